from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.enabling import scaler_switch
from ..engine.crossfile import located, project_function
from ..engine.diagnostics import Fix, Related
from ..engine.flow import Event, Flow, line_of
from ..engine.gradient_hooks import CLAMP_WORDS, called_name, calls_in, clamping, hook_clamp, registered_clamp
from ..engine.outline import named_parameters
from ..engine.regions import called_function
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import GRAD_SCALER, SCALER_PARAMETERS, scaled_backward_scaler
from ..engine.statement_edits import insert_before

# Tensor methods and torch functions that clamp: a helper named like one of them is not a
# helper that registers clamping hooks.
_TENSOR_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_max", "clamp_min_",
                            "clamp_max_"})


class ClipGradWithoutUnscale(Rule):
    """
    ## What it does
    Finds gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`, any
    spelling or alias, or a function or (base class's) method whose body clips, never unscaling)
    that some path reaches after `S.scale(loss).backward()` with no `S.unscale_(optimizer)`
    since, in the same function. Paths follow `if`s by their conditions (`if scaler is not
    None:` twice takes the same branch both times), `return`, `continue`, `break`, loops
    and `try`.

    A function that computes no gradients itself (the backward is its caller's) and clips
    before `S.step(optimizer)` with no `S.unscale_` on the way is reported too.

    So are gradient hooks that clamp (`p.register_hook(lambda g: g.clamp(-c, c))`, also
    `register_post_accumulate_grad_hook` and module backward hooks; a hook that calls anything
    named like a clamp or clip and reads no loss scale) registered in code that trains with a
    GradScaler (its class, else its module, creates one or scales a backward with one, or its
    function takes a `scaler`): where they are registered, or where a helper that registers
    them is called (a function of the file, or a module-level function of another file of the
    project named like a clip or clamp, whose file and line the message names).

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

    Hooks run inside the backward pass, before any `unscale_` can: they clamp scale ×
    gradient, and an overflow clamped to a finite value hides the inf the scaler looks for.

    ## Fix safety
    Safe: `scaler.step` skips unscaling an optimizer that was already unscaled, so the step
    is unchanged and the clip sees true gradients. Clamping hooks get no fix: the clip must
    move after `unscale_`. The optimizer is the one argument of the
    `S.step(...)` that follows the clip; when several optimizers are stepped (which ones does
    the clip cover?) or there is no such step, there is no fix. Nor is there when another path
    reaches the clip already unscaled: a second `unscale_` there would raise.

    ## False positives
    A clipping function of another file, or one reached through another object, is not seen (a
    miss, not a false alarm); of hooks registered in another file, only a module-level
    function named like a clip or clamp (`enable_gradient_clipping`) is read, not what it
    calls in turn. A GradScaler created with `enabled=False` still counts. Library wrappers that unscale for you (`accelerator.clip_grad_norm_`,
    Lightning) are not the torch functions and are not reported. A function that clips and
    steps gradients whose caller already unscaled them would be reported.
    """

    code = "AMP002"
    name = "clip-grad-without-unscale"
    summary = "Gradient clipping on scaled gradients (no scaler.unscale_ first)"
    fixable = True
    # A scaler (a scaled backward, a GradScaler, a parameter named like one) and a clip.
    fragments = ((AnyOf(*CLAMP_WORDS), AnyOf(r"\.scale\(", "scaler", "Scaler", r"\.unscale_\(")),)  # the rarer first

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
        # Gradient hooks that only record, beside a GradScaler; hooks that clamp, in a project
        # whose training has no GradScaler.
        Valid("""
import torch
class Trainer:
    def __init__(self, model):
        self.scaler = torch.amp.GradScaler("cuda")
        self.norms = []
        for p in model.parameters():
            p.register_hook(lambda grad: self.norms.append(grad.norm()))
"""),
        Valid("""
from utils import enable_gradient_clamping
def train(model, optimizer, loader, bound):
    enable_gradient_clamping(model, bound)
    for x, y in loader:
        model(x, y).backward()
        optimizer.step()
""", project=(("utils.py", """
def enable_gradient_clamping(model, bound):
    for p in model.parameters():
        if p.requires_grad:
            p.register_hook(lambda grad: grad.clamp(-bound, bound))
"""),)),
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
        # Gradient hooks that clamp run inside the scaled backward: no unscale_ can come first.
        Invalid("""
import torch
class Trainer:
    def __init__(self, model, clip):
        self.model = model
        self.scaler = torch.amp.GradScaler("cuda")
        for p in model.parameters():
            p.register_hook(lambda grad: grad.clamp(-clip, clip))
""", at=((8, 13, "gradient hooks registered here clamp the gradients (`grad.clamp` on line 8) during the "
                 "backward pass, while the GradScaler (`self.scaler`, line 6) still scales them"),)),
        # Registered by a method of a class that creates a GradScaler: reported once, there.
        Invalid("""
import torch
class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = torch.amp.GradScaler("cuda")
        self._hook_gradients(1.0)

    def _hook_gradients(self, bound):
        for p in self.model.parameters():
            p.register_hook(lambda grad: torch.clamp(grad, -bound, bound))
""", at=((11, 13, "gradient hooks registered here clamp the gradients (`torch.clamp` on line 11)"),)),
        # ... also registered by a method of the class, whose hook is a function.
        Invalid("""
import torch
class Trainer:
    def __init__(self, model, scaler):
        self.model, self.scaler = model, scaler
        self._hook_gradients(1.0)

    def _hook_gradients(self, bound):
        def clamp(grad):
            return grad.clamp_(-bound, bound)
        for p in self.model.parameters():
            p.register_post_accumulate_grad_hook(clamp)
""", at=((6, 9, "`self._hook_gradients` registers gradient hooks that clamp the gradients (`grad.clamp_` on "
                "line 10) during the backward pass, while the GradScaler (`scaler`, line 4)"),)),
        # A method of a base class in another file clips.
        Invalid("""
from base import BaseTrainer
class AmpTrainer(BaseTrainer):
    def step(self, loss):
        self.scaler.scale(loss).backward()
        self.clip()
        self.scaler.step(self.optimizer)
""", fixed="""
from base import BaseTrainer
class AmpTrainer(BaseTrainer):
    def step(self, loss):
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        self.clip()
        self.scaler.step(self.optimizer)
""", at=((6, 9, "(`self.clip` clips them at base.py:5)"),), project=(("base.py", """
import torch
class BaseTrainer:
    def clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
"""),)),
        # ... also registered by a helper in another file of the project.
        Invalid("""
import torch
from utils import enable_gradient_clamping
def train(model, optimizer, loader, bound, scaler):
    enable_gradient_clamping(model, bound)
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
""", at=((5, 5, "`enable_gradient_clamping` registers gradient hooks that clamp the gradients (`grad.clamp`, "
                "utils.py:5) during the backward pass, while the GradScaler (`scaler`, line 4)"),),
            project=(("utils.py", """
def enable_gradient_clamping(model, bound):
    for p in model.parameters():
        if p.requires_grad:
            p.register_hook(lambda grad: grad.clamp(-bound, bound))
"""),)),
    )

    def check(self, ctx: AstContext) -> None:
        for scope in flow.flows(ctx):
            if scope.of(flow.CLIP) and scope.of(flow.SCALED_BACKWARD, flow.SCALER_STEP):
                self._check_flow(ctx, scope)
        self._check_hooks(ctx)

    def _check_hooks(self, ctx: AstContext) -> None:
        """Gradient hooks that clamp, registered here or by a helper this code calls (of this
        file, or of another file of the project named like a clip or clamp), in code that
        trains with a GradScaler: they run inside the scaled backward, before any unscale_."""
        calls = sorted(ctx.outline.nodes(ast.Call), key=ctx.order)
        registered = {id(call): clamp for call in calls if (clamp := hook_clamp(ctx, call)) is not None}
        # Where they are registered, if a GradScaler trains there; else where a helper that
        # registers them is called (one finding for one mistake).
        reported = set()
        for call in calls:
            if id(call) in registered:
                clamp = registered[id(call)]
                if self._report_hooks(ctx, call, f"gradient hooks registered here clamp the gradients "
                                                  f"(`{ctx.code(clamp.func)}` on line {clamp.lineno})", ()):
                    reported.add(id(call))
        unreported = {k: v for k, v in registered.items() if k not in reported}
        for call in calls:
            if id(call) not in registered:
                found = self._helper_hooks(ctx, call, unreported)
                if found is not None:
                    self._report_hooks(ctx, call, *found)

    def _report_hooks(self, ctx: AstContext, call: ast.Call, how: str, related: tuple) -> bool:
        scaler = _scaler_here(ctx, call)
        if scaler is None:
            return False
        text, line = scaler
        ctx.report(call, f"{how} during the backward pass, while the GradScaler (`{text}`, line {line}) still "
                         "scales them: the bound applies to scale × gradient, and an overflow clamped to a finite "
                         f"value hides it from the scaler; clip after `{text}.unscale_(optimizer)` instead",
                   related=related)
        return True

    def _helper_hooks(self, ctx: AstContext, call: ast.Call, registered: dict[int, ast.Call]
                      ) -> tuple[str, tuple] | None:
        """For a call of a helper that registers clamping hooks (of this file: ``registered``,
        the clamp of each registration by its id): how the message says so, and the other
        file's line it names."""
        own = called_function(ctx, call) if registered else None
        if own is not None:
            for inner in calls_in(ctx, own):
                if id(inner) in registered:
                    clamp = registered[id(inner)]
                    return (f"`{ctx.code(call.func)}` registers gradient hooks that clamp the gradients "
                            f"(`{ctx.code(clamp.func)}` on line {clamp.lineno})"), ()
            return None
        name = called_name(call)
        if not clamping(name) or name in _TENSOR_CLAMPS:
            return None
        found = project_function(ctx, call)
        registration = registered_clamp(found[1]) if found is not None else None
        if registration is None:
            return None
        clamp = registration[1]
        where, related = located(ctx, found[0], clamp.lineno, "the hook clamps the gradients here")
        return (f"`{ctx.code(call.func)}` registers gradient hooks that clamp the gradients "
                f"(`{ast.unparse(clamp.func)}`, {where})"), (related,)

    def _check_flow(self, ctx: AstContext, scope: Flow) -> None:
        analysis = _ScaledClips()
        flow.propagate(scope, analysis)
        for clip, causes in sorted(analysis.found.items(), key=lambda f: ctx.order(f[0].node)):
            # the backward or step nearest the clip, whatever order the paths came in
            at = ctx.offsets(clip.node)[0]
            cause = min(causes, key=lambda e: abs(ctx.offsets(e.node)[0] - at))
            scaler = cause.scaler
            line = line_of(ctx, cause.node)
            if cause.kind == flow.SCALED_BACKWARD:
                where = f"`{scaler}.scale(...).backward()` on line {line}"
            else:
                where = f"`{ctx.code(cause.node)}` on line {line} steps them, and nothing unscales them before"
            helper, inside = self._helper(ctx, clip)
            later = [e for e in scope.events if ctx.order(e.node) > ctx.order(clip.node)]
            fix = None if clip in analysis.unscaled_before else self._fix(ctx, clip.node, scaler, later)
            switch = scaler_switch(ctx, scaler)
            when = f" ({switch.when})" if switch else ""
            ctx.report(clip.node, f"gradients are clipped while still scaled by `{scaler}`{when}{helper}: {where}; "
                                  f"call `{scaler}.unscale_(optimizer)` first", fix,
                       related=(*inside, *(switch.related if switch else ())))

    def _helper(self, ctx: AstContext, clip: Event) -> tuple[str, tuple[Related, ...]]:
        """The clip inside the helper a clip event calls, named (another file's, as a related place too)."""
        if clip.via is None:
            return "", ()
        where, inner = clip.via_module, clip.via
        if where is None:
            return f" (`{ctx.code(clip.node.func)}` clips them on line {line_of(ctx, inner)})", ()
        place, related = located(ctx, Path(where.path), line_of(where, inner),
                                 f"`{where.code(inner.func)}` clips the gradients, in `{ctx.code(clip.node.func)}`")
        return f" (`{ctx.code(clip.node.func)}` clips them at {place})", (related,)

    def _fix(self, ctx: AstContext, clip: ast.Call, scaler: str, later: list[Event]) -> Fix | None:
        steps = []
        for event in later:
            if event.kind in (flow.BACKWARD, flow.SCALED_BACKWARD):
                break
            if event.kind == flow.SCALER_STEP and event.scaler == scaler:
                steps.append(event)
        targets = {e.optimizer for e in steps}
        if len(targets) != 1 or None in targets or any(len(e.node.args) + len(e.node.keywords) != 1 for e in steps):
            return None
        optimizer = targets.pop()
        spelled = ctx.code(steps[0].node.args[0])  # as the step spells it, over lines as it does
        unscale = f"{scaler}.unscale_({spelled if spelled.split() == optimizer.split() else optimizer})"
        return Fix(f"Insert `{unscale}` before the clip", (insert_before(ctx, clip, unscale),))


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


def _scaler_here(ctx: AstContext, node: ast.AST) -> tuple[str, int] | None:
    """The GradScaler the code around ``node`` trains with, and its line: one its class (else
    its module) creates or scales a backward with, or a parameter of its function named like
    one."""
    function = ctx.enclosing_function(node)
    if function is not None:
        param = next((p for p in named_parameters(function.args) if p.arg in SCALER_PARAMETERS), None)
        if param is not None:
            return param.arg, param.lineno
    for call in calls_in(ctx, ctx.enclosing(node, ast.ClassDef) or ctx.outline.tree):
        scaled = scaled_backward_scaler(ctx, call)
        if scaled is not None:
            return scaled, call.lineno
        parent = ctx.parent(call)
        if ctx.resolves_to(call.func, GRAD_SCALER) and isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            return ctx.code(parent.targets[0]), call.lineno
    return None
