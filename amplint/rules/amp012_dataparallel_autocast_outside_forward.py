from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.outline import walk
from ..engine.regions import autocast_calls, autocast_decorator, autocast_of_with_item, autocast_region, value_before
from ..engine.rule import Invalid, Rule, Valid

_DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                            "torch.nn.parallel.data_parallel.DataParallel"})
_MOVES = frozenset({"cuda", "to", "cpu", "train", "eval", "float", "half", "bfloat16"})


def _strip_moves(expr: ast.expr) -> ast.expr:
    """``nn.DataParallel(net).cuda().train()`` is still the DataParallel."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _MOVES:
        expr = expr.func.value
    return expr


def _forward_has_autocast(ctx: AstContext, cls: ast.ClassDef) -> bool:
    forward = next((s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and s.name == "forward"), None)
    if forward is None:
        return False
    return autocast_decorator(ctx, forward) is not None or any(
        autocast_of_with_item(ctx, item) for node in walk(forward)
        if isinstance(node, (ast.With, ast.AsyncWith)) for item in node.items)


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

    def check(self, ctx: AstContext) -> None:
        # every region comes from an autocast call not turned off, every DataParallel from a call
        if all(ac.enabled is False for ac in autocast_calls(ctx)) or not ctx.outline.calls_to(_DATA_PARALLEL):
            return
        classes = {node.name: node for node in sorted(ctx.outline.nodes(ast.ClassDef), key=ctx.order)}
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            if not isinstance(call.func, (ast.Name, ast.Attribute)) or autocast_region(ctx, call) is None:
                continue
            for value in _values_of(ctx, call.func):
                value = _strip_moves(value)
                if not (isinstance(value, ast.Call) and ctx.resolves_to(value.func, _DATA_PARALLEL)
                        and (value.args or value.keywords)):
                    continue
                cls = _wrapped_class(ctx, (value.args or [k.value for k in value.keywords])[0], classes)
                if cls is not None and not _forward_has_autocast(ctx, cls):
                    ctx.report(call, f"`{ctx.code(call.func)}` is a DataParallel of `{cls.name}`, "
                                     "whose forward has no autocast: the worker threads run it in "
                                     "float32; put autocast inside forward")
                    break


def _values_of(ctx: AstContext, expr: ast.expr) -> list[ast.expr]:
    """What a callee holds: the last assignment to a name in its own scope, or every
    ``self.attr = ...`` in the enclosing class."""
    if isinstance(expr, ast.Name):
        value = value_before(ctx, expr)
        return [value] if value is not None else []
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        cls = ctx.enclosing(expr, ast.ClassDef)
        if cls is None:
            return []
        cache = ctx.__dict__.setdefault("_amp012_assigned", {})  # asked of every `self.x(...)` in a region
        if id(cls) not in cache:
            found: dict[str, list[ast.expr]] = {}
            for node in sorted((n for n in walk(cls) if isinstance(n, ast.Assign)), key=ctx.order):
                for code in dict.fromkeys(ctx.code(t) for t in node.targets):
                    found.setdefault(code, []).append(node.value)
            cache[id(cls)] = found
        return cache[id(cls)].get(ctx.code(expr), [])
    return []


def _wrapped_class(ctx: AstContext, expr: ast.expr, classes: dict[str, ast.ClassDef]) -> ast.ClassDef | None:
    for _ in range(3):  # follow `net = Net(); model = DataParallel(net)`
        expr = _strip_moves(expr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return classes.get(expr.func.id)
        if not isinstance(expr, ast.Name):
            return None
        expr = value_before(ctx, expr)
        if expr is None:
            return None
    return None
