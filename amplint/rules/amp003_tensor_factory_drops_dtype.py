from __future__ import annotations

import ast

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.outline import Outline
from ..engine.rule import PARENTHESIZED, AnyOf, Invalid, Rule, Valid, call_with
from ..engine.semantics import autocast_region, calls, calls_autocast, enclosing_function, has_star_args

_FACTORIES = {
    "torch.zeros": "new_zeros", "torch.ones": "new_ones", "torch.empty": "new_empty",
    "torch.full": "new_full", "torch.tensor": "new_tensor",
}
# Keywords the new_* methods accept besides dtype and device.
_KEPT_KEYWORDS = {"requires_grad", "layout", "pin_memory"}


# Names of tensors that hold integers or booleans: a float32 tensor made on their device is
# what the author wants, and `new_zeros` would make it integer.
_NON_FLOAT_HINTS = ("ids", "idx", "index", "indices", "mask", "len", "label", "target", "count")


def _parameter_like(attribute: str) -> bool:
    return attribute in ("weight", "bias") or attribute.endswith(("_weight", "_bias"))


def _float_like(name: str) -> bool:
    lowered = name.lower()
    return name not in ("self", "cls") and not any(h in lowered for h in _NON_FLOAT_HINTS)


def _buffers_named_in(ctx: FileContext, cls: cst.ClassDef) -> set[str]:
    """The strings of a class that calls ``register_buffer``: the names of its buffers among
    them, however they are registered (``for name in ("mean", "std"): ...`` included)."""
    calls = [c for c in ctx.nodes(cst.Call) if isinstance(c.func, cst.Attribute)
             and c.func.attr.value == "register_buffer" and ctx.contains(cls, c)]
    if not calls:
        return set()
    return {s.evaluated_value for s in ctx.nodes(cst.SimpleString)
            if ctx.contains(cls, s) and isinstance(s.evaluated_value, str)}


def _float_tensor(ctx: FileContext, source: cst.BaseExpression, cls: cst.ClassDef | None) -> bool:
    """Whether ``source`` (the x of ``device=x.device``) is plausibly a floating tensor: a
    name, subscript or ``self.weight``-like parameter, not a module (``self.model.device``)
    and not named like an index or a mask."""
    root = source
    while isinstance(root, cst.Subscript):
        root = root.value
    if isinstance(root, cst.Call) and isinstance(root.func, cst.Name) and root.func.value == "next" \
            and "parameters" in ctx.code(root):
        return True  # next(self.parameters()): a parameter
    if isinstance(root, cst.Name):
        name = root.value
    elif isinstance(root, cst.Attribute) and isinstance(root.value, cst.Name) and root.value.value == "self":
        name = root.attr.value
        # Parameters and buffers; any other attribute of a module may be a module itself.
        if not (_parameter_like(name) or (cls is not None and name in _buffers_named_in(ctx, cls))):
            return False
    else:
        return False
    return _float_like(name)


def _buffers_named_in_file(outline: Outline) -> set[str]:
    """``_buffers_named_in`` for the whole file."""
    if not outline.method_calls("register_buffer"):
        return set()
    return {c.value for c in outline.nodes(ast.Constant) if isinstance(c.value, str)}


def _plausible_float_tensor(outline: Outline, source: ast.expr) -> bool:
    """``_float_tensor`` on the ast, as far as the ast shows it (any registered buffer counts)."""
    root = source
    while isinstance(root, ast.Subscript):
        root = root.value
    if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "next":
        return True
    if isinstance(root, ast.Name):
        name = root.id
    elif isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name) and root.value.id == "self":
        name = root.attr
        if not (_parameter_like(name) or name in _buffers_named_in_file(outline)):
            return False
    else:
        return False
    return _float_like(name)


def _may_make_float(outline: Outline, call: ast.Call, keywords: dict[str, ast.expr]) -> bool:
    """``_makes_float`` on the ast, loosely: ``torch.tensor`` of a list or tuple, ``torch.full``
    with a fill value that is neither a name nor an int."""
    names = outline.qualified_names(call.func)
    if "torch.tensor" in names:
        data = keywords.get("data", call.args[0] if call.args else None)
        return isinstance(data, (ast.List, ast.Tuple))
    if "torch.full" in names:
        fill = keywords.get("fill_value", call.args[1] if len(call.args) > 1 else None)
        return fill is not None and not isinstance(fill, ast.Name) \
            and not (isinstance(fill, ast.Constant) and type(fill.value) is int)
    return True


def _candidate(outline: Outline, call: ast.Call) -> bool:
    """What check() reports, as far as the ast shows it: ``device=<x>.device`` with ``x``
    plausibly a floating tensor, no dtype other than ``x.dtype``, no ``*args``/``**kwargs``,
    and without a dtype, a call that may make a floating tensor."""
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    keywords = {k.arg: k.value for k in call.keywords}
    device, dtype = keywords.get("device"), keywords.get("dtype")
    if not (isinstance(device, ast.Attribute) and device.attr == "device"):
        return False
    if dtype is not None and not (isinstance(dtype, ast.Attribute) and dtype.attr == "dtype"
                                  and ast.dump(dtype.value) == ast.dump(device.value)):
        return False
    if dtype is None and not _may_make_float(outline, call, keywords):
        return False
    return _plausible_float_tensor(outline, device.value)


def _may_fire(outline: Outline) -> bool:
    candidates = [c for c in outline.calls_to(_FACTORIES.keys()) if _candidate(outline, c)]
    if not candidates:
        return False
    in_forward = outline.calls_in_methods("forward")
    return any(id(c) in in_forward for c in candidates) or calls_autocast(outline)


def _chain_without_calls(expr: cst.BaseExpression) -> bool:
    """``x``, ``self.weight``, ``batch["x"]``: evaluating it again (or first) cannot matter."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return isinstance(expr, cst.Name)


_FLOAT_CONSTANTS = frozenset({"math.inf", "math.nan", "math.pi", "math.e", "math.tau",
                              "numpy.inf", "numpy.nan", "numpy.pi", "numpy.e"})


def _evidently_float(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """A Python number that is a float whatever the variables hold: ``0.5``, ``-1e9``,
    ``float("-inf")``, ``1 / n``, ``math.pi``, ``torch.finfo(t).min``."""
    if isinstance(expr, cst.UnaryOperation):
        return _evidently_float(ctx, expr.expression)
    if isinstance(expr, cst.Float):
        return True
    if isinstance(expr, cst.Call):
        return isinstance(expr.func, cst.Name) and expr.func.value == "float"
    if isinstance(expr, cst.BinaryOperation):
        return isinstance(expr.operator, cst.Divide) or _evidently_float(ctx, expr.left) \
            or _evidently_float(ctx, expr.right)
    if isinstance(expr, cst.Attribute):
        if isinstance(expr.value, cst.Call) and ctx.resolves_to(expr.value.func, {"torch.finfo"}):
            return True
        return ctx.resolves_to(expr, _FLOAT_CONSTANTS) is not None
    return False


def _float_data(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """``torch.tensor`` data that makes a floating tensor of one dimension or more: a list or
    tuple with a float in it (``[0.5, 2]``). A lone number makes a 0-dim tensor, which does
    not change the dtype of the tensors it meets; ints, and data whose type the code does not
    show (a variable, ``[self.token_id] * n``), are left alone."""
    if not isinstance(expr, (cst.List, cst.Tuple)):
        return False
    values = [e.value for e in expr.elements if isinstance(e, cst.Element)]
    return any(_evidently_float(ctx, v) or _float_data(ctx, v) for v in values)


def _makes_float(ctx: FileContext, factory: str, call: cst.Call, keywords: dict[str, cst.Arg]) -> bool:
    """Whether the call, without ``dtype=``, makes a floating tensor: zeros, ones and empty
    always do; ``torch.full`` takes the type of its fill value (an int fill makes int64);
    ``torch.tensor`` infers it from its data."""
    positional = [a.value for a in call.args if a.keyword is None]
    if factory == "torch.tensor":
        data = keywords["data"].value if "data" in keywords else (positional[0] if positional else None)
        return data is not None and _float_data(ctx, data)
    if factory == "torch.full":
        fill = keywords["fill_value"].value if "fill_value" in keywords else \
            (positional[1] if len(positional) > 1 else None)
        return fill is not None and _evidently_float(ctx, fill)
    return True


def _in_module_forward(ctx: FileContext, node: cst.CSTNode) -> bool:
    func = enclosing_function(ctx, node)
    if func is None or func.name.value != "forward":
        return False
    block = ctx.parent(func)
    return isinstance(ctx.parent(block), cst.ClassDef) if block is not None else False


class TensorFactoryDropsDtype(Rule):
    """
    ## What it does
    Inside `forward` of a module class, or inside an autocast region, finds
    `torch.zeros/ones/empty/full/tensor(..., device=x.device)` that take the device from a
    tensor `x` but not its dtype.

    ## Why is this bad?
    Without `dtype=` a factory makes a float32 tensor (the default dtype), whatever `x` is. In a
    model run in half precision (`model.half()`, or bf16/fp16 activations under autocast) that
    tensor silently promotes what it touches to float32 (`torch.cat`, `+`), doubling memory
    and time, or breaks ops that need equal dtypes ("expected scalar type Half but found
    Float"). `x.new_zeros(...)` takes both the device and the dtype from `x`.

    ## Example
    ```python
    def forward(self, x):
        mask = torch.zeros(x.shape[0], 1, device=x.device)
    ```

    ## Fix
    ```python
    def forward(self, x):
        mask = x.new_zeros(x.shape[0], 1)
    ```

    ## Fix safety
    Safe when the call already passes `dtype=x.dtype` (same tensor as the device): the result
    is the same. Unsafe when it passes no dtype: the new tensor gets `x`'s dtype instead of
    float32 (the point of the fix, but a change of meaning), and `torch.tensor(data, ...)`
    becomes `x.new_tensor(data)`, which also takes `x`'s dtype. No fix when `x` is not a plain
    name, attribute or subscript chain, or the call has `out=` or `*args`/`**kwargs`.

    ## False positives
    A float32 tensor can be intended (an accumulator kept in float32 on purpose): then pass
    `dtype=torch.float32` explicitly, which this rule never reports. Any method named `forward`
    of a class counts as a module's forward. To stay quiet on correct code the rule skips
    `x` that may not be a floating tensor: attributes of `self` other than `weight`, `bias`,
    `*_weight`, `*_bias` and registered buffers (`self.model.device` is a module's), and names
    that suggest integers or booleans (`input_ids`, `mask`, `lengths`, `labels`, …). Without
    `dtype=`, `torch.full` and `torch.tensor` take their type from their values: the rule
    reports them only when the code shows a float (`torch.full(s, -1e9, ...)`,
    `torch.tensor([0.5, 2.0], ...)`); an int fill value, token ids (`[self.bos_id] * n`) and
    data held in a variable are left alone, and so is `torch.tensor(<number>, ...)`: a 0-dim
    tensor does not change other tensors' dtype.
    """

    code = "AMP003"
    name = "tensor-factory-drops-dtype"
    summary = "Tensor factory takes a tensor's device but not its dtype"
    fixable = True
    # A forward method or an autocast region, and a factory call with `device=<...>.device`
    # among its own arguments (the literal `.device` first: it is the cheap test).
    fragments = ((r"\.device", AnyOf(r"def\s+forward\b", "autocast"),
                  AnyOf(*(call_with(factory, rf"\bdevice\s*=\s*(?:[^()]|{PARENTHESIZED})*?\.device\b")
                          for factory in ("zeros", "ones", "empty", "full", "tensor")))),)
    # On the ast: such a call to a torch factory, with the arguments check() wants, in a
    # method named forward or in a file that calls autocast.
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
from torch import nn
class Head(nn.Module):
    def forward(self, x):
        acc = torch.zeros(x.shape[0], device=x.device, dtype=torch.float32)
        mask = x.new_ones(x.shape[0], 1)
        return acc, mask
"""),
        Valid("""
import torch
from torch import nn
class Ranker(nn.Module):
    def forward(self, input_ids, scores):
        mask = torch.ones(input_ids.shape, device=input_ids.device)
        target = torch.full((4,), 0.5, device=self.model.device)
        zero = torch.tensor(0.0, device=scores.device)
        return mask, target, zero
"""),
        # Integer tensors: an int fill value, token ids, data the code does not show.
        Valid("""
import torch
class Decoder(torch.nn.Module):
    def forward(self, x, step, ids):
        prefix = torch.tensor([self.bos_id] * x.shape[0], device=x.device)
        level = torch.full((x.shape[0],), fill_value=step, device=x.device)
        tokens = torch.tensor(ids, device=x.device)
        return prefix, level, tokens
"""),
        Valid("""
import torch
def make_buffers(x):
    return torch.zeros(4, device=x.device)
"""),
        Valid("""
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape, device=x.device, dtype=self.dtype)
"""),
    )
    invalid = (
        Invalid("""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, x.shape[2], device=x.device)
        return torch.cat([x, pad], dim=1)
""", fixed="""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1, x.shape[2])
        return torch.cat([x, pad], dim=1)
""", at=((6, 15, "`torch.zeros` takes `x`'s device but not its dtype (the resu"),)),
        Invalid("""
import torch as th
class Attn(th.nn.Module):
    def forward(self, q):
        bias = th.full((q.size(1), q.size(1)), float("-inf"), device=q.device, dtype=q.dtype)
        scale = th.tensor([0.5, 2.0], device=self.weight.device, requires_grad=False)
        return bias, scale
""", fixed="""
import torch as th
class Attn(th.nn.Module):
    def forward(self, q):
        bias = q.new_full((q.size(1), q.size(1)), float("-inf"))
        scale = self.weight.new_tensor([0.5, 2.0], requires_grad=False)
        return bias, scale
""", at=((5, 16, '`torch.full(..., device=q.device, dtype=q.dtype)` is `q.new_'), (6, 17, "`torch.tensor` takes `self.weight`'s device but not its dtyp"),)),
        Invalid("""
import torch
with torch.autocast("cuda"):
    out = model(x)
    ones = torch.ones(out.shape, device=out.device)
""", fixed="""
import torch
with torch.autocast("cuda"):
    out = model(x)
    ones = out.new_ones(out.shape)
""", at=((5, 12, "`torch.ones` takes `out`'s device but not its dtype (the res"),)),
        Invalid("""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = torch.full((n, n), -math.inf, device=scores.device).triu(1)
        return scores + causal
""", fixed="""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = scores.new_full((n, n), -math.inf).triu(1)
        return scores + causal
""", at=((7, 18, "`torch.full` takes `scores`'s device but not its dtype (the "),)),
        # A buffer, however its name was registered.
        Invalid("""
import torch
from torch import nn
class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        for name, value in (('mean', mean), ('std', std)):
            self.register_buffer(name, torch.as_tensor(value))
    def forward(self, x):
        eps = torch.full((1,), 1e-3, device=self.std.device)
        return (x - self.mean) / (self.std + eps)
""", fixed="""
import torch
from torch import nn
class Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        for name, value in (('mean', mean), ('std', std)):
            self.register_buffer(name, torch.as_tensor(value))
    def forward(self, x):
        eps = self.std.new_full((1,), 1e-3)
        return (x - self.mean) / (self.std + eps)
""", at=((10, 15, "`torch.full` takes `self.std`'s device but not its dtype (th"),)),
        # The tensor comes from a call: moving it before the other arguments is not a fix.
        Invalid("""
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.empty(x.size(0), device=next(self.parameters()).device)
""", at=((5, 16, "`torch.empty` takes `next(self.parameters())`'s device but n"),)),
    )

    def check(self, ctx: FileContext) -> None:
        for call in calls(ctx):
            factory = ctx.resolves_to(call.func, _FACTORIES.keys())
            if factory is None or has_star_args(call):
                continue
            keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
            device = keywords.get("device")
            if device is None or not isinstance(device.value, cst.Attribute) \
                    or device.value.attr.value != "device":
                continue
            source = device.value.value
            cls = next((a for a in ctx.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            if not _float_tensor(ctx, source, cls):
                continue
            dtype = keywords.get("dtype")
            same_dtype = dtype is not None and isinstance(dtype.value, cst.Attribute) \
                and dtype.value.attr.value == "dtype" and ctx.code(dtype.value.value) == ctx.code(source)
            if dtype is not None and not same_dtype:
                continue
            if not same_dtype and not _makes_float(ctx, factory, call, keywords):
                continue
            if not (_in_module_forward(ctx, call) or autocast_region(ctx, call)):
                continue
            method = _FACTORIES[factory]
            tensor = ctx.code(source)
            message = (f"`{factory}(..., device={tensor}.device, dtype={tensor}.dtype)` is "
                       f"`{tensor}.{method}(...)`" if same_dtype else
                       f"`{factory}` takes `{tensor}`'s device but not its dtype (the result is "
                       f"float32): use `{tensor}.{method}(...)`")
            ctx.report(call, message,
                       self._fix(ctx, call, source, method, keywords, same_dtype))

    def _fix(self, ctx, call, source, method, keywords, same_dtype) -> Fix | None:
        if "out" in keywords or not _chain_without_calls(source) \
                or set(keywords) - _KEPT_KEYWORDS - {"device", "dtype"}:
            return None
        args = [a for a in call.args if a.keyword is None or a.keyword.value in _KEPT_KEYWORDS]
        if args:  # the last argument must not keep a trailing comma meant for a dropped one
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new = call.with_changes(func=cst.Attribute(source, cst.Name(method)), args=args)
        tensor = ctx.code(source)
        return Fix(f"Use `{tensor}.{method}(...)`", (ctx.replace(call, ctx.module.code_for_node(new)),),
                   "safe" if same_dtype else "unsafe")
