"""One file as the rules that read libcst's tree see it: the tree, metadata on demand, and
``report``; what does not depend on the tree is ``checked_file.CheckedFile``'s."""

from __future__ import annotations

import ast
import bisect
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import libcst as cst

from .checked_file import CheckedFile
from .diagnostics import Edit, Fix, Related
from .names import ImportResolver
from .outline import Outline
from .project_index import star_dependency, star_imports
from .tree import Index, render

if TYPE_CHECKING:
    from ..policy import PolicyLoader


# What libcst and Python both see as statements, and (SimpleStatementSuite) where Python sees
# statements that libcst does not.
_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.SimpleStatementSuite)


def _ast_statements(tree: ast.AST) -> Iterator[ast.stmt]:
    """Python's statements, nested ones included, in source order."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.stmt):
            yield child
        if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
            yield from _ast_statements(child)


def _dotted_code(node: cst.CSTNode) -> str | None:
    """The code of a name or attribute chain (``self.model.fc``) with no parentheses in it and
    plain spaces around its dots, joined from its parts: what libcst's codegen renders, at a
    tenth of its cost (the rules ask for thousands). None for anything else."""
    parts: list[str] = []
    while type(node) is cst.Attribute and not node.lpar and not node.rpar and not node.attr.lpar:
        dot = node.dot
        if type(dot.whitespace_before) is not cst.SimpleWhitespace \
                or type(dot.whitespace_after) is not cst.SimpleWhitespace:
            return None
        parts.append(f"{dot.whitespace_before.value}.{dot.whitespace_after.value}{node.attr.value}")
        node = node.value
    if type(node) is not cst.Name or node.lpar or node.rpar:
        return None
    parts.append(node.value)
    return "".join(reversed(parts))


class FileContext(CheckedFile):
    """A file as the rules that read libcst's tree see it: one parse, metadata computed once
    and only if asked."""

    def __init__(self, path: str, source: str, module: cst.Module, policy_loader: "PolicyLoader | None" = None,
                 outline: Outline | None = None, preview: bool = False):
        super().__init__(path, source, policy_loader, preview, outline)
        self.module = module

    # -- metadata, resolved lazily -------------------------------------------------------

    @cached_property
    def _index(self) -> Index:
        return Index(self.module)

    @cached_property
    def _module_offsets(self) -> dict[int, tuple[int, int]]:
        """Every node's offsets, from rendering the whole module: when a statement's own
        offsets cannot be placed (see ``_statement_offsets``)."""
        return render(self.module, self.module)[1]

    @cached_property
    def _statement_lines(self) -> dict[int, int] | None:
        """The line where each statement's code starts (after its leading comments and blank
        lines), nested statements included, from Python's ast; None where ast and libcst do not
        count the same statements. Both are taken in source order and matched one by one."""
        outline = self.outline or Outline.parse(self.source)
        if outline is None:
            return None
        theirs = list(_ast_statements(outline.tree))
        spans = self._index.spans
        ours = sorted((node for kind, nodes in self._index.by_type.items() if issubclass(kind, _STATEMENTS)
                       for node in nodes), key=lambda node: spans[id(node)][0])
        lines, i = {}, 0
        for statement in ours:
            if isinstance(statement, cst.SimpleStatementSuite):
                # `if x: a; b` holds two of Python's statements and none of libcst's
                i += len(statement.body)
                continue
            if i >= len(theirs):
                return None
            lines[id(statement)] = theirs[i].lineno
            # `a = 1; b = 2` is one libcst statement and two of Python's
            i += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        return lines if i == len(theirs) else None

    def _statement_offsets(self, statement: cst.CSTNode, line: int, header_only: bool = False
                           ) -> tuple[int, dict] | None:
        """The offsets of the nodes inside one statement, from rendering it alone at its own
        indentation (files with findings pay for the statements they are in, not for the whole
        file), and where its code starts in the source. That start comes from ast's line number
        and is checked: the statement's code must be the source's there. None if it is not.
        ``header_only``: for the nodes before a compound statement's indented body (its
        decorators, `with` items, condition), rendered with a body of one `pass`: what comes
        before the body renders the same, and a long body is not rendered for them."""
        cache = self.__dict__.setdefault("_offsets_by_statement", {})
        key = (id(statement), header_only)
        if key not in cache:
            placed = None
            default = self.module.default_indent
            indents = [default if block.indent is None else block.indent
                       for block in self.ancestors(statement) if isinstance(block, cst.IndentedBlock)]
            indents.reverse()
            rendered = statement.with_changes(body=statement.body.with_changes(
                body=[cst.SimpleStatementLine([cst.Pass()])], footer=[])) if header_only else statement
            code, local = render(rendered, self.module, indents)
            base = self._line_starts[line - 1] + sum(map(len, indents)) - local[id(rendered)][0]
            # What was rendered of the source: all of it, or the header's line (to its colon's
            # comment and line break).
            end = local[id(rendered.body.header)][1] if header_only else len(code)
            if base >= 0 and self.source.startswith(code[:end], base):
                placed = (base, local)
            # The rendered copy is kept with its offsets: they are by id, and the id of a node
            # that is freed may be another's next.
            cache[key] = (placed, rendered)
        return cache[key][0]

    @property
    def _parents(self):
        return self._index.parents

    def nodes(self, kind: type[cst.CSTNode]) -> list:
        """Every node of one type, in source order; one walk of the tree serves all rules."""
        return self._index.by_type.get(kind, [])

    @cached_property
    def _imports(self) -> ImportResolver:
        # The index's own methods, not the context's: a context that its resolver refers to
        # is a cycle, which keeps the whole tree alive until the cycle collector runs.
        index = self._index
        return ImportResolver(lambda kind: index.by_type.get(kind, []), lambda node: index.parents.get(id(node)),
                              self._star_imports)

    def _star_imports(self) -> dict[str, frozenset[str]]:
        """What the file's star imports of the project's modules bind (``project_index``)."""

        root = self._project_root
        if root is None:
            return {}
        path = Path(self.path).resolve()
        self.dependencies.add(star_dependency(root, path))
        return star_imports(root, path)

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

    def names_leading_to(self, names: frozenset[str] | set[str]) -> frozenset[str]:
        """The names a reference must start with to resolve to one of ``names``
        (``ImportResolver.names_leading_to``)."""
        return self._imports.names_leading_to(names)

    def resolves_to(self, node: cst.CSTNode, names: frozenset[str] | set[str]) -> str | None:
        """The first qualified name of ``node`` that is in ``names``."""
        # Rules ask it of each call with one set of names after another: a node's qualified
        # names are looked up once (kept here only: ``qualified_names`` hands out a new set).
        cache = self.__dict__.setdefault("_qualified", {})
        hit = cache.get(id(node))
        if hit is None or hit[0] is not node:  # an id is unique only while its node lives
            hit = cache[id(node)] = (node, self.qualified_names(node))
        return next((n for n in hit[1] if n in names), None)

    def code(self, node: cst.CSTNode) -> str:
        """The node's source text. Rendered from the tree: positions cost a pass over the whole
        file, which only files with findings pay."""
        cache = self.__dict__.setdefault("_code", {})
        hit = cache.get(id(node))
        if hit is None or hit[0] is not node:  # an id is unique only while its node lives
            dotted = _dotted_code(node)
            hit = cache[id(node)] = (node, self.module.code_for_node(node) if dotted is None else dotted)
        return hit[1]

    def order(self, node: cst.CSTNode) -> int:
        """The node's rank in source order (``a`` before ``b`` iff ``order(a) < order(b)``)."""
        return self._index.spans[id(node)][0]

    def span(self, node: cst.CSTNode) -> tuple[int, int]:
        """The ranks of ``node`` and of its last descendant: ``node`` holds exactly the nodes
        ranked between them."""
        first, last = self._index.spans[id(node)]
        return first, last

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        first, last = self._index.spans[id(outer)]
        return first <= self._index.spans[id(inner)][0] <= last

    def nodes_within(self, kind: type[cst.CSTNode], outer: cst.CSTNode) -> list:
        """The nodes of one type that ``outer`` contains (``contains``: itself included), in
        source order: a slice of ``nodes(kind)``, found by bisection of their ranks."""
        ranks = self.__dict__.setdefault("_ranks", {})
        if kind not in ranks:
            spans = self._index.spans
            ranks[kind] = [spans[id(node)][0] for node in self.nodes(kind)]
        first, last = self._index.spans[id(outer)]
        return self.nodes(kind)[bisect.bisect_left(ranks[kind], first):bisect.bisect_right(ranks[kind], last)]

    def enclosing(self, node: cst.CSTNode, kind: type | tuple[type, ...]) -> cst.CSTNode | None:
        """The innermost ancestor of type ``kind`` (a function, a class; or of one of several
        types) around ``node``; None when there is none, or ``node`` is not in the tree. Rules
        ask it of most nodes they look at: the answer for every rank comes from one table per
        type, filled once."""
        tables = self.__dict__.setdefault("_enclosing", {})
        table = tables.get(kind)
        if table is None:
            spans = self._index.spans
            table = tables[kind] = [None] * len(spans)
            outers = self.nodes(kind) if isinstance(kind, type) else \
                sorted((n for k in kind for n in self.nodes(k)), key=self.order)
            for outer in outers:  # in source order: an inner one overwrites its outer
                first, last = spans[id(outer)]
                table[first + 1:last + 1] = [outer] * (last - first)
        span = self._index.spans.get(id(node))
        return table[span[0]] if span is not None else None

    def nodes_in(self, kind: type[cst.CSTNode], around: type | tuple[type, ...], scope: cst.CSTNode | None) -> list:
        """The nodes of type ``kind`` whose innermost ``around`` (``enclosing``) is ``scope``
        (None: those with none), in source order; grouped once for each pair of types."""
        groups = self.__dict__.setdefault("_nodes_in", {})
        grouped = groups.get((kind, around))
        if grouped is None:
            grouped = groups[(kind, around)] = {}
            for node in self.nodes(kind):
                grouped.setdefault(id(self.enclosing(node, around)), []).append(node)
        return grouped.get(id(scope), [])

    # -- positions and offsets -----------------------------------------------------------

    def offsets(self, node: cst.CSTNode) -> tuple[int, int]:
        """Where ``node`` starts and ends in the source, as character offsets: from the
        innermost enclosing statement that can be placed, else from the whole module."""
        lines = self._statement_lines
        if lines is not None:
            for candidate in (node, *self.ancestors(node)):
                line = lines.get(id(candidate))
                # Before the body in source order (the index numbers nodes so): in the header.
                header_only = candidate is not node and isinstance(getattr(candidate, "body", None), cst.IndentedBlock) \
                    and self._index.spans[id(node)][0] < self._index.spans[id(candidate.body)][0]
                placed = self._statement_offsets(candidate, line, header_only) if line is not None else None
                if placed is not None:
                    base, local = placed
                    start, end = local[id(node)]
                    return base + start, base + end
        return self._module_offsets[id(node)]

    def line_start(self, node: cst.CSTNode) -> int:
        """Offset of the first character of the line where ``node`` starts."""
        start = self.offsets(node)[0]
        return self._line_starts[bisect.bisect_right(self._line_starts, start) - 1]

    def indentation_of(self, node: cst.CSTNode) -> str:
        start = self.line_start(node)
        line = self.source[start:self.offsets(node)[0]]
        return line[: len(line) - len(line.lstrip())]

    @property
    def newline(self) -> str:
        return self.module.default_newline

    # -- reporting -------------------------------------------------------------------------

    def report(self, node: cst.CSTNode, message: str, fix: Fix | None = None,
               related: tuple[Related, ...] = (), preview: bool = False) -> None:
        """A finding on ``node`` (``CheckedFile._add``)."""
        self._add(*self.offsets(node), message, fix, related, preview)

    def replace(self, node: cst.CSTNode, content: str) -> Edit:
        start, end = self.offsets(node)
        return Edit(start, end, content)
