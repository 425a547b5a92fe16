from __future__ import annotations

from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import (
    calls,
    enclosing_function,
    exclusive,
    method_call,
    named_like_optimizer,
    scaler_events,
)


class OptimizerStepBypassesScaler(Rule):
    """
    ## What it does
    Finds `optimizer.step()` called directly in a function that scales the loss with
    `S.scale(loss).backward()`, where the step can run after that backward (not in the other
    branch of an `if`).

    ## Why is this bad?
    The gradients are still multiplied by the loss scale, so the update is tens of thousands of
    times too large, and steps with inf/NaN gradients are applied instead of skipped.
    `S.step(optimizer)` unscales first and skips bad steps.

    ## Example
    ```python
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
    ```

    ## Fix
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    Safe when the function has no `S.step(...)` at all (the direct step is the only step). When
    it already calls `S.step(...)` too, the direct call is a second step: reported without a fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    The optimizer is recognised by name (`optimizer`, `optim`, `opt`, `opt_*`, `*_opt`), so a
    step on something else named like an optimizer would be reported; schedulers are excluded.
    """

    code = "AMP005"
    name = "optimizer-step-bypasses-scaler"
    summary = "optimizer.step() after a scaled backward, bypassing the GradScaler"
    fixable = True
    fragments = (r"\.scale\(",)

    valid = (
        Valid("""
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
scheduler.step()
"""),
        Valid("""
if scaler is not None:
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
else:
    loss.backward()
    optimizer.step()
"""),
        Valid("""
def step(scaler, loss, optimizer):
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
"""),
    )
    invalid = (
        Invalid("""
def train_step(model, batch, optimizer, scaler):
    loss = model(batch).mean()
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
""", fixed="""
def train_step(model, batch, optimizer, scaler):
    loss = model(batch).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((5, 5, '`optimizer.step()` after `scaler.scale(...).backward()` step'),)),
        Invalid("""
self.scaler.scale(loss).backward()
self.scaler.step(self.optimizer)
self.optimizer.step()
self.scaler.update()
""", at=((4, 1, '`self.optimizer.step()` after `self.scaler.scale(...).backwa'),)),
    )

    def check(self, ctx: FileContext) -> None:
        events = scaler_events(ctx)
        for call in calls(ctx):
            mc = method_call(call)
            if mc is None or mc[1] != "step" or call.args or not named_like_optimizer(ctx.code(mc[0])):
                continue
            scope = events.get(id(enclosing_function(ctx, call)), [])
            if ctx.code(mc[0]) in {e.scaler for e in scope}:
                continue
            before = [e for e in scope if e.kind == "backward" and ctx.order(e.call) < ctx.order(call)
                      and not exclusive(ctx, e.call, call)]
            if not before:
                continue
            scaler = before[-1].scaler
            optimizer = ctx.code(mc[0])
            fix = None
            if not any(e.kind == "step" for e in scope):
                fix = Fix(f"Use `{scaler}.step({optimizer})`",
                          (ctx.replace(call, f"{scaler}.step({optimizer})"),))
            ctx.report(call, f"`{optimizer}.step()` after `{scaler}.scale(...).backward()` steps on "
                             f"scaled gradients: use `{scaler}.step({optimizer})`", fix)
