"""Gradient hooks that clamp: a registration (``p.register_hook(h)``, module backward hooks)
whose hook, a lambda or a function, calls something named like a clamp or clip on what it is
given and reads no loss scale. Autograd runs such a hook inside the backward pass, on the
gradients as they are computed."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .outline import spelled_names, walk

if TYPE_CHECKING:
    from .ast_context import AstContext

# Hooks autograd runs during the backward pass, on the gradients it computes.
HOOKS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "register_full_backward_hook",
                   "register_backward_hook"})
CLAMP_WORDS = ("clip", "clamp", "Clip", "Clamp")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def clamping(name: str | None) -> bool:
    """Named like a clamp or clip."""
    return name is not None and any(w in name for w in CLAMP_WORDS)


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def calls_in(ctx: AstContext, node: ast.AST) -> list[ast.Call]:
    """The calls in ``node`` (itself included), in source order."""
    return sorted((n for n in walk(node) if isinstance(n, ast.Call)), key=ctx.order)


def _unscaling(name: str) -> bool:
    """A name that reads the loss scale (`scaler.get_scale()`, `self.scaler`): a hook that
    reads it may unscale what it clamps."""
    return "scale" in name.lower()


def hook_clamp(ctx: AstContext, registration: ast.Call) -> ast.Call | None:
    """For ``x.register_hook(h)`` (a method of ``HOOKS``): the call in the hook (a lambda, a
    function of the file, a method ``self.h``) that clamps what it is given; None when it
    reads a loss scale."""
    if not (isinstance(registration.func, ast.Attribute) and registration.func.attr in HOOKS):
        return None
    arguments = [*registration.args, *(k.value for k in registration.keywords)]
    if not arguments:
        return None
    hook = min(arguments, key=ctx.order)
    hook = hook.value if isinstance(hook, ast.Starred) else hook
    if isinstance(hook, ast.Lambda):
        body = hook.body
    elif isinstance(hook, ast.Name):
        functions = [f for kind in _FUNCTIONS for f in ctx.outline.nodes(kind) if f.name == hook.id]
        body = min(functions, key=ctx.order, default=None)
    elif isinstance(hook, ast.Attribute) and isinstance(hook.value, ast.Name) and hook.value.id == "self":
        cls = ctx.enclosing(registration, ast.ClassDef)
        body = next((f for f in cls.body if isinstance(f, _FUNCTIONS) and f.name == hook.attr), None) \
            if cls is not None else None
    else:
        return None
    if body is None or any(_unscaling(n) for n in spelled_names(body)):
        return None
    return next((c for c in calls_in(ctx, body) if clamping(called_name(c))), None)


def registered_clamp(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[ast.Call, ast.Call] | None:
    """In a function of another file (no context of its own): a hook registration whose hook,
    a lambda or a function defined in ``function``, clamps what it is given and reads no loss
    scale; with the clamping call."""
    defined = {f.name: f for f in walk(function) if isinstance(f, _FUNCTIONS)}
    for call in walk(function):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in HOOKS
                and call.args):
            continue
        hook = call.args[0]
        body = hook.body if isinstance(hook, ast.Lambda) else defined.get(hook.id) if isinstance(hook, ast.Name) \
            else None
        if body is None:
            continue
        nodes = list(walk(body))
        if any(isinstance(n, ast.Name) and _unscaling(n.id) or isinstance(n, ast.Attribute) and _unscaling(n.attr)
               for n in nodes):
            continue
        clamp = next((n for n in nodes if isinstance(n, ast.Call) and clamping(called_name(n))), None)
        if clamp is not None:
            return call, clamp
    return None
