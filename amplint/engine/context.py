"""One parsed file as the rules see it: the tree, metadata on demand, and ``report``."""

from __future__ import annotations

import bisect
from functools import cached_property
from typing import TYPE_CHECKING, Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .diagnostics import Diagnostic, Edit, Fix, Location
from .names import ImportResolver
from .source import split_lines

if TYPE_CHECKING:
    from ..policy import PolicyTable
    from .rule import Rule


class _Index(cst.CSTVisitor):
    """Nodes by type, each node's parent, and each node's span in walk order (source order):
    collected in one walk. Keyed by ``id``: a libcst node's own hash is a Python-level call."""

    def __init__(self):
        self.by_type: dict[type, list] = {}
        self.parents: dict[int, cst.CSTNode] = {}
        self.spans: dict[int, list[int]] = {}  # [first, last] walk numbers of the subtree
        self._stack: list[cst.CSTNode] = []
        self._count = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.by_type.setdefault(type(node), []).append(node)
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self._stack.append(node)
        self.spans[id(node)] = [self._count, self._count]
        self._count += 1
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        self.spans[id(original_node)][1] = self._count - 1


class FileContext:
    """Shared by every rule on one file: one parse, metadata computed once and only if asked."""

    def __init__(self, path: str, source: str, module: cst.Module, policy_loader=None):
        self.path = path
        self.source = source
        self.module = module
        self.diagnostics: list[Diagnostic] = []
        self._policy_loader = policy_loader
        self._rule: type[Rule] | None = None

    # -- metadata, resolved lazily -------------------------------------------------------

    @cached_property
    def _statement_starts(self) -> dict[int, int]:
        """Where each top-level statement starts in the source. The module's code is its
        header, then its statements' code one after another; rendering them is several times
        cheaper than libcst's positions for the whole file."""
        offset = sum(len(self.module.code_for_node(line)) for line in self.module.header)
        starts = {}
        for statement in self.module.body:
            starts[id(statement)] = offset
            offset += len(self.code(statement))
        return starts

    def _statement_positions(self, statement: cst.CSTNode):
        """Positions inside one top-level statement (relative to its start), and its line starts."""
        cache = self.__dict__.setdefault("_positions_by_statement", {})
        if id(statement) not in cache:
            alone = self.module.with_changes(header=(), body=(statement,), footer=(), has_trailing_newline=True)
            positions = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
            starts, offset = [0], 0
            for line in split_lines(self.code(statement), keepends=True):
                offset += len(line)
                starts.append(offset)
            cache[id(statement)] = (statement, positions, starts)
        return cache[id(statement)]

    def _top_level_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        for candidate in (node, *self.ancestors(node)):
            if self.parent(candidate) is self.module:
                return candidate
        raise ValueError("the module itself, or its header or footer, has no statement")

    @cached_property
    def _index(self) -> "_Index":
        index = _Index()
        self.module.visit(index)
        return index

    @property
    def _parents(self):
        return self._index.parents

    def nodes(self, kind: type[cst.CSTNode]) -> list:
        """Every node of one type, in source order; one walk of the tree serves all rules."""
        return self._index.by_type.get(kind, [])

    @cached_property
    def _imports(self) -> ImportResolver:
        return ImportResolver(self.nodes, self.parent)

    @cached_property
    def _line_starts(self) -> list[int]:
        starts, offset = [0], 0
        for line in split_lines(self.source, keepends=True):
            offset += len(line)
            starts.append(offset)
        return starts

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self._parents.get(id(node))
        while current is not None:
            yield current
            current = self._parents.get(id(current))

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """What an imported name or attribute refers to: ``{"torch.nn.functional.softmax"}``
        for ``F.softmax``; empty for anything not reached through an import."""
        return self._imports.qualified_names(node)

    def resolves_to(self, node: cst.CSTNode, names: frozenset[str] | set[str]) -> str | None:
        """The first qualified name of ``node`` that is in ``names``."""
        return next((n for n in self.qualified_names(node) if n in names), None)

    def code(self, node: cst.CSTNode) -> str:
        """The node's source text. Rendered from the tree: positions cost a pass over the whole
        file, which only files with findings pay."""
        cache = self.__dict__.setdefault("_code", {})
        hit = cache.get(id(node))
        if hit is None or hit[0] is not node:  # an id is unique only while its node lives
            hit = cache[id(node)] = (node, self.module.code_for_node(node))
        return hit[1]

    def order(self, node: cst.CSTNode) -> int:
        """The node's rank in source order (``a`` before ``b`` iff ``order(a) < order(b)``)."""
        return self._index.spans[id(node)][0]

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        first, last = self._index.spans[id(outer)]
        return first <= self._index.spans[id(inner)][0] <= last

    # -- positions and offsets -----------------------------------------------------------

    def offsets(self, node: cst.CSTNode) -> tuple[int, int]:
        """Where ``node`` starts and ends in the source, as character offsets."""
        statement = self._top_level_statement(node)
        _, positions, starts = self._statement_positions(statement)
        rng, base = positions[node], self._statement_starts[id(statement)]
        return (base + starts[rng.start.line - 1] + rng.start.column,
                base + starts[rng.end.line - 1] + rng.end.column)

    def line_start(self, node: cst.CSTNode) -> int:
        """Offset of the first character of the line where ``node`` starts (a top-level
        statement always starts a line)."""
        statement = self._top_level_statement(node)
        _, positions, starts = self._statement_positions(statement)
        return self._statement_starts[id(statement)] + starts[positions[node].start.line - 1]

    def indentation_of(self, node: cst.CSTNode) -> str:
        start = self.line_start(node)
        line = self.source[start:self.offsets(node)[0]]
        return line[: len(line) - len(line.lstrip())]

    def location(self, offset: int) -> Location:
        row = bisect.bisect_right(self._line_starts, offset) - 1
        return Location(row + 1, offset - self._line_starts[row] + 1)

    @property
    def newline(self) -> str:
        return self.module.default_newline

    # -- reporting -------------------------------------------------------------------------

    def policy(self, device: str | None = None) -> "PolicyTable":
        """The op-policy table for ``device`` (default: the configured device)."""
        if self._policy_loader is None:
            raise RuntimeError("this run has no policy tables")
        return self._policy_loader(device)

    def report(self, node: cst.CSTNode, message: str, fix: Fix | None = None) -> None:
        rule = self._rule
        start, end = self.offsets(node)
        self.diagnostics.append(Diagnostic(
            code=rule.code, name=rule.name, message=message, path=self.path,
            location=self.location(start), end_location=self.location(end), fix=fix,
            url=rule.url(),
            edit_locations=[(self.location(e.start), self.location(e.end), e.content)
                            for e in (fix.edits if fix else ())]))

    def replace(self, node: cst.CSTNode, content: str) -> Edit:
        start, end = self.offsets(node)
        return Edit(start, end, content)
