"""Where a file makes a model float16: ``m.half()``, ``m.to(torch.float16)``, ``m.to(dtype)``
with the dtype chosen by a switch (``torch.float16 if args.fp16 else torch.float32``), or a call
of a project function that converts an argument or returns a model it converted
(``summaries.made_half``): each with the conditions it applies under, their switches named
(``enabling.switch_of``), and the places that show it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libcst as cst

from .context import FileContext
from .crossfile import located
from .diagnostics import Related
from .enabling import Switch, switch_of
from .semantics import assigned_before, dtype_of, method_call
from .summaries import made_half

# A module's methods that return it in its dtype (`.to` only to a device: `_keeps_dtype`).
_KEEPS_DTYPE = frozenset({"cuda", "cpu", "to", "train", "eval", "requires_grad_"})
_Tests = tuple[tuple[cst.BaseExpression, bool], ...]  # conditions, and whether each holds


@dataclass(frozen=True)
class Half:
    """A conversion of a model to float16 this file shows: the conversion itself, or the call
    of a project function that makes it (``node``)."""
    node: cst.CSTNode
    says: str  # how the finding names it
    related: tuple[Related, ...]
    switch: Switch | None


def _float16_when(ctx: FileContext, expr: cst.BaseExpression, depth: int = 2) -> _Tests | None:
    """Under which conditions the dtype ``expr`` is float16: always for ``torch.float16``,
    when an ``if``-expression's test holds or fails (``torch.float16 if args.fp16 else
    torch.float32``), through the value a name holds; None where it is not shown to be."""
    if dtype_of(ctx, expr) == "float16":
        return ()
    if isinstance(expr, cst.Name) and depth and (value := assigned_before(ctx, expr)) is not None:
        return _float16_when(ctx, value, depth - 1)
    if isinstance(expr, cst.IfExp):
        body, orelse = _float16_when(ctx, expr.body, 0), _float16_when(ctx, expr.orelse, 0)
        if body is not None and orelse is not None:
            return ()
        if body is not None or orelse is not None:
            return (expr.test, body is not None), *(body if body is not None else orelse)
    return None


def _halved(ctx: FileContext, call: cst.Call) -> tuple[str, _Tests] | None:
    """The code of ``m`` for ``m.half()``, ``m.to(torch.float16)``, ``m.to(dtype=dtype)``, and
    the conditions under which the dtype is float16."""
    mc = method_call(call)
    if mc is None:
        return None
    if mc[1] == "half" and not call.args:
        return ctx.code(mc[0]), ()
    if mc[1] == "to":
        for arg in call.args:
            if arg.keyword is None or arg.keyword.value == "dtype":
                when = _float16_when(ctx, arg.value)
                if when is not None:
                    return ctx.code(mc[0]), when
    return None


def made_float32_here(ctx: FileContext, call: cst.Call) -> set[str]:
    """The models ``call`` converts back to float32 (``m.float()``, ``m.to(torch.float32)``),
    as this file spells them: the receiver, and what the result is assigned to."""
    mc = method_call(call)
    to_float32 = mc is not None and mc[1] == "to" and any(
        (a.keyword is None or a.keyword.value == "dtype") and dtype_of(ctx, a.value) == "float32" for a in call.args)
    if mc is None or not (mc[1] == "float" and not call.args or to_float32):
        return set()
    return {ctx.code(mc[0])} | _targets(ctx, call)


def _to_device(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """A device: a string, ``torch.device(...)``, or a name holding one."""
    if isinstance(expr, cst.Name) and (value := assigned_before(ctx, expr)) is not None:
        expr = value
    return isinstance(expr, (cst.SimpleString, cst.FormattedString)) or \
        isinstance(expr, cst.Call) and ctx.resolves_to(expr.func, {"torch.device"}) is not None


def _keeps_dtype(ctx: FileContext, call: cst.Call, method: str) -> bool:
    """``m.method(...)`` returns ``m`` in its dtype: ``.cuda()``, ``.eval()``, ``.to(device)``."""
    if method != "to":
        return method in _KEEPS_DTYPE
    return all(a.keyword is not None and a.keyword.value == "non_blocking"
               or (a.keyword is None or a.keyword.value == "device") and _to_device(ctx, a.value) for a in call.args)


def _targets(ctx: FileContext, call: cst.Call) -> set[str]:
    """What the result of ``call`` is assigned to, through methods that return the module in
    its dtype (``net = build(cfg).cuda()``, ``.to(device)``)."""
    node = call
    while isinstance(attr := ctx.parent(node), cst.Attribute) and isinstance(outer := ctx.parent(attr), cst.Call) \
            and _keeps_dtype(ctx, outer, attr.attr.value):
        node = outer
    parent = ctx.parent(node)
    return {ctx.code(t.target) for t in parent.targets} if isinstance(parent, cst.Assign) else set()


def _guards(ctx: FileContext, node: cst.CSTNode) -> _Tests:
    """The ``if`` tests (statements and expressions) around ``node`` in its function, outermost
    first, and whether each holds there; not a script's ``if __name__ == "__main__"``."""
    found = []
    for outer in ctx.ancestors(node):
        if isinstance(outer, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            break
        if isinstance(outer, (cst.If, cst.IfExp)) and not ctx.contains(outer.test, node) \
                and "__name__" not in ctx.code(outer.test):
            found.append((outer.test, ctx.contains(outer.body, node)))
    return tuple(reversed(found))


def _switch(ctx: FileContext, tests: _Tests) -> Switch | None:
    """What a conversion applies under, said briefly: its innermost condition, and those that
    are a flag or a config key of the project (``switch_of``), not every ``if`` on the way
    (``if rank == 0:``)."""
    parts: dict[str, Switch] = {}
    for i, (test, holds) in enumerate(tests):
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, holds = test.expression, not holds
        part = switch_of(ctx, test) if holds and not isinstance(test, str) else \
            Switch(f"when `{test if isinstance(test, str) else ctx.code(test)}` is {'true' if holds else 'false'}")
        if part.related or i == len(tests) - 1:
            parts.setdefault(part.when, part)
    if not parts:
        return None
    first, *rest = parts.values()
    return Switch(" and ".join([first.when, *(p.when.removeprefix("when ") for p in rest)]),
                  tuple(r for p in parts.values() for r in p.related))


def _expression(code: str) -> cst.BaseExpression | str:
    """A condition of another module (``Place.when``) as an expression ``switch_of`` can read
    (its code, where libcst cannot read it)."""
    try:
        return cst.parse_expression(code)
    except cst.ParserSyntaxError:
        return code


def made_half_here(ctx: FileContext, call: cst.Call, wanted: Callable[[str], bool]) -> list[tuple[str, Half]]:
    """The models ``call`` makes float16, as this file spells them, of those ``wanted``
    accepts: a conversion here (``m.half()`` converts ``m`` in place; ``n = m.half()`` makes
    ``n`` the half model too), or a project function converting an argument or returning a model
    it converted. Asks the project only of a call that passes or assigns a wanted one."""
    halved = _halved(ctx, call)
    if halved is not None:
        names = [name for name in {halved[0]} | _targets(ctx, call) if wanted(name)]
        if not names:
            return []
        line = ctx.location(ctx.offsets(call)[0]).row
        half = Half(call, f"`{ctx.code(call)}` on line {line}", (), _switch(ctx, (*_guards(ctx, call), *halved[1])))
        return [(name, half) for name in names]
    # A model is spelled as a name or an attribute (`self.model`).
    passed = [a.value for a in call.args] + [call.func.value] if isinstance(call.func, cst.Attribute) else \
        [a.value for a in call.args]
    spelled = {ctx.code(e) for e in passed if isinstance(e, (cst.Name, cst.Attribute))} | _targets(ctx, call)
    if not any(map(wanted, spelled)):
        return []
    line = ctx.location(ctx.offsets(call)[0]).row
    found = []
    helper = ctx.code(call.func)
    for made in made_half(ctx, call):
        place = made.place
        where, related = located(ctx, place.path, place.row,
                                 f"`{place.code}`, in `{(helper.split('.')[-1], *place.via)[-1]}`")
        through = f" through `{'` and `'.join(place.via)}`" if place.via else ""
        does = "returns it made float16" if made.model is None else "makes it float16"
        switch = _switch(ctx, (*_guards(ctx, call), *((_expression(code), holds) for code, holds in place.when)))
        says = f"`{helper}(...)` on line {line} {does}: `{place.code}`, {where}{through}"
        for name in {made.model} if made.model is not None else _targets(ctx, call):
            if wanted(name):
                here = Related(ctx.path, line, f"`{helper}(...)` makes `{name}` float16")
                found.append((name, Half(call, says, (here, related), switch)))
    return found
