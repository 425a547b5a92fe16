from __future__ import annotations

from dataclasses import dataclass

from ..engine import flow
from ..engine.context import FileContext
from ..engine.flow import Event, Flow, line_of
from ..engine.rule import Invalid, Rule, Valid


class ScalerStepWithoutUpdate(Rule):
    """
    ## What it does
    In a function that runs a whole scaled iteration (`S.scale(loss).backward()` and
    `S.step(...)`), finds: `S.step(...)` calls no path follows with `S.update()`; a
    `S.update()` that comes only before the steps; and `S.update()` reached a second time on
    one path between scaled backwards (with several optimizers, step each one, then update
    once).

    ## Why is this bad?
    `update()` is what adapts the loss scale: without it the scale never grows back after an
    overflow and never shrinks, so steps keep being skipped or gradients keep underflowing.
    Updating before stepping uses the wrong iteration's overflow record, and updating twice
    per iteration halves/grows the scale twice and loses the other optimizers' inf checks.

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
    Only functions that contain both the scaled backward and the step are checked, so a
    `step()` helper whose caller updates is not reported. Paths follow `if`s by their
    conditions and exits, so updates in different branches (or under the same condition as
    their step) count as one.
    """

    code = "AMP006"
    name = "scaler-step-without-update"
    summary = "GradScaler step without exactly one update after it"
    fragments = (r"\.scale\(",)
    may_fire = staticmethod(lambda outline: flow.may_have_together(outline, flow.SCALED_BACKWARD, flow.SCALER_STEP))

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
    )

    def check(self, ctx: FileContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALED_BACKWARD) and scope.of(flow.SCALER_STEP):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: FileContext, scope: Flow) -> None:
        analysis = _Updates()
        flow.propagate(scope, analysis)
        scaled = {e.scaler for e in scope.of(flow.SCALED_BACKWARD)}
        for scaler in sorted(scaled):
            steps = [e for e in scope.of(flow.SCALER_STEP) if e.scaler == scaler]
            updates = [e for e in scope.of(flow.UPDATE) if e.scaler == scaler]
            if steps and not any(e in analysis.followed for e in steps):
                last = steps[-1]
                if updates:
                    ctx.report(updates[0].node, f"`{scaler}.update()` runs before `{scaler}.step(...)` (line "
                                                f"{line_of(ctx, last.node)}): update once, after every step")
                else:
                    ctx.report(last.node, f"`{scaler}.step(...)` is never followed by `{scaler}.update()`: "
                                          "the loss scale never adapts")
        for update in sorted(analysis.twice, key=lambda e: ctx.order(e.node)):
            first = min(analysis.twice[update], key=lambda e: ctx.order(e.node))
            ctx.report(update.node, f"`{update.scaler}.update()` is called more than once per iteration (also "
                                    f"on line {line_of(ctx, first.node)}): step every optimizer, then update once")


@dataclass(frozen=True)
class _Pending:
    steps: frozenset[Event] = frozenset()  # scaler steps no update has followed yet
    updates: frozenset[Event] = frozenset()  # updates since their scaler's last scaled backward
    stepped: frozenset[Event] = frozenset()  # steps since then, followed or not


class _Updates(flow.Analysis):
    """Which scaler steps some path follows with an update, and updates a path reaches twice
    between scaled backwards."""

    def __init__(self):
        self.followed: set[Event] = set()
        self.twice: dict[Event, set[Event]] = {}  # update -> the earlier updates on its paths

    def start(self) -> _Pending:
        return _Pending()

    def event(self, fact: _Pending, event: Event) -> _Pending:
        if event.kind == flow.SCALED_BACKWARD:
            return _Pending(fact.steps, frozenset(u for u in fact.updates if u.scaler != event.scaler),
                            frozenset(s for s in fact.stepped if s.scaler != event.scaler))
        if event.kind == flow.SCALER_STEP:
            if any(s.scaler == event.scaler and s.optimizer == event.optimizer for s in fact.steps | fact.stepped):
                # the same optimizer stepped again: a new round (a last partial accumulation
                # after the loop), whose update is not a second one
                return _Pending(fact.steps | {event}, frozenset(u for u in fact.updates if u.scaler != event.scaler),
                                frozenset({event}))
            return _Pending(fact.steps | {event}, fact.updates, fact.stepped | {event})
        if event.kind == flow.UPDATE:
            mine = {s for s in fact.steps if s.scaler == event.scaler}
            self.followed.update(mine)
            earlier = {u for u in fact.updates if u.scaler == event.scaler}
            if earlier:
                self.twice.setdefault(event, set()).update(earlier)
            return _Pending(fact.steps - mine, fact.updates | {event}, fact.stepped)
        return fact
