from __future__ import annotations

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import exclusive, scaler_events


class UnscaleTwice(Rule):
    """
    ## What it does
    Finds `S.unscale_(opt)` called a second time for the same optimizer before `S.update()`,
    or after `S.step(opt)` in the same iteration.

    ## Why is this bad?
    `unscale_` may run once per optimizer per iteration; a second call raises
    `RuntimeError: unscale_() has already been called on this optimizer since the last
    update()`. After `step(opt)` the gradients were already unscaled and consumed.

    ## Example
    ```python
    scaler.unscale_(optimizer)
    clip_grad_norm_(params, 1.0)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    ```

    ## Fix
    Remove the second call; unscale once, before anything that reads the gradients.

    ## Fix safety
    No automatic fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    Calls in different branches of an `if` are not counted together. Only calls in one
    function, in source order up to the next `S.update()` or scaled backward, are compared.
    """

    code = "AMP007"
    name = "unscale-twice"
    summary = "scaler.unscale_(opt) twice per iteration, or after scaler.step(opt)"
    fragments = (r"\.unscale_\(",)

    valid = (
        Valid("""
scaler.scale(loss).backward()
scaler.unscale_(opt_a)
scaler.unscale_(opt_b)
scaler.step(opt_a)
scaler.step(opt_b)
scaler.update()
"""),
        Valid("""
for batch in loader:
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
"""),
    )
    invalid = (
        Invalid("""
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(params, 1.0)
scaler.unscale_(optimizer)
scaler.step(optimizer)
scaler.update()
""", at=((5, 1, '`scaler.unscale_(optimizer)` again before `scaler.update()`'),)),
        Invalid("""
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.unscale_(optimizer)
log_grad_norms(model)
scaler.update()
""", at=((4, 1, '`scaler.unscale_(optimizer)` after `scaler.step(optimizer)`'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for events in scaler_events(ctx).values():
            unscaled: dict[tuple[str, str], list] = {}
            stepped: set[tuple[str, str]] = set()
            for e in events:
                if e.kind in ("update", "backward"):
                    unscaled = {k: v for k, v in unscaled.items() if k[0] != e.scaler}
                    stepped = {k for k in stepped if k[0] != e.scaler}
                    continue
                key = (e.scaler, e.argument or "")
                if e.kind == "step":
                    stepped.add(key)
                    continue
                earlier = [c for c in unscaled.get(key, []) if not exclusive(ctx, c, e.call)]
                if earlier:
                    ctx.report(e.call, f"`{e.scaler}.unscale_({e.argument})` again before "
                               f"`{e.scaler}.update()`: it raises at runtime")
                elif key in stepped:
                    ctx.report(e.call, f"`{e.scaler}.unscale_({e.argument})` after "
                               f"`{e.scaler}.step({e.argument})`: unscale before stepping")
                unscaled.setdefault(key, []).append(e.call)
