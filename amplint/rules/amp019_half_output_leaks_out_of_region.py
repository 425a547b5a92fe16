from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.dtypes import call_spelling, float32_outside_autocast, inferred_dtype, tensor_input
from ..engine.promotion import casts_back, policies_of
from ..engine.region_tables import region_table
from ..engine.regions import autocast_calls, autocast_region, value_before
from ..engine.rule import AnyOf, Invalid, Rule, Valid

# Ops that need all tensor inputs in one dtype when autocast is not there to cast them.
_EQUAL_DTYPE_OPS = frozenset({"mm", "matmul", "bmm", "addmm", "baddbmm", "addbmm", "mv", "dot",
                              "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                              "conv_transpose2d", "conv_transpose3d", "index_put", "scatter",
                              "scatter_add", "bilinear"})


def _base(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


class HalfOutputLeaksOutOfRegion(Rule):
    """
    ## What it does
    Light dtype inference over the policy tables: a value made inside an autocast region by an
    op the table for that device marks `lower_precision_fp` (`torch.mm`, `F.linear`, `@`, …)
    and used after the region, in an op that needs equal dtypes (`mm`, `matmul`, `bmm`,
    `addmm`, `linear`, `conv*`, `index_put`, `scatter` …), together with a value that is
    float32 there (a factory without `dtype=`, or `.float()`).

    ## Why is this bad?
    Outside the region nothing casts: the op gets a float16 and a float32 tensor and raises
    "expected scalar type Float but found Half" (or the reverse) — at run time, often far from
    the region that made the half tensor.

    ## Example
    ```python
    with torch.autocast("cuda"):
        h = torch.mm(x, w1)
    out = torch.mm(h, torch.randn(64, 10, device="cuda"))
    ```

    ## Fix
    ```python
    with torch.autocast("cuda"):
        h = torch.mm(x, w1)
    h = h.float()  # leave the region in float32
    out = torch.mm(h, torch.randn(64, 10, device="cuda"))
    ```

    ## Fix safety
    No automatic fix: where to cast is the author's call.

    ## False positives
    Only values whose origin is visible in the same function are followed (names assigned
    once, a few steps deep); values produced by model calls are not known and are not
    reported. Uses inside another autocast region are not reported (it casts them).
    """

    code = "AMP019"
    name = "half-output-leaks-out-of-region"
    summary = "Half-precision output of an autocast region mixed with float32 after the region"
    uses_policy = True
    # A region, and a float32 value made outside one (a factory or `.float()`).
    fragments = (("autocast", AnyOf(r"\.float\(", "rand", "zeros", "ones", "empty", "full", "linspace", "eye")),)

    valid = (
        Valid("""
import torch
with torch.autocast("cuda"):
    h = torch.mm(x, w1)
h = h.float()
out = torch.mm(h, torch.randn(64, 10, device="cuda"))
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    h = torch.mm(x, w1)
    out = torch.mm(h, torch.randn(64, 10, device="cuda"))
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    s = torch.softmax(x, dim=-1)
out = torch.mm(s, torch.randn(64, 10, device="cuda"))
"""),
        # No op that needs equal dtypes; no float32 value; a method's receiver is not judged.
        Valid("""
import torch
with torch.autocast("cuda"):
    h = x.relu()
    g = x @ w
    k = x.mm(w)
out = torch.zeros(3) + h
out = g @ w2
out = k.mm(w.float())
"""),
    )
    invalid = (
        # `@`, a function imported under another name, a method of a float32 tensor.
        Invalid("""
import torch
from torch import mm as product, zeros
with torch.autocast("cuda"):
    h = x @ w
    g = product(x, w)
    k = x.mm(w)
out = h @ torch.zeros(3)
out = product(g, zeros(3, 3))
out = torch.ones(3, 3).addmm(k, w.float())
""", at=((8, 7, '`h` comes out of an autocast region in lower precision'),
         (9, 7, '`g` comes out of an autocast region in lower precision'),
         (10, 7, '`k` comes out of an autocast region in lower precision'))),
        Invalid("""
import torch
import torch.nn.functional as F
def head(x, w1):
    with torch.autocast(device_type="cuda"):
        h = F.linear(x, w1)
    w2 = torch.randn(10, 64, device="cuda")
    return F.linear(h, w2)
""", at=((8, 12, '`h` comes out of an autocast region in lower precision and `'),)),
        Invalid("""
import torch
with torch.autocast("cuda"):
    h = x @ w1
proj = torch.zeros(64, 10, device="cuda").float()
out = h @ proj
""", at=((6, 7, '`h` comes out of an autocast region in lower precision and `'),)),
        # A name the region sets to another name, which holds the region's lower-precision value.
        Invalid("""
import torch
def head(x, w1, w2):
    with torch.autocast("cuda"):
        h = torch.mm(x, w1)
        out = h
    return torch.mm(out, w2.float())
""", at=((7, 12, '`out` comes out of an autocast region in lower precision and'),)),
    )

    def check(self, ctx: AstContext) -> None:
        # a region, which the lower-precision value comes out of
        if all(ac.enabled is False for ac in autocast_calls(ctx)):
            return
        candidates = []
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            spelling = call_spelling(ctx, call)
            if spelling is not None:
                positional = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
                candidates.append((call, spelling, positional + [k.value for k in call.keywords if k.arg is None]))
        candidates.extend((node, "torch.Tensor.__matmul__", [node.left, node.right])
                          for node in sorted(ctx.outline.nodes(ast.BinOp), key=ctx.order)
                          if isinstance(node.op, ast.MatMult))
        table = ctx.policy()
        for node, spelling, args in candidates:
            if not any(_base(op) in _EQUAL_DTYPE_OPS for op in table.ops_reached_by(spelling)):
                continue
            if autocast_region(ctx, node) is not None:
                continue
            half = next((a for a in args if self._half_from_region(ctx, a)), None)
            full = next((a for a in args if a is not half and float32_outside_autocast(ctx, a)), None)
            if half is not None and full is not None:
                ctx.report(node, f"`{ctx.code(half)}` comes out of an autocast region in lower precision "
                                 f"and `{ctx.code(full)}` is float32: outside the region this raises "
                                 f"'expected scalar type'; cast with `{ctx.code(half)}.float()` at the "
                                 "region's end")

    @staticmethod
    def _half_from_region(ctx: AstContext, expr: ast.expr) -> bool:
        if not isinstance(expr, ast.Name):
            return False
        value = value_before(ctx, expr)
        if value is None:
            return False
        region = autocast_region(ctx, value)
        if region is None:
            return False
        table = region_table(ctx, region[0])
        if isinstance(value, ast.Call) and table is not None:
            # A project's own op, by its Python name (``mypkg.ops.fused_mm``): a table of
            # [tool.amplint] policies knows it; torch's spellings are inferred_dtype's.
            for name in ctx.outline.qualified_names(value.func):
                if not name.startswith("torch.") and table.ops_reached_by(name):
                    if casts_back(table, name):  # its output has its input's dtype
                        source = tensor_input(value, name)
                        return source is not None and inferred_dtype(ctx, source, table) == "lowp"
                    return policies_of(table, name) == {"lower_precision_fp"}
        return inferred_dtype(ctx, value, table) == "lowp"
