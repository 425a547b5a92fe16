from __future__ import annotations

import ast

from ..engine import flow
from ..engine.context import FileContext
from ..engine.enabling import scaler_switch
from ..engine.flow import Event, Flow, line_of
from ..engine.outline import Outline
from ..engine.rule import AnyOf, Invalid, Rule, Valid

# Nodes whose fields hold blocks of statements, and those fields.
_BLOCK_FIELDS = ("body", "orelse", "finalbody")
_COMPOUND = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor, ast.While,
             ast.If, ast.With, ast.AsyncWith, ast.Try, ast.ExceptHandler, ast.match_case)


def _step_of(statement: ast.stmt, scaler: ast.expr) -> bool:
    """``S.step(...)`` as the whole of an expression statement or of an assignment's value,
    with ``S`` written as ``scaler`` is; an assignment only where ``scaler`` is no plain name
    (rebinding a name may change what another name stands for)."""
    if isinstance(statement, ast.Expr):
        value = statement.value
    elif isinstance(statement, (ast.Assign, ast.AnnAssign)) and not isinstance(scaler, ast.Name):
        value = statement.value
    else:
        return False
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "step" \
        and ast.unparse(value.func.value) == ast.unparse(scaler)


def _updates_after_their_step(outline: Outline) -> set[int]:
    """ids of the ``S.update()`` statements that every path reaches right after ``S.step(...)``:
    a statement earlier in the same block steps the same scaler, and only expression statements
    (which bind nothing) run between. Blocks are entered only at their start, so no path
    reaches such an update without the step."""
    found = set()
    for kind in _COMPOUND:
        for node in outline.nodes(kind):
            for field in _BLOCK_FIELDS:
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for j, statement in enumerate(block):
                    value = statement.value if isinstance(statement, ast.Expr) else None
                    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                            and value.func.attr == "update"):
                        continue
                    k = j - 1
                    while k >= 0 and isinstance(block[k], ast.Expr) and not _step_of(block[k], value.func.value):
                        k -= 1
                    if k >= 0 and _step_of(block[k], value.func.value):
                        found.add(id(value))
    return found


def _may_fire(outline: Outline) -> bool:
    """A function (or the module's code) that may step a scaler and update one, with an update
    some path may reach without a step: not one right after its scaler's step
    (``_updates_after_their_step``)."""
    events = flow.events_on_ast(outline)
    candidates = [call for call, kind in flow.event_calls(outline).items() if kind == flow.UPDATE
                  and flow.SCALER_STEP in events[outline.scopes[call]]]
    if not candidates:
        return False
    stepped = _updates_after_their_step(outline)
    return any(call not in stepped for call in candidates)


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
    may_fire = staticmethod(_may_fire)

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

    def check(self, ctx: FileContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALER_STEP) and scope.of(flow.UPDATE):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: FileContext, scope: Flow) -> None:
        analysis = _IterationSteps()
        flow.propagate(scope, analysis)
        for update in scope.of(flow.UPDATE):
            if update not in analysis.with_step or update not in analysis.without_step:
                continue
            steps = [e for e in scope.of(flow.SCALER_STEP) if e.scaler == update.scaler]
            if not steps:
                continue
            step = min(steps, key=lambda e: abs(ctx.order(e.node) - ctx.order(update.node)))
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
