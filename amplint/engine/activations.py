"""Which values of a file follow the model's dtype, on Python's ``ast``: a value known to be
float32 whatever the model runs in (a factory without ``dtype=``, ``.float()``, an op autocast
runs in float32), half (``.half()``, ``dtype=torch.bfloat16``), half under autocast (what a
``lower_precision_fp`` op makes of values of unknown dtype), an activation (a tensor argument,
a module's output: half in a half model, and mostly under autocast), or the output of the
model a loss calls, half under the autocast its project enables in another file; with the call
that made a float32 value so. A name stands for its binding before the read (``regions.
value_before``, an unpacking's element, a parameter with the values the file passes for it,
a list with what ``append`` added to it); what the policy tables say of an op comes from
``promotion``, factories from ``dtypes``."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from .ast_context import AstContext
from .crossfile import named_loss_place
from .enabling import enabling_site
from .dtypes import call_spelling, factory, float32_factory, tensor_input
from .outline import contains, named_parameters, parameter_defaults
from .promotion import FP32_FAMILY, casts_back, policies_of
from .regions import autocast_region, dtype_of, has_star_args, value_before
from .summaries import checked_module, receiver

FLOAT32, HALF, AUTOCAST_HALF, ACTIVATION = "float32", "half", "autocast half", "activation"
PROJECT_HALF = "half under the project's autocast"
HALF_KINDS = (HALF, AUTOCAST_HALF, ACTIVATION, PROJECT_HALF)
# What follows the activations' dtype into the modules and ops it goes through.
ACTIVATION_KINDS = (HALF, ACTIVATION, PROJECT_HALF)
# Half only under autocast or in a half model (a lowered op's output, a tensor argument, a
# module's output; a loss's model output under another file's autocast).
GUESSED_KINDS = (AUTOCAST_HALF, ACTIVATION, PROJECT_HALF)

_LIKE_FACTORIES = frozenset({"torch.zeros_like", "torch.ones_like", "torch.empty_like",
                             "torch.full_like", "torch.rand_like", "torch.randn_like"})
# Methods and functions whose result is not a floating tensor, or whose float result does not
# follow the input's dtype.
_NOT_FLOAT = frozenset({
    "long", "int", "bool", "byte", "short", "char", "double", "argmax", "argmin", "argsort",
    "nonzero", "size", "dim", "numel", "item", "tolist", "numpy", "eq", "ne", "lt", "le", "gt",
    "ge", "isnan", "isinf", "isfinite", "logical_and", "logical_or", "logical_not", "logical_xor",
    "all", "any", "searchsorted", "bucketize", "multinomial", "unique", "count_nonzero",
    "is_floating_point", "type", "arange", "randint", "randperm",
})
# Those of them that make integers or booleans.
_INTEGRAL = _NOT_FLOAT - {"double", "size", "dim", "numel", "item", "tolist", "numpy", "type"}
# Tensor methods that return the receiver's values (or a view of them) in its dtype.
_SAME_DTYPE_METHODS = frozenset({"view", "reshape", "unsqueeze", "squeeze", "expand", "flatten", "transpose",
                                 "permute", "contiguous", "detach", "clone", "repeat", "expand_as", "view_as",
                                 "reshape_as"})
# ... and those that keep an integer an integer.
_RESHAPES = ("view", "reshape", "unsqueeze", "squeeze", "expand", "flatten", "transpose", "permute",
             "contiguous", "to")
# Functions returning (values, indices): only the values follow the input's dtype.
_VALUES_AND_INDICES = frozenset({"max", "min", "topk", "sort", "kthvalue", "median", "mode",
                                 "cummax", "cummin"})
_CONCATENATIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack",
                             "torch.hstack", "torch.vstack", "torch.dstack"})
# In-place ops that need the source in the destination's dtype: the source's position and
# keyword. An index-put (`dest[i] = src`) is the same op.
STRICT_METHODS = {
    "scatter_": (2, "src"), "scatter_add_": (2, "src"), "scatter_reduce_": (2, "src"),
    "index_add_": (2, "source"), "index_copy_": (2, "source"), "index_put_": (1, "values"),
    "masked_scatter_": (1, "source"),
}
_RECURRENT = frozenset({"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN", "torch.nn.LSTMCell",
                        "torch.nn.GRUCell", "torch.nn.RNNCell"})
# Attributes of a tensor that are that tensor's values, in its dtype.
_SAME_VALUE_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real"})
_NON_FLOAT_HINTS = ("ids", "idx", "index", "indices", "mask", "len", "label", "target", "count")
# Builtins that never return a tensor.
_BUILTINS = frozenset({"len", "int", "float", "bool", "str", "range", "isinstance", "hasattr",
                       "zip", "enumerate", "tuple", "list", "dict", "set", "print", "round",
                       "sorted", "id", "type", "repr", "format", "slice"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEPTH = 24


@dataclass(frozen=True)
class Value:
    kind: str | None  # one of the kinds above, or None: not known to be a floating tensor
    # The call that made it float32 where that may be a mistake: a factory without `dtype=`, or
    # `.float()` of integers.
    origin: ast.Call | None = None


UNKNOWN = Value(None)


@dataclass(frozen=True)
class Binding:
    """What a name read somewhere was last bound to before the read."""
    statement: ast.AST  # the assignment, loop or `with` target; the function for a parameter
    value: ast.expr | None  # None: a loop or `with` target, or a parameter
    index: int | None = None  # the name's position in an unpacking of ``value``
    parameter: ast.arg | None = None


def callee_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def binding(ctx: AstContext, name: ast.Name) -> Binding | None:
    """The binding of ``name`` where it is read: the plain assignment ``regions.value_before``
    shows, else an unpacking's element, a ``for`` or ``with`` target, or, where its function
    binds it nowhere before, the function's parameter; through ``x += ...``. None where
    nothing binds it there or the binding is of another kind (an import, a comprehension's)."""
    value = value_before(ctx, name)
    if value is not None:
        return Binding(ctx.parent(value), value)
    module = checked_module(ctx)
    if module is None:
        return None
    function = ctx.enclosing_function(name)
    at, last = ctx.order(name), None
    for node, _ in module.placed(function or ctx.outline.tree).get(name.id, ()):
        if ctx.order(node) >= at:
            break
        if not contains(node, name):  # `x = f(x)` reads the binding before it
            last = node
    if last is None:
        parameter = next((p for p in named_parameters(function.args) if p.arg == name.id), None) if function else None
        return Binding(function, None, parameter=parameter) if parameter is not None else None
    if isinstance(last, ast.AugAssign):  # an update in place keeps what the name holds
        return binding(ctx, last.target) if isinstance(last.target, ast.Name) else None
    if isinstance(last, ast.Assign):
        return next((Binding(last, last.value, i) for t in last.targets if isinstance(t, (ast.Tuple, ast.List))
                     for i, e in enumerate(t.elts) if isinstance(e, ast.Name) and e.id == name.id), None)
    if isinstance(last, (ast.For, ast.AsyncFor)) or isinstance(ctx.parent(last), ast.withitem):
        return Binding(last, None)
    return None


def bound_before(ctx: AstContext, chain: ast.expr, node: ast.AST) -> bool:
    """Whether ``chain``, a name or a chain of attributes and subscripts of one
    (``self.weight``, ``batch["x"]``), means at ``node`` what it means where it is: the binding
    its name has there is a parameter, or was made before ``node`` in the same function."""
    root = chain
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value
    if not isinstance(root, ast.Name) or ctx.enclosing_function(root) is not ctx.enclosing_function(node):
        return False
    found = binding(ctx, root)
    return found is not None and (found.parameter is not None or (
        ctx.order(found.statement) < ctx.order(node) and not contains(found.statement, node)))


def _tensor_parameter(ctx: AstContext, function: ast.AST, param: ast.arg) -> bool:
    """A parameter that plausibly holds a floating tensor: not ``self``, not named like indices
    or a mask, not annotated with anything but a tensor, no number or string by default."""
    name = param.arg
    if name in ("self", "cls") or any(h in name.lower() for h in _NON_FLOAT_HINTS):
        return False
    default = parameter_defaults(function.args).get(param)
    if isinstance(default, ast.Constant) and type(default.value) in (int, float, str, bytes, bool):
        return False
    return param.annotation is None or "Tensor" in ctx.code(param.annotation)


def integral(ctx: AstContext, expr: ast.expr, depth: int = _DEPTH) -> bool:
    """A boolean or integer tensor: a comparison, ``~m``, ``.long()``, ``argmax``, or a name, an
    index or a reshape of one."""
    if depth == 0:
        return False
    if isinstance(expr, ast.Compare) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Invert)):
        return True
    if isinstance(expr, ast.Name):
        found = binding(ctx, expr)
        return found is not None and found.value is not None and found.index is None \
            and integral(ctx, found.value, depth - 1)
    if isinstance(expr, ast.Subscript):
        return integral(ctx, expr.value, depth - 1)
    if isinstance(expr, ast.Call):
        name = callee_name(expr)
        return name in _INTEGRAL or (isinstance(expr.func, ast.Attribute) and name in _RESHAPES
                                     and integral(ctx, expr.func.value, depth - 1))
    return False


def tensor_index(ctx: AstContext, expr: ast.expr, depth: int = 4) -> bool:
    """An index that makes ``x[i] = v`` an index-put (a tensor, a mask, a list), which needs
    ``v`` in ``x``'s dtype, rather than a copy into a slice (ints, slices), which casts."""
    if depth == 0:
        return False
    if isinstance(expr, (ast.Compare, ast.List)) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Invert)):
        return True
    if isinstance(expr, ast.Tuple):  # an index per dimension (`sel = (slice(None), slice(0, k))`)
        return any(tensor_index(ctx, e, depth - 1) for e in expr.elts)
    if isinstance(expr, ast.Subscript):
        return tensor_index(ctx, expr.value, depth - 1)
    if isinstance(expr, ast.Call):
        return not (isinstance(expr.func, ast.Name) and expr.func.id in _BUILTINS) \
            and callee_name(expr) not in ("item", "size", "numel", "dim", "tolist")
    if isinstance(expr, ast.Name):
        found = binding(ctx, expr)
        if found is None or found.parameter is not None:
            return found is not None and any(h in expr.id.lower() for h in ("idx", "index", "indices", "mask"))
        if found.value is None:
            return False
        if found.index is not None:
            return isinstance(found.value, ast.Call) and tensor_index(ctx, found.value, depth - 1)
        return tensor_index(ctx, found.value, depth - 1)
    return False


def index_elements(target: ast.Subscript) -> list[ast.expr]:
    """The indices of ``x[i, j]`` that are no slices (``:``, ``a:b``)."""
    index = target.slice
    elements = index.elts if isinstance(index, ast.Tuple) else [index]
    return [e for e in elements if not isinstance(e, ast.Slice)]


def index_puts(ctx: AstContext, within: set[int]) -> list[tuple[ast.Assign, ast.expr]]:
    """The assignments ``x[i] = v`` that are index-puts (``tensor_index``), with their ``x``; in
    the functions ``within`` (by id as ``outline.scopes`` gives them, 0 for the top level)."""
    scopes = ctx.outline.scopes
    return [(node, target.value) for node in sorted(ctx.outline.nodes(ast.Assign), key=ctx.order)
            if scopes[id(node)] in within for target in node.targets
            if isinstance(target, ast.Subscript) and any(tensor_index(ctx, i) for i in index_elements(target))]


def strict_calls(ctx: AstContext, within: set[int]) -> list[tuple[ast.Call, ast.expr, ast.expr, str]]:
    """The calls of in-place ops that need their source in their tensor's dtype (``x.scatter_(d,
    i, src)``), with the tensor, the source and the op's name; in the functions ``within``."""
    found = []
    for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
        method = receiver(call)
        if method is not None and method[1] in STRICT_METHODS and ctx.outline.scopes[id(call)] in within:
            position, keyword = STRICT_METHODS[method[1]]
            positional = [a for a in call.args if not isinstance(a, ast.Starred)]
            source = next((k.value for k in call.keywords if k.arg == keyword),
                          positional[position] if len(positional) > position else None)
            if source is not None:
                found.append((call, method[0], source, method[1]))
    return found


def promoting_ops(ctx: AstContext, within: set[int]) -> list[tuple[ast.AST, list[ast.expr]]]:
    """The ops that promote their operands to a common dtype: a concatenation of a list or
    tuple of tensors (``torch.cat([x, pad])``), ``+ - * /``; with their operands; in the
    functions ``within``."""
    scopes = ctx.outline.scopes
    found = [(call, [e for e in tensors.elts if not isinstance(e, ast.Starred)])
             for call in ctx.outline.calls_to(_CONCATENATIONS)
             if scopes[id(call)] in within and isinstance(tensors := first_argument(call), (ast.List, ast.Tuple))]
    found += [(node, [node.left, node.right]) for node in ctx.outline.nodes(ast.BinOp)
              if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) and scopes[id(node)] in within]
    return sorted(found, key=lambda f: ctx.order(f[0]))


def float32_makers(ctx: AstContext, casts: set[int] | None) -> list[ast.Call]:
    """The calls that make a float32 tensor where the model may run in half: a factory without
    ``dtype=`` (``dtypes.float32_factory``) and ``.float()`` of integers (``integral``) in the
    functions ``casts`` (by id as ``outline.scopes`` gives them; None: in every function)."""
    scopes = ctx.outline.scopes
    return [c for c in ctx.outline.nodes(ast.Call) if float32_factory(ctx, c) is not None or (
        isinstance(c.func, ast.Attribute) and c.func.attr == "float" and not c.args and not c.keywords
        and (casts is None or scopes[id(c)] in casts) and integral(ctx, c.func.value))]


def argument_values(call: ast.Call) -> list[ast.expr]:
    """The values of the call's arguments, in the order they are written."""
    return [a.value if isinstance(a, (ast.Starred, ast.keyword)) else a
            for a in sorted([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset))]


def first_argument(call: ast.Call) -> ast.expr | None:
    """The value of the call's first argument as written, positional or not."""
    first = min([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset), default=None)
    return first.value if isinstance(first, (ast.Starred, ast.keyword)) else first


def _device_like(ctx: AstContext, expr: ast.expr, depth: int = _DEPTH) -> bool:
    """A device argument of ``.to``: ``x.device``, a string, ``torch.device(...)``, or a name
    bound to one of those or named like one."""
    if isinstance(expr, ast.Attribute):
        return expr.attr == "device"
    if isinstance(expr, ast.Constant):
        return type(expr.value) in (str, int)
    if isinstance(expr, ast.Call):
        return ctx.resolves_to(expr.func, {"torch.device"}) is not None
    if isinstance(expr, ast.Name) and depth:
        if "device" in expr.id.lower():
            return True
        found = binding(ctx, expr)
        return found is not None and found.value is not None and found.index is None \
            and _device_like(ctx, found.value, depth - 1)
    return False


def in_model(ctx: AstContext, node: ast.AST) -> bool:
    """In a method of a module class (one that defines ``forward`` or derives from a
    ``...Module``), or in an autocast region: where the activations may be half."""
    if autocast_region(ctx, node) is not None:
        return True
    cls = ctx.enclosing(node, ast.ClassDef)
    return cls is not None and (any(ctx.code(b).endswith("Module") for b in cls.bases) or any(
        isinstance(s, _FUNCTIONS) and s.name == "forward" for s in cls.body))


def _makes_half(ctx: AstContext, call: ast.Call) -> bool:
    """``x.half()``, ``x.bfloat16()``, ``x.to(torch.float16)``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in ("half", "bfloat16"):
        return not call.args and not call.keywords
    return func.attr == "to" and any(dtype_of(ctx, a) in ("float16", "bfloat16")
                                     for a in [*call.args, *(k.value for k in call.keywords)])


def modules_made_half(ctx: AstContext) -> dict[str, ast.Call]:
    """What the file makes half with `model.half()` (or `.bfloat16()`, `.to(torch.float16)`)
    as a statement of its own, or `model = ....half()`: by its code, the call that does."""
    if "_modules_made_half" not in ctx.__dict__:
        found = {}
        for call in sorted((c for c in ctx.outline.nodes(ast.Call) if _makes_half(ctx, c)), key=ctx.order):
            parent = ctx.parent(call)
            if isinstance(parent, ast.Expr):
                found[ctx.code(call.func.value)] = call
            elif isinstance(parent, ast.Assign) and len(parent.targets) == 1:
                found[ctx.code(parent.targets[0])] = call
        ctx.__dict__["_modules_made_half"] = found
    return ctx.__dict__["_modules_made_half"]


def recurrent_calls(ctx: AstContext) -> list[tuple[ast.Call, ast.expr | None, list[ast.expr]]]:
    """Calls ``self.rnn(x, hx)`` of a module's ``nn.LSTM``/``GRU``/``RNN`` (set as
    ``self.rnn = nn.LSTM(...)`` in its class), with their input and their state (``hx``, or
    each element of a tuple ``(h0, c0)``)."""
    built = {}  # by id of the class: the attributes its code sets to a recurrent module
    for a in ctx.outline.nodes(ast.Assign):
        target = a.targets[0]
        if len(a.targets) == 1 and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                and target.value.id == "self" and isinstance(a.value, ast.Call) \
                and ctx.resolves_to(a.value.func, _RECURRENT) is not None:
            cls = a
            while (cls := ctx.enclosing(cls, ast.ClassDef)) is not None:
                built.setdefault(id(cls), set()).add(target.attr)
    found = []
    for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order) if built else ():
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
            continue
        cls = call
        while (cls := ctx.enclosing(cls, ast.ClassDef)) is not None:
            if func.attr in built.get(id(cls), ()):
                positional = [a for a in call.args if not isinstance(a, ast.Starred)]
                hidden = next((k.value for k in call.keywords if k.arg == "hx"),
                              positional[1] if len(positional) > 1 else None)
                if hidden is not None:
                    states = [e for e in hidden.elts if not isinstance(e, ast.Starred)] \
                        if isinstance(hidden, ast.Tuple) else []
                    found.append((call, first_argument(call), states or [hidden]))
                break
    return found


def _calls_by_name(ctx: AstContext) -> dict[str, list[tuple[ast.Call, int]]]:
    """The file's calls ``f(...)`` and ``self.f(...)`` without ``*args`` or ``**kwargs``, by
    ``f``, with how many arguments ``self`` takes (0 or 1)."""
    if "_calls_by_name" not in ctx.__dict__:
        found: dict[str, list[tuple[ast.Call, int]]] = {}
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            func = call.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                name, offset = func.attr, 1
            else:
                name, offset = (func.id if isinstance(func, ast.Name) else None), 0
            if name is not None and not has_star_args(call):
                found.setdefault(name, []).append((call, offset))
        ctx.__dict__["_calls_by_name"] = found
    return ctx.__dict__["_calls_by_name"]


def passed_for(ctx: AstContext, function: ast.AST, param: ast.arg) -> list[ast.expr]:
    """What the file passes for ``param`` where it calls ``function`` by its name (or as
    ``self.name``): by keyword, or by position; empty where it passes none it can read."""
    names = [p.arg for p in [*function.args.posonlyargs, *function.args.args]]
    position = names.index(param.arg) if param.arg in names else None
    if position is None and param not in function.args.kwonlyargs:
        return []
    found = []
    for call, offset in _calls_by_name(ctx).get(function.name, ()):
        keyword = next((k.value for k in call.keywords if k.arg == param.arg), None)
        if keyword is not None:
            found.append(keyword)
        elif position is not None and 0 <= position - offset < len(call.args):
            found.append(call.args[position - offset])
    return found


def _appended(ctx: AstContext, scope: ast.AST) -> dict[str, list[ast.Call]]:
    """The calls ``name.append(v)`` of a function's own code (or the top level's), by name."""
    cache = ctx.__dict__.setdefault("_appended", {})
    if id(scope) not in cache:
        found: dict[str, list[ast.Call]] = {}
        for node in checked_module(ctx).scope_nodes(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" \
                    and isinstance(node.func.value, ast.Name) and len(node.args) + len(node.keywords) == 1:
                found.setdefault(node.func.value.id, []).append(node)
        cache[id(scope)] = found
    return cache[id(scope)]


def list_items(ctx: AstContext, name: ast.Name) -> list[ast.expr] | None:
    """What a list built in its function holds where ``name`` reads it: the elements of its
    list literal and what ``name.append(...)`` added in between (``outs = []``, then
    ``outs.append(self.head(x))`` in a loop); None when ``name`` is not such a list."""
    found = binding(ctx, name)
    if found is None or found.index is not None or not isinstance(found.value, ast.List):
        return None
    first, last = ctx.order(found.statement), ctx.order(name)
    items = [e for e in found.value.elts if not isinstance(e, ast.Starred)]
    for call in _appended(ctx, ctx.enclosing_function(name) or ctx.outline.tree).get(name.id, ()):
        if first < ctx.order(call) < last and call.args and (other := binding(ctx, call.func.value)) is not None \
                and other.value is found.value:
            items.append(call.args[0])
    return items


@lru_cache(maxsize=None)
def _lower_precision_spellings(table) -> frozenset[str]:
    return frozenset(table.spellings_with("lower_precision_fp"))


def lower_precision_operands(ctx: AstContext, node: ast.AST) -> list[ast.expr]:
    """The tensor operands of ``a @ b`` or of a call to a `lower_precision_fp` op (``mm``,
    ``F.linear``, ``x.bmm(y)``); empty for anything else."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right] if isinstance(node.op, ast.MatMult) else []
    if not isinstance(node, ast.Call):
        return []
    table = ctx.policy()
    torch = any(n.startswith("torch.") for n in ctx.outline.qualified_names(node.func))
    # A method spelling no such op, on something torch does not name: not one (rendering the
    # receiver, as call_spelling does, costs more than the rest).
    if isinstance(node.func, ast.Attribute) and not torch \
            and f"torch.Tensor.{node.func.attr}" not in _lower_precision_spellings(table):
        return []
    if policies_of(table, call_spelling(ctx, node)) != {"lower_precision_fp"}:
        return []
    tensor = [node.func.value] if isinstance(node.func, ast.Attribute) and not torch else []
    return tensor + [a for a in node.args if not isinstance(a, ast.Starred)]


def promoted(values: list[Value]) -> Value:
    """The dtype of an op that promotes its operands: float32 wins, then half."""
    for kind in (FLOAT32, *HALF_KINDS):
        found = [v for v in values if v.kind == kind]
        if found:
            return next((v for v in found if v.origin is not None), found[0])
    return UNKNOWN


def _lower_precision(operands: list[Value]) -> Value:
    """A `lower_precision_fp` op: half under autocast, the activations' dtype in a half model."""
    return next((Value(v.kind) for v in operands if v.kind in ACTIVATION_KINDS), Value(AUTOCAST_HALF))


class Activations:
    """The values of one file, as far as its code shows their dtype (``Value``), each worked
    out once."""

    def __init__(self, ctx: AstContext):
        self.ctx = ctx
        self.table = ctx.policy()
        self._values: dict[int, Value] = {}
        self._passed: dict[int, list[Value]] = {}

    def value(self, expr: ast.expr, depth: int = _DEPTH) -> Value:
        if depth == 0:
            return UNKNOWN
        if id(expr) not in self._values:
            self._values[id(expr)] = self._value(expr, depth)
        return self._values[id(expr)]

    def _value(self, expr: ast.expr, depth: int) -> Value:
        if isinstance(expr, ast.Name):
            return self._name(expr, depth)
        if isinstance(expr, ast.Subscript):
            return self.value(expr.value, depth - 1)
        if isinstance(expr, ast.Attribute):
            if expr.attr in _SAME_VALUE_ATTRIBUTES:
                return self.value(expr.value, depth - 1)
            root = expr.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if expr.attr in ("weight", "bias") and isinstance(root, ast.Name) and root.id == "self":
                return Value(ACTIVATION)  # a parameter of the module or of a submodule
            return UNKNOWN
        if isinstance(expr, ast.UnaryOp) and not isinstance(expr.op, (ast.Invert, ast.Not)):
            return self.value(expr.operand, depth - 1)
        if isinstance(expr, ast.BinOp):
            operands = [self.value(expr.left, depth - 1), self.value(expr.right, depth - 1)]
            return _lower_precision(operands) if isinstance(expr.op, ast.MatMult) else promoted(operands)
        if isinstance(expr, ast.IfExp):
            return promoted([self.value(expr.body, depth - 1), self.value(expr.orelse, depth - 1)])
        if isinstance(expr, ast.Call):
            return self._call(expr, depth)
        return UNKNOWN

    def _name(self, name: ast.Name, depth: int) -> Value:
        found = binding(self.ctx, name)
        if found is None:
            return UNKNOWN
        if found.parameter is not None:
            if not _tensor_parameter(self.ctx, found.statement, found.parameter):
                return UNKNOWN
            key = id(found.parameter)
            if key not in self._passed:
                self._passed[key] = [self.value(a, depth - 1)
                                     for a in passed_for(self.ctx, found.statement, found.parameter)]
            passed = self._passed[key]
            # A helper the file only ever calls with float32 values gets float32 values.
            return Value(FLOAT32) if passed and all(v.kind == FLOAT32 for v in passed) else Value(ACTIVATION)
        value, index = found.value, found.index
        if value is None:
            return UNKNOWN
        if index is not None and isinstance(value, (ast.Tuple, ast.List)):
            element = value.elts[index] if index < len(value.elts) else None
            return UNKNOWN if element is None or isinstance(element, ast.Starred) else self.value(element, depth - 1)
        if index is not None and isinstance(value, ast.Call) and index > 0 \
                and callee_name(value) in _VALUES_AND_INDICES:
            return UNKNOWN
        return self.value(value, depth - 1)

    def _dtype(self, expr: ast.expr, depth: int) -> Value:
        """The value a ``dtype=`` argument gives: a literal, or ``y.dtype``."""
        literal = dtype_of(self.ctx, expr)
        if literal in ("float16", "bfloat16"):
            return Value(HALF)
        if literal == "float32":
            return Value(FLOAT32)
        if isinstance(expr, ast.Attribute) and expr.attr == "dtype":
            return Value(self.value(expr.value, depth - 1).kind)
        return UNKNOWN

    def _call(self, call: ast.Call, depth: int) -> Value:
        ctx = self.ctx
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if factory(ctx, call) is not None:
            if "dtype" in keywords:
                return self._dtype(keywords["dtype"], depth)
            return Value(FLOAT32, call) if float32_factory(ctx, call) is not None else UNKNOWN
        if ctx.resolves_to(call.func, _LIKE_FACTORIES) is not None:
            if "dtype" in keywords:
                return self._dtype(keywords["dtype"], depth)
            return Value(self.value(positional[0], depth - 1).kind) if positional else UNKNOWN
        if callee_name(call) in _NOT_FLOAT or (isinstance(call.func, ast.Name) and call.func.id in _BUILTINS):
            return UNKNOWN
        torch = any(n.startswith("torch.") for n in ctx.outline.qualified_names(call.func))
        # The tensor a method is called on; none for `self.f(...)` or `torch.f(...)`.
        tensor = call.func.value if isinstance(call.func, ast.Attribute) and not torch \
            and ctx.code(call.func.value) not in ("self", "super()") else None
        if tensor is not None:
            method = call.func.attr
            if method == "float" and not call.args and not call.keywords:
                return Value(FLOAT32, call if integral(ctx, tensor, depth - 1) else None)
            if method in ("half", "bfloat16"):
                return Value(HALF)
            if method == "type_as" and positional:
                return Value(self.value(positional[0], depth - 1).kind)
            if method == "to":
                return self._to(call, tensor, positional, keywords, depth)
            if method.startswith("new_"):
                if "dtype" in keywords:
                    return self._dtype(keywords["dtype"], depth)
                return Value(self.value(tensor, depth - 1).kind)
            if method in _SAME_DTYPE_METHODS:  # the tables know no op for them: the values are the tensor's
                return self.value(tensor, depth - 1)
        spelling = call_spelling(ctx, call)
        if spelling is None and isinstance(call.func, ast.Call):  # `nn.Softmax(dim=-1)(x)`: the module's op
            spelling = next((n for n in ctx.outline.qualified_names(call.func.func) if n.startswith("torch.nn.")), None)
        if spelling is not None and spelling.startswith("torch."):
            if casts_back(self.table, spelling):  # autocast gives the output its input's dtype
                source = tensor_input(call, spelling)
                return Value(self.value(source, depth - 1).kind) if source is not None else UNKNOWN
            policies = policies_of(self.table, spelling)
            if policies and policies <= FP32_FAMILY:
                return Value(FLOAT32)
            if tensor is not None:  # a method's other arguments are mostly sizes and dims
                return self.value(tensor, depth - 1)
            operands = []
            for arg in positional:
                appended = list_items(ctx, arg) if isinstance(arg, ast.Name) else None
                if appended is not None:
                    operands.extend(appended)
                elif isinstance(arg, (ast.List, ast.Tuple)):
                    operands.extend(e for e in arg.elts if not isinstance(e, ast.Starred))
                else:
                    operands.append(arg)
            values = [self.value(o, depth - 1) for o in operands]
            return _lower_precision(values) if policies == {"lower_precision_fp"} else promoted(values)
        # A call the tables do not know (a submodule, a helper): its result follows the
        # activations if an activation goes in. What autocast alone makes half may come out
        # float32 (a module that ends in `sum` or `softmax`).
        inputs = [self.value(a, depth - 1) for a in argument_values(call)]
        if any(v.kind in (HALF, ACTIVATION) for v in inputs):
            return Value(ACTIVATION)
        if any(v.kind == PROJECT_HALF for v in inputs):
            return Value(PROJECT_HALF)
        # A loss's model, given nothing known to be a float (tokens, strings): half under
        # the project's autocast. Given float32 values, it computes in float32 (an
        # activation function on logits made float32).
        if all(v.kind is None for v in inputs) and _model_call(ctx, call) and self.project_region():
            return Value(PROJECT_HALF)
        return UNKNOWN

    def _to(self, call: ast.Call, tensor: ast.expr, positional: list[ast.expr], keywords: dict, depth: int) -> Value:
        """``.to(...)``: a device keeps the tensor's value; a dtype or a tensor casts."""
        if "dtype" in keywords:
            return self._dtype(keywords["dtype"], depth)
        for arg in positional:
            cast = self._dtype(arg, depth)
            if cast.kind is not None or dtype_of(self.ctx, arg) is not None:
                return cast
            if not _device_like(self.ctx, arg):
                return Value(self.value(arg, depth - 1).kind)  # .to(other): other's dtype
        return self.value(tensor, depth - 1)

    def cast_back(self, node: ast.AST) -> bool:
        """Whether the result of ``node`` is copied into a half tensor, which casts it back:
        ``x[:, 0] = x[:, 0] + noise``, ``out.copy_(a + b)``."""
        ctx, child = self.ctx, node
        for ancestor in iter(lambda: ctx.parent(child), None):
            if isinstance(ancestor, ast.Assign):
                dest = [t.value for t in ancestor.targets if isinstance(t, ast.Subscript)]
                return bool(dest) and child is ancestor.value and self.value(dest[0]).kind in HALF_KINDS
            if isinstance(ancestor, ast.Call) and isinstance(ancestor.func, ast.Attribute) \
                    and ancestor.func.attr == "copy_" and child is not ancestor.func:
                return self.value(ancestor.func.value).kind in HALF_KINDS
            if isinstance(ancestor, ast.stmt):
                return False
            child = ancestor
        return False

    def project_region(self) -> tuple | None:
        """The autocast its project enables in another file, under which the file's losses may
        run (``enabling.enabling_site``: the site, how to name it, the related location)."""
        if "_region" not in self.__dict__:
            self.__dict__["_region"] = enabling_site(self.ctx)
        return self.__dict__["_region"]


def _model_call(ctx: AstContext, call: ast.Call) -> bool:
    """A loss calling its model: ``self.name(...)`` in a loss (``crossfile.named_loss_place``),
    where ``name`` is no method of the class and not named like a loss or criterion (which
    returns a loss, float32 under autocast)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return False
    name = func.attr
    if "loss" in name.lower() or "criterion" in name.lower():
        return False
    cls = ctx.enclosing(call, ast.ClassDef)
    if cls is None or any(isinstance(s, _FUNCTIONS) and s.name == name for s in cls.body):
        return False
    return named_loss_place(ctx, call) is not None
