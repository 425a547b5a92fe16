"""Tensor factories (``torch.zeros`` ...) and their ``x.new_*`` spelling, shared by the rules
about factories. Pure libcst; no torch."""

from __future__ import annotations

import libcst as cst

from .context import FileContext
from .diagnostics import Fix

NEW_METHODS = {
    "torch.zeros": "new_zeros", "torch.ones": "new_ones", "torch.empty": "new_empty",
    "torch.full": "new_full", "torch.tensor": "new_tensor",
}
# Keywords the new_* methods accept besides dtype and device.
_KEPT_KEYWORDS = {"requires_grad", "layout", "pin_memory"}


def chain_without_calls(expr: cst.BaseExpression) -> bool:
    """``x``, ``self.weight``, ``batch["x"]``: evaluating it again (or first) cannot matter."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return isinstance(expr, cst.Name)


def new_method_fix(ctx: FileContext, call: cst.Call, factory: str, source: cst.BaseExpression,
                   safety: str) -> Fix | None:
    """``torch.zeros(s, device=..., dtype=...)`` -> ``source.new_zeros(s)``; None where the call
    has arguments ``new_*`` does not take or ``source`` is not a plain chain."""
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if factory not in NEW_METHODS or "out" in keywords or not chain_without_calls(source) \
            or keywords - _KEPT_KEYWORDS - {"device", "dtype"}:
        return None
    method = NEW_METHODS[factory]
    args = [a for a in call.args if a.keyword is None or a.keyword.value in _KEPT_KEYWORDS]
    if args:  # the last argument must not keep a trailing comma meant for a dropped one
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    new = call.with_changes(func=cst.Attribute(source, cst.Name(method)), args=args)
    tensor = ctx.code(source)
    return Fix(f"Use `{tensor}.{method}(...)`", (ctx.replace(call, ctx.module.code_for_node(new)),), safety)
