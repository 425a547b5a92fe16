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
import re
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
    parsing at once cannot leave validation off.

    Where the process asks (``parse_in_pieces``), the module is parsed in pieces of whole
    top-level statements (``_pieces``), each piece once per text (``_PIECES``): an edit parses
    again only the statements it touched (a language server checks a document after each
    edit), and hands out the others' nodes again. The tree is the one libcst builds for the
    whole text (tests/test_server.py compares them); where the pieces could give another one,
    the whole text is parsed. A run over files each parsed once parses them whole: pieces are
    slower to parse the first time."""
    cst.CSTNode.__post_init__ = _no_validation
    try:
        return (_in_pieces(source) if _KEEP_PIECES else None) or cst.parse_module(source)
    finally:
        cst.CSTNode.__post_init__ = _VALIDATION


# A line that starts with code at column 0 (not a clause of the statement above, nor a
# closing bracket): where a top-level statement may start.
_AT_COLUMN_0 = re.compile(r"^(?!(?:else|elif|except|finally)\b)[^\s#)\]}]", re.MULTILINE)
_KEEP_PIECES: list[bool] = []


def parse_in_pieces() -> None:
    """Parse modules in pieces from now on in this process, keeping each piece's tree and
    index for the next parse of a text that holds it (``parse``, ``Index``)."""
    _KEEP_PIECES[:] = [True]


# Pieces parsed alone, by their text, the most recently used last; at most _PIECE_CHARACTERS
# characters of them are kept (a tree takes some 100 times its text's size in memory).
_PIECES: dict[str, "_Piece"] = {}
_PIECE_CHARACTERS = 200_000
_MAX_FAILED_PIECES = 8


class _Piece:
    """A piece parsed alone, and its statements as a module of several pieces holds them
    after its first piece (made once: a statement handed out again is the same node)."""

    __slots__ = ("module", "_statements")

    def __init__(self, module: cst.Module):
        self.module = module
        self._statements: list[cst.CSTNode] | None = None

    def statements(self) -> list[cst.CSTNode]:
        if self._statements is None:
            statement, *rest = self.module.body
            if self.module.header:  # the lines above the statement, which the piece alone takes for its header
                statement = statement.with_changes(leading_lines=(*self.module.header, *statement.leading_lines))
            self._statements = [statement, *rest]
        return self._statements


def _pieces(source: str) -> list[str]:
    """``source`` cut before top-level statements, each cut where libcst gives the lines above
    the statement to it (its ``leading_lines``): every line between it and the code before it
    is empty or a comment at column 0 (an indented comment would close the block above, as its
    ``footer``). A cut inside a string or brackets, or after a backslash, leaves a piece that
    does not parse alone; one before `else:`, `except:` or the like, one that does not parse
    either."""
    cuts = [0]
    for found in _AT_COLUMN_0.finditer(source):
        end = found.start()
        while end > 0:
            start = source.rfind("\n", 0, end - 1) + 1
            line = source[start:end]
            if line not in ("\n", "\r\n") and not line.startswith("#"):
                # The code above: not a blank or indented comment line, no backslash at its end.
                if line.strip() and not line.lstrip().startswith("#") and not line.rstrip("\r\n").endswith("\\") \
                        and end > cuts[-1]:
                    cuts.append(end)
                break
            end = start
    cuts.append(len(source))
    return [source[a:b] for a, b in zip(cuts, cuts[1:])]


def _in_pieces(source: str) -> cst.Module | None:
    """The module assembled from its pieces parsed alone; None where a piece does not parse, or
    the pieces were parsed with other defaults than the whole text's (its first indentation
    and line break)."""
    pieces = _pieces(source)
    if len(pieces) < 2:
        return None
    modules, texts, seen, pending, failed = [], [], set(), "", 0
    for piece in pieces:
        text = pending + piece
        # A text met twice in one module is parsed again: a node stands in one place of a tree.
        module = _PIECES.pop(text, None) if text not in seen else None
        if module is None:
            try:
                module = _Piece(cst.parse_module(text))
            except (cst.ParserSyntaxError, RecursionError):
                # Cut inside a string or brackets: taken together with the next piece. A few
                # times at most: text that does not parse is parsed whole, once.
                failed += 1
                if failed > _MAX_FAILED_PIECES:
                    return None
                pending = text
                continue
        if text not in seen:
            _PIECES[text] = module
            seen.add(text)
        modules.append(module)
        texts.append(text)
        pending = ""
    if pending or len(modules) < 2:
        return None
    held = sum(map(len, _PIECES))
    while held > _PIECE_CHARACTERS and len(_PIECES) > len(modules):
        held -= len(oldest := next(iter(_PIECES)))
        del _PIECES[oldest]
    first, last = modules[0].module, modules[-1].module
    # A piece with an indented line detects its default indentation from it: where the whole
    # text's first indentation is, with every such piece agreeing, each block's `indent` is
    # what the whole parse gives it.
    indents = {p.module.default_indent for text, p in zip(texts, modules) if _INDENTED.search(text)}
    if len(indents) > 1 or len({p.module.default_newline for p in modules}) > 1 \
            or any(p.module.footer for p in modules[:-1]) or any(not p.module.body for p in modules):
        return None
    body = list(first.body)
    for piece in modules[1:]:
        body += piece.statements()
    return cst.Module(body=tuple(body), header=first.header, footer=last.footer, encoding=first.encoding,
                      default_indent=first.default_indent if not indents else indents.pop(),
                      default_newline=first.default_newline, has_trailing_newline=last.has_trailing_newline)


_INDENTED = re.compile(r"^[ \t]", re.MULTILINE)


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
        if type(module) is cst.Module and _KEEP_PIECES:
            self._module(module)
        else:
            self._visit(module, None)

    def _module(self, module: cst.Module) -> None:
        """``_visit`` of a module, with each top-level statement's part taken from its own
        index (``_statement_index``): a statement that a parse in pieces handed out again is
        not walked again."""
        self.by_type[cst.Module] = [module]
        span = self.spans[id(module)] = [0, 0]
        self._count = 1
        by_type, spans = self.by_type, self.spans
        for statement in module.body:
            own = _statement_index(statement)
            for kind, nodes in own.by_type.items():
                found = by_type.get(kind)
                if found is None:
                    by_type[kind] = list(nodes)
                else:
                    found.extend(nodes)
            self.parents.update(own.parents)
            self.parents[id(statement)] = module
            offset = self._count
            for key, (first, last) in own.spans.items():
                spans[key] = [first + offset, last + offset]
            self._count += own._count
        span[1] = self._count - 1

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


# The index of each top-level statement walked lately, by the statement's id, with the statement
# (an id is another node's once its node is freed); the oldest go first past _INDEXED_NODES nodes.
_STATEMENT_INDEXES: dict[int, tuple[cst.CSTNode, Index]] = {}
_INDEXED_NODES = 100_000
_indexed = [0]  # the nodes the kept indexes hold


def _statement_index(statement: cst.CSTNode) -> Index:
    kept = _STATEMENT_INDEXES.pop(id(statement), None)
    if kept is None or kept[0] is not statement:
        if kept is not None:
            _indexed[0] -= kept[1]._count
        own = Index.__new__(Index)
        own.by_type, own.parents, own.spans, own._count = {}, {}, {}, 0
        own._visit(statement, None)
        kept = (statement, own)
        _indexed[0] += own._count
        while _indexed[0] > _INDEXED_NODES and _STATEMENT_INDEXES:
            _indexed[0] -= _STATEMENT_INDEXES.pop(next(iter(_STATEMENT_INDEXES)))[1]._count
    _STATEMENT_INDEXES[id(statement)] = kept
    return kept[1]


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
