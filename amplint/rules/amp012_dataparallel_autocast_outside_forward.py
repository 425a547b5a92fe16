from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import autocast_decorator, autocast_of_with_item, autocast_region, calls

_DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                            "torch.nn.parallel.data_parallel.DataParallel"})


class _Bindings(cst.CSTVisitor):
    """What each name/attribute was assigned: ``model = Net()``, ``model = nn.DataParallel(model)``."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.values: dict[str, list[cst.BaseExpression]] = {}
        self.classes: dict[str, cst.ClassDef] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes[node.name.value] = node

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.values.setdefault(self.ctx.code(target.target), []).append(node.value)


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
    fragments = (r"DataParallel",)

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
        return self.body(x)
net = Net()
model = nn.DataParallel(net)
with torch.autocast("cuda"):
    out = model(x)
"""),
    )

    def check(self, ctx: FileContext) -> None:
        bindings = None
        for call in calls(ctx):
            if not isinstance(call.func, (cst.Name, cst.Attribute)) or autocast_region(ctx, call) is None:
                continue
            if bindings is None:
                bindings = _Bindings(ctx)
                ctx.module.visit(bindings)
            for value in bindings.values.get(ctx.code(call.func), []):
                if not (isinstance(value, cst.Call) and ctx.resolves_to(value.func, _DATA_PARALLEL)
                        and value.args):
                    continue
                cls = self._wrapped_class(ctx, value.args[0].value, bindings)
                if cls is not None and not _forward_has_autocast(ctx, cls):
                    ctx.report(call, f"`{ctx.code(call.func)}` is a DataParallel of `{cls.name.value}`, "
                                     "whose forward has no autocast: the worker threads run it in "
                                     "float32; put autocast inside forward")
                    break

    @staticmethod
    def _wrapped_class(ctx, expr, bindings) -> cst.ClassDef | None:
        for _ in range(3):  # follow `net = Net(); model = DataParallel(net)`
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
                return bindings.classes.get(expr.func.value)
            values = bindings.values.get(ctx.code(expr), [])
            if len(values) != 1:
                return None
            expr = values[0]
        return None
