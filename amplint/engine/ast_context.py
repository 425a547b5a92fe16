"""One file as the rules see it: the outline (its tree, names resolved through the imports,
nodes by type), the source of a node, edits of its text, and ``report``."""

from __future__ import annotations

import ast
import bisect
from functools import cached_property
from typing import TYPE_CHECKING

from .checked_file import CheckedFile
from .diagnostics import Edit, Fix, Related
from .outline import ModulesByText, Outline, first_position, walk

if TYPE_CHECKING:
    from ..policy import PolicyLoader

# Other modules of the project read while checking a file, by path and text: a trainer's
# base classes are read for each file that subclasses them.
_PROJECT_MODULES: ModulesByText[AstContext] = ModulesByText(32)


class AstContext(CheckedFile):
    def __init__(self, path: str, source: str, outline: Outline, policy_loader: "PolicyLoader | None" = None,
                 preview: bool = False):
        super().__init__(path, source, policy_loader, preview, outline)
        self.outline: Outline = outline
        # Each node's text once (the rules ask for the same nodes' text many times); the node
        # is held beside it, so that its id is not another node's while the context lives.
        self._codes: dict[int, tuple[ast.AST, str]] = {}
        self._functions: dict[int, ast.AST | None] = {}  # ``enclosing_function``'s answers

    @cached_property
    def _encoded_lines(self) -> list[bytes]:
        """Each line as UTF-8: ``ast`` counts columns in its bytes."""
        return [self.source[start:end].encode("utf-8")
                for start, end in zip(self._line_starts, self._line_starts[1:])]

    @cached_property
    def _ascii_lines(self) -> list[bool]:
        """Whether each line is ASCII: there a byte column is the character column."""
        return [line.isascii() for line in self._encoded_lines]

    def offset(self, row: int, byte_column: int) -> int:
        """The character offset of ``ast``'s position (a 1-based row, a UTF-8 byte column)."""
        if row - 1 < len(self._encoded_lines):
            line = self._encoded_lines[row - 1]
            if self._ascii_lines[row - 1]:
                return self._line_starts[row - 1] + min(byte_column, len(line))
        else:
            line = b""
        return self._line_starts[row - 1] + len(line[:byte_column].decode("utf-8", errors="replace"))

    def offsets(self, node: ast.AST) -> tuple[int, int]:
        """Where ``node`` starts and ends in the source, as character offsets."""
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def code(self, node: ast.AST) -> str:
        """The node's source text, as the file spells it."""
        known = self._codes.get(id(node))
        if known is None:
            start, end = self.offsets(node)
            known = self._codes[id(node)] = (node, self.source[start:end])
        return known[1]

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.outline.parents.get(id(node))

    def enclosing(self, node: ast.AST, kind: type | tuple[type, ...]) -> ast.AST | None:
        """The innermost node of ``kind`` around ``node``; None where there is none."""
        parent = self.outline.parents.get(id(node))
        while parent is not None and not isinstance(parent, kind):
            parent = self.outline.parents.get(id(parent))
        return parent

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost function around ``node`` (not a lambda); None at the top level. Each
        node's answer is kept: a walk up stops at the first node answered (the tree's nodes
        live as long as the context, so their ids are theirs)."""
        known = self._functions
        walked = []
        current, function = node, None
        while id(current) not in known:
            walked.append(id(current))
            parent = self.outline.parents.get(id(current))
            if parent is None or isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = parent
                break
            current = parent
        else:
            function = known[id(current)]
        for walked_id in walked:
            known[walked_id] = function
        return function

    def resolves_to(self, node: ast.AST, names: frozenset[str] | set[str]) -> str | None:
        """One of ``names`` that ``node`` stands for by the file's imports, if any."""
        return next((n for n in self.outline.qualified_names(node) if n in names), None)

    @cached_property
    def calls_in_order(self) -> tuple[list[ast.Call], list[tuple[int, int]]]:
        """The file's calls in source order, and where each starts."""
        ordered = sorted(self.outline.nodes(ast.Call), key=self.order)
        return ordered, [(c.lineno, c.col_offset) for c in ordered]

    def calls_within(self, definition: ast.AST) -> list[ast.Call]:
        """The calls inside a function or class (its decorators and what it defines included),
        in source order: those that start inside a definition end inside it."""
        ordered, starts = self.calls_in_order
        end = (definition.end_lineno, definition.end_col_offset)
        return ordered[bisect.bisect_left(starts, first_position(definition)):bisect.bisect_right(starts, end)]

    def order(self, node: ast.AST) -> tuple[int, int, int, int]:
        """A key that sorts nodes in source order (an outer node before the nodes inside it)."""
        return node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset

    def replace(self, node: ast.AST, content: str) -> Edit:
        """An edit that puts ``content`` where ``node`` is."""
        return Edit(*self.offsets(node), content)

    def out_of_block(self, block: ast.stmt, first: ast.stmt) -> Edit | None:
        """An edit that moves ``first`` and the statements after it in ``block``'s body out of
        the block, after it, at the block's own indentation; the comments just above ``first``
        go with it. None where the text does not allow it: the block's body on its own line,
        ``first`` on the line of the statement before it, a string spanning lines (its text
        would change)."""
        index = next(i for i, s in enumerate(block.body) if s is first)
        tail = block.body[index:]
        previous_end = block.body[index - 1].end_lineno if index else block.lineno
        if first.lineno <= previous_end or any(
                isinstance(n, (ast.Constant, ast.JoinedStr)) and n.end_lineno > n.lineno
                for stmt in tail for n in walk(stmt)):
            return None
        outer = self._indentation(block.lineno)
        inner = self._indentation(first.lineno)
        if inner == outer or not inner.startswith(outer):
            return None
        start = first.lineno
        while start - 1 > previous_end and self._line(start - 1).strip()[:1] in ("", "#"):
            start -= 1
        lines = [self._line(row) for row in range(start, tail[-1].end_lineno + 1)]
        moved = "".join(outer + line[len(inner):] if line.startswith(inner) else line for line in lines)
        return Edit(self._line_starts[start - 1], self._line_starts[tail[-1].end_lineno], moved)

    def _line(self, row: int) -> str:
        """Line ``row`` (1-based) with its line ending."""
        return self.source[self._line_starts[row - 1]:self._line_starts[row]]

    def _indentation(self, row: int) -> str:
        line = self._line(row)
        return line[:len(line) - len(line.lstrip(" \t"))]

    def project_module(self, module: str | None, level: int) -> "AstContext | None":
        """The module of this file's project that ``from <level dots><module> import ...``
        reads here (``project_source``), as a context of its own (without tables: what is
        asked of it is its code); None where there is none or it does not parse."""
        found = self.project_source(module, level)
        if found is None:
            return None
        path, text = found
        return _PROJECT_MODULES.get(path, text, lambda outline: AstContext(str(path), text, outline))

    def report(self, node: ast.AST, message: str, fix: Fix | None = None, related: tuple[Related, ...] = (),
               preview: bool = False) -> None:
        """A finding on ``node`` (``CheckedFile._add``)."""
        self._add(*self.offsets(node), message, fix, related, preview)
