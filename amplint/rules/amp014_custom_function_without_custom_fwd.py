from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.autograd_functions import (
    autograd_functions,
    custom_methods,
    decorated,
    lower_precision_output,
    may_be_aliased_custom,
    mentions_autocast,
    mixed_ops,
    module_level_names,
    name_node,
    needs_autocast_state,
    parameter_passes,
    recomputation,
)
from ..engine.crossfile import located
from ..engine.enabling import enabling_site
from ..engine.regions import autocast_calls
from ..engine.rule import Invalid, Rule, Valid
from ..policy import PolicyError

_DECORATOR = {"forward": "custom_fwd", "backward": "custom_bwd"}


_LAYERS = """
import torch
from torch import nn
from example import ScaledMatmul
class Projection(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))
    def forward(self, x):
        return ScaledMatmul.apply(x, self.weight)
"""
_TRAIN = """
import torch
from layers import Projection
model = Projection(8)
with torch.autocast("cuda"):
    loss = model(torch.randn(4, 8)).sum()
loss.backward()
"""


class CustomFunctionWithoutCustomFwd(Rule):
    """
    ## What it does
    Finds `torch.autograd.Function` subclasses that autocast can break:
    - in a file that uses autocast, a Function whose `forward` or `backward` calls an op
      autocast casts (per the policy table: `mm`, `linear`, `@`, `softmax`, …) or code autocast
      cannot see into (a kernel launch, an extension's function), with neither
      `@torch.amp.custom_fwd(device_type=...)` on `forward` nor `@torch.amp.custom_bwd` on
      `backward`;
    - a `forward` with `custom_fwd` whose `backward` lacks `custom_bwd` (in such a file);
    - a `backward` with `custom_bwd` whose `forward` lacks `custom_fwd` (in any file);
    - in any file, a `backward` without `custom_bwd` that recomputes part of the forward: under
      `with torch.enable_grad():` it calls a module or function the Function was given (stored
      on `ctx` from a `forward` argument, or a value derived from one), directly or in a method
      of this file it calls (then the module is one that class's `__init__` stored on `self`).
      The finding sits on the recomputing call and names the backward;
    - in a file without autocast, in a project that enables it elsewhere (an autocast call, a
      framework's mixed-precision setting), a Function with neither decorator whose forward
      returns what an op autocast casts makes (`x.mm(w.t())`: float16 there) and whose
      backward meets that float16 gradient, in an op that needs one dtype (`mm`, `linear`,
      `@`, `einsum`), with a tensor the forward saved from an argument (`save_for_backward`,
      `ctx.weight = weight`), where a call in the project passes a module's float32 parameter
      in that argument's place: `Fn.apply(x, self.weight)` in a module's method, directly or
      through a function of the project that hands its argument to `apply`
      (`fused_linear(x, self.proj.weight)`). The finding sits on that op and names the
      autocast site, the call and the helper it goes through, also as related locations.

    ## Why is this bad?
    Autocast does not know what a custom Function's ops expect. Without `custom_fwd` its
    forward receives whatever dtypes autocast produced (often a mix of float16 and float32,
    which custom kernels reject) and its autocastable ops run in float16; the backward runs
    later, outside autocast, on float16 gradients and float32 saved tensors: "expected scalar
    type Half but found Float". `custom_bwd` runs the backward in the forward's autocast state,
    which `custom_fwd` records: `custom_bwd` alone raises AttributeError in the backward.

    ## Example
    ```python
    class LinearFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            return x.mm(weight.t())
        @staticmethod
        def backward(ctx, grad): ...
    ```

    ## Fix
    ```python
    class LinearFunction(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda")
        def forward(ctx, x, weight): ...
        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad): ...
    ```
    (`cast_inputs=torch.float32` for a forward that must run in float32.)

    ## Fix safety
    No automatic fix: whether the forward should run in float32 (`cast_inputs`) is the
    author's call.

    ## False positives
    A Function whose methods only call ops autocast leaves alone (elementwise math, views,
    `x.new(...)`) needs neither decorator and is not reported. Only files that use autocast
    themselves are checked for a missing pair; a Function defined elsewhere is reported only
    where its backward is shown to mix dtypes (above), and one that reads or sets the autocast
    state itself is not. A backward that casts the saved tensor (`weight.to(grad.dtype)`) or the
    gradient, multiplies elementwise (type promotion, no error) or uses only Python numbers is
    silent. That a module which passes a parameter runs inside the project's autocast region
    is not shown: a project that enables autocast only for other code (an evaluation of
    another model), or casts the whole model to float16, gets a false report. Recomputation is
    reported without autocast in the file (reversible and checkpointing Functions are library
    code run under the caller's autocast), except where the Function or the helper reads or
    sets the autocast state itself (`is_autocast_enabled`, an `autocast(...)` around the
    recomputation) or a decorator amplint cannot resolve may be `custom_bwd` under an alias
    (as it may for a Function defined elsewhere). A value stored on `ctx` from a forward argument and then
    called as a method under `enable_grad` is taken for a module, even where it is a tensor.
    """

    code = "AMP014"
    preview = True  # triaged precision below 0.9: docs/triage.md
    name = "custom-function-without-custom-fwd"
    summary = "autograd.Function without custom_fwd/custom_bwd whose dtypes autocast changes"
    uses_policy = True
    fragments = (("Function", "autocast"), ("Function", "custom_bwd"), ("Function", "enable_grad"),
                 ("Function", "backward"))  # rarer first
    # Every region comes from an autocast call; a lone custom_bwd is a bug anywhere, and so is a
    # backward that recomputes (under enable_grad) without custom_bwd; a backward that mixes
    # dtypes is one where another file of the project enables autocast.

    valid = (
        Valid("""
import torch
class LinearFunction(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x.mm(weight.t())

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad.mm(weight), grad.t().mm(x)
with torch.autocast("cuda"):
    y = LinearFunction.apply(x, w)
"""),
        # Only ops autocast leaves alone: the dtypes are the same with and without it.
        Valid("""
import torch
class GradMultiply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.new(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None
with torch.autocast("cuda"):
    y = GradMultiply.apply(x, 0.1)
"""),
        Valid("""
import torch
class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.mm(x)
"""),
        # Recomputation under the autocast state the forward recorded, as torch.utils.checkpoint does.
        Valid("""
import torch
class Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, x):
        ctx.run_function = run_function
        ctx.had_autocast = torch.is_autocast_enabled()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run_function(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad(), torch.autocast("cuda", enabled=ctx.had_autocast):
            out = ctx.run_function(x)
        torch.autograd.backward(out, grad)
        return None, x.grad
"""),
        # An alias amplint cannot follow may be custom_bwd (chosen by torch version elsewhere).
        Valid("""
import torch
from .utils import amp_custom_fwd, amp_custom_bwd
class Reversible(torch.autograd.Function):
    @staticmethod
    @amp_custom_fwd
    def forward(ctx, x, fn):
        ctx.fn = fn
        with torch.no_grad():
            return fn(x)

    @staticmethod
    @amp_custom_bwd
    def backward(ctx, grad):
        with torch.enable_grad():
            y = ctx.fn(ctx.x)
        return torch.autograd.grad(y, ctx.x, grad)[0], None
"""),
        # Run under the project's autocast elsewhere, but the backward casts what it saved.
        Valid("""
import torch
class ScaledMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight.t().to(grad.dtype), x.t().to(grad.dtype) @ grad
""", project=(("layers.py", _LAYERS), ("train.py", _TRAIN))),
    )
    invalid = (
        Invalid("""
import torch
from torch.autograd import Function
class LinearFunction(Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x.mm(weight.t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad.mm(weight), grad.t().mm(x)
with torch.autocast("cuda"):
    y = LinearFunction.apply(x, w)
""", at=((6, 9, '`LinearFunction.forward` has no `@torch.amp.custom_fwd(devic'), (11, 9, '`LinearFunction.backward` has no `@torch.amp.custom_bwd(devi'),)),
        # A compiled extension autocast cannot see into.
        Invalid("""
import torch
import roi_align_cuda
class RoIAlign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, rois):
        return roi_align_cuda.forward(features, rois)

    @staticmethod
    def backward(ctx, grad):
        return roi_align_cuda.backward(grad), None
with torch.autocast("cuda"):
    out = RoIAlign.apply(features, rois)
""", at=((6, 9, '`RoIAlign.forward` has no `@torch.amp.custom_fwd(device_type'), (10, 9, '`RoIAlign.backward` has no `@torch.amp.custom_bwd(device_typ'),)),
        # An extension the file loads itself, a kernel launch, an `@`: each decides its dtypes.
        Invalid("""
import torch
from torch.utils.cpp_extension import load
ext = load(name="ext", sources=["ext.cpp"])
class Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return ext.forward(x)
with torch.autocast("cuda"):
    y = Fused.apply(x)
""", at=((7, 9, '`Fused.forward` has no `@torch.amp.custom_fwd(device_type=...)'),)),
        Invalid("""
import torch
class Launch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty(x.shape)
        kernel[(x.numel(),)](x, out)
        return out
with torch.autocast("cuda"):
    y = Launch.apply(x)
""", at=((5, 9, '`Launch.forward` has no `@torch.amp.custom_fwd(device_type=...'),)),
        Invalid("""
import torch
class Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x @ w
with torch.autocast("cuda"):
    y = Project.apply(x, w)
""", at=((5, 9, '`Project.forward` has no `@torch.amp.custom_fwd(device_type=..'),)),
        Invalid("""
import torch
class Scale(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad @ w.t(), None
with torch.autocast("cuda"):
    y = Scale.apply(x, w)
""", at=((11, 9, '`Scale.backward` has no `@torch.amp.custom_bwd(device_type=.'),)),
        # custom_bwd reads what custom_fwd records: without it the backward raises.
        Invalid("""
from torch.autograd import Function
from torch.amp import custom_bwd
class Double(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        return grad * 2
""", at=((6, 9, '`Double.forward` has no `@torch.amp.custom_fwd(device_type=.'),)),
        # A reversible block: backward recomputes the module it was given, outside autocast.
        Invalid("""
import torch
class ReversibleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        with torch.no_grad():
            y = block(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        with torch.enable_grad():
            x = y.detach().requires_grad_()
            out = ctx.block(x)
        torch.autograd.backward(out, grad)
        return x.grad, None
""", at=((17, 19, "`ctx.block` re-runs a module or function the caller passed in, for `Rever"),)),
        # The recomputation lives in a method of the block class that backward calls.
        Invalid("""
import torch
from torch import nn
class Block(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def backward_pass(self, y, dy):
        with torch.enable_grad():
            y.requires_grad = True
            fy = self.f(y)
            fy.backward(dy)
        return y - fy.detach(), y.grad

class SequenceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, blocks):
        ctx.blocks = blocks
        for block in blocks:
            x = block(x)
        ctx.y = x.detach()
        return x

    @staticmethod
    def backward(ctx, dy):
        y = ctx.y
        for block in reversed(ctx.blocks):
            y, dy = block.backward_pass(y, dy)
        return dy, None
""", at=((12, 18, "`self.f` re-runs a module or function the caller passed in, for `SequenceFn.backward` (line 26)"),)),
        # Applied in another file, which passes a float32 parameter, under autocast in a third.
        Invalid("""
import torch
class ScaledMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight.t(), x.t() @ grad
""", at=((12, 16, "`grad @ weight.t()` in `ScaledMatmul.backward` multiplies the incoming gradient by the "
                         "forward's `weight`, which `Projection.forward` passes as `self.weight`, an `nn.Parameter`"),),
                project=(("layers.py", _LAYERS), ("train.py", _TRAIN))),
    )

    def check(self, ctx: AstContext) -> None:
        functions = autograd_functions(ctx)
        if not functions:
            return
        uses_autocast = bool(autocast_calls(ctx))
        module_names = None
        for cls in functions:
            methods = custom_methods(cls)
            decorations = {name: decorated(ctx, method, name) for name, method in methods.items()}
            where = cls.name
            recompute = None
            if decorations.get("backward") is False and not may_be_aliased_custom(ctx, methods["backward"]):
                recompute = recomputation(ctx, cls, methods["backward"])
            if recompute is not None:
                ctx.report(recompute, f"`{ctx.code(recompute.func)}` re-runs a module or function the caller passed "
                           f"in, for `{where}.backward` (line {methods['backward'].lineno}), which has no "
                           "`@torch.amp.custom_bwd`: this recomputation runs outside the autocast the forward ran "
                           "in, so float16 activations meet float32 weights; decorate `forward` with `custom_fwd` "
                           "and `backward` with `custom_bwd(device_type=...)`")
            elif decorations.get("backward") and decorations.get("forward") is False:
                ctx.report(name_node(ctx, methods["forward"]), f"`{where}.forward` has no `@torch.amp.custom_fwd"
                           "(device_type=...)`, which its backward's `custom_bwd` needs: the backward "
                           "raises AttributeError (`_fwd_used_autocast`)")
            elif decorations.get("forward") and decorations.get("backward") is False and uses_autocast:
                ctx.report(name_node(ctx, methods["backward"]), f"`{where}.backward` has no `@torch.amp.custom_bwd"
                           "(device_type=...)`: it does not run in the autocast state its forward ran "
                           "in, so its dtypes may not match the saved tensors")
            elif decorations and not any(decorations.values()) and uses_autocast and not mentions_autocast(cls):
                if module_names is None:
                    module_names = module_level_names(ctx)
                if any(needs_autocast_state(ctx, m, module_names) for m in methods.values()):
                    for name, method in methods.items():
                        ctx.report(name_node(ctx, method), f"`{where}.{name}` has no `@torch.amp.{_DECORATOR[name]}"
                                   "(device_type=...)`: autocast does not know its dtypes")
            elif len(decorations) == 2 and not any(decorations.values()) and not uses_autocast \
                    and not mentions_autocast(cls) and not any(may_be_aliased_custom(ctx, m) for m in methods.values()):
                self._check_backward_dtypes(ctx, cls, methods["forward"], methods["backward"])

    @staticmethod
    def _check_backward_dtypes(ctx: AstContext, cls: ast.ClassDef, forward: ast.FunctionDef,
                               backward: ast.FunctionDef) -> None:
        """A Function this file defines and another runs under the project's autocast: its
        backward multiplies the float16 gradient with a float32 parameter the forward saved."""
        enabling = enabling_site(ctx)
        if enabling is None:
            return
        site, where, site_related = enabling
        try:
            table = ctx.policy(site.device)
        except PolicyError:
            return
        output = lower_precision_output(ctx, forward, table)
        ops = mixed_ops(ctx, table, forward, backward) if output is not None else []
        passes = parameter_passes(ctx, cls, {position for _, position in ops}) if ops else []
        op, position, passed = next(((op, position, p) for op, position in ops for at, p in passes
                                     if at == position), (None, None, None))
        if passed is None:
            return
        name, device = cls.name, site.device or "cuda"
        half = "bfloat16" if site.dtype == "bfloat16" else "float16" if site.may_be_float16() else "half-precision"
        call, call_related = located(ctx, passed.path, passed.row, f"`{passed.code}` passes a float32 parameter")
        related = [site_related, call_related]
        through = ""
        if passed.helper is not None:
            helper, path, row, code = passed.helper
            applied, applied_related = located(ctx, path, row, f"`{helper}` hands it to `{name}.apply`")
            through = f" through `{helper}` (`{code}`, {applied})"
            related.append(applied_related)
        param = forward.args.args[position + 1].arg
        ctx.report(op, f"`{ctx.code(op)}` in `{name}.backward` multiplies the incoming gradient by the forward's "
                       f"`{param}`, which `{passed.method}` passes{through} as {passed.parameter} (`{passed.code}`, "
                       f"{call}): under this project's autocast ({where}) the forward's `{ctx.code(output)}` gives "
                       f"{half}, so does the gradient, while the backward runs outside autocast: {half} meets "
                       f"float32 and the op raises; decorate `forward` with `@torch.amp.custom_fwd(device_type="
                       f"\"{device}\")` and `backward` with `@torch.amp.custom_bwd(device_type=\"{device}\")`",
                   related=tuple(related))
