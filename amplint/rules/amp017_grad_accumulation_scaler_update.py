from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import scaler_events

_LOOPS = (cst.For, cst.While)


def _accumulation_if(ctx: FileContext, node: cst.CSTNode) -> cst.If | None:
    """The nearest ``if`` around ``node`` whose test uses ``%`` (``if (i + 1) % k == 0:``)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.If):
            found = []

            class FindModulo(cst.CSTVisitor):
                def visit_Modulo(self, op: cst.Modulo) -> None:
                    found.append(op)

            ancestor.test.visit(FindModulo())
            if found:
                return ancestor
        if isinstance(ancestor, (cst.FunctionDef, *_LOOPS)):
            return None
    return None


class GradAccumulationScalerUpdate(Rule):
    """
    ## What it does
    With gradient accumulation — `S.step(opt)` under `if (i + 1) % k == 0:` — finds
    `S.update()` outside that condition, in the same loop.

    ## Why is this bad?
    `update()` must follow a `step()` in the same iteration: called on the iterations that did
    not step, it adjusts the scale with no inf check recorded (it raises "No inf checks were
    recorded prior to update" on the first such iteration).

    ## Example
    ```python
    for i, batch in enumerate(loader):
        scaler.scale(loss_of(batch) / k).backward()
        if (i + 1) % k == 0:
            scaler.step(optimizer)
            optimizer.zero_grad()
        scaler.update()
    ```

    ## Fix
    ```python
        if (i + 1) % k == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    ```

    ## Fix safety
    No automatic fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    None known: only an update in the same loop as the conditional step is reported.
    """

    code = "AMP017"
    name = "grad-accumulation-scaler-update"
    summary = "scaler.update() outside the gradient-accumulation condition of scaler.step()"
    # A scaler, and `.step` and `.update` calls.
    fragments = ((AnyOf("scaler", "Scaler", r"\.scale\("), r"\.\s*step\b", r"\.\s*update\b"),)

    valid = (
        Valid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""),
    )
    invalid = (
        Invalid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k == 0:
        scaler.step(optimizer)
        optimizer.zero_grad()
    scaler.update()
""", at=((7, 5, '`scaler.update()` runs on every iteration but `scaler.step(.'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for events in scaler_events(ctx).values():
            for step in (e for e in events if e.kind == "step"):
                condition = _accumulation_if(ctx, step.call)
                if condition is None:
                    continue
                loop = next((a for a in ctx.ancestors(condition) if isinstance(a, _LOOPS)), None)
                if loop is None:
                    continue
                for update in (e for e in events if e.kind == "update" and e.scaler == step.scaler):
                    ancestors = list(ctx.ancestors(update.call))
                    if condition not in ancestors and loop in ancestors:
                        ctx.report(update.call, f"`{update.scaler}.update()` runs on every iteration but "
                                   f"`{step.scaler}.step(...)` only when the accumulation condition "
                                   "holds: move the update under that condition")
