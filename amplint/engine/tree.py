"""Two passes over a libcst tree, cheaper than libcst's own: the node index the rules query, and
the offsets where nodes start and end.

libcst's visitor rebuilds every node it leaves and visits whitespace, commas and parentheses
as nodes of their own: over half the parse's objects, and more time than the parse itself.
The index here walks the nodes that hold code (expressions, statements and their parts) and
skips syntax tokens and whitespace, which no rule asks for. libcst's positions record line and
column for every token; the offsets here only count characters while a node is rendered.
They are checked against libcst's own visitor (tests/test_tree.py) and PositionProvider
(tests/test_positions.py).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import libcst as cst
from libcst._nodes.internal import CodegenState  # the hook libcst's own position providers use

# Fields that hold only whitespace, comments or syntax tokens (or plain strings).
_SYNTAX_FIELDS = frozenset({
    "asynchronous", "colon", "comma", "comment", "default_indent", "default_newline", "dot",
    "empty_lines", "encoding", "end", "equal", "first_colon", "first_line", "footer",
    "has_trailing_newline", "header", "indent", "last_line", "lbrace", "lbracket",
    "leading_lines", "leading_whitespace", "lines_after_decorators", "lpar", "newline", "operator",
    "posonly_ind", "rbrace", "rbracket", "relative", "rpar", "second_colon", "semicolon",
    "separator", "start", "star", "trailing_comma", "trailing_whitespace", "conversion",
})

# Where a node's children come in another order in the source than its dataclass declares them
# (only the fields walked matter). A test derives every class's order from libcst's visitor.
_SOURCE_ORDER = {
    "Arg": ("keyword", "value"),
    "ClassDef": ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    "FunctionDef": ("decorators", "name", "type_parameters", "params", "returns", "body"),
    "ExceptHandler": ("type", "name", "body"),
    "ExceptStarHandler": ("type", "name", "body"),
    "IfExp": ("body", "test", "orelse"),
    "MatchCase": ("pattern", "guard", "body"),
    "Parameters": ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "TypeAlias": ("name", "type_parameters", "value"),
}

_fields_cache: dict[type, tuple[str, ...]] = {}


_VALIDATION = cst.CSTNode.__post_init__


def _no_validation(node: cst.CSTNode) -> None:
    pass


def parse(source: str) -> cst.Module:
    """``libcst.parse_module``, without validating each node as it is built: libcst's parser
    builds only valid trees, and the checks (an eighth of the parse's time) are there for trees
    built by hand (libcst's own comment on ``CSTNode.__post_init__`` says as much). Nodes the
    rules build for fixes are still validated. Always restored to libcst's own: two threads
    parsing at once cannot leave validation off."""
    cst.CSTNode.__post_init__ = _no_validation
    try:
        return cst.parse_module(source)
    finally:
        cst.CSTNode.__post_init__ = _VALIDATION


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node class that the index walks, in source order."""
    found = _fields_cache.get(kind)
    if found is None:
        declared = [f.name for f in dataclasses.fields(kind)
                    if f.name not in _SYNTAX_FIELDS and not f.name.startswith("whitespace")]
        # An older libcst may lack a field (type_parameters came in 1.1); a newer one may add
        # one, whose place in the source amplint cannot guess.
        found = tuple(f for f in _SOURCE_ORDER.get(kind.__name__, declared) if f in declared)
        if len(found) != len(declared):
            raise RuntimeError(f"amplint does not know the order of {kind.__name__}'s fields {declared}")
        _fields_cache[kind] = found
    return found


class Index:
    """Nodes by type, each node's parent, and each node's [first, last] rank in source order
    (its own and its last descendant's): built in one walk, keyed by ``id`` (a libcst node's
    hash is a Python-level call)."""

    def __init__(self, module: cst.Module):
        self.by_type: dict[type, list] = {}
        self.parents: dict[int, cst.CSTNode] = {}
        self.spans: dict[int, list[int]] = {}
        self._count = 0
        self._visit(module, None)

    def _visit(self, node: cst.CSTNode, parent: cst.CSTNode | None) -> None:
        kind = type(node)
        nodes = self.by_type.get(kind)
        if nodes is None:
            nodes = self.by_type[kind] = []
        nodes.append(node)
        if parent is not None:
            self.parents[id(node)] = parent
        span = self.spans[id(node)] = [self._count, 0]
        self._count += 1
        for name in _fields_cache.get(kind) or child_fields(kind):
            value = getattr(node, name)
            if _IS_NODE.get(type(value)) or _is_node(value):
                self._visit(value, node)
            elif isinstance(value, (tuple, list)):
                for item in value:
                    if _IS_NODE.get(type(item)) or _is_node(item):
                        self._visit(item, node)
        span[1] = self._count - 1


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes that hold code directly below ``node``, in source order: libcst's
    ``node.children`` without its syntax tokens and whitespace, and many times cheaper (libcst
    rebuilds the node to list them)."""
    found = []
    for name in _fields_cache.get(type(node)) or child_fields(type(node)):
        value = getattr(node, name)
        if _IS_NODE.get(type(value)) or _is_node(value):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(item for item in value if _IS_NODE.get(type(item)) or _is_node(item))
    return found


# CSTNode is an abstract base class: isinstance() on it is a Python-level call, and the walk
# asks it of every field. The answer for each type seen so far comes from a dict.
_IS_NODE: dict[type, bool] = {}


def _is_node(value: object) -> bool:
    kind = type(value)
    if kind not in _IS_NODE:
        _IS_NODE[kind] = isinstance(value, cst.CSTNode)
    return _IS_NODE[kind]


class _OffsetState(CodegenState):
    """Renders while counting characters, and records where each node starts and ends, with
    libcst's syntactic bounds (a statement without its leading blank lines and indentation,
    an expression with its parentheses only where libcst's PositionProvider has them)."""

    def __init__(self, module: cst.Module):
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.offset = 0
        self.spans: dict[int, tuple[int, int]] = {}
        self._open: list[int] = []

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def pop_trailing_newline(self) -> None:
        if self.tokens:
            self.offset -= len(self.tokens.pop())

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._open.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._open.pop()
        self.spans.setdefault(id(node), (start, self.offset))  # a syntactic span wins

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> "_SyntacticSpan":
        return _SyntacticSpan(self, node, start_node, end_node)


class _SyntacticSpan:
    """The span of the code rendered inside ``with``, or of the given first and last nodes.
    A class, not ``@contextmanager``: libcst enters one per expression, and a generator-based
    context manager costs several times more."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _OffsetState, node, start_node, end_node):
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = self.state.offset

    def __exit__(self, *exc) -> None:
        spans = self.state.spans
        start = spans[id(self.start_node)][0] if self.start_node is not None else self.start
        end = spans[id(self.end_node)][1] if self.end_node is not None else self.state.offset
        spans[id(self.node)] = (start, end)


def render(node: cst.CSTNode, module: cst.Module,
           indents: Sequence[str] = ()) -> tuple[str, dict[int, tuple[int, int]]]:
    """The code of ``node`` (the module, or a part of it), and the (start, end) character
    offsets of every node inside it in that code, by ``id``. ``indents``: those of the blocks
    around ``node``, outermost first, so that a nested statement renders as it reads."""
    state = _OffsetState(module)
    state.indent_tokens.extend(indents)
    node._codegen(state)
    return "".join(state.tokens), state.spans
