"""The classes ``self`` may be an instance of, as Python looks a method up on an instance of a
class: the class's own body, then its bases (classes of the file, or classes imported from a
module of the project), depth first. A base that cannot be read (another library's) ends the
search, since it may define the name first."""

from __future__ import annotations

import ast
from typing import Callable, Generator, TypeVar

from .ast_context import AstContext
from .crossfile import imported_in

_MAX_BASES = 8  # classes read up a hierarchy
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef
Module = TypeVar("Module")


def bases_in_order(module: Module, cls: ast.ClassDef,
                   class_named: Callable[[Module, ast.expr], tuple[Module, ast.ClassDef] | None],
                   depth: int = 0) -> Generator[tuple[Module, ast.ClassDef], None, bool]:
    """The class and its bases in the order Python looks a method up, each with the module it
    is in, read only as far as a lookup asks; ``class_named`` finds the class a base names from
    a module (of whatever model of a module the caller reads). Depth first, which is Python's
    order where no two bases share a base; where two do (a diamond), Python puts the shared one
    after both, and the walk stops before the bases. True once the order stops: there, or at a
    base that cannot be read (a later one may define a name it does)."""
    yield module, cls
    bases = [b for b in cls.bases if not is_object(b)]
    if depth >= _MAX_BASES:
        return bool(bases)
    if len(bases) > 1 and _bases_share(module, bases, class_named, depth):
        return True
    for base in bases:
        found = class_named(module, base)
        if found is None or (yield from bases_in_order(*found, class_named, depth + 1)):
            return True
    return False


def _bases_share(module: Module, bases: list[ast.expr],
                 class_named: Callable[[Module, ast.expr], tuple[Module, ast.ClassDef] | None], depth: int) -> bool:
    """Whether two of ``bases`` have a class in common, as far as they can be read."""
    seen: set[int] = set()
    for base in bases:
        found = class_named(module, base)
        if found is None:
            return False  # the walk stops at it anyway
        mine = {id(c) for _, c in _all_of(*found, class_named, depth + 1)}
        if mine & seen:
            return True
        seen |= mine
    return False


def _all_of(module: Module, cls: ast.ClassDef,
            class_named: Callable[[Module, ast.expr], tuple[Module, ast.ClassDef] | None],
            depth: int) -> list[tuple[Module, ast.ClassDef]]:
    found = [(module, cls)]
    if depth < _MAX_BASES:
        for base in cls.bases:
            if not is_object(base) and (named := class_named(module, base)) is not None:
                found += _all_of(*named, class_named, depth + 1)
    return found


def lookup_order(ctx: AstContext, cls: ast.ClassDef) -> Generator[tuple[AstContext, ast.ClassDef], None, bool]:
    """``bases_in_order`` over the checked file and the project modules it reads."""
    return bases_in_order(ctx, cls, class_named)


def inherited_method(ctx: AstContext, call: ast.Call) -> tuple[AstContext, Function] | None:
    """For ``self.m(...)`` in a class that does not define ``m``: the method of a base that
    ``self.m`` runs, with the file it is in; None where no base that can be read defines it
    before one that cannot be read."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return None
    cls = ctx.enclosing(call, ast.ClassDef)
    if cls is None:
        return None
    order = lookup_order(ctx, cls)
    for where, owner in order:
        defined = [s for s in owner.body if isinstance(s, _FUNCTIONS) and s.name == func.attr]
        if defined:
            return None if owner is cls else (where, defined[-1])
    return None


def class_named(ctx: AstContext, expr: ast.expr) -> tuple[AstContext, ast.ClassDef] | None:
    """The class a base names: one defined at the top of this module, or of the project
    module it is imported from."""
    if isinstance(expr, ast.Name):
        local = _top_class(ctx, expr.id)
        if local is not None:
            return ctx, local
    for module, level, name in imported_in(ctx, expr):
        other = ctx.project_module(module, level)
        found = _top_class(other, name) if other is not None else None
        if found is not None:
            return other, found
    return None


def _top_class(ctx: AstContext, name: str) -> ast.ClassDef | None:
    return next((s for s in ctx.outline.tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)


def is_object(base: ast.expr) -> bool:
    return isinstance(base, ast.Name) and base.id == "object"
