"""Where a file makes a model float16, on Python's ``ast``: ``m.half()``, ``m.to(torch.float16)``,
``m.to(dtype)`` with the dtype chosen by a switch (``torch.float16 if args.fp16 else
torch.float32``), or a call of a project function that converts an argument or returns a model
it converted (``summaries.made_half``): each with the conditions it applies under, their
switches named (``enabling.named_switch``), and the places that show it. What a conversion is
comes from ``summaries``, which reads every module of the project the same way."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from .ast_context import AstContext
from .crossfile import located
from .diagnostics import Related
from .enabling import Switch, named_switch
from .outline import parameter_defaults
from .summaries import checked_module, conversion, guards_of, keeps_dtype, made_half, receiver

_Tests = tuple[tuple[str, bool], ...]  # conditions' code, and whether each holds
_FLOAT32 = frozenset({"torch.float32", "torch.float"})


@dataclass(frozen=True)
class Half:
    """A conversion of a model to float16 this file shows: the conversion itself, or the call
    of a project function that makes it (``node``)."""
    node: ast.Call
    says: str  # how the finding names it
    related: tuple[Related, ...]
    switch: Switch | None


def _once(ctx: AstContext, node: ast.AST) -> dict[str, ast.expr]:
    """The names of ``node``'s function (or the top level) that one plain assignment binds and
    nothing else: each stands for its value."""
    module = checked_module(ctx)
    return module.assigned_once(ctx.enclosing_function(node) or ctx.outline.tree) if module is not None else {}


def _halved(ctx: AstContext, call: ast.Call) -> tuple[str, _Tests] | None:
    """The code of ``m`` for ``m.half()``, ``m.to(torch.float16)``, ``m.to(dtype=dtype)``, and
    the conditions under which the dtype is float16."""
    found = receiver(call)
    if found is None or found[1] not in ("half", "to"):
        return None
    when = conversion(ctx.outline, call, _once(ctx, call))
    return (ctx.code(found[0]), when) if when is not None else None


def made_float32_here(ctx: AstContext, call: ast.Call) -> set[str]:
    """The models ``call`` converts back to float32 (``m.float()``, ``m.to(torch.float32)``),
    as this file spells them: the receiver, and what the result is assigned to."""
    found = receiver(call)
    if found is None:
        return set()
    given = [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]
    to_float32 = found[1] == "to" and any(ctx.outline.qualified_names(a) & _FLOAT32 for a in given)
    if not (found[1] == "float" and not call.args and not call.keywords or to_float32):
        return set()
    return {ctx.code(found[0])} | _targets(ctx, call)


def _targets(ctx: AstContext, call: ast.Call) -> set[str]:
    """What the result of ``call`` is assigned to, through methods that return the module in
    its dtype (``net = build(cfg).cuda()``, ``.to(device)``)."""
    node: ast.AST = call
    while isinstance(attr := ctx.parent(node), ast.Attribute) and isinstance(outer := ctx.parent(attr), ast.Call) \
            and outer.func is attr and keeps_dtype(ctx.outline, outer):
        node = outer
    parent = ctx.parent(node)
    return {ctx.code(t) for t in parent.targets} if isinstance(parent, ast.Assign) else set()


def _guards(ctx: AstContext, node: ast.AST) -> _Tests:
    """The conditions around ``node`` in its function, outermost first; not a script's ``if
    __name__ == "__main__"``."""
    tests = guards_of(ctx.enclosing_function(node) or ctx.outline.tree).get(id(node), ())
    return tuple(t for t in tests if "__name__" not in t[0])


def _parameter_switch(ctx: AstContext, node: ast.AST, name: str) -> Switch | None:
    """A parameter of ``node``'s function that it never rebinds, with a default."""
    function = ctx.enclosing_function(node)
    module = checked_module(ctx)
    if function is None or module is None:
        return None
    param, default = next(((a, d) for a, d in parameter_defaults(function.args).items() if a.arg == name),
                          (None, None))
    if param is None or module.rebinds(function, name):
        return None
    return Switch(f"when `{name}` is true (a parameter of `{function.name}`, default `{ctx.code(default)}`)",
                  (Related(ctx.path, param.lineno, f"`{name}` defaults to `{ctx.code(default)}`"),))


def _chain(test: ast.expr) -> list[str] | None:
    """``args.amp`` → [args, amp]; ``cfg["train"]["amp"]`` → [cfg, train, amp]."""
    if isinstance(test, ast.Name):
        return [test.id]
    if isinstance(test, ast.Attribute):
        head = _chain(test.value)
        return None if head is None else [*head, test.attr]
    if isinstance(test, ast.Subscript) and isinstance(test.slice, ast.Constant) and isinstance(test.slice.value, str):
        head = _chain(test.value)
        return None if head is None else [*head, test.slice.value]
    return None


def _switch(ctx: AstContext, node: ast.AST, tests: _Tests) -> Switch | None:
    """What a conversion applies under, said briefly: its innermost condition, and those that
    are a flag or a config key of the project (``named_switch``) or a parameter's default, not
    every ``if`` on the way (``if rank == 0:``)."""
    parts: dict[str, Switch] = {}
    for i, (code, holds) in enumerate(tests):
        part = None
        if holds:
            try:
                test = ast.parse(code.strip(), mode="eval").body
            except SyntaxError:
                test = None
            chain = _chain(test) if test is not None else None
            part = named_switch(ctx, chain) if chain is not None else None
            if part is None and isinstance(test, ast.Name):
                part = _parameter_switch(ctx, node, test.id)
        part = part or Switch(f"when `{code}` is {'true' if holds else 'false'}")
        if part.related or i == len(tests) - 1:
            parts.setdefault(part.when, part)
    if not parts:
        return None
    first, *rest = parts.values()
    return Switch(" and ".join([first.when, *(p.when.removeprefix("when ") for p in rest)]),
                  tuple(r for p in parts.values() for r in p.related))


def made_half_here(ctx: AstContext, call: ast.Call, wanted: Callable[[str], bool]) -> list[tuple[str, Half]]:
    """The models ``call`` makes float16, as this file spells them, of those ``wanted``
    accepts: a conversion here (``m.half()`` converts ``m`` in place; ``n = m.half()`` makes
    ``n`` the half model too), or a project function converting an argument or returning a model
    it converted. Asks the project only of a call that passes or assigns a wanted one."""
    halved = _halved(ctx, call)
    if halved is not None:
        names = [name for name in {halved[0]} | _targets(ctx, call) if wanted(name)]
        if not names:
            return []
        half = Half(call, f"`{ctx.code(call)}` on line {call.lineno}", (),
                    _switch(ctx, call, (*_guards(ctx, call), *halved[1])))
        return [(name, half) for name in names]
    # A model is spelled as a name or an attribute (`self.model`).
    passed = [*call.args, *(k.value for k in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        passed.append(call.func.value)
    spelled = {ctx.code(e) for e in passed if isinstance(e, (ast.Name, ast.Attribute))} | _targets(ctx, call)
    if not any(map(wanted, spelled)):
        return []
    line = call.lineno
    found = []
    helper = ctx.code(call.func)
    for made in made_half(ctx, call):
        place = made.place
        where, related = located(ctx, place.path, place.row,
                                 f"`{place.code}`, in `{(helper.split('.')[-1], *place.via)[-1]}`")
        through = f" through `{'` and `'.join(place.via)}`" if place.via else ""
        does = "returns it made float16" if made.model is None else "makes it float16"
        switch = _switch(ctx, call, (*_guards(ctx, call), *place.when))
        says = f"`{helper}(...)` on line {line} {does}: `{place.code}`, {where}{through}"
        for name in {made.model} if made.model is not None else _targets(ctx, call):
            if wanted(name):
                here = Related(ctx.path, line, f"`{helper}(...)` makes `{name}` float16")
                found.append((name, Half(call, says, (here, related), switch)))
    return found
