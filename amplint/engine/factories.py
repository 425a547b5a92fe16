"""Tensor factories (``torch.zeros`` ...) and their ``x.new_*`` spelling, shared by the rules
about factories: which arguments the ``new_*`` spelling keeps, and the fix that rewrites a
factory so, on either tree (a libcst node, or an ``ast`` one as a text edit). No torch."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import libcst as cst

from .context import FileContext
from .diagnostics import Fix
from .text_parts import call_text

if TYPE_CHECKING:
    from .ast_context import AstContext

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


def chain_without_calls(expr: cst.BaseExpression) -> bool:
    """``x``, ``self.weight``, ``batch["x"]``: evaluating it again (or first) cannot matter."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return isinstance(expr, cst.Name)


def new_method_fix(ctx: FileContext, call: cst.Call, factory: str, source: cst.BaseExpression,
                   safety: str) -> Fix | None:
    """``torch.zeros(s, device=..., dtype=...)`` -> ``source.new_zeros(s)``; None where the call
    has arguments ``new_*`` does not take or ``source`` is not a plain chain."""
    kept = _kept_arguments([a.keyword.value if a.keyword is not None else None for a in call.args])
    if factory not in NEW_METHODS or kept is None or not chain_without_calls(source):
        return None
    method = NEW_METHODS[factory]
    args = [call.args[i] for i in kept]
    if args:  # the last argument must not keep a trailing comma meant for a dropped one
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    new = call.with_changes(func=cst.Attribute(source, cst.Name(method)), args=args)
    tensor = ctx.code(source)
    return Fix(f"Use `{tensor}.{method}(...)`", (ctx.replace(call, ctx.module.code_for_node(new)),), safety)


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


def new_method_text_fix(ctx: AstContext, call: ast.Call, factory: str, device: ast.Attribute,
                        safety: str) -> Fix | None:
    """``new_method_fix`` on the ast: ``torch.zeros(s, device=x.device, ...)`` -> ``x.new_zeros(s)``,
    ``x`` the value of ``device``, as a text edit; the text ``new_method_fix`` makes: the kept
    arguments with the commas (and blanks, comments) that followed them, none after the last."""
    arguments = sorted([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset))
    kept = _kept_arguments([a.arg if isinstance(a, ast.keyword) else None for a in arguments])
    if factory not in NEW_METHODS or kept is None or not _chain_without_calls(device.value):
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


def _chain_without_calls(expr: ast.expr) -> bool:
    """``chain_without_calls`` on the ast."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return isinstance(expr, ast.Name)
