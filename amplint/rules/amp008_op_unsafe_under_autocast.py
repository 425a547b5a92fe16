from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import autocast_region, calls, calls_autocast, method_call, region_table

_SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})
_WITH_LOGITS = {"binary_cross_entropy": "binary_cross_entropy_with_logits",
                "BCELoss": "BCEWithLogitsLoss"}


def _constructions(ctx: FileContext) -> dict[str, set[str]]:
    """``name = torch.nn.SomeLoss(...)`` anywhere: what each target was built from."""
    built: dict[str, set[str]] = {}
    for node in ctx.nodes(cst.Assign):
        if isinstance(node.value, cst.Call):
            names = {n for n in ctx.qualified_names(node.value.func) if n.startswith("torch.")}
            for target in node.targets:
                built.setdefault(ctx.code(target.target), set()).update(names)
    return built


def _is_module_class(spelling: str) -> bool:
    return spelling.rsplit(".", 1)[-1][:1].isupper()


def _sigmoid_input(ctx: FileContext, expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """``z`` for ``torch.sigmoid(z)``, ``F.sigmoid(z)`` or ``z.sigmoid()``."""
    if not isinstance(expr, cst.Call):
        return None
    if ctx.resolves_to(expr.func, _SIGMOID) and len(expr.args) == 1 and expr.args[0].keyword is None:
        return expr.args[0].value
    mc = method_call(expr)
    if mc is not None and mc[1] == "sigmoid" and not expr.args:
        return mc[0]
    return None


class OpUnsafeUnderAutocast(Rule):
    """
    ## What it does
    Inside an enabled autocast region, finds calls that reach an op the policy tables mark
    `banned` for the region's device (for torch 2.13 on cuda, xpu, mtia and maia:
    `aten::binary_cross_entropy`, reached by `torch.nn.functional.binary_cross_entropy` and
    `torch.nn.BCELoss`). Loss modules are followed from where they are built
    (`self.criterion = nn.BCELoss()`) to where they are called. The list of banned ops and
    their spellings comes from `policies/`, not from this rule.

    ## Why is this bad?
    The autocast kernel raises: `binary_cross_entropy` "is unsafe to autocast" because its
    backward can produce gradients that float16 cannot represent. The training step crashes
    the first time the region runs on that device.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = F.binary_cross_entropy(torch.sigmoid(logits), targets)
    ```

    ## Fix
    ```python
    with torch.autocast("cuda"):
        loss = F.binary_cross_entropy_with_logits(logits, targets)
    ```

    ## Fix safety
    Safe, for the common pattern only: the input is `torch.sigmoid(z)` (or `z.sigmoid()`) and the
    call is spelled through a module (`F.binary_cross_entropy`, `nn.BCELoss()`), so the
    `_with_logits` name is reachable the same way; it computes the same loss, stably. Other
    arguments (`weight=`, `reduction=`) are kept. Otherwise no fix: compute that loss outside
    the region, in float32.

    ## False positives
    A region whose device is not a literal is judged with the configured device's table.
    """

    code = "AMP008"
    name = "op-unsafe-under-autocast"
    summary = "Op that autocast refuses (banned) called inside an autocast region"
    fixable = True
    uses_policy = True
    # The banned ops' spellings in every committed table (a test keeps this true).
    fragments = (("autocast", AnyOf("binary_cross_entropy", "BCELoss")),)
    may_fire = staticmethod(calls_autocast)  # every region comes from an autocast call

    valid = (
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
loss = F.binary_cross_entropy(torch.sigmoid(logits.float()), y)
"""),
        Valid("""
import torch
from torch import nn
criterion = nn.BCELoss()
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = criterion(torch.sigmoid(model(x)), y)
"""),
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    loss = F.binary_cross_entropy_with_logits(model(x), y)
"""),
    )
    invalid = (
        Invalid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
    loss = F.binary_cross_entropy(torch.sigmoid(logits), y, reduction="sum")
""", fixed="""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y, reduction="sum")
""", at=((6, 12, '`torch.nn.functional.binary_cross_entropy` reaches `aten'),)),
        Invalid("""
import torch
from torch import nn
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = nn.BCELoss()(model(x).sigmoid(), y)
""", fixed="""
import torch
from torch import nn
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = nn.BCEWithLogitsLoss()(model(x), y)
""", at=((5, 12, '`torch.nn.BCELoss` reaches `aten'),)),
        Invalid("""
import torch
from torch import nn
class Trainer:
    def __init__(self, model):
        self.model = model
        self.criterion = nn.BCELoss()

    def step(self, x, y):
        with torch.autocast("cuda"):
            probs = torch.sigmoid(self.model(x))
            return self.criterion(probs, y)
""", at=((12, 20, '`torch.nn.BCELoss` reaches `aten'),)),
    )

    def check(self, ctx: FileContext) -> None:
        constructions = None
        for call in calls(ctx):
            region = autocast_region(ctx, call)
            if region is None:
                continue
            table = region_table(ctx, region[0])
            if table is None:
                continue
            banned = table.spellings_with("banned")
            direct = isinstance(call.func, (cst.Name, cst.Attribute))
            spelling = ctx.resolves_to(call.func, banned) if direct else None
            if spelling is not None and _is_module_class(spelling):
                continue  # building the loss module runs nothing; calling it does
            if spelling is None and isinstance(call.func, cst.Call):  # nn.BCELoss()(...)
                spelling = ctx.resolves_to(call.func.func, banned)
            if spelling is None:
                if constructions is None:
                    constructions = _constructions(ctx)
                spelling = next(iter(constructions.get(ctx.code(call.func), set()) & banned), None)
            if spelling is None:
                continue
            ops = [op for op in table.ops_reached_by(spelling) if table.policy(op) == "banned"]
            ctx.report(call, f"`{spelling}` reaches `{ops[0]}`, which autocast refuses on "
                             f"{table.device} (it raises): compute it outside the region or use "
                             "the `_with_logits` form", self._fix(ctx, call))

    def _fix(self, ctx: FileContext, call: cst.Call) -> Fix | None:
        func = call.func.func if isinstance(call.func, cst.Call) else call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _WITH_LOGITS or not call.args:
            return None
        first = call.args[0]
        inner = _sigmoid_input(ctx, first.value) if first.keyword is None else None
        if inner is None:
            return None
        new_func = func.with_changes(attr=cst.Name(_WITH_LOGITS[func.attr.value]))
        new_callee = call.func.with_changes(func=new_func) if isinstance(call.func, cst.Call) else new_func
        new = call.with_changes(func=new_callee, args=[first.with_changes(value=inner), *call.args[1:]])
        return Fix(f"Use `{_WITH_LOGITS[func.attr.value]}` on the logits",
                   (ctx.replace(call, ctx.module.code_for_node(new)),))
