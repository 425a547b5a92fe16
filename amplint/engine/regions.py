"""Autocast calls and the regions they open, read from Python's ``ast``: what an autocast call
asks for (its device, dtype, and whether it is on: a literal, a parameter's default with the
project's call sites, or unknown), and which region, if any, a node runs in — a ``with`` on an
autocast call (or a name bound to one, or one chosen over ``nullcontext``), a function
autocast decorates, a framework's or the project's own autocast context — and the region
around a caller in this file that reaches it."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from .ast_context import AstContext
from .names import AUTOCAST, AUTOCAST_DEVICE, DTYPES
from .outline import parameter_defaults, walk
from .project_index import AutocastSite, AutocastWrapper
from .summaries import checked_module

_SIGNATURES = {
    "generic": ("device_type", "dtype", "enabled", "cache_enabled"),
    "per_device": ("enabled", "dtype", "cache_enabled"),
}
# Context managers that do nothing: the other branch of a region chosen at run time.
_NULL_CONTEXTS = frozenset({"contextlib.nullcontext"})
_PER_DEVICE_DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Calls followed from a function to the region around one of its callers (`forward` wrapping
# `self._forward(...)` in `with torch.autocast(...)`, a helper of that helper).
REACHING_DEPTH = 3


@dataclass(frozen=True)
class AutocastCall:
    node: ast.Call
    api: str  # the qualified name called
    device: str | None  # None when not a string literal
    dtype: str | None  # None when not given or not a literal torch dtype
    dtype_given: bool
    enabled: bool | None  # None when an expression decides
    # `torch.autocast if use_amp else nullcontext`: the condition that picks autocast over a
    # context that does nothing, and whether autocast is its true branch.
    chosen_by: ast.expr | None = None
    chosen_when: bool = True

    @property
    def deprecated_api(self) -> bool:
        return self.api in AUTOCAST_DEVICE


# -- arguments ---------------------------------------------------------------------------

def has_star_args(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


def bind(call: ast.Call, params: Sequence[str]) -> dict[str, ast.expr] | None:
    """Argument values by parameter name; None when ``*args``/``**kwargs`` hide some of them."""
    if has_star_args(call):
        return None
    bound = dict(zip(params, call.args))
    bound.update((k.arg, k.value) for k in call.keywords)
    return bound


def autocast_arguments(ac: AutocastCall) -> dict[str, ast.expr]:
    """An autocast call's arguments by parameter name; none where ``*args``/``**kwargs`` hide them."""
    return _bound(ac.node, ac.deprecated_api)


def _bound(call: ast.Call, per_device: bool) -> dict[str, ast.expr]:
    return bind(call, _SIGNATURES["per_device" if per_device else "generic"]) or {}


def literal_bool(expr: ast.expr) -> bool | None:
    return expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, bool) else None


def literal_str(expr: ast.expr) -> str | None:
    return expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else None


def dtype_of(ctx: AstContext, expr: ast.expr) -> str | None:
    name = ctx.resolves_to(expr, DTYPES.keys())
    return DTYPES[name] if name else None


# -- autocast calls ----------------------------------------------------------------------

def autocast_call(ctx: AstContext, expr: ast.expr) -> AutocastCall | None:
    if not isinstance(expr, ast.Call):
        return None
    cache = ctx.__dict__.setdefault("_autocast_call", {})  # rules ask it of every `with` around every call
    if id(expr) not in cache:
        cache[id(expr)] = _autocast_call(ctx, expr)
    return cache[id(expr)]


def autocast_calls(ctx: AstContext) -> list[AutocastCall]:
    """Every autocast call of the file, in source order."""
    if "_autocast_calls" not in ctx.__dict__:
        ctx.__dict__["_autocast_calls"] = [ac for c in sorted(ctx.outline.nodes(ast.Call), key=ctx.order)
                                           if (ac := autocast_call(ctx, c))]
    return ctx.__dict__["_autocast_calls"]


def _null_choice(ctx: AstContext, expr: ast.expr | None, arm_is_autocast: Callable[[ast.expr], object]
                 ) -> tuple[ast.expr, ast.expr, bool] | None:
    """For ``A if cond else B`` where one branch passes ``arm_is_autocast`` and the other is a
    context that does nothing (``contextlib.nullcontext``, called or not): that branch, the
    condition, and whether the branch is the true one."""
    if not isinstance(expr, ast.IfExp):
        return None
    for arm, other, when in ((expr.body, expr.orelse, True), (expr.orelse, expr.body, False)):
        null = other.func if isinstance(other, ast.Call) else other
        if arm_is_autocast(arm) and ctx.resolves_to(null, _NULL_CONTEXTS):
            return arm, expr.test, when
    return None


def _autocast_call(ctx: AstContext, call: ast.Call) -> AutocastCall | None:
    api = ctx.resolves_to(call.func, AUTOCAST)
    chosen = None
    if api is None and isinstance(call.func, ast.Name) and call.func.id in _chosen_names(ctx):
        # `ctx = torch.autocast if amp else nullcontext`
        chosen = _null_choice(ctx, value_before(ctx, call.func), lambda arm: ctx.resolves_to(arm, AUTOCAST))
        api = ctx.resolves_to(chosen[0], AUTOCAST) if chosen is not None else None
    if api is None:
        return None
    per_device = AUTOCAST_DEVICE.get(api)
    args = _bound(call, per_device is not None)
    device = per_device or (literal_str(args["device_type"]) if "device_type" in args else None)
    dtype = dtype_of(ctx, args["dtype"]) if "dtype" in args else None
    # ``*args``/``**kwargs`` may pass a dtype: then an expression decides it.
    dtype_given = "dtype" in args or has_star_args(call)
    if not dtype_given and per_device:
        dtype = _PER_DEVICE_DEFAULT_DTYPE[per_device]
    enabled = literal_bool(args["enabled"]) if "enabled" in args else True
    if has_star_args(call):
        enabled = None
    elif enabled is None and _off_unless_passed(ctx, args["enabled"]):
        enabled = False
    if chosen is not None and enabled is not False:
        return AutocastCall(call, api, device, dtype, dtype_given, None, chosen[1], chosen[2])
    return AutocastCall(call, api, device, dtype, dtype_given, enabled)


def _chosen_names(ctx: AstContext) -> frozenset[str]:
    """The names some assignment of the file binds to ``A if c else B`` with autocast as an arm:
    only a call of one of them may be a region chosen at run time."""
    if "_chosen_names" not in ctx.__dict__:
        ctx.__dict__["_chosen_names"] = frozenset(
            t.id for a in ctx.outline.nodes(ast.Assign) if isinstance(a.value, ast.IfExp)
            and (ctx.resolves_to(a.value.body, AUTOCAST) or ctx.resolves_to(a.value.orelse, AUTOCAST))
            for t in a.targets if isinstance(t, ast.Name))
    return ctx.__dict__["_chosen_names"]


def value_before(ctx: AstContext, name: ast.Name) -> ast.expr | None:
    """The value a plain assignment earlier in its function (or at the top level) shows
    ``name`` holds where it is read (``summaries._Module.value_before``)."""
    module = checked_module(ctx)
    if module is None:
        return None
    return module.value_before(ctx.enclosing_function(name) or ctx.outline.tree, name)


def parameters_read(ctx: AstContext, function: ast.AST) -> dict[str, tuple[ast.arg, ast.expr | None]]:
    """The parameters whose value ``function``'s code reads, with their defaults: its own, and
    those of the functions around it that it reads as free names (it binds none of their names
    itself): the step function a factory returns reads the factory's ``scaler=None``. The
    innermost function's parameter of a name wins, as in Python."""
    found: dict[str, tuple[ast.arg, ast.expr | None]] = {}
    module = checked_module(ctx)
    bound: set[str] = set()
    scope = function
    while isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = scope.args
        defaults = parameter_defaults(args)
        for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
            if arg is not None and arg.arg not in bound and arg.arg not in found:
                found[arg.arg] = (arg, defaults.get(arg))
        outer = ctx.enclosing_function(scope)
        if outer is None:
            break
        if module is not None:  # what this function binds hides the outer one's parameters
            bound |= set(module.placed(scope))
        bound |= set(found)
        scope = outer
    return found


def _off_unless_passed(ctx: AstContext, expr: ast.expr) -> bool:
    """Whether an ``enabled=`` expression is a parameter that defaults to False (``use_amp``,
    or ``self.use_amp`` that ``__init__`` sets from one) and that nothing passes: no call in
    this file (by keyword or position), no call in the project by keyword, no command-line
    flag or config key of its name. The region is then off on every run the project shows."""
    function, name = _parameter_behind(ctx, expr)
    if function is None:
        return False
    # a parameter callers may pass by position or keyword: one only a keyword can set is an
    # option a library's users pass
    args = function.args
    params = [p.arg for p in (*args.posonlyargs, *args.args)]
    defaults = dict(zip(params[len(params) - len(args.defaults):], args.defaults))
    names = [p.arg for p in args.args]
    if name not in names or name not in defaults or literal_bool(defaults[name]) is not False:
        return False
    index = names.index(name) - (1 if names[:1] == ["self"] else 0)
    for call in _calls_running(ctx, function):
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if len(positional) > index or has_star_args(call) or any(k.arg == name for k in call.keywords):
            return False
    return not (ctx.keyword_passes(name) or any(k.key[-1] == name for k in ctx.config_keys())
                or ctx.flags_named(name))


def _parameter_behind(ctx: AstContext, expr: ast.expr) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, str]:
    """The function and parameter an expression reads: ``x`` of the function it is in (not
    rebound before), or for ``self.x`` the parameter ``__init__`` assigns it from (its only
    binding in the class)."""
    if isinstance(expr, ast.Name):
        function = ctx.enclosing_function(expr)
        return (function, expr.id) if function is not None and value_before(ctx, expr) is None else (None, "")
    if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"):
        return None, ""
    cls = ctx.enclosing(expr, ast.ClassDef)
    if cls is None:
        return None, ""
    assigned = [(node, t) for node in walk(cls) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                and t.attr == expr.attr]
    if len(assigned) != 1:
        return None, ""
    statement, target = assigned[0]
    function = ctx.enclosing_function(target)
    if function is None or function.name != "__init__" or not isinstance(statement, ast.Assign) \
            or not isinstance(statement.value, ast.Name):
        return None, ""
    return function, statement.value.id


def _calls_running(ctx: AstContext, function: ast.AST) -> list[ast.Call]:
    """The calls of this file that run ``function``: ``calls_of``, and for ``__init__`` the
    calls of its class by name."""
    if function.name != "__init__":
        return calls_of(ctx, function)
    cls = ctx.enclosing(function, ast.ClassDef)
    return [c for c in ctx.outline.nodes(ast.Call)
            if cls is not None and isinstance(c.func, ast.Name) and c.func.id == cls.name]


def _autocast_bindings(ctx: AstContext, scope: ast.AST) -> dict[str, AutocastCall]:
    """Names assigned an autocast object in ``scope`` (``ctx = torch.autocast("cuda")``)."""
    cache = ctx.__dict__.setdefault("_autocast_bindings", {})
    if id(scope) not in cache:
        found = {}
        module = checked_module(ctx)
        for node in module.scope_nodes(scope) if module is not None else ():
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                ac = autocast_call(ctx, node.value)
                chosen = _null_choice(ctx, node.value, lambda arm: autocast_call(ctx, arm) is not None) \
                    if ac is None else None
                if chosen is not None:  # `amp = torch.autocast("cuda") if use_amp else nullcontext()`
                    ac = autocast_call(ctx, chosen[0])
                    if ac.enabled is not False:
                        ac = dataclasses.replace(ac, enabled=None, chosen_by=chosen[1], chosen_when=chosen[2])
                if ac is not None:
                    found[node.targets[0].id] = ac
        cache[id(scope)] = found
    return cache[id(scope)]


def autocast_of_with_item(ctx: AstContext, item: ast.withitem) -> AutocastCall | None:
    direct = autocast_call(ctx, item.context_expr)
    if direct is not None or not isinstance(item.context_expr, ast.Name):
        return direct
    scope = ctx.enclosing_function(item.context_expr) or ctx.outline.tree
    return _autocast_bindings(ctx, scope).get(item.context_expr.id)


def autocast_decorator(ctx: AstContext, function: ast.AST) -> AutocastCall | None:
    return next((ac for d in function.decorator_list if (ac := autocast_call(ctx, d)) is not None), None)


def framework_autocast(ctx: AstContext, expr: ast.expr) -> bool | None:
    """For ``X.autocast(...)`` that is not torch's: a framework's or project's autocast context
    (accelerate's ``accelerator.autocast()``, a trainer's ``self.autocast()``, a project
    wrapper, an optimizer wrapper's ``optim_context`` where the project makes it an
    ``AmpOptimWrapper``), which picks its device and dtype itself. False when a literal
    ``enabled=False`` turns it off; None when ``expr`` is no such call."""
    if not isinstance(expr, ast.Call):
        return None
    if not isinstance(expr.func, ast.Attribute) or expr.func.attr != "autocast" \
            or ctx.outline.qualified_names(expr.func):
        if project_autocast_wrapper(ctx, expr) is None and optim_wrapper_setting(ctx, expr) is None:
            return None
    enabled = next((k.value for k in expr.keywords if k.arg == "enabled"), None)
    return enabled is None or literal_bool(enabled) is not False


def optim_wrapper_setting(ctx: AstContext, expr: ast.expr) -> AutocastSite | None:
    """For ``X.optim_context(model)``, the context of an optimizer wrapper (mmengine's), which
    opens autocast when the wrapper is an ``AmpOptimWrapper``: the project's setting of one (a
    training script's ``if args.amp: cfg.optim_wrapper.type = 'AmpOptimWrapper'``, a config's
    ``type='AmpOptimWrapper'``, its constructor); None otherwise."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "optim_context"):
        return None
    project = ctx.project()
    # the project's sites come with a training script's switch for any config first
    return next((s for s in project[1] if s.setting and "AmpOptimWrapper" in s.setting), None) if project else None


def project_autocast_wrapper(ctx: AstContext, expr: ast.expr) -> AutocastWrapper | None:
    """For a call of one of the project's own autocast wrappers (``maybe_autocast(...)``,
    ``self.amp_context()``, ``utils.amp_ctx()``; ``project_index.AutocastWrapper``), its
    definition; None otherwise, and for a name an import binds to another library."""
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name is None or ctx.resolves_to(func, AUTOCAST) is not None:
        return None
    imported = ctx.outline.qualified_names(func)
    if imported and isinstance(func, ast.Name):  # `from .utils import amp_ctx as ctx_`: the imported name
        name = next(iter(imported)).rsplit(".", 1)[-1]
    wrappers = ctx.autocast_wrappers().get(name)
    return wrappers[0] if wrappers else None


# -- regions -----------------------------------------------------------------------------

def autocast_region(ctx: AstContext, node: ast.AST, frameworks: bool = False
                    ) -> tuple[AutocastCall | None, ast.AST] | None:
    """The innermost autocast region around ``node`` and its ``with`` (or decorated function),
    or None when there is none or the innermost one is disabled by a literal False. With
    ``frameworks``, a ``with`` on a ``framework_autocast`` is a region too, given as
    ``(None, with)``: nothing is known of its device or dtype."""
    # Most rules ask it of every call: each node's answer is kept, and a walk up stops at the
    # first node already answered (the nodes of one statement share their ancestors').
    cache = ctx.__dict__.setdefault("_autocast_region", {})
    walked: list[int] = []
    child, ancestor = node, ctx.parent(node)
    region = None
    while (id(child), frameworks) not in cache:
        walked.append(id(child))
        if ancestor is None:
            break
        if isinstance(ancestor, (ast.With, ast.AsyncWith)) and child in ancestor.body:
            found = next((found for item in reversed(ancestor.items)
                          if (found := _with_item_region(ctx, item, ancestor, frameworks)) is not None), None)
            if found is not None:
                region = found[0]
                break
        elif isinstance(ancestor, _FUNCTIONS):
            ac = autocast_decorator(ctx, ancestor) if child in ancestor.body else None
            region = None if ac is None or ac.enabled is False else (ac, ancestor)
            break
        elif isinstance(ancestor, ast.Lambda):
            break
        child, ancestor = ancestor, ctx.parent(ancestor)
    else:
        region = cache[(id(child), frameworks)]
    for walked_id in walked:
        cache[(walked_id, frameworks)] = region
    return region


def _with_item_region(ctx: AstContext, item: ast.withitem, block: ast.With | ast.AsyncWith, frameworks: bool
                      ) -> tuple[tuple[AutocastCall | None, ast.AST] | None] | None:
    """What a ``with`` item makes of the code in its block, if it is an autocast (a region, or
    none where it is disabled by a literal False), wrapped in a tuple; None if it is no autocast."""
    ac = autocast_of_with_item(ctx, item)
    if ac is not None:
        return (None if ac.enabled is False else (ac, block),)
    framework = framework_autocast(ctx, item.context_expr) if frameworks else None
    if framework is not None:
        return ((None, block) if framework else None,)
    return None


def reaching_region(ctx: AstContext, node: ast.AST, depth: int = REACHING_DEPTH
                    ) -> tuple[AutocastCall | None, ast.AST, ast.Call | None] | None:
    """The autocast region ``node`` runs in: the one around it (``autocast_region``, and None
    as the call), or else the one around a call of its function in this file (a module-level
    function called by name, a method by ``self.name`` in its class), followed up to ``depth``
    calls, with the call inside that region: where the code shows that autocast reaches it.
    None when nothing in the file shows one."""
    found = autocast_region(ctx, node)
    if found is not None:
        return found[0], found[1], None
    seen: set[int] = set()
    frontier = [node]
    for _ in range(depth):
        callers = []
        for inner in frontier:
            function = ctx.enclosing_function(inner)
            if function is None or id(function) in seen:
                continue
            seen.add(id(function))
            for call in calls_of(ctx, function):
                found = autocast_region(ctx, call)
                if found is not None:
                    return found[0], found[1], call
                callers.append(call)
        frontier = callers
    return None


def called_function(ctx: AstContext, call: ast.Call) -> ast.AST | None:
    """The function of this file that ``call`` runs: ``self.m(...)`` for a method of the
    enclosing class, or ``f(...)`` for a module-level function (the last of its name, which
    replaced any before it)."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        owner = ctx.enclosing(call, ast.ClassDef)
        if owner is None:
            return None
        name = func.attr
    elif isinstance(func, ast.Name):
        owner, name = ctx.outline.tree, func.id
    else:
        return None
    defined = [s for s in owner.body if isinstance(s, _FUNCTIONS) and s.name == name]
    return defined[-1] if defined else None


def calls_of(ctx: AstContext, function: ast.AST) -> list[ast.Call]:
    """The calls of this file that run ``function`` (``called_function``), in source order:
    every call's function is found once per file, not once per function asked about."""
    if "_calls_of" not in ctx.__dict__:
        found: dict[int, list[ast.Call]] = {}
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            called = called_function(ctx, call)
            if called is not None:
                found.setdefault(id(called), []).append(call)
        ctx.__dict__["_calls_of"] = found
    return ctx.__dict__["_calls_of"].get(id(function), [])
