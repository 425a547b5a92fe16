from __future__ import annotations

import ast
from functools import lru_cache

import libcst as cst

from ..engine.context import FileContext
from ..engine.outline import Outline
from ..engine.region_tables import region_table
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import (
    assigned_before,
    autocast_region,
    call_spelling,
    calls,
    calls_enabled_autocast,
    casts_back,
    float32_outside_autocast,
    inferred_dtype,
    makes_float32_outside_autocast,
    policies_of,
    region_spans,
    tensor_input,
)
from ..policy import committed_tables

# Ops that need all tensor inputs in one dtype when autocast is not there to cast them.
_EQUAL_DTYPE_OPS = frozenset({"mm", "matmul", "bmm", "addmm", "baddbmm", "addbmm", "mv", "dot",
                              "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                              "conv_transpose2d", "conv_transpose3d", "index_put", "scatter",
                              "scatter_add", "bilinear"})


def _base(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


@lru_cache(maxsize=None)
def _equal_dtype_callees() -> frozenset[str]:
    """The last part of every spelling that reaches an equal-dtype op, in any committed table
    (``linear`` for ``torch.nn.functional.linear``, ``einsum``, ``Linear``...)."""
    return frozenset(spelling.rsplit(".", 1)[-1] for table in committed_tables()
                     for spelling in table.spellings_reaching(lambda op: _base(op) in _EQUAL_DTYPE_OPS))


def _may_fire(outline: Outline) -> bool:
    """A float32 value (a factory without dtype, ``.float()``), and an ``@`` or a call that may
    reach an equal-dtype op (through an import, by the callee's qualified name, or as a method,
    by its attribute) with another name or call among its positional arguments and a name that
    a plain assignment earlier in the same function sets, inside a region, to a call, an ``@``
    or a name (what ``_half_from_region`` may find lower precision): what check() needs to
    report."""
    if not (calls_enabled_autocast(outline) and makes_float32_outside_autocast(outline)):
        return False
    scopes = outline.scopes
    # (function, name) -> where each assignment in a region to that name starts.
    made_in_region: dict[tuple[int, str], list[tuple[int, int]]] = {}
    spans = [((first.lineno, first.col_offset), (last.end_lineno, last.end_col_offset), scope)
             for first, last, scope in region_spans(outline)]
    for a in outline.nodes(ast.Assign):
        if len(a.targets) != 1 or not isinstance(a.targets[0], ast.Name) or not (
                isinstance(a.value, (ast.Call, ast.Name))
                or isinstance(a.value, ast.BinOp) and isinstance(a.value.op, ast.MatMult)):
            continue
        at, scope = (a.lineno, a.col_offset), scopes[id(a)]
        if any(start <= at < end and scope == region_scope for start, end, region_scope in spans):
            made_in_region.setdefault((scope, a.targets[0].id), []).append(at)
    if not made_in_region:
        return False

    def half_and_full(node: ast.AST, args: list[ast.expr]) -> bool:
        scope = scopes[id(node)]
        return sum(isinstance(a, (ast.Name, ast.Call)) for a in args) >= 2 and any(
            isinstance(a, ast.Name)
            and any(at < (a.lineno, a.col_offset) for at in made_in_region.get((scope, a.id), ())) for a in args)

    if any(isinstance(op.op, ast.MatMult) and half_and_full(op, [op.left, op.right])
           for op in outline.nodes(ast.BinOp)):
        return True
    callees = _equal_dtype_callees()
    return any(half_and_full(call, call.args) and (
        (isinstance(call.func, ast.Attribute) and call.func.attr in callees)
        or any(q.rsplit(".", 1)[-1] in callees for q in outline.qualified_names(call.func)))
        for call in outline.nodes(ast.Call))


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
    may_fire = staticmethod(_may_fire)

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
    )
    invalid = (
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

    def check(self, ctx: FileContext) -> None:
        candidates = []
        for call in calls(ctx):
            spelling = call_spelling(ctx, call)
            if spelling is not None:
                candidates.append((call, spelling, [a.value for a in call.args if a.keyword is None]))

        candidates.extend((node, "torch.Tensor.__matmul__", [node.left, node.right])
                          for node in ctx.nodes(cst.BinaryOperation)
                          if isinstance(node.operator, cst.MatrixMultiply))
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
    def _half_from_region(ctx: FileContext, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Name):
            return False
        value = assigned_before(ctx, expr)
        if value is None:
            return False
        region = autocast_region(ctx, value)
        if region is None:
            return False
        table = region_table(ctx, region[0])
        if isinstance(value, cst.Call) and table is not None:
            # A project's own op, by its Python name (``mypkg.ops.fused_mm``): a table of
            # [tool.amplint] policies knows it; torch's spellings are inferred_dtype's.
            for name in ctx.qualified_names(value.func):
                if not name.startswith("torch.") and table.ops_reached_by(name):
                    if casts_back(table, name):  # its output has its input's dtype
                        source = tensor_input(value, name)
                        return source is not None and inferred_dtype(ctx, source, table) == "lowp"
                    return policies_of(table, name) == {"lower_precision_fp"}
        return inferred_dtype(ctx, value, table) == "lowp"
