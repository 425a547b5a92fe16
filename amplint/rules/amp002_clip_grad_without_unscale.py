from __future__ import annotations

from collections import defaultdict

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.edits import edit_from_tree
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import (
    Block,
    CLIP_GRAD,
    calls,
    enclosing_function,
    method_call,
    runs_with,
    scaled_backward_scaler,
    statement_of,
)


class ClipGradWithoutUnscale(Rule):
    """
    ## What it does
    Finds gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`, any
    spelling or alias) after `S.scale(loss).backward()` with no `S.unscale_(optimizer)` before
    the clip on that path, in the same function.

    An `unscale_` before the clip counts when it runs whenever the scaled backward and the
    clip both do: every `if` around it also guards the clip (`if max_norm: S.unscale_(opt);
    clip(...)`), or has the same condition as one around the backward
    (`if scaler is not None:` around both, as real trainers write it).

    ## Why is this bad?
    After `S.scale(loss).backward()` the gradients are multiplied by the loss scale (65536 at
    first). Clipping them to `max_norm` clips the scaled values: the threshold is effectively
    divided by the scale, so the clip either does nothing or cuts every step, and it changes as
    the scale changes. PyTorch's AMP examples call `scaler.unscale_(optimizer)` first.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    ```

    ## Fix
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    ```

    ## Fix safety
    Safe: `scaler.step` skips unscaling an optimizer that was already unscaled, so the step
    is unchanged and the clip sees true gradients. The optimizer is the one argument of the
    `S.step(...)` that follows the clip; when several optimizers are stepped (which ones does
    the clip cover?) or there is no such step, there is no fix.

    ## False positives
    Clipping inside a helper function called between backward and step is not seen (a miss,
    not a false alarm). Library wrappers that unscale for you (`accelerator.clip_grad_norm_`,
    Lightning) are not the torch functions and are not reported.
    """

    code = "AMP002"
    name = "clip-grad-without-unscale"
    summary = "Gradient clipping on scaled gradients (no scaler.unscale_ first)"
    fixable = True
    fragments = (r"\.scale\(",)  # needs S.scale(loss).backward() before the clip

    valid = (
        Valid("""
import torch
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
"""),
        Valid("""
from torch.nn.utils import clip_grad_norm_
def train_step(self, batch):
    loss = self.compute_loss(batch)
    self.scaler.scale(loss).backward()
    if self.max_grad_norm:
        self.scaler.unscale_(self.optimizer)
        clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
    self.scaler.step(self.optimizer)
    self.scaler.update()
"""),
        Valid("""
import torch.nn as nn
if scaler is not None:
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
else:
    loss.backward()
nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""),
        Valid("""
import torch
def train_step(scaler, loss, model, optimizer, accumulate, step):
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if step % accumulate == 0:
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
"""),
        Valid("""
import torch
loss.backward()
torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
optimizer.step()
"""),
    )
    invalid = (
        Invalid("""
import torch
scaler.scale(loss).backward()
# keep the update small
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
scaler.step(optimizer)
scaler.update()
""", fixed="""
import torch
scaler.scale(loss).backward()
# keep the update small
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
scaler.step(optimizer)
scaler.update()
""", at=((5, 1, 'gradients are clipped while still scaled by `scaler`'),)),
        Invalid("""
from torch import nn
def step(self, loss):
    self.scaler.scale(loss).backward()
    if self.clip:
        nn.utils.clip_grad_value_(self.model.parameters(), self.clip)
    self.scaler.step(self.opt)
    self.scaler.update()
""", fixed="""
from torch import nn
def step(self, loss):
    self.scaler.scale(loss).backward()
    if self.clip:
        self.scaler.unscale_(self.opt)
        nn.utils.clip_grad_value_(self.model.parameters(), self.clip)
    self.scaler.step(self.opt)
    self.scaler.update()
""", at=((6, 9, 'gradients are clipped while still scaled by `self.scaler`'),)),
        # Unscaled only on one branch: the other path clips scaled gradients.
        Invalid("""
import torch
scaler.scale(loss).backward()
if log_grads:
    scaler.unscale_(optimizer)
    log(optimizer)
torch.nn.utils.clip_grad_norm_(params, 1.0)
scaler.step(optimizer)
scaler.update()
""", fixed="""
import torch
scaler.scale(loss).backward()
if log_grads:
    scaler.unscale_(optimizer)
    log(optimizer)
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(params, 1.0)
scaler.step(optimizer)
scaler.update()
""", at=((7, 1, 'gradients are clipped while still scaled by `scaler`'),)),
        # Two optimizers stepped: which to unscale is the author's call.
        Invalid("""
from torch.nn.utils import clip_grad_norm_ as clip
scaler.scale(loss).backward()
clip(params, 1.0)
scaler.step(opt_g)
scaler.step(opt_d)
scaler.update()
""", at=((4, 1, 'gradients are clipped while still scaled by `scaler`'),)),
    )

    def check(self, ctx: FileContext) -> None:
        scopes: dict[int, list[tuple[str, str | None, cst.Call]]] = defaultdict(list)
        for call in calls(ctx):
            scope = id(enclosing_function(ctx, call))
            scaler = scaled_backward_scaler(ctx, call)
            mc = method_call(call)
            if scaler is not None:
                scopes[scope].append(("backward", scaler, call))
            elif mc is not None and mc[1] in ("unscale_", "step"):
                scopes[scope].append((mc[1], ctx.code(mc[0]), call))
            elif ctx.resolves_to(call.func, CLIP_GRAD):
                scopes[scope].append(("clip", None, call))
        for events in scopes.values():
            self._check_scope(ctx, events)

    def _check_scope(self, ctx: FileContext, events) -> None:
        for i, (kind, _, clip) in enumerate(events):
            if kind != "clip":
                continue
            backwards = [(s, c) for k, s, c in events[:i] if k == "backward"]
            for scaler in dict.fromkeys(s for s, _ in backwards):
                unscales = [c for k, s, c in events[:i] if k == "unscale_" and s == scaler]
                mine = [c for s, c in backwards if s == scaler]
                covered = all(any(runs_with(ctx, u, clip, b) for u in unscales) for b in mine)
                if not covered:
                    ctx.report(clip, f"gradients are clipped while still scaled by `{scaler}`: "
                                     f"call `{scaler}.unscale_(optimizer)` first",
                               self._fix(ctx, clip, scaler, events[i + 1:]))
                    break

    def _fix(self, ctx: FileContext, clip: cst.Call, scaler: str, later) -> Fix | None:
        steps = []
        for kind, s, call in later:
            if kind == "backward":
                break
            if kind == "step" and s == scaler:
                steps.append(call)
        targets = {ctx.code(c.args[0].value) for c in steps
                   if len(c.args) == 1 and c.args[0].keyword is None and not c.args[0].star}
        if len(targets) != 1 or any(len(c.args) != 1 for c in steps):
            return None
        optimizer = targets.pop()
        stmt = statement_of(ctx, clip)
        block = ctx.parent(stmt)
        if not isinstance(block, Block):
            return None
        unscale = f"{scaler}.unscale_({optimizer})"
        body = list(block.body)
        at = next(i for i, s in enumerate(body) if s is stmt)
        if isinstance(stmt, cst.SimpleStatementLine) or not isinstance(block, cst.SimpleStatementSuite):
            new = cst.parse_statement(unscale + ctx.newline)
            if hasattr(stmt, "leading_lines"):  # comments above the clip stay above both lines
                new = new.with_changes(leading_lines=stmt.leading_lines)
                body[at] = stmt.with_changes(leading_lines=())
        else:
            new = cst.Expr(cst.parse_expression(unscale))
        new_block = block.with_changes(body=body[:at] + [new] + body[at:])
        return Fix(f"Insert `{unscale}` before the clip", (edit_from_tree(ctx, block, new_block),))
