from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.factories import NEW_METHODS, new_method_text_fix, receiver_text
from ..engine.outline import walk
from ..engine.regions import autocast_region
from ..engine.rule import AnyOf, Invalid, PARENTHESIZED, Rule, Valid, call_with

_FACTORIES = frozenset(NEW_METHODS)
_FACTORY_NAMES = tuple(method.removeprefix("torch.") for method in NEW_METHODS)
# Names of tensors that hold integers or booleans: what `x` in `device=x.device` may be
# without being a floating tensor.
_NON_FLOAT_HINTS = ("ids", "idx", "index", "indices", "mask", "len", "label", "target", "count")


def _parameter_like(attribute: str) -> bool:
    return attribute in ("weight", "bias") or attribute.endswith(("_weight", "_bias"))


def _float_like(name: str) -> bool:
    lowered = name.lower()
    return name not in ("self", "cls") and not any(h in lowered for h in _NON_FLOAT_HINTS)


def _buffers_named_in(ctx: AstContext, cls: ast.ClassDef) -> set[str]:
    """The strings of a class that calls ``register_buffer``: the names of its buffers among
    them, however they are registered (``for name in ("mean", "std"): ...`` included)."""
    nodes = list(walk(cls))
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "register_buffer"
               for n in nodes):
        return set()
    # String literals, not the text between an f-string's fields.
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and not isinstance(ctx.parent(n), ast.JoinedStr)}


def _tensor(ctx: AstContext, source: ast.expr, cls: ast.ClassDef | None) -> bool:
    """Whether ``source`` (the x of ``device=x.device``) is plausibly a floating tensor: a
    name, subscript or ``self.weight``-like parameter, not a module (``self.model.device``)."""
    root = source
    while isinstance(root, ast.Subscript):
        root = root.value
    if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "next" \
            and "parameters" in ctx.code(root):
        return True  # next(self.parameters()): a parameter
    if isinstance(root, ast.Name):
        name = root.id
    elif isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name) and root.value.id == "self":
        name = root.attr
        # Parameters and buffers; any other attribute of a module may be a module itself.
        if not (_parameter_like(name) or (cls is not None and name in _buffers_named_in(ctx, cls))):
            return False
    else:
        return False
    return _float_like(name)


def _in_module_forward(ctx: AstContext, node: ast.AST) -> bool:
    func = ctx.enclosing_function(node)
    return func is not None and func.name == "forward" and isinstance(ctx.parent(func), ast.ClassDef)


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
        # A call over several lines keeps its layout: the kept arguments as they were written.
        Invalid("""
import torch
class Pool(torch.nn.Module):
    def forward(self, hidden):
        return torch.zeros(
            hidden.size(0), hidden.size(-1),  # (batch, features)
            device=hidden.device,
            dtype=hidden.dtype,
        )
""", fixed="""
import torch
class Pool(torch.nn.Module):
    def forward(self, hidden):
        return hidden.new_zeros(
            hidden.size(0), hidden.size(-1))
""", at=((5, 16, "is `hidden.new_zeros(...)`"),)),
        # The tensor comes from a call: moving it before the other arguments is not a fix.
        Invalid("""
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.empty(x.size(0), device=next(self.parameters()).device,
                           dtype=next(self.parameters()).dtype)
""", at=((5, 16, "`torch.empty(..., device=next(self.parameters()).device, dty"),)),
    )

    def check(self, ctx: AstContext) -> None:
        for call in sorted(ctx.outline.calls_to(_FACTORIES), key=ctx.order):
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                continue
            keywords = {k.arg: k.value for k in call.keywords}
            device, dtype = keywords.get("device"), keywords.get("dtype")
            if not (isinstance(device, ast.Attribute) and device.attr == "device"
                    and isinstance(dtype, ast.Attribute) and dtype.attr == "dtype"):
                continue
            tensor = receiver_text(ctx, device)
            if receiver_text(ctx, dtype) != tensor or not _tensor(ctx, device.value, ctx.enclosing(call, ast.ClassDef)):
                continue
            if not (_in_module_forward(ctx, call) or autocast_region(ctx, call)):
                continue
            factory = ctx.resolves_to(call.func, _FACTORIES)
            ctx.report(call, f"`{factory}(..., device={tensor}.device, dtype={tensor}.dtype)` is "
                             f"`{tensor}.{NEW_METHODS[factory]}(...)`",
                       new_method_text_fix(ctx, call, factory, device, "safe"))
