"""What a custom ``torch.autograd.Function`` does that autocast can break, read from its code,
and where the project hands it a float32 parameter.

Autocast runs a Function's ``forward`` (without ``custom_fwd``) like any other code: an op it
casts makes the forward's output float16, so the gradient its ``backward`` receives is float16
too. The backward itself runs later, outside autocast (without ``custom_bwd``): an op there
that autocast would have cast (``mm``, ``linear``, ``@``: ``lower_precision_fp``) now needs its
operands in one dtype, and raises when it meets that gradient and a float32 tensor the forward
saved (``mixed_ops``, with the forward argument the saved operand carries unchanged); a module
the backward re-runs runs in float32 (``recomputation``). ``parameter_passes`` finds where the
project passes a module's float32 parameter in a forward argument's place: in a call of the
Function's ``apply``, directly or through one function of the project that calls it
(``fused_linear(x, self.weight)``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

import libcst as cst

from .outline import Outline
from .project_index import mentions_dependency, module_text, modules_mentioning, project_module
from .promotion import policies_of
from .semantics import assigned_before, call_spelling, enclosing_function, inferred_dtype, subtree

if TYPE_CHECKING:
    from .context import FileContext

# Methods and attributes whose result has the dtype of the tensor they are taken of.
_KEEPS_DTYPE = frozenset({"t", "transpose", "permute", "view", "view_as", "reshape", "reshape_as", "contiguous",
                          "detach", "clone", "unsqueeze", "squeeze", "flatten", "expand", "expand_as"})
_KEEPS_DTYPE_ATTRIBUTES = frozenset({"T", "mT", "data"})
_SAVED = frozenset({"saved_tensors", "saved_variables"})
_PARAMETER = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
# torch.nn classes that hold no ``weight`` of their own.
_CONTAINERS = frozenset({"Module", "ModuleList", "ModuleDict", "Sequential", "Parameter", "ParameterList",
                         "ParameterDict", "Identity"})
# Calls inside a parameter's construction that may make it another dtype.
_RECASTS = frozenset({"half", "bfloat16", "to", "type"})
_FLOAT32 = frozenset({"torch.float32", "torch.float"})
# Decorators that leave a method's autocast state alone; any other one amplint cannot resolve
# may be custom_fwd/custom_bwd under another name (an alias chosen by torch version).
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "torch.autograd.function.once_differentiable"})
ENABLE_GRAD = frozenset({"torch.enable_grad", "torch.autograd.enable_grad", "torch.autograd.grad_mode.enable_grad"})

GRAD = "grad"  # what ``mixed_ops`` calls the gradient the backward receives

Origin = Union[str, int, None]  # GRAD, a forward argument's position (after ctx), or unknown


# -- the Function's methods ---------------------------------------------------------------


def method_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def mentions_autocast(node: cst.CSTNode) -> bool:
    """Whether the code reads or sets the autocast state itself (``torch.is_autocast_enabled()``,
    ``with torch.autocast(...)``, an accelerator's ``autocast()``), as checkpointing does."""
    return any(isinstance(n, cst.Name) and "autocast" in n.value or
               isinstance(n, cst.Attribute) and "autocast" in n.attr.value for n in subtree(node))


def stored_arguments(function: cst.FunctionDef | None, holder: str) -> set[str]:
    """Attributes ``function`` sets on ``holder`` straight from one of its parameters
    (``ctx.fn = fn`` in a forward, ``self.block = block`` in an ``__init__``): values the
    caller handed in, such as modules and functions."""
    if function is None:
        return set()
    params = {p.name.value for p in function.params.params} | \
        ({function.params.star_arg.name.value} if isinstance(function.params.star_arg, cst.Param) else set())
    found = set()
    for node in subtree(function.body):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Name) and node.value.value in params:
            for target in node.targets:
                t = target.target
                if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == holder:
                    found.add(t.attr.value)
    return found


def _root(expr: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr


def _first_attribute(expr: cst.BaseExpression) -> str | None:
    """``a`` for ``ctx.a``, ``ctx.a.b``, ``ctx.a[i].b``: the attribute right after the root."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        if isinstance(expr.value, cst.Name):
            return expr.attr.value if isinstance(expr, cst.Attribute) else None
        expr = expr.value
    return None


def _given_callable(ctx: FileContext, call: cst.Call, holder: str, given: set[str]) -> bool:
    """Whether ``call`` runs something the caller handed in: ``holder.a(...)``/``holder.a.b(...)``
    with ``a`` stored from a parameter, or a local bound to such a value (``m = copy(ctx.mod)``;
    ``m.layer(x)``), not the result of calling it."""
    if ctx.qualified_names(call.func):
        return False
    root = _root(call.func)
    if not isinstance(root, cst.Name):
        return False
    if root.value == holder:
        return _first_attribute(call.func) in given
    value = assigned_before(ctx, root)
    if value is None:
        return False
    called = {id(n.func) for n in subtree(value) if isinstance(n, cst.Call)}
    return any(isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == holder
               and n.attr.value in given and id(n) not in called for n in subtree(value))


def _recomputed(ctx: FileContext, body: cst.FunctionDef, holder: str, given: set[str]) -> cst.Call | None:
    """The first call of a given callable inside a ``with torch.enable_grad():`` of ``body``:
    the backward re-running part of the forward to differentiate it."""
    for node in ctx.nodes(cst.With):
        if ctx.contains(body, node) and any(isinstance(item.item, cst.Call) and
                                              ctx.resolves_to(item.item.func, ENABLE_GRAD) for item in node.items):
            for call in ctx.nodes(cst.Call):
                if ctx.contains(node.body, call) and _given_callable(ctx, call, holder, given):
                    return call
    return None


def recomputation(ctx: FileContext, cls: cst.ClassDef, backward: cst.FunctionDef) -> cst.Call | None:
    """A call in ``backward``, or in a function of this file it calls, that recomputes a
    module or function the Function was given, outside any autocast the code sets itself."""
    forward = method_of(cls, "forward")
    if forward is None or not forward.params.params or not backward.params.params or mentions_autocast(cls):
        return None
    holder = backward.params.params[0].name.value
    given = stored_arguments(forward, forward.params.params[0].name.value)
    found = _recomputed(ctx, backward, holder, given)
    if found is not None:
        return found
    # One level into this file's helpers that backward calls by name (``block.backward_pass(...)``).
    names = {c.func.value if isinstance(c.func, cst.Name) else c.func.attr.value
             for c in ctx.nodes(cst.Call) if ctx.contains(backward, c) and isinstance(c.func, (cst.Name, cst.Attribute))}
    for helper in ctx.nodes(cst.FunctionDef):
        if helper.name.value not in names or ctx.contains(cls, helper) or not helper.params.params \
                or mentions_autocast(helper):
            continue
        owner = next((a for a in ctx.ancestors(helper) if isinstance(a, cst.ClassDef)), None)
        if owner is None or ctx.parent(ctx.parent(helper)) is not owner:
            continue  # only methods: what they were given is what their __init__ stored on self
        holder = helper.params.params[0].name.value
        methods = {s.name.value for s in owner.body.body if isinstance(s, cst.FunctionDef)}
        found = _recomputed(ctx, helper, holder, stored_arguments(method_of(owner, "__init__"), holder) - methods)
        if found is not None:
            return found
    return None


def module_level_names(ctx: FileContext) -> set[str]:
    """Names bound by assignments, functions and classes at the top of the file (where an
    extension a Function calls may be loaded: ``ext = load(...)``)."""
    names = set()
    for statement in ctx.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                    [small.target] if isinstance(small, cst.AnnAssign) else []
                names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names


def may_be_aliased_custom(ctx: FileContext, method: cst.FunctionDef) -> bool:
    """A decorator that may be custom_fwd/custom_bwd under an alias amplint cannot follow."""
    for decorator in method.decorators:
        func = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        names = ctx.qualified_names(func)
        plain = isinstance(func, cst.Name) and func.value in _PLAIN_DECORATORS
        if not plain and not (names & _PLAIN_DECORATORS) and not any(n.startswith("torch.") for n in names):
            return True
    return False


# -- what the backward does with what the forward saved -------------------------------------------------------------


def _bound_names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _bound_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []


def _last_binding(ctx: FileContext, function: cst.FunctionDef, name: cst.Name) -> cst.CSTNode | None:
    """The statement of ``function`` that last binds ``name`` before it is read there (an
    assignment, a loop, a ``with ... as``); None where only the parameter does."""
    last = None
    for node in subtree(function.body):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else \
            [node.target] if isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.NamedExpr)) else \
            [node.name] if isinstance(node, cst.AsName) else []
        if any(n.value == name.value for t in targets for n in _bound_names(t)) \
                and ctx.order(node) < ctx.order(name) and not ctx.contains(node, name):
            last = node if last is None or ctx.order(node) > ctx.order(last) else last
    return last


def _carried(ctx: FileContext, function: cst.FunctionDef, expr: cst.BaseExpression,
             leaf: Callable[[cst.BaseExpression], Origin] | None = None, depth: int = 6) -> Origin:
    """What ``expr`` carries with its dtype unchanged: ``leaf``'s answer for it, else that of
    the value a name was assigned, or of the tensor a view or transpose is taken of. Without a
    ``leaf``: a parameter of ``function`` that nothing rebinds, as its position after the
    first (``ctx``)."""
    if depth == 0:
        return None
    found = leaf(expr) if leaf is not None else None
    if found is not None:
        return found
    if isinstance(expr, cst.Name):
        value = assigned_before(ctx, expr)
        if value is not None:
            return _carried(ctx, function, value, leaf, depth - 1)
        params = [p.name.value for p in function.params.params]
        if leaf is None and expr.value in params[1:] and _last_binding(ctx, function, expr) is None:
            return params.index(expr.value) - 1
        return None
    if isinstance(expr, cst.Attribute) and expr.attr.value in _KEEPS_DTYPE_ATTRIBUTES:
        return _carried(ctx, function, expr.value, leaf, depth - 1)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _KEEPS_DTYPE:
        return _carried(ctx, function, expr.func.value, leaf, depth - 1)
    return None


def _saved_positions(ctx: FileContext, forward: cst.FunctionDef) -> list[Origin] | None:
    """The forward argument each tensor of ``ctx.save_for_backward(...)`` carries (None: not
    one of them); None without exactly one such call."""
    holder = forward.params.params[0].name.value
    saves = [c for c in ctx.nodes_within(cst.Call, forward) if isinstance(c.func, cst.Attribute)
             and c.func.attr.value == "save_for_backward" and isinstance(c.func.value, cst.Name)
             and c.func.value.value == holder]
    if len(saves) != 1 or any(a.star or a.keyword for a in saves[0].args):
        return None
    return [_carried(ctx, forward, a.value) for a in saves[0].args]


def _stored_positions(ctx: FileContext, forward: cst.FunctionDef) -> dict[str, Origin]:
    """The forward argument each attribute set once on ``ctx`` carries (``ctx.weight = weight``)."""
    holder = forward.params.params[0].name.value
    found: dict[str, Origin] = {}
    seen: set[str] = set()
    for node in ctx.nodes_within(cst.Assign, forward):
        for target in node.targets:
            t = target.target
            if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == holder:
                name = t.attr.value
                found[name] = None if name in seen else _carried(ctx, forward, node.value)
                seen.add(name)
    return found


def lower_precision_output(ctx: FileContext, forward: cst.FunctionDef, table) -> cst.BaseExpression | None:
    """What the forward returns, where every ``return`` gives one tensor made by an op autocast
    runs in float16 (``semantics.inferred_dtype``): the gradient the backward receives is then
    float16 too. None otherwise (a tuple, a value of unknown dtype)."""
    returned = [r.value for r in ctx.nodes_within(cst.Return, forward) if enclosing_function(ctx, r) is forward]
    if not returned or any(v is None or isinstance(v, cst.Tuple) or inferred_dtype(ctx, v, table) != "lowp"
                           for v in returned):
        return None
    return returned[0]


def _operands(ctx: FileContext, node: cst.CSTNode) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BinaryOperation):
        return [node.left, node.right]
    receiver = [node.func.value] if isinstance(node.func, cst.Attribute) and \
        (call_spelling(ctx, node) or "").startswith("torch.Tensor.") else []
    return receiver + [a.value for a in node.args if not a.star]


def mixed_ops(ctx: FileContext, table, forward: cst.FunctionDef, backward: cst.FunctionDef
              ) -> list[tuple[cst.CSTNode, int]]:
    """The ops of ``backward`` that autocast runs in lower precision (so that, outside it, they
    need one dtype) with the incoming gradient as one operand and, as another, a tensor the
    forward saved straight from one of its arguments (``ctx.save_for_backward(x, weight)``,
    ``ctx.weight = weight``), each with that argument's position (after ``ctx``). A value
    that a cast (``.to(grad.dtype)``, ``.float()``) or any op other than a view passes through
    carries neither. For a forward with one output, whose backward takes one gradient."""
    params = backward.params.params
    if len(params) != 2 or isinstance(backward.params.star_arg, cst.Param) or not forward.params.params:
        return []
    holder, grad = params[0].name.value, params[1].name.value
    saved = _saved_positions(ctx, forward) or []
    stored = _stored_positions(ctx, forward)

    def leaf(expr: cst.BaseExpression) -> Origin:
        if isinstance(expr, cst.Name):
            if expr.value == grad:
                return GRAD if _last_binding(ctx, backward, expr) is None else None
            binding = _last_binding(ctx, backward, expr)
            if isinstance(binding, cst.Assign) and _reads_saved(binding.value, holder):
                for target in binding.targets:
                    names = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else ()
                    for i, element in enumerate(names):
                        if isinstance(element.value, cst.Name) and element.value.value == expr.value \
                                and not any(isinstance(e, cst.StarredElement) for e in names):
                            return saved[i] if i < len(saved) else None
        if isinstance(expr, cst.Subscript) and _reads_saved(expr.value, holder) and len(expr.slice) == 1 \
                and isinstance(expr.slice[0].slice, cst.Index) and isinstance(expr.slice[0].slice.value, cst.Integer):
            i = int(expr.slice[0].slice.value.value)
            return saved[i] if i < len(saved) else None
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == holder:
            return stored.get(expr.attr.value)
        return None

    found = []
    for node in ctx.nodes_within(cst.BinaryOperation, backward) + ctx.nodes_within(cst.Call, backward):
        if isinstance(node, cst.BinaryOperation) and not isinstance(node.operator, cst.MatrixMultiply):
            continue
        if isinstance(node, cst.Call) and policies_of(table, call_spelling(ctx, node)) != {"lower_precision_fp"}:
            continue
        origins = [_carried(ctx, backward, operand, leaf) for operand in _operands(ctx, node)]
        position = next((o for o in origins if isinstance(o, int)), None)
        if GRAD in origins and position is not None:
            found.append((node, position))
    return sorted(found, key=lambda f: ctx.order(f[0]))


def _reads_saved(expr: cst.BaseExpression, holder: str) -> bool:
    return isinstance(expr, cst.Attribute) and expr.attr.value in _SAVED and isinstance(expr.value, cst.Name) \
        and expr.value.value == holder


# -- where the project applies it ------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """A call that hands a module's float32 parameter to a Function: where (``path``, ``row``),
    its code, what is passed (``parameter``: "`self.weight`, an `nn.Parameter` that
    `FusedLinear` makes at line 10"), the method it is in, and, where it calls a function of the
    project that calls ``apply`` (``helper``), that function's name and its ``apply`` call
    (path, row, code)."""
    path: Path
    row: int
    code: str
    parameter: str
    method: str
    helper: tuple[str, Path, int, str] | None = None


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 80 else text[:77] + "..."


def _modules_mentioning(ctx: FileContext, root: Path, word: str) -> list[tuple[Path, Outline]]:
    """The project's modules whose text has ``word``, parsed (this file as it is checked); the
    file's findings then depend on which modules these are and on their texts."""
    here = Path(ctx.path).resolve()
    ctx.dependencies.add(mentions_dependency(root, word))
    found = []
    for path in modules_mentioning(root, word):
        text = ctx.source if path.resolve() == here else module_text(path)
        outline = Outline.parse(text) if text is not None else None
        if outline is not None:
            found.append((path, outline))
    return found


def _bindings(root: Path, path: Path, outline: Outline, target: Path, name: str) -> tuple[set[str], set[str]]:
    """The names that module ``path`` binds to ``name`` of module ``target`` (directly, or as a
    package re-exports it), and those it binds to that module."""
    direct = {name} if path.resolve() == target else set()
    modules = set()

    def resolved(module: str | None, level: int, importer: Path = path) -> Path | None:
        found = project_module(root, importer, module, level)
        return found.resolve() if found is not None else None

    for node in outline.nodes(ast.ImportFrom):
        source = resolved(node.module, node.level)
        for alias in node.names:
            local = alias.asname or alias.name
            if alias.name == name and source is not None \
                    and (source == target or _reexports(root, source, target, name)):
                direct.add(local)
            elif resolved(f"{node.module}.{alias.name}" if node.module else alias.name, node.level) == target:
                modules.add(local)
    for node in outline.nodes(ast.Import):
        modules.update(a.asname for a in node.names if a.asname and resolved(a.name, 0) == target)
    return direct, modules


def _reexports(root: Path, package: Path, target: Path, name: str) -> bool:
    """Whether module ``package`` (an ``__init__.py``) imports ``name`` from ``target``."""
    if package.name != "__init__.py":
        return False
    outline = Outline.parse(module_text(package) or "")
    return outline is not None and any(
        any(a.name == name for a in node.names) and (found := project_module(root, package, node.module, node.level))
        is not None and found.resolve() == target for node in outline.nodes(ast.ImportFrom))


def _refers(expr: ast.expr, direct: set[str], modules: set[str], name: str) -> bool:
    return isinstance(expr, ast.Name) and expr.id in direct or isinstance(expr, ast.Attribute) \
        and expr.attr == name and isinstance(expr.value, ast.Name) and expr.value.id in modules


def _argument(call: ast.Call, position: int, keyword: str | None = None) -> ast.expr | None:
    if any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return None
    if position < len(call.args):
        return call.args[position]
    return next((k.value for k in call.keywords if keyword is not None and k.arg == keyword), None)


def _methods(outline: Outline) -> list[tuple[ast.ClassDef, ast.FunctionDef]]:
    return [(cls, m) for cls in outline.nodes(ast.ClassDef) for m in cls.body
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.args.args]


def _within(outer: ast.AST, inner: ast.AST) -> bool:
    return (outer.lineno, outer.col_offset) <= (inner.lineno, inner.col_offset) and \
        (inner.end_lineno, inner.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


def _float32(outline: Outline, value: ast.expr) -> bool:
    """Whether nothing in the construction ``value`` picks another dtype (``dtype=``, ``.half()``)."""
    for node in ast.walk(value):
        if isinstance(node, ast.keyword) and (node.arg is None or node.arg == "dtype"
                                              and outline.qualified_names(node.value).isdisjoint(_FLOAT32)):
            return False  # `**factory_kwargs` may hold a dtype too
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _RECASTS:
            return False
    return True


def _assigned(cls: ast.ClassDef, attribute: str) -> list[ast.expr]:
    """What the methods of ``cls`` assign to ``self.<attribute>`` (``self``: each one's first parameter)."""
    found = []
    for m in cls.body:
        if not isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) or not m.args.args:
            continue
        holder = m.args.args[0].arg
        for node in ast.walk(m):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) and node.value is not None else []
            if any(isinstance(t, ast.Attribute) and t.attr == attribute and isinstance(t.value, ast.Name)
                   and t.value.id == holder for t in targets):
                found.append(node.value)
    return [v for v in found if not (isinstance(v, ast.Constant) and v.value is None)]


def _layer(outline: Outline, expr: ast.expr) -> str | None:
    """The ``torch.nn`` layer class (one that holds a ``weight``) ``expr`` names."""
    return next((n for n in sorted(outline.qualified_names(expr)) if n.startswith("torch.nn.")
                 and n.count(".") == 2 and n.rsplit(".", 1)[1][:1].isupper()
                 and n.rsplit(".", 1)[1] not in _CONTAINERS), None)


def _parameter(outline: Outline, call: ast.Call, value: ast.expr) -> tuple[str, str] | None:
    """What ``value``, passed in ``call`` inside a method, is when it is a float32 parameter of
    that method's module, and the method: ``self.w`` that the class sets to an ``nn.Parameter``,
    ``self.weight``/``self.bias`` of a class derived from a ``torch.nn`` layer, or the
    ``weight``/``bias`` of a ``torch.nn`` layer the class builds (``self.proj.weight``)."""
    enclosing = [(c, m) for c, m in _methods(outline) if _within(m, call)]
    if not enclosing:
        return None
    cls, function = max(enclosing, key=lambda cm: (cm[1].lineno, cm[1].col_offset))
    holder = function.args.args[0].arg
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _KEEPS_DTYPE \
            or isinstance(value, ast.Attribute) and value.attr in _KEEPS_DTYPE_ATTRIBUTES:
        value = value.func.value if isinstance(value, ast.Call) else value.value
    if not isinstance(value, ast.Attribute):
        return None
    where = f"{cls.name}.{function.name}"
    if isinstance(value.value, ast.Name) and value.value.id == holder:
        made = _assigned(cls, value.attr)
        if made and all(isinstance(v, ast.Call) and not outline.qualified_names(v.func).isdisjoint(_PARAMETER)
                        and _float32(outline, v) for v in made):
            return f"`{_shown(value)}`, an `nn.Parameter` that `{cls.name}` makes at line {made[0].lineno}", where
        base = next((b for b in map(lambda b: _layer(outline, b), cls.bases) if b), None)
        if not made and value.attr in ("weight", "bias") and base is not None:
            return f"`{_shown(value)}`, the parameter `{cls.name}` inherits from `{base}`", where
        return None
    inner = value.value
    if value.attr in ("weight", "bias") and isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) \
            and inner.value.id == holder:
        made = _assigned(cls, inner.attr)
        layers = [_layer(outline, v.func) if isinstance(v, ast.Call) and _float32(outline, v) else None for v in made]
        if layers and all(layers):
            return f"`{_shown(value)}`, a parameter of the `{layers[0]}` that `{cls.name}` builds at line " \
                   f"{made[0].lineno}", where
    return None


def _helper_of(outline: Outline, call: ast.Call, argument: ast.expr) -> tuple[ast.FunctionDef, int] | None:
    """The module-level function whose body makes ``call`` with ``argument`` one of its own
    parameters, passed on untouched, and that parameter's position."""
    if not isinstance(argument, ast.Name):
        return None
    for function in outline.tree.body:
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and _within(function, call):
            params = [a.arg for a in function.args.posonlyargs + function.args.args]
            rebound = any(isinstance(n, ast.Name) and n.id == argument.id and not isinstance(n.ctx, ast.Load)
                          for n in ast.walk(function))
            if argument.id in params and not rebound:
                return function, params.index(argument.id)
    return None


def parameter_passes(ctx: FileContext, cls: cst.ClassDef, positions: set[int]) -> list[tuple[int, Pass]]:
    """Where the project passes a module's float32 parameter as the argument at one of
    ``positions`` of the Function ``cls`` (defined in this module outside any function or
    class, also under ``if HAVE_EXT:``): in a call of its ``apply``
    (``_FusedLinearFn.apply(x, self.weight)``), of a name bound to it (``fused_linear =
    _FusedLinearFn.apply``), or of a module-level function that passes one of its parameters
    on to ``apply`` (``def fused_linear(x, weight): return _FusedLinearFn.apply(x, weight)``).
    With each, the position."""
    root = ctx.project_root()
    if root is None or ctx.enclosing(cls, (cst.FunctionDef, cst.ClassDef)) is not None:
        return []
    here, name = Path(ctx.path).resolve(), cls.name.value
    found: list[tuple[int, Pass]] = []
    forward = [p.name.value for p in method_of(cls, "forward").params.params[1:]]
    # (helper's module, its name, {the Function's position: the helper's position and name},
    # where it hands them to apply: its call, or the assignment of a name to apply)
    helpers: list[tuple[Path, str, dict[int, tuple[int, str]], ast.AST]] = []
    for path, outline in _modules_mentioning(ctx, root, name):
        direct, modules = _bindings(root, path, outline, here, name)
        if not direct and not modules:
            continue
        for statement in outline.tree.body:  # fused_linear = _FusedLinearFn.apply
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Attribute) \
                    and statement.value.attr == "apply" and _refers(statement.value.value, direct, modules, name):
                helpers += [(path, t.id, {p: (p, forward[p]) for p in positions if p < len(forward)}, statement)
                            for t in statement.targets if isinstance(t, ast.Name)]
        for call in outline.nodes(ast.Call):
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "apply"
                    and _refers(call.func.value, direct, modules, name)):
                continue
            for position in sorted(positions):
                argument = _argument(call, position)
                passed = _parameter(outline, call, argument) if argument is not None else None
                if passed is not None:
                    found.append((position, Pass(path, call.lineno, _shown(call), *passed)))
                elif argument is not None and (helper := _helper_of(outline, call, argument)) is not None:
                    function, own = helper
                    params = [a.arg for a in function.args.posonlyargs + function.args.args]
                    helpers.append((path, function.name, {position: (own, params[own])}, call))
    for path, helper, mapping, applied in helpers:
        target = path.resolve()
        for where, outline in _modules_mentioning(ctx, root, helper):
            direct, modules = _bindings(root, where, outline, target, helper)
            for call in outline.nodes(ast.Call):
                if not _refers(call.func, direct, modules, helper):
                    continue
                for position, (own, keyword) in mapping.items():
                    argument = _argument(call, own, keyword)
                    passed = _parameter(outline, call, argument) if argument is not None else None
                    if passed is not None:
                        via = (helper, path, applied.lineno, _shown(applied))
                        found.append((position, Pass(where, call.lineno, _shown(call), *passed, helper=via)))
    return found

