from __future__ import annotations

import builtins

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import autocast_calls, call_spelling, calls_autocast, policies_of

_FUNCTION = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
_CUSTOM = {
    "forward": frozenset({"torch.amp.custom_fwd", "torch.cuda.amp.custom_fwd",
                          "torch.amp.autocast_mode.custom_fwd", "torch.cuda.amp.autocast_mode.custom_fwd"}),
    "backward": frozenset({"torch.amp.custom_bwd", "torch.cuda.amp.custom_bwd",
                           "torch.amp.autocast_mode.custom_bwd", "torch.cuda.amp.autocast_mode.custom_bwd"}),
}
_DECORATOR = {"forward": "custom_fwd", "backward": "custom_bwd"}
_BUILTINS = frozenset(dir(builtins))
# Modules whose functions work on Python values or pass tensors through unchanged.
_TRANSPARENT = frozenset({"torch", "math", "numpy", "operator", "functools", "itertools", "typing",
                          "warnings", "logging", "collections", "numbers", "einops"})


def _module_level_names(ctx: FileContext) -> set[str]:
    """Names bound by assignments, functions and classes at the top of the file."""
    names = set()
    for statement in ctx.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                    [small.target] if isinstance(small, cst.AnnAssign) else []
                names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names


def _opaque(ctx: FileContext, call: cst.Call, module_names: set[str]) -> bool:
    """A call autocast cannot see into: a kernel launch (``kernel[grid](...)``), a function
    imported from outside torch and the standard library (an extension's ``ext.op(...)``), or
    one the file defines or binds at its top (``ext = load(...)``; ``ext.op(...)``)."""
    func = call.func
    if isinstance(func, cst.Subscript):
        return True
    names = ctx.qualified_names(func)
    if names:
        return not any(n.split(".")[0] in _TRANSPARENT for n in names)
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name):
        return False
    if isinstance(func, cst.Name):
        return func.value not in _BUILTINS
    return root.value in module_names  # a method of a local value (a tensor, ctx) is not


def _needs_autocast_state(ctx: FileContext, method: cst.FunctionDef, module_names: set[str]) -> bool:
    """Whether the method's dtypes depend on autocast: it calls an op autocast casts (the
    policy table has it), uses ``@``, or calls code autocast cannot see into."""
    table = ctx.policy()
    for call in ctx.nodes(cst.Call):
        if ctx.contains(method, call) and (policies_of(table, call_spelling(ctx, call)) - {None}
                                            or _opaque(ctx, call, module_names)):
            return True
    return any(isinstance(op.operator, cst.MatrixMultiply) and ctx.contains(method, op)
               for op in ctx.nodes(cst.BinaryOperation))


def _may_fire(outline) -> bool:
    return calls_autocast(outline) or outline.refers_to(_CUSTOM["backward"])


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
    - a `backward` with `custom_bwd` whose `forward` lacks `custom_fwd` (in any file).

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
    themselves are checked for a missing pair; a Function used under autocast from another
    file is not seen.
    """

    code = "AMP014"
    name = "custom-function-without-custom-fwd"
    summary = "autograd.Function without custom_fwd/custom_bwd in code that uses autocast"
    uses_policy = True
    fragments = ((r"autocast", r"Function"), (r"custom_bwd", r"Function"))
    # Every region comes from an autocast call; a lone custom_bwd is a bug anywhere.
    may_fire = staticmethod(_may_fire)

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
    )

    def check(self, ctx: FileContext) -> None:
        uses_autocast = bool(autocast_calls(ctx))
        module_names = None
        for cls in ctx.nodes(cst.ClassDef):
            if not any(ctx.resolves_to(b.value, _FUNCTION) for b in cls.bases):
                continue
            methods = {stmt.name.value: stmt for stmt in cls.body.body
                       if isinstance(stmt, cst.FunctionDef) and stmt.name.value in _CUSTOM}
            decorated = {name: any(ctx.resolves_to(d.decorator.func if isinstance(d.decorator, cst.Call)
                                                   else d.decorator, _CUSTOM[name]) for d in method.decorators)
                         for name, method in methods.items()}
            where = cls.name.value
            if decorated.get("backward") and decorated.get("forward") is False:
                ctx.report(methods["forward"].name, f"`{where}.forward` has no `@torch.amp.custom_fwd"
                           "(device_type=...)`, which its backward's `custom_bwd` needs: the backward "
                           "raises AttributeError (`_fwd_used_autocast`)")
            elif decorated.get("forward") and decorated.get("backward") is False and uses_autocast:
                ctx.report(methods["backward"].name, f"`{where}.backward` has no `@torch.amp.custom_bwd"
                           "(device_type=...)`: it does not run in the autocast state its forward ran "
                           "in, so its dtypes may not match the saved tensors")
            elif decorated and not any(decorated.values()) and uses_autocast:
                if module_names is None:
                    module_names = _module_level_names(ctx)
                if any(_needs_autocast_state(ctx, m, module_names) for m in methods.values()):
                    for name, method in methods.items():
                        ctx.report(method.name, f"`{where}.{name}` has no `@torch.amp.{_DECORATOR[name]}"
                                   "(device_type=...)`: autocast does not know its dtypes")
