"""FSDP's reduced precision: a module that ``FullyShardedDataParallel(mixed_precision=...)`` or
FSDP2's ``fully_shard(mp_policy=...)`` wraps with a policy whose ``param_dtype`` is float16
computes its forward and backward in float16 with no autocast region at all, so its gradients
need a loss scale as a float16 autocast region's do. Read from Python's ``ast``.

What a rule asks (``Float16Models.trained_by``): which such model the code around a backward
pass trains, where the file shows it — wrapped in the same function before the backward, an
attribute of the class that a method wraps, a global of the module, or a model that a call of
the file passes to the backward's function; and run with gradients there (called or passed to
a call outside ``torch.no_grad()``, in that function or one of the file it calls) — with the
wrap reached directly or through a helper that returns the wrapped model (or shards its
parameter in place), of this file or of a module of the project it imports; and the policy
built where the wrap call names it, or in a variable, a helper or another module of the
project. A dtype counts only as a literal (``torch.float16``, ``torch.half``, a name the same
function assigns one); a policy or dtype chosen by a condition (``torch.float16 if args.fp16
else ...``) counts with that condition as its switch (``enabling.switch_of``).

A module of the project is read only where a call in it passes a policy keyword
(``project_index.keyword_passes``): most helpers a training loop calls wrap nothing."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path

from .ast_context import AstContext
from .checkpoints import argument_values
from .crossfile import imported_in, located
from .diagnostics import Related
from .enabling import Switch, switch_of
from .outline import walk
from .project_index import project_module, project_name
from .regions import bind, called_function, calls_of, dtype_of, value_before

# FSDP1's policy and FSDP2's, under the names torch has exported them by.
MIXED_PRECISION = frozenset({
    "torch.distributed.fsdp.MixedPrecision", "torch.distributed.fsdp.api.MixedPrecision",
    "torch.distributed.fsdp.fully_sharded_data_parallel.MixedPrecision",
    "torch.distributed.fsdp.MixedPrecisionPolicy", "torch.distributed.fsdp._fully_shard.MixedPrecisionPolicy",
    "torch.distributed.fsdp._fully_shard._fsdp_api.MixedPrecisionPolicy",
    "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
    "torch.distributed._composable.fsdp._fsdp_api.MixedPrecisionPolicy",
})
_FSDP1 = frozenset({"torch.distributed.fsdp.FullyShardedDataParallel",
                    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel"})
# FSDP2 shards the module it is given in place (and returns it).
_FSDP2 = frozenset({"torch.distributed.fsdp.fully_shard", "torch.distributed.fsdp._fully_shard.fully_shard",
                    "torch.distributed.fsdp._fully_shard._fully_shard.fully_shard",
                    "torch.distributed._composable.fsdp.fully_shard",
                    "torch.distributed._composable.fsdp.fully_shard.fully_shard"})
# The calls that wrap a module with a policy, and the keyword they take it by.
WRAPS = {**dict.fromkeys(_FSDP1, "mixed_precision"), **dict.fromkeys(_FSDP2, "mp_policy")}
# The keywords that hand a wrap its precision policy.
POLICY_KEYWORDS = tuple(sorted(set(WRAPS.values())))
_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                      "torch.autograd.inference_mode", "torch.autograd.grad_mode.no_grad",
                      "torch.autograd.grad_mode.inference_mode"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEPTH = 3  # helpers and modules followed from a use of a model to its wrap
_POLICY_DEPTH = 4  # names, helpers and modules followed from a wrap to its policy

Position = tuple[int, int]  # a row and a column of the source


@dataclass(frozen=True)
class Place:
    where: str  # "build.py:12" for another module (from the project's root), "line 12" in the file
    related: Related


@dataclass(frozen=True)
class Float16Model:
    """A model FSDP wraps with a float16 policy, as the checked file reaches it."""
    policy: str  # the policy's code, `MixedPrecision(param_dtype=torch.float16)`
    policy_place: Place
    wrap: str  # the wrapping callee as written, `FSDP`, `fully_shard`
    wrap_place: Place
    # The calls of the checked file that connect the wrap to the backward, innermost first:
    # (`wrap_model()`, where).
    through: tuple[tuple[str, Place], ...] = ()
    switch: Switch | None = None  # the condition that picks the float16 policy, if one does

    def evidence(self) -> str:
        """``MixedPrecision(param_dtype=torch.float16)``, config.py:4, handed to `FSDP` at
        build.py:12, through `wrap_model()` on line 9"""
        policy = f"`{self.policy}`" if self.policy_place.where == self.wrap_place.where \
            else f"`{self.policy}`, {self.policy_place.where},"
        through = " and ".join(f"{call} on {place.where}" for call, place in self.through)
        return f"{policy} handed to `{self.wrap}` at {self.wrap_place.where}" + \
            (f", through {through}" if through else "")

    def related(self) -> tuple[Related, ...]:
        """The switch's places, the policy, the wrap and the connecting calls: one per line."""
        places = {}
        for place in (self.policy_place, self.wrap_place, *(place for _, place in self.through)):
            places.setdefault(place.where, place.related)
        return (*(self.switch.related if self.switch else ()), *places.values())


@dataclass(frozen=True)
class _Binding:
    end: Position  # where the binding statement ends
    code: str  # what holds the model: `model`, `self.model`
    model: Float16Model
    in_place: bool  # `fully_shard(model, ...)` as a statement: the caller's object is the model


class Float16Models:
    """The float16 FSDP models of what one file trains (the module docstring says where)."""

    def __init__(self, ctx: AstContext):
        self.ctx = ctx
        self._bindings: dict[tuple[int, int, int], list[_Binding]] = {}
        self._modules: dict[tuple[int, str | None, int], AstContext | None] = {}
        self._wrapping: dict[tuple[int, str | None, int], bool] = {}  # `_passes_policy`, by `_module`'s key
        self._read: dict[int, AstContext] = {}  # the project's other modules read, by id
        self._calls: dict[int, list[ast.Call]] = {}  # the calls within a scope, by its id
        self._no_grad: dict[int, bool] = {}  # `_without_grad` of a call, by its id
        self._locals: dict[int, frozenset[str]] = {}  # `_bound_locally` of a function, by its id
        self._possible: bool | None = None

    def possible(self) -> bool:
        """Whether the file may reach a wrap at all, ``trained_by``'s first step: a call passes
        a policy keyword to a wrap in the file, or passes one (to anything) elsewhere in its
        project (``CheckedFile.keyword_passes``, where ``_passes_policy`` looks)."""
        if self._possible is None:
            self._possible = any(k.arg in POLICY_KEYWORDS for c in self.ctx.outline.calls_to(WRAPS.keys())
                                 for k in c.keywords) or any(self.ctx.keyword_passes(k) for k in POLICY_KEYWORDS)
        return self._possible

    def trained_by(self, backward: ast.Call) -> Float16Model | None:
        if not self.possible():
            return None
        try:
            return self._trained_by(backward)
        finally:  # what the other modules read of the project, this file's findings read too
            for other in self._read.values():
                self.ctx.dependencies |= other.dependencies

    def _trained_by(self, backward: ast.Call) -> Float16Model | None:
        ctx = self.ctx
        function = ctx.enclosing_function(backward)
        at = _start(backward)
        scope = function if function is not None else ctx.outline.tree
        own = [b for b in self._bound_in(ctx, function, _DEPTH)
               if b.end <= at and self._uses(scope, b.code, after=b.end)]
        if own:
            return own[-1].model
        if function is None:
            return None
        used = next(self._used_bindings(function), None)
        if used is not None:
            return used.model
        # A model a call of this file passes to the backward's function, which uses it.
        for call in calls_of(ctx, function):
            caller = ctx.enclosing_function(call)
            for param, arg in (bind(call, _params(ctx, function)) or {}).items():
                model = self._held(caller, ctx.code(arg), _start(call)) \
                    if isinstance(arg, (ast.Name, ast.Attribute)) else None
                if model is not None and self._uses(function, param):
                    return self._through(ctx, call, model)
        return None

    def _used_bindings(self, function: ast.AST):
        """The class's attributes that its methods wrap and ``function`` uses, then the module's
        globals that ``function`` uses and does not bind."""
        ctx = self.ctx
        for method in _methods(ctx.parent(function)):
            for b in self._bound_in(ctx, method, _DEPTH):
                if b.code.startswith("self.") and self._uses(function, b.code):
                    yield b
        for b in self._bound_in(ctx, None, _DEPTH):
            if "." not in b.code and b.code not in self._bound_locally(function) and self._uses(function, b.code):
                yield b

    def _held(self, scope: ast.AST | None, code: str, at: Position) -> Float16Model | None:
        """The model that ``code`` holds at ``at`` in ``scope``: bound there before, an attribute
        of its class, a global of the module."""
        ctx = self.ctx
        own = [b for b in self._bound_in(ctx, scope, _DEPTH) if b.end <= at and b.code == code]
        if own:
            return own[-1].model
        if scope is None:
            return None
        if code.startswith("self."):
            return next((b.model for m in _methods(ctx.parent(scope))
                         for b in self._bound_in(ctx, m, _DEPTH) if b.code == code), None)
        if "." in code or code in self._bound_locally(scope):
            return None
        return next((b.model for b in self._bound_in(ctx, None, _DEPTH) if b.code == code), None)

    def _uses(self, scope: ast.AST, code: str, after: Position | None = None, depth: int = 1) -> bool:
        """Whether ``scope`` (from ``after`` on), or a function of the file it calls, runs the
        model ``code`` holds where gradients are recorded: calls it (or its ``forward``) or
        passes it to a call, outside ``torch.no_grad()`` (a frozen teacher's forward is not
        what a backward trains)."""
        ctx = self.ctx
        if id(scope) not in self._calls:
            self._calls[id(scope)] = [n for n in walk(scope) if isinstance(n, ast.Call)]
        for call in self._calls[id(scope)]:
            if after is not None and _start(call) < after or self._without_grad(call):
                continue
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "forward":
                func = func.value
            if isinstance(func, (ast.Name, ast.Attribute)) and ctx.code(func) == code or any(
                    isinstance(a, (ast.Name, ast.Attribute)) and ctx.code(a) == code for a in argument_values(call)):
                return True
            callee = called_function(ctx, call) if depth > 0 else None
            if callee is not None and callee is not scope and self._uses(callee, code, depth=depth - 1):
                return True
        return False

    def _without_grad(self, call: ast.Call) -> bool:
        """Whether ``call`` runs inside ``with torch.no_grad():`` (or ``torch.inference_mode()``)
        or in a function decorated with one."""
        if id(call) not in self._no_grad:
            ctx, found = self.ctx, False
            ancestor = ctx.parent(call)
            while ancestor is not None and not found:
                if isinstance(ancestor, (ast.With, ast.AsyncWith)):
                    items = [item.context_expr for item in ancestor.items]
                else:
                    items = ancestor.decorator_list if isinstance(ancestor, _FUNCTIONS) else []
                found = any(ctx.resolves_to(i.func if isinstance(i, ast.Call) else i, _NO_GRAD) for i in items)
                ancestor = ctx.parent(ancestor)
            self._no_grad[id(call)] = found
        return self._no_grad[id(call)]

    def _bound_locally(self, function: ast.AST) -> frozenset[str]:
        """The names ``function`` binds itself (parameters, assignments, loop targets, imports),
        its nested functions' included."""
        if id(function) not in self._locals:
            found = set()
            for node in walk(function):
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    found.add(node.id)
                elif isinstance(node, ast.arg):
                    found.add(node.arg)
                elif isinstance(node, ast.alias):
                    found.add(node.asname or node.name.split(".")[0])
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    found.add(node.name)
            self._locals[id(function)] = frozenset(found)
        return self._locals[id(function)]

    # -- the wrap ----------------------------------------------------------------------------

    def _bound_in(self, fctx: AstContext, scope: ast.AST | None, depth: int) -> list[_Binding]:
        """What ``scope`` (None: the module's own statements) binds to a float16 FSDP model, in
        source order: ``x = FSDP(...)``, ``x = helper(...)``, ``x = y`` of such a ``y``, and
        ``fully_shard(x, ...)`` or ``helper(x)`` that shards ``x`` in place."""
        key = (id(fctx), id(scope), depth)
        if key not in self._bindings:
            self._bindings[key] = found = []
            for statement in _in_scope(fctx, (ast.Assign, ast.Expr), scope):
                value = statement.value
                if isinstance(statement, ast.Expr):
                    if isinstance(value, ast.Call):
                        found.extend(_Binding(_end(statement), code, model, True)
                                     for code, model in self._in_place(fctx, value, depth))
                    continue
                if isinstance(value, ast.Call):
                    model = self._model_of(fctx, value, depth)
                elif isinstance(value, (ast.Name, ast.Attribute)):
                    model = next((b.model for b in reversed(found) if b.code == fctx.code(value)), None)
                else:
                    model = None
                if model is not None:
                    found.extend(_Binding(_end(statement), fctx.code(t), model, False)
                                 for t in statement.targets if isinstance(t, (ast.Name, ast.Attribute)))
        return self._bindings[key]

    def _model_of(self, fctx: AstContext, call: ast.Call, depth: int) -> Float16Model | None:
        """The float16 FSDP model ``call`` returns: a wrap with such a policy, or a helper that
        returns one."""
        if depth == 0:
            return None
        api = fctx.resolves_to(call.func, WRAPS.keys())
        if api is not None:
            given = next((k.value for k in call.keywords if k.arg == WRAPS[api]), None)
            found = self._policy(fctx, given, _POLICY_DEPTH) if given is not None else None
            if found is None:
                return None
            code, place, switch = found
            wrap = fctx.code(call.func)
            return Float16Model(code, place, wrap, self._place(fctx, call, f"`{wrap}` wraps the model with it here"),
                                switch=switch)
        helper = self._helper(fctx, call, across=fctx is self.ctx, wrapping=True)
        if helper is None:
            return None
        hctx, function = helper
        at_return = (self._returned(hctx, function, r.value, depth - 1)
                     for r in _in_scope(hctx, (ast.Return,), function) if r.value is not None)
        model = next((m for m in at_return if m is not None), None)
        return self._through(fctx, call, model) if model is not None else None

    def _returned(self, hctx: AstContext, function: ast.AST, value: ast.expr, depth: int) -> Float16Model | None:
        if isinstance(value, ast.Call):
            return self._model_of(hctx, value, depth)
        if isinstance(value, ast.Name):
            return next((b.model for b in reversed(self._bound_in(hctx, function, depth))
                         if b.end <= _start(value) and b.code == value.id), None)
        return None

    def _in_place(self, fctx: AstContext, call: ast.Call, depth: int) -> list[tuple[str, Float16Model]]:
        """What a call as a statement shards in place: ``fully_shard(x, mp_policy=...)``'s ``x``,
        or the argument a helper of the file (or of a module it imports) shards so."""
        if depth == 0:
            return []
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if fctx.resolves_to(call.func, _FSDP2) is not None:
            model = self._model_of(fctx, call, depth)
            return [(fctx.code(positional[0]), model)] if model is not None and positional else []
        helper = self._helper(fctx, call, across=fctx is self.ctx, wrapping=True)
        if helper is None:
            return []
        hctx, function = helper
        params = _params(hctx, function)
        found = []
        for b in self._bound_in(hctx, function, depth - 1):
            if not b.in_place or b.code not in params:
                continue
            given = (bind(call, params) or {}).get(b.code)
            if isinstance(given, (ast.Name, ast.Attribute)):
                found.append((fctx.code(given), self._through(fctx, call, b.model)))
        return found

    def _helper(self, fctx: AstContext, call: ast.Call, across: bool, wrapping: bool = False
                ) -> tuple[AstContext, ast.AST] | None:
        """The function ``call`` runs: of its own file, or (``across``) a module-level function
        of a module of the project that the file imports (``wrapping``: one whose text passes a
        policy keyword, as a module where a wrap is must)."""
        function = called_function(fctx, call)
        if function is not None:
            return fctx, function
        if not across:
            return None
        for module, level, name in imported_in(fctx, call.func):
            other = self._module(fctx, module, level, wrapping)
            function = next((s for s in other.outline.tree.body if isinstance(s, _FUNCTIONS) and s.name == name),
                            None) if other is not None else None
            if function is not None:
                return other, function
        return None

    def _through(self, fctx: AstContext, call: ast.Call, model: Float16Model) -> Float16Model:
        """``model`` reached through ``call``: named in the finding where it is a call of the
        checked file."""
        if fctx is not self.ctx:
            return model
        name = f"`{fctx.code(call.func)}()`"
        return replace(model, through=(*model.through, (name, self._place(
            fctx, call, f"{name} connects the float16 FSDP model to the backward here"))))

    # -- the policy --------------------------------------------------------------------------

    def _policy(self, pctx: AstContext, expr: ast.expr, depth: int) -> tuple[str, Place, Switch | None] | None:
        """The float16 policy ``expr`` holds: its code, place, and the switch that picks it."""
        if depth == 0:
            return None
        if isinstance(expr, ast.IfExp):
            return _either(pctx, expr, lambda branch: self._policy(pctx, branch, depth))
        if isinstance(expr, ast.Call):
            if pctx.resolves_to(expr.func, MIXED_PRECISION) is not None:
                dtype = (bind(expr, ("param_dtype",)) or {}).get("param_dtype")
                float16 = _float16(pctx, dtype) if dtype is not None else None
                if float16 is None:
                    return None
                keyword = "param_dtype=" if any(k.arg == "param_dtype" for k in expr.keywords) else ""
                more = ", ..." if len(expr.args) + len(expr.keywords) > 1 else ""
                shown = f"{pctx.code(expr.func)}({keyword}{pctx.code(dtype)}{more})"
                return shown, self._place(pctx, expr, "the float16 FSDP policy is built here"), float16[0]
            helper = self._helper(pctx, expr, across=True)
            if helper is None:
                return None
            hctx, function = helper
            return next((found for r in _in_scope(hctx, (ast.Return,), function) if r.value is not None
                         if (found := self._policy(hctx, r.value, depth - 1)) is not None), None)
        if isinstance(expr, ast.Name):
            bound = value_before(pctx, expr)
            if bound is not None:
                return self._policy(pctx, bound, depth - 1)
            function = pctx.enclosing_function(expr)
            if function is not None and expr.id in self._bound_locally(function):
                return None
            bound = _module_value(pctx, expr.id)
            if bound is not None:
                return self._policy(pctx, bound, depth - 1)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            for module, level, name in imported_in(pctx, expr):
                other = self._module(pctx, module, level)
                bound = _module_value(other, name) if other is not None else None
                if bound is not None:
                    return self._policy(other, bound, depth - 1)
        return None

    # -- the project ---------------------------------------------------------------------------

    def _module(self, fctx: AstContext, module: str | None, level: int, wrapping: bool = False
                ) -> AstContext | None:
        """The module of the project that ``from <level dots><module> import ...`` reads in
        ``fctx``; with ``wrapping``, only one where a call passes a policy keyword (most
        helpers a training loop calls wrap nothing, and are not read)."""
        if module is not None and (module + ".").startswith("torch."):
            return None  # torch's own modules are no project's
        key = (id(fctx), module, level)
        if wrapping and key not in self._wrapping:
            self._wrapping[key] = self._passes_policy(fctx, module, level)
        if wrapping and not self._wrapping[key]:
            return None
        if key not in self._modules:
            other = self._modules[key] = fctx.project_module(module, level)
            if other is not None:
                self._read[id(other)] = other
            if fctx is not self.ctx:
                self._read[id(fctx)] = fctx
        return self._modules[key]

    def _passes_policy(self, fctx: AstContext, module: str | None, level: int) -> bool:
        """Whether a call in the module passes a policy keyword (``CheckedFile.keyword_passes``,
        which records what the findings read)."""
        root = fctx.project_root()
        path = project_module(root, Path(fctx.path), module, level) if root is not None else None
        return path is not None and project_name(path.resolve(), root.resolve()) in {
            shown for keyword in POLICY_KEYWORDS for shown, _ in self.ctx.keyword_passes(keyword)}

    def _place(self, fctx: AstContext, node: ast.AST, what: str) -> Place:
        if fctx is self.ctx:
            return Place(f"line {node.lineno}", Related(fctx.path, node.lineno, what))
        return Place(*located(self.ctx, Path(fctx.path), node.lineno, what))


def _either(ctx: AstContext, expr: ast.IfExp, found_in):
    """What ``found_in`` finds in a branch of ``a if test else b``, with the switch that picks
    that branch (unless one inside it picks already); none where both branches hold it."""
    body, orelse = found_in(expr.body), found_in(expr.orelse)
    if body is not None and orelse is not None:
        return body
    if body is not None:
        *rest, inner = body
        return (*rest, inner or switch_of(ctx, expr.test))
    if orelse is not None:
        *rest, inner = orelse
        return (*rest, inner or Switch(f"when `{ctx.code(expr.test)}` is false"))
    return None


def _float16(ctx: AstContext, expr: ast.expr, named: bool = True) -> tuple[Switch | None] | None:
    """For a float16 dtype: (the switch that picks it, if a condition does); None otherwise. A
    literal, or (``named``) a name its function (or module) assigns one."""
    if isinstance(expr, ast.IfExp):
        return _either(ctx, expr, lambda branch: _float16(ctx, branch, named))
    if named and isinstance(expr, ast.Name) and dtype_of(ctx, expr) is None:
        bound = value_before(ctx, expr)
        return _float16(ctx, bound, named=False) if bound is not None else None
    return (None,) if dtype_of(ctx, expr) == "float16" else None


def _start(node: ast.AST) -> Position:
    return node.lineno, node.col_offset


def _end(node: ast.AST) -> Position:
    return node.end_lineno, node.end_col_offset


def _in_scope(ctx: AstContext, kinds: tuple[type, ...], scope: ast.AST | None) -> list:
    """The nodes of ``kinds`` whose innermost function is ``scope`` (None: the module's own
    code, class bodies included), in source order; grouped once per file and kinds."""
    cache = ctx.__dict__.setdefault("_sharded_in_scope", {})
    if kinds not in cache:
        grouped = cache[kinds] = {}
        for node in sorted((n for kind in kinds for n in ctx.outline.nodes(kind)), key=ctx.order):
            grouped.setdefault(id(ctx.enclosing_function(node)), []).append(node)
    return cache[kinds].get(id(scope), [])


def _params(ctx: AstContext, function: ast.AST) -> list[str]:
    """The parameters a call passes positionally or by name, past a method's ``self``."""
    names = [a.arg for a in function.args.args]
    return names[1:] if isinstance(ctx.parent(function), ast.ClassDef) else names


def _methods(owner: ast.AST | None) -> list[ast.AST]:
    """The methods of ``owner`` where it is a class; none otherwise."""
    return [s for s in owner.body if isinstance(s, _FUNCTIONS)] if isinstance(owner, ast.ClassDef) else []


def _module_value(ctx: AstContext, name: str) -> ast.expr | None:
    """The value of the module's one top-level ``name = value``; None where it has not one."""
    values = [s.value for s in ctx.outline.tree.body if isinstance(s, (ast.Assign, ast.AnnAssign))
              and any(isinstance(t, ast.Name) and t.id == name for t in (
                  s.targets if isinstance(s, ast.Assign) else [s.target]))]
    return values[0] if len(values) == 1 and values[0] is not None else None
