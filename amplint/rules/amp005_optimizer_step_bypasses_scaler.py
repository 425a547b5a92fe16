from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.diagnostics import Edit, Fix
from ..engine.flow import Event, Flow, line_of
from ..engine.rule import Invalid, Rule, Valid


class OptimizerStepBypassesScaler(Rule):
    """
    ## What it does
    Finds `optimizer.step()` called directly where some path reaches it after
    `S.scale(loss).backward()` in the same function. Paths follow `if`s by their conditions
    (the same condition twice takes the same branch) and exits: `if use_amp:
    scaler.step(opt); return` before a plain `optimizer.step()` is fine.

    ## Why is this bad?
    The gradients are still multiplied by the loss scale, so the update is tens of thousands of
    times too large, and steps with inf/NaN gradients are applied instead of skipped.
    `S.step(optimizer)` unscales first and skips bad steps.

    ## Example
    ```python
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
    ```

    ## Fix
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    Safe when the function has no `S.step(...)` at all (the direct step is the only step). When
    no `S.update()` follows the step on any path, the fix adds one after it (a step without an
    update is AMP006's finding); when one follows on some paths only, there is no fix. When the
    function already calls `S.step(...)` too, the direct call is a second step: reported without
    a fix.

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    The optimizer is recognised by name (`optimizer`, `optim`, `opt`, `opt_*`, `*_opt`), so a
    step on something else named like an optimizer would be reported; schedulers are excluded.
    """

    code = "AMP005"
    preview = True  # triaged precision below 0.9: docs/triage.md
    name = "optimizer-step-bypasses-scaler"
    summary = "optimizer.step() after a scaled backward, bypassing the GradScaler"
    fixable = True
    fragments = (r"\.scale\(",)

    valid = (
        Valid("""
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
scheduler.step()
"""),
        Valid("""
if scaler is not None:
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
else:
    loss.backward()
    optimizer.step()
"""),
        Valid("""
def step(scaler, loss, optimizer):
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
"""),
        # The scaled path returns before the direct step.
        Valid("""
def step(self, loss):
    if self.use_amp:
        self.scaler.scale(loss).backward()
    else:
        loss.backward()
    if self.use_amp:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return
    self.optimizer.step()
"""),
        # `not use_amp` and `use_amp is False`-style spellings are the same atom, negated.
        Valid("""
def step(scaler, loss, optimizer):
    if scaler is None:
        loss.backward()
        optimizer.step()
    elif not scaler is None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""),
    )
    invalid = (
        Invalid("""
def train_step(model, batch, optimizer, scaler):
    loss = model(batch).mean()
    scaler.scale(loss).backward()
    optimizer.step()
    scaler.update()
""", fixed="""
def train_step(model, batch, optimizer, scaler):
    loss = model(batch).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((5, 5, '`optimizer.step()` after `scaler.scale(...).backward()` (line 4) step'),)),
        # No update anywhere after: the fix adds one.
        Invalid("""
def train_step(model, batch, optimizer, scaler):
    scaler.scale(model(batch).mean()).backward()
    optimizer.step()
    optimizer.zero_grad()
""", fixed="""
def train_step(model, batch, optimizer, scaler):
    scaler.scale(model(batch).mean()).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
""", at=((4, 5, 'steps on scaled gradients: use `scaler.step(optimizer)`'),)),
        # An update on one path only: no fix.
        Invalid("""
def train_step(model, batch, optimizer, scaler, last):
    scaler.scale(model(batch).mean()).backward()
    optimizer.step()
    if last:
        scaler.update()
""", at=((4, 5, 'steps on scaled gradients'),)),
        Invalid("""
self.scaler.scale(loss).backward()
self.scaler.step(self.optimizer)
self.optimizer.step()
self.scaler.update()
""", at=((4, 1, '`self.optimizer.step()` after `self.scaler.scale(...).backwa'),)),
    )

    def check(self, ctx: AstContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.STEP) and scope.of(flow.SCALED_BACKWARD):
                self._check_flow(ctx, scope)

    def _check_flow(self, ctx: AstContext, scope: Flow) -> None:
        analysis = _DirectSteps()
        for fact in flow.propagate(scope, analysis):
            analysis.unfollowed.update(fact.awaiting)
        for step in sorted(analysis.found, key=lambda e: ctx.order(e.node)):
            backward = max(analysis.found[step], key=lambda e: ctx.order(e.node))
            scaler, optimizer = backward.scaler, _receiver(ctx, step.node)
            fix = None
            if not scope.of(flow.SCALER_STEP) and step not in analysis.unfollowed:
                fix = Fix(f"Use `{scaler}.step({optimizer})`",
                          (ctx.replace(step.node, f"{scaler}.step({optimizer})"),))
            elif not scope.of(flow.SCALER_STEP) and step not in analysis.followed:
                fix = _fix_with_update(ctx, step.node, scaler, optimizer)
            ctx.report(step.node, f"`{optimizer}.step()` after `{scaler}.scale(...).backward()` (line "
                                  f"{line_of(ctx, backward.node)}) steps on scaled gradients: use "
                                  f"`{scaler}.step({optimizer})`", fix)


def _receiver(ctx: AstContext, call: ast.Call) -> str:
    """What ``call``'s method is called on (``opt`` of ``opt.step()``), as written: with the
    parentheses around it, which its own node leaves out."""
    func = ctx.code(call.func)
    return func[:func.rindex(".")].rstrip()


def _fix_with_update(ctx: AstContext, call: ast.Call, scaler: str, optimizer: str) -> Fix | None:
    """``S.step(opt)`` and, on a line of its own after it, the ``S.update()`` that no path had:
    where the call is an expression statement alone on its lines (not after a ``;`` or a
    block's ``:``), at that statement's indentation."""
    statement = ctx.parent(call)
    if not isinstance(statement, ast.Expr):
        return None
    start, end = ctx.offsets(statement)
    line_start = ctx.offset(statement.lineno, 0)
    line_end = ctx.offset(statement.end_lineno + 1, 0)
    indentation, rest = ctx.source[line_start:start], ctx.source[end:line_end]
    after = rest.lstrip(" \t")
    if after.startswith(";"):  # its `;` goes, with the blanks before it, and after it unless a comment follows
        rest = after[1:] if after[1:].strip() else after[1:].lstrip(" \t")
    if indentation.strip(" \t") or rest.strip()[:1] not in ("", "#"):
        return None
    newline = rest[len(rest.rstrip("\r\n")):]
    if not newline:  # the file's last line, without a line break
        first_break = re.search(r"\r\n?|\n", ctx.source)
        rest += first_break.group() if first_break else "\n"
    update = f"{indentation}{scaler}.update(){newline}"
    return Fix(f"Use `{scaler}.step({optimizer})` and `{scaler}.update()`",
               (Edit(start, line_end, f"{scaler}.step({optimizer}){rest}{update}"),))


@dataclass(frozen=True)
class _Steps:
    scaled: frozenset[Event] = frozenset()  # scaled backwards on this path
    awaiting: frozenset[Event] = frozenset()  # direct steps no scaler update has followed yet


class _DirectSteps(flow.Analysis):
    """Direct ``opt.step()`` calls some path reaches after a scaled backward, and whether a
    scaler's ``update()`` follows them on every path, on none, or on some."""

    def __init__(self):
        self.found: dict[Event, set[Event]] = {}  # direct step -> the scaled backwards before it
        self.followed: set[Event] = set()
        self.unfollowed: set[Event] = set()

    def start(self) -> _Steps:
        return _Steps()

    def event(self, fact: _Steps, event: Event) -> _Steps:
        if event.kind == flow.SCALED_BACKWARD:
            return replace(fact, scaled=frozenset(b for b in fact.scaled if b.scaler != event.scaler) | {event})
        if event.kind == flow.STEP and fact.scaled:
            self.found.setdefault(event, set()).update(fact.scaled)
            return replace(fact, awaiting=fact.awaiting | {event})
        if event.kind == flow.UPDATE:
            self.followed.update(fact.awaiting)
            return replace(fact, awaiting=frozenset())
        return fact
