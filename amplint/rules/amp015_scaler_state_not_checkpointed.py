from __future__ import annotations

import re

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import calls, enclosing_function, known_scalers, named_like_optimizer

_SAVE = frozenset({"torch.save"})


def _state_dict_calls(ctx: FileContext, node: cst.CSTNode) -> list[cst.Call]:
    """``x.state_dict()`` / ``x.load_state_dict(...)`` calls inside ``node`` (by walk order:
    walking each function's subtree again is slow on large trainers)."""
    return [c for c in calls(ctx) if isinstance(c.func, cst.Attribute)
            and c.func.attr.value in ("state_dict", "load_state_dict") and ctx.contains(node, c)]


def _is_scaler(code: str, in_scope: set[str]) -> bool:
    return code in in_scope or "scaler" in code.split(".")[-1].lower()


class ScalerStateNotCheckpointed(Rule):
    """
    ## What it does
    Where a GradScaler is in scope (used in the same function, or bound to `self.` in the same
    class), finds a checkpoint — `torch.save` of a payload with `.state_dict()` calls — that
    saves no `scaler.state_dict()`, and a resume that loads state dicts
    (`optimizer.load_state_dict(...)`) but never `scaler.load_state_dict(...)`.

    ## Why is this bad?
    The scaler's state (the current loss scale and its growth tracker) is part of the
    training state. A run resumed without it restarts at a scale of 65536: the first steps
    overflow and are skipped, or, after a long run at a small scale, gradients underflow.
    PyTorch's AMP examples save and load it with the model and optimizer.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    ```

    ## Fix
    ```python
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)
    ```

    ## Fix safety
    No automatic fix: the key name and the loading side are the author's.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    A scaler state saved or restored anywhere in the same class (a separate resume helper), or
    through any attribute named like a scaler, counts. The resume side is only checked where an optimizer (named like one: `optimizer`, `opt`,
    `optim*`) is restored from a checkpoint; loading model or EMA weights alone is not a
    resume. A scaler saved by another function (a separate `state_dict()` method of a trainer) is not
    seen when `torch.save` is called elsewhere with `trainer.state_dict()`; that payload has
    no scaler in scope, so it is not reported either.
    """

    code = "AMP015"
    name = "scaler-state-not-checkpointed"
    summary = "Checkpoint saved or loaded without the GradScaler's state"
    fragments = ((AnyOf("scaler", "Scaler", r"\.scale\("), AnyOf("save", "state_dict")),)  # a scaler, a checkpoint
    # What it reports: a torch.save call, or a load_state_dict call.
    may_fire = staticmethod(lambda outline: bool(outline.calls_to(_SAVE)
                                                 or outline.method_calls("load_state_dict")))

    valid = (
        Valid("""
import torch
def save(model, optimizer, scaler, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)

def load(model, optimizer, scaler, path):
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
"""),
        Valid("""
import torch
def save(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""),
    )
    valid = valid + (
        Valid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    def resume(self, ckpt):
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self._restore_amp(ckpt)

    def _restore_amp(self, ckpt):
        self.scaler.load_state_dict(ckpt["scaler"])
"""),
    )
    invalid = (
        Invalid("""
import torch
def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)
""", at=((10, 5, 'checkpoint without `scaler.state_dict()`'),)),
        Invalid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    def resume(self, path):
        ckpt = torch.load(path)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
""", at=((10, 9, 'state restored without `self.scaler.load_state_dict(...)`'),)),
    )

    def check(self, ctx: FileContext) -> None:
        scalers = known_scalers(ctx)
        if not scalers:
            return
        by_function: dict[int, list[cst.Call]] = {}
        functions: dict[int, cst.FunctionDef] = {}
        for call in calls(ctx):
            func = enclosing_function(ctx, call)
            if func is not None:
                by_function.setdefault(id(func), []).append(call)
                functions[id(func)] = func
        for key, func_calls in by_function.items():
            func = functions[key]
            in_scope = self._scalers_in_scope(ctx, func, scalers)
            if not in_scope:
                continue
            state_calls = _state_dict_calls(ctx, func)
            # The scaler's state may be handled elsewhere in the class (a resume helper).
            cls = next((a for a in ctx.ancestors(func) if isinstance(a, cst.ClassDef)), None)
            handled = _state_dict_calls(ctx, cls) if cls is not None else state_calls
            if any(_is_scaler(ctx.code(c.func.value), in_scope) for c in handled):
                continue
            assignments = None
            # A resume restores an optimizer from a checkpoint (not `opt.load_state_dict(opt.state_dict())`).
            loads = [c for c in state_calls if c.func.attr.value == "load_state_dict"
                     and named_like_optimizer(ctx.code(c.func.value)) and c.args
                     and not _state_dict_calls(ctx, c.args[0].value)]
            for call in func_calls:
                if ctx.resolves_to(call.func, _SAVE) and call.args:
                    payload = call.args[0].value
                    if isinstance(payload, cst.Name):
                        if assignments is None:
                            assignments = self._assignments(ctx, func)
                        payload = assignments.get(payload.value, payload)
                    if any(c.func.attr.value == "state_dict" for c in _state_dict_calls(ctx, payload)):
                        ctx.report(call, f"checkpoint without `{sorted(in_scope)[0]}.state_dict()`: a "
                                         "resumed run restarts the loss scale")
            if loads:
                ctx.report(loads[0], f"state restored without `{sorted(in_scope)[0]}.load_state_dict(...)`: "
                                     "the loss scale restarts from its initial value")

    @staticmethod
    def _scalers_in_scope(ctx: FileContext, func, scalers: set[str]) -> set[str]:
        if func is None:
            return set()
        def mentions(code: str, name: str) -> bool:
            return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", code) is not None

        code = ctx.code(func)
        found = {s for s in scalers if mentions(code, s)}
        cls = next((a for a in ctx.ancestors(func) if isinstance(a, cst.ClassDef)), None)
        if cls is not None:
            cache = ctx.__dict__.setdefault("_class_code", {})
            class_code = cache.setdefault(id(cls), ctx.code(cls))
            found |= {s for s in scalers if s.startswith("self.") and mentions(class_code, s)}
        return found

    @staticmethod
    def _assignments(ctx: FileContext, body) -> dict[str, cst.BaseExpression]:
        found: dict[str, cst.BaseExpression] = {}

        class Collect(cst.CSTVisitor):
            def visit_Assign(self, node: cst.Assign) -> None:
                for t in node.targets:
                    if isinstance(t.target, cst.Name):
                        found[t.target.value] = node.value

        body.visit(Collect())
        return found
