from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from ..engine import flow
from ..engine.context import FileContext
from ..engine.enabling import scaler_switch
from ..engine.flow import Event, Flow, line_of
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import called_function, enclosing_function, method_call


class ScalerStepWithoutUpdate(Rule):
    """
    ## What it does
    In a function that runs a whole scaled iteration (`S.scale(loss).backward()` and
    `S.step(...)` or `S.update()`), finds: `S.step(...)` calls no path follows with
    `S.update()`; a `S.update()` that comes only before the steps; `S.update()` reached a
    second time on one path between scaled backwards (with several optimizers, step each one,
    then update once); `S.step(opt)` reached on some path where `S` already stepped `opt`
    since its last update; and `S.update()` that no path reaches after a `S.step(...)` or
    `S.unscale_(...)` since the function's start or the last update (a plain
    `optimizer.step()` counts as the step: AMP005 reports it).

    ## Why is this bad?
    `update()` is what adapts the loss scale: without it the scale never grows back after an
    overflow and never shrinks, so steps keep being skipped or gradients keep underflowing.
    Updating before stepping uses the wrong iteration's overflow record, and updating twice
    per iteration halves/grows the scale twice and loses the other optimizers' inf checks.
    Stepping one optimizer twice before an update raises ("step() has already been called
    since the last update()"), and so does an update with no step or unscale since the last
    one ("No inf checks were recorded prior to update").

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(opt_a)
    scaler.update()
    scaler.step(opt_b)
    scaler.update()
    ```

    ## Fix
    ```python
    scaler.scale(loss).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    ```

    ## Fix safety
    No automatic fix: where the update belongs depends on the loop's structure.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    Only functions that contain the scaled backward are checked, so a `step()` helper whose
    caller updates is not reported. A repeated step and an update without a step are not
    reported in a function that passes the scaler to a call or calls a helper of the file that
    steps, unscales or updates it (`self.optimizer_step()`): the step may be there. Paths follow `if`s by their
    conditions and exits, so updates in different branches (or under the same condition as
    their step) count as one. An update reached with a step on some paths and without on
    others is AMP017's. A loop's body is followed once, so a step repeated in the next
    iteration is not reported here.
    """

    code = "AMP006"
    name = "scaler-step-without-update"
    summary = "GradScaler step without exactly one update after it"
    fragments = (r"\.scale\(",)
    may_fire = staticmethod(lambda outline: flow.may_have_together(outline, flow.SCALED_BACKWARD,
                                                                   (flow.SCALER_STEP, flow.UPDATE)))

    valid = (
        Valid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
"""),
        Valid("""
def step(self):
    self.scaler.step(self.optimizer)
"""),
        Valid("""
scaler.scale(loss).backward()
if accumulate_done:
    scaler.step(optimizer)
    scaler.update()
"""),
        # Several optimizers through one function: update after the last one only.
        # A last partial accumulation after the loop: its own step and update.
        Valid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    boundary = (i + 1) % k == 0
    if boundary:
        scaler.step(optimizer)
        scaler.update()
if (i + 1) % k != 0:
    scaler.step(optimizer)
    scaler.update()
"""),
        Valid("""
def optimize(self, scaler, loss, optimizer, idx, count):
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    if idx + 1 == count:
        scaler.update()
"""),
        # Update on the early-return path and at the end: one per path.
        Valid("""
def step(self, loss, skip):
    self.scaler.scale(loss).backward()
    self.scaler.unscale_(self.optimizer)
    if skip:
        self.scaler.update()
        return
    self.scaler.step(self.optimizer)
    self.scaler.update()
"""),
        # Accumulation: micro-batches leave the iteration before the step and the update.
        Valid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k:
        continue
    scaler.step(optimizer)
    scaler.update()
"""),
        # Each optimizer of a list stepped once, then one update.
        Valid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
"""),
        # The step is in a call given the scaler, or in a helper of the class.
        Valid("""
def train_iteration(self, step):
    self.grad_scaler.scale(self.loss(step)).backward()
    self.optimizers.scaler_step_some(self.grad_scaler, self.groups_due(step))
    self.grad_scaler.update()
"""),
        Valid("""
class Trainer:
    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)
        self.scaler.step(self.optimizer)
    def train_step(self, loss):
        self.scaler.scale(loss).backward()
        self.optimizer_step()
        self.scaler.update()
"""),
        # With the scaler disabled a plain step runs (AMP005's concern): the update follows a step either way.
        Valid("""
def step(self, loss):
    self.scaler.scale(loss).backward()
    if self.scaler.is_enabled():
        self.scaler.step(self.optimizer)
    else:
        self.optimizer.step()
    self.scaler.update()
"""),
    )
    invalid = (
        Invalid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    scaler.step(optimizer)
    optimizer.zero_grad()
""", at=((4, 5, '`scaler.step(...)` is never followed by `scaler.update()`'),)),
        Invalid("""
for batch in loader:
    scaler.update()
    scaler.scale(model(batch).mean()).backward()
    scaler.step(optimizer)
""", at=((3, 5, '`scaler.update()` runs before `scaler.step(...)` (line 5)'),)),
        Invalid("""
scaler.scale(loss).backward()
scaler.step(opt_a)
scaler.update()
scaler.step(opt_b)
scaler.update()
""", at=((6, 1, '`scaler.update()` is called more than once per iteration (also on line 4)'),)),
        # The second update is conditional, but on its path the first one ran too.
        Invalid("""
def step(self, loss):
    self.scaler.scale(loss).backward()
    self.scaler.step(self.optimizer)
    self.scaler.update()
    if self.log_scale:
        self.scaler.update()
""", at=((7, 9, 'is called more than once per iteration (also on line 5)'),)),
        Invalid("""
def train_step(scaler, optimizer, loss):
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.step(optimizer)
    scaler.update()
""", at=((5, 5, '`scaler.step(optimizer)` again before `scaler.update()` (first on line 4)'),)),
        Invalid("""
for batch in loader:
    scaler.scale(model(batch).mean()).backward()
    optimizer.zero_grad()
    scaler.update()
""", at=((5, 5, '`scaler.update()` with no `scaler.step(...)` since the last update'),)),
        # The skip path updates without a step (or an unscale_ that would record the inf checks).
        Invalid("""
import torch
def train_step(self, loss):
    self.scaler.scale(loss).backward()
    if not torch.isfinite(loss):
        self.scaler.update()
        return
    self.scaler.step(self.optimizer)
    self.scaler.update()
""", at=((6, 9, '`self.scaler.update()` with no `self.scaler.step(...)` since the last update'),)),
    )

    def check(self, ctx: FileContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALED_BACKWARD) and scope.of(flow.SCALER_STEP, flow.UPDATE):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: FileContext, scope: Flow) -> None:
        analysis = _Updates()
        flow.propagate(scope, analysis)
        scaled = {e.scaler for e in scope.of(flow.SCALED_BACKWARD)}
        reported: set[Event] = set()  # one finding per call

        def report(event: Event, message: str) -> None:
            if event not in reported:
                reported.add(event)
                switch = scaler_switch(ctx, event.scaler) if event.scaler else None
                ctx.report(event.node, message + (f" ({switch.when})" if switch else ""),
                           related=switch.related if switch else ())

        for scaler in sorted(scaled):
            steps = [e for e in scope.of(flow.SCALER_STEP) if e.scaler == scaler]
            updates = [e for e in scope.of(flow.UPDATE) if e.scaler == scaler]
            if steps and not any(e in analysis.followed for e in steps):
                last = steps[-1]
                if updates:
                    report(updates[0], f"`{scaler}.update()` runs before `{scaler}.step(...)` (line "
                                       f"{line_of(ctx, last.node)}): update once, after every step")
                else:
                    report(last, f"`{scaler}.step(...)` is never followed by `{scaler}.update()`: "
                                 "the loss scale never adapts")
        for update in sorted(analysis.twice, key=lambda e: ctx.order(e.node)):
            first = min(analysis.twice[update], key=lambda e: ctx.order(e.node))
            report(update, f"`{update.scaler}.update()` is called more than once per iteration (also "
                           f"on line {line_of(ctx, first.node)}): step every optimizer, then update once")
        for step in sorted(analysis.stepped_again, key=lambda e: ctx.order(e.node)):
            if step.scaler in scaled and not _out_of_sight(ctx, scope, step.scaler):
                first = min(analysis.stepped_again[step], key=lambda e: ctx.order(e.node))
                report(step, f"`{step.scaler}.step({step.optimizer})` again before `{step.scaler}.update()` "
                             f"(first on line {line_of(ctx, first.node)}): it raises at runtime; step each "
                             "optimizer once, then update")
        for update in sorted(analysis.unchecked - analysis.checked, key=lambda e: ctx.order(e.node)):
            if update.scaler in scaled and not _out_of_sight(ctx, scope, update.scaler):
                report(update, f"`{update.scaler}.update()` with no `{update.scaler}.step(...)` since the "
                               "last update on any path: it raises (no inf checks recorded); update after "
                               "the step")


_SCALER_STATE = frozenset({"step", "unscale_", "update"})  # what records or clears inf checks


def _out_of_sight(ctx: FileContext, scope: Flow, scaler: str) -> bool:
    """Whether the function may step or update ``scaler`` where its flow does not show it: it
    passes the scaler to a call (nerfstudio's `optimizer_scaler_step_some(self.grad_scaler,
    ...)`), or calls a helper of the file that steps, unscales or updates it."""
    func = scope.scope if isinstance(scope.scope, cst.FunctionDef) else None
    for call in ctx.nodes(cst.Call):
        if not ctx.contains(scope.scope, call) or enclosing_function(ctx, call) is not func:
            continue
        if any(ctx.code(a.value) == scaler for a in call.args):
            return True
        helper = called_function(ctx, call)
        if helper is not None and any(
                (mc := method_call(c)) is not None and mc[1] in _SCALER_STATE and ctx.code(mc[0]) == scaler
                for c in ctx.nodes(cst.Call) if ctx.contains(helper, c)):
            return True
    return False


@dataclass(frozen=True)
class _Pending:
    steps: frozenset[Event] = frozenset()  # scaler steps no update has followed yet
    updates: frozenset[Event] = frozenset()  # updates since their scaler's last scaled backward
    stepped: frozenset[Event] = frozenset()  # steps since then, followed or not
    # Scalers that stepped or unscaled since their last update (both record the inf checks
    # update() reads); None once a plain optimizer.step() ran (AMP005 reports that one).
    checked: frozenset[str | None] = frozenset()


class _Updates(flow.Analysis):
    """Which scaler steps some path follows with an update, updates a path reaches twice
    between scaled backwards, steps a path reaches again before an update, and updates some
    path reaches with or without a step since the last update."""

    def __init__(self):
        self.followed: set[Event] = set()
        self.twice: dict[Event, set[Event]] = {}  # update -> the earlier updates on its paths
        self.stepped_again: dict[Event, set[Event]] = {}  # step -> the same optimizer's earlier steps
        self.checked: set[Event] = set()  # updates some path reaches after a step
        self.unchecked: set[Event] = set()  # updates some path reaches without one

    def start(self) -> _Pending:
        return _Pending()

    def event(self, fact: _Pending, event: Event) -> _Pending:
        if event.kind == flow.SCALED_BACKWARD:
            return replace(fact, updates=frozenset(u for u in fact.updates if u.scaler != event.scaler),
                           stepped=frozenset(s for s in fact.stepped if s.scaler != event.scaler))
        if event.kind == flow.UNSCALE:
            return replace(fact, checked=fact.checked | {event.scaler})
        if event.kind == flow.STEP:
            return replace(fact, checked=fact.checked | {None})
        if event.kind == flow.SCALER_STEP:
            again = {s for s in fact.steps if s.scaler == event.scaler and s.optimizer == event.optimizer}
            if again and event.optimizer is not None:
                self.stepped_again.setdefault(event, set()).update(again)
            checked = fact.checked | {event.scaler}
            if any(s.scaler == event.scaler and s.optimizer == event.optimizer for s in fact.steps | fact.stepped):
                # the same optimizer stepped again: a new round (a last partial accumulation
                # after the loop), whose update is not a second one
                return _Pending(fact.steps | {event}, frozenset(u for u in fact.updates if u.scaler != event.scaler),
                                frozenset({event}), checked)
            return _Pending(fact.steps | {event}, fact.updates, fact.stepped | {event}, checked)
        if event.kind == flow.UPDATE:
            mine = {s for s in fact.steps if s.scaler == event.scaler}
            self.followed.update(mine)
            earlier = {u for u in fact.updates if u.scaler == event.scaler}
            if earlier:
                self.twice.setdefault(event, set()).update(earlier)
            (self.checked if fact.checked & {event.scaler, None} else self.unchecked).add(event)
            return _Pending(fact.steps - mine, fact.updates | {event}, fact.stepped,
                            fact.checked - {event.scaler, None})
        return fact
