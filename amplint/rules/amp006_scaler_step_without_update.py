from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Iterator

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.flow import Event
from ..engine.method_calls import RETURN, MethodFlow, Reached, evidence, hops, method_flows, order, place, site, through
from ..engine.rule import Invalid, Rule, Valid
from ..engine.enabling import scaler_switch


class ScalerStepWithoutUpdate(Rule):
    """
    ## What it does
    In a function that runs a whole scaled iteration (`S.scale(loss).backward()` and
    `S.step(...)` or `S.update()`), with the methods it calls on `self` counted where it calls
    them (`self._optimizer_step()`, in its class or a base class of the project), finds:
    `S.step(...)` calls no path follows with `S.update()`; a `S.update()` that comes only
    before the steps; `S.update()` reached a second time on one path between scaled backwards
    (with several optimizers, step each one, then update once), or run by every iteration of a
    loop that steps another optimizer each time, with no backward of its own; `S.step(opt)`
    reached on some path where `S` already stepped `opt` since its last update; `S.update()`
    that no path reaches after a `S.step(...)` or `S.unscale_(...)` since the function's start
    or the last update (a plain `optimizer.step()` counts as the step: AMP005 reports it); and
    a `return` that leaves a `S.step(opt)` or `S.unscale_(opt)` without the update that comes
    after it in its function (an early return on overflow). A finding in a called method sits
    there (or, in another module, on the call) and names the method and the call that runs it.

    ## Why is this bad?
    `update()` is what adapts the loss scale: without it the scale never grows back after an
    overflow and never shrinks, so steps keep being skipped or gradients keep underflowing.
    Updating before stepping uses the wrong iteration's overflow record, and updating twice
    per iteration halves/grows the scale twice and loses the other optimizers' inf checks (the
    next optimizer's step then unscales with a scale the update changed). Stepping one
    optimizer twice before an update raises ("step() has already been called since the last
    update()"), as does an update with no step or unscale since the last one ("No inf checks
    were recorded prior to update"), and the next iteration's `step`/`unscale_` after a
    return that skipped the update.

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
    Only functions that contain the scaled backward (themselves or in a method they call) are
    checked, and a step with no update, or a return, only in a function no other function of
    the file calls on `self`: a caller may update. Calls on `self` are followed three deep,
    not into a method with a `return` inside a loop; a repeated step and an update without a
    step are not reported where the scaler is passed to a call, or a method or helper of the
    file that steps, unscales or updates it is not followed: the step may be there. Paths
    follow `if`s by their conditions and exits, so updates in different branches (or under
    the same condition as their step) count as one. An update reached with a step on some
    paths and without on others is AMP017's. A loop's body is followed once, so a step
    repeated in the next iteration is not reported here; a loop updates once per optimizer
    only if its update is under no condition on what the loop changes, nor after an exit on
    one (`if i != optim_idx: continue`). A return is reported only for an optimizer of the
    function's own: a caller passing the optimizer may update after the last one.
    """

    code = "AMP006"
    name = "scaler-step-without-update"
    summary = "GradScaler step without exactly one update after it"
    fragments = (r"\.scale\(",)

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
        # Across methods: every optimizer stepped, then one update; the update after the last one.
        Valid("""
class Trainer:
    def step_all(self):
        for opt in self.optimizers:
            self.scaler.step(opt)
    def step_each(self):
        for i, opt in enumerate(self.optimizers):
            self.scaler.step(opt)
            if i == len(self.optimizers) - 1:
                self.scaler.update()
    def train_step(self, loss):
        self.scaler.scale(loss).backward()
        self.step_all()
        self.scaler.update()
    def train_step_last(self, loss):
        self.scaler.scale(loss).backward()
        self.step_each()
"""),
        # The base class's update in a `finally:` runs on the early return too.
        Valid("""
from trainers.base import BaseTrainer
class Trainer(BaseTrainer):
    def train_step(self, loss):
        self.scaler.scale(loss).backward()
        try:
            self.scaler.step(self.optimizer)
            if not loss.isfinite():
                return None
        finally:
            self.end_step()
""", project=(("trainers/__init__.py", ""), ("trainers/base.py", """
class BaseTrainer:
    def end_step(self):
        self.scaler.update()
"""))),
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
        # A helper updates once per optimizer.
        Invalid("""
class Trainer:
    def backward(self, loss):
        self.scaler.scale(loss).backward()
    def optimizer_step(self):
        for opt in self.optimizers:
            self.scaler.step(opt)
            self.scaler.update()
    def train_step(self, loss):
        self.backward(loss)
        self.optimizer_step()
""", at=((8, 13, 'runs once per optimizer: each iteration of the loop on line 6 in `optimizer_step`'),)),
        # The early return on overflow skips the update of the base class's method.
        Invalid("""
import math
from trainers.base import BaseTrainer
class Trainer(BaseTrainer):
    def train_step(self, loss):
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        if not math.isfinite(clip_grad_norm_(self.model.parameters(), 1.0)):
            return None
        self.scaler.step(self.optimizer)
        self.end_step()
""", at=((9, 13, '`return` leaves `self.scaler.unscale_(self.optimizer)` (line 7) without the'),),
            project=(("trainers/__init__.py", ""), ("trainers/base.py", """
class BaseTrainer:
    def end_step(self):
        self.scaler.update()
"""))),
    )

    def check(self, ctx: AstContext) -> None:
        flows = [f for f in method_flows(ctx)
                 if f.flow.of(flow.SCALED_BACKWARD) and f.flow.of(flow.SCALER_STEP, flow.UPDATE)]
        inlined = {id(h.method) for f in flows for h in f.wrappers.values()}
        findings: dict[int, tuple] = {}  # by node: the finding reached through the fewest calls
        for scope in flows:
            _check_flow(ctx, scope, id(scope.function) not in inlined, findings)
        for _, node, message, related in findings.values():
            ctx.report(node, message, related=related)


def _check_flow(ctx: AstContext, scope: MethodFlow, outermost: bool, findings: dict[int, tuple]) -> None:
    """``outermost``: no other function of the file runs this one through ``self``, so its
    paths end the iteration (a caller could still update what they leave)."""
    analysis = _Updates()
    ends = flow.propagate(scope.flow, analysis)
    events = scope.flow.events
    scaled = {e.scaler for e in events if e.kind == flow.SCALED_BACKWARD}

    def report(event: Event, message: str, *others: Event) -> None:
        node = site(ctx, event)
        if id(node) not in findings or findings[id(node)][0] > len(hops(event)):
            switch = scaler_switch(ctx, event.scaler) if event.scaler else None
            related = (*evidence(ctx, event, _WHAT[event.kind] if node is not event.node else None),
                       *(r for o in others for r in evidence(ctx, o, _WHAT[o.kind])),
                       *(switch.related if switch else ()))
            findings[id(node)] = (len(hops(event)), node, message + through(ctx, event)
                                  + (f" ({switch.when})" if switch else ""), tuple(dict.fromkeys(related)))

    for scaler in sorted(scaled):
        steps = [e for e in events if e.kind == flow.SCALER_STEP and e.scaler == scaler]
        updates = [e for e in events if e.kind == flow.UPDATE and e.scaler == scaler]
        if outermost and steps and not any(e in analysis.followed for e in steps):
            if updates:
                report(updates[0], f"`{scaler}.update()` runs before `{scaler}.step(...)` "
                                   f"({place(ctx, steps[-1], hops(updates[0]))}): update once, after every step",
                       steps[-1])
            else:
                report(steps[-1], f"`{scaler}.step(...)` is never followed by `{scaler}.update()`: "
                                  "the loss scale never adapts")
    for update in sorted(analysis.twice, key=lambda e: order(ctx, e)):
        first = min(analysis.twice[update], key=lambda e: order(ctx, e))
        report(update, f"`{update.scaler}.update()` is called more than once per iteration (also on "
                       f"{place(ctx, first, hops(update))}): step every optimizer, then update once", first)
    for step in sorted(analysis.stepped_again, key=lambda e: order(ctx, e)):
        if step.scaler in scaled and not scope.hides(step.scaler):
            first = min(analysis.stepped_again[step], key=lambda e: order(ctx, e))
            report(step, f"`{step.scaler}.step({step.optimizer})` again before `{step.scaler}.update()` (first on "
                         f"{place(ctx, first, hops(step))}): it raises at runtime; step each optimizer once, "
                         "then update", first)
    for update in sorted(analysis.unchecked - analysis.checked, key=lambda e: order(ctx, e)):
        if update.scaler in scaled and not scope.hides(update.scaler):
            report(update, f"`{update.scaler}.update()` with no `{update.scaler}.step(...)` since the last "
                           "update on any path: it raises (no inf checks recorded); update after the step")
    for update, loop, step in _per_optimizer_updates(ctx, scope, scaled):
        backward = next(e for e in events if e.kind == flow.SCALED_BACKWARD and e.scaler == update.scaler)
        report(update, f"`{update.scaler}.update()` runs once per optimizer: each iteration of the loop on "
                       f"{place(ctx, loop, hops(update))} steps one (`{step.scaler}.step({step.optimizer})`) and "
                       f"updates, after one scaled backward ({place(ctx, backward, hops(update))}); step every "
                       "optimizer, then update once after the loop", loop, backward)
    if outermost:
        for ret, left, update in _updates_returned_past(ctx, scope, analysis, ends):
            call = f"{left.scaler}.{'step' if left.kind == flow.SCALER_STEP else 'unscale_'}({left.optimizer})"
            report(ret, f"`return` leaves `{call}` ({place(ctx, left, hops(ret))}) without the "
                        f"`{left.scaler}.update()` after it ({place(ctx, update, hops(ret))}): the next `{call}` "
                        "raises and the loss scale stops adapting; update before returning (or in a `finally:`)",
                   left, update)


_WHAT = {flow.SCALER_STEP: "the scaler's step", flow.UPDATE: "the scaler's update", flow.UNSCALE: "the unscale",
         flow.SCALED_BACKWARD: "the scaled backward", "loop": "the loop over the optimizers", RETURN: "the return"}


def _per_optimizer_updates(ctx: AstContext, scope: MethodFlow, scaled: set[str]
                           ) -> Iterator[tuple[Event, Event, Event]]:
    """(update, loop, step) for a loop with no backward of its own that steps a different
    optimizer each iteration and updates every iteration: one update per optimizer. The loop
    is given as an event at its ``for``."""
    for loop, leading in scope.loops():
        inside = [e for e in flow.items(loop.body) if isinstance(e, Event)]
        if not isinstance(loop.node, (ast.For, ast.AsyncFor)) \
                or any(e.kind in (flow.BACKWARD, flow.SCALED_BACKWARD) for e in inside):
            continue
        steps = [e for e in inside if e.kind == flow.SCALER_STEP and e.scaler in scaled
                 and e.optimizer is not None and flow.mentions(e.optimizer, loop.assigned)]
        for update in scope.every_iteration(loop, flow.UPDATE):
            step = next((s for s in steps if s.scaler == update.scaler and order(ctx, s) < order(ctx, update)), None)
            if step is not None and not scope.hides(update.scaler):
                yield update, Reached("loop", loop.node, hops=leading) if leading else Event("loop", loop.node), step


def _updates_returned_past(ctx: AstContext, scope: MethodFlow, analysis: "_Updates", ends: set
                           ) -> Iterator[tuple[Event, Event, Event]]:
    """(return, step or unscale, update) for a return that leaves the step or unscale of an
    optimizer of the function's own (not one its caller passes, which may be another one next
    time) without the update that comes after the return in its function, on a path that
    reaches the end without any other."""
    params = scope.parameters()
    left_at: dict[Event, set[Event]] = {}
    for fact in ends:
        for ret, left in fact.skipped:
            left_at.setdefault(ret, set()).add(left)
    for ret in sorted(left_at, key=lambda e: order(ctx, e)):
        left = max(left_at[ret], key=lambda e: order(ctx, e))
        skipped = sorted((u for u in analysis.checked if u.scaler == left.scaler and order(ctx, u) > order(ctx, ret)
                          and hops(u)[:len(hops(ret))] == hops(ret)), key=lambda e: order(ctx, e))
        if skipped and left.optimizer is not None and not flow.mentions(left.optimizer, params) \
                and not scope.hides(left.scaler):
            yield ret, left, skipped[0]


@dataclass(frozen=True)
class _Pending:
    steps: frozenset[Event] = frozenset()  # scaler steps no update has followed yet
    updates: frozenset[Event] = frozenset()  # updates since their scaler's last scaled backward
    stepped: frozenset[Event] = frozenset()  # steps since then, followed or not
    # Scalers that stepped or unscaled since their last update (both record the inf checks
    # update() reads); None once a plain optimizer.step() ran (AMP005 reports that one).
    checked: frozenset[str | None] = frozenset()
    recorded: frozenset[Event] = frozenset()  # the steps and unscales since their scaler's last update
    skipped: frozenset[tuple[Event, Event]] = frozenset()  # (a return, one of those it left)


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
            return replace(fact, checked=fact.checked | {event.scaler}, recorded=fact.recorded | {event})
        if event.kind == flow.STEP:
            return replace(fact, checked=fact.checked | {None})
        if event.kind == RETURN:
            return replace(fact, skipped=fact.skipped | {(event, r) for r in fact.recorded})
        if event.kind == flow.SCALER_STEP:
            again = {s for s in fact.steps if s.scaler == event.scaler and s.optimizer == event.optimizer}
            if again and event.optimizer is not None:
                self.stepped_again.setdefault(event, set()).update(again)
            new_round = any(s.scaler == event.scaler and s.optimizer == event.optimizer
                            for s in fact.steps | fact.stepped)
            fact = replace(fact, steps=fact.steps | {event}, checked=fact.checked | {event.scaler},
                           recorded=fact.recorded | {event})
            if new_round:
                # the same optimizer stepped again: a new round (a last partial accumulation
                # after the loop), whose update is not a second one
                return replace(fact, updates=frozenset(u for u in fact.updates if u.scaler != event.scaler),
                               stepped=frozenset({event}))
            return replace(fact, stepped=fact.stepped | {event})
        if event.kind == flow.UPDATE:
            mine = {s for s in fact.steps if s.scaler == event.scaler}
            self.followed.update(mine)
            earlier = {u for u in fact.updates if u.scaler == event.scaler}
            if earlier:
                self.twice.setdefault(event, set()).update(earlier)
            (self.checked if fact.checked & {event.scaler, None} else self.unchecked).add(event)
            return replace(fact, steps=fact.steps - mine, updates=fact.updates | {event},
                           checked=fact.checked - {event.scaler, None},
                           recorded=frozenset(r for r in fact.recorded if r.scaler != event.scaler),
                           skipped=frozenset(p for p in fact.skipped if p[1].scaler != event.scaler))
        return fact
