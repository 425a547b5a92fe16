from __future__ import annotations

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import exclusive, scaler_events


class ScalerStepWithoutUpdate(Rule):
    """
    ## What it does
    In a function that runs a whole scaled iteration (`S.scale(loss).backward()` and
    `S.step(...)`), finds: a `S.step(...)` with no `S.update()` after it; a `S.update()` that
    comes before the steps; and `S.update()` called more than once per iteration (with several
    optimizers, step each one, then update once).

    ## Why is this bad?
    `update()` is what adapts the loss scale: without it the scale never grows back after an
    overflow and never shrinks, so steps keep being skipped or gradients keep underflowing.
    Updating before stepping uses the wrong iteration's overflow record, and updating twice
    per iteration halves/grows the scale twice and loses the other optimizers' inf checks.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(opt_a)
    scaler.update()
    scaler.step(opt_b)
    scaler.update()
    ```

    ## Fix
    ```python
    scaler.scale(loss).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    ```

    ## Fix safety
    No automatic fix: where the update belongs depends on the loop's structure.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    Only functions that contain both the scaled backward and the step are checked, so a
    `step()` helper whose caller updates is not reported. Updates in different branches of an
    `if` count as one.
    """

    code = "AMP006"
    name = "scaler-step-without-update"
    summary = "GradScaler step without exactly one update after it"
    fragments = (r"\.scale\(",)

    valid = (
        Valid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
"""),
        Valid("""
def step(self):
    self.scaler.step(self.optimizer)
"""),
        Valid("""
scaler.scale(loss).backward()
if accumulate_done:
    scaler.step(optimizer)
    scaler.update()
"""),
    )
    invalid = (
        Invalid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    scaler.step(optimizer)
    optimizer.zero_grad()
""", at=((4, 5, '`scaler.step(...)` is never followed by `scaler.update()`'),)),
        Invalid("""
for batch in loader:
    scaler.update()
    scaler.scale(model(batch).mean()).backward()
    scaler.step(optimizer)
""", at=((3, 5, '`scaler.update()` runs before `scaler.step(...)`'),)),
        Invalid("""
scaler.scale(loss).backward()
scaler.step(opt_a)
scaler.update()
scaler.step(opt_b)
scaler.update()
""", at=((6, 1, '`scaler.update()` is called more than once per iteration'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for events in scaler_events(ctx).values():
            for scaler in {e.scaler for e in events}:
                mine = [e for e in events if e.scaler == scaler]
                if not any(e.kind == "backward" for e in mine):
                    continue
                steps = [e for e in mine if e.kind == "step"]
                updates = [e for e in mine if e.kind == "update"]
                if not steps:
                    continue
                last_step = steps[-1]
                after = [u for u in updates if ctx.order(u.call) > ctx.order(last_step.call)]
                if not after:
                    if updates:
                        ctx.report(updates[0].call, f"`{scaler}.update()` runs before "
                                   f"`{scaler}.step(...)`: update once, after every step")
                    else:
                        ctx.report(last_step.call, f"`{scaler}.step(...)` is never followed by "
                                   f"`{scaler}.update()`: the loss scale never adapts")
                    continue
                for i, update in enumerate(updates[1:], start=1):
                    if not any(exclusive(ctx, update.call, u.call) for u in updates[:i]):
                        ctx.report(update.call, f"`{scaler}.update()` is called more than once per "
                                   "iteration: step every optimizer, then update once")
