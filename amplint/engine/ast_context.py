"""One file as the rules that read Python's ``ast`` see it: the outline (its tree, names
resolved through the imports, nodes by type), the source of a node, and ``report``. Python
parses a file several times faster than libcst: a file whose selected rules all read the
``ast`` is never parsed with libcst."""

from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING

from .checked_file import CheckedFile
from .diagnostics import Edit, Fix, Related
from .outline import Outline

if TYPE_CHECKING:
    from ..policy import PolicyLoader


class AstContext(CheckedFile):
    def __init__(self, path: str, source: str, outline: Outline, policy_loader: "PolicyLoader | None" = None,
                 preview: bool = False):
        super().__init__(path, source, policy_loader, preview, outline)
        self.outline: Outline = outline

    @cached_property
    def _encoded_lines(self) -> list[bytes]:
        """Each line as UTF-8: ``ast`` counts columns in its bytes."""
        return [self.source[start:end].encode("utf-8")
                for start, end in zip(self._line_starts, self._line_starts[1:])]

    def offset(self, row: int, byte_column: int) -> int:
        """The character offset of ``ast``'s position (a 1-based row, a UTF-8 byte column)."""
        line = self._encoded_lines[row - 1] if row - 1 < len(self._encoded_lines) else b""
        return self._line_starts[row - 1] + len(line[:byte_column].decode("utf-8", errors="replace"))

    def offsets(self, node: ast.AST) -> tuple[int, int]:
        """Where ``node`` starts and ends in the source, as character offsets."""
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def code(self, node: ast.AST) -> str:
        """The node's source text, as the file spells it."""
        start, end = self.offsets(node)
        return self.source[start:end]

    @cached_property
    def _parents(self) -> dict[int, ast.AST]:
        return {id(child): node for node in ast.walk(self.outline.tree) for child in ast.iter_child_nodes(node)}

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self._parents.get(id(node))

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost function around ``node`` (not a lambda); None at the top level."""
        parent = self._parents.get(id(node))
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parent = self._parents.get(id(parent))
        return parent

    def order(self, node: ast.AST) -> tuple[int, int, int, int]:
        """A key that sorts nodes in source order (an outer node before the nodes inside it)."""
        return node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset

    def replace(self, node: ast.AST, content: str) -> Edit:
        """An edit that puts ``content`` where ``node`` is."""
        return Edit(*self.offsets(node), content)

    def report(self, node: ast.AST, message: str, fix: Fix | None = None, related: tuple[Related, ...] = (),
               preview: bool = False) -> None:
        """A finding on ``node`` (``CheckedFile._add``)."""
        self._add(*self.offsets(node), message, fix, related, preview)
