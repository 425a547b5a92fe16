"""A file as Python's own ``ast`` sees it, once parsed for every rule: its tree, its nodes by
type, what its names stand for by its imports, the innermost function around each node."""

from __future__ import annotations

import ast
from collections import deque
from functools import cached_property
from typing import Callable, Generic, Iterator, TypeVar


def dotted(expr: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return parts[::-1]


# The fields each node type is walked through: not an expression's Load/Store context, nor the
# fields that hold identifiers, numbers or strings; None for values that are not nodes.
_SCALAR_FIELDS = frozenset({"ctx", "id", "attr", "name", "arg", "module", "kind", "level", "type_comment",
                            "is_async", "conversion"})
_FIELDS: dict[type, tuple[str, ...] | None] = {str: None, int: None, type(None): None}


def _fields(kind: type) -> tuple[str, ...] | None:
    if not issubclass(kind, ast.AST):
        found = None
    elif kind is ast.Constant:
        found = ()
    else:
        found = tuple(f for f in kind._fields if f not in _SCALAR_FIELDS)
    _FIELDS[kind] = found
    return found


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes directly inside ``node``, in the order of its fields: ``ast.iter_child_nodes``
    without the expressions' Load/Store contexts, from the table above (the engine's walks
    ask it of every node, and the generators of ``ast`` cost three times as much)."""
    kind = type(node)
    fields = _FIELDS[kind] if kind in _FIELDS else _fields(kind)
    found: list[ast.AST] = []
    for name in fields or ():
        value = getattr(node, name)
        if type(value) is list:
            for item in value:
                if isinstance(item, ast.AST):
                    found.append(item)
        elif isinstance(value, ast.AST):
            found.append(value)
    return found


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and every node inside it, breadth first, as ``ast.walk`` (less contexts)."""
    queue = deque([node])
    while queue:
        current = queue.popleft()
        queue.extend(child_nodes(current))
        yield current


def spelled_names(node: ast.AST) -> Iterator[str]:
    """Every name the code spells: read, bound, defined, imported, an attribute, a keyword."""
    for n in walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield n.name
        elif isinstance(n, (ast.arg, ast.keyword)):
            yield n.arg or ""
        elif isinstance(n, ast.alias):
            yield n.name
            yield n.asname or ""
        elif isinstance(n, ast.ImportFrom):
            yield n.module or ""
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            yield from n.names
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            yield n.name or ""
        elif isinstance(n, ast.MatchClass):
            yield from n.kwd_attrs
        elif isinstance(n, ast.MatchMapping):
            yield n.rest or ""


def named_parameters(args: ast.arguments) -> list[ast.arg]:
    """The parameters a call may pass one by one (not ``*args``, ``**kwargs``), in order."""
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


def parameter_defaults(args: ast.arguments) -> dict[ast.arg, ast.expr]:
    """The parameters that have a default, with it, in the signature's order."""
    positional = (*args.posonlyargs, *args.args)
    found = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    found.update((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    return found


def first_position(node: ast.AST) -> tuple[int, int]:
    """Where ``node`` starts: at its first decorator, for a decorated definition."""
    return min([(node.lineno, node.col_offset),
                *((d.lineno, d.col_offset) for d in getattr(node, "decorator_list", ()))])


def contains(outer: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` lies inside ``outer`` (its decorators included), by position: what
    ``ast.walk(outer)`` would reach, without walking it."""
    return first_position(outer) <= (node.lineno, node.col_offset) \
        and (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


_NOTHING: frozenset[str] = frozenset()

# Statements that bind names.
BINDING_STATEMENTS = (ast.Assign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)


class Scopes(dict):
    """The innermost function (by id; 0 at module level) around every binding statement, call
    and binary operation (by id); and which
    of them sit in a class body (whose assignments bind no name of a function). One sweep in
    source order with a stack of the functions and classes still open (they nest, so the
    stack's top is the innermost)."""

    def __init__(self, outline: "Outline"):
        super().__init__()
        events = [((f.lineno, f.col_offset), 0, (f.end_lineno, f.end_col_offset), id(f), kind is ast.ClassDef)
                  for kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef) for f in outline.nodes(kind)]
        events += [((n.lineno, n.col_offset), 1, None, id(n), False)
                   for kind in (*BINDING_STATEMENTS, ast.Call, ast.BinOp) for n in outline.nodes(kind)]
        events.sort(key=lambda e: (e[0], e[1]))
        self.in_class_body: set[int] = set()
        stack: list[tuple[tuple[int, int], int, bool]] = []
        for at, is_node, end, key, is_class in events:
            while stack and stack[-1][0] <= at:
                stack.pop()
            if is_node:
                self[key] = next((k for _, k, c in reversed(stack) if not c), 0)
                if stack and stack[-1][2]:
                    self.in_class_body.add(key)
            else:
                stack.append((end, key, is_class))


# Outlines a project's scan made (``keep=True``), by text, until the check of the same text in
# the same process takes them (``Outline.parse``): the files a project's scan reads are mostly
# those its checks outline again. A tree takes about 30 times its text's size: the texts of
# those held add up to at most _KEPT_CHARACTERS (the oldest go first).
_KEPT: dict[str, "Outline"] = {}
_KEPT_CHARACTERS = 4_000_000
# What a kept outline hands on: what it read of its tree alone (the rest, such as what a name
# stands for, may depend on the project the next reader gives it).
_CARRIED = ("_index", "scopes")


class Outline:
    # What the prefilter may ask of the checked file's project (``project_index.ProjectHints``;
    # None for text whose path names no file on disk): set by the runner.
    project = None

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self._qualified: dict[int, frozenset[str]] = {}  # by id of the node (the tree keeps them alive)

    @classmethod
    def parse(cls, source: str, keep: bool = False) -> "Outline | None":
        """None when Python cannot parse it. With ``keep``, the
        outline is also kept for the next ``parse`` of the same text, which takes it (its tree
        and node index, ``_CARRIED``)."""
        kept = _KEPT.pop(source, None)
        if kept is not None:
            return kept.of_same_tree()
        try:
            outline = cls(ast.parse(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if keep and len(source) <= _KEPT_CHARACTERS:
            held = sum(map(len, _KEPT)) + len(source)
            while held > _KEPT_CHARACTERS:
                held -= len(oldest := next(iter(_KEPT)))
                del _KEPT[oldest]
            _KEPT[source] = outline
        return outline

    def of_same_tree(self) -> "Outline":
        """A new outline of this tree, with what was read of the tree alone (``_CARRIED``) and
        nothing of what its names stand for."""
        outline = Outline(self.tree)
        outline.__dict__.update((k, self.__dict__[k]) for k in _CARRIED if k in self.__dict__)
        return outline

    @staticmethod
    def forget_kept() -> None:
        _KEPT.clear()

    @cached_property
    def _index(self) -> tuple[dict[type, list[ast.AST]], dict[int, ast.AST]]:
        """Every node by type, and the node each node sits in (by id of the node), from one
        walk (``ast.walk`` is a generator per node, and slower)."""
        by_type: dict[type, list[ast.AST]] = {}
        parents: dict[int, ast.AST] = {}
        stack: list = [self.tree]
        while stack:
            node = stack.pop()
            kind = type(node)
            fields = _FIELDS[kind] if kind in _FIELDS else _fields(kind)
            if fields is None:  # a name in `global x`, a number in a match pattern: not a node
                continue
            nodes = by_type.get(kind)
            if nodes is None:
                nodes = by_type[kind] = []
            nodes.append(node)
            for name in fields:
                value = getattr(node, name)
                if type(value) is list:
                    for child in value:
                        parents[id(child)] = node
                    stack.extend(value)
                elif value is not None:
                    parents[id(value)] = node
                    stack.append(value)
        return by_type, parents

    @property
    def parents(self) -> dict[int, ast.AST]:
        return self._index[1]

    @cached_property
    def scopes(self) -> Scopes:
        return Scopes(self)

    def nodes(self, kind: type) -> list:
        """Every node of one type (in no particular order)."""
        return self._index[0].get(kind, [])

    @cached_property
    def _imports(self) -> dict[str, set[str]]:
        """Every name any import binds, in any scope, and what it may stand for."""
        found: dict[str, set[str]] = {}
        if self.project is not None and any(isinstance(s, ast.ImportFrom) and s.names[0].name == "*"
                                            for s in self.tree.body):
            for local, qualified in self.project.star_imports().items():  # the project's re-exports
                found.setdefault(local, set()).update(qualified)
        for node in self.nodes(ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                found.setdefault(local, set()).add(alias.name if alias.asname else local)
        for node in self.nodes(ast.ImportFrom):
            if node.module and not node.level:
                for alias in node.names:
                    found.setdefault(alias.asname or alias.name, set()).add(f"{node.module}.{alias.name}")
        return found

    def qualified_names(self, expr: ast.expr) -> frozenset[str]:
        """What a name or attribute may stand for, by the file's imports (each rule's test asks
        of the same calls: answered once per node)."""
        known = self._qualified.get(id(expr))
        if known is None:
            parts = dotted(expr)
            if parts is None or parts[0] not in self._imports:
                known = _NOTHING
            else:
                tail = "".join("." + p for p in parts[1:])
                known = frozenset(q + tail for q in self._imports[parts[0]])
            self._qualified[id(expr)] = known
        return known

    def calls_to(self, names: frozenset[str] | set[str]) -> list[ast.Call]:
        return [c for c in self.nodes(ast.Call) if not self.qualified_names(c.func).isdisjoint(names)]

    def method_calls(self, name: str) -> list[ast.Call]:
        """``<anything>.name(...)`` calls."""
        return [c for c in self.nodes(ast.Call) if isinstance(c.func, ast.Attribute) and c.func.attr == name]

    def refers_to(self, names: frozenset[str] | set[str]) -> bool:
        """Whether a name or attribute outside the imports refers to one of ``names``."""
        imported = self._imports
        return any(node.id in imported and not self.qualified_names(node).isdisjoint(names)
                   for node in self.nodes(ast.Name)) or any(
            not self.qualified_names(node).isdisjoint(names) for node in self.nodes(ast.Attribute))


Built = TypeVar("Built")


class ModulesByText(Generic[Built]):
    """What is built from the outlines of a project's other modules (by path and text), kept in
    the process for the next check that reads the same text: a module many files import is
    parsed once. At most ``most`` modules, the oldest dropped first, and one text per path: a
    module read with a new text (saved since) drops what was built from its older one, which no
    check reads again (the project's modules are read from disk), so that a language server
    does not hold a tree for every version of a module saved while it runs."""

    def __init__(self, most: int):
        self._most = most
        self._built: dict[tuple[object, str], Built | None] = {}

    def get(self, path: object, text: str, build: Callable[[Outline], Built]) -> Built | None:
        """What ``build`` makes of the module's outline; None when it does not parse."""
        key = (path, text)
        if key not in self._built:
            for older in [k for k in self._built if k[0] == path]:
                del self._built[older]
            while len(self._built) >= self._most:
                del self._built[next(iter(self._built))]
            outline = Outline.parse(text)
            self._built[key] = None if outline is None else build(outline)
        return self._built[key]
