"""Turning a changed tree into a text edit, so structural fixes compose like textual ones."""

from __future__ import annotations

import libcst as cst

from .context import FileContext
from .diagnostics import Edit


def edit_from_tree(ctx: FileContext, old: cst.CSTNode, new: cst.CSTNode) -> Edit:
    """The smallest edit that turns the file into the file with ``old`` replaced by ``new``.

    libcst renders the new tree with correct indentation (statements moved between blocks
    are re-indented; string contents are not), and the common prefix and suffix are trimmed.
    """
    before = ctx.source
    after = ctx.module.deep_replace(old, new).code
    start = 0
    limit = min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    end_b, end_a = len(before), len(after)
    while end_b > start and end_a > start and before[end_b - 1] == after[end_a - 1]:
        end_b -= 1
        end_a -= 1
    return Edit(start, end_b, after[start:end_a])
