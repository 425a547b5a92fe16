"""Turning a changed tree into a text edit, so structural fixes compose like textual ones."""

from __future__ import annotations

import dataclasses
import os

import libcst as cst

from .context import FileContext
from .diagnostics import Edit
from .tree import render

# Nodes that render the same alone as in their block, given the blocks' indentation.
_STANDALONE = (cst.BaseStatement, cst.BaseSuite)


def _changed_run(old: cst.CSTNode, new: cst.CSTNode) -> tuple[list, list]:
    """The fewest whole statements (or one block) of ``old`` that differ from ``new``, and
    what replaces them. A fix rebuilds a block with ``with_changes``, so what it kept is the
    same object: descend while only one child differs, and within a block's statements keep
    only the run between the common (identical) head and tail."""
    olds, news = [old], [new]
    while len(olds) == len(news) == 1 and type(olds[0]) is type(news[0]):
        o, n = olds[0], news[0]
        differing = [f.name for f in dataclasses.fields(o) if getattr(o, f.name) is not getattr(n, f.name)]
        if len(differing) != 1:
            break
        a, b = getattr(o, differing[0]), getattr(n, differing[0])
        if isinstance(a, _STANDALONE) and isinstance(b, _STANDALONE):
            olds, news = [a], [b]
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) \
                and all(isinstance(s, cst.BaseStatement) for s in (*a, *b)):
            head = 0
            while head < min(len(a), len(b)) and a[head] is b[head]:
                head += 1
            tail = 0
            while tail < min(len(a), len(b)) - head and a[-1 - tail] is b[-1 - tail]:
                tail += 1
            if head + tail == len(a):  # a pure insertion: anchor it on a neighbour
                if tail:
                    tail -= 1
                elif head:
                    head -= 1
                else:
                    break
            olds, news = list(a[head:len(a) - tail]), list(b[head:len(b) - tail])
        else:
            break
    return olds, news


def _render_run(ctx: FileContext, nodes: list, indents: list[str]) -> tuple[str, int]:
    """The nodes' code rendered one after the other, and where the first one's own span starts in it."""
    codes, first_start = [], 0
    for i, node in enumerate(nodes):
        code, spans = render(node, ctx.module, indents)
        if i == 0:
            first_start = spans[id(node)][0]
        codes.append(code)
    return "".join(codes), first_start


def _trimmed(before: str, after: str, base: int = 0) -> Edit:
    """The edit from ``before`` (found at ``base`` in the file) to ``after``, minus their common prefix and suffix."""
    start = len(os.path.commonprefix([before, after]))
    limit = min(len(before), len(after)) - start
    end = len(os.path.commonprefix([before[::-1][:limit], after[::-1][:limit]]))
    return Edit(base + start, base + len(before) - end, after[start:len(after) - end])


def edit_from_tree(ctx: FileContext, old: cst.CSTNode, new: cst.CSTNode) -> Edit:
    """The smallest edit that turns the file into the file with ``old`` replaced by ``new``.

    libcst renders the new tree with correct indentation (statements moved between blocks
    are re-indented; string contents are not). Only the statements that changed are
    rendered, where they stand (a fix costs the size of what it changes, not of the file);
    if that rendering is not the source's text there, the whole module is rendered instead.
    """
    olds, news = _changed_run(old, new)
    if ctx.parent(olds[0]) is not None and all(isinstance(n, _STANDALONE) for n in (*olds, *news)):
        default = ctx.module.default_indent
        indents = [default if block.indent is None else block.indent
                   for block in ctx.ancestors(olds[0]) if isinstance(block, cst.IndentedBlock)]
        indents.reverse()
        before, first_start = _render_run(ctx, olds, indents)
        base = ctx.offsets(olds[0])[0] - first_start
        if base >= 0 and ctx.source.startswith(before, base):
            return _trimmed(before, _render_run(ctx, news, indents)[0], base)
    return _trimmed(ctx.source, ctx.module.deep_replace(old, new).code)
