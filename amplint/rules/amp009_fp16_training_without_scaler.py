from __future__ import annotations

from ..engine.context import FileContext
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import (
    autocast_calls,
    calls,
    calls_autocast,
    enclosing_function,
    is_backward,
    known_scalers,
    method_call,
    region_dtype,
)


class Fp16TrainingWithoutScaler(Rule):
    """
    ## What it does
    Finds a float16 autocast region — `dtype=torch.float16`, or no dtype on a device whose
    default is float16 per the policy tables (cuda, xpu, mps, mtia) — in a function that also
    runs a backward pass, when no GradScaler is in sight: none is built in the file, none is
    passed in (`scaler`, `grad_scaler`, `amp_scaler`), and nothing calls `.scale(...)`.

    ## Why is this bad?
    float16 cannot represent gradients below about 6e-8 (or 6e-5 at full precision): small
    gradients flush to zero and the model silently stops learning in places. PyTorch's AMP
    recipe pairs float16 autocast with `torch.amp.GradScaler`. bfloat16 does not need one.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Fix
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    or use `dtype=torch.bfloat16` where the hardware supports it.

    ## Fix safety
    No automatic fix: the scaler has to be threaded through the loop and its checkpoint.

    ## False positives
    Frameworks that scale for you call the backward with the loss as an argument
    (`accelerator.backward(loss)`, `engine.backward(loss)`), which does not count as a backward
    here. A region whose dtype is an expression is not judged.
    """

    code = "AMP009"
    name = "fp16-training-without-scaler"
    summary = "float16 autocast training with no GradScaler"
    uses_policy = True
    fragments = (("autocast", AnyOf("backward", "autograd")),)  # a region and a backward pass
    may_fire = staticmethod(calls_autocast)  # every region comes from an autocast call

    valid = (
        Valid("""
import torch
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda"):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""),
        Valid("""
import torch
def train_step(model, x, y, optimizer):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""),
        Valid("""
import torch
@torch.no_grad()
def predict(model, x):
    with torch.autocast("cuda"):
        return model(x)
"""),
        Valid("""
import torch
def train_step(accelerator, model, x, y):
    with torch.autocast("cuda"):
        loss = model(x, y)
    accelerator.backward(loss)
"""),
    )
    invalid = (
        Invalid("""
import torch
def train_step(model, x, y, optimizer):
    with torch.autocast(device_type="cuda"):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
""", at=((4, 10, 'float16 autocast with a backward pass but no GradScaler'),)),
        Invalid("""
import torch
for x, y in loader:
    with torch.amp.autocast("cpu", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
""", at=((4, 10, 'float16 autocast with a backward pass but no GradScaler'),)),
    )

    def check(self, ctx: FileContext) -> None:
        if known_scalers(ctx) or any((mc := method_call(c)) and mc[1] == "scale" for c in calls(ctx)):
            return
        backward_scopes = {id(enclosing_function(ctx, c)) for c in calls(ctx) if is_backward(ctx, c)}
        for ac in autocast_calls(ctx):
            if ac.enabled is False or id(enclosing_function(ctx, ac.node)) not in backward_scopes:
                continue
            if region_dtype(ctx, ac) == "float16":
                ctx.report(ac.node, "float16 autocast with a backward pass but no GradScaler: small "
                                    "gradients underflow to zero; use torch.amp.GradScaler (or bfloat16)")
