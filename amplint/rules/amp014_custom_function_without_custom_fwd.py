from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import autocast_calls, calls_autocast

_FUNCTION = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
_CUSTOM = {
    "forward": frozenset({"torch.amp.custom_fwd", "torch.cuda.amp.custom_fwd",
                          "torch.amp.autocast_mode.custom_fwd", "torch.cuda.amp.autocast_mode.custom_fwd"}),
    "backward": frozenset({"torch.amp.custom_bwd", "torch.cuda.amp.custom_bwd",
                           "torch.amp.autocast_mode.custom_bwd", "torch.cuda.amp.autocast_mode.custom_bwd"}),
}


class CustomFunctionWithoutCustomFwd(Rule):
    """
    ## What it does
    In a file that uses autocast, finds `torch.autograd.Function` subclasses whose `forward`
    lacks `@torch.amp.custom_fwd(device_type=...)` or whose `backward` lacks
    `@torch.amp.custom_bwd(device_type=...)`.

    ## Why is this bad?
    Autocast does not know what a custom Function's ops expect. Without `custom_fwd` its
    forward receives whatever dtypes autocast produced (often a mix of float16 and float32,
    which custom kernels reject), and without `custom_bwd` the backward runs with a different
    autocast state than the forward, so its dtypes do not match the saved tensors.

    ## Example
    ```python
    class Swish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): ...
        @staticmethod
        def backward(ctx, g): ...
    ```

    ## Fix
    ```python
    class Swish(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda")
        def forward(ctx, x): ...
        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, g): ...
    ```
    (`cast_inputs=torch.float32` for a forward that must run in float32.)

    ## Fix safety
    No automatic fix: whether the forward should run in float32 (`cast_inputs`) is the
    author's call.

    ## False positives
    Only files that use autocast themselves are checked; a Function used under autocast from
    another file is not seen.
    """

    code = "AMP014"
    name = "custom-function-without-custom-fwd"
    summary = "autograd.Function without custom_fwd/custom_bwd in code that uses autocast"
    fragments = ((r"autocast", r"Function"),)  # only files that use autocast are checked
    may_fire = staticmethod(calls_autocast)  # every region comes from an autocast call

    valid = (
        Valid("""
import torch
class Swish(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * torch.sigmoid(x)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g
with torch.autocast("cuda"):
    y = Swish.apply(x)
"""),
        Valid("""
import torch
class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x
"""),
    )
    invalid = (
        Invalid("""
import torch
from torch.autograd import Function
class Swish(Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        return g
with torch.autocast("cuda"):
    y = Swish.apply(x)
""", count=2),
    )

    def check(self, ctx: FileContext) -> None:
        if not autocast_calls(ctx):
            return
        for cls in ctx.nodes(cst.ClassDef):
            if not any(ctx.resolves_to(b.value, _FUNCTION) for b in cls.bases):
                continue
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value in _CUSTOM:
                    wanted = _CUSTOM[stmt.name.value]
                    decorated = any(ctx.resolves_to(d.decorator.func if isinstance(d.decorator, cst.Call)
                                                    else d.decorator, wanted) for d in stmt.decorators)
                    if not decorated:
                        which = "custom_fwd" if stmt.name.value == "forward" else "custom_bwd"
                        ctx.report(stmt.name, f"`{cls.name.value}.{stmt.name.value}` has no "
                                   f"`@torch.amp.{which}(device_type=...)`: autocast does not "
                                   "know its dtypes")
