from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from ..engine import flow
from ..engine.context import FileContext
from ..engine.diagnostics import Fix
from ..engine.edits import edit_from_tree
from ..engine.flow import Event, Flow, line_of
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import Block, statement_of


class ClipGradWithoutUnscale(Rule):
    """
    ## What it does
    Finds gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`, any
    spelling or alias, or a helper of the same file whose body clips and never unscales)
    that some path reaches after `S.scale(loss).backward()` with no `S.unscale_(optimizer)`
    since, in the same function. Paths follow `if`s by their conditions (`if scaler is not
    None:` twice takes the same branch both times), `return`, `continue`, `break`, loops
    and `try`.

    A function that computes no gradients itself (the backward is its caller's) and clips
    before `S.step(optimizer)` with no `S.unscale_` on the way is reported too.

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
    the clip cover?) or there is no such step, there is no fix. Nor is there when another path
    reaches the clip already unscaled: a second `unscale_` there would raise.

    ## False positives
    A helper in another file, or one reached through another object, is not seen (a miss, not
    a false alarm). Library wrappers that unscale for you (`accelerator.clip_grad_norm_`,
    Lightning) are not the torch functions and are not reported. A function that clips and
    steps gradients whose caller already unscaled them would be reported.
    """

    code = "AMP002"
    name = "clip-grad-without-unscale"
    summary = "Gradient clipping on scaled gradients (no scaler.unscale_ first)"
    fixable = True
    # A scaler (a scaled backward, a GradScaler, a parameter named like one) and a clip.
    fragments = (("clip_grad", AnyOf(r"\.scale\(", "scaler", "Scaler", r"\.unscale_\(")),)  # the rarer first
    # What check() needs: a clip where gradients may be scaled, in one function.
    may_fire = staticmethod(lambda outline: flow.may_have_together(outline, flow.CLIP, (flow.SCALED_BACKWARD, flow.SCALER_STEP)))

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
        # The clip in the branch without a scaler sees plain gradients.
        Valid("""
import torch.nn as nn
def train_one_epoch(model, optimizer, scaler, loss, clip_grad_norm):
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if scaler is not None:
        if clip_grad_norm is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
    else:
        if clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()
"""),
        # Unscaled under the same condition as the scaled backward, through an alias; the
        # accumulation steps leave the loop before the clip.
        Valid("""
import torch
def train(self, loader, params, amp, accumulate):
    scaler = self.scaler
    for step, batch in enumerate(loader):
        loss = self.model(batch)
        if amp:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if step % accumulate > 0:
            continue
        if amp:
            scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if amp:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
"""),
        # A helper that unscales before it clips is not a clip of scaled gradients.
        Valid("""
import torch
class Trainer:
    def _clip(self, scaler, optimizer):
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)

    def step(self, scaler, loss, optimizer):
        scaler.scale(loss).backward()
        self._clip(scaler, optimizer)
        scaler.step(optimizer)
        scaler.update()
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
""", at=((5, 1, 'still scaled by `scaler`: `scaler.scale(...).backward()` on line 3'),)),
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
        # Unscaled only on one branch: the other path clips scaled gradients. No fix: on the
        # first path a second unscale_ would raise.
        Invalid("""
import torch
scaler.scale(loss).backward()
if log_grads:
    scaler.unscale_(optimizer)
    log(optimizer)
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
        # The backward is the caller's: the clip still comes before the scaler unscales.
        Invalid("""
import torch
def optimizer_step(model, optimizer, scaler, max_norm):
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
""", fixed="""
import torch
def optimizer_step(model, optimizer, scaler, max_norm):
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
""", at=((4, 5, '`scaler.step(optimizer)` on line 5 steps them'),)),
        # A method of the class that clips: reported where it is called.
        Invalid("""
from torch import nn
class Task:
    def _clip(self, max_norm):
        nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def run(self, loss):
        self.grad_scaler.scale(loss).backward()
        if self.clip_norm is not None:
            self._clip(self.clip_norm)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
""", fixed="""
from torch import nn
class Task:
    def _clip(self, max_norm):
        nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def run(self, loss):
        self.grad_scaler.scale(loss).backward()
        if self.clip_norm is not None:
            self.grad_scaler.unscale_(self.optimizer)
            self._clip(self.clip_norm)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
""", at=((10, 13, '(`self._clip` clips them on line 5)'),)),
        # An early exit that skips the unscale_ but not the clip.
        Invalid("""
import torch
def step(scaler, loss, model, optimizer, log_only):
    scaler.scale(loss).backward()
    for group in optimizer.param_groups:
        if log_only:
            break
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""", at=((9, 5, 'gradients are clipped while still scaled by `scaler`'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.CLIP) and scope.of(flow.SCALED_BACKWARD, flow.SCALER_STEP):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: FileContext, scope: Flow) -> None:
        analysis = _ScaledClips()
        flow.propagate(scope, analysis)
        for clip, causes in sorted(analysis.found.items(), key=lambda f: ctx.order(f[0].node)):
            # the backward or step nearest the clip, whatever order the paths came in
            cause = min(causes, key=lambda e: abs(ctx.order(e.node) - ctx.order(clip.node)))
            scaler = cause.scaler
            line = line_of(ctx, cause.node)
            if cause.kind == flow.SCALED_BACKWARD:
                where = f"`{scaler}.scale(...).backward()` on line {line}"
            else:
                where = f"`{ctx.code(cause.node)}` on line {line} steps them, and nothing unscales them before"
            helper = f" (`{ctx.code(clip.node.func)}` clips them on line {line_of(ctx, clip.via)})" if clip.via else ""
            later = [e for e in scope.events if ctx.order(e.node) > ctx.order(clip.node)]
            fix = None if clip in analysis.unscaled_before else self._fix(ctx, clip.node, scaler, later)
            ctx.report(clip.node, f"gradients are clipped while still scaled by `{scaler}`{helper}: {where}; "
                                  f"call `{scaler}.unscale_(optimizer)` first", fix)

    def _fix(self, ctx: FileContext, clip: cst.Call, scaler: str, later: list[Event]) -> Fix | None:
        steps = []
        for event in later:
            if event.kind in (flow.BACKWARD, flow.SCALED_BACKWARD):
                break
            if event.kind == flow.SCALER_STEP and event.scaler == scaler:
                steps.append(event)
        targets = {e.optimizer for e in steps}
        if len(targets) != 1 or None in targets or any(len(e.node.args) != 1 for e in steps):
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


@dataclass(frozen=True)
class _Gradients:
    scaled: frozenset[Event] = frozenset()  # the scaled backwards whose gradients nothing unscaled yet
    unscaled: frozenset[str] = frozenset()  # scalers whose unscale_ ran since their scaled backward
    known: bool = False  # a backward, unscale_ or scaler step ran: the gradients are this path's own
    open_clips: frozenset[Event] = frozenset()  # clips of gradients from elsewhere, no unscale_ since


class _ScaledClips(flow.Analysis):
    """Clips that see scaled gradients: after a scaled backward with no ``unscale_`` of its
    scaler since, or, on gradients this function did not compute, before a scaler's step with
    no ``unscale_`` between."""

    def __init__(self):
        self.found: dict[Event, set[Event]] = {}  # clip -> the scaled backwards or steps that make it wrong
        self.unscaled_before: set[Event] = set()  # clips that some path reaches already unscaled

    def start(self) -> _Gradients:
        return _Gradients()

    def event(self, fact: _Gradients, event: Event) -> _Gradients:
        kind = event.kind
        if kind == flow.SCALED_BACKWARD:
            return _Gradients(frozenset({b for b in fact.scaled if b.scaler != event.scaler} | {event}),
                              fact.unscaled - {event.scaler}, True)
        if kind == flow.BACKWARD:
            return replace(fact, known=True, open_clips=frozenset())
        if kind == flow.UNSCALE:
            return _Gradients(frozenset(b for b in fact.scaled if b.scaler != event.scaler),
                              fact.unscaled | {event.scaler}, True)
        if kind == flow.SCALER_STEP:
            for clip in fact.open_clips:
                self.found.setdefault(clip, set()).add(event)
            return _Gradients(frozenset(b for b in fact.scaled if b.scaler != event.scaler), fact.unscaled, True)
        if kind == flow.UPDATE:
            return replace(fact, unscaled=fact.unscaled - {event.scaler})
        if kind == flow.CLIP:
            if fact.scaled:
                self.found.setdefault(event, set()).update(fact.scaled)
            if fact.unscaled:
                self.unscaled_before.add(event)
            if not fact.known:
                return replace(fact, open_clips=fact.open_clips | {event})
        return fact
