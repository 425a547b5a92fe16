from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.diagnostics import Fix
from ..engine.rule import AnyOf, Invalid, Rule, Valid

_SOFTMAX = frozenset({"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"})
_LOG = frozenset({"torch.log"})


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

    def check(self, ctx: AstContext) -> None:
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            inner = None
            if ctx.outline.qualified_names(call.func) & _LOG and len(call.args) == 1 and not call.keywords:
                inner = call.args[0]
            elif isinstance(call.func, ast.Attribute) and call.func.attr == "log" and not call.args \
                    and not call.keywords:
                inner = call.func.value
            if not isinstance(inner, ast.Call) or not self._is_softmax(ctx, inner):
                continue
            ctx.report(call, "log of softmax underflows to -inf in half precision: use log_softmax",
                       self._fix(ctx, call, inner))

    @staticmethod
    def _is_softmax(ctx: AstContext, call: ast.Call) -> bool:
        names = ctx.outline.qualified_names(call.func)
        if names & _SOFTMAX:
            return True
        # x.softmax(d) is the tensor method; self.softmax(x) is some attribute of a module.
        return isinstance(call.func, ast.Attribute) and call.func.attr == "softmax" \
            and ctx.code(call.func.value).split(".")[0] != "self" and not any(n.startswith("torch.") for n in names)

    @staticmethod
    def _fix(ctx: AstContext, call: ast.Call, softmax: ast.Call) -> Fix | None:
        if not isinstance(softmax.func, ast.Attribute):
            return None
        start, end = ctx.offsets(softmax)
        name_end = ctx.offsets(softmax.func)[1]  # the attribute ends with its name
        name_start = name_end - len("softmax")
        text = ctx.source[start:name_start] + "log_softmax" + ctx.source[name_end:end]
        return Fix("Use log_softmax", (ctx.replace(call, text),))
