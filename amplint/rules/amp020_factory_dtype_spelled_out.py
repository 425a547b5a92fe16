from __future__ import annotations

import ast

import libcst as cst

from ..engine.context import FileContext
from ..engine.factories import NEW_METHODS, new_method_fix
from ..engine.outline import Outline
from ..engine.rule import PARENTHESIZED, AnyOf, Invalid, Rule, Valid, call_with
from ..engine.semantics import autocast_region, calls, calls_autocast, enclosing_function, has_star_args

# Names of tensors that hold integers or booleans, and attributes of a module that are
# tensors: what `x` in `device=x.device` may be without being a submodule.
_FACTORY_NAMES = tuple(method.removeprefix("torch.") for method in NEW_METHODS)
_NON_FLOAT_HINTS = ("ids", "idx", "index", "indices", "mask", "len", "label", "target", "count")


def _parameter_like(attribute: str) -> bool:
    return attribute in ("weight", "bias") or attribute.endswith(("_weight", "_bias"))


def _float_like(name: str) -> bool:
    lowered = name.lower()
    return name not in ("self", "cls") and not any(h in lowered for h in _NON_FLOAT_HINTS)


def _buffers_named_in(ctx: FileContext, cls: cst.ClassDef) -> set[str]:
    """The strings of a class that calls ``register_buffer``: the names of its buffers among
    them, however they are registered (``for name in ("mean", "std"): ...`` included)."""
    registers = [c for c in ctx.nodes(cst.Call) if isinstance(c.func, cst.Attribute)
                 and c.func.attr.value == "register_buffer" and ctx.contains(cls, c)]
    if not registers:
        return set()
    return {s.evaluated_value for s in ctx.nodes(cst.SimpleString)
            if ctx.contains(cls, s) and isinstance(s.evaluated_value, str)}


def _tensor(ctx: FileContext, source: cst.BaseExpression, cls: cst.ClassDef | None) -> bool:
    """Whether ``source`` (the x of ``device=x.device``) is plausibly a floating tensor: a
    name, subscript or ``self.weight``-like parameter, not a module (``self.model.device``)."""
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


def _plausible_tensor(outline: Outline, source: ast.expr) -> bool:
    """``_tensor`` on the ast, as far as the ast shows it (any registered buffer counts)."""
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


def _candidate(outline: Outline, call: ast.Call) -> bool:
    """What check() reports, as far as the ast shows it: ``device=x.device, dtype=x.dtype``
    with ``x`` plausibly a tensor, no ``*args``/``**kwargs``."""
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    keywords = {k.arg: k.value for k in call.keywords}
    device, dtype = keywords.get("device"), keywords.get("dtype")
    if not (isinstance(device, ast.Attribute) and device.attr == "device"
            and isinstance(dtype, ast.Attribute) and dtype.attr == "dtype"
            and ast.dump(dtype.value) == ast.dump(device.value)):
        return False
    return _plausible_tensor(outline, device.value)


def _may_fire(outline: Outline) -> bool:
    candidates = [c for c in outline.calls_to(NEW_METHODS.keys()) if _candidate(outline, c)]
    if not candidates:
        return False
    in_forward = outline.calls_in_methods("forward")
    return any(id(c) in in_forward for c in candidates) or calls_autocast(outline)


def _in_module_forward(ctx: FileContext, node: cst.CSTNode) -> bool:
    func = enclosing_function(ctx, node)
    if func is None or func.name.value != "forward":
        return False
    block = ctx.parent(func)
    return isinstance(ctx.parent(block), cst.ClassDef) if block is not None else False


class FactoryDtypeSpelledOut(Rule):
    """
    ## What it does
    Inside `forward` of a module class, or inside an autocast region, finds
    `torch.zeros/ones/empty/full/tensor(..., device=x.device, dtype=x.dtype)`: a factory that
    takes both its device and its dtype from the same tensor `x`. A style rule, off by default
    (`select = ["AMP020"]` turns it on).

    ## Why is this bad?
    It is not wrong: the tensor has `x`'s device and dtype. But `x.new_zeros(...)` says the
    same in one name, and cannot drift apart when one of the two keywords is edited (the
    mistake AMP003 finds: a factory that keeps the device and loses the dtype).

    ## Example
    ```python
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, device=x.device, dtype=x.dtype)
    ```

    ## Fix
    ```python
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1)
    ```

    ## Fix safety
    Safe: the result is the same tensor. No fix when `x` is not a plain name, attribute or
    subscript chain, or the call has `out=` or `*args`/`**kwargs`.

    ## False positives
    None in meaning; it is a matter of style. To stay quiet where `new_*` would not exist, the
    rule skips `x` that may be a module (attributes of `self` other than `weight`, `bias`,
    `*_weight`, `*_bias` and registered buffers: `self.model.device`) and names that suggest
    integers or booleans (`input_ids`, `mask`, …).
    """

    code = "AMP020"
    name = "factory-dtype-spelled-out"
    summary = "Tensor factory spells out a tensor's device and dtype: use `new_*`"
    fixable = True
    on_by_default = False
    # A forward method or an autocast region, and a factory call (by its own name, checked
    # behind it: not `new_zeros`) with `dtype=<...>.dtype` and `device=<...>.device` among its
    # own arguments.
    fragments = ((r"\.dtype", AnyOf(r"def\s+forward\b", "autocast"),
                  AnyOf(*(call_with(rf"{f}(?<!\w{f})", rf"\bdtype\s*=\s*(?:[^()]|{PARENTHESIZED})*?\.dtype\b")
                          for f in _FACTORY_NAMES)),
                  AnyOf(*(call_with(rf"{f}(?<!\w{f})", rf"\bdevice\s*=\s*(?:[^()]|{PARENTHESIZED})*?\.device\b")
                          for f in _FACTORY_NAMES))),)
    # On the ast: such a call to a torch factory in a method named forward or in a file that
    # calls autocast.
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
from torch import nn
class Head(nn.Module):
    def forward(self, x, y):
        other = torch.zeros(x.shape[0], device=x.device, dtype=y.dtype)
        mine = x.new_ones(x.shape[0], 1)
        return other, mine
"""),
        # A module's device and dtype (`self.model` has no `new_zeros`); outside a forward.
        Valid("""
import torch
class Ranker(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape, device=self.model.device, dtype=self.model.dtype)
def make_buffers(x):
    return torch.zeros(4, device=x.device, dtype=x.dtype)
"""),
    )
    invalid = (
        Invalid("""
import torch as th
class Attn(th.nn.Module):
    def forward(self, q):
        bias = th.full((q.size(1), q.size(1)), float("-inf"), device=q.device, dtype=q.dtype)
        return bias
""", fixed="""
import torch as th
class Attn(th.nn.Module):
    def forward(self, q):
        bias = q.new_full((q.size(1), q.size(1)), float("-inf"))
        return bias
""", at=((5, 16, '`torch.full(..., device=q.device, dtype=q.dtype)` is `q.new_'),)),
        Invalid("""
import torch
with torch.autocast("cuda"):
    out = model(x)
    ones = torch.ones(out.shape, dtype=out.dtype, device=out.device, requires_grad=True)
""", fixed="""
import torch
with torch.autocast("cuda"):
    out = model(x)
    ones = out.new_ones(out.shape, requires_grad=True)
""", at=((5, 12, "`torch.ones(..., device=out.device, dtype=out.dtype)` is `out"),)),
        # The tensor comes from a call: moving it before the other arguments is not a fix.
        Invalid("""
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.empty(x.size(0), device=next(self.parameters()).device,
                           dtype=next(self.parameters()).dtype)
""", at=((5, 16, "`torch.empty(..., device=next(self.parameters()).device, dty"),)),
    )

    def check(self, ctx: FileContext) -> None:
        for call in calls(ctx):
            factory = ctx.resolves_to(call.func, NEW_METHODS.keys())
            if factory is None or has_star_args(call):
                continue
            keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
            device, dtype = keywords.get("device"), keywords.get("dtype")
            if not (isinstance(device, cst.Attribute) and device.attr.value == "device"
                    and isinstance(dtype, cst.Attribute) and dtype.attr.value == "dtype"
                    and ctx.code(dtype.value) == ctx.code(device.value)):
                continue
            source = device.value
            cls = next((a for a in ctx.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            if not _tensor(ctx, source, cls):
                continue
            if not (_in_module_forward(ctx, call) or autocast_region(ctx, call)):
                continue
            tensor = ctx.code(source)
            ctx.report(call, f"`{factory}(..., device={tensor}.device, dtype={tensor}.dtype)` is "
                             f"`{tensor}.{NEW_METHODS[factory]}(...)`",
                       new_method_fix(ctx, call, factory, source, "safe"))
