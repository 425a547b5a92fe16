from __future__ import annotations

import ast

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.outline import Outline
from ..engine.semantics import calls, method_call

_SOFTMAX = frozenset({"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"})
_LOG = frozenset({"torch.log"})


def _may_fire(outline: Outline) -> bool:
    """A `log(<softmax call>)` or `<softmax call>.log()`, as check() resolves the names: torch's
    log through the imports; a softmax through the imports, or any method named so."""
    def softmax(expr: ast.expr) -> bool:
        return isinstance(expr, ast.Call) and (
            (isinstance(expr.func, ast.Attribute) and expr.func.attr == "softmax")
            or not outline.qualified_names(expr.func).isdisjoint(_SOFTMAX))

    return any((not outline.qualified_names(c.func).isdisjoint(_LOG) and len(c.args) == 1 and softmax(c.args[0]))
               or (isinstance(c.func, ast.Attribute) and c.func.attr == "log" and not c.args and softmax(c.func.value))
               for c in outline.nodes(ast.Call))


class LogOfSoftmax(Rule):
    """
    ## What it does
    Finds `torch.log(torch.softmax(x, d))`, `F.softmax(x, d).log()`, `x.softmax(d).log()` and
    the like.

    ## Why is this bad?
    Softmax probabilities underflow to exactly 0 for very negative logits — at around 1e-8 in
    float16 — and the log of 0 is `-inf`, which turns the loss and then the gradients into NaN.
    `log_softmax` computes the same value stably (log-sum-exp) in one op.

    ## Example
    ```python
    log_probs = torch.log(F.softmax(logits, dim=-1))
    ```

    ## Fix
    ```python
    log_probs = F.log_softmax(logits, dim=-1)
    ```

    ## Fix safety
    Safe: the same value where the original is finite, and no `-inf` where it was not. The
    `log_softmax` is reached the same way as the softmax was (`torch.`, `F.`, the tensor
    method), and its arguments are kept; no fix when the softmax was imported by its bare name.

    ## False positives
    None known.
    """

    code = "AMP013"
    preview = True  # triaged precision below 0.9: docs/triage.md
    name = "log-of-softmax"
    summary = "log(softmax(x)) instead of log_softmax(x)"
    fixable = True
    fragments = (("softmax", AnyOf(r"softmax\([^\n]*\.log\(\)", r"log\([^\n]*softmax")),)
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
import torch.nn.functional as F
def head(self, x):
    return self.softmax(x).log()
log_probs = F.log_softmax(logits, dim=-1)
probs = torch.softmax(logits, -1)
entropy = -(probs * torch.log(probs + 1e-9)).sum(-1)
"""),
    )
    invalid = (
        Invalid("""
import torch
import torch.nn.functional as F
a = torch.log(F.softmax(logits, dim=-1))
b = torch.softmax(logits, 1).log()
def f(x):
    logits = x * 2
    return logits.softmax(dim=-1).log()
""", fixed="""
import torch
import torch.nn.functional as F
a = F.log_softmax(logits, dim=-1)
b = torch.log_softmax(logits, 1)
def f(x):
    logits = x * 2
    return logits.log_softmax(dim=-1)
""", at=((4, 5, 'log of softmax underflows to -inf in half precision'), (5, 5, 'log of softmax underflows to -inf in half precision'), (8, 12, 'log of softmax underflows to -inf in half precision'),)),
        Invalid("""
import torch
from torch.nn.functional import softmax
a = torch.log(softmax(logits, dim=-1))
""", at=((4, 5, 'log of softmax underflows to -inf in half precision'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for call in calls(ctx):
            inner = None
            if ctx.resolves_to(call.func, _LOG) and len(call.args) == 1 and call.args[0].keyword is None:
                inner = call.args[0].value
            else:
                mc = method_call(call)
                if mc is not None and mc[1] == "log" and not call.args:
                    inner = mc[0]
            if not isinstance(inner, cst.Call) or not self._is_softmax(ctx, inner):
                continue
            ctx.report(call, "log of softmax underflows to -inf in half precision: use log_softmax",
                       self._fix(ctx, call, inner))

    @staticmethod
    def _is_softmax(ctx: FileContext, call: cst.Call) -> bool:
        if ctx.resolves_to(call.func, _SOFTMAX):
            return True
        mc = method_call(call)
        # x.softmax(d) is the tensor method; self.softmax(x) is some attribute of a module.
        return mc is not None and mc[1] == "softmax" and not ctx.code(mc[0]).split(".")[0] == "self" \
            and not any(n.startswith("torch.") for n in ctx.qualified_names(call.func))

    @staticmethod
    def _fix(ctx: FileContext, call: cst.Call, softmax: cst.Call) -> Fix | None:
        if not isinstance(softmax.func, cst.Attribute):
            return None
        new = softmax.with_changes(func=softmax.func.with_changes(attr=cst.Name("log_softmax")))
        return Fix("Use log_softmax", (ctx.replace(call, ctx.module.code_for_node(new)),))
