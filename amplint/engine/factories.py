"""Tensor factories (``torch.zeros`` ...) and their ``x.new_*`` spelling, shared by the rules
about factories: which arguments the ``new_*`` spelling keeps, and the fixes that rewrite a
factory so or give it ``dtype=``, as text edits of the ``ast``'s positions. No torch."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .diagnostics import Fix
from .dtypes import FACTORIES, factory
from .rule import PARENTHESIZED
from .text_parts import call_text

if TYPE_CHECKING:
    from .ast_context import AstContext

# What a fragment of a factory call lets through between its parentheses: text and nested
# groups, but no `dtype=`, `*args` or `**kwargs` of its own (a power, `2 ** n`, let through).
_ARGUMENT = rf"(?:(?!\bdtype\s*=|(?<=[(,])\s*\*)[^()]|{PARENTHESIZED})"
# What a `.to(...)` that may only move a tensor holds: no `dtype=` of its own, nor an argument
# that is a `.dtype` or a floating dtype's attribute (`torch.float16`).
_TO_ARGUMENT = rf"(?:(?!(?<![\w.])dtype\s*=(?!=)|\.\s*(?:dtype|float\w*|half\w*|bfloat\w*)\s*[,)])[^()]|{PARENTHESIZED})"
_NAMES = sorted(f.removeprefix("torch.") for f in FACTORIES)
# Fragments of a factory call by its own name without `dtype=`: given a device (a `tensor`
# given its data as a list or a tuple, or by keyword), or moved by `.to(...)`/`.cuda(...)` at
# once. The name's start is checked behind it: a leading `\b` would cost the literal scan.
PLACED_WITHOUT_DTYPE = (
    *(rf"{f}(?<!\w{f})\s*\({_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)" for f in _NAMES if f != "tensor"),
    rf"tensor(?<!\wtensor)\s*\(\s*(?=[\[(]){_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)",
    rf"tensor(?<!\wtensor)\s*\((?={_ARGUMENT}*?\bdata\s*=){_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)")
MOVED_WITHOUT_DTYPE = tuple(rf"{f}(?<!\w{f})\s*\({_ARGUMENT}*\)[\s)]*\.\s*(?:cuda\s*\(|to\s*\({_TO_ARGUMENT}*\))"
                            for f in _NAMES)
NEW_METHODS = {
    "torch.zeros": "new_zeros", "torch.ones": "new_ones", "torch.empty": "new_empty",
    "torch.full": "new_full", "torch.tensor": "new_tensor",
}
# Keywords the new_* methods accept besides dtype and device.
_KEPT_KEYWORDS = {"requires_grad", "layout", "pin_memory"}


def _kept_arguments(keywords: list[str | None]) -> list[int] | None:
    """The positions of the arguments that ``x.new_*(...)`` keeps of a factory call whose
    arguments have these keywords (None for one without): all but ``device`` and ``dtype``;
    None where one is a keyword ``new_*`` does not take (``out=``, ``size=``)."""
    if {k for k in keywords if k is not None} - _KEPT_KEYWORDS - {"device", "dtype"}:
        return None
    return [i for i, k in enumerate(keywords) if k is None or k in _KEPT_KEYWORDS]


def _after_blanks(text: str, i: int) -> int:
    """Where the first character from ``i`` on that is no blank, comment or line
    continuation is."""
    while i < len(text):
        if text[i] == "#":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif text[i] in " \t\f\r\n\\":
            i += 1
        else:
            break
    return i


def receiver_text(ctx: AstContext, attribute: ast.Attribute) -> str:
    """The ``x`` of ``x.device`` as the file spells it, its own parentheses included."""
    source = ctx.source
    start, value_end = ctx.offsets(attribute)[0], ctx.offsets(attribute.value)[1]
    i = _after_blanks(source, value_end)
    while source.startswith(")", i):
        value_end = i + 1
        i = _after_blanks(source, value_end)
    return source[start:value_end]


def parenthesized_code(ctx: AstContext, expr: ast.expr) -> str:
    """``expr``'s code with the parentheses the file puts around it (``(a + b)``), which the
    ``ast``'s span leaves out; not a call's own around its argument."""
    source, (start, end) = ctx.source, ctx.offsets(expr)
    parent = ctx.parent(expr)
    low = ctx.offsets(parent)[0] if parent is not None else 0
    if isinstance(parent, ast.Call) and expr is not parent.func:
        low = _after_blanks(source, ctx.offsets(parent.func)[1])
        while source.startswith(")", low):  # the callee's own parentheses
            low = _after_blanks(source, low + 1)
        low += 1
    while True:
        before, after = start, _after_blanks(source, end)
        while before > low and source[before - 1] in " \t\r\n\f\\":
            before -= 1
        if before - 1 < low or source[before - 1] != "(" or not source.startswith(")", after):
            return source[start:end]
        start, end = before - 1, after + 1


def new_method_text_fix(ctx: AstContext, call: ast.Call, factory: str, device: ast.Attribute,
                        safety: str) -> Fix | None:
    """``torch.zeros(s, device=x.device, ...)`` -> ``x.new_zeros(s)``, ``x`` the value of
    ``device``, as a text edit: the kept arguments with the commas (and blanks, comments) that
    followed them, none after the last; None where the call has arguments ``new_*`` does not
    take or ``x`` is not a plain chain."""
    arguments = sorted([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset))
    kept = _kept_arguments([a.arg if isinstance(a, ast.keyword) else None for a in arguments])
    if factory not in NEW_METHODS or kept is None or not chain_without_calls(device.value):
        return None
    parts = call_text(ctx, call)
    if parts is None:
        return None
    start, end = ctx.offsets(call)
    text = ctx.source[start:end]
    # Where each argument starts, from the call's `(` on; a kept argument brings the comma (and
    # blanks, comments) that follows it, the last one kept none.
    i = _after_blanks(text, ctx.offsets(call.func)[1] - start)
    while text.startswith(")", i):  # the callee's own parentheses
        i = _after_blanks(text, i + 1)
    starts = [i + 1 + len(parts.before_arguments)]
    for argument in parts.arguments[:-1]:
        starts.append(_after_blanks(text, _after_blanks(text, starts[-1] + len(argument)) + 1))
    written = [text[starts[k]:starts[k + 1]] for k in kept[:-1]] + [parts.arguments[k] for k in kept[-1:]]
    tensor = receiver_text(ctx, device)
    method = NEW_METHODS[factory]
    rewritten = f"{tensor}.{method}{parts.after_callee}({parts.before_arguments}{''.join(written)})"
    return Fix(f"Use `{tensor}.{method}(...)`", (ctx.replace(call, rewritten),), safety)


def chain_without_calls(expr: ast.expr) -> bool:
    """``x``, ``self.weight``, ``batch["x"]``: evaluating it again (or first) cannot matter."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return isinstance(expr, ast.Name)


def dtype_text_fix(ctx: AstContext, call: ast.Call, dtype: str, safety: str) -> Fix | None:
    """``torch.zeros(s, device=d)`` -> ``torch.zeros(s, device=d, dtype=<dtype>)``, as a text edit:
    ``, dtype=...`` after the last argument, before the comma that followed it (the blanks and
    comments that followed an argument without one come between). None for a call without
    arguments, or with ``*args``/``**kwargs``."""
    arguments = sorted([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset))
    if not arguments or any(isinstance(a, ast.Starred) or (isinstance(a, ast.keyword) and a.arg is None)
                            for a in arguments):
        return None
    start, end = ctx.offsets(call)
    text = ctx.source[start:end]
    last = arguments[-1]
    value = last.value if isinstance(last, ast.keyword) else last
    value_start, value_end = (offset - start for offset in ctx.offsets(value))
    # The parentheses around the value (after the call's own) close after its end.
    opening = _after_blanks(text, ctx.offsets(call.func)[1] - start)
    while text.startswith(")", opening):  # the callee's own parentheses
        opening = _after_blanks(text, opening + 1)
    own_end, i = value_end, value_start
    while i - 1 > opening and text[i - 1] in "( \t\r\n\f\\":
        i -= 1
        if text[i] == "(":
            own_end = _after_blanks(text, own_end) + 1
    after = _after_blanks(text, own_end)
    closing = len(text) - 1
    if text.startswith(",", after):
        rewritten = f"{text[:own_end]}, dtype={dtype}{text[own_end:after]},{text[after + 1:closing]})"
    else:
        rewritten = f"{text[:own_end]}, {text[own_end:closing]}dtype={dtype})"
    return Fix(f"Pass `dtype={dtype}`", (ctx.replace(call, rewritten),), safety)


def placed_on_device(ctx: AstContext, call: ast.Call) -> bool:
    """A factory call given a device (``device=...``, or ``.to(...)``/``.cuda()`` on its result)."""
    if any(k.arg == "device" for k in call.keywords):
        return True
    attribute = ctx.parent(call)
    return isinstance(attribute, ast.Attribute) and attribute.attr in ("to", "cuda") \
        and isinstance(ctx.parent(attribute), ast.Call)


def same_dtype_fix(ctx: AstContext, maker: ast.Call, other: ast.expr, safety: str) -> Fix | None:
    """Give the float32 tensor ``maker`` makes (a factory, or ``.float()``) the dtype of
    ``other``: ``other.new_zeros(...)`` where the factory takes ``other``'s device, else
    ``dtype=other.dtype``; ``.to(other.dtype)`` for ``.float()``."""
    dtype = f"{parenthesized_code(ctx, other)}.dtype"
    if isinstance(maker.func, ast.Attribute) and maker.func.attr == "float":
        return Fix(f"Use `.to({dtype})`", (ctx.replace(maker, f"{receiver_text(ctx, maker.func)}.to({dtype})"),),
                   safety)
    device = next((k.value for k in maker.keywords if k.arg == "device"), None)
    if isinstance(device, ast.Attribute) and device.attr == "device" and ctx.code(device.value) == ctx.code(other):
        fix = new_method_text_fix(ctx, maker, factory(ctx, maker), device, safety)
        if fix is not None:
            return fix
    return dtype_text_fix(ctx, maker, dtype, safety)
