"""A value's dtype on Python's ``ast``, with its evidence: what autocast makes of the op that
produced it (by the device's policy table), a cast (``.half()``, ``.to(torch.float32)``),
``torch.tensor(0.5)``, and what PyTorch's type promotion makes of arithmetic on such values
(``promotion``); a name stands for the value its function bound it to before (``regions.
value_before``). Unknown, rather than guessed, where the code does not show it."""

from __future__ import annotations

import ast

from .ast_context import AstContext
from .promotion import (DTYPE_METHODS, FLOAT32_FACTORIES, FULL_REDUCTIONS, SAME_DTYPE_METHODS, UNKNOWN, Typed,
                        by_policy, casts_back, promoted)
from .regions import dtype_of, has_star_args, value_before


def call_spelling(ctx: AstContext, call: ast.Call) -> str | None:
    """The public spelling a call goes through: ``torch.mm``, ``torch.Tensor.softmax`` for a
    method on anything that is not a known module."""
    names = [n for n in ctx.outline.qualified_names(call.func) if n.startswith("torch.")]
    if names:
        return names[0]
    if isinstance(call.func, ast.Attribute) and not ctx.code(call.func.value).startswith("self"):
        return f"torch.Tensor.{call.func.attr}"
    return None


def tensor_input(call: ast.Call, spelling: str) -> ast.expr | None:
    """The tensor whose dtype a cast-back op's output takes: the receiver of a Tensor method
    (``spelling`` ``torch.Tensor.x``), else the first positional argument."""
    if isinstance(call.func, ast.Attribute) and spelling.startswith("torch.Tensor."):
        return call.func.value
    return next((a for a in call.args if not isinstance(a, ast.Starred)), None)


def inferred_dtype(ctx: AstContext, expr: ast.expr, table, depth: int = 3) -> str | None:
    """'lowp', 'float32' or None (unknown) for a value computed inside an autocast region whose
    device's policies are ``table``."""
    return typed(ctx, expr, table, depth).dtype


def typed(ctx: AstContext, expr: ast.expr, table, depth: int = 3) -> Typed:
    """``inferred_dtype``, with its evidence: the call or operation that produced the dtype
    (``F.linear(...)`` that autocast lowers, ``x.half()``, ``torch.tensor(0.5)``); the dtype is
    None when unknown."""
    found = _dtype(ctx, expr, table, depth)
    return found if found.dtype in ("lowp", "float32") else UNKNOWN


def _number(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) in (int, float)


def _dtype(ctx: AstContext, expr: ast.expr, table, depth: int) -> Typed:
    if depth == 0:
        return UNKNOWN
    if _number(expr):
        return Typed("number", True, expr)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        return _dtype(ctx, expr.operand, table, depth)
    if isinstance(expr, ast.Name):
        value = value_before(ctx, expr)  # an earlier binding: no cycle, so no depth spent
        return _dtype(ctx, value, table, depth) if value is not None else UNKNOWN
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.MatMult):
            return by_policy(table, "torch.Tensor.__matmul__", expr)
        return promoted(_dtype(ctx, expr.left, table, depth - 1), _dtype(ctx, expr.right, table, depth - 1))
    if not isinstance(expr, ast.Call):
        return UNKNOWN
    method = expr.func.attr if isinstance(expr.func, ast.Attribute) else None
    receiver = expr.func.value if method is not None else None
    arguments = (*expr.args, *expr.keywords)
    if method in DTYPE_METHODS and not arguments:
        return Typed(DTYPE_METHODS[method], False, expr)
    if method == "to":
        target = next((dtype_of(ctx, a) for a in (*expr.args, *(k.value for k in expr.keywords if k.arg == "dtype"))),
                      None)
        if target is not None:
            return Typed("float32" if target == "float32" else "lowp" if target in ("float16", "bfloat16") else None,
                         False, expr)
        if not expr.args and all(k.arg in ("device", "non_blocking") for k in expr.keywords):
            return _dtype(ctx, receiver, table, depth - 1)
    if method in SAME_DTYPE_METHODS:
        return _dtype(ctx, receiver, table, depth - 1)
    if ctx.resolves_to(expr.func, {"torch.tensor"}) is not None and expr.args \
            and (_number(expr.args[0]) or isinstance(expr.args[0], ast.UnaryOp)):
        given = next((dtype_of(ctx, k.value) for k in expr.keywords if k.arg == "dtype"), None)
        if given is None and isinstance(expr.args[0], ast.Constant) and type(expr.args[0].value) is float \
                or given == "float32":
            return Typed("float32", True, expr)
        return Typed("lowp" if given in ("float16", "bfloat16") else None, True, expr)
    spelling = call_spelling(ctx, expr)
    if casts_back(table, spelling):
        source = tensor_input(expr, spelling)
        return _dtype(ctx, source, table, depth - 1) if source is not None else UNKNOWN
    found = by_policy(table, spelling, expr)
    if method in FULL_REDUCTIONS and not arguments:
        return found._replace(zero_dim=True) if found.dtype else \
            _dtype(ctx, receiver, table, depth - 1)._replace(zero_dim=True)
    return found


def float32_outside_autocast(ctx: AstContext, expr: ast.expr, depth: int = 3) -> bool:
    """A value that is float32 without autocast: a factory without ``dtype=``, or ``.float()``."""
    if depth == 0:
        return False
    if isinstance(expr, ast.Name):
        value = value_before(ctx, expr)
        return value is not None and float32_outside_autocast(ctx, value, depth - 1)
    if not isinstance(expr, ast.Call):
        return False
    if isinstance(expr.func, ast.Attribute) and expr.func.attr == "float" and not expr.args and not expr.keywords:
        return True
    return ctx.resolves_to(expr.func, FLOAT32_FACTORIES) is not None \
        and not any(k.arg == "dtype" for k in expr.keywords) and not has_star_args(expr)


# Factories whose result, given no `dtype=`, is the default dtype (float32) or, for `full` and
# `tensor`, follows their data.
FACTORIES = frozenset({"torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.tensor", "torch.rand",
                       "torch.randn"})
_FLOAT_CONSTANTS = frozenset({"math.inf", "math.nan", "math.pi", "math.e", "math.tau",
                              "numpy.inf", "numpy.nan", "numpy.pi", "numpy.e"})


def factory(ctx: AstContext, call: ast.Call) -> str | None:
    """The torch factory ``call`` runs, as ``torch.zeros``: a torch factory, or a function of
    that name given a device (a package's re-export of torch's)."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if f"torch.{name}" not in FACTORIES:  # what it resolves to ends in that name too
        return None
    found = ctx.resolves_to(call.func, FACTORIES)
    return found if found is not None or not any(k.arg == "device" for k in call.keywords) else f"torch.{name}"


def evidently_float(ctx: AstContext, expr: ast.expr) -> bool:
    """A Python number that is a float whatever the variables hold: ``0.5``, ``-1e9``,
    ``float("-inf")``, ``1 / n``, ``math.pi``, ``torch.finfo(t).min``."""
    if isinstance(expr, ast.UnaryOp):
        return evidently_float(ctx, expr.operand)
    if isinstance(expr, ast.Constant):
        return type(expr.value) is float
    if isinstance(expr, ast.Call):
        return isinstance(expr.func, ast.Name) and expr.func.id == "float"
    if isinstance(expr, ast.BinOp):
        return isinstance(expr.op, ast.Div) or evidently_float(ctx, expr.left) or evidently_float(ctx, expr.right)
    if isinstance(expr, ast.Attribute):
        if isinstance(expr.value, ast.Call) and ctx.resolves_to(expr.value.func, {"torch.finfo"}):
            return True
        return ctx.resolves_to(expr, _FLOAT_CONSTANTS) is not None
    return False


def _float_data(ctx: AstContext, expr: ast.expr) -> bool:
    """``torch.tensor`` data that makes a floating tensor of one dimension or more: a list or
    tuple with a float in it (``[0.5, 2]``). A lone number makes a 0-dim tensor; ints, and data
    whose type the code does not show, are left alone."""
    return isinstance(expr, (ast.List, ast.Tuple)) and any(
        evidently_float(ctx, e) or _float_data(ctx, e) for e in expr.elts if not isinstance(e, ast.Starred))


def float32_factory(ctx: AstContext, call: ast.Call) -> str | None:
    """The torch factory ``call`` runs (``factory``) where it makes a float32 tensor of one
    dimension or more: given no ``dtype=`` nor ``*args``/``**kwargs``, and ``_makes_float32``."""
    made_by = factory(ctx, call)
    if made_by is None or any(k.arg == "dtype" for k in call.keywords) or has_star_args(call) \
            or not _makes_float32(ctx, call, made_by):
        return None
    return made_by


def _makes_float32(ctx: AstContext, call: ast.Call, made_by: str) -> bool:
    """Whether ``call`` of the factory ``made_by``, without ``dtype=``, makes a float32 tensor of
    one dimension or more (a 0-dim tensor does not change the dtype of the tensors it meets):
    zeros, ones, empty and the random ones always make a float; ``torch.full`` takes the type
    of its fill value (an int fill makes int64); ``torch.tensor`` infers it from its data."""
    positional = call.args
    keywords = {k.arg: k.value for k in call.keywords}
    if made_by == "torch.tensor":
        data = keywords.get("data", positional[0] if positional else None)
        return data is not None and _float_data(ctx, data)
    size = keywords.get("size", positional[0] if positional else None)
    if isinstance(size, (ast.Tuple, ast.List)) and not size.elts:
        return False
    if made_by == "torch.full":
        fill = keywords.get("fill_value", positional[1] if len(positional) > 1 else None)
        return fill is not None and evidently_float(ctx, fill)
    return True
