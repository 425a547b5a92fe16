"""FSDP's reduced precision: a module that ``FullyShardedDataParallel(mixed_precision=...)`` or
FSDP2's ``fully_shard(mp_policy=...)`` wraps with a policy whose ``param_dtype`` is float16
computes its forward and backward in float16 with no autocast region at all, so its gradients
need a loss scale as a float16 autocast region's do.

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
else ...``) counts with that condition as its switch (``enabling.switch_of``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import libcst as cst

from .context import FileContext
from .crossfile import imported_as, located
from .diagnostics import Related
from .enabling import Switch, switch_of
from .outline import Outline
from .project_index import Dependency, keyword_dependency, keyword_passes, project_module, relative_name
from .semantics import assigned_before, bind, called_function, calls_of, dtype_of, enclosing_function

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
_KEYWORDS = frozenset(WRAPS.values())
_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                      "torch.autograd.inference_mode", "torch.autograd.grad_mode.no_grad",
                      "torch.autograd.grad_mode.inference_mode"})
_DEPTH = 3  # helpers and modules followed from a use of a model to its wrap
_POLICY_DEPTH = 4  # names, helpers and modules followed from a wrap to its policy


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
    order: int  # the rank of the binding statement's last node
    code: str  # what holds the model: `model`, `self.model`
    model: Float16Model
    in_place: bool  # `fully_shard(model, ...)` as a statement: the caller's object is the model


class Float16Models:
    """The float16 FSDP models of what one file trains (the module docstring says where)."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self._bindings: dict[tuple[int, int, int], list[_Binding]] = {}
        self._modules: dict[tuple[int, str | None, int], FileContext | None] = {}
        self._wrapping: dict[tuple[int, str | None, int], bool] = {}  # `_passes_policy`, by `_module`'s key
        self._read: dict[int, FileContext] = {}  # the project's other modules read, by id

    def trained_by(self, backward: cst.Call) -> Float16Model | None:
        try:
            return self._trained_by(backward)
        finally:  # what the other modules read of the project, this file's findings read too
            for other in self._read.values():
                self.ctx.dependencies |= other.dependencies

    def _trained_by(self, backward: cst.Call) -> Float16Model | None:
        ctx = self.ctx
        function = enclosing_function(ctx, backward)
        at = ctx.order(backward)
        scope = function if function is not None else ctx.module
        own = [b for b in self._bound_in(ctx, function, _DEPTH)
               if b.order < at and self._uses(scope, b.code, after=b.order)]
        if own:
            return own[-1].model
        if function is None:
            return None
        used = next(self._used_bindings(function), None)
        if used is not None:
            return used.model
        # A model a call of this file passes to the backward's function, which uses it.
        params = [p.name.value for p in function.params.params][1 if _class_of(ctx, function) else 0:]
        for call in calls_of(ctx, function):
            caller = enclosing_function(ctx, call)
            for param, arg in (bind(call, params) or {}).items():
                model = self._held(caller, ctx.code(arg.value), ctx.order(call)) \
                    if isinstance(arg.value, (cst.Name, cst.Attribute)) else None
                if model is not None and self._uses(function, param):
                    return self._through(ctx, call, model)
        return None

    def _used_bindings(self, function: cst.FunctionDef):
        """The class's attributes that its methods wrap and ``function`` uses, then the module's
        globals that ``function`` uses and does not bind."""
        ctx = self.ctx
        cls = _class_of(ctx, function)
        for method in _methods(cls) if cls is not None else ():
            for b in self._bound_in(ctx, method, _DEPTH):
                if b.code.startswith("self.") and self._uses(function, b.code):
                    yield b
        for b in self._bound_in(ctx, None, _DEPTH):
            if "." not in b.code and not _bound_locally(ctx, function, b.code) and self._uses(function, b.code):
                yield b

    def _held(self, scope: cst.FunctionDef | None, code: str, at: int) -> Float16Model | None:
        """The model that ``code`` holds at ``at`` in ``scope``: bound there before, an attribute
        of its class, a global of the module."""
        ctx = self.ctx
        own = [b for b in self._bound_in(ctx, scope, _DEPTH) if b.order < at and b.code == code]
        if own:
            return own[-1].model
        if scope is None:
            return None
        if code.startswith("self."):
            cls = _class_of(ctx, scope)
            return next((b.model for m in (_methods(cls) if cls is not None else ())
                         for b in self._bound_in(ctx, m, _DEPTH) if b.code == code), None)
        if "." in code or _bound_locally(ctx, scope, code):
            return None
        return next((b.model for b in self._bound_in(ctx, None, _DEPTH) if b.code == code), None)

    def _uses(self, scope: cst.CSTNode, code: str, after: int = -1, depth: int = 1) -> bool:
        """Whether ``scope`` (past the rank ``after``), or a function of the file it calls, runs
        the model ``code`` holds where gradients are recorded: calls it (or its ``forward``) or
        passes it to a call, outside ``torch.no_grad()`` (a frozen teacher's forward is not
        what a backward trains)."""
        ctx = self.ctx
        for call in ctx.nodes_within(cst.Call, scope):
            if ctx.order(call) <= after or _without_grad(ctx, call):
                continue
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "forward":
                func = func.value
            if isinstance(func, (cst.Name, cst.Attribute)) and ctx.code(func) == code or any(
                    isinstance(a.value, (cst.Name, cst.Attribute)) and ctx.code(a.value) == code for a in call.args):
                return True
            callee = called_function(ctx, call) if depth > 0 else None
            if callee is not None and callee is not scope and self._uses(callee, code, depth=depth - 1):
                return True
        return False

    # -- the wrap ----------------------------------------------------------------------------

    def _bound_in(self, fctx: FileContext, scope: cst.FunctionDef | None, depth: int) -> list[_Binding]:
        """What ``scope`` (None: the module's own statements) binds to a float16 FSDP model, in
        source order: ``x = FSDP(...)``, ``x = helper(...)``, ``x = y`` of such a ``y``, and
        ``fully_shard(x, ...)`` or ``helper(x)`` that shards ``x`` in place."""
        key = (id(fctx), id(scope), depth)
        if key not in self._bindings:
            self._bindings[key] = found = []
            statements = sorted([*fctx.nodes_in(cst.Assign, cst.FunctionDef, scope),
                                 *fctx.nodes_in(cst.Expr, cst.FunctionDef, scope)], key=fctx.order)
            for statement in statements:
                value = statement.value
                if isinstance(statement, cst.Expr):
                    if isinstance(value, cst.Call):
                        found.extend(_Binding(fctx.span(statement)[1], code, model, True)
                                     for code, model in self._in_place(fctx, value, depth))
                    continue
                if isinstance(value, cst.Call):
                    model = self._model_of(fctx, value, depth)
                elif isinstance(value, (cst.Name, cst.Attribute)):
                    model = next((b.model for b in reversed(found) if b.code == fctx.code(value)), None)
                else:
                    model = None
                if model is not None:
                    found.extend(_Binding(fctx.span(statement)[1], fctx.code(t.target), model, False)
                                 for t in statement.targets if isinstance(t.target, (cst.Name, cst.Attribute)))
        return self._bindings[key]

    def _model_of(self, fctx: FileContext, call: cst.Call, depth: int) -> Float16Model | None:
        """The float16 FSDP model ``call`` returns: a wrap with such a policy, or a helper that
        returns one."""
        if depth == 0:
            return None
        api = fctx.resolves_to(call.func, WRAPS.keys())
        if api is not None:
            keyword = WRAPS[api]
            given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
            found = self._policy(fctx, given, _POLICY_DEPTH) if given is not None else None
            if found is None:
                return None
            code, place, switch = found
            return Float16Model(code, place, fctx.code(call.func),
                                self._place(fctx, call, f"`{fctx.code(call.func)}` wraps the model with it here"),
                                switch=switch)
        helper = self._helper(fctx, call, across=fctx is self.ctx, wrapping=True)
        if helper is None:
            return None
        hctx, function = helper
        at_return = (self._returned(hctx, function, r.value, depth - 1)
                     for r in hctx.nodes_in(cst.Return, cst.FunctionDef, function) if r.value is not None)
        model = next((m for m in at_return if m is not None), None)
        return self._through(fctx, call, model) if model is not None else None

    def _returned(self, hctx: FileContext, function: cst.FunctionDef, value: cst.BaseExpression,
                  depth: int) -> Float16Model | None:
        if isinstance(value, cst.Call):
            return self._model_of(hctx, value, depth)
        if isinstance(value, cst.Name):
            at = hctx.order(value)
            return next((b.model for b in reversed(self._bound_in(hctx, function, depth))
                         if b.order < at and b.code == value.value), None)
        return None

    def _in_place(self, fctx: FileContext, call: cst.Call, depth: int) -> list[tuple[str, Float16Model]]:
        """What a call as a statement shards in place: ``fully_shard(x, mp_policy=...)``'s ``x``,
        or the argument a helper of the file (or of a module it imports) shards so."""
        if depth == 0:
            return []
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if fctx.resolves_to(call.func, _FSDP2) is not None:
            model = self._model_of(fctx, call, depth)
            return [(fctx.code(positional[0]), model)] if model is not None and positional else []
        helper = self._helper(fctx, call, across=fctx is self.ctx, wrapping=True)
        if helper is None:
            return []
        hctx, function = helper
        params = [p.name.value for p in function.params.params][1 if _class_of(hctx, function) else 0:]
        found = []
        for b in self._bound_in(hctx, function, depth - 1):
            if not b.in_place or b.code not in params:
                continue
            given = (bind(call, params) or {}).get(b.code)
            if given is not None and isinstance(given.value, (cst.Name, cst.Attribute)):
                found.append((fctx.code(given.value), self._through(fctx, call, b.model)))
        return found

    def _helper(self, fctx: FileContext, call: cst.Call, across: bool, wrapping: bool = False
                ) -> tuple[FileContext, cst.FunctionDef] | None:
        """The function ``call`` runs: of its own file, or (``across``) a module-level function
        of a module of the project that the file imports (``wrapping``: one whose text passes a
        policy keyword, as a module where a wrap is must)."""
        function = called_function(fctx, call)
        if function is not None:
            return fctx, function
        if not across:
            return None
        for module, level, name in imported_as(fctx, call.func):
            other = self._module(fctx, module, level, wrapping)
            function = next((s for s in other.module.body if isinstance(s, cst.FunctionDef)
                             and s.name.value == name), None) if other is not None else None
            if function is not None:
                return other, function
        return None

    def _through(self, fctx: FileContext, call: cst.Call, model: Float16Model) -> Float16Model:
        """``model`` reached through ``call``: named in the finding where it is a call of the
        checked file."""
        if fctx is not self.ctx:
            return model
        name = f"`{fctx.code(call.func)}()`"
        return replace(model, through=(*model.through, (name, self._place(
            fctx, call, f"{name} connects the float16 FSDP model to the backward here"))))

    # -- the policy --------------------------------------------------------------------------

    def _policy(self, pctx: FileContext, expr: cst.BaseExpression, depth: int
                ) -> tuple[str, Place, Switch | None] | None:
        """The float16 policy ``expr`` holds: its code, place, and the switch that picks it."""
        if depth == 0:
            return None
        if isinstance(expr, cst.IfExp):
            return _either(pctx, expr, lambda branch: self._policy(pctx, branch, depth))
        if isinstance(expr, cst.Call):
            if pctx.resolves_to(expr.func, MIXED_PRECISION) is not None:
                dtype = (bind(expr, ("param_dtype",)) or {}).get("param_dtype")
                float16 = _float16(pctx, dtype.value) if dtype is not None else None
                if float16 is None:
                    return None
                shown = f"{pctx.code(expr.func)}({'param_dtype=' if dtype.keyword else ''}{pctx.code(dtype.value)}" \
                        f"{', ...' if len(expr.args) > 1 else ''})"
                return shown, self._place(pctx, expr, "the float16 FSDP policy is built here"), float16[0]
            helper = self._helper(pctx, expr, across=True)
            if helper is None:
                return None
            hctx, function = helper
            return next((found for r in hctx.nodes_in(cst.Return, cst.FunctionDef, function) if r.value is not None
                         if (found := self._policy(hctx, r.value, depth - 1)) is not None), None)
        if isinstance(expr, cst.Name):
            bound = assigned_before(pctx, expr)
            if bound is not None:
                return self._policy(pctx, bound, depth - 1)
            function = enclosing_function(pctx, expr)
            if function is not None and _bound_locally(pctx, function, expr.value):
                return None
            bound = _module_value(pctx, expr.value)
            if bound is not None:
                return self._policy(pctx, bound, depth - 1)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            for module, level, name in imported_as(pctx, expr):
                other = self._module(pctx, module, level)
                bound = _module_value(other, name) if other is not None else None
                if bound is not None:
                    return self._policy(other, bound, depth - 1)
        return None

    # -- the project ---------------------------------------------------------------------------

    def _module(self, fctx: FileContext, module: str | None, level: int, wrapping: bool = False
                ) -> FileContext | None:
        """The module of the project that ``from <level dots><module> import ...`` reads in
        ``fctx``; with ``wrapping``, only one where a call passes a policy keyword (as the
        prefilter asks: most helpers a training loop calls wrap nothing, and are not read)."""
        if module is not None and (module + ".").startswith("torch."):
            return None  # torch's own modules are no project's (the prefilter skips them too)
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

    def _passes_policy(self, fctx: FileContext, module: str | None, level: int) -> bool:
        root = fctx.project_root()
        path = project_module(root, Path(fctx.path), module, level) if root is not None else None
        return path is not None and _shown(path, root) in _wrapping_modules(root, self.ctx.dependencies.add)

    def _place(self, fctx: FileContext, node: cst.CSTNode, what: str) -> Place:
        row = fctx.location(fctx.offsets(node)[0]).row
        if fctx is self.ctx:
            return Place(f"line {row}", Related(fctx.path, row, what))
        return Place(*located(self.ctx, Path(fctx.path), row, what))


def _either(ctx: FileContext, expr: cst.IfExp, found_in):
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


def _float16(ctx: FileContext, expr: cst.BaseExpression, named: bool = True) -> tuple[Switch | None] | None:
    """For a float16 dtype: (the switch that picks it, if a condition does); None otherwise. A
    literal, or (``named``) a name its function (or module) assigns one."""
    if isinstance(expr, cst.IfExp):
        return _either(ctx, expr, lambda branch: _float16(ctx, branch, named))
    if named and isinstance(expr, cst.Name) and dtype_of(ctx, expr) is None:
        bound = assigned_before(ctx, expr)
        return _float16(ctx, bound, named=False) if bound is not None else None
    return (None,) if dtype_of(ctx, expr) == "float16" else None


def _module_value(ctx: FileContext, name: str) -> cst.BaseExpression | None:
    """The value of the module's one top-level ``name = value``; None where it has not one."""
    values = [small.value for statement in ctx.module.body if isinstance(statement, cst.SimpleStatementLine)
              for small in statement.body if isinstance(small, (cst.Assign, cst.AnnAssign))
              and any(isinstance(t, cst.Name) and t.value == name for t in (
                  [x.target for x in small.targets] if isinstance(small, cst.Assign) else [small.target]))]
    return values[0] if len(values) == 1 and values[0] is not None else None


_BINDERS = (cst.Param, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.AsName, cst.NamedExpr,
            cst.CompFor)


def _bound_locally(ctx: FileContext, function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` binds ``name`` itself (a parameter, an assignment, a loop's target)."""
    return any(n.value == name and isinstance(ctx.parent(n), _BINDERS) for n in ctx.nodes_within(cst.Name, function))


def _without_grad(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs inside ``with torch.no_grad():`` (or ``torch.inference_mode()``) or
    in a function decorated with one."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.With):
            items = [item.item for item in ancestor.items]
        elif isinstance(ancestor, cst.FunctionDef):
            items = [d.decorator for d in ancestor.decorators]
        else:
            continue
        if any(ctx.resolves_to(i.func if isinstance(i, cst.Call) else i, _NO_GRAD) for i in items):
            return True
    return False


def _class_of(ctx: FileContext, function: cst.FunctionDef) -> cst.ClassDef | None:
    """The class ``function`` is a method of."""
    block = ctx.parent(function)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    return owner if isinstance(owner, cst.ClassDef) else None


def _methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    return [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]


# -- the prefilter ------------------------------------------------------------------------------

def may_train_float16(outline: Outline) -> bool:
    """``may_fire``'s side of ``Float16Models``: the file calls a wrap with a policy keyword, or
    imports a module of the project where a call passes one (a helper that wraps is there). What
    of the project it read is recorded as what the prefilter's answer depends on."""
    if any(k.arg in _KEYWORDS for c in outline.calls_to(WRAPS.keys()) for k in c.keywords):
        return True
    hints = outline.project
    root = hints.root if hints is not None else None
    if root is None:
        return False
    path = Path(hints.path)
    targets = {target for module, level in _imported_modules(outline)
               if (target := project_module(root, path, module, level)) is not None}
    # the project's keyword passes are read only for a file that imports some of its modules
    return bool(targets) and not {_shown(t, root) for t in targets}.isdisjoint(_wrapping_modules(root, hints.read.add))


def _wrapping_modules(root: Path, read: Callable[[Dependency], None]) -> set[str]:
    """The modules of the project (from its root) where a call passes a policy keyword
    (``project_index.keyword_passes``): where a wrap may be. ``read`` records the dependency."""
    found = set()
    for keyword in sorted(_KEYWORDS):
        read(keyword_dependency(root, keyword))
        found.update(path for path, _ in keyword_passes(root, keyword))
    return found


def _shown(path: Path, root: Path) -> str:
    return relative_name(path.resolve(), root.resolve())


def _imported_modules(outline: Outline) -> set[tuple[str | None, int]]:
    """The modules ``crossfile.imported_as`` may name for the calls whose helper ``Float16Models``
    follows into another module (the value of an assignment, a return or a statement), as
    (module, level): those of the absolute names such a call resolves to, and the relative
    imports (the module imported from, and each name imported as a module of it)."""
    calls = [s.value for kind in (ast.Assign, ast.Expr, ast.Return) for s in outline.nodes(kind)
             if isinstance(s.value, ast.Call)]
    found = {(q.rpartition(".")[0], 0) for c in calls for q in outline.qualified_names(c.func)
             if "." in q and not q.startswith("torch.")}
    for statement in outline.nodes(ast.ImportFrom):
        if statement.level and statement.names[0].name != "*":
            found.add((statement.module, statement.level))
            found.update((f"{statement.module}.{a.name}" if statement.module else a.name, statement.level)
                         for a in statement.names)
    return found
