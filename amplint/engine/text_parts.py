"""Parts of the text that Python's ``ast`` has no node for, found by the tokens of a node's
text: a call's parentheses and each argument as written, the module a ``from`` import names,
the dotted name of an import alias. A rule that reads the ``ast`` rewrites them with text
edits (``AstContext.replace``), the rest of the text as it was."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .source import split_lines

if TYPE_CHECKING:
    from .ast_context import AstContext

_TRIVIA = frozenset({tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                     tokenize.ENDMARKER})


def _tokens(text: str) -> list[tokenize.TokenInfo] | None:
    """The tokens of ``text`` with character offsets (``start``/``end`` as (0, offset)), no
    blanks or comments; None where the text does not tokenize alone."""
    starts = [0]
    for line in split_lines(text, keepends=True):
        starts.append(starts[-1] + len(line))
    try:
        found = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return [t._replace(start=(0, starts[t.start[0] - 1] + t.start[1]), end=(0, starts[t.end[0] - 1] + t.end[1]))
            for t in found if t.type not in _TRIVIA]


@dataclass(frozen=True)
class CallText:
    """A call as its file spells it. ``after_callee``: the blanks between the callee (and its
    own closing parentheses) and the call's ``(``; ``before_arguments``: what follows the
    ``(`` up to the first argument (up to the ``)`` when there is none); ``arguments``: each
    argument's own text, from its first token to its last (the parentheses around a value, a
    keyword and its ``=``), the last one with what follows it up to the ``)`` when no comma
    does."""

    after_callee: str
    before_arguments: str
    arguments: tuple[str, ...]

    def rewritten(self, callee: str, arguments: list[str]) -> str:
        """The call with another callee and arguments, the blanks as
        a rewrite of the call's parts leaves them: those after the callee and the ``(`` kept, one space after each comma."""
        return f"{callee}{self.after_callee}({self.before_arguments}{', '.join(arguments)})"


def call_text(ctx: "AstContext", call: ast.Call) -> CallText | None:
    """``call`` in parts; None where its text does not split into as many arguments as the
    ``ast`` counts."""
    start, end = ctx.offsets(call)
    text = ctx.source[start:end]
    tokens = _tokens(text)
    if tokens is None:
        return None
    callee_end = ctx.offsets(call.func)[1] - start
    i = next((k for k, t in enumerate(tokens) if t.start[1] >= callee_end), len(tokens))
    blanks_from = callee_end
    while i < len(tokens) and tokens[i].string == ")":  # the callee's own parentheses
        blanks_from = tokens[i].end[1]
        i += 1
    if i >= len(tokens) or tokens[i].string != "(":
        return None
    opening, depth, groups, group = tokens[i], 0, [], []
    for token in tokens[i + 1:]:
        if token.type == tokenize.OP and token.string in ")]}" and depth == 0:
            closing = token
            break
        if token.type == tokenize.OP and token.string == "," and depth == 0:
            groups.append(group)
            group = []
            continue
        if token.type == tokenize.OP:
            depth += token.string in "([{"
            depth -= token.string in ")]}"
        group.append(token)
    else:
        return None
    comma_after_last = bool(groups) and not group
    if group:
        groups.append(group)
    if len(groups) != len(call.args) + len(call.keywords):
        return None
    first = groups[0][0].start[1] if groups else closing.start[1]
    arguments = [text[g[0].start[1]:g[-1].end[1]] for g in groups]
    if groups and not comma_after_last:
        arguments[-1] += text[groups[-1][-1].end[1]:closing.start[1]]
    return CallText(text[blanks_from:opening.start[1]], text[opening.end[1]:first], tuple(arguments))


def name_span(ctx: "AstContext", node: ast.ImportFrom | ast.alias) -> tuple[int, int] | None:
    """Where the dotted name of an import is, as character offsets: the module of ``from
    <module> import ...`` (not a relative one), or an alias's name before its ``as``."""
    start, end = ctx.offsets(node)
    tokens = _tokens(ctx.source[start:end])
    if tokens is None:
        return None
    if isinstance(node, ast.ImportFrom):
        tokens = tokens[1:]  # after `from`
    name = []
    for token in tokens:
        if token.type == tokenize.NAME and token.string in ("import", "as"):
            break
        name.append(token)
    if not name or name[0].type != tokenize.NAME:
        return None
    return start + name[0].start[1], start + name[-1].end[1]
