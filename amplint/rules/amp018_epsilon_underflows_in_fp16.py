from __future__ import annotations

import ast

import libcst as cst

from ..engine.context import FileContext
from ..engine.outline import Outline
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import (
    FP32_FAMILY,
    autocast_region,
    call_spelling,
    calls_autocast,
    inferred_dtype,
    policies_of,
    region_dtype,
    region_table,
)

# float16's smallest subnormal is 2**-24; anything below half of it rounds to 0.
FP16_SMALLEST = 2.0 ** -24
_EPS_KEYWORDS = frozenset({"eps", "epsilon", "min"})


def _may_fire(outline: Outline) -> bool:
    """A region, and a float literal the rule would call tiny (libcst's ``Float`` nodes are
    the ``float`` constants of Python's ast)."""
    return any(isinstance(c.value, float) and 0 < c.value < FP16_SMALLEST for c in outline.nodes(ast.Constant)) \
        and calls_autocast(outline)


def _tiny(node: cst.BaseExpression) -> float | None:
    if isinstance(node, cst.Float):
        try:
            value = float(node.value.replace("_", ""))
        except ValueError:
            return None
        return value if 0 < value < FP16_SMALLEST else None
    return None


class EpsilonUnderflowsInFp16(Rule):
    """
    ## What it does
    Inside a float16 autocast region, finds a float literal smaller than float16's smallest
    subnormal (2**-24 ≈ 5.96e-8) used as an epsilon: an operand of `+`, `-`, `/`, `*`, or an
    `eps=`/`epsilon=`/`min=` argument.

    ## Why is this bad?
    In float16 the literal rounds to exactly 0, so `x / (norm + 1e-8)` divides by zero and
    `torch.log(p.clamp(min=1e-10))` takes the log of 0: the guard does nothing and the loss
    becomes inf/NaN as soon as the value it protects reaches 0.

    ## Example
    ```python
    with torch.autocast("cuda"):
        y = x / (x.norm(dim=-1, keepdim=True) + 1e-8)
    ```

    ## Fix
    Use an epsilon float16 can hold (≥ 6e-8; 1e-5 to 1e-6 in practice), or compute that step in
    float32 (`x.float()`).

    ## Fix safety
    No automatic fix: the right epsilon depends on the computation.

    ## False positives
    Operands that the policy tables say come out of a float32 op (a `softmax`, `norm` or
    `sum` under autocast on cuda) are not reported, nor are keyword arguments of calls whose
    ops autocast runs in float32 (`F.layer_norm(..., eps=1e-12)`). Operands of unknown origin
    in a float16 region are assumed float16.
    """

    code = "AMP018"
    name = "epsilon-underflows-in-fp16"
    summary = "Epsilon below float16's smallest value inside a float16 region"
    uses_policy = True
    # A region and a float literal below 5.96e-8 (an exponent, or seven zeros after the point).
    fragments = (("autocast", AnyOf("e-", "E-", r"\.0(?:_?0){6}")),)
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-9)).sum()
    h = F.layer_norm(x, x.shape[-1:], eps=1e-12)
    y = x / (x.norm(dim=-1, keepdim=True) + 1e-6)
"""),
        Valid("""
import torch
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = x / (x.abs().amax() + 1e-8)
"""),
    )
    invalid = (
        Invalid("""
import torch
with torch.autocast("cuda"):
    h = model(x)
    y = h / (h.abs().amax(dim=-1, keepdim=True) + 1e-8)
    z = torch.log(y.clamp(min=1e-10))
""", at=((5, 51, "`1e-8` is below float16's smallest value (≈5.96e-8) and roun"), (6, 31, "`min=1e-10` is below float16's smallest value (≈5.96e-8) and"),)),
    )

    def check(self, ctx: FileContext) -> None:
        for node in ctx.nodes(cst.BinaryOperation):
            for literal, other in ((node.right, node.left), (node.left, node.right)):
                if _tiny(literal) is not None:
                    self._check_operand(ctx, literal, other)
        for node in ctx.nodes(cst.Arg):
            if node.keyword is not None and node.keyword.value in _EPS_KEYWORDS and _tiny(node.value):
                self._check_keyword(ctx, node)

    @staticmethod
    def _fp16_table(ctx: FileContext, node: cst.CSTNode):
        region = autocast_region(ctx, node)
        if region is None or region_dtype(ctx, region[0]) != "float16":
            return False, None
        return True, region_table(ctx, region[0])

    def _check_operand(self, ctx, literal, other) -> None:
        fp16, table = self._fp16_table(ctx, literal)
        if fp16 and inferred_dtype(ctx, other, table) != "float32":
            ctx.report(literal, f"`{ctx.code(literal)}` is below float16's smallest value (≈5.96e-8) "
                                "and rounds to 0 in this float16 region: use ≥ 1e-6 or compute in float32")

    def _check_keyword(self, ctx, arg: cst.Arg) -> None:
        fp16, table = self._fp16_table(ctx, arg)
        call = ctx.parent(arg)
        if not fp16 or not isinstance(call, cst.Call):
            return
        policies = policies_of(table, call_spelling(ctx, call))
        if policies and policies <= FP32_FAMILY:
            return  # autocast runs this op in float32, where the epsilon survives
        ctx.report(arg.value, f"`{arg.keyword.value}={ctx.code(arg.value)}` is below float16's "
                              "smallest value (≈5.96e-8) and rounds to 0 in this float16 region")
