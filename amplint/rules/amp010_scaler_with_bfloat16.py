from __future__ import annotations

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import autocast_calls, enclosing_function, region_dtype, scaler_events


class ScalerWithBfloat16(Rule):
    """
    ## What it does
    Finds `S.scale(loss).backward()` in a function whose autocast regions all run in bfloat16
    (explicitly, or by the device's default per the policy tables, e.g. cpu).

    ## Why is this bad?
    bfloat16 has float32's exponent range, so gradients do not underflow and loss scaling buys
    nothing; it only adds an unscale pass and inf checks per step, and skips steps for no
    reason after a genuine overflow. Informational.

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## Fix
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    No automatic fix (the scaler's step, update and checkpoint go too).

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    A function whose regions use float16 or an expression for the dtype is not reported:
    code that switches dtypes at run time keeps its scaler.
    """

    code = "AMP010"
    name = "scaler-with-bfloat16"
    summary = "GradScaler used with bfloat16 autocast (not needed)"
    uses_policy = True
    fragments = (r"\.scale\(",)

    valid = (
        Valid("""
import torch
with torch.autocast("cuda", dtype=amp_dtype):
    loss = model(x)
scaler.scale(loss).backward()
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    loss = model(x)
scaler.scale(loss).backward()
"""),
    )
    invalid = (
        Invalid("""
import torch
def step(model, x, scaler, optimizer):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((6, 5, '`scaler` scales a bfloat16 loss'),)),
        Invalid("""
import torch
with torch.autocast("cpu"):
    loss = model(x).mean()
scaler.scale(loss).backward()
""", at=((5, 1, '`scaler` scales a bfloat16 loss'),)),
    )

    def check(self, ctx: FileContext) -> None:
        regions: dict[int, list] = {}
        for ac in autocast_calls(ctx):
            if ac.enabled is not False:
                regions.setdefault(id(enclosing_function(ctx, ac.node)), []).append(ac)
        for scope, events in scaler_events(ctx).items():
            scope_regions = regions.get(scope, [])
            if not scope_regions or any(region_dtype(ctx, ac) != "bfloat16" for ac in scope_regions):
                continue
            for e in events:
                if e.kind == "backward":
                    ctx.report(e.call, f"`{e.scaler}` scales a bfloat16 loss: bfloat16 does not "
                               "underflow like float16, so the GradScaler is not needed")
