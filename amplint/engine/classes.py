"""The classes ``self`` may be an instance of, as Python looks a method up on an instance of a
class: the class's own body, then its bases (classes of the file, or classes imported from a
module of the project), depth first. A base that cannot be read (another library's) ends the
search, since it may define the name first."""

from __future__ import annotations

import ast
from typing import Generator

from .ast_context import AstContext
from .crossfile import imported_in

_MAX_BASES = 8  # classes read up a hierarchy
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def lookup_order(ctx: AstContext, cls: ast.ClassDef,
                 depth: int = 0) -> Generator[tuple[AstContext, ast.ClassDef], None, bool]:
    """The class and its bases, depth first, read only as far as a lookup asks. True once a
    base cannot be read: a later one may define a name it does, so the lookup ends there."""
    yield ctx, cls
    for base in cls.bases:
        if depth >= _MAX_BASES:
            return False
        if is_object(base):
            continue
        found = class_named(ctx, base)
        if found is None or (yield from lookup_order(*found, depth + 1)):
            return True
    return False


def inherited_method(ctx: AstContext, call: ast.Call) -> tuple[AstContext, Function] | None:
    """For ``self.m(...)`` in a class that does not define ``m``: the method of a base that
    ``self.m`` runs, with the file it is in; None where no base that can be read defines it
    before one that cannot be read."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return None
    cls = ctx.enclosing(call, ast.ClassDef)
    if cls is None:
        return None
    order = lookup_order(ctx, cls)
    for where, owner in order:
        defined = [s for s in owner.body if isinstance(s, _FUNCTIONS) and s.name == func.attr]
        if defined:
            return None if owner is cls else (where, defined[-1])
    return None


def class_named(ctx: AstContext, expr: ast.expr) -> tuple[AstContext, ast.ClassDef] | None:
    """The class a base names: one defined at the top of this module, or of the project
    module it is imported from."""
    if isinstance(expr, ast.Name):
        local = _top_class(ctx, expr.id)
        if local is not None:
            return ctx, local
    for module, level, name in imported_in(ctx, expr):
        other = ctx.project_module(module, level)
        found = _top_class(other, name) if other is not None else None
        if found is not None:
            return other, found
    return None


def _top_class(ctx: AstContext, name: str) -> ast.ClassDef | None:
    return next((s for s in ctx.outline.tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)


def is_object(base: ast.expr) -> bool:
    return isinstance(base, ast.Name) and base.id == "object"
