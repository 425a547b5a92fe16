"""The loss scale of a GradScaler, read from Python's ``ast``: a value the scaler multiplied by
it (``S.scale(loss)``, directly or through a name), what reads the scale itself
(``S.get_scale()``, a name like ``inv_scale``), and the names a function binds to the scale or
its inverse (``inv_scale = 1.0 / scaler.get_scale()``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Iterator

from . import flow
from .ast_context import AstContext
from .outline import child_nodes
from .regions import value_before
from .summaries import checked_module, receiver

_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_ASSIGNMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def unstarred(exprs: Iterable[ast.expr]) -> list[ast.expr]:
    """The values of a call's arguments or a display's elements, ``*x`` as ``x``."""
    return [e.value if isinstance(e, ast.Starred) else e for e in exprs]


def arguments(call: ast.Call) -> list[ast.expr]:
    """The values a call is given, the positional ones (``*args`` as ``args``) first."""
    return [*unstarred(call.args), *(k.value for k in call.keywords)]


def last_name(node: ast.AST) -> str | None:
    """``loss`` of ``loss`` and of ``self.loss``."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def bound_names(ctx: AstContext, target: ast.expr) -> list[str]:
    """What an assignment binds, by code: names and attributes, tuples unpacked."""
    if isinstance(target, (ast.Name, ast.Attribute)):
        return [ctx.code(target)]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in unstarred(target.elts) for n in bound_names(ctx, e)]
    return bound_names(ctx, target.value) if isinstance(target, ast.Starred) else []


@dataclass(frozen=True)
class Scaled:
    scaler: str  # the code of the GradScaler
    call: ast.Call  # its `.scale(...)` call


def scaled(ctx: AstContext, expr: ast.expr | None, depth: int = 2) -> Scaled | None:
    """``S.scale(...)`` for a GradScaler ``S`` (``flow.scalers``), in a list or tuple, or a name
    assigned one earlier in its function (``regions.value_before``), ``depth`` names deep."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return next((s for e in unstarred(expr.elts) if (s := scaled(ctx, e, depth)) is not None), None)
    if isinstance(expr, ast.Call):
        found = receiver(expr)
        if found is not None and found[1] == "scale" and flow.key(ctx, found[0]) in flow.scalers(ctx):
            return Scaled(ctx.code(found[0]), expr)
    elif isinstance(expr, ast.Name) and depth:
        return scaled(ctx, value_before(ctx, expr), depth - 1)
    return None


def _named_like_scale(name: str | None) -> bool:
    """``inv_scale``, ``loss_scale``, ``self.scale``: named like the loss scale (not the scaler,
    nor something scaled)."""
    lowered = (name or "").lower()
    return "scale" in lowered and "scaler" not in lowered and "scaled" not in lowered


def _reads(nodes: Iterable[ast.AST], attribute_values: bool) -> Iterator[ast.AST]:
    """What ``nodes`` read: each ``S.get_scale()`` call, name and attribute (and, with
    ``attribute_values``, what an attribute is read from), and each function, class or lambda
    they define; not a called function's own name (``S.scale(...)`` reads ``S``)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            found = receiver(node)
            if found is not None and found[1] == "get_scale":
                yield node
                continue
            stack.extend(arguments(node))
            if found is not None:
                stack.append(found[0])
        elif isinstance(node, (ast.Name, ast.Attribute, *_NESTED)):
            yield node
            if attribute_values and isinstance(node, ast.Attribute):
                stack.append(node.value)
        else:
            stack.extend(child_nodes(node))


def reads_scale(ctx: AstContext, nodes: Iterable[ast.AST], scales: set[str]) -> bool:
    """Whether ``nodes`` call ``S.get_scale()`` or read a name in ``scales`` (``scale_names``)
    or named like the scale."""
    return any(isinstance(read, ast.Call) or isinstance(read, (ast.Name, ast.Attribute)) and (
        ctx.code(read) in scales or _named_like_scale(last_name(read))) for read in _reads(nodes, True))


def _only_scale(ctx: AstContext, node: ast.AST, scales: set[str]) -> bool:
    """Every name ``node`` reads is a name in ``scales``, named like the scale, a device or a
    dtype, or an import's (``math.sqrt``); ``S.get_scale()`` reads nothing else."""
    return all(isinstance(read, ast.Call) or isinstance(read, (ast.Name, ast.Attribute)) and (
        ctx.code(read) in scales or _named_like_scale(last := last_name(read)) or last in ("device", "dtype")
        or ctx.outline.qualified_names(read)) for read in _reads([node], False))


def scale_names(ctx: AstContext, scope: ast.AST) -> set[str]:
    """The names and attributes a function (or the module's own code) assigns the scale or its
    inverse: a value that reads ``S.get_scale()`` (or such a name) and nothing else but
    constants, devices and imports (``inv_scale = 1.0 / scaler.get_scale()``, not ``grads =
    [g * inv_scale for g in scaled]``)."""
    cache = ctx.__dict__.setdefault("_scale_names", {})
    if id(scope) not in cache:
        found: set[str] = set()
        for statement in sorted((n for n in checked_module(ctx).scope_nodes(scope) if isinstance(n, _ASSIGNMENTS)),
                                key=ctx.order):
            if statement.value is not None and reads_scale(ctx, [statement.value], found) \
                    and _only_scale(ctx, statement.value, found):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                found.update(n for t in targets for n in bound_names(ctx, t))
        cache[id(scope)] = found
    return cache[id(scope)]
