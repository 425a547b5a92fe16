from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import (
    assigned_before,
    autocast_decorator,
    autocast_of_with_item,
    autocast_region,
    calls,
    calls_enabled_autocast,
)

_DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                            "torch.nn.parallel.data_parallel.DataParallel"})


_MOVES = frozenset({"cuda", "to", "cpu", "train", "eval", "float", "half", "bfloat16"})


def _strip_moves(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``nn.DataParallel(net).cuda().train()`` is still the DataParallel."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
            and expr.func.attr.value in _MOVES:
        expr = expr.func.value
    return expr


def _forward_has_autocast(ctx: FileContext, cls: cst.ClassDef) -> bool:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "forward":
            if autocast_decorator(ctx, stmt):
                return True
            found = []

            class FindWith(cst.CSTVisitor):
                def visit_WithItem(self, node: cst.WithItem) -> None:
                    if autocast_of_with_item(ctx, node):
                        found.append(node)

            stmt.visit(FindWith())
            return bool(found)
    return False


class DataParallelAutocastOutsideForward(Rule):
    """
    ## What it does
    Finds a `torch.nn.DataParallel` model called inside an autocast region when the wrapped
    module's class (defined in the same file) has no autocast of its own in `forward` (neither
    a decorator nor a `with` block).

    ## Why is this bad?
    Autocast state is thread-local. DataParallel runs each replica's forward in a worker
    thread, where the region is not active: the model silently runs in float32 on every GPU,
    with none of the expected speed-up. PyTorch's AMP examples put autocast inside `forward`.

    ## Example
    ```python
    model = nn.DataParallel(Net())
    with torch.autocast("cuda"):
        out = model(x)
    ```

    ## Fix
    ```python
    class Net(nn.Module):
        @torch.autocast(device_type="cuda")
        def forward(self, x):
            ...
    ```

    ## Fix safety
    No automatic fix: the change belongs in the model class.

    ## False positives
    When the wrapped module's class is not defined in the same file its forward cannot be
    seen, and nothing is reported (a miss rather than a false alarm).
    """

    code = "AMP012"
    name = "dataparallel-autocast-outside-forward"
    summary = "DataParallel model run in an autocast region that its worker threads do not see"
    fragments = ((r"DataParallel", r"autocast"),)
    may_fire = staticmethod(calls_enabled_autocast)  # every region comes from an enabled autocast call

    valid = (
        Valid("""
import torch
from torch import nn
class Net(nn.Module):
    @torch.autocast(device_type="cuda")
    def forward(self, x):
        return x
model = nn.DataParallel(Net())
with torch.autocast("cuda"):
    out = model(x)
"""),
        Valid("""
import torch
from torch import nn
class Net(nn.Module):
    def forward(self, x):
        return x
def train():
    model = nn.DataParallel(Net())
    return model
def evaluate(model, x):
    with torch.autocast("cuda"):
        return model(x)
"""),
        Valid("""
import torch
from torch import nn
from mylib import Net
model = nn.DataParallel(Net())
with torch.autocast("cuda"):
    out = model(x)
"""),
    )
    invalid = (
        Invalid("""
import torch
from torch import nn
class Net(nn.Module):
    def forward(self, x):
        return x
class Trainer:
    def __init__(self):
        self.model = nn.DataParallel(Net()).cuda()

    def step(self, x):
        with torch.autocast("cuda"):
            return self.model(x)
""", at=((13, 20, '`self.model` is a DataParallel of `Net`, whose forward has n'),)),
        Invalid("""
import torch
from torch import nn
class Net(nn.Module):
    def forward(self, x):
        return self.body(x)
net = Net()
model = nn.DataParallel(net).cuda()
with torch.autocast("cuda"):
    out = model(x)
""", at=((10, 11, '`model` is a DataParallel of `Net`, whose forward has no aut'),)),
    )

    def check(self, ctx: FileContext) -> None:
        classes = None
        for call in calls(ctx):
            if not isinstance(call.func, (cst.Name, cst.Attribute)) or autocast_region(ctx, call) is None:
                continue
            if classes is None:
                classes = _classes(ctx)
            for value in _values_of(ctx, call.func):
                value = _strip_moves(value)
                if not (isinstance(value, cst.Call) and ctx.resolves_to(value.func, _DATA_PARALLEL)
                        and value.args):
                    continue
                cls = _wrapped_class(ctx, value.args[0].value, classes)
                if cls is not None and not _forward_has_autocast(ctx, cls):
                    ctx.report(call, f"`{ctx.code(call.func)}` is a DataParallel of `{cls.name.value}`, "
                                     "whose forward has no autocast: the worker threads run it in "
                                     "float32; put autocast inside forward")
                    break


def _classes(ctx: FileContext) -> dict[str, cst.ClassDef]:
    return {node.name.value: node for node in ctx.nodes(cst.ClassDef)}


def _values_of(ctx: FileContext, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a callee holds: the last assignment to a name in its own scope, or every
    ``self.attr = ...`` in the enclosing class."""
    if isinstance(expr, cst.Name):
        value = assigned_before(ctx, expr)
        return [value] if value is not None else []
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        cls = ctx.enclosing(expr, cst.ClassDef)
        if cls is None:
            return []
        target = ctx.code(expr)
        return [node.value for node in ctx.nodes_within(cst.Assign, cls)
                if any(ctx.code(t.target) == target for t in node.targets)]
    return []


def _wrapped_class(ctx, expr, classes) -> cst.ClassDef | None:
    for _ in range(3):  # follow `net = Net(); model = DataParallel(net)`
        expr = _strip_moves(expr)
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            return classes.get(expr.func.value)
        if not isinstance(expr, cst.Name):
            return None
        expr = assigned_before(ctx, expr)
        if expr is None:
            return None
    return None
