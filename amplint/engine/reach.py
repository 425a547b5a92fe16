"""Whether the project ever uses a class or function it defines at the top of a module: code
nothing uses never runs under the autocast a trainer elsewhere opens, so a finding that rests
on "another file runs this under autocast" needs it used.

A definition is used when it is decorated (a registry's ``@LOSSES.register_module()`` runs when
its module is imported), or named elsewhere in the project: in a config file (``type:
DBLoss``), in module-level code (a table of choices, ``__all__``, a script), in a package's
``__init__.py`` that re-exports it (public API, which users and lookups by name reach), or in the
code of a class or function that is used itself, followed ``REACH_DEPTH`` definitions up (beyond
that it counts as used). Any other import only binds the name, and a definition's mentions of itself (``super(
Net, self)``) are not uses. A class whose ``__init__`` calls ``super(Net).__init__()`` (one
argument: ``nn.Module.__init__`` never runs) and then assigns a parameter or a submodule raises
on construction: it is never used."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .outline import Outline, walk
from .project_index import configs_mentioning, mentions_dependency, module_text, modules_mentioning

REACH_DEPTH = 3

# Decorators that register nothing: they wrap or describe what they decorate.
_PLAIN_DECORATORS = ("dataclasses.", "functools.", "torch.", "typing.", "abc.", "contextlib.")


def used(root: Path, path: Path, name: str, read: set | None = None, depth: int = REACH_DEPTH) -> bool:
    """Whether the project uses ``name``, a class or function at the top of module ``path``.
    ``read``: collects the dependencies the answer rests on (``project_index.mentions_dependency``)."""
    return _used(root, path.resolve(), name, depth, frozenset(), read if read is not None else set())


def _used(root: Path, path: Path, name: str, depth: int, seen: frozenset, read: set) -> bool:
    if depth == 0 or (path, name) in seen:
        return depth == 0
    seen = seen | {(path, name)}
    outline = _outline(path)
    if outline is None:
        return True
    definition = next((s for s in outline.tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef,
                                                                      ast.AsyncFunctionDef)) and s.name == name), None)
    if definition is None:
        return True  # bound some other way: not judged
    if any(_registers(outline, d) for d in definition.decorator_list):
        return True
    if isinstance(definition, ast.ClassDef) and _never_built(definition):
        return False
    read.add(mentions_dependency(root, name))
    if configs_mentioning(root, name):
        return True
    word = re.compile(rf"\b{re.escape(name)}\b")
    for other in modules_mentioning(root, name):
        other = other.resolve()
        tree = _outline(other)
        if tree is None:
            return True
        for statement in tree.tree.body:
            if other == path and statement is definition:
                continue
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                if other.name == "__init__.py" and any(a.name.rsplit(".", 1)[-1] == name for a in statement.names):
                    return True  # a package's re-export: its public API, which users and lookups by name reach
                continue
            if not any(_names(node, name, word) for node in walk(statement)):
                continue
            if not isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                return True  # module-level code names it
            if _used(root, other, statement.name, depth - 1, seen, read):
                return True
    return False


def _names(node: ast.AST, name: str, word: re.Pattern) -> bool:
    if isinstance(node, ast.Name):
        return node.id == name
    if isinstance(node, ast.Attribute):
        return node.attr == name
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and word.search(node.value) is not None


def _registers(outline: Outline, decorator: ast.expr) -> bool:
    func = decorator.func if isinstance(decorator, ast.Call) else decorator
    qualified = outline.qualified_names(func)
    if qualified:
        return not any(q.startswith(_PLAIN_DECORATORS) for q in qualified)
    return not (isinstance(func, ast.Name) and func.id in ("staticmethod", "classmethod", "property", "dataclass"))


def _never_built(cls: ast.ClassDef) -> bool:
    """``super(Cls).__init__()`` in ``__init__`` (the base's ``__init__`` never runs), then a
    parameter or submodule assigned to ``self``, which ``nn.Module`` refuses before its own
    ``__init__``."""
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is None:
        return False
    unbound = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"
                  and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
                  and n.func.value.func.id == "super" and len(n.func.value.args) == 1 for n in walk(init))
    return unbound and any(
        isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
        and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" for t in n.targets)
        and (ast.unparse(n.value.func).split(".")[-1] == "Parameter" or ast.unparse(n.value.func).startswith("nn."))
        for n in walk(init))


_OUTLINES: dict[tuple[Path, str], Outline | None] = {}


def _outline(path: Path) -> Outline | None:
    text = module_text(path)
    if text is None:
        return None
    if (path, text) not in _OUTLINES:
        if len(_OUTLINES) > 256:
            _OUTLINES.pop(next(iter(_OUTLINES)))
        _OUTLINES[(path, text)] = Outline.parse(text)
    return _OUTLINES[(path, text)]
