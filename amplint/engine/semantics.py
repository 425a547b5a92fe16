"""What AMP code means, shared by the rules: autocast calls and regions, GradScaler usage,
argument binding, statements and blocks. Pure libcst; no torch."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import libcst as cst

from .context import FileContext
from .names import AUTOCAST, AUTOCAST_DEVICE
from .outline import Outline
from .promotion import (DTYPE_METHODS, FULL_REDUCTIONS, SAME_DTYPE_METHODS, UNKNOWN, Typed,
                        by_policy, casts_back, promoted)
from .tree import children

GRAD_SCALER = frozenset({
    "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler",
    "torch.cpu.amp.grad_scaler.GradScaler",
})
CLIP_GRAD = frozenset({
    "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_", "torch.nn.utils.clip_grad.clip_grad_norm",
})
DTYPES = {
    "torch.float16": "float16", "torch.half": "float16", "torch.bfloat16": "bfloat16",
    "torch.float32": "float32", "torch.float": "float32", "torch.float64": "float64",
    "torch.double": "float64",
}
_SIGNATURES = {
    "generic": ("device_type", "dtype", "enabled", "cache_enabled"),
    "per_device": ("enabled", "dtype", "cache_enabled"),
}
# Context managers that do nothing: the other branch of a region chosen at run time.
_NULL_CONTEXTS = frozenset({"contextlib.nullcontext"})
_PER_DEVICE_DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}


# -- arguments ---------------------------------------------------------------------------

def subtree(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node below it, in no particular order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def bind(call: cst.Call, params: Sequence[str]) -> dict[str, cst.Arg] | None:
    """Arguments by parameter name; None when ``*args``/``**kwargs`` hide some of them."""
    if has_star_args(call):
        return None
    bound: dict[str, cst.Arg] = {}
    positional = [a for a in call.args if a.keyword is None]
    for name, arg in zip(params, positional):
        bound[name] = arg
    for arg in call.args:
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg
    return bound


def literal_bool(expr: cst.BaseExpression) -> bool | None:
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return expr.value == "True"
    return None


def literal_str(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def dtype_of(ctx: FileContext, expr: cst.BaseExpression) -> str | None:
    name = ctx.resolves_to(expr, DTYPES.keys())
    return DTYPES[name] if name else None


# -- autocast ----------------------------------------------------------------------------

@dataclass(frozen=True)
class AutocastCall:
    node: cst.Call
    api: str  # the qualified name called
    device: str | None  # None when not a string literal
    dtype: str | None  # None when not given or not a literal torch dtype
    dtype_given: bool
    enabled: bool | None  # None when an expression decides
    # `torch.autocast if use_amp else nullcontext`: the condition that picks autocast over a
    # context that does nothing, and whether autocast is its true branch.
    chosen_by: cst.BaseExpression | None = None
    chosen_when: bool = True

    @property
    def deprecated_api(self) -> bool:
        return self.api in AUTOCAST_DEVICE


def _may_be_enabled(outline: Outline, call: ast.Call) -> bool:
    """Whether an autocast call is not turned off by a literal ``enabled=False`` (as
    ``autocast_call`` binds it)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True
    for name in outline.qualified_names(call.func) & AUTOCAST:
        position = _SIGNATURES["per_device" if name in AUTOCAST_DEVICE else "generic"].index("enabled")
        enabled = next((k.value for k in call.keywords if k.arg == "enabled"),
                       call.args[position] if len(call.args) > position else None)
        if not (isinstance(enabled, ast.Constant) and enabled.value is False):
            return True
    return False


def enabled_autocast_calls(outline: Outline) -> list[ast.Call]:
    """The autocast calls that a literal ``enabled=False`` does not turn off."""
    return [c for c in outline.calls_to(AUTOCAST) if _may_be_enabled(outline, c)]


def calls_enabled_autocast(outline: Outline) -> bool:
    """The ``may_fire`` of rules about enabled regions: an autocast call that a literal
    ``enabled=False`` does not turn off. A file whose regions are all disabled (a float32
    island in a model) opens none."""
    return bool(enabled_autocast_calls(outline))


def autocast_call(ctx: FileContext, expr: cst.BaseExpression) -> AutocastCall | None:
    if not isinstance(expr, cst.Call):
        return None
    # Once per call: rules ask it of every `with` around every call they judge.
    cache = ctx.__dict__.setdefault("_autocast_call", {})
    hit = cache.get(id(expr))
    if hit is None or hit[0] is not expr:  # an id is unique only while its node lives
        hit = cache[id(expr)] = (expr, _autocast_call(ctx, expr))
    return hit[1]


def _null_choice(ctx: FileContext, expr: cst.BaseExpression | None, arm_is_autocast
                 ) -> tuple[cst.BaseExpression, cst.BaseExpression, bool] | None:
    """For ``A if cond else B`` where one branch passes ``arm_is_autocast`` and the other is a
    context that does nothing (``contextlib.nullcontext``, called or not): that branch, the
    condition, and whether the branch is the true one."""
    if not isinstance(expr, cst.IfExp):
        return None
    for arm, other, when in ((expr.body, expr.orelse, True), (expr.orelse, expr.body, False)):
        null = other.func if isinstance(other, cst.Call) else other
        if arm_is_autocast(arm) and ctx.resolves_to(null, _NULL_CONTEXTS):
            return arm, expr.test, when
    return None


def _autocast_call(ctx: FileContext, expr: cst.Call) -> AutocastCall | None:
    api = ctx.resolves_to(expr.func, AUTOCAST)
    chosen = None
    if api is None and isinstance(expr.func, cst.Name):  # `ctx = torch.autocast if amp else nullcontext`
        chosen = _null_choice(ctx, assigned_before(ctx, expr.func), lambda arm: ctx.resolves_to(arm, AUTOCAST))
        api = ctx.resolves_to(chosen[0], AUTOCAST) if chosen is not None else None
    if api is None:
        return None
    per_device = AUTOCAST_DEVICE.get(api)
    args = bind(expr, _SIGNATURES["per_device" if per_device else "generic"]) or {}
    device = per_device or (literal_str(args["device_type"].value) if "device_type" in args else None)
    dtype_arg = args.get("dtype")
    dtype = dtype_of(ctx, dtype_arg.value) if dtype_arg else None
    # ``*args``/``**kwargs`` may pass a dtype: then an expression decides it.
    dtype_given = dtype_arg is not None or has_star_args(expr)
    if not dtype_given and per_device:
        dtype = _PER_DEVICE_DEFAULT_DTYPE[per_device]
    enabled = literal_bool(args["enabled"].value) if "enabled" in args else True
    if has_star_args(expr):
        enabled = None
    elif enabled is None and _off_unless_passed(ctx, args["enabled"].value):
        enabled = False
    if chosen is not None and enabled is not False:
        return AutocastCall(expr, api, device, dtype, dtype_given, None, chosen[1], chosen[2])
    return AutocastCall(expr, api, device, dtype, dtype_given, enabled)


def _off_unless_passed(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """Whether an ``enabled=`` expression is a parameter that defaults to False (``use_amp``,
    or ``self.use_amp`` that ``__init__`` sets from one) and that nothing passes: no call in
    this file (by keyword or position), no call in the project by keyword, no command-line
    flag or config key of its name. The region is then off on every run the project shows."""
    function, name = _parameter_behind(ctx, expr)
    if function is None:
        return False
    params = list(function.params.params)
    param = next((p for p in params if p.name.value == name), None)
    if param is None or param.default is None or literal_bool(param.default) is not False:
        return False
    index = params.index(param) - (1 if params and params[0].name.value == "self" else 0)
    for call in _calls_running(ctx, function):
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) > index or any(a.star or (a.keyword is not None and a.keyword.value == name)
                                          for a in call.args):
            return False
    return not (ctx.keyword_passes(name) or any(k.key[-1] == name for k in ctx.config_keys())
                or ctx.flags_named(name))


def _parameter_behind(ctx: FileContext, expr: cst.BaseExpression) -> tuple[cst.FunctionDef | None, str]:
    """The function and parameter an expression reads: ``x`` of the function it is in (not
    rebound), or for ``self.x`` the parameter ``__init__`` assigns it from (its only binding in
    the class)."""
    if isinstance(expr, cst.Name):
        function = enclosing_function(ctx, expr)
        return (function, expr.value) if function is not None and assigned_before(ctx, expr) is None else (None, "")
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self"):
        return None, ""
    cls = next((a for a in ctx.ancestors(expr) if isinstance(a, cst.ClassDef)), None)
    if cls is None:
        return None, ""
    assigned = [t for node in subtree(cls) if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
                for t in ([x.target for x in node.targets] if isinstance(node, cst.Assign) else [node.target])
                if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self"
                and t.attr.value == expr.attr.value]
    if len(assigned) != 1:
        return None, ""
    statement = ctx.parent(assigned[0]) if isinstance(ctx.parent(assigned[0]), cst.Assign) else None
    if statement is None:
        statement = ctx.parent(ctx.parent(assigned[0]))
    function = enclosing_function(ctx, assigned[0])
    if function is None or function.name.value != "__init__" or not isinstance(statement, cst.Assign) \
            or not isinstance(statement.value, cst.Name):
        return None, ""
    return function, statement.value.value


def _calls_running(ctx: FileContext, function: cst.FunctionDef) -> list[cst.Call]:
    """The calls of this file that run ``function``: ``calls_of``, and for ``__init__`` the
    calls of its class by name."""
    if function.name.value != "__init__":
        return calls_of(ctx, function)
    cls = next((a for a in ctx.ancestors(function) if isinstance(a, cst.ClassDef)), None)
    return [c for c in calls(ctx) if cls is not None and isinstance(c.func, cst.Name) and c.func.value == cls.name.value]


def enclosing_function(ctx: FileContext, node: cst.CSTNode) -> cst.FunctionDef | None:
    return ctx.enclosing(node, cst.FunctionDef)


def _autocast_bindings(ctx: FileContext, scope: cst.CSTNode) -> dict[str, AutocastCall]:
    """Names assigned an autocast object in ``scope`` (``ctx = torch.autocast("cuda")``)."""
    cache = ctx.__dict__.setdefault("_autocast_bindings", {})
    if id(scope) not in cache:
        found = {}
        for node in _walk_same_scope(scope):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0].target, cst.Name):
                ac = autocast_call(ctx, node.value)
                chosen = _null_choice(ctx, node.value, lambda arm: autocast_call(ctx, arm) is not None) \
                    if ac is None else None
                if chosen is not None:  # `amp = torch.autocast("cuda") if use_amp else nullcontext()`
                    ac = autocast_call(ctx, chosen[0])
                    if ac.enabled is not False:
                        ac = dataclasses.replace(ac, enabled=None, chosen_by=chosen[1], chosen_when=chosen[2])
                if ac is not None:
                    found[node.targets[0].target.value] = ac
        cache[id(scope)] = found
    return cache[id(scope)]


def _walk_same_scope(scope: cst.CSTNode) -> Iterator[cst.CSTNode]:
    if isinstance(scope, cst.Module):
        stack = list(scope.body)
    elif isinstance(scope, cst.FunctionDef):
        stack = [scope.body]
    else:
        stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        for child in children(node):
            if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                stack.append(child)


def autocast_of_with_item(ctx: FileContext, item: cst.WithItem) -> AutocastCall | None:
    direct = autocast_call(ctx, item.item)
    if direct is not None or not isinstance(item.item, cst.Name):
        return direct
    scope = enclosing_function(ctx, item) or ctx.module
    return _autocast_bindings(ctx, scope).get(item.item.value)


def autocast_decorator(ctx: FileContext, func: cst.FunctionDef) -> AutocastCall | None:
    for decorator in func.decorators:
        ac = autocast_call(ctx, decorator.decorator)
        if ac is not None:
            return ac
    return None


def framework_autocast(ctx: FileContext, expr: cst.BaseExpression) -> bool | None:
    """For ``X.autocast(...)`` that is not torch's: a framework's or project's autocast context
    (accelerate's ``accelerator.autocast()``, a trainer's ``self.autocast()``), which picks its
    device and dtype itself. False when a literal ``enabled=False`` turns it off; None when
    ``expr`` is no such call."""
    if not isinstance(expr, cst.Call):
        return None
    if not isinstance(expr.func, cst.Attribute) or expr.func.attr.value != "autocast" \
            or ctx.qualified_names(expr.func):
        if project_autocast_wrapper(ctx, expr) is None:
            return None
    enabled = next((a.value for a in expr.args if a.keyword is not None and a.keyword.value == "enabled"), None)
    return enabled is None or literal_bool(enabled) is not False


def project_autocast_wrapper(ctx: FileContext, expr: cst.BaseExpression):
    """For a call of one of the project's own autocast wrappers (``maybe_autocast(...)``,
    ``self.amp_context()``, ``utils.amp_ctx()``; ``project_index.AutocastWrapper``), its
    definition; None otherwise, and for a name an import binds to another library."""
    if not isinstance(expr, cst.Call):
        return None
    func = expr.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
    if name is None or ctx.resolves_to(func, AUTOCAST) is not None:
        return None
    imported = ctx.qualified_names(func)
    if imported and isinstance(func, cst.Name):  # `from .utils import amp_ctx as ctx_`: the imported name
        name = next(iter(imported)).rsplit(".", 1)[-1]
    wrappers = ctx.autocast_wrappers().get(name)
    return wrappers[0] if wrappers else None


def autocast_region(ctx: FileContext, node: cst.CSTNode,
                    frameworks: bool = False) -> tuple[AutocastCall | None, cst.CSTNode] | None:
    """The innermost autocast region around ``node`` and its ``with`` (or decorated function),
    or None when there is none or the innermost one is disabled by a literal False. With
    ``frameworks``, a ``with`` on a ``framework_autocast`` is a region too, given as
    ``(None, with)``: nothing is known of its device or dtype."""
    # Once per node: most rules ask it of every call of the file.
    cache = ctx.__dict__.setdefault("_autocast_region", {})
    hit = cache.get((id(node), frameworks))
    if hit is None or hit[0] is not node:  # an id is unique only while its node lives
        hit = cache[(id(node), frameworks)] = (node, _autocast_region(ctx, node, frameworks))
    return hit[1]


# What bounds a region: the ancestors ``autocast_region`` stops at (``FileContext.enclosing``).
REGION_BOUNDS = (cst.With, cst.FunctionDef, cst.Lambda)


def _autocast_region(ctx: FileContext, node: cst.CSTNode,
                     frameworks: bool) -> tuple[AutocastCall | None, cst.CSTNode] | None:
    ancestor = ctx.enclosing(node, REGION_BOUNDS)
    while ancestor is not None:
        if isinstance(ancestor, cst.With) and ctx.contains(ancestor.body, node):
            for item in reversed(ancestor.items):
                ac = autocast_of_with_item(ctx, item)
                if ac is not None:
                    return None if ac.enabled is False else (ac, ancestor)
                framework = framework_autocast(ctx, item.item) if frameworks else None
                if framework is not None:
                    return (None, ancestor) if framework else None
        elif isinstance(ancestor, cst.FunctionDef):
            ac = autocast_decorator(ctx, ancestor) if ctx.contains(ancestor.body, node) else None
            return None if ac is None or ac.enabled is False else (ac, ancestor)
        elif isinstance(ancestor, cst.Lambda):
            return None
        ancestor = ctx.enclosing(ancestor, REGION_BOUNDS)
    return None


# Calls followed from a function to the region around one of its callers (`forward` wrapping
# `self._forward(...)` in `with torch.autocast(...)`, a helper of that helper).
REACHING_DEPTH = 3


def reaching_region(ctx: FileContext, node: cst.CSTNode, depth: int = REACHING_DEPTH
                    ) -> tuple[AutocastCall | None, cst.CSTNode, cst.Call | None] | None:
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
            function = enclosing_function(ctx, inner)
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


def called_function(ctx: FileContext, call: cst.Call) -> cst.FunctionDef | None:
    """The function of this file that ``call`` runs: ``self.m(...)`` for a method of the
    enclosing class, or ``f(...)`` for a module-level function."""
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        owner = ctx.enclosing(call, cst.ClassDef)
        if owner is None:
            return None
        name = func.attr.value
    elif isinstance(func, cst.Name):
        owner, name = ctx.module, func.value
    else:
        return None
    return _defined_in(ctx, owner).get(name)


def _defined_in(ctx: FileContext, owner: cst.Module | cst.ClassDef) -> dict[str, cst.FunctionDef]:
    """The functions a module's or class's body defines directly, by name (the first of each
    name): read once per body, not once per call (``called_function`` is asked of them all)."""
    cache = ctx.__dict__.setdefault("_defined_in", {})
    if id(owner) not in cache:
        found: dict[str, cst.FunctionDef] = {}
        for statement in owner.body.body if isinstance(owner, cst.ClassDef) else owner.body:
            if isinstance(statement, cst.FunctionDef):
                found.setdefault(statement.name.value, statement)
        cache[id(owner)] = found
    return cache[id(owner)]


def calls_of(ctx: FileContext, function: cst.FunctionDef) -> list[cst.Call]:
    """The calls of this file that run ``function`` (``called_function``), in source order:
    every call's function is found once per file, not once per function asked about."""
    if "_calls_of" not in ctx.__dict__:
        found: dict[int, list[cst.Call]] = {}
        for call in ctx.nodes(cst.Call):
            called = called_function(ctx, call)
            if called is not None:
                found.setdefault(id(called), []).append(call)
        ctx.__dict__["_calls_of"] = found
    return ctx.__dict__["_calls_of"].get(id(function), [])


# -- calls -------------------------------------------------------------------------------

def calls(ctx: FileContext) -> list[cst.Call]:
    """Every call in the file, in source order (computed once per file)."""
    return ctx.nodes(cst.Call)


def method_call(call: cst.Call) -> tuple[cst.BaseExpression, str] | None:
    """(receiver, method) for ``receiver.method(...)``."""
    if isinstance(call.func, cst.Attribute):
        return call.func.value, call.func.attr.value
    return None


def scaled_backward_scaler(ctx, call: cst.Call | ast.Call) -> str | None:
    """For ``S.scale(loss).backward()`` the code of S, in either tree."""
    if isinstance(call, ast.Call):
        func = call.func
        inner = func.value if isinstance(func, ast.Attribute) and func.attr == "backward" else None
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "scale":
            return ctx.code(inner.func.value)
        return None
    mc = method_call(call)
    if mc is None or mc[1] != "backward":
        return None
    receiver = mc[0]
    if isinstance(receiver, cst.Call):
        inner = method_call(receiver)
        if inner is not None and inner[1] == "scale":
            return ctx.code(inner[0])
    return None


# -- GradScaler ---------------------------------------------------------------------------

SCALER_PARAMETERS = frozenset({"scaler", "grad_scaler", "amp_scaler"})


def named_like_optimizer(code: str) -> bool:
    """``optimizer``, ``self.opt``, ``opt_g``, ``self._optimizer``: named like one, not a scheduler."""
    last = code.split(".")[-1].lower().lstrip("_")
    return ("optim" in last or last == "opt" or last.startswith("opt_") or last.endswith("_opt")) \
        and "sched" not in last


def autocast_calls(ctx: FileContext) -> list[AutocastCall]:
    if "_autocast_calls" not in ctx.__dict__:
        ctx.__dict__["_autocast_calls"] = [ac for c in calls(ctx) if (ac := autocast_call(ctx, c))]
    return ctx.__dict__["_autocast_calls"]


def backward_by_shape(method: str | None, positional: bool, names: Iterable[str]) -> bool:
    """A tensor's backward pass, from a call's shape in either tree: ``loss.backward()``,
    ``S.scale(loss).backward()`` (``method`` the name after the dot, no ``positional``
    argument), ``torch.autograd.backward(...)`` (one of ``names``, what the callee stands for).
    ``accelerator.backward(loss)`` and other wrappers that take the loss as an argument are
    not; `torch.autograd.backward(loss)` is one by its shape, with the loss positional."""
    return method == "backward" and not positional or "torch.autograd.backward" in names


def is_backward(ctx: FileContext, call: cst.Call) -> bool:
    """``backward_by_shape`` of libcst's call."""
    mc = method_call(call)
    method = mc[1] if mc else None
    resolved = ctx.resolves_to(call.func, _AUTOGRAD_BACKWARD) if method in (None, "backward") else None
    return backward_by_shape(method, any(a.keyword is None for a in call.args), (resolved,) if resolved else ())


_AUTOGRAD_BACKWARD = frozenset({"torch.autograd.backward"})


# -- light dtype inference ------------------------------------------------------------------

def call_spelling(ctx: FileContext, call: cst.Call) -> str | None:
    """The public spelling a call goes through: ``torch.mm``, ``torch.Tensor.softmax`` for a
    method on anything that is not a known module, ``torch.Tensor.__matmul__`` for ``@``."""
    names = [n for n in ctx.qualified_names(call.func) if n.startswith("torch.")]
    if names:
        return names[0]
    mc = method_call(call)
    if mc is not None and not ctx.code(mc[0]).startswith("self"):
        return f"torch.Tensor.{mc[1]}"
    return None


def tensor_input(call: cst.Call, spelling: str) -> cst.BaseExpression | None:
    """The tensor whose dtype a cast-back op's output takes: the receiver of a Tensor method
    (``spelling`` ``torch.Tensor.x``), else the first positional argument."""
    mc = method_call(call)
    if mc is not None and spelling.startswith("torch.Tensor."):
        return mc[0]
    return next((a.value for a in call.args if a.keyword is None and not a.star), None)


def assigned_before(ctx: FileContext, name: cst.Name) -> cst.BaseExpression | None:
    """The value ``name`` holds where it is read, where a plain assignment earlier in its
    function shows it (``x = ...``, ``x: T = ...``, ``x := ...``). None when there is none,
    when the last binding before the read is another kind (``x += ...``, a ``for`` or ``with``
    target, unpacking, an import), or when a binding later in a loop around the read may
    reach it on the next iteration: each read has one answer or none."""
    scope = enclosing_function(ctx, name) or ctx.module
    bindings = _bindings_in(ctx, scope).get(name.value, ())
    at = ctx.order(name)
    value = None
    for binding, bound in bindings:
        if ctx.order(binding) >= at:
            break
        if not ctx.contains(binding, name):  # `x = x + 1` reads the binding before it
            value = bound
    if value is None:
        return None
    for loop in ctx.ancestors(name):
        if loop is scope:
            break
        if isinstance(loop, (cst.For, cst.While)) and any(
                ctx.order(b) > at and ctx.contains(loop, b) for b, _ in bindings):
            return None
    return value


def _bind(found: dict[str, list], node: cst.CSTNode, target: cst.BaseExpression,
          value: cst.BaseExpression | None) -> None:
    """Record ``node`` as a binding of each name in ``target`` (a module-level function: a
    recursive closure would be a reference cycle holding the whole tree)."""
    if isinstance(target, cst.Name):
        found.setdefault(target.value, []).append((node, value))
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _bind(found, node, element.value, None)
    elif isinstance(target, cst.StarredElement):
        _bind(found, node, target.value, None)


def _bindings_in(ctx: FileContext, scope: cst.CSTNode) -> dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]]:
    """Every binding of each name in ``scope`` (not in nested functions, classes, lambdas), in
    source order, with the value it binds where a plain assignment shows it (else None)."""
    cache = ctx.__dict__.setdefault("_scope_bindings", {})
    if id(scope) not in cache:
        found: dict[str, list] = {}
        for node in _walk_same_scope(scope):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    _bind(found, node, target.target, node.value)
            elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)) and node.value is not None:
                _bind(found, node, node.target, node.value)
            elif isinstance(node, (cst.AugAssign, cst.For, cst.CompFor)):
                _bind(found, node, node.target, None)
            elif isinstance(node, cst.AsName):
                _bind(found, node, node.name, None)
            elif isinstance(node, cst.ImportAlias) and node.asname is None:
                found.setdefault(node.evaluated_name.split(".")[0], []).append((node, None))
        cache[id(scope)] = {k: sorted(v, key=lambda b: ctx.order(b[0])) for k, v in found.items()}
    return cache[id(scope)]


# A value's dtype, whether it is a 0-dim tensor or a Python number (those take part in type
# promotion only when their category is higher: a float32 0-dim tensor or a float added to a
# float16 tensor leaves it float16), and the node that made it so: the evidence a finding names.
def inferred_dtype(ctx: FileContext, expr: cst.BaseExpression, table, depth: int = 3) -> str | None:
    """'lowp', 'float32' or None (unknown) for a value computed inside an autocast region whose
    device's policies are ``table``: what autocast makes of the op that produced it, and what
    PyTorch's type promotion makes of arithmetic on such values."""
    return typed(ctx, expr, table, depth).dtype


def typed(ctx: FileContext, expr: cst.BaseExpression, table, depth: int = 3) -> Typed:
    """``inferred_dtype``, with its evidence: the call or operation that produced the dtype
    (``F.linear(...)`` that autocast lowers, ``x.half()``, ``torch.tensor(0.5)``); the dtype is
    None when unknown."""
    found = _dtype(ctx, expr, table, depth)
    return found if found.dtype in ("lowp", "float32") else UNKNOWN


def _dtype(ctx: FileContext, expr: cst.BaseExpression, table, depth: int) -> Typed:
    if depth == 0:
        return UNKNOWN
    if isinstance(expr, (cst.Integer, cst.Float)):
        return Typed("number", True, expr)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, (cst.Minus, cst.Plus)):
        return _dtype(ctx, expr.expression, table, depth)
    if isinstance(expr, cst.Name):
        value = assigned_before(ctx, expr)  # an earlier binding: no cycle, so no depth spent
        return _dtype(ctx, value, table, depth) if value is not None else UNKNOWN
    if isinstance(expr, cst.BinaryOperation):
        if isinstance(expr.operator, cst.MatrixMultiply):
            return by_policy(table, "torch.Tensor.__matmul__", expr)
        return promoted(_dtype(ctx, expr.left, table, depth - 1), _dtype(ctx, expr.right, table, depth - 1))
    if not isinstance(expr, cst.Call):
        return UNKNOWN
    mc = method_call(expr)
    if mc is not None and mc[1] in DTYPE_METHODS and not expr.args:
        return Typed(DTYPE_METHODS[mc[1]], False, expr)
    if mc is not None and mc[1] == "to":
        target = next((dtype_of(ctx, a.value) for a in expr.args
                       if a.keyword is None or a.keyword.value == "dtype"), None)
        if target is not None:
            return Typed("float32" if target == "float32" else "lowp" if target in ("float16", "bfloat16") else None,
                         False, expr)
        if all(a.keyword is not None and a.keyword.value in ("device", "non_blocking") for a in expr.args):
            return _dtype(ctx, mc[0], table, depth - 1)
    if mc is not None and mc[1] in SAME_DTYPE_METHODS:
        return _dtype(ctx, mc[0], table, depth - 1)
    if ctx.resolves_to(expr.func, {"torch.tensor"}) is not None and expr.args and expr.args[0].keyword is None \
            and isinstance(expr.args[0].value, (cst.Float, cst.Integer, cst.UnaryOperation)):
        given = next((dtype_of(ctx, a.value) for a in expr.args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if given is None and isinstance(expr.args[0].value, cst.Float) or given == "float32":
            return Typed("float32", True, expr)
        return Typed("lowp" if given in ("float16", "bfloat16") else None, True, expr)
    spelling = call_spelling(ctx, expr)
    if casts_back(table, spelling):
        source = tensor_input(expr, spelling)
        return _dtype(ctx, source, table, depth - 1) if source is not None else UNKNOWN
    found = by_policy(table, spelling, expr)
    if mc is not None and mc[1] in FULL_REDUCTIONS and not expr.args:
        return found._replace(zero_dim=True) if found.dtype else _dtype(ctx, mc[0], table, depth - 1)._replace(zero_dim=True)
    return found
