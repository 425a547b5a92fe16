from __future__ import annotations

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.flow import Event, Flow, line_of
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.enabling import scaler_switch


class GradAccumulationScalerUpdate(Rule):
    """
    ## What it does
    Finds `S.update()` that some path reaches in an iteration (of the loop around it, or a
    call of its function) that also ran `S.step(...)`, and some other path reaches without
    one: with gradient accumulation, `S.step(opt)` under `if (i + 1) % k == 0:` and
    `S.update()` outside that condition. An iteration that unscaled (`S.unscale_`) or stepped
    without the scaler (`optimizer.step()`) counts as one that stepped.

    ## Why is this bad?
    `update()` must follow a `step()` in the same iteration: called on the iterations that did
    not step, it adjusts the scale with no inf check recorded (it raises "No inf checks were
    recorded prior to update" on the first such iteration).

    ## Example
    ```python
    for i, batch in enumerate(loader):
        scaler.scale(loss_of(batch) / k).backward()
        if (i + 1) % k == 0:
            scaler.step(optimizer)
            optimizer.zero_grad()
        scaler.update()
    ```

    ## Fix
    ```python
        if (i + 1) % k == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    ```

    ## Fix safety
    No automatic fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    Paths follow `if`s by their conditions (`if use_amp:` around both the step and the update
    takes the same branch) and exits (`continue` at the accumulation boundary). A loop between
    the step and the update that itself updates is taken to start a new iteration.
    """

    code = "AMP017"
    name = "grad-accumulation-scaler-update"
    summary = "scaler.update() outside the gradient-accumulation condition of scaler.step()"
    # A scaler, and `.step` and `.update` calls.
    fragments = ((AnyOf("scaler", "Scaler", r"\.scale\("), r"\.\s*step\b", r"\.\s*update\b"),)

    valid = (
        Valid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""),
        # Accumulation steps leave the iteration early.
        Valid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k:
        continue
    scaler.step(optimizer)
    scaler.update()
"""),
        # Without the scaler the plain step runs; the update is then a no-op.
        Valid("""
def step(self, loss):
    self.scaler.scale(loss).backward()
    if self.scaler.is_enabled():
        self.scaler.step(self.optimizer)
    else:
        self.optimizer.step()
    self.scaler.update()
"""),
        # unscale_ records the inf checks update() needs; step and update under one condition.
        Valid("""
def step(self, loss, grad_norm_ok):
    self.scaler.scale(loss).backward()
    self.scaler.unscale_(self.optimizer)
    if grad_norm_ok:
        self.scaler.step(self.optimizer)
    self.scaler.update()
"""),
    )
    invalid = (
        Invalid("""
for i, batch in enumerate(loader):
    scaler.scale(model(batch).mean() / k).backward()
    if (i + 1) % k == 0:
        scaler.step(optimizer)
        optimizer.zero_grad()
    scaler.update()
""", at=((7, 5, '`scaler.update()` runs on every iteration but `scaler.step(...)` (line 5)'),)),
        # The same mistake in a function called once per micro-batch.
        Invalid("""
def train_step(self, loss, boundary):
    self.scaler.scale(loss).backward()
    if boundary:
        self.scaler.step(self.optimizer)
    self.scaler.update()
""", at=((6, 5, 'only on some: move the update under the step'),)),
    )

    def check(self, ctx: AstContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALER_STEP) and scope.of(flow.UPDATE):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: AstContext, scope: Flow) -> None:
        analysis = _IterationSteps()
        flow.propagate(scope, analysis)
        for update in scope.of(flow.UPDATE):
            if update not in analysis.with_step or update not in analysis.without_step:
                continue
            steps = [e for e in scope.of(flow.SCALER_STEP) if e.scaler == update.scaler]
            if not steps:
                continue
            # The message names the step nearest the update.
            at = ctx.offsets(update.node)[0]
            step = min(steps, key=lambda e: abs(ctx.offsets(e.node)[0] - at))
            switch = scaler_switch(ctx, update.scaler) if update.scaler else None
            ctx.report(update.node, f"`{update.scaler}.update()` runs on every iteration but "
                                    f"`{step.scaler}.step(...)` (line {line_of(ctx, step.node)}) only on some: "
                                    "move the update under the step's condition"
                                    + (f" ({switch.when})" if switch else ""), related=switch.related if switch else ())


class _IterationSteps(flow.Analysis):
    """Which updates some path reaches after a step in the same iteration (or call), and which
    some path reaches without one. The fact: the scalers that stepped or unscaled (both record
    the inf checks ``update()`` needs) in this iteration, and ``None`` once a plain
    ``optimizer.step()`` ran (an iteration without the scaler)."""

    def __init__(self):
        self.with_step: set[Event] = set()
        self.without_step: set[Event] = set()

    def start(self) -> frozenset:
        return frozenset()

    def loop_entry(self, fact: frozenset, loop: flow.Loop) -> frozenset:
        # Each iteration of a loop that updates starts afresh.
        return frozenset() if any(isinstance(e, Event) and e.kind == flow.UPDATE for e in flow.items(loop.body)) \
            else fact

    def event(self, fact: frozenset, event: Event) -> frozenset:
        if event.kind in (flow.SCALER_STEP, flow.UNSCALE):
            return fact | {event.scaler}
        if event.kind == flow.STEP:
            return fact | {None}
        if event.kind == flow.UPDATE:
            stepped = event.scaler in fact or None in fact
            (self.with_step if stepped else self.without_step).add(event)
        return fact
