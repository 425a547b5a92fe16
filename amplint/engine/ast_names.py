"""What an imported name stands for, with Python's scoping. A function's
parameter or assignment named like an import hides that import inside the function; class
bodies do not enclose their methods; a function's decorators, defaults and annotations, and a
class's header, belong to the scope around it. ``Outline.qualified_names`` is the prefilter's
looser answer (an import in any scope counts)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .outline import Outline, dotted
from .project_index import star_dependency, star_imports

if TYPE_CHECKING:
    from .checked_file import CheckedFile

_SCOPES = frozenset({ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
                     ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp})
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _import_bindings(stmt: ast.Import | ast.ImportFrom) -> Iterable[tuple[str, str]]:
    """(local name, qualified name) for each name an absolute import statement binds."""
    if isinstance(stmt, ast.ImportFrom):
        if stmt.level or stmt.module is None or stmt.names[0].name == "*":
            return
        for alias in stmt.names:
            yield alias.asname or alias.name, f"{stmt.module}.{alias.name}"
    else:
        for alias in stmt.names:
            if alias.asname:
                yield alias.asname, alias.name
            else:
                head = alias.name.split(".")[0]
                yield head, head


def _bound_names(node: ast.AST) -> Iterable[ast.Name]:
    """The plain names a binding target binds (tuples unpacked; attributes and subscripts
    bind nothing)."""
    if isinstance(node, ast.Name):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _bound_names(element)
    elif isinstance(node, ast.Starred):
        yield from _bound_names(node.value)


class AstImportResolver:
    """Qualified names of names and attributes, from the imports of one module's ``ast``."""

    def __init__(self, outline: Outline, star: Callable[[], dict[str, frozenset[str]]] | None = None):
        """``star``: what the module's ``from <project module> import *`` bind, asked only of
        a module that has one at module level (``project_index.star_imports``)."""
        parents = outline.parents
        self._parent = lambda node: parents.get(id(node))
        nodes = outline.nodes
        self._scope_cache: dict[int, ast.AST] = {}
        self._imports: dict[tuple[int, str], set[str]] = {}  # (id(scope), local name) -> names
        for stmt in nodes(ast.Import) + nodes(ast.ImportFrom):
            scope = self.scope_of(stmt)
            if star is not None and isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*" \
                    and isinstance(scope, ast.Module):
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

    def _collect_shadows(self, nodes: Callable[[type], list]) -> None:
        """Scopes where an imported name is bound by something other than an import."""
        def bind(owner: ast.AST, names: Iterable[ast.Name | str], scope: ast.AST | None = None) -> None:
            for name in names:
                value = name if isinstance(name, str) else name.id
                if value in self._imported:
                    self._shadowed.add((id(scope or self.scope_of(owner)), value))
                    if not isinstance(name, str):
                        self._binding.add(id(name))

        for param in nodes(ast.arg):
            function = self._parent(param)
            while function is not None and not isinstance(function, _FUNCTIONS):
                function = self._parent(function)
            bind(param, (param.arg,), function)
        for stmt in nodes(ast.Assign):
            for target in stmt.targets:
                bind(target, _bound_names(target))
        for kind in (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension):
            for node in nodes(kind):
                bind(node.target, _bound_names(node.target))
        for item in nodes(ast.withitem):
            if item.optional_vars is not None:
                bind(item.optional_vars, _bound_names(item.optional_vars))
        for handler in nodes(ast.ExceptHandler):
            if handler.name:
                bind(handler, (handler.name,))
        for expr in nodes(ast.NamedExpr):
            bind(expr, _bound_names(expr.target))
        for kind in _DEFINITIONS:
            for definition in nodes(kind):
                bind(definition, (definition.name,))

    def names_leading_to(self, names: Iterable[str]) -> frozenset[str]:
        """The local names that some import, in any scope, binds to one of ``names`` or to a
        module above one (``torch`` for ``torch.cuda.amp.autocast``): only a reference that
        starts with one of them can resolve to one of ``names``."""
        prefixes = {name[:end] for name in names for end in range(len(name) + 1)
                    if end == len(name) or name[end] == "."}
        return frozenset(local for (_, local), qualified in self._imports.items() if not qualified.isdisjoint(prefixes))

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The scope a name at ``node`` is looked up in first. A function's decorators, default
        values and annotations belong to the scope around it, as does a class's header."""
        known = self._scope_cache.get(id(node))
        if known is not None:
            return known
        child, current = node, self._parent(node)
        while current is not None:
            kind = type(current)
            if kind in _SCOPES and not (kind in _DEFINITIONS and not isinstance(child, ast.stmt)) \
                    and not (kind is ast.Lambda and child is not current.body):
                break
            child, current = current, self._parent(current)
        found = self._scope_cache[id(node)] = current if current is not None else child
        return found

    def _enclosing(self, scope: ast.AST) -> ast.AST | None:
        if isinstance(scope, ast.Module):
            return None
        outer = self.scope_of(scope)
        while isinstance(outer, ast.ClassDef):  # class bodies are skipped from a nested scope
            outer = self.scope_of(outer)
        return outer

    def _lookup(self, name: str, scope: ast.AST) -> set[str]:
        current: ast.AST | None = scope
        while current is not None:
            key = (id(current), name)
            if key in self._imports:
                return self._imports[key]
            if key in self._shadowed:
                return set()
            current = self._enclosing(current)
        return set()

    def qualified_names(self, expr: ast.AST) -> set[str]:
        """What an imported name or attribute refers to; empty for anything not reached
        through an import."""
        parts = dotted(expr)
        if parts is None or parts[0] not in self._imported:
            return set()
        head = expr
        while isinstance(head, ast.Attribute):
            head = head.value
        if id(head) in self._binding:
            return set()
        tail = "".join("." + p for p in parts[1:])
        return {q + tail for q in self._lookup(parts[0], self.scope_of(head))}


def file_resolver(ctx: "CheckedFile", outline: Outline) -> AstImportResolver:
    """The checked file's resolver (``outline``: the file's), made once per check, with its
    star imports of the project's modules (the file's findings then depend on them)."""
    found = ctx.__dict__.get("_ast_imports")
    if found is None:
        def star() -> dict[str, frozenset[str]]:
            root = ctx.project_root()
            if root is None:
                return {}
            path = Path(ctx.path).resolve()
            ctx.dependencies.add(star_dependency(root, path))
            return star_imports(root, path)

        found = ctx.__dict__["_ast_imports"] = AstImportResolver(outline, star)
    return found


def single_imports(statements: Iterable[ast.Import | ast.ImportFrom]) -> dict[str, tuple[ast.AST, ast.alias]]:
    """The local names that exactly one import alias binds, with its statement (which binding
    a use of a name bound twice sees is not clear)."""
    found: dict[str, tuple[ast.AST, ast.alias]] = {}
    seen: set[str] = set()
    for stmt in statements:
        for alias in stmt.names:
            if alias.name == "*":
                continue
            local = alias.asname or alias.name.split(".")[0]
            if local in seen:
                found.pop(local, None)
                continue
            seen.add(local)
            found[local] = (stmt, alias)
    return found


# -- how a reference is used ------------------------------------------------------------------

def in_annotation(parent: Callable[[ast.AST], ast.AST | None], node: ast.AST) -> bool:
    """Whether ``node`` lies in an annotation (a parameter's, a return's, a variable's)."""
    child, current = node, parent(node)
    while current is not None:
        if child is getattr(current, "annotation", None) or child is getattr(current, "returns", None):
            return True
        child, current = current, parent(current)
    return False


def type_check_classes(parent: Callable[[ast.AST], ast.AST | None], node: ast.expr) -> ast.expr | None:
    """The classes of the ``isinstance``/``issubclass`` call or ``except`` clause that ``node``
    is one of (in a tuple, a concatenation of tuples or a conditional expression), or None."""
    child, current = node, parent(node)
    while current is not None:
        if isinstance(current, ast.Call) and child is not current.func:
            if isinstance(current.func, ast.Name) and current.func.id in ("isinstance", "issubclass") \
                    and len(current.args) == 2 and not current.keywords and current.args[1] is child:
                return child
            return None
        if isinstance(current, ast.ExceptHandler):
            return child if current.type is child else None
        if not isinstance(current, (ast.Tuple, ast.BinOp, ast.IfExp)):
            return None
        child, current = current, parent(current)
    return None
