from __future__ import annotations

import ast
import keyword
import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import Callable

import libcst as cst

from ..engine.context import FileContext
from ..engine.crossfile import enabling_site, loss_places_on_ast, named_loss_place
from ..engine.diagnostics import Fix, Related
from ..engine.enabling import region_switch
from ..engine.factories import chain_without_calls, new_method_fix
from ..engine.outline import BINDING_STATEMENTS, Outline, Scopes
from ..engine.promotion import FP32_FAMILY, casts_back, policies_of
from ..engine.rule import PARENTHESIZED, AnyOf, Invalid, Rule, TextTest, Valid, tolerant_of_spacing
from ..engine.semantics import (
    AUTOCAST,
    DTYPES,
    autocast_region,
    reaching_region,
    call_spelling,
    calls_enabled_autocast,
    dtype_of,
    method_call,
    tensor_input,
)
from ..engine.text_scan import call_arguments, enclosing_bracket, space_before, word_before
from ..policy import committed_tables

# What a value's dtype is known to be: float32 whatever the model runs in; half (`.half()`,
# `dtype=torch.bfloat16`); half under autocast (what a `lower_precision_fp` op makes of
# values of unknown dtype); the activations' dtype (a tensor argument, a module's output:
# half in a half model, and mostly under autocast); or the output of the model a loss calls
# (`self.model(tokens)`), half when the loss runs under the autocast its project enables
# in another file.
FLOAT32, HALF, AUTOCAST_HALF, ACTIVATION = "float32", "half", "autocast half", "activation"
PROJECT_HALF = "half under the project's autocast"
_HALF_KINDS = (HALF, AUTOCAST_HALF, ACTIVATION, PROJECT_HALF)
# What follows the activations' dtype into the modules and ops it goes through.
_ACTIVATION_KINDS = (HALF, ACTIVATION, PROJECT_HALF)
# Half only under autocast or in a half model (a lowered op's output, a tensor argument, a
# module's output; a loss's model output under another file's autocast): evidence only where
# they meet inside an autocast region of this file. Elsewhere a guess, triaged below the
# precision bar, so reported only in preview mode.
_GUESSED_KINDS = (AUTOCAST_HALF, ACTIVATION, PROJECT_HALF)

_FACTORY_NAMES = ("zeros", "ones", "empty", "full", "tensor", "rand", "randn")
_FACTORIES = frozenset({"torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.tensor",
                        "torch.rand", "torch.randn"})
_LIKE_FACTORIES = frozenset({"torch.zeros_like", "torch.ones_like", "torch.empty_like",
                             "torch.full_like", "torch.rand_like", "torch.randn_like"})
_CONCATENATIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack",
                             "torch.hstack", "torch.vstack", "torch.dstack"})
# In-place ops that need the source in the destination's dtype: the source's position and
# keyword. An index-put (`dest[i] = src`) is the same op.
_STRICT_METHODS = {
    "scatter_": (2, "src"), "scatter_add_": (2, "src"), "scatter_reduce_": (2, "src"),
    "index_add_": (2, "source"), "index_copy_": (2, "source"), "index_put_": (1, "values"),
    "masked_scatter_": (1, "source"),
}
# Methods and functions whose result is not a floating tensor, or whose float result does not
# follow the input's dtype.
_NOT_FLOAT = frozenset({
    "long", "int", "bool", "byte", "short", "char", "double", "argmax", "argmin", "argsort",
    "nonzero", "size", "dim", "numel", "item", "tolist", "numpy", "eq", "ne", "lt", "le", "gt",
    "ge", "isnan", "isinf", "isfinite", "logical_and", "logical_or", "logical_not", "logical_xor",
    "all", "any", "searchsorted", "bucketize", "multinomial", "unique", "count_nonzero",
    "is_floating_point", "type", "arange", "randint", "randperm",
})
# Those of them that make integers or booleans, and the methods that keep an integer an integer.
_INTEGRAL = _NOT_FLOAT - {"double", "size", "dim", "numel", "item", "tolist", "numpy", "type"}
# Tensor methods that return the receiver's values (or a view of them) in its dtype.
_SAME_DTYPE_METHODS = frozenset({"view", "reshape", "unsqueeze", "squeeze", "expand", "flatten", "transpose",
                                 "permute", "contiguous", "detach", "clone", "repeat", "expand_as", "view_as",
                                 "reshape_as"})
_RESHAPES = ("view", "reshape", "unsqueeze", "squeeze", "expand", "flatten", "transpose", "permute",
             "contiguous", "to")
# Functions returning (values, indices): only the values follow the input's dtype.
_VALUES_AND_INDICES = frozenset({"max", "min", "topk", "sort", "kthvalue", "median", "mode",
                                 "cummax", "cummin"})
_RECURRENT = frozenset({"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN", "torch.nn.LSTMCell",
                        "torch.nn.GRUCell", "torch.nn.RNNCell"})
_PROMOTING = {cst.Add: "adds it to", cst.Subtract: "subtracts", cst.Multiply: "multiplies it with",
              cst.Divide: "divides"}
# Attributes of a tensor that are that tensor's values, in its dtype.
_SAME_VALUE_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real"})
_NON_FLOAT_HINTS = ("ids", "idx", "index", "indices", "mask", "len", "label", "target", "count")
_FLOAT_CONSTANTS = frozenset({"math.inf", "math.nan", "math.pi", "math.e", "math.tau",
                              "numpy.inf", "numpy.nan", "numpy.pi", "numpy.e"})


def _evidently_float(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """A Python number that is a float whatever the variables hold: ``0.5``, ``-1e9``,
    ``float("-inf")``, ``1 / n``, ``math.pi``, ``torch.finfo(t).min``."""
    if isinstance(expr, cst.UnaryOperation):
        return _evidently_float(ctx, expr.expression)
    if isinstance(expr, cst.Float):
        return True
    if isinstance(expr, cst.Call):
        return isinstance(expr.func, cst.Name) and expr.func.value == "float"
    if isinstance(expr, cst.BinaryOperation):
        return isinstance(expr.operator, cst.Divide) or _evidently_float(ctx, expr.left) \
            or _evidently_float(ctx, expr.right)
    if isinstance(expr, cst.Attribute):
        if isinstance(expr.value, cst.Call) and ctx.resolves_to(expr.value.func, {"torch.finfo"}):
            return True
        return ctx.resolves_to(expr, _FLOAT_CONSTANTS) is not None
    return False


def _float_data(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """``torch.tensor`` data that makes a floating tensor of one dimension or more: a list or
    tuple with a float in it (``[0.5, 2]``). A lone number makes a 0-dim tensor; ints, and data
    whose type the code does not show, are left alone."""
    if not isinstance(expr, (cst.List, cst.Tuple)):
        return False
    values = [e.value for e in expr.elements if isinstance(e, cst.Element)]
    return any(_evidently_float(ctx, v) or _float_data(ctx, v) for v in values)


def _empty_shape(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, (cst.Tuple, cst.List)) and not expr.elements


def _makes_float32(ctx: FileContext, factory: str, call: cst.Call) -> bool:
    """Whether the call, without ``dtype=``, makes a float32 tensor of one dimension or more
    (a 0-dim tensor does not change the dtype of the tensors it meets): zeros, ones, empty and
    the random ones always make a float; ``torch.full`` takes the type of its fill value (an int
    fill makes int64); ``torch.tensor`` infers it from its data."""
    positional = [a.value for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if factory == "torch.tensor":
        data = keywords.get("data", positional[0] if positional else None)
        return data is not None and _float_data(ctx, data)
    size = keywords.get("size", positional[0] if positional else None)
    if _empty_shape(size):
        return False
    if factory == "torch.full":
        fill = keywords.get("fill_value", positional[1] if len(positional) > 1 else None)
        return fill is not None and _evidently_float(ctx, fill)
    return True


@dataclass(frozen=True)
class _Value:
    kind: str | None  # one of the kinds above, or None: not known to be a floating tensor
    # The call that made it float32 where that is the mistake: a factory without `dtype=`, or
    # `.float()` of a mask or of integers.
    origin: cst.Call | None = None


_UNKNOWN = _Value(None)
# Builtins that never return a tensor.
_BUILTINS = frozenset({"len", "int", "float", "bool", "str", "range", "isinstance", "hasattr",
                       "zip", "enumerate", "tuple", "list", "dict", "set", "print", "round",
                       "sorted", "id", "type", "repr", "format"})


def _promoted(values: list[_Value]) -> _Value:
    """The dtype of an op that promotes its operands: float32 wins, then half."""
    for kind in (FLOAT32, *_HALF_KINDS):
        found = [v for v in values if v.kind == kind]
        if found:
            return next((v for v in found if v.origin is not None), found[0])
    return _UNKNOWN


def _lower_precision(operands: list[_Value]) -> _Value:
    """A `lower_precision_fp` op: half under autocast, the activations' dtype in a half model."""
    return next((_Value(v.kind) for v in operands if v.kind in _ACTIVATION_KINDS), _Value(AUTOCAST_HALF))


@dataclass(frozen=True)
class _Binding:
    statement: cst.CSTNode  # the assignment, or the function for a parameter
    value: cst.BaseExpression | None  # None: a loop or `with` target, or a parameter
    index: int | None = None  # the target's position in an unpacking
    parameter: cst.Param | None = None


def _binding_scope(ctx: FileContext, node: cst.CSTNode) -> cst.CSTNode | None:
    """The function (or the module) whose names an assignment in ``node`` binds; None in a
    class body."""
    for a in ctx.ancestors(node):
        if isinstance(a, cst.FunctionDef):
            return a
        if isinstance(a, (cst.ClassDef, cst.Lambda)):
            return None
    return ctx.module


def _targets(target: cst.BaseExpression) -> list[tuple[str, int | None]]:
    if isinstance(target, cst.Name):
        return [(target.value, None)]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [(e.value.value, i) for i, e in enumerate(target.elements)
                if isinstance(e, cst.Element) and isinstance(e.value, cst.Name)]
    return []


class _Flow:
    """Which values of a file are float32, half or the activations' dtype, following plain
    assignments backwards within a function."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.table = ctx.policy()
        self._bindings: dict[int, dict[str, list[_Binding]]] = {}
        self._values: dict[int, _Value] = {}
        self._arguments: dict[int, list[_Value]] = {}

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return next((a for a in self.ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), self.ctx.module)

    @cached_property
    def _assigned(self) -> dict[int, dict[str, list[_Binding]]]:
        """Every scope's assignments, loop and ``with`` targets by name, from the file's index
        (one pass, not a walk per scope)."""
        ctx = self.ctx
        nodes = sorted([*ctx.nodes(cst.Assign), *ctx.nodes(cst.AnnAssign), *ctx.nodes(cst.For),
                        *ctx.nodes(cst.WithItem)], key=ctx.order)
        found: dict[int, dict[str, list[_Binding]]] = {}
        for node in nodes:
            pairs: list[tuple[cst.BaseExpression, cst.BaseExpression | None]] = []
            if isinstance(node, cst.Assign):
                pairs = [(t.target, node.value) for t in node.targets]
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, cst.For):
                pairs = [(node.target, None)]
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                pairs = [(node.asname.name, None)]
            if not pairs:
                continue
            scope = _binding_scope(ctx, node)
            if scope is None:
                continue
            names = found.setdefault(id(scope), {})
            for target, value in pairs:
                for name, index in _targets(target):
                    names.setdefault(name, []).append(_Binding(node, value, index))
        return found

    def bindings(self, scope: cst.CSTNode) -> dict[str, list[_Binding]]:
        """The scope's bindings by name, in source order: parameters first."""
        if id(scope) not in self._bindings:
            found: dict[str, list[_Binding]] = {}
            if isinstance(scope, cst.FunctionDef):
                params = scope.params
                for p in [*params.posonly_params, *params.params, *params.kwonly_params]:
                    found.setdefault(p.name.value, []).append(_Binding(scope, None, parameter=p))
            for name, entries in self._assigned.get(id(scope), {}).items():
                found.setdefault(name, []).extend(entries)
            self._bindings[id(scope)] = found
        return self._bindings[id(scope)]

    def binding(self, name: cst.Name) -> _Binding | None:
        """The binding of ``name`` last made before it (a parameter, else an assignment that does
        not contain it: ``x = f(x)`` reads the previous ``x``)."""
        at = self.ctx.order(name)
        last = None
        for b in self.bindings(self.scope_of(name)).get(name.value, ()):
            if b.parameter is None and (self.ctx.order(b.statement) >= at or self.ctx.contains(b.statement, name)):
                break
            last = b
        return last

    def value(self, expr: cst.BaseExpression, depth: int = 24) -> _Value:
        if depth == 0:
            return _UNKNOWN
        if id(expr) not in self._values:
            self._values[id(expr)] = self._value(expr, depth)
        return self._values[id(expr)]

    def _value(self, expr: cst.BaseExpression, depth: int) -> _Value:
        ctx = self.ctx
        if isinstance(expr, cst.Name):
            b = self.binding(expr)
            if b is None:
                return _UNKNOWN
            if b.parameter is not None:
                if not _tensor_parameter(ctx, b.parameter):
                    return _UNKNOWN
                key = id(b.parameter)
                if key not in self._arguments:
                    self._arguments[key] = self.arguments(b.statement, b.parameter, depth - 1)
                passed = self._arguments[key]
                # A helper the file only ever calls with float32 values gets float32 values.
                if passed and all(v.kind == FLOAT32 for v in passed):
                    return _Value(FLOAT32)
                return _Value(ACTIVATION)
            if b.value is None:
                return _UNKNOWN
            if b.index is not None and isinstance(b.value, (cst.Tuple, cst.List)):
                element = b.value.elements[b.index] if b.index < len(b.value.elements) else None
                return self.value(element.value, depth - 1) if isinstance(element, cst.Element) else _UNKNOWN
            if b.index is not None and isinstance(b.value, cst.Call) and b.index > 0 \
                    and _callee_name(b.value) in _VALUES_AND_INDICES:
                return _UNKNOWN
            return self.value(b.value, depth - 1)
        if isinstance(expr, cst.Subscript):
            return self.value(expr.value, depth - 1)
        if isinstance(expr, cst.Attribute):
            if expr.attr.value in _SAME_VALUE_ATTRIBUTES:
                return self.value(expr.value, depth - 1)
            root = _root(expr)
            if expr.attr.value in ("weight", "bias") and isinstance(root, cst.Name) and root.value == "self":
                return _Value(ACTIVATION)  # a parameter of the module or of a submodule
            return _UNKNOWN
        if isinstance(expr, cst.UnaryOperation) and not isinstance(expr.operator, (cst.BitInvert, cst.Not)):
            return self.value(expr.expression, depth - 1)
        if isinstance(expr, cst.BinaryOperation):
            operands = [self.value(expr.left, depth - 1), self.value(expr.right, depth - 1)]
            if isinstance(expr.operator, cst.MatrixMultiply):
                return _lower_precision(operands)
            return _promoted(operands)
        if isinstance(expr, cst.IfExp):
            return _promoted([self.value(expr.body, depth - 1), self.value(expr.orelse, depth - 1)])
        if isinstance(expr, cst.Call):
            return self._call(expr, depth)
        return _UNKNOWN

    @cached_property
    def _calls_by_name(self) -> dict[str, list[tuple[cst.Call, int]]]:
        """The file's calls ``f(...)`` and ``self.f(...)`` without ``*args``, by ``f``, with
        how many arguments ``self`` takes (0 or 1)."""
        found: dict[str, list[tuple[cst.Call, int]]] = {}
        for call in self.ctx.nodes(cst.Call):
            name = call.func
            offset = 0
            if isinstance(name, cst.Attribute) and isinstance(name.value, cst.Name) and name.value.value == "self":
                name, offset = name.attr, 1
            if isinstance(name, cst.Name) and not any(a.star for a in call.args):
                found.setdefault(name.value, []).append((call, offset))
        return found

    def arguments(self, func: cst.FunctionDef, param: cst.Param, depth: int) -> list[_Value]:
        """The values the file passes for ``param`` where it calls ``func`` by its name (or
        as ``self.name``); empty when it passes none it can read."""
        params = [p.name.value for p in [*func.params.posonly_params, *func.params.params]]
        if param.name.value not in params and param not in func.params.kwonly_params:
            return []
        position = params.index(param.name.value) if param.name.value in params else None
        found = []
        for call, offset in self._calls_by_name.get(func.name.value, ()):
            positional = [a.value for a in call.args if a.keyword is None]
            keyword = next((a.value for a in call.args if a.keyword is not None
                            and a.keyword.value == param.name.value), None)
            if keyword is not None:
                found.append(self.value(keyword, depth))
            elif position is not None and 0 <= position - offset < len(positional):
                found.append(self.value(positional[position - offset], depth))
        return found

    def list_items(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        """What a list built in this function holds where ``name`` reads it: the elements of
        its list literal and what ``name.append(...)`` added in between (``outs = []``, then
        ``outs.append(self.head(x))`` in a loop); None when ``name`` is not such a list."""
        b = self.binding(name)
        if b is None or b.index is not None or not isinstance(b.value, cst.List):
            return None
        ctx = self.ctx
        first, last = ctx.order(b.statement), ctx.order(name)
        items = [e.value for e in b.value.elements if isinstance(e, cst.Element)]
        for call in ctx.nodes(cst.Call):
            mc = method_call(call)
            if mc is not None and mc[1] == "append" and isinstance(mc[0], cst.Name) and mc[0].value == name.value \
                    and first < ctx.order(call) < last and len(call.args) == 1 and self.binding(mc[0]) is b:
                items.append(call.args[0].value)
        return items

    def _dtype(self, expr: cst.BaseExpression, depth: int) -> _Value:
        """The value a ``dtype=`` argument gives: a literal, or ``y.dtype``."""
        literal = dtype_of(self.ctx, expr)
        if literal in ("float16", "bfloat16"):
            return _Value(HALF)
        if literal == "float32":
            return _Value(FLOAT32)
        if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
            return _Value(self.value(expr.value, depth - 1).kind)
        return _UNKNOWN

    def _call(self, call: cst.Call, depth: int) -> _Value:
        ctx = self.ctx
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        factory = _factory(ctx, call)
        if factory is not None:
            if "dtype" in keywords:
                return self._dtype(keywords["dtype"], depth)
            if any(a.star for a in call.args) or not _makes_float32(ctx, factory, call):
                return _UNKNOWN
            return _Value(FLOAT32, call)
        if ctx.resolves_to(call.func, _LIKE_FACTORIES) is not None:
            if "dtype" in keywords:
                return self._dtype(keywords["dtype"], depth)
            return _Value(self.value(positional[0], depth - 1).kind) if positional else _UNKNOWN
        if _callee_name(call) in _NOT_FLOAT or (isinstance(call.func, cst.Name) and call.func.value in _BUILTINS):
            return _UNKNOWN
        mc = method_call(call)
        # The tensor a method is called on; none for `self.f(...)` or `torch.f(...)`.
        receiver = None if mc is None or ctx.code(mc[0]) in ("self", "super()") \
            or any(n.startswith("torch.") for n in ctx.qualified_names(call.func)) else mc[0]
        if receiver is not None:
            method = mc[1]
            if method == "float" and not call.args:
                return _Value(FLOAT32, call if _integral(self, receiver, depth - 1) else None)
            if method in ("half", "bfloat16"):
                return _Value(HALF)
            if method == "type_as" and positional:
                return _Value(self.value(positional[0], depth - 1).kind)
            if method == "to":
                return self._to(call, receiver, positional, keywords, depth)
            if method.startswith("new_"):
                if "dtype" in keywords:
                    return self._dtype(keywords["dtype"], depth)
                return _Value(self.value(receiver, depth - 1).kind)
            if method in _SAME_DTYPE_METHODS:  # the tables know no op for them: the values are the receiver's
                return self.value(receiver, depth - 1)
        spelling = call_spelling(ctx, call)
        if spelling is None and isinstance(call.func, cst.Call):  # `nn.Softmax(dim=-1)(x)`: the module's op
            spelling = next((n for n in ctx.qualified_names(call.func.func) if n.startswith("torch.nn.")), None)
        if spelling is not None and spelling.startswith("torch."):
            if casts_back(self.table, spelling):  # autocast gives the output its input's dtype
                source = tensor_input(call, spelling)
                return _Value(self.value(source, depth - 1).kind) if source is not None else _UNKNOWN
            policies = policies_of(self.table, spelling)
            if policies and policies <= FP32_FAMILY:
                return _Value(FLOAT32)
            if receiver is not None:  # a method's other arguments are mostly sizes and dims
                return self.value(receiver, depth - 1)
            operands = []
            for arg in positional:
                appended = self.list_items(arg) if isinstance(arg, cst.Name) else None
                if appended is not None:
                    operands.extend(appended)
                elif isinstance(arg, (cst.List, cst.Tuple)):
                    operands.extend(e.value for e in arg.elements if isinstance(e, cst.Element))
                else:
                    operands.append(arg)
            values = [self.value(o, depth - 1) for o in operands]
            return _lower_precision(values) if policies == {"lower_precision_fp"} else _promoted(values)
        # A call the tables do not know (a submodule, a helper): its result follows the
        # activations if an activation goes in. What autocast alone makes half may come out
        # float32 (a module that ends in `sum` or `softmax`).
        inputs = [self.value(a.value, depth - 1) for a in call.args]
        if any(v.kind in (HALF, ACTIVATION) for v in inputs):
            return _Value(ACTIVATION)
        if any(v.kind == PROJECT_HALF for v in inputs):
            return _Value(PROJECT_HALF)
        # A loss's model, given nothing known to be a float (tokens, strings): half under
        # the project's autocast. Given float32 values, it computes in float32 (an
        # activation function on logits made float32).
        if all(v.kind is None for v in inputs) and _model_call(ctx, call) and self.project_region():
            return _Value(PROJECT_HALF)
        return _UNKNOWN

    def project_region(self) -> tuple | None:
        """The autocast its project enables in another file, under which the file's losses may
        run (``crossfile.enabling_site``: the site, how to name it, the related location)."""
        if "_region" not in self.__dict__:
            self.__dict__["_region"] = enabling_site(self.ctx)
        return self.__dict__["_region"]

    def _to(self, call, receiver, positional, keywords, depth) -> _Value:
        """``.to(...)``: a device keeps the receiver's value; a dtype or a tensor casts."""
        ctx = self.ctx
        if "dtype" in keywords:
            return self._dtype(keywords["dtype"], depth)
        for arg in positional:
            cast = self._dtype(arg, depth)
            if cast.kind is not None or dtype_of(ctx, arg) is not None:
                return cast
            if not _device_like(self, arg):
                return _Value(self.value(arg, depth - 1).kind)  # .to(other): other's dtype
        return self.value(receiver, depth - 1)


def _model_call(ctx: FileContext, call: cst.Call) -> bool:
    """A loss calling its model: ``self.name(...)`` in a loss (``crossfile.named_loss_place``),
    where ``name`` is no method of the class and not named like a loss or criterion (which
    returns a loss, float32 under autocast)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
        return False
    name = func.attr.value
    if "loss" in name.lower() or "criterion" in name.lower():
        return False
    cls = next((a for a in ctx.ancestors(call) if isinstance(a, cst.ClassDef)), None)
    if cls is None or any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in cls.body.body):
        return False
    return named_loss_place(ctx, call) is not None


def _root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` of ``x.a[i].b``."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr


def _factory(ctx: FileContext, call: cst.Call) -> str | None:
    """The torch factory a call makes, as ``torch.zeros``: a torch factory, or a function of
    that name given a device (a package's re-export of torch's)."""
    factory = ctx.resolves_to(call.func, _FACTORIES)
    if factory is not None or not any(a.keyword is not None and a.keyword.value == "device" for a in call.args):
        return factory
    name = f"torch.{_callee_name(call)}"
    return name if name in _FACTORIES else None


def _float_cast(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "float"


def _callee_name(call: cst.Call) -> str | None:
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return call.func.value if isinstance(call.func, cst.Name) else None


def _tensor_parameter(ctx: FileContext, param: cst.Param) -> bool:
    """A parameter that plausibly holds a floating tensor: not ``self``, not named like indices
    or a mask, not annotated with anything but a tensor, no number or string by default."""
    name = param.name.value
    if name in ("self", "cls") or any(h in name.lower() for h in _NON_FLOAT_HINTS):
        return False
    if isinstance(param.default, (cst.Integer, cst.Float, cst.SimpleString)) or (
            isinstance(param.default, cst.Name) and param.default.value in ("True", "False")):
        return False
    return param.annotation is None or "Tensor" in ctx.code(param.annotation.annotation)


def _integral(flow: _Flow, expr: cst.BaseExpression, depth: int) -> bool:
    """A boolean or integer tensor: a comparison, ``~m``, ``.long()``, ``argmax``, or a name, an
    index or a reshape of one."""
    if depth == 0:
        return False
    if isinstance(expr, cst.Comparison) or (isinstance(expr, cst.UnaryOperation)
                                            and isinstance(expr.operator, cst.BitInvert)):
        return True
    if isinstance(expr, cst.Name):
        b = flow.binding(expr)
        return b is not None and b.value is not None and b.index is None and _integral(flow, b.value, depth - 1)
    if isinstance(expr, cst.Subscript):
        return _integral(flow, expr.value, depth - 1)
    if isinstance(expr, cst.Call):
        name = _callee_name(expr)
        if name in _INTEGRAL:
            return True
        mc = method_call(expr)
        return mc is not None and name in _RESHAPES and _integral(flow, mc[0], depth - 1)
    return False


def _device_like(flow: _Flow, expr: cst.BaseExpression) -> bool:
    """A device argument of ``.to``: ``x.device``, a string, ``torch.device(...)``, or a name
    bound to one of those or named like one."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "device"
    if isinstance(expr, (cst.SimpleString, cst.Integer)):
        return True
    if isinstance(expr, cst.Call):
        return flow.ctx.resolves_to(expr.func, {"torch.device"}) is not None
    if isinstance(expr, cst.Name):
        if "device" in expr.value.lower():
            return True
        b = flow.binding(expr)
        return b is not None and b.value is not None and b.index is None and _device_like(flow, b.value)
    return False


_HALF_NOTE = ", which is float16/bfloat16 in a half model or under autocast"


def _half_note(flow: _Flow, node: cst.CSTNode, value: _Value) -> tuple[str, tuple[Related, ...]]:
    """Why the other value is half, for the message, and the other file that says so."""
    if value.kind != PROJECT_HALF:
        return _HALF_NOTE, ()
    _, where, related = flow.project_region()
    return (f", which is float16/bfloat16 when {named_loss_place(flow.ctx, node)} runs under the autocast "
            f"this project enables ({where})"), (related,)


@dataclass(frozen=True)
class _Meeting:
    node: cst.CSTNode  # where they meet
    origin: cst.Call  # the float32 value's maker
    other: cst.BaseExpression | None  # the half value (None: a half module)
    text: str  # what happens there, for the message
    related: tuple[Related, ...] = ()  # another file the half value's dtype comes from
    guessed: bool = False  # the half value's kind is one of _GUESSED_KINDS (see check)


def _float32_origin(value: _Value, strict: bool) -> cst.Call | None:
    """The reportable maker of a float32 value: a factory, or (where the op needs equal dtypes)
    a `.float()` of integers."""
    if value.kind != FLOAT32 or value.origin is None:
        return None
    return value.origin if strict or not _float_cast(value.origin) else None


def _meetings(flow: _Flow) -> list[_Meeting]:
    ctx = flow.ctx
    found: list[_Meeting] = []

    def strict(node, dest, source, verb):
        d, s = flow.value(dest), flow.value(source)
        if _float32_origin(d, True) is not None and s.kind in _HALF_KINDS:
            note, related = _half_note(flow, node, s)
            found.append(_Meeting(node, d.origin, source, f"{verb} `{ctx.code(source)}` into it{note}", related,
                                  s.kind in _GUESSED_KINDS))
        elif _float32_origin(s, True) is not None and d.kind in _HALF_KINDS:
            note, related = _half_note(flow, node, d)
            found.append(_Meeting(node, s.origin, dest, f"{verb} it into `{ctx.code(dest)}`{note}", related,
                                  d.kind in _GUESSED_KINDS))

    def promoting(node, operands, verb):
        values = [flow.value(o) for o in operands]
        if all(_float32_origin(v, False) is None for v in values) or _cast_back(flow, node):
            return
        # Outside a model, only a value the code makes half is known to be half.
        half = _HALF_KINDS if _in_model(ctx, node) else (HALF,)
        for value in values:
            if _float32_origin(value, False) is None:
                continue
            other = next(((o, v) for o, v in zip(operands, values) if v.kind in half), None)
            if other is not None:
                note, related = _half_note(flow, node, other[1])
                found.append(_Meeting(node, value.origin, other[0], f"{verb} `{ctx.code(other[0])}`{note}", related,
                                      other[1].kind in _GUESSED_KINDS))

    for node in ctx.nodes(cst.Assign):
        for target in node.targets:
            if isinstance(target.target, cst.Subscript) and any(
                    isinstance(e.slice, cst.Index) and _tensor_index(flow, e.slice.value, 4)
                    for e in target.target.slice):
                strict(node, target.target.value, node.value, "index-puts")
    for call in ctx.nodes(cst.Call):
        mc = method_call(call)
        if mc is not None and mc[1] in _STRICT_METHODS:
            position, keyword = _STRICT_METHODS[mc[1]]
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            source = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword),
                          positional[position] if len(positional) > position else None)
            if source is not None:
                strict(call, mc[0], source, f"`{mc[1]}`s")
        elif ctx.resolves_to(call.func, _CONCATENATIONS) is not None and call.args \
                and isinstance(call.args[0].value, (cst.List, cst.Tuple)):
            elements = [e.value for e in call.args[0].value.elements if isinstance(e, cst.Element)]
            promoting(call, elements, "concatenates it with")
    for call, hidden in _recurrent_calls(ctx):
        state = hidden.elements if isinstance(hidden, cst.Tuple) else ()
        for h in [e.value for e in state if isinstance(e, cst.Element)] or [hidden]:
            value = flow.value(h)
            # Autocast casts an RNN's state with its input; a half model does not.
            kind = flow.value(call.args[0].value).kind if call.args else None
            if _float32_origin(value, False) is not None and kind in (HALF, ACTIVATION):
                found.append(_Meeting(call, value.origin, call.args[0].value,
                                      f"passes it to `{ctx.code(call.func)}` as the state of "
                                      f"`{ctx.code(call.args[0].value)}`{_HALF_NOTE}", guessed=kind in _GUESSED_KINDS))
    for node in [*ctx.nodes(cst.Call), *ctx.nodes(cst.BinaryOperation)]:
        operands = _lower_precision_operands(flow, node)
        if operands:
            # Autocast casts both operands; in a half model the op fails on mixed dtypes.
            values = [flow.value(o) for o in operands]
            if all(_float32_origin(v, False) is None for v in values):
                continue
            half = (HALF, ACTIVATION) if _in_model(ctx, node) else (HALF,)
            for value in values:
                other = next(((o, v) for o, v in zip(operands, values) if v.kind in half), None)
                if _float32_origin(value, False) is not None and other is not None:
                    name = "@" if isinstance(node, cst.BinaryOperation) else _callee_name(node)
                    found.append(_Meeting(node, value.origin, other[0],
                                          f"multiplies it with `{ctx.code(other[0])}` (`{name}`){_HALF_NOTE}",
                                          guessed=other[1].kind in _GUESSED_KINDS))
    half_modules = _half_modules(ctx)
    for call in ctx.nodes(cst.Call) if half_modules else ():
        made_half = half_modules.get(ctx.code(call.func))
        if made_half is None or ctx.order(made_half) > ctx.order(call):
            continue
        for arg in call.args:
            value = flow.value(arg.value)
            if _float32_origin(value, True) is not None:
                line = ctx.location(ctx.offsets(made_half)[0]).row
                found.append(_Meeting(call, value.origin, None,
                                      f"passes it to `{ctx.code(call.func)}`, made half on line {line}"))
    for node in ctx.nodes(cst.BinaryOperation):
        verb = _PROMOTING.get(type(node.operator))
        if verb is not None:
            promoting(node, [node.left, node.right], verb)
    return sorted(found, key=lambda m: ctx.order(m.node))


def _lower_precision_operands(flow: _Flow, node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tensor operands of ``a @ b`` or of a call to a `lower_precision_fp` op (``mm``,
    ``F.linear``, ``x.bmm(y)``); empty for anything else."""
    if isinstance(node, cst.BinaryOperation):
        return [node.left, node.right] if isinstance(node.operator, cst.MatrixMultiply) else []
    if not isinstance(node, cst.Call):
        return []
    # A method spelling no such op, on something torch does not name: not one (rendering the
    # receiver, as call_spelling does, costs more than the rest of the rule).
    if isinstance(node.func, cst.Attribute) \
            and f"torch.Tensor.{node.func.attr.value}" not in _lower_precision_spellings(flow.table) \
            and not any(n.startswith("torch.") for n in flow.ctx.qualified_names(node.func)):
        return []
    if policies_of(flow.table, call_spelling(flow.ctx, node)) != {"lower_precision_fp"}:
        return []
    mc = method_call(node)
    receiver = [mc[0]] if mc is not None and not any(
        n.startswith("torch.") for n in flow.ctx.qualified_names(node.func)) else []
    return receiver + [a.value for a in node.args if a.keyword is None and not a.star]


def _half_modules(ctx: FileContext) -> dict[str, cst.Call]:
    """What the file makes half with `model.half()` (or `.bfloat16()`, `.to(torch.float16)`)
    as a statement of its own, or `model = ....half()`: by its code, the call that does."""
    found = {}
    for call in ctx.nodes(cst.Call):
        mc = method_call(call)
        cast = mc is not None and ((mc[1] in ("half", "bfloat16") and not call.args)
                                   or (mc[1] == "to" and any(dtype_of(ctx, a.value) in ("float16", "bfloat16")
                                                             for a in call.args)))
        parent = ctx.parent(call)
        if cast and isinstance(parent, cst.Expr):
            found[ctx.code(mc[0])] = call
        elif cast and isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            found[ctx.code(parent.targets[0].target)] = call
    return found


def _recurrent_calls(ctx: FileContext) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """Calls ``self.rnn(x, hx)`` of a module's ``nn.LSTM``/``GRU``/``RNN`` (set as
    ``self.rnn = nn.LSTM(...)`` in its class), with their state argument."""
    found = []
    for cls in ctx.nodes(cst.ClassDef):
        recurrent = {a.targets[0].target.attr.value for a in ctx.nodes(cst.Assign)
                     if ctx.contains(cls, a) and len(a.targets) == 1
                     and isinstance(a.targets[0].target, cst.Attribute)
                     and isinstance(a.targets[0].target.value, cst.Name) and a.targets[0].target.value.value == "self"
                     and isinstance(a.value, cst.Call) and ctx.resolves_to(a.value.func, _RECURRENT) is not None}
        if not recurrent:
            continue
        for call in ctx.nodes(cst.Call):
            func = call.func
            if not (ctx.contains(cls, call) and isinstance(func, cst.Attribute) and func.attr.value in recurrent
                    and isinstance(func.value, cst.Name) and func.value.value == "self"):
                continue
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            hidden = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "hx"),
                          positional[1] if len(positional) > 1 else None)
            if hidden is not None:
                found.append((call, hidden))
    return found


def _cast_back(flow: _Flow, node: cst.CSTNode) -> bool:
    """Whether the result of ``node`` is copied into a half tensor, which casts it back:
    ``x[:, 0] = x[:, 0] + noise``, ``out.copy_(a + b)``."""
    ctx = flow.ctx
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.Assign):
            dest = [t.target.value for t in ancestor.targets if isinstance(t.target, cst.Subscript)]
            return bool(dest) and ctx.contains(ancestor.value, node) and flow.value(dest[0]).kind in _HALF_KINDS
        if isinstance(ancestor, cst.Call) and _callee_name(ancestor) == "copy_" \
                and isinstance(ancestor.func, cst.Attribute) and not ctx.contains(ancestor.func, node):
            return flow.value(ancestor.func.value).kind in _HALF_KINDS
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return False
    return False


def _in_model(ctx: FileContext, node: cst.CSTNode) -> bool:
    """In a method of a module class (one that defines ``forward`` or derives from a
    ``...Module``), or in an autocast region: where the activations may be half."""
    if autocast_region(ctx, node) is not None:
        return True
    cls = next((a for a in ctx.ancestors(node) if isinstance(a, cst.ClassDef)), None)
    if cls is None:
        return False
    return any(ctx.code(b.value).endswith("Module") for b in cls.bases) or any(
        isinstance(s, cst.FunctionDef) and s.name.value == "forward" for s in cls.body.body)


def _tensor_index(flow: _Flow, expr: cst.BaseExpression, depth: int) -> bool:
    """An index that makes ``x[i] = v`` an index-put (a tensor, a mask, a list), which needs
    ``v`` in ``x``'s dtype, rather than a copy into a slice (ints, slices), which casts."""
    if depth == 0:
        return False
    if isinstance(expr, (cst.Comparison, cst.List, cst.Tuple)) or (
            isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert)):
        return True
    if isinstance(expr, cst.Subscript):
        return _tensor_index(flow, expr.value, depth - 1)
    if isinstance(expr, cst.Call):
        return not (isinstance(expr.func, cst.Name) and expr.func.value in _BUILTINS) \
            and _callee_name(expr) not in ("item", "size", "numel", "dim", "tolist")
    if isinstance(expr, cst.Name):
        b = flow.binding(expr)
        if b is None or b.parameter is not None:
            return b is not None and any(h in expr.value.lower() for h in ("idx", "index", "indices", "mask"))
        if b.value is None:
            return False
        if b.index is not None:
            return isinstance(b.value, cst.Call) and _tensor_index(flow, b.value, depth - 1)
        return _tensor_index(flow, b.value, depth - 1)
    return False


def _placed_on_device(ctx: FileContext, factory: cst.Call) -> bool:
    """A factory given a device (``device=...``, or ``.to(...)``/``.cuda()`` on its result): on
    the CPU it could not meet a GPU's half values."""
    if any(a.keyword is not None and a.keyword.value == "device" for a in factory.args):
        return True
    attribute = ctx.parent(factory)
    return isinstance(attribute, cst.Attribute) and attribute.attr.value in ("to", "cuda") \
        and isinstance(ctx.parent(attribute), cst.Call)


def _bound_before(flow: _Flow, other: cst.BaseExpression, origin: cst.Call) -> bool:
    """Whether ``other``, a chain without calls, means at ``origin`` what it means where it is:
    the binding its name has there was made before the origin."""
    if not chain_without_calls(other):
        return False
    root = _root(other)
    binding = flow.binding(root)
    if binding is None or flow.scope_of(root) is not flow.scope_of(origin):
        return False
    return binding.parameter is not None or (flow.ctx.order(binding.statement) < flow.ctx.order(origin)
                                             and not flow.ctx.contains(binding.statement, origin))


def _fix(flow: _Flow, m: _Meeting) -> Fix | None:
    """Give the float32 value the other's dtype: ``other.new_zeros(...)`` where the factory
    takes ``other``'s device, else ``dtype=other.dtype``; ``.to(other.dtype)`` for
    ``.float()``."""
    ctx = flow.ctx
    if m.other is None or not _bound_before(flow, m.other, m.origin):
        return None
    other = ctx.code(m.other)
    if _float_cast(m.origin):
        return Fix(f"Use `.to({other}.dtype)`",
                   (ctx.replace(m.origin, f"{ctx.code(m.origin.func.value)}.to({other}.dtype)"),), "unsafe")
    factory = _factory(ctx, m.origin)
    device = next((a.value for a in m.origin.args if a.keyword is not None and a.keyword.value == "device"), None)
    if device is not None and isinstance(device, cst.Attribute) and device.attr.value == "device" \
            and ctx.code(device.value) == other:
        fix = new_method_fix(ctx, m.origin, factory, m.other, "unsafe")
        if fix is not None:
            return fix
    if any(a.star for a in m.origin.args):
        return None
    args = list(m.origin.args)
    # The new last argument takes over the old one's trailing comma (and line break), if any.
    dtype = cst.Arg(cst.parse_expression(f"{other}.dtype"), keyword=cst.Name("dtype"), comma=args[-1].comma,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new = m.origin.with_changes(args=[*args, dtype])
    return Fix(f"Pass `dtype={other}.dtype`", (ctx.replace(m.origin, ctx.module.code_for_node(new)),), "unsafe")


# What a factory's fragment lets through between its parentheses: text and nested groups,
# but no `dtype=`, `*args` or `**kwargs` of its own (check() never reports a factory given
# one; a power, `2 ** n`, is let through).
_ARGUMENT = rf"(?:(?!\bdtype\s*=|(?<=[(,])\s*\*)[^()]|{PARENTHESIZED})"
# What a `.to(...)` that may only move a tensor (``_may_be_device``) holds: no `dtype=` of its
# own, nor an argument that is a `.dtype` or a floating dtype's attribute (`torch.float16`).
_TO_ARGUMENT = rf"(?:(?!(?<![\w.])dtype\s*=(?!=)|\.\s*(?:dtype|float\w*|half\w*|bfloat\w*)\s*[,)])[^()]|{PARENTHESIZED})"


def _may_make_float32(outline: Outline, call: ast.Call) -> bool:
    """A factory call check() may take for a float32 maker, as far as the ast shows it: no
    ``dtype=`` or ``**kwargs``, a call by a torch factory's name, data that may hold a float."""
    if isinstance(call.func, ast.Attribute) and call.func.attr not in _FACTORY_NAMES:
        return False  # what it resolves to ends in that name too
    if any(k.arg in ("dtype", None) for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    names = outline.qualified_names(call.func)
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if names.isdisjoint(_FACTORIES) and f"torch.{name}" not in _FACTORIES:
        return False
    keywords = {k.arg: k.value for k in call.keywords}
    if name == "tensor" or "torch.tensor" in names:
        data = keywords.get("data", call.args[0] if call.args else None)
        return isinstance(data, (ast.List, ast.Tuple)) and _may_be_float_number(data)
    size = keywords.get("size", call.args[0] if call.args else None)
    if isinstance(size, (ast.Tuple, ast.List)) and not size.elts:
        return False
    if name == "full" or "torch.full" in names:
        fill = keywords.get("fill_value", call.args[1] if len(call.args) > 1 else None)
        return fill is not None and _may_be_float_number(fill)
    return True


def _may_be_float_number(expr: ast.expr) -> bool:
    """``_evidently_float`` (or ``_float_data``), loosely: a float literal, a division,
    ``float(...)``, a float constant's name or an attribute of a call somewhere in it."""
    return any((isinstance(n, ast.Constant) and isinstance(n.value, float))
               or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div))
               or (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "float")
               or (isinstance(n, ast.Attribute) and (isinstance(n.value, ast.Call)
                                                     or n.attr in ("inf", "nan", "pi", "e", "tau")))
               for n in ast.walk(expr))


def _may_be_device(to: ast.Call) -> bool:
    """A ``.to(...)`` call that may only move its tensor: ``_device_like`` arguments, loosely."""
    return not any(k.arg == "dtype" for k in to.keywords) and not any(
        isinstance(a, ast.Attribute) and (a.attr == "dtype" or a.attr.startswith(("float", "half", "bfloat")))
        for a in to.args)


def _behind_indexing(expr: ast.expr) -> ast.expr:
    """What ``expr`` indexes or reshapes, through any number of them."""
    while isinstance(expr, ast.Subscript) or (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
                                              and expr.func.attr in _RESHAPES):
        expr = expr.value if isinstance(expr, ast.Subscript) else expr.func.value
    return expr


def _may_be_integral(expr: ast.expr, names: set[str]) -> bool:
    """``_integral``, loosely: a comparison, ``~m``, an integer-making call, or a name assigned
    one of those anywhere, behind indexing and reshapes."""
    expr = _behind_indexing(expr)
    if isinstance(expr, ast.Compare) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Invert)):
        return True
    if isinstance(expr, ast.Call):
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", None)
        return name in _INTEGRAL
    return isinstance(expr, ast.Name) and expr.id in names


def _maybe_integral_names(outline: Outline) -> set[str]:
    """The names an assignment anywhere in the file (plain or annotated, as ``_Flow`` binds
    them) may give integers, as ``_may_be_integral`` reads them."""
    names: set[str] = set()
    assignments = [(a.targets, a.value) for a in outline.nodes(ast.Assign)] \
        + [([a.target], a.value) for a in outline.nodes(ast.AnnAssign) if a.value is not None]
    while True:
        before = len(names)
        pending = []
        for targets, value in assignments:
            if _may_be_integral(value, names):
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            else:  # one that matched has added all it can
                pending.append((targets, value))
        assignments = pending
        if len(names) == before:
            return names


# `_may_be_integral` asked of the text, before anything is parsed: a file in which no
# `.float()` may cast integers needs no ast for that fragment group. Read loosely (more
# `name = ` than assignments, more than comparisons), and where a string or a comment could
# mislead a backward reading, the answer is yes.
_FLOAT_CALL = re.compile(tolerant_of_spacing(r"\.float\(\)"))
_ONE_LINE_STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'")
_INTEGRAL_MARK = re.compile(r"<|(?<!-)>|~|==|!=|\bin\b|\bis\b|\b(?:" + "|".join(sorted(_INTEGRAL)) + r")\s*\(")
_LEADING_NAME = re.compile(r"[^\W\d]\w*")
# At the top of a value: an operator that makes it no name, comparison or call.
_OPERATION = re.compile(r"[-+*/%@&|^,]|:=|\b(?:if|and|or|not|lambda|await|yield)\b")
# An arithmetic operator, and what binds less tightly (a comparison, `not`, `and`, `or`, a
# conditional, a lambda): a value with the first at its top and none of the second is an
# arithmetic operation, even one whose operands are comparisons (`(a > b).sum() + 1`).
_ARITHMETIC = re.compile(r"[-+*/%@&|^]")
_LOOSER = re.compile(r"<|>|==|!=|:=|\b(?:in|is|not|and|or|if|else|lambda)\b")


def _rest_of_statement(text: str, start: int) -> str | None:
    """The statement's text from ``start`` to its end, over the lines its open brackets take
    (brackets counted outside one-line strings and comments); None where a triple quote or a
    backslash makes that reading unsure, or past 50 lines."""
    lines = []
    depth = 0
    for _ in range(50):
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if '"' * 3 in line or "'" * 3 in line or line.rstrip().endswith("\\"):
            return None
        lines.append(line)
        code = _ONE_LINE_STRING.sub("", line).split("#", 1)[0]
        depth += sum(map(code.count, "([{")) - sum(map(code.count, ")]}"))
        if depth <= 0 or end < 0:
            return "\n".join(lines)
        start = end + 1
    return None


def _top_level(code: str) -> str | None:
    """``code`` with what its brackets hold left out (the brackets kept), up to a comma or a
    closing bracket of its own (the end of a default or a keyword's value); None where a
    bracket does not close."""
    kept, depth = [], 0
    for char in code:
        if char in ")]}":
            depth -= 1
            if depth < 0:
                return "".join(kept)
        elif char == "," and not depth:
            break
        if not depth:
            kept.append(char)
        if char in "([{":
            depth += 1
    return "".join(kept) if not depth else None


def _integers_in(value: str) -> bool | str:
    """What ``_may_be_integral`` may say of an expression's code, read at its top level (not
    inside its brackets): True (it may hold integers: a comparison, `~`, an integer-making
    call; or the reading is unsure), False (an operation, a literal, a display), or the name
    whose integers it holds (behind indexing and calls)."""
    code = _ONE_LINE_STRING.sub("0", value)
    if '"' in code or "'" in code:
        return True
    code = re.sub(r"#[^\n]*", "", code).strip()
    while True:
        top = _top_level(code)
        if top is None:
            return True
        if top != "()":
            break
        code = code[1:-1].strip()  # a parenthesized expression: what it holds
    if _ARITHMETIC.search(top) and not _LOOSER.search(top):
        return False  # as `_may_be_integral` reads a binary or unary operation
    if _INTEGRAL_MARK.search(top) or top.startswith("("):
        return True
    if _OPERATION.search(top):
        return False
    lead = _LEADING_NAME.match(top)
    return lead[0] if lead else False


def _assigned_integers(text: str) -> Callable[[str], bool]:
    """``_maybe_integral_names``, loosely, on the text: whether some `name = ` (or `name: T =`,
    a keyword argument, a walrus) assigns a value that ``_integers_in`` says may hold integers,
    or that of a name which may."""
    known: dict[str, bool] = {}

    def assigned(name: str) -> bool:
        if name not in known:
            seen, pending, known[name] = {name}, [name], False
            while pending and not known[name]:
                other = pending.pop()
                for assignment in re.finditer(rf"{other}(?<![\w.]{other})[ \t)]*(?::[^=\n]*)?=(?!=)", text):
                    rest = _rest_of_statement(text, assignment.end())
                    verdict = True if rest is None else _integers_in(rest)
                    if verdict is True or (verdict and known.get(verdict)):
                        known[name] = True
                        break
                    if verdict and verdict not in seen:
                        seen.add(verdict)
                        pending.append(verdict)
        return known[name]

    return assigned


# The factory calls the fragments look for: given a device (a `tensor` given its data as a
# list or a tuple, or by keyword), or moved by `.to(...)`/`.cuda(...)` at once.
_PLACED_FACTORIES = (
    *(rf"{f}(?<!\w{f})\s*\({_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)" for f in _FACTORY_NAMES if f != "tensor"),
    rf"tensor(?<!\wtensor)\s*\(\s*(?=[\[(]){_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)",
    rf"tensor(?<!\wtensor)\s*\((?={_ARGUMENT}*?\bdata\s*=){_ARGUMENT}*?\bdevice\s*={_ARGUMENT}*\)")
_MOVED_FACTORIES = tuple(rf"{f}(?<!\w{f})\s*\({_ARGUMENT}*\)[\s)]*\.\s*(?:cuda\s*\(|to\s*\({_TO_ARGUMENT}*\))"
                         for f in _FACTORY_NAMES)
# In the text of a value, what ``_may_be_float_number`` accepts, loosely: a float literal (a
# point or an exponent by a digit), a division, `float(...)`, a float constant's name, an
# attribute of a call.
_FLOAT_MARK = re.compile(r"\d[\d_]*\.|\.\d|\d[eE][-+]?\d|/|\bfloat[\s\\]*\(|"
                         r"\.[\s\\]*(?:inf|nan|pi|e|tau)\b|\)[\s\\]*\.")
_KEYWORD = re.compile(r"\s*(\w+)\s*=(?!=)")


def _argument(arguments: list[str], position: int, keyword: str) -> str | None:
    """The argument given by ``keyword``, else the one at ``position`` (before any keyword)."""
    positional = []
    for argument in arguments:
        named = _KEYWORD.match(argument)
        if named is None:
            positional.append(argument)
        elif named.group(1) == keyword:
            return argument[named.end():]
    return positional[position] if len(positional) > position else None


def _may_make_float32_text(text: str, start: int) -> bool:
    """``_may_make_float32`` of the factory call whose name starts at ``start``, on the
    text: no empty size; a `tensor`'s data a list or a tuple that may hold a float, a
    `full`'s fill value one that may be a float; yes where the reading is unsure."""
    name = _LEADING_NAME.match(text, start).group()
    arguments = call_arguments(text, text.index("(", start))
    if arguments is None:
        return True
    if name == "tensor":
        data = _argument(arguments, 0, "data")
        return data is not None and data.lstrip()[:1] in ("[", "(") and _FLOAT_MARK.search(data) is not None
    size = _argument(arguments, 0, "size")
    if size is not None and size.strip() in ("()", "[]"):
        return False
    if name == "full":
        fill = _argument(arguments, 1, "fill_value")
        return fill is not None and _FLOAT_MARK.search(fill) is not None
    return True


def _factory_test(patterns: tuple[str, ...]):
    """A text test: some call that one of the factory ``patterns`` finds may make float32."""
    compiled = [re.compile(tolerant_of_spacing(p)) for p in patterns]

    def test(text: str) -> bool:
        return any(_may_make_float32_text(text, m.start()) for c in compiled for m in c.finditer(text))
    return test


_may_place_float32 = _factory_test(_PLACED_FACTORIES)
_may_move_float32 = _factory_test(_MOVED_FACTORIES)


def _may_cast_integers(text: str) -> bool:
    """Whether the receiver of some `.float()` may be what ``_may_be_integral`` accepts, read
    backwards: behind indexing and reshapes, an integer-making call, a name assigned integers,
    or a parenthesized expression that ``_integers_in`` says may hold them; not an attribute,
    a literal, nor any other call."""
    assigned = None
    for call in _FLOAT_CALL.finditer(text):
        end = call.start()
        while True:
            end = space_before(text, end)
            if end is None:  # a comment in the way
                return True
            if not end:
                break
            if text[end - 1] in ")]":
                opening = enclosing_bracket(text, end - 1)
                if opening is None or opening < 0:
                    return True
                if text[end - 1] == "]":
                    end = opening  # what is indexed
                    continue
                name_end = space_before(text, opening)
                if name_end is None:
                    return True
                name_start = word_before(text, name_end)
                name = text[name_start:name_end]
                if not name or keyword.iskeyword(name):  # a parenthesized expression
                    verdict = _integers_in(text[opening + 1:end - 1])
                    assigned = assigned or _assigned_integers(text)
                    if verdict is True or (verdict and assigned(verdict)):
                        return True
                    break
                if name[0].isdigit() or name in _INTEGRAL:
                    return True  # an integer-making call
                dot = space_before(text, name_start)
                if dot is None:
                    return True
                if dot and text[dot - 1] == "." and name in _RESHAPES:
                    end = dot - 1  # what is reshaped
                    continue
                break  # a call that makes no integers
            name_start = word_before(text, end)
            name = text[name_start:end]
            if not name or name[0].isdigit() or name in ("None", "True", "False"):
                break  # a literal (or text in a string or a comment): no integers
            if keyword.iskeyword(name):
                return True
            dot = space_before(text, name_start)
            if dot is None:
                return True
            if not (dot and text[dot - 1] == "."):  # an attribute is never a name's integers
                assigned = assigned or _assigned_integers(text)
                if assigned(name):
                    return True
            break
    return False


_HALF_DTYPES = frozenset(name for name, dtype in DTYPES.items() if dtype in ("float16", "bfloat16"))
_HALF_DTYPE_ATTRIBUTES = frozenset(name.rsplit(".", 1)[1] for name in _HALF_DTYPES)
_DTYPE_ATTRIBUTES = frozenset(name.rsplit(".", 1)[1] for name in DTYPES)


def _tensor_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """``_tensor_parameter``'s parameters, loosely (string defaults are not read): the names
    ``_Flow`` may take for activations."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    defaults.update(zip(args.kwonlyargs, args.kw_defaults))
    return {a.arg for a in [*positional, *args.kwonlyargs]
            if a.arg not in ("self", "cls") and not any(h in a.arg.lower() for h in _NON_FLOAT_HINTS)
            and (a.annotation is None or "Tensor" in ast.unparse(a.annotation))
            and not (isinstance(defaults.get(a), ast.Constant) and type(defaults[a].value) in (int, float, bool))}


_PARAMETER = object()  # a tensor parameter's binding


def _subscript_elements(index: ast.expr) -> list[ast.expr]:
    """What libcst takes for the elements of ``x[index]``: ``x[a, b]`` has two, ``x[(a, b)]``
    one (a tuple, which starts before its first element)."""
    if isinstance(index, ast.Tuple) and index.elts and (index.lineno, index.col_offset) == (
            index.elts[0].lineno, index.elts[0].col_offset):
        return index.elts
    return [index]


# The makers ``_AstFlow.carried`` follows, as bits: a factory (reported wherever it meets a half
# value) and a `.float()` of integers (only where the op needs equal dtypes).
_FACTORY, _CAST = 1, 2


def _callee_on_ast(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _is_super(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and not expr.args and getattr(expr.func, "id", None) == "super"


def _self_or_super(expr: ast.expr) -> bool:
    """What ``_Flow`` takes for no tensor of a method call: ``self``, ``super()``."""
    return (isinstance(expr, ast.Name) and expr.id == "self") or _is_super(expr)


def _self_rooted(expr: ast.expr) -> bool:
    """Whether ``expr``'s code may start with ``self`` (what ``call_spelling`` asks of a
    method's tensor): its leftmost name does (``self.model``, ``self_attn[0]``)."""
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return isinstance(expr, ast.Name) and expr.id.startswith("self")


class _AstFlow:
    """``_Flow`` on the ast, loosely, for ``may_fire``: bindings as ``_Flow.binding`` finds them
    (the last one before a name in its function), ``_tensor_index``, which makers' float32 a
    value may carry (``_Flow.value(...).origin``), and whether a value may be half
    (``_Flow.value(...).kind in _HALF_KINDS``: a tensor parameter, a module's weight, a
    `.half()`, a half ``dtype=``, a `lower_precision_fp` op, a loss's call of its model in a
    project that enables autocast, or a name bound to one) or made half (``kind == HALF``: from
    a `.half()` or a half ``dtype=`` only), through the calls and operators ``_Flow`` follows.
    Built for the functions in ``within`` (by id; 0: the module's code) and asked only of
    them. ``makers``: the calls (by id) whose float32 check() may report, as bits."""

    def __init__(self, outline: Outline, scopes: Scopes, within: set[int], makers: dict[int, int]):
        self.outline = outline
        self.makers = makers
        self.loss_places = {id(f) for f in loss_places_on_ast(outline)}
        self.lower_precision = _lower_precision_names()
        self._half: dict[tuple[int, bool], bool] = {}  # by id of the node and whether made half
        self._carried: dict[int, int] = {}
        # By function and name, in source order: (start, end, value, index in an unpacking),
        # the value _PARAMETER for a tensor parameter, None for one that is not or a loop target.
        self.bindings: dict[int, dict[str, list[tuple]]] = {}
        for f in [*outline.nodes(ast.FunctionDef), *outline.nodes(ast.AsyncFunctionDef)]:
            if id(f) not in within:
                continue
            tensors = _tensor_parameters(f)
            args = f.args
            names = self.bindings.setdefault(id(f), {})
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                names.setdefault(a.arg, []).append(((0, -1), (0, -1), _PARAMETER if a.arg in tensors else None, None))
        statements = [n for kind in BINDING_STATEMENTS for n in outline.nodes(kind)
                      if scopes[id(n)] in within and id(n) not in scopes.in_class_body]
        for node in sorted(statements, key=lambda n: (n.lineno, n.col_offset)):
            span = ((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign):
                pairs = [(node.target, node.value)] if node.value is not None else []
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                pairs = [(node.target, None)]
            else:  # a `with`: each `as` target is a binding of its own
                pairs = []
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name):
                        v = item.optional_vars
                        self._bind(scopes[id(node)], v.id, ((item.context_expr.lineno, item.context_expr.col_offset),
                                                              (v.end_lineno, v.end_col_offset)), None, None)
            for target, value in pairs:
                if isinstance(target, ast.Name):
                    self._bind(scopes[id(node)], target.id, span, value, None)
                elif isinstance(target, (ast.Tuple, ast.List)):
                    for i, e in enumerate(target.elts):
                        if isinstance(e, ast.Name):
                            self._bind(scopes[id(node)], e.id, span, value, i)
        self.appended: dict[tuple[int, str], list[ast.expr]] = {}  # what ``_Flow.list_items`` reads
        for c in outline.nodes(ast.Call):
            if isinstance(c.func, ast.Attribute) and c.func.attr == "append" and len(c.args) == 1 \
                    and isinstance(c.func.value, ast.Name) and scopes[id(c)] in within:
                self.appended.setdefault((scopes[id(c)], c.func.value.id), []).append(c.args[0])

    def _bind(self, scope: int, name: str, span, value, index) -> None:
        self.bindings.setdefault(scope, {}).setdefault(name, []).append((*span, value, index))

    def _binding(self, name: ast.Name, scope: int) -> tuple | None:
        """``_Flow.binding``: the last binding made before ``name`` that does not contain it."""
        at = (name.lineno, name.col_offset)
        last = None
        for binding in self.bindings.get(scope, {}).get(name.id, ()):
            start, end = binding[0], binding[1]
            if start != (0, -1) and (start >= at or at <= end):
                break
            last = binding
        return last

    def tensor_index(self, expr: ast.expr, scope: int, depth: int = 4) -> bool:
        """``_tensor_index``: an index that makes ``x[i] = v`` an index-put."""
        if depth == 0:
            return False
        if isinstance(expr, (ast.Compare, ast.List, ast.Tuple)) or (
                isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Invert)):
            return True
        if isinstance(expr, ast.Subscript):
            return self.tensor_index(expr.value, scope, depth - 1)
        if isinstance(expr, ast.Call):
            return not (isinstance(expr.func, ast.Name) and expr.func.id in _BUILTINS) \
                and getattr(expr.func, "attr", getattr(expr.func, "id", None)) not in ("item", "size", "numel", "dim", "tolist")
        if isinstance(expr, ast.Name):
            binding = self._binding(expr, scope)
            if binding is None or binding[0] == (0, -1):  # unbound, or a parameter
                return binding is not None and any(h in expr.id.lower() for h in ("idx", "index", "indices", "mask"))
            value, index = binding[2], binding[3]
            if value is None:
                return False
            if index is not None:
                return isinstance(value, ast.Call) and self.tensor_index(value, scope, depth - 1)
            return self.tensor_index(value, scope, depth - 1)
        return False

    def _bound_value(self, name: ast.Name, scope: int) -> ast.expr | None:
        """The expression ``_Flow.value`` reads for ``name`` (None: a parameter, a loop or `with`
        target, unbound, or what an unpacking takes no value from)."""
        last = self._binding(name, scope)
        if last is None or last[2] is None or last[2] is _PARAMETER:
            return None
        value, index = last[2], last[3]
        if index is not None and isinstance(value, (ast.Tuple, ast.List)):
            element = value.elts[index] if index < len(value.elts) else None
            return None if isinstance(element, ast.Starred) else element
        if index is not None and isinstance(value, ast.Call) and index > 0 \
                and _callee_on_ast(value.func) in _VALUES_AND_INDICES:
            return None  # the indices
        return value

    def _list_items(self, name: ast.Name, scope: int) -> list[ast.expr] | None:
        """``_Flow.list_items``, loosely: the elements of the list literal ``name`` is bound to
        and whatever ``name.append(...)`` adds anywhere in the function."""
        last = self._binding(name, scope)
        if last is None or last[3] is not None or not isinstance(last[2], ast.List):
            return None
        return [*last[2].elts, *self.appended.get((scope, name.id), ())]

    def _operands(self, call: ast.Call, scope: int) -> list[ast.expr]:
        """The values a torch function's result is promoted from (``_Flow._call``): its
        positional arguments, the elements of a list or tuple among them, and what a list
        built in the function holds."""
        found = []
        for arg in call.args:
            items = self._list_items(arg, scope) if isinstance(arg, ast.Name) else None
            if items is not None:
                found.extend(items)
            elif isinstance(arg, (ast.List, ast.Tuple)):
                found.extend(arg.elts)
            elif not isinstance(arg, ast.Starred):
                found.append(arg)
        return found

    def _method_of(self, call: ast.Call) -> ast.expr | None:
        """The tensor ``_Flow`` surely takes for a method call's receiver: ``x`` of ``x.f(...)``
        where ``x`` is no ``self...`` or ``super()`` and ``f`` no torch function's name (the call
        then gives ``x``'s value, whatever its arguments); None otherwise."""
        func = call.func
        if not isinstance(func, ast.Attribute) or _self_rooted(func.value) or _is_super(func.value):
            return None
        if any(n.startswith("torch.") for n in self.outline.qualified_names(func)):
            return None
        return func.value

    def may_be_device(self, expr: ast.expr, scope: int, depth: int = 8) -> bool:
        """``_device_like``, loosely: ``x.device``, a literal, a call of ``device``/``torch.device``,
        a name with ``device`` in it, or one bound to any of those."""
        if isinstance(expr, ast.Attribute):
            return expr.attr == "device"
        if isinstance(expr, (ast.Constant, ast.Starred)):
            return True
        if isinstance(expr, ast.Call):
            return _callee_on_ast(expr.func) == "device" or "torch.device" in self.outline.qualified_names(expr.func)
        if isinstance(expr, ast.Name):
            if "device" in expr.id.lower() or depth == 0:
                return True
            last = self._binding(expr, scope)
            return last is not None and last[2] not in (None, _PARAMETER) and last[3] is None \
                and self.may_be_device(last[2], scope, depth - 1)
        return False

    def carried(self, expr: ast.expr | None, scope: int, depth: int = 200) -> int:
        """The makers (as bits) whose float32 ``expr``'s value may carry, as ``_Flow.value``
        keeps an origin: through names, indexing, `+ - * /`, a tensor's methods that keep its
        values (not `.float()`, `.type_as`, `new_*`, nor a `.to(...)` given anything but a
        device) and torch functions of it; not through a module or helper, `@`, or a cast."""
        if depth == 0:
            return _FACTORY | _CAST  # as far as it is worth following
        key = id(expr)
        if key not in self._carried:
            self._carried[key] = self._carries(expr, scope, depth)
        return self._carried[key]

    def _carries(self, expr: ast.expr | None, scope: int, depth: int) -> int:
        if isinstance(expr, ast.Name):
            value = self._bound_value(expr, scope)
            return self.carried(value, scope, depth - 1) if value is not None else 0
        if isinstance(expr, (ast.Subscript, ast.Starred)):
            return self.carried(expr.value, scope, depth - 1)
        if isinstance(expr, ast.Attribute):
            return self.carried(expr.value, scope, depth - 1) if expr.attr in _SAME_VALUE_ATTRIBUTES else 0
        if isinstance(expr, ast.UnaryOp):
            return 0 if isinstance(expr.op, (ast.Invert, ast.Not)) else self.carried(expr.operand, scope, depth - 1)
        if isinstance(expr, ast.BinOp):  # `@` is a `lower_precision_fp` op: its result has no maker
            return 0 if isinstance(expr.op, ast.MatMult) else \
                self.carried(expr.left, scope, depth - 1) | self.carried(expr.right, scope, depth - 1)
        if isinstance(expr, ast.IfExp):
            return self.carried(expr.body, scope, depth - 1) | self.carried(expr.orelse, scope, depth - 1)
        if not isinstance(expr, ast.Call):
            return 0  # a list, a comparison, a constant: `_Flow.value` knows no maker in them
        made = self.makers.get(id(expr))
        if made is not None:
            return made
        func = expr.func
        name = _callee_on_ast(func)
        if name in _NOT_FLOAT or (isinstance(func, ast.Name) and func.id in _BUILTINS) \
                or (not self.outline.qualified_names(func).isdisjoint(_LIKE_FACTORIES)
                    and not self.outline.surely_qualified_names(func).isdisjoint(_LIKE_FACTORIES)):
            return 0
        torch = any(n.startswith("torch.") for n in self.outline.qualified_names(func))
        found = 0
        # A method of a tensor (which any `x.f` may be, unless it is a torch function): the
        # tensor's maker, unless the method casts, makes a new tensor or takes another's dtype.
        tensor = func.value if isinstance(func, ast.Attribute) and not _self_or_super(func.value) else None
        if tensor is not None and name not in ("half", "bfloat16", "type_as") and not name.startswith("new_") \
                and not (name == "float" and not expr.args) \
                and not (name == "to" and (any(k.arg == "dtype" for k in expr.keywords)
                                           or not all(self.may_be_device(a, scope) for a in expr.args))):
            found = self.carried(tensor, scope, depth - 1)
        # A torch function (`super().f(x)` and a module built and called at once are spelled
        # as one): what it promotes its operands to. A helper or `self.f(...)` makes its own.
        if torch or isinstance(func, ast.Call) or (isinstance(func, ast.Attribute) and _is_super(func.value)):
            for operand in self._operands(expr, scope):
                found |= self.carried(operand, scope, depth - 1)
        return found

    def _dtype(self, expr: ast.expr, scope: int, depth: int, made: bool) -> bool:
        """``_Flow._dtype`` may give half (or, ``made``, HALF): a half dtype, or ``y.dtype`` of
        such a ``y``."""
        if isinstance(expr, ast.Attribute):
            if expr.attr in _HALF_DTYPE_ATTRIBUTES:
                return True
            if expr.attr == "dtype":
                return self.may_be_half(expr.value, scope, depth - 1, made)
        return not self.outline.qualified_names(expr).isdisjoint(_HALF_DTYPES)

    def may_be_half(self, expr: ast.expr | None, scope: int, depth: int = 200, made: bool = False) -> bool:
        """Whether ``expr``'s value may be half (``made``: made half, ``kind == HALF``)."""
        if depth == 0:
            return True  # as far as it is worth following
        key = (id(expr), made)
        if key not in self._half:
            self._half[key] = self._value(expr, scope, depth, made)
        return self._half[key]

    def _value(self, expr: ast.expr | None, scope: int, depth: int, made: bool) -> bool:
        if isinstance(expr, ast.Name):
            return self._name(expr, scope, depth, made)
        if isinstance(expr, (ast.Subscript, ast.Starred)):
            return self.may_be_half(expr.value, scope, depth - 1, made)
        if isinstance(expr, ast.Attribute):
            return (expr.attr in ("weight", "bias") and not made) or (
                expr.attr in _SAME_VALUE_ATTRIBUTES and self.may_be_half(expr.value, scope, depth - 1, made))
        if isinstance(expr, ast.UnaryOp):
            return not isinstance(expr.op, (ast.Invert, ast.Not)) \
                and self.may_be_half(expr.operand, scope, depth - 1, made)
        if isinstance(expr, ast.BinOp):  # `@` is half under autocast whatever it multiplies
            return (isinstance(expr.op, ast.MatMult) and not made) or self.may_be_half(expr.left, scope, depth - 1, made) \
                or self.may_be_half(expr.right, scope, depth - 1, made)
        if isinstance(expr, ast.IfExp):
            return self.may_be_half(expr.body, scope, depth - 1, made) \
                or self.may_be_half(expr.orelse, scope, depth - 1, made)
        if isinstance(expr, (ast.List, ast.Tuple)):
            return any(self.may_be_half(e, scope, depth - 1, made) for e in expr.elts)
        if isinstance(expr, ast.Call):
            return self._call(expr, scope, depth, made)
        return False

    def _name(self, name: ast.Name, scope: int, depth: int, made: bool) -> bool:
        last = self._binding(name, scope)
        if last is not None and last[2] is _PARAMETER:
            return not made  # the activations', never made half
        value = self._bound_value(name, scope)
        if value is None:
            return False
        if isinstance(value, ast.List) and any(
                self.may_be_half(e, scope, depth - 1, made) for e in self.appended.get((scope, name.id), ())):
            return True
        return self.may_be_half(value, scope, depth - 1, made)

    def _call(self, call: ast.Call, scope: int, depth: int, made: bool) -> bool:
        func = call.func
        name = _callee_on_ast(func)
        dtype = next((k.value for k in call.keywords if k.arg == "dtype"), None)
        names = self.outline.qualified_names(func)
        if not names.isdisjoint(_FACTORIES) or (name in _FACTORY_NAMES and any(k.arg == "device" for k in call.keywords)):
            return dtype is not None and self._dtype(dtype, scope, depth, made)  # else float32, or not known
        if name in ("half", "bfloat16"):
            return True
        receiver = func.value if isinstance(func, ast.Attribute) \
            and not (isinstance(func.value, ast.Name) and func.value.id == "self") else None
        # Where the dtype given decides, else the tensor's (or `.to(other)`'s).
        method = name if receiver is not None else None
        like = not names.isdisjoint(_LIKE_FACTORIES)
        if dtype is not None and (method == "to" or (method or "").startswith("new_") or like):
            return self._dtype(dtype, scope, depth, made)
        if (method or "").startswith("new_"):
            return self.may_be_half(receiver, scope, depth - 1, made)
        if like:
            return bool(call.args) and self.may_be_half(call.args[0], scope, depth - 1, made)
        if (method == "float" and not call.args) or name in _NOT_FLOAT \
                or (isinstance(func, ast.Name) and func.id in _BUILTINS):
            return False
        tensor = self._method_of(call)
        if tensor is not None:  # `_Flow` reads the tensor, not the arguments
            if name == "type_as":
                return bool(call.args) and self.may_be_half(call.args[0], scope, depth - 1, made)
            if name == "to":
                return self._to(call, tensor, scope, depth, made)
            return not _float32_everywhere(f"torch.Tensor.{name}") and self.may_be_half(tensor, scope, depth - 1, made)
        if method == "to" and call.args and ((isinstance(call.args[0], ast.Attribute) and call.args[0].attr
                                              in _DTYPE_ATTRIBUTES) or not self.outline.qualified_names(
                                                  call.args[0]).isdisjoint(DTYPES)):
            return self._dtype(call.args[0], scope, depth, made)
        if not made and (name in self.lower_precision or (isinstance(func, ast.Call) and getattr(
                func.func, "attr", getattr(func.func, "id", None)) in self.lower_precision)):
            return True  # half under autocast whatever goes in
        torch = {n for n in names if n.startswith("torch.")}
        spellings = torch or ({f"torch.Tensor.{name}"} if isinstance(func, ast.Attribute) and not _self_rooted(func.value)
                              else set())
        if spellings and all(_float32_everywhere(s) for s in spellings):
            return False  # float32 under autocast, whatever goes in
        if made and not torch and (isinstance(func, ast.Name) or receiver is None and not isinstance(func, ast.Call)):
            return False  # a helper, `self.f(...)`: its result is the activations', never made half
        operands = [*call.args, *(k.value for k in call.keywords), *([receiver] if receiver is not None else [])]
        return any(self.may_be_half(o, scope, depth - 1, made) for o in operands) \
            or (not made and self._model_call(call, scope))

    def _to(self, call: ast.Call, tensor: ast.expr, scope: int, depth: int, made: bool) -> bool:
        """``_Flow._to``: the first argument that is a dtype or no device decides (a cast, or
        `.to(other)`: other's dtype); with only devices, the tensor's value."""
        for arg in call.args:
            if self._dtype(arg, scope, depth, made) or self.may_be_half(arg, scope, depth - 1, made):
                return True
            if not self.may_be_device(arg, scope):
                return False
        return self.may_be_half(tensor, scope, depth - 1, made)

    def _model_call(self, call: ast.Call, scope: int) -> bool:
        """``_model_call``, loosely (any method ``self.name`` of a loss place), in a project
        that enables autocast (asked last: it reads the project)."""
        func = call.func
        project = self.outline.project
        return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
            and "loss" not in func.attr.lower() and "criterion" not in func.attr.lower() \
            and scope in self.loss_places and project is not None and project.autocast


def _may_fire(outline: Outline) -> bool:
    """What check() reports, as far as the ast shows it: a float32 maker placed on a device
    (or a `.float()` of integers) whose value, as ``_Flow`` follows it, may meet a half value
    where check() looks: an index-put or scatter (for `.float()` too), a half module's call,
    an RNN's state, or (a factory only) a concatenation, sum or product in a model (where the
    activations may be half) or elsewhere with what the file made half."""
    calls = outline.nodes(ast.Call)
    moved = {id(c.func.value) for c in calls if isinstance(c.func, ast.Attribute)
             and (c.func.attr == "cuda" or (c.func.attr == "to" and _may_be_device(c)))}
    factories = {id(c) for c in calls if (id(c) in moved or any(k.arg == "device" for k in c.keywords))
                 and _may_make_float32(outline, c)}
    index_puts = [a for a in outline.nodes(ast.Assign) if not isinstance(a.value, ast.Constant)
                  and any(isinstance(t, ast.Subscript) for t in a.targets)]
    strict_calls = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr in _STRICT_METHODS]
    floats = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "float" and not c.args]
    casts = set()
    # A `.float()` is reported only where dtypes must agree (an index-put, a scatter, a half
    # module's call), and only a name's cast asks which names hold integers.
    if floats and (index_puts or strict_calls or _makes_half(outline)):
        integral = _maybe_integral_names(outline) \
            if any(isinstance(_behind_indexing(c.func.value), ast.Name) for c in floats) else set()
        casts = {id(c) for c in floats if _may_be_integral(c.func.value, integral)}
    if not factories and not casts:
        return False
    scopes = outline.scopes
    makers = {**dict.fromkeys(factories, _FACTORY), **dict.fromkeys(casts, _CAST)}
    # Two values meet where a maker's value is, so only in a function that holds a maker.
    flow = _AstFlow(outline, scopes, {scopes[m] for m in makers}, makers)

    made_half = _makes_half(outline)

    @cache
    def in_model() -> set[int]:
        return _in_model_on_ast(outline)

    def meet(node: ast.AST, float32: ast.expr, other: ast.expr, makers: int, promotes: bool = False) -> bool:
        """A value one of ``makers`` made float32 may meet a half value there; where the op
        ``promotes``, a half value in a model, elsewhere only one the file made half."""
        scope = scopes[id(node)]
        if not flow.carried(float32, scope) & makers:
            return False
        if not promotes or id(node) in in_model():
            return flow.may_be_half(other, scope)
        return made_half and flow.may_be_half(other, scope, made=True)

    for a in index_puts:
        if any(isinstance(t, ast.Subscript)
               and (meet(a, t.value, a.value, _FACTORY | _CAST) or meet(a, a.value, t.value, _FACTORY | _CAST))
               and any(flow.tensor_index(i, scopes[id(a)]) for i in _subscript_elements(t.slice))
               for t in a.targets):
            return True
    for c in strict_calls:
        position, keyword = _STRICT_METHODS[c.func.attr]
        source = next((k.value for k in c.keywords if k.arg == keyword),
                      c.args[position] if len(c.args) > position else None)
        if source is not None and (meet(c, c.func.value, source, _FACTORY | _CAST)
                                   or meet(c, source, c.func.value, _FACTORY | _CAST)):
            return True
    half_modules = _may_be_half_modules(outline) if made_half else set()
    # The last names half modules may be called by (None: `models[0]`), not to render every call.
    half_module_names = {m.rsplit(".", 1)[-1] for m in half_modules} | {None}
    recurrent = bool(outline.calls_to(_RECURRENT))
    for c in calls if half_modules or recurrent else ():
        arguments = [*c.args, *(k.value for k in c.keywords)]
        if half_modules and _callee_on_ast(c.func) in half_module_names \
                and ast.unparse(c.func) in half_modules and any(flow.carried(a, scopes[id(c)]) for a in arguments):
            return True  # passed to a half module
        if recurrent and len(arguments) > 1 and any(flow.carried(e, scopes[id(c)]) & _FACTORY for a in arguments
                                                    for e in (a.elts if isinstance(a, ast.Tuple) else [a])) \
                and any(flow.may_be_half(a, scopes[id(c)]) for a in arguments):
            return True  # an RNN's state
    if not made_half and not in_model():
        return False  # nowhere a value that promotes may meet a half one
    lower_precision = _lower_precision_names()
    for c in calls:
        if not outline.qualified_names(c.func).isdisjoint(_CONCATENATIONS) and any(
                meet(c, e, other, _FACTORY, promotes=True)
                for group in [*c.args, *(k.value for k in c.keywords)] if isinstance(group, (ast.List, ast.Tuple))
                for e in group.elts for other in group.elts if other is not e):
            return True
        operands = [*c.args, *([c.func.value] if isinstance(c.func, ast.Attribute) else [])]
        if _callee_on_ast(c.func) in lower_precision and any(
                meet(c, e, other, _FACTORY, promotes=True) for e in operands for other in operands if other is not e):
            return True
    return any(isinstance(b.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.MatMult))
               and any(meet(b, side, other, _FACTORY, promotes=True)
                       for side, other in ((b.left, b.right), (b.right, b.left)))
               for b in outline.nodes(ast.BinOp))


def _makes_half(outline: Outline) -> bool:
    """Whether the file may make something half: `.half()`, `.bfloat16()`, a half dtype (by its
    attribute, or imported by name)."""
    return any(a.attr in _HALF_DTYPE_ATTRIBUTES for a in outline.nodes(ast.Attribute)) or any(
        a.name in _HALF_DTYPE_ATTRIBUTES for i in outline.nodes(ast.ImportFrom) for a in i.names)


def _may_be_half_modules(outline: Outline) -> set[str]:
    """``_half_modules``' keys, as ``ast.unparse`` writes them: what a statement of its own
    makes half (`model.half()`, `.bfloat16()`, `.to(torch.float16)`), or the name it is
    assigned to."""
    def makes_half(value: ast.expr) -> bool:
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)):
            return False
        if value.func.attr in ("half", "bfloat16"):
            return not value.args and not value.keywords
        return value.func.attr == "to" and any(not outline.qualified_names(a).isdisjoint(_HALF_DTYPES)
                                               for a in [*value.args, *(k.value for k in value.keywords)])

    found = {ast.unparse(s.value.func.value) for s in outline.nodes(ast.Expr) if makes_half(s.value)}
    found.update(ast.unparse(a.targets[0]) for a in outline.nodes(ast.Assign)
                 if len(a.targets) == 1 and makes_half(a.value))
    return found


@lru_cache(maxsize=None)
def _lower_precision_spellings(table) -> frozenset[str]:
    return frozenset(table.spellings_with("lower_precision_fp"))


@lru_cache(maxsize=None)
def _float32_everywhere(spelling: str) -> bool:
    """Whether every committed table runs what ``spelling`` reaches in float32 under autocast
    (and casts nothing back): ``_Flow`` then takes its result for float32 whatever the device."""
    return all((policies := policies_of(t, spelling)) and policies <= FP32_FAMILY and not casts_back(t, spelling)
               for t in committed_tables())


@lru_cache(maxsize=None)
def _lower_precision_names() -> frozenset[str]:
    """The last part of every spelling of a `lower_precision_fp` op in any committed table."""
    return frozenset(spelling.rsplit(".", 1)[-1] for table in committed_tables()
                     for spelling in table.spellings_with("lower_precision_fp"))


def _in_model_on_ast(outline: Outline) -> set[int]:
    """``_in_model`` on the ast: the ids of the calls and binary operations in a class that
    defines ``forward`` or derives from a ``...Module``, or in an autocast region (a ``with``
    on an autocast call or on a name, in a file that calls autocast, or a function with an
    autocast decorator). By position (a class's nodes are those that start inside it,
    decorators included), not a walk of each."""
    spans = [(min([(cls.lineno, cls.col_offset), *((d.lineno, d.col_offset) for d in cls.decorator_list)]),
              (cls.end_lineno, cls.end_col_offset))
             for cls in outline.nodes(ast.ClassDef)
             if any(getattr(b, "attr", getattr(b, "id", "")).endswith("Module") for b in cls.bases) or any(
                 isinstance(s, ast.FunctionDef) and s.name == "forward" for s in cls.body)]
    if calls_enabled_autocast(outline):
        def autocast(expr: ast.expr) -> bool:
            return isinstance(expr, ast.Call) and not outline.qualified_names(expr.func).isdisjoint(AUTOCAST)

        spans += [((w.lineno, w.col_offset), (w.end_lineno, w.end_col_offset))
                  for kind in (ast.With, ast.AsyncWith) for w in outline.nodes(kind)
                  if any(autocast(item.context_expr) or isinstance(item.context_expr, ast.Name) for item in w.items)]
        spans += [((f.lineno, f.col_offset), (f.end_lineno, f.end_col_offset))
                  for kind in (ast.FunctionDef, ast.AsyncFunctionDef) for f in outline.nodes(kind)
                  if any(autocast(d) for d in f.decorator_list)]
    if not spans:
        return set()
    nodes = sorted(((n.lineno, n.col_offset), id(n)) for kind in (ast.Call, ast.BinOp) for n in outline.nodes(kind))
    starts = [start for start, _ in nodes]
    found: set[int] = set()
    for first, end in spans:
        found.update(i for _, i in nodes[bisect_left(starts, first):bisect_left(starts, end)])
    return found


class TensorFactoryDropsDtype(Rule):
    """
    ## What it does
    Finds a float32 tensor that meets the activations: a tensor factory
    (`torch.zeros/ones/empty/full/tensor/rand/randn`) given a device but no `dtype=`, or
    `.float()` of a mask or of integers, that is then index-put or scattered into, scattered
    or index-put into an activation, concatenated, added to or multiplied with one (in a
    module's method or an autocast region), given to an `nn.LSTM`/`GRU`/`RNN` as its initial
    state, or passed to a module the file made half (`model.half()`). An activation is a
    value whose dtype follows the model's: a tensor argument, a module's output, what a
    `lower_precision_fp` op (`F.linear`, `@`) makes under autocast, a `.half()` tensor, and
    what is computed from those. In a loss (a function or class named like one, or in a module
    named so) of a project that enables autocast in another file (a trainer's `with
    torch.autocast(...)`, a framework's precision setting), what the loss's model returns
    (`self.model(tokens)`: a callable attribute that is no method of the class and is not
    named like a loss or criterion) is half too, whatever it is given: the message names that
    autocast.

    ## Why is this bad?
    Without `dtype=` a factory makes float32 (the default dtype), whatever the model runs in.
    In a `.half()`/bf16 model or under autocast the activations are float16 or bfloat16:
    index-puts and scatters then fail ("Index put requires the source and destination dtypes
    match", "scatter(): Expected self.dtype to be equal to src.dtype"), and `torch.cat`, `+`,
    `*` silently promote the result to float32, doubling memory and time, until an op that
    needs equal dtypes fails ("expected scalar type Half but found Float").

    ## Example
    ```python
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, x.shape[2], device=x.device)
        return torch.cat([x, pad], dim=1)
    ```

    ## Fix
    ```python
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1, x.shape[2])
        return torch.cat([x, pad], dim=1)
    ```

    ## Fix safety
    Unsafe: the tensor gets the other value's dtype instead of float32 (the point of the fix,
    but a change of meaning). The fix is `x.new_zeros(...)` where the factory takes its device
    from that same `x`, else `dtype=x.dtype`, and `.to(x.dtype)` for `.float()`. No fix when
    the other value is not a plain name, attribute or subscript chain already bound where the
    float32 tensor is made.

    ## False positives
    A float32 tensor can be intended (an accumulator kept in float32 on purpose): then pass
    `dtype=torch.float32`, which this rule never reports. The rule stays silent where the
    other value is float32 too (another factory, `.float()`, the output of an op autocast runs
    in float32 such as `softmax` or `sum`), where the tensor is cast before it is used
    (`.to(x.dtype)`, `.type_as(x)`), on 0-dim tensors (`torch.full((), v)`,
    `torch.tensor(0.0)`: they do not promote), on factories without a device, on copies
    into a slice (`x[:, 0] = x[:, 0] + noise` casts back to `x`'s dtype), and on sums and
    products outside a module class or autocast region (unless the file makes the other value
    half). It follows plain assignments within a function, and the arguments a file passes
    to its own helpers, not values passed between files: a module's output counts as an
    activation although some modules return float32 (a loss's model, in a project that
    enables autocast, although some end in a float32 op). Arguments named like indices or masks
    (`input_ids`, `mask`, `lengths`, …), annotated with a type other than a tensor or with a
    number as default are not taken for activations.
    """

    code = "AMP003"
    preview_paths = ("a float32 tensor meeting a value that is half only under autocast or in a half model (an op's, a module's or an argument's), outside any autocast region of the file, runs")
    name = "tensor-factory-drops-dtype"
    summary = "A float32 tensor (factory without dtype) meets half activations"
    fixable = True
    uses_policy = True
    # A factory call (by its own name: not `new_zeros`, `as_tensor`) given a device among its
    # own arguments, or moved to one by a `.to(`/`.cuda(` on its result, and given no `dtype=`
    # or `*args`/`**kwargs` (_ARGUMENT), a `.to(` only if it may move nothing but the device
    # (_TO_ARGUMENT); or a `.float()` where an op that needs equal dtypes (an
    # index-put, a scatter) or a half module may take it. The name's start is checked behind
    # it: a leading `\b` would cost the literal scan. `torch.tensor` only with data that can
    # be a list or a tuple (what may hold a float). Each group starts with cheap patterns its
    # others need, which most files lack (most files that mention a device pass no `device=`;
    # most that move a value with `.to(` move no call's result). A pattern that starts with a
    # word, not `\b`, lets the regex engine scan for that word.
    fragments = (("device", r"device\s*=", AnyOf(*_PLACED_FACTORIES), TextTest(_may_place_float32)),
                 (r"\.\s*(?:to|cuda)\s*\(", r"\)[\s)]*\.\s*(?:to|cuda)\s*\(", AnyOf(*_MOVED_FACTORIES),
                  TextTest(_may_move_float32)),
                 (r"\.float\(\)",
                  AnyOf(rf"\.(?:{'|'.join(_STRICT_METHODS)})\s*\(", r"\][\s)\\]*=(?!=)", "half", "float16"),
                  TextTest(_may_cast_integers)))
    may_fire = staticmethod(_may_fire)

    valid = (
        # An `nn.Softmax` built and called in one expression runs softmax (float32 under
        # autocast): scattered into a float32 buffer, the dtypes agree.
        Valid("""
import torch
from torch import nn
class RepeatDecoder(nn.Module):
    def forward(self, memory, item_seq, num_items):
        scores = nn.Softmax(dim=-1)(self.proj(memory).squeeze(2))
        out = torch.zeros([item_seq.shape[0], num_items], device=memory.device)
        out.scatter_add_(1, item_seq, scores)
        return out
"""),
        # Float32 on purpose: an explicit dtype, and float32 met with float32 (a scatter of
        # float32 ones, a product with what autocast runs in float32: softmax, mean).
        Valid("""
import torch
import torch.nn.functional as F
class Gate(torch.nn.Module):
    def forward(self, hidden, idx):
        acc = torch.zeros(hidden.shape[0], device=hidden.device, dtype=torch.float32)
        scores = F.linear(hidden, self.weight).softmax(dim=-1)
        counts = torch.zeros(hidden.shape[0], 8, device=hidden.device)
        counts.scatter_add_(1, idx, torch.ones(idx.shape, device=hidden.device))
        return acc + hidden.sum(-1), (counts * scores.mean(dim=1)).sum()
"""),
        # 0-dim tensors do not promote; a cast before use; a copy into a slice casts back.
        Valid("""
import torch
class Sine(torch.nn.Module):
    def forward(self, f0):
        total = torch.tensor(0.0, device=f0.device)
        eps = torch.full((), 1e-6, device=f0.device)
        pos = torch.zeros(f0.shape[1], device=f0.device).to(f0.dtype)
        table = torch.ones(f0.shape[1], device=f0.device).type_as(f0)
        rad = f0 / 16000 + pos + table
        noise = torch.rand(f0.shape[0], f0.shape[2], device=f0.device)
        rad[:, 0, :] = rad[:, 0, :] + noise
        return total + rad + eps
"""),
        # Float32 into float32: logits upcast first; a helper only ever called with float32.
        Valid("""
import torch
def listwise(logits, row_idx, col_idx, device):
    logits = logits.float()
    matrix = torch.full((4, 8), -1e16, device=device)
    matrix[row_idx, col_idx] = logits
    return matrix
def totals(segment, flags):
    def seg_sum(vals):
        return torch.zeros(4, device=vals.device).index_add_(0, segment, vals)
    return seg_sum(flags.float()), seg_sum(torch.ones_like(flags, dtype=torch.float32))
"""),
        # A copy into a slice (an int index) casts; no device: a CPU table built from data.
        Valid("""
import torch
class Pos(torch.nn.Module):
    def forward(self, x, nodes):
        table = torch.zeros(len(nodes), 4)
        for i, node in enumerate(nodes):
            table[i] = node.encoding
        out = torch.zeros(x.shape, device=x.device)
        out[0] = x[0]
        return out, table
"""),
        # A loss calling its model on tokens (not tensors it was given), in a project that
        # never enables autocast: nothing says the model's scores are half.
        Valid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", project=(("trainer.py", """
import torch
def train_step(loss_fn, optimizer, batch):
    loss = loss_fn(*batch)
    loss.backward()
    optimizer.step()
"""),)),
        # ... and in a project that does, scores upcast before an activation function: the
        # activation gets float32 and gives float32.
        Valid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        logits = torch.cat([self.model(self.model.tokenize(p))["scores"] for p in pairs]).float()
        logits = self.activation_fn(logits)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", project=(("trainer.py", """
import torch
def train_step(loss_fn, batch):
    with torch.autocast("cuda"):
        return loss_fn(*batch)
"""),)),
    )
    invalid = (
        # The same loss in a project whose trainer (another file) runs it under float16
        # autocast: the model's scores are half there, and the index-put fails.
        Invalid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", fixed="""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device, dtype=logits.dtype)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", at=((8, 18, "index-puts `logits` into it, which is float16/bfloat16 when `ListwiseLoss.forward` runs "
                   "under the autocast this project enables (trainer.py:4)"),),
            project=(("trainer.py", """
import torch
def train_step(loss_fn, scaler, optimizer, batch):
    with torch.autocast("cuda"):
        loss = loss_fn(*batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""),)),
        # A list of activations built with `append` and concatenated is the activations.
        Invalid("""
import torch
from torch import nn
class LayerConcat(nn.Module):
    def forward(self, hidden):
        parts = []
        for layer in self.layers:
            hidden = layer(hidden)
            parts.append(hidden)
        stacked = torch.cat(parts, dim=-1)
        pad = torch.zeros(stacked.shape[0], 1, device=stacked.device)
        return torch.cat([stacked, pad], dim=-1)
""", fixed="""
import torch
from torch import nn
class LayerConcat(nn.Module):
    def forward(self, hidden):
        parts = []
        for layer in self.layers:
            hidden = layer(hidden)
            parts.append(hidden)
        stacked = torch.cat(parts, dim=-1)
        pad = stacked.new_zeros(stacked.shape[0], 1)
        return torch.cat([stacked, pad], dim=-1)
""", at=((11, 15, "line 12 concatenates it with `stacked`"),)),
        # A module's output reshaped (`.view(-1)`) is still the activations.
        Invalid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, tokens, batch_size, max_docs, docs_per_query):
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), 1e-16, device=logits.device)
        rows = torch.repeat_interleave(torch.arange(batch_size), torch.tensor(docs_per_query))
        matrix[rows, 0] = logits
        return matrix
""", fixed="""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, tokens, batch_size, max_docs, docs_per_query):
        logits = self.model(tokens)["scores"].view(-1)
        matrix = logits.new_full((batch_size, max_docs), 1e-16)
        rows = torch.repeat_interleave(torch.arange(batch_size), torch.tensor(docs_per_query))
        matrix[rows, 0] = logits
        return matrix
""", at=((7, 18, "`torch.full` without `dtype=` makes a float32 tensor, and line 9 index-puts `logits`"),)),
        Invalid("""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, x.shape[2], device=x.device)
        return torch.cat([x, pad], dim=1)
""", fixed="""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1, x.shape[2])
        return torch.cat([x, pad], dim=1)
""", at=((6, 15, "`torch.zeros` without `dtype=` makes a float32 tensor, and line 7 concatenates it with `x`"),)),
        # An index-put of half scores, with the device from a variable.
        Invalid("""
import torch
def remap(scores, indices, n, device):
    scores = scores.half()
    full = torch.zeros(scores.shape[0], n, device=device)
    full[:, indices] = scores
    return full
""", fixed="""
import torch
def remap(scores, indices, n, device):
    scores = scores.half()
    full = torch.zeros(scores.shape[0], n, device=device, dtype=scores.dtype)
    full[:, indices] = scores
    return full
""", at=((5, 12, "and line 6 index-puts `scores` into it"),)),
        # A mask made float32, scattered into a tensor that follows the hidden states.
        Invalid("""
import torch
def mean_pool(hidden, word_ids):
    mask = word_ids >= 0
    counts = torch.zeros_like(hidden[:, :, 0])
    counts.scatter_add_(1, word_ids.clamp(min=0), mask.float())
    return counts
""", fixed="""
import torch
def mean_pool(hidden, word_ids):
    mask = word_ids >= 0
    counts = torch.zeros_like(hidden[:, :, 0])
    counts.scatter_add_(1, word_ids.clamp(min=0), mask.to(counts.dtype))
    return counts
""", at=((6, 51, "`mask.float()` makes a float32 tensor, and line 6 `scatter_add_`s it into `counts`"),)),
        # Moved to the device after creation; a boolean-mask index-put of a head's output.
        Invalid("""
import torch
from torch import nn
class MultiHead(nn.Module):
    def forward(self, x, task_labels):
        out = torch.zeros(x.shape[0], self.max_classes).to(x.device)
        for task in task_labels.unique():
            task_mask = task_labels == task
            out[task_mask] = self.heads[str(task.item())](x[task_mask])
        return out
""", at=((6, 15, "and line 9 index-puts `self.heads[str(task.item())](x[task_mask])` into it"),)),
        # Moved by a name bound to a device; the activations reshaped by a method of theirs.
        Invalid("""
import torch
from torch import nn
class Head(nn.Module):
    def forward(self, x):
        dev = x.device
        bias = torch.ones(x.shape[0], 1).to(dev)
        return torch.cat([x.flatten(1), bias], dim=1)
""", at=((7, 16, "line 8 concatenates it with `x.flatten(1)`"),)),
        # Outside a model, with what the file made half (and reshaped).
        Invalid("""
import torch
def pad_tokens(hidden):
    tokens = hidden.half().transpose(0, 1)
    pad = torch.zeros(tokens.shape[0], 1, device=tokens.device)
    return torch.cat([tokens, pad], dim=1)
""", fixed="""
import torch
def pad_tokens(hidden):
    tokens = hidden.half().transpose(0, 1)
    pad = tokens.new_zeros(tokens.shape[0], 1)
    return torch.cat([tokens, pad], dim=1)
""", at=((5, 11, "`torch.zeros` without `dtype=` makes a float32 tensor, and line 6 concatenates it with `tokens`"),)),
        # An RNN's initial state: a half model's LSTM needs it in its input's dtype.
        Invalid("""
import torch
from torch import nn
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(32, 64, batch_first=True)
    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), 64, device=x.device)
        c0 = torch.zeros(1, x.size(0), 64, device=x.device)
        return self.rnn(x, (h0, c0))
""", fixed="""
import torch
from torch import nn
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(32, 64, batch_first=True)
    def forward(self, x):
        h0 = x.new_zeros(1, x.size(0), 64)
        c0 = x.new_zeros(1, x.size(0), 64)
        return self.rnn(x, (h0, c0))
""", at=((9, 14, "line 11 passes it to `self.rnn` as the state of `x`"), (10, 14, "line 11 passes it to `self.rnn`"))),
        # A matmul with a submodule's weight: autocast would cast both, a half model fails.
        Invalid("""
import torch
class Quantizer(torch.nn.Module):
    def forward(self, inputs, distances):
        indices = torch.argmin(distances, dim=1).unsqueeze(1)
        onehot = torch.zeros(len(indices), self.size, device=inputs.device)
        onehot.scatter_(1, indices, 1)
        return torch.matmul(onehot, self.embedding.weight)
""", fixed="""
import torch
class Quantizer(torch.nn.Module):
    def forward(self, inputs, distances):
        indices = torch.argmin(distances, dim=1).unsqueeze(1)
        onehot = torch.zeros(len(indices), self.size, device=inputs.device, dtype=self.embedding.weight.dtype)
        onehot.scatter_(1, indices, 1)
        return torch.matmul(onehot, self.embedding.weight)
""", at=((6, 18, "line 8 multiplies it with `self.embedding.weight` (`matmul`)"),)),
        # Passed to a module the file made half.
        Invalid("""
import torch
model = Net().cuda()
model.half()
def predict(batch):
    mask = batch["mask"] > 0
    return model(torch.ones(mask.shape, device="cuda"), mask.float())
""", at=((7, 18, "passes it to `model`, made half on line 4"), (7, 57, "`mask.float()` makes a float32 tensor, and line 7 passes it"))),
        # What a `lower_precision_fp` op makes in an autocast region is half.
        Invalid("""
import torch
import torch.nn.functional as F
def step(x, w):
    with torch.autocast("cuda"):
        h = F.linear(x, w)
        bias = torch.full((h.shape[0], 1), 0.5, device=h.device)
        return torch.cat([h, bias], dim=1)
""", fixed="""
import torch
import torch.nn.functional as F
def step(x, w):
    with torch.autocast("cuda"):
        h = F.linear(x, w)
        bias = h.new_full((h.shape[0], 1), 0.5)
        return torch.cat([h, bias], dim=1)
""", at=((7, 16, "`torch.full` without `dtype=` makes a float32 tensor, and line 8 concatenates it with `h`"),)),
        # Added to and multiplied with the activations; `.triu` keeps the factory the cause.
        Invalid("""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = torch.full((n, n), -math.inf, device=scores.device).triu(1)
        keep = torch.ones(n, n, device=scores.device)
        return scores + causal, scores * keep
""", fixed="""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = scores.new_full((n, n), -math.inf).triu(1)
        keep = scores.new_ones(n, n)
        return scores + causal, scores * keep
""", at=((7, 18, "line 9 adds it to `scores`"), (8, 16, "line 9 multiplies it with `scores`"))),
    )

    def check(self, ctx: FileContext) -> None:
        flow = _Flow(ctx)
        reported: set[int] = set()
        for m in _meetings(flow):
            if id(m.origin) in reported:
                continue
            cast = _float_cast(m.origin)
            if not cast and not _placed_on_device(ctx, m.origin):
                continue
            reported.add(id(m.origin))
            made = f"`{ctx.code(m.origin)}`" if cast else \
                f"`{_factory(ctx, m.origin)}` without `dtype=`"
            line = ctx.location(ctx.offsets(m.node)[0]).row
            region = reaching_region(ctx, m.node) if m.guessed else None
            evidence, related = "", m.related
            if region is not None and region[2] is not None:  # the region is around a caller
                region_line, call_line = (ctx.location(ctx.offsets(n)[0]).row for n in (region[1], region[2]))
                switch = region_switch(ctx, region[0]) if region[0] is not None else None
                when = f" {switch.when}" if switch else ""
                evidence = f" (this runs under the autocast of line {region_line}{when}, through the call on line {call_line})"
                related += (Related(ctx.path, call_line, "runs it under autocast"),) + (switch.related if switch else ())
            ctx.report(m.origin, f"{made} makes a float32 tensor, and line {line} {m.text}{evidence}", _fix(flow, m),
                       related=related, preview=m.guessed and region is None)
