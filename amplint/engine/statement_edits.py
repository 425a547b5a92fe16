"""Text edits that add a statement, built from Python's ``ast`` positions: the new line
takes the indentation of the line it goes above and the file's own line ending."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from .diagnostics import Edit

if TYPE_CHECKING:
    from .ast_context import AstContext

_NEWLINE = re.compile(r"\r\n?|\n")
_INDENTATION = re.compile(r"[ \t\f]*")


def insert_before(ctx: AstContext, node: ast.AST, statement: str) -> Edit:
    """An edit that puts ``statement`` before the statement that holds ``node``: on a line of
    its own just above it, at its indentation, with the file's first line ending, the comments
    above staying above both; in a one-line suite (`if c: a(); b()`), before it on the same
    line. The edit starts where the statement's own text does."""
    stmt = node
    while not isinstance(stmt, ast.stmt):
        stmt = ctx.parent(stmt)
    # An `elif` is a statement of the `if` it continues.
    while isinstance(stmt, ast.If) and ctx.source.startswith("elif", ctx.offsets(stmt)[0]):
        stmt = ctx.parent(stmt)
    parent = ctx.parent(stmt)
    body = next(b for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody"))
                if isinstance(b, list) and any(s is stmt for s in b))
    if ctx.source[ctx.offset(body[0].lineno, 0):ctx.offsets(body[0])[0]].strip():  # after its header's colon
        start = ctx.offsets(stmt)[0]
        return Edit(start, start, statement + "; ")
    index = next(i for i, s in enumerate(body) if s is stmt)
    while index and body[index - 1].end_lineno >= body[index].lineno:  # one line: `a = 1; clip(...)`
        index -= 1
    decorators = getattr(body[index], "decorator_list", ())
    indentation = _INDENTATION.match(ctx.source, ctx.offset(min([body[index].lineno, *(d.lineno for d in decorators)]), 0))
    newline = _NEWLINE.search(ctx.source)
    return Edit(indentation.end(), indentation.end(),
                statement + (newline.group() if newline else "\n") + indentation.group())
