"""Training checkpoints, their restores, and the GradScalers a file uses, read from Python's
``ast``: what AMP015 asks of a file.

A GradScaler is in use where the file assigns one (a call of a GradScaler class, or of a
module-level alias of one: ``GradScaler = torch.cuda.amp.GradScaler``,
``functools.partial(torch.GradScaler, ...)``), receives one (a parameter named ``scaler``,
``grad_scaler`` or ``amp_scaler``, or annotated with a GradScaler class), or scales a loss with
one (``S.scale(loss).backward()``). It is known by how the code spells what holds it
(``self.scaler``); an object it is an attribute of holds it too (``self.state`` holds
``self.state.scaler``).

A checkpoint is training state that holds an optimizer's state: model weights alone are not
resumed from. It is built as a dict (a literal, ``dict(...)``, a constructor's keyword
arguments such as ``Snapshot(optimizer_state=...)``, ``ckpt["optimizer"] = ...``) or saved as
a file of its own (``torch.save(optimizer.state_dict(), "optimizer.pt")``). A restore is a call
named like a load, a restore or a resume (``load_checkpoint``, ``self.restore_model``); an
optimizer's restore loads its state from saved state (``optimizer.load_state_dict(ckpt["optimizer"])``).

Scalers and checkpoints are matched within a unit: a class (its methods share them), or the
module outside classes (``unit_of``). Whether a unit saves or restores a scaler's state
(``saves_scaler``, ``restores_scaler``) is asked with a test of what may be the scaler, given
its spelling and whether it is a name or an attribute (``ScalerTest``).

Names stand for what the file's imports make them (``Outline.qualified_names``); a name read
for its value is followed to the plain assignment before it (``summaries``' ``value_before``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from .ast_context import AstContext
from .outline import child_nodes, contains
from .outline import dotted as outline_dotted
from .semantics import GRAD_SCALER, named_like_optimizer
from .summaries import checked_module

SCALER_CLASSES = GRAD_SCALER | {"torch.GradScaler", "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
                                "torch.distributed.fsdp.ShardedGradScaler"}
# Parameters that receive a GradScaler by name alone.
SCALER_PARAMS = frozenset({"scaler", "grad_scaler", "amp_scaler"})
# The words of a call that loads or restores saved state.
RESTORE_WORDS = frozenset({"load", "reload", "restore", "resume"})
# The words of a call that may save what it is given.
_SAVE_WORDS = frozenset({"save", "checkpoint", "ckpt"})
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

# Whether an expression may be the scaler (or hold it): its spelling, and whether it is a name
# or an attribute.
ScalerTest = Callable[[str, bool], bool]


# -- names and spellings ---------------------------------------------------------------------

def last_name(expr: ast.expr) -> str:
    """``b`` for ``a.b`` and for ``b``; empty for anything else."""
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ""


def dotted(expr: ast.expr) -> str | None:
    """``self.scaler`` for a name or an attribute chain, however spaced; None for anything else."""
    parts = outline_dotted(expr)
    return ".".join(parts) if parts is not None else None


def spelled(ctx: AstContext, expr: ast.expr) -> str:
    """``dotted``, or the code of any other expression as written."""
    return dotted(expr) or ctx.code(expr)


def named(expr: ast.expr) -> bool:
    return isinstance(expr, (ast.Name, ast.Attribute))


def named_like_scaler(code: str) -> bool:
    return "scaler" in code.split(".")[-1].lower()


def holds(code: str, scaler_code: str) -> bool:
    """Whether ``code`` is the scaler or an object it is an attribute of (``self.state`` holds
    ``self.state.scaler``); ``self`` alone holds everything and counts for nothing."""
    return code == scaler_code or (code != "self" and scaler_code.startswith(code + "."))


def key_text(expr: ast.expr | None) -> str | None:
    """A literal string key, lowercased (keys are only searched for words)."""
    return expr.value.lower() if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else None


def words(name: str) -> set[str]:
    """The lowercased words of a name: ``load_checkpoint``, ``loadCheckpoint`` -> {"load",
    "checkpoint"}; ``set_dataloader`` has no word "load"."""
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)}


def name_words(expr: ast.expr) -> set[str]:
    """The words of a callee's last name."""
    return words(last_name(expr))


def restores_from_checkpoint(call: ast.Call) -> bool:
    """A call named like loading or restoring (``load_checkpoint``, ``self.restore_model``, ``resume``)."""
    return not name_words(call.func).isdisjoint(RESTORE_WORDS)


def argument_values(call: ast.Call) -> list[ast.expr]:
    """What ``call`` is given: its arguments' values (those of ``*args`` and ``**kwargs`` too)."""
    return [a.value if isinstance(a, ast.Starred) else a for a in call.args] + [k.value for k in call.keywords]


def _unnamed(call: ast.Call) -> list[ast.expr]:
    """The values ``call`` is given without a keyword: positional, ``*args`` and ``**kwargs``."""
    return [a.value if isinstance(a, ast.Starred) else a for a in call.args] + \
        [k.value for k in call.keywords if k.arg is None]


def first_argument(call: ast.Call) -> tuple[str | None, ast.expr] | None:
    """The first argument as written, as (its keyword, or None; its value)."""
    given = [*call.args, *call.keywords]
    if not given:
        return None
    first = min(given, key=lambda a: (a.lineno, a.col_offset)) if call.keywords else given[0]
    if isinstance(first, ast.keyword):
        return first.arg, first.value
    return None, first.value if isinstance(first, ast.Starred) else first


def subexpressions(expr: ast.AST) -> Iterator[ast.AST]:
    """``expr`` and what it holds, not entering lambdas."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in child_nodes(node) if not isinstance(c, ast.Lambda))


# -- where a node is -------------------------------------------------------------------------

def ancestors(ctx: AstContext, node: ast.AST) -> Iterator[ast.AST]:
    parent = ctx.parent(node)
    while parent is not None:
        yield parent
        parent = ctx.parent(parent)


def unit_of(ctx: AstContext, node: ast.AST) -> ast.ClassDef | ast.Module:
    """The innermost class around ``node`` (its methods share their scalers and checkpoints),
    else the module."""
    if ctx.outline.nodes(ast.ClassDef):
        for parent in ancestors(ctx, node):
            if isinstance(parent, ast.ClassDef):
                return parent
    return ctx.outline.tree


def in_unit(ctx: AstContext, unit: ast.AST, kind: type) -> list:
    """The nodes of type ``kind`` whose unit (``unit_of``) is ``unit``, in source order."""
    groups = ctx.__dict__.setdefault("_checkpoint_units", {})
    if kind not in groups:
        grouped = groups[kind] = {}
        for node in sorted(ctx.outline.nodes(kind), key=ctx.order):
            grouped.setdefault(id(unit_of(ctx, node)), []).append(node)
    return groups[kind].get(id(unit), [])


def calls_in(ctx: AstContext, function: ast.AST | None) -> list[ast.Call]:
    """The calls whose innermost function is ``function`` (None: the top level), in source order."""
    if "_checkpoint_calls_in" not in ctx.__dict__:
        grouped: dict[int, list[ast.Call]] = {}
        for call in ctx.calls_in_order[0]:
            grouped.setdefault(id(ctx.enclosing_function(call)), []).append(call)
        ctx.__dict__["_checkpoint_calls_in"] = grouped
    return ctx.__dict__["_checkpoint_calls_in"].get(id(function), [])


def _block(ctx: AstContext, statement: ast.stmt) -> list[ast.stmt]:
    """The statements of the block ``statement`` is in (a body, an ``else``, a ``finally``)."""
    parent = ctx.parent(statement)
    return next(b for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody"))
                if isinstance(b, list) and any(s is statement for s in b))


def starts_its_line(ctx: AstContext, statement: ast.stmt) -> bool:
    """Whether ``statement`` is the first on its line: not after a ``;`` (``a = 1; b = f()``)
    nor after a compound statement's colon (``if c: b = f()``)."""
    return not ctx.source[ctx.offset(statement.lineno, 0):ctx.offset(statement.lineno, statement.col_offset)].strip()


def in_block(ctx: AstContext, statement: ast.stmt, node: ast.AST) -> bool:
    """Whether ``node`` is in one of the statements of the block ``statement`` is in."""
    return any(contains(s, node) for s in _block(ctx, statement))


def body_of(ctx: AstContext, statement: ast.stmt, function: ast.AST) -> bool:
    """Whether ``statement`` is directly in ``function``'s body (under no other statement)."""
    return _block(ctx, statement) is function.body


# -- GradScalers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Scaler:
    code: str  # what holds it: ``scaler``, ``self.grad_scaler``, ``self.state.scaler``
    node: ast.AST  # where the file creates or receives it
    function: ast.FunctionDef | ast.AsyncFunctionDef | None  # the function it is created or received in


def _scaler_aliases(ctx: AstContext) -> set[str]:
    """Module-level names bound to a GradScaler class (``GradScaler = torch.cuda.amp.GradScaler``,
    ``functools.partial(torch.GradScaler, device="cuda")``)."""
    outline, found = ctx.outline, set()
    for node in outline.nodes(ast.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and "functools.partial" in outline.qualified_names(value.func) \
                    and (first := first_argument(value)) is not None:
                value = first[1]
            if not outline.qualified_names(value).isdisjoint(SCALER_CLASSES) and not any(
                    isinstance(a, (*FUNCTIONS, ast.ClassDef)) for a in ancestors(ctx, node)):
                found.add(node.targets[0].id)
    return found


def creates_scaler(ctx: AstContext, expr: ast.expr, aliases: set[str]) -> bool:
    """``GradScaler(...)``, also as a branch of ``a if c else b`` or ``x or y``."""
    if isinstance(expr, ast.IfExp):
        return creates_scaler(ctx, expr.body, aliases) or creates_scaler(ctx, expr.orelse, aliases)
    if isinstance(expr, ast.BoolOp):
        return any(creates_scaler(ctx, v, aliases) for v in expr.values)
    return isinstance(expr, ast.Call) and (not ctx.outline.qualified_names(expr.func).isdisjoint(SCALER_CLASSES) or (
        isinstance(expr.func, ast.Name) and expr.func.id in aliases))


def scaler_creations(ctx: AstContext) -> list[tuple[ast.Assign | ast.AnnAssign, str]]:
    """Assignments of a new GradScaler, with the code of their target, in source order."""
    if "_scaler_creations" not in ctx.__dict__:
        aliases = _scaler_aliases(ctx)
        found = []
        for node in sorted([*ctx.outline.nodes(ast.Assign), *ctx.outline.nodes(ast.AnnAssign)], key=ctx.order):
            if node.value is not None and creates_scaler(ctx, node.value, aliases):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.extend((node, code) for t in targets if (code := dotted(t)))
        ctx.__dict__["_scaler_creations"] = found
    return ctx.__dict__["_scaler_creations"]


def scalers(ctx: AstContext) -> list[Scaler]:
    """The GradScalers the file uses, in source order: those it creates (assigned a GradScaler
    class's instance), those it receives (a parameter named ``scaler``, ``grad_scaler`` or
    ``amp_scaler``, or annotated with a GradScaler class) and those it scales a loss with
    (``S.scale(loss).backward()``)."""
    if "_checkpoint_scalers" not in ctx.__dict__:
        found = [Scaler(code, node, ctx.enclosing_function(node)) for node, code in scaler_creations(ctx)]
        annotated = "GradScaler" in ctx.source  # else no annotation names one
        for param in ctx.outline.nodes(ast.arg):
            if param.arg in SCALER_PARAMS or annotated and param.annotation is not None \
                    and "GradScaler" in ctx.code(param.annotation):
                found.append(Scaler(param.arg, param, ctx.enclosing_function(param)))
        for call in ctx.outline.method_calls("backward"):
            scaled = call.func.value
            if isinstance(scaled, ast.Call) and isinstance(scaled.func, ast.Attribute) and scaled.func.attr == "scale" \
                    and (code := dotted(scaled.func.value)):
                found.append(Scaler(code, call, ctx.enclosing_function(call)))
        ctx.__dict__["_checkpoint_scalers"] = sorted(found, key=lambda s: ctx.order(s.node))
    return ctx.__dict__["_checkpoint_scalers"]


# -- checkpoints -----------------------------------------------------------------------------

def _state_call(call: ast.Call) -> bool:
    """A call that reads some state: ``x.state_dict()``, ``get_optimizer_state_dict(...)``."""
    name = last_name(call.func).lower()
    return "state_dict" in name and not name.startswith(("load", "set"))


def _optimizer_state_call(ctx: AstContext, call: ast.Call) -> bool:
    """``optimizer.state_dict()``, ``model.optim_state_dict(optimizer)``, ``get_optimizer_state_dict(...)``."""
    if not _state_call(call):
        return False
    name = last_name(call.func)
    if name == "state_dict":
        return isinstance(call.func, ast.Attribute) and named_like_optimizer(spelled(ctx, call.func.value))
    return "optim" in name.lower()


# How many assignments back a name is followed to the state it was made from.
_TRACE_DEPTH = 3


def _transforms(call: ast.Call) -> bool:
    """A function applied to some state that gives it back changed (``move_to_device(sd, dev)``,
    ``copy.deepcopy(sd)``): not a constructor or a dict, which build a checkpoint of their own."""
    name = last_name(call.func)
    return bool(name) and not name[:1].isupper() and name != "dict" and not _state_call(call)


def _state_names(ctx: AstContext) -> set[str]:
    """The names some plain assignment of the file binds to a call that reads some state, or to
    a function of such a name or call (``sd = move_to_device(sd, dev)``): the only names
    ``_traced`` looks up."""
    if "_state_names" not in ctx.__dict__:
        outline = ctx.outline
        bound = [(t.id, node.value)
                 for node in (*outline.nodes(ast.Assign), *outline.nodes(ast.AnnAssign), *outline.nodes(ast.NamedExpr))
                 if isinstance(node.value, ast.Call)
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
        names = {name for name, value in bound if _state_call(value)}
        grown = True
        while grown:
            grown = False
            for name, value in bound:
                if name not in names and _transforms(value) and any(
                        isinstance(v, ast.Call) and _state_call(v) or isinstance(v, ast.Name) and v.id in names
                        for v in argument_values(value)):
                    names.add(name)
                    grown = True
        ctx.__dict__["_state_names"] = names
    return ctx.__dict__["_state_names"]


def _traced(ctx: AstContext, expr: ast.expr, depth: int = _TRACE_DEPTH) -> ast.expr:
    """The state call a name's value was made from where it was last assigned before
    (``opt_state = optimizer.state_dict()``, then perhaps ``opt_state = to_cpu(opt_state)``),
    else the expression itself. A name bound to a checkpoint already found (a dict) is not
    followed: that checkpoint is reported once."""
    if depth and isinstance(expr, ast.Name) and expr.id in _state_names(ctx) \
            and (module := checked_module(ctx)) is not None:
        value = module.value_before(ctx.enclosing_function(expr) or ctx.outline.tree, expr)
        if isinstance(value, ast.Call) and _state_call(value):
            return value
        if isinstance(value, ast.Call) and _transforms(value):
            for given in argument_values(value):
                traced = _traced(ctx, given, depth - 1) if isinstance(given, ast.Name) else given
                if isinstance(traced, ast.Call) and _state_call(traced):
                    return traced
    return expr


def holds_state(ctx: AstContext, expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and _state_call(n) for n in subexpressions(_traced(ctx, expr)))


def optimizer_state(ctx: AstContext, expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and _optimizer_state_call(ctx, n) for n in subexpressions(_traced(ctx, expr)))


def _optimizer_entry(ctx: AstContext, key: str | None, value: ast.expr) -> bool:
    if key is not None and "optim" in key:
        return holds_state(ctx, value)
    return optimizer_state(ctx, value)


def _gives_optimizer_state(ctx: AstContext, expr: ast.expr) -> bool:
    """The optimizer's state itself, not a dict or a constructor that holds it."""
    expr = _traced(ctx, expr)
    return isinstance(expr, ast.Call) and _optimizer_state_call(ctx, expr)


def checkpoints(ctx: AstContext) -> list[ast.AST]:
    """Where each checkpoint is built, in source order: a dict or a call with an optimizer-state
    keyword entry, a constructor (a capitalised callee) given an optimizer's state, the first
    ``x["optim..."] = state`` of a dict in a function, a save call whose first argument is an
    optimizer's state. A checkpoint inside another is not one of its own."""
    outline = ctx.outline
    found: list[ast.AST] = []
    for node in outline.nodes(ast.Dict):
        if any(k is not None and _optimizer_entry(ctx, key_text(k), v) for k, v in zip(node.keys, node.values)):
            found.append(node)
    for call in outline.nodes(ast.Call):
        if any(k.arg is not None and _optimizer_entry(ctx, k.arg.lower(), k.value) for k in call.keywords):
            found.append(call)
        elif last_name(call.func)[:1].isupper() and any(_gives_optimizer_state(ctx, v) for v in _unnamed(call)):
            found.append(call)  # a constructor given the state positionally: `Snapshot(model_sd, optim_sd)`
        elif "save" in name_words(call.func) and (first := first_argument(call)) is not None and first[0] is None \
                and _gives_optimizer_state(ctx, first[1]):
            found.append(call)
    filled: set[tuple[int, str]] = set()
    for node in sorted(outline.nodes(ast.Assign), key=ctx.order):
        target = node.targets[0]
        if len(node.targets) == 1 and isinstance(target, ast.Subscript) \
                and not isinstance(target.slice, (ast.Slice, ast.Tuple)):
            where = (id(ctx.enclosing_function(node)), spelled(ctx, target.value))
            if where not in filled and _optimizer_entry(ctx, key_text(target.slice), node.value):
                filled.add(where)
                found.append(node)
    found.sort(key=ctx.order)
    outermost: list[ast.AST] = []
    for node in found:
        if not any(contains(outer, node) for outer in outermost[-1:]):
            outermost.append(node)
    return [node for node in outermost if not _loaded_back(ctx, node)]


def _loaded_back(ctx: AstContext, node: ast.AST) -> bool:
    """State built to be restored, not saved: an old checkpoint converted and handed (directly,
    or through plain ``a = b`` copies of its name in the same function) to a load or restore.
    A restore that can only read another binding of the name (``ckpt = torch.load(w)`` handed
    to a resume before the loop that binds ``ckpt = {...}`` and saves it) is not this state's."""
    parent = ctx.parent(node)
    given_to = ctx.parent(parent) if isinstance(parent, (ast.keyword, ast.Starred)) else \
        parent if isinstance(parent, ast.Call) and parent.func is not node else None
    if isinstance(given_to, ast.Call) and restores_from_checkpoint(given_to):
        return True
    if isinstance(node, ast.Assign):
        bound, built = node.targets[0].value, node
    elif isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is node:
        bound, built = parent.targets[0], parent
    else:
        return False
    function = ctx.enclosing_function(node)
    if not isinstance(bound, ast.Name) or function is None:
        return False
    names = {bound.id}
    copies = [(a.targets[0].id, a.value.id) for a in ctx.outline.nodes(ast.Assign)
              if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and isinstance(a.value, ast.Name)
              and contains(function, a)]
    grown = True
    while grown:
        grown = False
        for target, source in copies:
            if source in names and target not in names:
                names.add(target)
                grown = True
    return any(restores_from_checkpoint(call) and any(
        isinstance(v, ast.Name) and v.id in names and (v.id != bound.id or _may_read(ctx, v, built, function))
        for v in argument_values(call)) for call in ctx.calls_within(function))


def _may_read(ctx: AstContext, read: ast.Name, built: ast.stmt, function: ast.AST) -> bool:
    """Whether ``read`` may see the value the statement ``built`` gives its name: not where it
    comes first and no loop holds both, nor where a binding of the name between them runs on
    every path to it (in a block that holds the read)."""
    if ctx.order(read) < ctx.order(built):
        return any(isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and contains(loop, read)
                   and contains(loop, built) for loop in ancestors(ctx, read))
    module = checked_module(ctx)
    bindings = module.placed(function).get(read.id, ()) if module is not None else ()
    around = {id(a) for a in ancestors(ctx, read)}
    return not any(isinstance(binding, ast.stmt) and ctx.order(built) < ctx.order(binding) < ctx.order(read)
                   and any(id(s) in around for s in _block(ctx, binding)) for binding, _ in bindings)


# -- restores --------------------------------------------------------------------------------

def optimizer_restores(ctx: AstContext) -> list[ast.Call]:
    """Calls that restore an optimizer from saved state, in source order:
    ``optimizer.load_state_dict(ckpt["optimizer"])``, ``model.load_optim_state_dict(optimizer, ...)``,
    ``set_optimizer_state_dict(...)``; not a copy from a live object
    (``opt.load_state_dict(other.state_dict())``)."""
    found = []
    for call in ctx.outline.nodes(ast.Call):
        name = last_name(call.func).lower()
        if not (call.args or call.keywords) or "state_dict" not in name or not name.startswith(("load", "set")):
            continue
        restores = named_like_optimizer(spelled(ctx, call.func.value)) if name == "load_state_dict" \
            and isinstance(call.func, ast.Attribute) else "optim" in name
        if restores and not any(holds_state(ctx, v) for v in argument_values(call)):
            found.append(call)
    return sorted(found, key=ctx.order)


def _is(ctx: AstContext, test: ScalerTest, expr: ast.expr) -> bool:
    return test(spelled(ctx, expr), named(expr))


def restores(ctx: AstContext, call: ast.Call, test: ScalerTest) -> bool:
    """A restore call given the scaler (or its holder), or whose result an assignment that
    starts its line assigns to it (``self.model, self.scaler = self.restore(path)``: any name
    in the targets, an attribute's own name included)."""
    if any(_is(ctx, test, v) for v in argument_values(call)):
        return True
    assign = ctx.parent(call)
    if not (isinstance(assign, ast.Assign) and assign.value is call and starts_its_line(ctx, assign)):
        return False
    for node in (n for t in assign.targets for n in subexpressions(t)):
        if named(node) and _is(ctx, test, node) or isinstance(node, ast.Attribute) and test(node.attr, True) \
                or isinstance(node, ast.keyword) and node.arg is not None and test(node.arg, True):
            return True
    return False


def restores_of(ctx: AstContext, function: ast.AST, code: str) -> list[ast.Call]:
    """Calls directly in ``function`` that restore the scaler held by ``code``, or the object holding it."""
    held: ScalerTest = lambda spelling, _: holds(spelling, code)  # noqa: E731
    found = []
    for call in calls_in(ctx, function):
        if last_name(call.func) == "load_state_dict" and isinstance(call.func, ast.Attribute) \
                and holds(spelled(ctx, call.func.value), code):
            found.append(call)
        elif restores_from_checkpoint(call) and restores(ctx, call, held):
            found.append(call)
    return found


def _names_scaler(subscript: ast.Subscript) -> bool:
    """``ckpt["scaler"]``, ``state["grad_scaler_state"]``."""
    keys = subscript.slice.elts if isinstance(subscript.slice, ast.Tuple) else [subscript.slice]
    return any("scaler" in (key_text(k) or "") for k in keys)


def saves_scaler(ctx: AstContext, unit: ast.AST, test: ScalerTest) -> bool:
    """Whether the unit takes a scaler's state to save it: a scaler's (or its holder's)
    ``state_dict()``, the scaler passed to a call named like a save or a checkpoint, a dict key
    or an assigned subscript naming a scaler (``"grad_scaler_state"``)."""
    for call in in_unit(ctx, unit, ast.Call):
        if last_name(call.func) == "state_dict" and isinstance(call.func, ast.Attribute) \
                and _is(ctx, test, call.func.value):
            return True
        if not name_words(call.func).isdisjoint(_SAVE_WORDS) and not restores_from_checkpoint(call) \
                and any(_is(ctx, test, v) for v in argument_values(call)):
            return True
    if any("scaler" in (key_text(k) or "") for d in in_unit(ctx, unit, ast.Dict) for k in d.keys):
        return True
    return any(isinstance(a.targets[0], ast.Subscript) and _names_scaler(a.targets[0])
               for a in in_unit(ctx, unit, ast.Assign))


def restores_scaler(ctx: AstContext, unit: ast.AST, test: ScalerTest) -> bool:
    """Whether the unit restores a scaler's state: a scaler's (or its holder's)
    ``load_state_dict``, a checkpoint entry naming a scaler read (``ckpt["scaler"]``,
    ``ckpt.get("scaler")``), or the scaler passed to or assigned from a restore (``restores``)."""
    for call in in_unit(ctx, unit, ast.Call):
        name = last_name(call.func).lower()
        if name == "load_state_dict" and isinstance(call.func, ast.Attribute) and _is(ctx, test, call.func.value):
            return True
        if name in ("get", "pop") and (first := first_argument(call)) is not None \
                and "scaler" in (key_text(first[1]) or ""):
            return True
        if restores_from_checkpoint(call) and restores(ctx, call, test):
            return True
    stores = {id(t) for a in in_unit(ctx, unit, ast.Assign) for t in a.targets}
    return any(id(s) not in stores and _names_scaler(s) for s in in_unit(ctx, unit, ast.Subscript))
