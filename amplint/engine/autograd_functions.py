"""What a custom ``torch.autograd.Function`` does that autocast can break, read from Python's
``ast`` of its code, and where the project hands it a float32 parameter.

A Function is a class derived from ``torch.autograd.Function`` (``autograd_functions``);
its ``forward`` and ``backward`` are the last methods of those names in its body, each
decorated (``custom_fwd``/``custom_bwd``, ``decorated``) or not. Under autocast, a method that
calls an op autocast casts, uses ``@``, or calls code autocast cannot see into (a kernel
launch, an extension's function) depends on autocast's state (``needs_autocast_state``).
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
import builtins
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Union

from .ast_context import AstContext
from .dtypes import call_spelling, inferred_dtype
from .outline import Outline, contains, spelled_names, walk
from .project_index import module_text, project_module
from .promotion import policies_of
from .regions import value_before

FUNCTION = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
CUSTOM = {
    "forward": frozenset({"torch.amp.custom_fwd", "torch.cuda.amp.custom_fwd",
                          "torch.amp.autocast_mode.custom_fwd", "torch.cuda.amp.autocast_mode.custom_fwd"}),
    "backward": frozenset({"torch.amp.custom_bwd", "torch.cuda.amp.custom_bwd",
                           "torch.amp.autocast_mode.custom_bwd", "torch.cuda.amp.autocast_mode.custom_bwd"}),
}
_BUILTINS = frozenset(dir(builtins))
# Modules whose functions work on Python values or pass tensors through unchanged.
_TRANSPARENT = frozenset({"torch", "math", "numpy", "operator", "functools", "itertools", "typing",
                          "warnings", "logging", "collections", "numbers", "einops"})
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
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEF = re.compile(r"(?:async[\s\\]+)?def[\s\\]+")

GRAD = "grad"  # what ``mixed_ops`` calls the gradient the backward receives

Origin = Union[str, int, None]  # GRAD, a forward argument's position (after ctx), or unknown
Method = Union[ast.FunctionDef, ast.AsyncFunctionDef]


# -- the Function's methods ---------------------------------------------------------------


def autograd_functions(ctx: AstContext) -> list[ast.ClassDef]:
    """The file's classes derived from ``torch.autograd.Function``, in source order."""
    return sorted((cls for cls in ctx.outline.nodes(ast.ClassDef)
                   if any(ctx.resolves_to(b, FUNCTION) for b in cls.bases)), key=ctx.order)


def custom_methods(cls: ast.ClassDef) -> dict[str, Method]:
    """The class's ``forward`` and ``backward``: the last definition of each name in its body."""
    return {s.name: s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name in CUSTOM}


def decorated(ctx: AstContext, method: Method, role: str) -> bool:
    """Whether a decorator of ``method`` is ``custom_fwd`` (``role`` forward) or ``custom_bwd``
    (backward)."""
    return any(ctx.resolves_to(d.func if isinstance(d, ast.Call) else d, CUSTOM[role]) for d in method.decorator_list)


def name_node(ctx: AstContext, function: Method) -> ast.Name:
    """A node where ``function``'s name is written (``ast`` gives a definition's name no
    position of its own)."""
    start = ctx.offset(function.lineno, function.col_offset)
    begin = _DEF.match(ctx.source, start).end()
    at = ctx.location(begin)
    col_offset = len(ctx.source[begin - at.column + 1:begin].encode("utf-8"))  # ast counts bytes
    node = ast.Name(function.name, ast.Load())
    node.lineno = node.end_lineno = at.row
    node.col_offset, node.end_col_offset = col_offset, col_offset + len(function.name.encode("utf-8"))
    return node


def method_of(cls: ast.ClassDef, name: str) -> Method | None:
    return next((s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == name), None)


def mentions_autocast(node: ast.AST) -> bool:
    """Whether the code reads or sets the autocast state itself (``torch.is_autocast_enabled()``,
    ``with torch.autocast(...)``, an accelerator's ``autocast()``), as checkpointing does: a
    name it spells has ``autocast`` in it."""
    return any("autocast" in name for name in spelled_names(node))


def may_be_aliased_custom(ctx: AstContext, method: Method) -> bool:
    """A decorator that may be custom_fwd/custom_bwd under an alias amplint cannot follow."""
    for decorator in method.decorator_list:
        func = decorator.func if isinstance(decorator, ast.Call) else decorator
        names = ctx.outline.qualified_names(func)
        plain = isinstance(func, ast.Name) and func.id in _PLAIN_DECORATORS
        if not plain and not (names & _PLAIN_DECORATORS) and not any(n.startswith("torch.") for n in names):
            return True
    return False


def module_level_names(ctx: AstContext) -> set[str]:
    """Names bound by assignments, functions and classes at the top of the file (where an
    extension a Function calls may be loaded: ``ext = load(...)``)."""
    names = set()
    for statement in ctx.outline.tree.body:
        if isinstance(statement, (*_FUNCTIONS, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _opaque(ctx: AstContext, call: ast.Call, module_names: set[str]) -> bool:
    """A call autocast cannot see into: a kernel launch (``kernel[grid](...)``), a function
    imported from outside torch and the standard library (an extension's ``ext.op(...)``), or
    one the file defines or binds at its top (``ext = load(...)``; ``ext.op(...)``)."""
    func = call.func
    if isinstance(func, ast.Subscript):
        return True
    names = ctx.outline.qualified_names(func)
    if names:
        return not any(n.split(".")[0] in _TRANSPARENT for n in names)
    root = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    if isinstance(func, ast.Name):
        return func.id not in _BUILTINS
    return root.id in module_names  # a method of a local value (a tensor, ctx) is not


def needs_autocast_state(ctx: AstContext, method: Method, module_names: set[str]) -> bool:
    """Whether the method's dtypes depend on autocast: it calls an op autocast casts (the
    policy table has it), uses ``@``, or calls code autocast cannot see into (``_opaque``;
    ``module_names``: ``module_level_names``)."""
    table = ctx.policy()
    nodes = list(walk(method))
    return any(isinstance(call, ast.Call) and (policies_of(table, call_spelling(ctx, call)) - {None}
                                               or _opaque(ctx, call, module_names)) for call in nodes) \
        or any(isinstance(op, ast.BinOp) and isinstance(op.op, ast.MatMult) for op in nodes)


# -- what a backward recomputes -------------------------------------------------------------


def _body_nodes(function: Method) -> Iterator[ast.AST]:
    """The nodes of the function's body (not its decorators, parameters or annotations)."""
    for statement in function.body:
        yield from walk(statement)


def stored_arguments(function: Method | None, holder: str) -> set[str]:
    """Attributes ``function`` sets on ``holder`` straight from one of its parameters
    (``ctx.fn = fn`` in a forward, ``self.block = block`` in an ``__init__``): values the
    caller handed in, such as modules and functions."""
    if function is None:
        return set()
    params = {a.arg for a in function.args.args} | ({function.args.vararg.arg} if function.args.vararg else set())
    found = set()
    for node in _body_nodes(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in params:
            found.update(t.attr for t in node.targets if isinstance(t, ast.Attribute)
                         and isinstance(t.value, ast.Name) and t.value.id == holder)
    return found


def _root(expr: ast.expr) -> ast.expr:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr


def _first_attribute(expr: ast.expr) -> str | None:
    """``a`` for ``ctx.a``, ``ctx.a.b``, ``ctx.a[i].b``: the attribute right after the root."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr.value, ast.Name):
            return expr.attr if isinstance(expr, ast.Attribute) else None
        expr = expr.value
    return None


def _given_callable(ctx: AstContext, call: ast.Call, holder: str, given: set[str]) -> bool:
    """Whether ``call`` runs something the caller handed in: ``holder.a(...)``/``holder.a.b(...)``
    with ``a`` stored from a parameter, or a local bound to such a value (``m = copy(ctx.mod)``;
    ``m.layer(x)``), not the result of calling it."""
    if ctx.outline.qualified_names(call.func):
        return False
    root = _root(call.func)
    if not isinstance(root, ast.Name):
        return False
    if root.id == holder:
        return _first_attribute(call.func) in given
    value = value_before(ctx, root)
    if value is None:
        return False
    nodes = list(walk(value))
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == holder
               and n.attr in given and id(n) not in called for n in nodes)


def _recomputed(ctx: AstContext, body: Method, holder: str, given: set[str]) -> ast.Call | None:
    """The first call of a given callable inside a ``with torch.enable_grad():`` of ``body``:
    the backward re-running part of the forward to differentiate it."""
    withs = [w for kind in (ast.With, ast.AsyncWith) for w in ctx.outline.nodes(kind) if contains(body, w)]
    for node in sorted(withs, key=ctx.order):
        if any(isinstance(item.context_expr, ast.Call) and ctx.resolves_to(item.context_expr.func, ENABLE_GRAD)
               for item in node.items):
            calls = [c for s in node.body for c in walk(s) if isinstance(c, ast.Call)]
            found = next((c for c in sorted(calls, key=ctx.order) if _given_callable(ctx, c, holder, given)), None)
            if found is not None:
                return found
    return None


def recomputation(ctx: AstContext, cls: ast.ClassDef, backward: Method) -> ast.Call | None:
    """A call in ``backward``, or in a function of this file it calls, that recomputes a
    module or function the Function was given, outside any autocast the code sets itself."""
    forward = method_of(cls, "forward")
    if forward is None or not forward.args.args or not backward.args.args or mentions_autocast(cls):
        return None
    holder = backward.args.args[0].arg
    given = stored_arguments(forward, forward.args.args[0].arg)
    found = _recomputed(ctx, backward, holder, given)
    if found is not None:
        return found
    # One level into this file's helpers that backward calls by name (``block.backward_pass(...)``).
    names = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in walk(backward)
             if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}
    helpers = [f for kind in _FUNCTIONS for f in ctx.outline.nodes(kind) if f.name in names]
    for helper in sorted(helpers, key=ctx.order):
        if contains(cls, helper) or not helper.args.args or mentions_autocast(helper):
            continue
        owner = ctx.parent(helper)
        if not isinstance(owner, ast.ClassDef):
            continue  # only methods: what they were given is what their __init__ stored on self
        holder = helper.args.args[0].arg
        methods = {s.name for s in owner.body if isinstance(s, _FUNCTIONS)}
        found = _recomputed(ctx, helper, holder, stored_arguments(method_of(owner, "__init__"), holder) - methods)
        if found is not None:
            return found
    return None


# -- what the backward does with what the forward saved -------------------------------------------------------------


def _bound_names(target: ast.expr) -> list[ast.Name]:
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound_names(e)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _binding_of(node: ast.AST) -> tuple[list[str], tuple, ast.AST | None] | None:
    """The names ``node`` binds, where it stands in source order (``AstContext.order``), and
    the node a read inside of which is not bound by it (None: none is); None for a node that
    binds none of the kinds ``_last_binding`` counts."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        at = node.optional_vars
        return [n.id for n in _bound_names(at)], (at.lineno, at.col_offset, -at.end_lineno, -at.end_col_offset), None
    elif isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
        at = node.type  # the `as name` just after the type
        return [node.name], (at.end_lineno, at.end_col_offset, -at.end_lineno, -at.end_col_offset), None
    elif isinstance(node, ast.alias) and node.asname:
        return [node.asname], (node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset), None
    else:
        return None
    return [n.id for t in targets for n in _bound_names(t)], \
        (node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset), node


def _last_binding(ctx: AstContext, function: Method, name: ast.Name) -> ast.AST | None:
    """The statement of ``function`` that last binds ``name`` before it is read there (an
    assignment, a loop, a ``with ... as``); None where only the parameter does."""
    last, last_at = None, None
    read_at = ctx.order(name)
    for node in _body_nodes(function):
        bound = _binding_of(node)
        if bound is None:
            continue
        names, at, span = bound
        if name.id in names and at < read_at and (span is None or not contains(span, name)) \
                and (last is None or at > last_at):
            last, last_at = node, at
    return last


def _carried(ctx: AstContext, function: Method, expr: ast.expr,
             leaf: Callable[[ast.expr], Origin] | None = None, depth: int = 6) -> Origin:
    """What ``expr`` carries with its dtype unchanged: ``leaf``'s answer for it, else that of
    the value a name was assigned, or of the tensor a view or transpose is taken of. Without a
    ``leaf``: a parameter of ``function`` that nothing rebinds, as its position after the
    first (``ctx``)."""
    if depth == 0:
        return None
    found = leaf(expr) if leaf is not None else None
    if found is not None:
        return found
    if isinstance(expr, ast.Name):
        value = value_before(ctx, expr)
        if value is not None:
            return _carried(ctx, function, value, leaf, depth - 1)
        params = [a.arg for a in function.args.args]
        if leaf is None and expr.id in params[1:] and _last_binding(ctx, function, expr) is None:
            return params.index(expr.id) - 1
        return None
    if isinstance(expr, ast.Attribute) and expr.attr in _KEEPS_DTYPE_ATTRIBUTES:
        return _carried(ctx, function, expr.value, leaf, depth - 1)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _KEEPS_DTYPE:
        return _carried(ctx, function, expr.func.value, leaf, depth - 1)
    return None


def _on_holder(expr: ast.expr, holder: str) -> bool:
    """``holder.<attribute>``."""
    return isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == holder


def _saved_positions(ctx: AstContext, forward: Method) -> list[Origin] | None:
    """The forward argument each tensor of ``ctx.save_for_backward(...)`` carries (None: not
    one of them); None without exactly one such call."""
    holder = forward.args.args[0].arg
    saves = [c for c in walk(forward) if isinstance(c, ast.Call) and _on_holder(c.func, holder)
             and c.func.attr == "save_for_backward"]
    if len(saves) != 1 or saves[0].keywords or any(isinstance(a, ast.Starred) for a in saves[0].args):
        return None
    return [_carried(ctx, forward, a) for a in saves[0].args]


def _stored_positions(ctx: AstContext, forward: Method) -> dict[str, Origin]:
    """The forward argument each attribute set once on ``ctx`` carries (``ctx.weight = weight``)."""
    holder = forward.args.args[0].arg
    found: dict[str, Origin] = {}
    seen: set[str] = set()
    for node in walk(forward):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if _on_holder(target, holder):
                    found[target.attr] = None if target.attr in seen else _carried(ctx, forward, node.value)
                    seen.add(target.attr)
    return found


def lower_precision_output(ctx: AstContext, forward: Method, table) -> ast.expr | None:
    """What the forward returns, where every ``return`` gives one tensor made by an op autocast
    runs in float16 (``dtypes.inferred_dtype``): the gradient the backward receives is then
    float16 too. None otherwise (a tuple, a value of unknown dtype)."""
    returned = [r.value for r in sorted((r for r in walk(forward) if isinstance(r, ast.Return)), key=ctx.order)
                if ctx.enclosing_function(r) is forward]
    if not returned or any(v is None or isinstance(v, ast.Tuple) or inferred_dtype(ctx, v, table) != "lowp"
                           for v in returned):
        return None
    return returned[0]


def _operands(ctx: AstContext, node: ast.BinOp | ast.Call) -> list[ast.expr]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    receiver = [node.func.value] if isinstance(node.func, ast.Attribute) and \
        (call_spelling(ctx, node) or "").startswith("torch.Tensor.") else []
    return receiver + [a for a in node.args if not isinstance(a, ast.Starred)] + \
        [k.value for k in node.keywords if k.arg is not None]


def mixed_ops(ctx: AstContext, table, forward: Method, backward: Method) -> list[tuple[ast.expr, int]]:
    """The ops of ``backward`` that autocast runs in lower precision (so that, outside it, they
    need one dtype) with the incoming gradient as one operand and, as another, a tensor the
    forward saved straight from one of its arguments (``ctx.save_for_backward(x, weight)``,
    ``ctx.weight = weight``), each with that argument's position (after ``ctx``). A value
    that a cast (``.to(grad.dtype)``, ``.float()``) or any op other than a view passes through
    carries neither. For a forward with one output, whose backward takes one gradient."""
    params = backward.args.args
    if len(params) != 2 or backward.args.vararg is not None or not forward.args.args:
        return []
    holder, grad = params[0].arg, params[1].arg
    saved = _saved_positions(ctx, forward) or []
    stored = _stored_positions(ctx, forward)

    def leaf(expr: ast.expr) -> Origin:
        if isinstance(expr, ast.Name):
            binding = _last_binding(ctx, backward, expr)
            if expr.id == grad:
                return GRAD if binding is None else None
            if isinstance(binding, ast.Assign) and _reads_saved(binding.value, holder):
                for target in binding.targets:
                    names = target.elts if isinstance(target, (ast.Tuple, ast.List)) else ()
                    for i, element in enumerate(names):
                        if isinstance(element, ast.Name) and element.id == expr.id \
                                and not any(isinstance(e, ast.Starred) for e in names):
                            return saved[i] if i < len(saved) else None
        if isinstance(expr, ast.Subscript) and _reads_saved(expr.value, holder) \
                and isinstance(expr.slice, ast.Constant) and type(expr.slice.value) is int:
            i = expr.slice.value
            return saved[i] if i < len(saved) else None
        if _on_holder(expr, holder):
            return stored.get(expr.attr)
        return None

    found = []
    for node in walk(backward):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) or isinstance(node, ast.Call)
                and policies_of(table, call_spelling(ctx, node)) == {"lower_precision_fp"}):
            continue
        origins = [_carried(ctx, backward, operand, leaf) for operand in _operands(ctx, node)]
        position = next((o for o in origins if isinstance(o, int)), None)
        if GRAD in origins and position is not None:
            found.append((node, position))
    return sorted(found, key=lambda f: ctx.order(f[0]))


def _reads_saved(expr: ast.expr, holder: str) -> bool:
    return _on_holder(expr, holder) and expr.attr in _SAVED


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


def _modules_mentioning(ctx: AstContext, word: str) -> list[tuple[Path, Outline]]:
    """The project's modules whose text has ``word``, parsed (this file as it is checked); the
    file's findings then depend on which modules these are and on their texts."""
    here = Path(ctx.path).resolve()
    found = []
    for path in ctx.project_mentions(word):
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
    for node in walk(value):
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
        for node in walk(m):
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
                          for n in walk(function))
            if argument.id in params and not rebound:
                return function, params.index(argument.id)
    return None


def parameter_passes(ctx: AstContext, cls: ast.ClassDef, positions: set[int]) -> list[tuple[int, Pass]]:
    """Where the project passes a module's float32 parameter as the argument at one of
    ``positions`` of the Function ``cls`` (defined in this module outside any function or
    class, also under ``if HAVE_EXT:``): in a call of its ``apply``
    (``_FusedLinearFn.apply(x, self.weight)``), of a name bound to it (``fused_linear =
    _FusedLinearFn.apply``), or of a module-level function that passes one of its parameters
    on to ``apply`` (``def fused_linear(x, weight): return _FusedLinearFn.apply(x, weight)``).
    With each, the position."""
    root = ctx.project_root()
    if root is None or ctx.enclosing(cls, (*_FUNCTIONS, ast.ClassDef)) is not None:
        return []
    here, name = Path(ctx.path).resolve(), cls.name
    found: list[tuple[int, Pass]] = []
    forward = [a.arg for a in method_of(cls, "forward").args.args[1:]]
    # (helper's module, its name, {the Function's position: the helper's position and name},
    # where it hands them to apply: its call, or the assignment of a name to apply)
    helpers: list[tuple[Path, str, dict[int, tuple[int, str]], ast.AST]] = []
    for path, outline in _modules_mentioning(ctx, name):
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
        for where, outline in _modules_mentioning(ctx, helper):
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

