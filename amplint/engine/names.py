"""What imported name an expression refers to: ``F.softmax`` is ``torch.nn.functional.softmax``
after ``import torch.nn.functional as F``.

The rules only ask about imported names (torch's API), so this follows imports and nothing
else, with Python's scoping: a function's parameter or assignment named like an import hides
that import inside the function; class bodies do not enclose their methods. It replaces
libcst's QualifiedNameProvider, whose full scope analysis was most of a check's run time.
"""

from __future__ import annotations

from typing import Callable, Iterable

import libcst as cst

# torch.autocast and torch.amp.autocast take the device first; the per-device classes do not.
AUTOCAST_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
AUTOCAST_DEVICE = {
    "torch.cuda.amp.autocast": "cuda",
    "torch.cuda.amp.autocast_mode.autocast": "cuda",
    "torch.cpu.amp.autocast": "cpu",
    "torch.cpu.amp.autocast_mode.autocast": "cpu",
}
AUTOCAST = AUTOCAST_GENERIC | frozenset(AUTOCAST_DEVICE)

Scope = cst.CSTNode  # a Module, FunctionDef, Lambda, ClassDef or comprehension
_SCOPES = (cst.Module, cst.FunctionDef, cst.Lambda, cst.ClassDef,
           cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
# The same, as a set of types: libcst's node classes are abstract base classes, and an
# isinstance() that fails on one is a Python-level call (scope_of asks it of every ancestor).
_SCOPE_TYPES = frozenset(_SCOPES)


def dotted(expr: cst.CSTNode) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while type(expr) is cst.Attribute:  # exact types: see _SCOPE_TYPES
        parts.append(expr.attr.value)
        expr = expr.value
    if type(expr) is not cst.Name:
        return None
    parts.append(expr.value)
    return parts[::-1]


def _import_bindings(stmt: cst.Import | cst.ImportFrom) -> Iterable[tuple[str, str]]:
    """(local name, qualified name) for each name an import statement binds."""
    if isinstance(stmt, cst.ImportFrom):
        if isinstance(stmt.names, cst.ImportStar) or stmt.relative or stmt.module is None:
            return
        module = ".".join(dotted(stmt.module) or ())
        for alias in stmt.names:
            name = alias.evaluated_name
            yield alias.evaluated_alias or name, f"{module}.{name}"
    else:
        for alias in stmt.names:
            if alias.evaluated_alias:
                yield alias.evaluated_alias, alias.evaluated_name
            else:
                head = alias.evaluated_name.split(".")[0]
                yield head, head


def _bound_names(node: cst.CSTNode) -> Iterable[cst.Name]:
    """The plain names a binding target binds (tuples unpacked; attributes and subscripts
    bind nothing)."""
    if isinstance(node, cst.Name):
        yield node
    elif isinstance(node, (cst.Tuple, cst.List)):
        for element in node.elements:
            yield from _bound_names(element.value)
    elif isinstance(node, cst.StarredElement):
        yield from _bound_names(node.value)


class ImportResolver:
    """Qualified names of names and attributes, from the imports of one file."""

    def __init__(self, nodes: Callable[[type], list], parent: Callable[[cst.CSTNode], cst.CSTNode | None],
                 star: Callable[[], dict[str, frozenset[str]]] | None = None):
        """``star``: what the file's ``from <project module> import *`` bind, asked only of a
        file that has one at module level (``project_index.star_imports``)."""
        self._parent = parent
        self._imports: dict[tuple[int, str], set[str]] = {}  # (id(scope), local name) -> names
        for kind in (cst.Import, cst.ImportFrom):
            for stmt in nodes(kind):
                scope = self.scope_of(stmt)
                if star is not None and isinstance(stmt, cst.ImportFrom) and isinstance(stmt.names, cst.ImportStar) \
                        and isinstance(scope, cst.Module):
                    for local, qualified in star().items():
                        self._imports.setdefault((id(scope), local), set()).update(qualified)
                    star = None
                for local, qualified in _import_bindings(stmt):
                    self._imports.setdefault((id(scope), local), set()).add(qualified)
        self._imported = {local for _, local in self._imports}
        self._shadowed: set[tuple[int, str]] = set()
        self._binding: set[int] = set()  # ids of Name nodes that bind rather than refer
        if self._imported:
            self._collect_shadows(nodes)
        self._scope_cache: dict[int, Scope] = {}

    def _collect_shadows(self, nodes: Callable[[type], list]) -> None:
        """Scopes where an imported name is bound by something other than an import."""
        def bind(owner: cst.CSTNode, names: Iterable[cst.Name], scope: Scope | None = None) -> None:
            for name in names:
                if name.value in self._imported:
                    self._shadowed.add((id(scope or self.scope_of(owner)), name.value))
                    self._binding.add(id(name))

        for param in nodes(cst.Param):
            bind(param, (param.name,), self._function_of_param(param))
        for target in nodes(cst.AssignTarget):
            bind(target, _bound_names(target.target))
        for kind in (cst.AnnAssign, cst.AugAssign):
            for stmt in nodes(kind):
                bind(stmt, _bound_names(stmt.target))
        for kind in (cst.For, cst.CompFor):
            for loop in nodes(kind):
                bind(loop.target, _bound_names(loop.target))
        for as_name in nodes(cst.AsName):
            if not isinstance(self._parent(as_name), cst.ImportAlias):
                bind(as_name, _bound_names(as_name.name))
        for expr in nodes(cst.NamedExpr):
            bind(expr, _bound_names(expr.target))
        for kind in (cst.FunctionDef, cst.ClassDef):
            for definition in nodes(kind):
                bind(definition, (definition.name,))

    def names_leading_to(self, names: Iterable[str]) -> frozenset[str]:
        """The local names that some import, in any scope, binds to one of ``names`` or to a
        module above one (``torch`` for ``torch.cuda.amp.autocast``): only a reference that
        starts with one of them can resolve to one of ``names``."""
        prefixes = {name[:end] for name in names for end in range(len(name) + 1)
                    if end == len(name) or name[end] == "."}
        return frozenset(local for (_, local), qualified in self._imports.items() if not qualified.isdisjoint(prefixes))

    def _function_of_param(self, param: cst.Param) -> Scope:
        node = self._parent(param)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda)):
            node = self._parent(node)
        return node

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The scope a name at ``node`` is looked up in first. A function's decorators, default
        values and annotations belong to the scope around it, as does a class's header."""
        child, current = node, self._parent(node)
        while current is not None:
            if type(current) in _SCOPE_TYPES:
                if isinstance(current, (cst.FunctionDef, cst.ClassDef)) and child is not current.body:
                    pass  # the header of a def/class: evaluated outside it
                elif isinstance(current, cst.Lambda) and child is not current.body:
                    pass
                else:
                    return current
            child, current = current, self._parent(current)
        return child  # the Module

    def _enclosing(self, scope: Scope) -> Scope | None:
        if isinstance(scope, cst.Module):
            return None
        outer = self.scope_of(scope)
        # Class bodies are skipped when looking up from a nested function.
        while isinstance(outer, cst.ClassDef):
            outer = self.scope_of(outer)
        return outer

    def _lookup(self, name: str, scope: Scope) -> set[str]:
        current: Scope | None = scope
        while current is not None:
            key = (id(current), name)
            if key in self._imports:
                return self._imports[key]
            if key in self._shadowed:
                return set()
            current = self._enclosing(current)
        return set()

    def qualified_names(self, expr: cst.CSTNode) -> set[str]:
        parts = dotted(expr)
        if parts is None or parts[0] not in self._imported:
            return set()
        head = expr
        while isinstance(head, cst.Attribute):
            head = head.value
        if id(head) in self._binding:
            return set()
        scope = self._scope_cache.get(id(head))
        if scope is None:
            scope = self._scope_cache[id(head)] = self.scope_of(head)
        tail = "".join("." + p for p in parts[1:])
        return {q + tail for q in self._lookup(parts[0], scope)}
