"""Training checkpoints and the GradScalers a file uses, as AMP015 reads them. Pure libcst.

A checkpoint is training state that holds an optimizer's state: model weights alone are not
resumed from. It is built as a dict (a literal, ``dict(...)``, a constructor's keyword
arguments such as ``Snapshot(optimizer_state=...)``, ``ckpt["optimizer"] = ...``) or saved as
a file of its own (``torch.save(optimizer.state_dict(), "optimizer.pt")``); a resume is a call
that restores an optimizer's state from one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from .context import FileContext
from .names import dotted
from .tree import children
from .semantics import GRAD_SCALER, assigned_before, enclosing_function, named_like_optimizer, scaled_backward_scaler

SCALER_CLASSES = GRAD_SCALER | {"torch.GradScaler", "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
                                "torch.distributed.fsdp.ShardedGradScaler"}
# Parameters that receive a GradScaler by name alone.
SCALER_PARAMS = frozenset({"scaler", "grad_scaler", "amp_scaler"})


def last_name(expr: cst.BaseExpression) -> str:
    """``b`` for ``a.b`` and for ``b``; empty for anything else."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return expr.value if isinstance(expr, cst.Name) else ""


def spelled(ctx: FileContext, expr: cst.BaseExpression) -> str:
    """``self.scaler`` however it is spaced (``self . scaler``); other expressions as written."""
    parts = dotted(expr)
    return ".".join(parts) if parts else ctx.code(expr)


def named_like_scaler(code: str) -> bool:
    return "scaler" in code.split(".")[-1].lower()


def subexpressions(expr: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``expr`` and what it holds, not entering functions or lambdas."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in children(node) if not isinstance(c, (cst.Lambda, cst.FunctionDef, cst.ClassDef)))


def key_text(expr: cst.BaseExpression) -> str | None:
    """A literal string key, lowercased, as written (escapes left as they are: keys are only
    searched for words). Not ``evaluated_value``: its ``ast.literal_eval`` leaves reference
    cycles behind on every call."""
    if isinstance(expr, cst.SimpleString):
        return None if "b" in expr.prefix.lower() else expr.raw_value.lower()
    if isinstance(expr, cst.ConcatenatedString):
        parts = key_text(expr.left), key_text(expr.right)
        return None if None in parts else "".join(parts)
    return None


# -- GradScalers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Scaler:
    code: str  # what holds it: ``scaler``, ``self.grad_scaler``, ``self.state.scaler``
    node: cst.CSTNode  # where the file creates or receives it
    function: cst.FunctionDef | None  # the function it is created or received in


def _scaler_aliases(ctx: FileContext) -> set[str]:
    """Module-level names bound to a GradScaler class (``GradScaler = torch.cuda.amp.GradScaler``,
    ``functools.partial(torch.GradScaler, device="cuda")``)."""
    found = set()
    for node in ctx.nodes(cst.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and not any(
                isinstance(a, (cst.FunctionDef, cst.ClassDef)) for a in ctx.ancestors(node)):
            value = node.value
            if isinstance(value, cst.Call) and ctx.resolves_to(value.func, {"functools.partial"}) and value.args:
                value = value.args[0].value
            if ctx.resolves_to(value, SCALER_CLASSES):
                found.add(node.targets[0].target.value)
    return found


def creates_scaler(ctx: FileContext, expr: cst.BaseExpression, aliases: set[str]) -> bool:
    """``GradScaler(...)``, also as a branch of ``a if c else b`` or ``x or y``."""
    if isinstance(expr, cst.IfExp):
        return creates_scaler(ctx, expr.body, aliases) or creates_scaler(ctx, expr.orelse, aliases)
    if isinstance(expr, cst.BooleanOperation):
        return creates_scaler(ctx, expr.left, aliases) or creates_scaler(ctx, expr.right, aliases)
    return isinstance(expr, cst.Call) and (ctx.resolves_to(expr.func, SCALER_CLASSES) is not None or (
        isinstance(expr.func, cst.Name) and expr.func.value in aliases))


def scaler_creations(ctx: FileContext) -> list[tuple[cst.Assign | cst.AnnAssign, str]]:
    """Assignments of a new GradScaler, with the code of their target, in source order."""
    if "_scaler_creations" not in ctx.__dict__:
        aliases = _scaler_aliases(ctx)
        found = []
        for node in sorted([*ctx.nodes(cst.Assign), *ctx.nodes(cst.AnnAssign)], key=ctx.order):
            if node.value is not None and creates_scaler(ctx, node.value, aliases):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                found.extend((node, spelled(ctx, t)) for t in targets if dotted(t))
        ctx.__dict__["_scaler_creations"] = found
    return ctx.__dict__["_scaler_creations"]


def scalers(ctx: FileContext) -> list[Scaler]:
    """The GradScalers the file uses, in source order: those it creates (assigned a GradScaler
    class's instance), those it receives (a parameter named ``scaler``, ``grad_scaler`` or
    ``amp_scaler``, or annotated with a GradScaler class) and those it scales a loss with
    (``S.scale(loss).backward()``)."""
    if "_checkpoint_scalers" not in ctx.__dict__:
        found = [Scaler(code, node, enclosing_function(ctx, node)) for node, code in scaler_creations(ctx)]
        for param in ctx.nodes(cst.Param):
            annotation = ctx.code(param.annotation.annotation) if param.annotation else ""
            if param.name.value in SCALER_PARAMS or "GradScaler" in annotation:
                found.append(Scaler(param.name.value, param, enclosing_function(ctx, param)))
        for call in ctx.nodes(cst.Call):
            if scaled_backward_scaler(ctx, call) is not None and dotted(call.func.value.func.value):
                found.append(Scaler(spelled(ctx, call.func.value.func.value), call, enclosing_function(ctx, call)))
        ctx.__dict__["_checkpoint_scalers"] = sorted(found, key=lambda s: ctx.order(s.node))
    return ctx.__dict__["_checkpoint_scalers"]


def holds(code: str, scaler_code: str) -> bool:
    """Whether ``code`` is the scaler or an object it is an attribute of (``self.state`` holds
    ``self.state.scaler``); ``self`` alone holds everything and counts for nothing."""
    return code == scaler_code or (code != "self" and scaler_code.startswith(code + "."))


# -- checkpoints -----------------------------------------------------------------------------

def _state_call(call: cst.Call) -> bool:
    """A call that reads some state: ``x.state_dict()``, ``get_optimizer_state_dict(...)``."""
    name = last_name(call.func).lower()
    return "state_dict" in name and not name.startswith(("load", "set"))


def _optimizer_state_call(ctx: FileContext, call: cst.Call) -> bool:
    """``optimizer.state_dict()``, ``model.optim_state_dict(optimizer)``, ``get_optimizer_state_dict(...)``."""
    if not _state_call(call):
        return False
    name = last_name(call.func)
    if name == "state_dict":
        return isinstance(call.func, cst.Attribute) and named_like_optimizer(spelled(ctx, call.func.value))
    return "optim" in name.lower()


def _traced(ctx: FileContext, expr: cst.BaseExpression) -> cst.BaseExpression:
    """A name's value where it was last assigned before, when that reads some state
    (``opt_state = optimizer.state_dict()``), else the expression itself. A name bound to a
    checkpoint already found (a dict) is not followed: that checkpoint is reported once."""
    if isinstance(expr, cst.Name):
        value = assigned_before(ctx, expr)
        if isinstance(value, cst.Call) and _state_call(value):
            return value
    return expr


def holds_state(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    return any(isinstance(n, cst.Call) and _state_call(n) for n in subexpressions(_traced(ctx, expr)))


def optimizer_state(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    return any(isinstance(n, cst.Call) and _optimizer_state_call(ctx, n) for n in subexpressions(_traced(ctx, expr)))


def _optimizer_entry(ctx: FileContext, key: str | None, value: cst.BaseExpression) -> bool:
    if key is not None and "optim" in key:
        return holds_state(ctx, value)
    return optimizer_state(ctx, value)


def _gives_optimizer_state(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """The optimizer's state itself, not a dict or a constructor that holds it."""
    expr = _traced(ctx, expr)
    return isinstance(expr, cst.Call) and _optimizer_state_call(ctx, expr)


def _is_save(call: cst.Call) -> bool:
    return "save" in name_words(call.func)


def checkpoints(ctx: FileContext) -> list[cst.CSTNode]:
    """Where each checkpoint is built, in source order: a dict or a call with an optimizer-state
    keyword entry, a constructor (a capitalised callee) given an optimizer's state, the first
    ``x["optim..."] = state`` of a dict in a function, a save call whose first argument is an
    optimizer's state. A checkpoint inside another is not one of its own."""
    found: list[cst.CSTNode] = []
    for node in ctx.nodes(cst.Dict):
        if any(isinstance(e, cst.DictElement) and _optimizer_entry(ctx, key_text(e.key), e.value)
               for e in node.elements):
            found.append(node)
    for call in ctx.nodes(cst.Call):
        if any(a.keyword is not None and _optimizer_entry(ctx, a.keyword.value.lower(), a.value) for a in call.args):
            found.append(call)
        elif last_name(call.func)[:1].isupper() and any(
                a.keyword is None and _gives_optimizer_state(ctx, a.value) for a in call.args):
            found.append(call)  # a constructor given the state positionally: `Snapshot(model_sd, optim_sd)`
        elif _is_save(call) and call.args and call.args[0].keyword is None \
                and _gives_optimizer_state(ctx, call.args[0].value):
            found.append(call)
    filled: set[tuple[int, str]] = set()
    for node in ctx.nodes(cst.Assign):
        target = node.targets[0].target
        if len(node.targets) == 1 and isinstance(target, cst.Subscript) and len(target.slice) == 1 \
                and isinstance(target.slice[0].slice, cst.Index):
            where = (id(enclosing_function(ctx, node)), spelled(ctx, target.value))
            if where not in filled and _optimizer_entry(ctx, key_text(target.slice[0].slice.value), node.value):
                filled.add(where)
                found.append(node)
    found.sort(key=ctx.order)
    outermost: list[cst.CSTNode] = []
    for node in found:
        if not any(ctx.contains(outer, node) for outer in outermost[-1:]):
            outermost.append(node)
    return [node for node in outermost if not _loaded_back(ctx, node)]


def _loaded_back(ctx: FileContext, node: cst.CSTNode) -> bool:
    """State built to be restored, not saved: an old checkpoint converted and handed (directly,
    or through plain ``a = b`` copies of its name in the same function) to a load or restore."""
    parent = ctx.parent(node)
    if isinstance(parent, cst.Arg) and restores_from_checkpoint(ctx.parent(parent)):
        return True
    if isinstance(node, cst.Assign):
        bound = node.targets[0].target.value
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is node:
        bound = parent.targets[0].target
    else:
        return False
    function = enclosing_function(ctx, node)
    if not isinstance(bound, cst.Name) or function is None:
        return False
    names = {bound.value}
    copies = [(a.targets[0].target.value, a.value.value) for a in ctx.nodes(cst.Assign)
              if ctx.contains(function, a) and len(a.targets) == 1
              and isinstance(a.targets[0].target, cst.Name) and isinstance(a.value, cst.Name)]
    grown = True
    while grown:
        grown = False
        for target, source in copies:
            if source in names and target not in names:
                names.add(target)
                grown = True
    return any(restores_from_checkpoint(call) and any(isinstance(a.value, cst.Name) and a.value.value in names
                                                      for a in call.args)
               for call in ctx.nodes(cst.Call) if ctx.contains(function, call))


def optimizer_restores(ctx: FileContext) -> list[cst.Call]:
    """Calls that restore an optimizer from saved state, in source order:
    ``optimizer.load_state_dict(ckpt["optimizer"])``, ``model.load_optim_state_dict(optimizer, ...)``,
    ``set_optimizer_state_dict(...)``; not a copy from a live object
    (``opt.load_state_dict(other.state_dict())``)."""
    found = []
    for call in ctx.nodes(cst.Call):
        name = last_name(call.func).lower()
        if not call.args or "state_dict" not in name or not name.startswith(("load", "set")):
            continue
        restores = named_like_optimizer(spelled(ctx, call.func.value)) if name == "load_state_dict" \
            and isinstance(call.func, cst.Attribute) else "optim" in name
        if restores and not any(holds_state(ctx, a.value) for a in call.args):
            found.append(call)
    return found


def words(name: str) -> set[str]:
    """The lowercased words of a name: ``load_checkpoint``, ``loadCheckpoint`` -> {"load",
    "checkpoint"}; ``set_dataloader`` has no word "load"."""
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)}


def name_words(expr: cst.BaseExpression) -> set[str]:
    """The words of a callee's last name."""
    return words(last_name(expr))


# The words of a call that loads or restores saved state.
RESTORE_WORDS = frozenset({"load", "reload", "restore", "resume"})


def restores_from_checkpoint(call: cst.Call) -> bool:
    """A call named like loading or restoring (``load_checkpoint``, ``self.restore_model``, ``resume``)."""
    return not name_words(call.func).isdisjoint(RESTORE_WORDS)
