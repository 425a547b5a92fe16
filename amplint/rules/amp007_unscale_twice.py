from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.flow import Event, line_of
from ..engine.rule import Invalid, Rule, Valid
from ..engine.enabling import scaler_switch


class UnscaleTwice(Rule):
    """
    ## What it does
    Finds `S.unscale_(opt)` reached on some path where `S` already unscaled or stepped the same
    optimizer since its last `S.update()`: twice in one iteration, after `S.step(opt)`, or in
    the next iteration of a loop when an iteration can end without `S.update()` (an
    `unscale_` every micro-batch while step and update run only at the accumulation boundary;
    a "non-finite gradients, skip this step" branch that skips the update too).

    ## Why is this bad?
    `unscale_` may run once per optimizer per iteration; a second call raises
    `RuntimeError: unscale_() has already been called on this optimizer since the last
    update()`. After `step(opt)` the gradients were already unscaled and consumed.

    ## Example
    ```python
    scaler.unscale_(optimizer)
    clip_grad_norm_(params, 1.0)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    ```

    ## Fix
    Remove the second call; unscale once, before anything that reads the gradients.

    ## Fix safety
    No automatic fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    Paths follow `if`s by their conditions (the same condition twice takes the same branch)
    and exits; a loop that rebinds the optimizer (`for opt in optimizers:`) unscales a new one
    each iteration. Only calls in one function are compared.
    """

    code = "AMP007"
    name = "unscale-twice"
    summary = "scaler.unscale_(opt) twice per iteration, or after scaler.step(opt)"
    fragments = (r"\.unscale_\(",)

    valid = (
        Valid("""
scaler.scale(loss).backward()
scaler.unscale_(opt_a)
scaler.unscale_(opt_b)
scaler.step(opt_a)
scaler.step(opt_b)
scaler.update()
"""),
        Valid("""
for batch in loader:
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
"""),
        # The skip path updates too (scaler.step skips the optimizer on inf/NaN itself).
        Valid("""
import torch
for i, batch in enumerate(loader):
    scaler.scale(model(batch)).backward()
    if i % accumulate == 0:
        if scaler is not None:
            scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(grad_norm):
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
        else:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
"""),
        # One optimizer per iteration, one update after the loop.
        Valid("""
import torch
for opt in optimizers:
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(params_of(opt), 1.0)
    scaler.step(opt)
scaler.update()
"""),
        # A project's own loss scaler, not torch's GradScaler: its unscale_ has no such state.
        Valid("""
class Trainer:
    def __init__(self, fp16):
        self.scaler = DynamicLossScaler(init_scale=4) if fp16 else None

    def train(self, loader):
        for batch in loader:
            self.scaler.scale(self.loss(batch)).backward()
            self.scaler.unscale_(self.model.parameters())
            if self.overflow():
                continue
            self.optimizer.step()
            self.scaler.update()
"""),
        # Unscaled again only after an early return.
        Valid("""
def step(self):
    if self.amp:
        self.scaler.unscale_(self.optimizer)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return
    self.scaler.unscale_(self.optimizer)
"""),
    )
    invalid = (
        Invalid("""
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(params, 1.0)
scaler.unscale_(optimizer)
scaler.step(optimizer)
scaler.update()
""", at=((5, 1, '`scaler.unscale_(optimizer)` again before `scaler.update()` (first on line 3)'),)),
        Invalid("""
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.unscale_(optimizer)
log_grad_norms(model)
scaler.update()
""", at=((4, 1, '`scaler.unscale_(optimizer)` after `scaler.step(optimizer)` on line 3'),)),
        # Unscaled every micro-batch, updated only at the accumulation boundary.
        Invalid("""
import torch
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean()).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if (i + 1) % accumulate == 0:
        scaler.step(optimizer)
        scaler.update()
""", at=((5, 5, 'runs again in the next iteration of the loop on line 3'),)),
        # A non-finite norm skips step and update: the next iteration's unscale_ raises.
        Invalid("""
import torch
def train_epoch(model, loader, optimizer, scaler):
    for batch in loader:
        scaler.scale(model(batch)).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad()
            continue
        scaler.step(optimizer)
        scaler.update()
""", at=((6, 9, 'an iteration can end without `update()`'),)),
    )

    def check(self, ctx: AstContext) -> None:
        if not ctx.outline.method_calls("unscale_"):  # every finding is an `S.unscale_(...)` call
            return
        for scope in flow.flows(ctx):
            if scope.of(flow.UNSCALE):
                analysis = _Unscales()
                flow.propagate(scope, analysis)
                for call in sorted(analysis.found, key=lambda e: ctx.order(e.node)):
                    self._report(ctx, call, analysis.found[call])

    def _report(self, ctx: AstContext, call: Event, causes: set[Event]) -> None:
        s, opt = call.scaler, call.optimizer
        switch = scaler_switch(ctx, s) if s else None  # a disabled scaler's unscale_ does nothing
        when, related = (f" ({switch.when})", switch.related) if switch else ("", ())
        earlier = [e for e in causes if e.kind == flow.UNSCALE]
        if not earlier:
            step = min(causes, key=lambda e: ctx.order(e.node))
            ctx.report(call.node, f"`{s}.unscale_({opt})` after `{s}.step({opt})` on line "
                                  f"{line_of(ctx, step.node)}: unscale before stepping{when}", related=related)
            return
        before = [e for e in earlier if ctx.order(e.node) < ctx.order(call.node)]
        if before:
            first = max(before, key=lambda e: ctx.order(e.node))
            ctx.report(call.node, f"`{s}.unscale_({opt})` again before `{s}.update()` (first on line "
                                  f"{line_of(ctx, first.node)}): it raises at runtime{when}", related=related)
            return
        loop = ctx.enclosing(call.node, (ast.For, ast.AsyncFor, ast.While))
        ctx.report(call.node, f"`{s}.unscale_({opt})` runs again in the next iteration of the loop on line "
                              f"{line_of(ctx, loop)} before any `{s}.update()`: an iteration can end "
                              f"without `update()` after it, and the next one raises{when}", related=related)


@dataclass(frozen=True)
class _Unscaled:
    unscaled: frozenset[Event] = frozenset()  # unscale_ calls since their scaler's update()
    stepped: frozenset[Event] = frozenset()  # scaler steps since their scaler's update()


class _Unscales(flow.Analysis):
    """``unscale_(opt)`` reached where its scaler already unscaled or stepped ``opt`` since
    its last ``update()``, across loop iterations too."""

    back_edges = True

    def __init__(self):
        self.found: dict[Event, set[Event]] = {}  # unscale_ -> the earlier unscale_ or step

    def start(self) -> _Unscaled:
        return _Unscaled()

    def event(self, fact: _Unscaled, event: Event) -> _Unscaled:
        if event.kind == flow.UPDATE:
            return _Unscaled(frozenset(e for e in fact.unscaled if e.scaler != event.scaler),
                             frozenset(e for e in fact.stepped if e.scaler != event.scaler))
        if event.kind == flow.SCALER_STEP:
            return replace(fact, stepped=fact.stepped | {event})
        if event.kind == flow.UNSCALE:
            same = {e for e in fact.unscaled | fact.stepped
                    if e.scaler == event.scaler and e.optimizer == event.optimizer}
            if same:
                self.found.setdefault(event, set()).update(same)
            return replace(fact, unscaled=fact.unscaled | {event})
        return fact

    def forget(self, fact: _Unscaled, names: frozenset[str]) -> _Unscaled:
        """An optimizer (or scaler) the loop rebinds is another one in the next iteration."""
        def kept(e: Event) -> bool:
            return not flow.mentions(e.optimizer or "", names) and not flow.mentions(e.scaler, names)
        return _Unscaled(frozenset(filter(kept, fact.unscaled)), frozenset(filter(kept, fact.stepped)))
