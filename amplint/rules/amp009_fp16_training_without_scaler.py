from __future__ import annotations

import ast

from ..engine import flow, regions
from ..engine.ast_context import AstContext
from ..engine.checkpoints import argument_values, calls_in
from ..engine.diagnostics import Related
from ..engine.enabling import float16_choice, region_switch
from ..engine.flow import Event
from ..engine.outline import walk
from ..engine.region_tables import region_dtype
from ..engine.regions import (AutocastCall, autocast_calls, autocast_region, called_function, calls_of,
                              parameters_read, value_before)
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import scaled_backward_scaler
from ..engine.sharded_precision import POLICY_KEYWORDS, Float16Models
from ..engine.summaries import backward_tensor, is_backward, receiver


def _vector_jacobian(call: ast.Call) -> bool:
    """``out.backward(gradient=g)``: the gradient of a non-scalar output (a saliency map, an
    input gradient), not a loss trained with an optimizer; a loss scale has nothing to scale."""
    return any(k.arg == "gradient" for k in call.keywords)


class _TrainingPaths:
    """The unscaled backward pass a float16 region feeds, through the file's own functions
    (``regions.called_function``): in the region's function, in a function called inside the
    region, or in a caller that runs the backward of what the region's function returns. A
    function that touches a GradScaler (``flow.scalers``: calls ``.scale(...)``, uses or passes
    a scaler, or calls a function of the file that does) ends the search: it scales on some path."""

    def __init__(self, ctx: AstContext):
        self.ctx, self.scalers = ctx, flow.scalers(ctx)

    def scales(self, found: list[ast.Call]) -> bool:
        code, scalers = self.ctx.code, self.scalers
        return any((method := receiver(call)) is not None and (method[1] == "scale" or code(method[0]) in scalers)
                   or any(isinstance(a, (ast.Name, ast.Attribute)) and code(a) in scalers
                          for a in argument_values(call)) for call in found)

    def uses_scaler(self, func: ast.AST | None) -> bool:
        """``func`` touches a scaler itself or through a function of the file it calls
        (``if amp: self.backward_amp(loss) else: loss.backward()``)."""
        own = calls_in(self.ctx, func)
        return self.scales(own) or any(
            (callee := called_function(self.ctx, c)) is not None and self.scales(calls_in(self.ctx, callee))
            for c in own)

    def unscaled_backwards(self, func: ast.AST | None) -> list[ast.Call]:
        if self.uses_scaler(func):
            return []
        return [c for c in calls_in(self.ctx, func) if is_backward(self.ctx.outline, c)
                and scaled_backward_scaler(self.ctx, c) is None and not _vector_jacobian(c)]

    def unscaled_backward(self, ac: AutocastCall) -> ast.Call | None:
        func = self.ctx.enclosing_function(ac.node)
        if self.uses_scaler(func):
            return None
        own = self.unscaled_backwards(func)
        return own[0] if own else self._in_callees(ac, func) or self._in_callers(func)

    def _in_callees(self, ac: AutocastCall, func: ast.AST | None) -> ast.Call | None:
        holder = self.ctx.parent(ac.node)  # a `with` item, or a function it decorates
        decorated = isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef)) and ac.node in holder.decorator_list
        body = self.ctx.parent(holder).body if isinstance(holder, ast.withitem) else holder.body if decorated else None
        if body is None:
            return None
        start, end = (body[0].lineno, body[0].col_offset), (body[-1].end_lineno, body[-1].end_col_offset)
        frontier = [c for c in calls_in(self.ctx, func) if start <= (c.lineno, c.col_offset) < end]
        seen: set[int] = set()
        for _ in range(regions.REACHING_DEPTH):  # as deep as a region reaches a function
            reached = []
            for call in frontier:
                callee = called_function(self.ctx, call)
                if callee is None or id(callee) in seen or self.uses_scaler(callee):
                    continue
                seen.add(id(callee))
                backwards = self.unscaled_backwards(callee)
                if backwards:
                    return backwards[0]
                reached.append(callee)
            frontier = [c for f in reached for c in calls_in(self.ctx, f)]
        return None

    def _in_callers(self, func: ast.AST | None) -> ast.Call | None:
        """``loss = self.func(...)`` then ``loss.backward()`` in another function of the file."""
        for call in calls_of(self.ctx, func) if func is not None else ():
            assignment = self.ctx.parent(call)
            targets = assignment.targets if isinstance(assignment, ast.Assign) else []
            name = targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
            for backward in self.unscaled_backwards(self.ctx.enclosing_function(call)) if name else ():
                tensor = backward_tensor(backward)
                if isinstance(tensor, ast.Name) and tensor.id == name \
                        and self.ctx.order(backward) > self.ctx.order(call):
                    return backward
        return None


class _BesideScaled(flow.Analysis):
    """Unscaled backward passes some path runs in the same call as a scaled one, before or
    after it. The fact: whether a scaled backward ran, and the unscaled ones before any."""

    def __init__(self):
        self.beside: set[Event] = set()

    def start(self) -> tuple[bool, frozenset]:
        return False, frozenset()

    def event(self, fact: tuple[bool, frozenset], event: Event) -> tuple[bool, frozenset]:
        scaled, unscaled = fact
        if event.kind == flow.SCALED_BACKWARD:
            self.beside.update(unscaled)
            return True, frozenset()
        if event.kind == flow.BACKWARD and scaled:
            self.beside.add(event)
        elif event.kind == flow.BACKWARD:
            return False, unscaled | {event}
        return fact


class Fp16TrainingWithoutScaler(Rule):
    """
    ## What it does
    Finds a float16 autocast region — `dtype=torch.float16`, or no dtype on a device whose default
    is float16 per the policy tables (cuda, xpu, mps, mtia) — that feeds an unscaled backward pass
    (`loss.backward()`, `torch.autograd.backward(...)`): one in the region's function, one in a
    function of the file called inside the region (followed three calls deep), or `loss.backward()`
    in a function of the file that got `loss` from the region's function. A function on that path
    that touches a GradScaler (calls `.scale(...)`, uses a scaler built in the file or a parameter
    named `scaler`, `grad_scaler` or `amp_scaler`, or passes one on, or calls a function of the file
    that does) scales on some branch and ends the search. When the device is an expression and no
    dtype is given, the region is float16 only on a float16 device, so a GradScaler anywhere in the
    file silences it. A `dtype=` that a project function or property gives
    (`cfg.autocast_precision`, every `return` a literal dtype, one torch.float16) counts where the
    project makes no GradScaler: the finding says when it applies and points at that `return`. In a
    function that scales, it finds a plain `loss.backward()` that some path runs in the same call as
    a scaled backward (before or after it), of a `loss` last assigned in a float16 region with a
    literal device or dtype: one loss scaled, another not (`if scaler is not None: ... else:
    loss.backward()` runs one or the other, and is not reported there). Such a branch (an `else`, an
    `elif`, `if scaler is None: loss.backward(); return`) is reported when the scaler is a parameter
    that defaults to None (a library's `train_one_epoch(..., scaler=None)`, or a factory's
    `make_update(..., scaler=None)` whose returned step function reads it): called without one,
    the float16 region still runs and its loss backpropagates unscaled — unless the region's
    `enabled=` depends on the scaler (`enabled=scaler is not None`).

    It also finds an unscaled backward pass of a model that FSDP wraps with a float16 policy
    (`FullyShardedDataParallel(m, mixed_precision=MixedPrecision(param_dtype=torch.float16))`,
    `fully_shard(m, mp_policy=MixedPrecisionPolicy(param_dtype=torch.half))`): float16 with no
    autocast at all. The model is wrapped in the backward's function, its class, its module, or a
    function of the file that passes it on, directly or through a helper (of the file or of a
    project module it imports) that returns it or shards it in place; the backward's code runs
    it with gradients. The policy may come from a variable, a helper or another module; its
    `param_dtype` must be a literal float16 (or a name its function assigns one), a condition
    that picks it (`torch.float16 if args.fp16 else ...`) named as the finding's switch. The
    finding sits on the backward and names the policy, the wrap and the connecting calls.

    ## Why is this bad?
    float16 cannot represent gradients below about 6e-8 (or 6e-5 at full precision): small
    gradients flush to zero and the model silently stops learning in places. PyTorch's AMP
    recipe pairs float16 autocast with `torch.amp.GradScaler`, and FSDP's float16 parameters
    with `torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler` (FSDP2: `torch.amp.GradScaler`).
    bfloat16 does not need one.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Fix
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    or use `dtype=torch.bfloat16` where the hardware supports it.

    ## Fix safety
    No automatic fix: the scaler has to be threaded through the loop and its checkpoint.

    ## False positives
    Frameworks that scale for you call the backward with the loss as an argument
    (`accelerator.backward(loss)`, `engine.backward(loss)`), which does not count as a backward
    here. A region whose dtype is another expression is not judged. A backward given an explicit
    `gradient=` (a saliency map's `output.backward(gradient=one_hot)`, a vector-Jacobian product)
    is not a loss's: it is not reported. A loss written `loss.backward(gradient=torch.ones_like(loss))`
    is missed. An FSDP model reaches the backward only as the file shows it: one wrapped by the
    caller of a training function in another module is missed, and so is a `param_dtype` read
    from a config (`PrecisionType.to_dtype(cfg.dtype)`). A backward of a loss multiplied by
    hand (`(loss * loss_scale).backward()`) is taken as scaled.
    """

    code = "AMP009"
    name = "fp16-training-without-scaler"
    summary = "float16 autocast training with no GradScaler"
    uses_policy = True
    # Every finding is about a backward pass, in a file with a float16 autocast region or an
    # FSDP precision policy passed to a wrap (in the file, or anywhere in its project).
    fragments = ((AnyOf(r"\.backward\(", "autograd"), AnyOf("autocast", *POLICY_KEYWORDS)),)
    project_keywords_for = ("autocast", POLICY_KEYWORDS)

    valid = (
        # bfloat16 parameters need no scaler; the float16 policy is never handed to FSDP.
        Valid("""
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
from policies import FP16
def train(model, loader):
    model = FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    for x, y in loader:
        model(x, y).backward()
""", project=(("policies.py", "import torch\nfrom torch.distributed.fsdp import MixedPrecision\n"
                               "FP16 = MixedPrecision(torch.float16)\n"),)),
        # Without a scaler the region is off: float32 training.
        Valid("""
import torch
def train_one_epoch(model, loader, optimizer, scaler=None):
    for x, y in loader:
        with torch.autocast("cuda", enabled=scaler is not None):
            loss = model(x, y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
"""),
        # A saliency map: the gradient of a non-scalar output, nothing trained.
        Valid("""
import torch
def saliency(model, x, target):
    x.requires_grad = True
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
    one_hot = torch.zeros_like(out)
    one_hot[:, target] = 1
    out.backward(gradient=one_hot)
    return x.grad
"""),
        Valid("""
import torch
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda"):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""),
        Valid("""
import torch
def train_step(model, x, y, optimizer):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""),
        Valid("""
import torch
@torch.no_grad()
def predict(model, x):
    with torch.autocast("cuda"):
        return model(x)
"""),
        Valid("""
import torch
def train_step(accelerator, model, x, y):
    with torch.autocast("cuda"):
        loss = model(x, y)
    accelerator.backward(loss)
"""),
        # `**kwargs` may pass the dtype: an expression decides it.
        Valid("""
import torch
def train_step(model, x, y, optimizer, amp_kwargs):
    with torch.cuda.amp.autocast(**amp_kwargs):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""),
        # The unscaled backward is the branch without a scaler (bfloat16 or float32 runs).
        Valid("""
import torch
def train_step(self, x, y):
    scaler = getattr(self, "scaler", None)
    with torch.autocast("cuda", dtype=self.dtype):
        loss = self.model(x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
"""),
        # The unscaled backward is the branch where a helper of the file does not scale.
        Valid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")
    def train_step(self, x, y):
        with torch.autocast("cuda", enabled=self.amp):
            loss = self.model(x, y)
        if self.amp:
            self.backward_amp(loss)
        else:
            loss.backward()
    def backward_amp(self, loss):
        self.scaler.scale(loss).backward()
"""),
        # The region's callee scales.
        Valid("""
import torch
class Trainer:
    def train_step(self, x, y):
        with torch.autocast("cuda"):
            loss = self.model(x, y)
            self.backward(loss)
    def backward(self, loss):
        self.scaler.scale(loss).backward()
"""),
        # An expression device: float16 only on cuda, where the file's scaler is built.
        Valid("""
import torch
class Trainer:
    def __init__(self, device):
        self.device = device
        self.scaler = torch.amp.GradScaler(enabled=device.type == "cuda")
    def train_step(self, x, y):
        with torch.autocast(device_type=self.device.type):
            loss = self.model(x, y)
        loss.backward()
"""),
        # float16 when the scaler is given, and then scaled; without one the region is off.
        Valid("""
import torch
def train_step(model, x, y, optimizer, scaler=None):
    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
        loss = loss_fn(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
"""),
        # The unscaled loss beside the scaled one is computed in float32, outside the region.
        Valid("""
import torch
def train_step(model, critic, x, y, scaler):
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    critic_loss = critic(x.detach()).mean()
    critic_loss.backward()
"""),
    )
    invalid = (
        # FSDP2 in place, through a helper of another module, with its policy from a third.
        Invalid("""
from sharding import shard
def train(model, loader, optimizer, mesh):
    shard(model, mesh)
    for x, y in loader:
        loss = model(x).nll_loss(y)
        loss.backward()
        optimizer.step()
""", at=((7, 9, "FSDP computes in float16 here (`MixedPrecisionPolicy(param_dtype=torch.half)`, policies.py:3, "
                "handed to `fully_shard` at sharding.py:4, through `shard()` on line 4): no ShardedGradScaler "
                "scales `loss.backward()`"),),
            project=(("policies.py", "import torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy\n"
                                     "HALF = MixedPrecisionPolicy(param_dtype=torch.half)\n"),
                     ("sharding.py", "from torch.distributed.fsdp import fully_shard\nfrom policies import HALF\n"
                                     "def shard(module, mesh):\n"
                                     "    fully_shard(module, mesh=mesh, mp_policy=HALF)\n"))),
        # A step whose keyword-only scaler may be left out: then it returns before scaling.
        Invalid("""
import torch
def train_step(model, x, optimizer, *, scaler=None):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).mean()
    if scaler is None:
        loss.backward()
        return optimizer.step()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
""", at=((4, 10, "(`scaler` defaults to None, line 3): `loss.backward()` on line 7 then runs unscaled"),)),
        # A library's training step: the caller that passes no scaler trains float16 unscaled.
        Invalid("""
import torch
def train_one_epoch(model, loader, optimizer, scaler=None):
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
""", at=((5, 14, "float16 autocast when called without a scaler (`scaler` defaults to None, line 3): "
                 "`loss.backward()` on line 12 then runs unscaled"),)),
        Invalid("""
import torch
def train_step(model, x, y, optimizer):
    with torch.autocast(device_type="cuda"):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
""", at=((4, 10, 'float16 autocast with a backward pass but no GradScaler'),)),
        # The functional spelling, in a caller that got the loss from the region's function.
        Invalid("""
import torch
from torch import autograd, autocast
class Trainer:
    def fit(self, batches):
        for batch in batches:
            loss = self.forward_loss(batch)
            autograd.backward(loss)
            self.optimizer.step()
    def forward_loss(self, batch):
        with autocast("cuda", dtype=torch.float16):
            return self.criterion(self.model(batch.x), batch.y)
""", at=((11, 14, '`autograd.backward()` on line 8 runs unscaled'),)),
        Invalid("""
import torch
for x, y in loader:
    with torch.amp.autocast("cpu", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
""", at=((4, 10, 'float16 autocast with a backward pass but no GradScaler'),)),
        # The region calls a method that runs the backward; the class's scaler serves another path.
        Invalid("""
import torch
class CriticTrainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")
    def train_net(self, batches):
        for batch in batches:
            with torch.amp.autocast("cuda", enabled=self.mixed_precision):
                self.train_critic(batch)
    def train_critic(self, batch):
        loss = self.model(batch).mean()
        loss.backward()
        self.optimizer.step()
    def train_on_batch(self, batch):
        with torch.amp.autocast("cuda", enabled=self.mixed_precision):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
""", at=((8, 18, '`loss.backward()` on line 12 runs unscaled'),)),
        # The backward is in the caller, on the loss the region's method returns.
        Invalid("""
import torch
class Trainer:
    def train_one_epoch(self, loader):
        for sample in loader:
            loss = self.train_one_batch(sample)
            loss.backward()
            self.optimizer.step()
    def train_one_batch(self, sample):
        with torch.autocast(device_type=self.device.type):
            return self.loss_fn(self.model(sample["x"]), sample["y"])
""", at=((10, 14, '`loss.backward()` on line 7 runs unscaled'),)),
        # One loss of the region scaled, the other not.
        Invalid("""
import torch
def train_step(model, x, y, scaler, optimizer):
    with torch.autocast("cuda", dtype=torch.float16):
        loss_a = loss_fn(model(x), y)
        loss_b = aux_loss(model.head(x))
    scaler.scale(loss_a).backward()
    loss_b.backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((4, 10, '`loss_b.backward()` on line 8 runs unscaled beside the scaled backward on line 7'),)),
        # The generator's loss, in a second region, skips the scaler the discriminator's uses.
        Invalid("""
import torch
class GanTrainer:
    def train_step(self, real, noise):
        with torch.autocast("cuda"):
            loss_d = self.d_loss(real, noise)
        self.scaler.scale(loss_d).backward()
        self.scaler.step(self.opt_d)
        with torch.autocast("cuda"):
            loss_g = self.g_loss(noise)
        loss_g.backward()
        self.scaler.step(self.opt_g)
        self.scaler.update()
""", at=((9, 14, '`loss_g.backward()` on line 11 runs unscaled beside the scaled backward on line 7'),)),
    )

    def check(self, ctx: AstContext) -> None:
        regions = [ac for ac in autocast_calls(ctx) if ac.enabled is not False
                   and (region_dtype(ctx, ac) == "float16" or float16_choice(ctx, ac) is not None)]
        models = Float16Models(ctx)
        if not (fsdp := models.possible()) and not regions:
            return  # nothing of the file computes in float16
        paths = _TrainingPaths(ctx)
        file_has_scaler = bool(paths.scalers) or paths.scales(ctx.outline.nodes(ast.Call))
        reported, backwards = set(), set()  # ids of the autocast calls reported, and of the backward passes named
        for ac in regions:
            # float16 as the default of a device an expression names, or as one dtype a project
            # function gives: a scaler in the file (for the latter, in the project) may be its pair.
            chosen = ac.dtype is None and ac.dtype_given
            if file_has_scaler and ac.dtype is None and (ac.device is None or chosen) \
                    or chosen and ctx.project_mentions("GradScaler"):
                continue
            backward = paths.unscaled_backward(ac)
            if backward is not None:
                reported.add(id(ac.node))
                backwards.add(id(backward))
                switch = region_switch(ctx, ac, dtype=True)
                ctx.report(ac.node, f"float16 autocast{f' ({switch.when})' if switch else ''} with a backward "
                                    f"pass but no GradScaler: `{ctx.code(backward.func)}()` on line "
                                    f"{backward.lineno} runs unscaled, so small gradients underflow to zero; "
                                    "use torch.amp.GradScaler (or bfloat16)", related=switch.related if switch else ())
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALED_BACKWARD) and scope.of(flow.BACKWARD):
                self._check_beside_scaled(ctx, scope, reported)
            self._check_optional_scaler(ctx, scope, reported)
            function = None if isinstance(scope.scope, ast.Module) else scope.scope
            for backward in paths.unscaled_backwards(function) if fsdp else ():
                if id(backward) not in backwards:
                    self._check_float16_fsdp(ctx, models, backward)

    def _check_float16_fsdp(self, ctx: AstContext, models: Float16Models, backward: ast.Call) -> None:
        """An unscaled backward pass of a float16 FSDP model, not one scaled by hand (``(loss * k).backward()``)."""
        tensor = backward_tensor(backward)
        by_hand = isinstance(tensor, ast.BinOp) and isinstance(tensor.op, ast.Mult)
        model = None if by_hand else models.trained_by(backward)
        if model is not None:
            when = f" {model.switch.when}" if model.switch else ""
            ctx.report(backward, f"FSDP computes in float16 here{when} ({model.evidence()}): no "
                                 f"ShardedGradScaler scales `{ctx.code(backward.func)}()`, so small gradients "
                                 "underflow to zero; scale the loss with a ShardedGradScaler "
                                 "(torch.amp.GradScaler for `fully_shard`), or use a bfloat16 `param_dtype`",
                       related=model.related())

    def _check_optional_scaler(self, ctx: AstContext, scope: flow.Flow, reported: set[int]) -> None:
        """A training step whose scaler parameter defaults to None (a library's
        ``train_one_epoch(..., scaler=None)``) and that, on the paths where none was given (the
        flow's branches on it), backpropagates a float16 autocast loss unscaled: the region does
        not depend on it."""
        params = _none_by_default(ctx, scope.scope)
        for branch in flow.items(scope.block) if params else ():
            param = params.get(name := branch.atom.text) if isinstance(branch, flow.Branch) else None
            for event in flow.items(branch.orelse) if param is not None else ():
                if not isinstance(event, Event) or event.kind != flow.BACKWARD \
                        or scaled_backward_scaler(ctx, event.node) is not None:
                    continue
                ac = _float16_region_of_loss(ctx, event.node)
                if ac is None or id(ac.node) in reported or any(isinstance(n, ast.Name) and n.id == name
                                                                for a in argument_values(ac.node) for n in walk(a)):
                    continue  # `enabled=scaler is not None`: no region without one
                reported.add(id(ac.node))
                ctx.report(ac.node, f"float16 autocast when called without a scaler (`{name}` defaults to None, "
                                    f"line {param.lineno}): `{ctx.code(event.node.func)}()` on line "
                                    f"{event.node.lineno} then runs unscaled, so small gradients underflow to zero; "
                                    f"pass a GradScaler, or turn the region off without one (`enabled={name} is not "
                                    "None`)", related=(Related(ctx.path, param.lineno, f"`{name}` defaults to None"),))

    def _check_beside_scaled(self, ctx: AstContext, scope: flow.Flow, reported: set[int]) -> None:
        flow.propagate(scope, analysis := _BesideScaled())
        for event in sorted(analysis.beside, key=lambda e: ctx.order(e.node)):
            ac = _float16_region_of_loss(ctx, event.node)
            if ac is None or id(ac.node) in reported:
                continue
            reported.add(id(ac.node))
            at = ctx.offsets(event.node)[0]
            scaled = min(scope.of(flow.SCALED_BACKWARD), key=lambda e: abs(ctx.offsets(e.node)[0] - at))
            ctx.report(ac.node, f"float16 autocast whose loss skips the GradScaler: "
                                f"`{ctx.code(event.node.func)}()` on line {event.node.lineno} "
                                f"runs unscaled beside the scaled backward on line {scaled.node.lineno}, "
                                "so its small gradients underflow to zero; scale it too")


def _none_by_default(ctx: AstContext, function: ast.AST) -> dict[str, ast.arg]:
    """The parameters a function reads (its own, or a factory's around it) that default to
    None, by name."""
    return {name: arg for name, (arg, default) in parameters_read(ctx, function).items()
            if isinstance(default, ast.Constant) and default.value is None}


def _float16_region_of_loss(ctx: AstContext, call: ast.Call) -> AutocastCall | None:
    """The float16 region (with a literal device or dtype) where the tensor ``call``
    backpropagates was last assigned; None when it is not a name assigned in one."""
    tensor = backward_tensor(call)
    value = value_before(ctx, tensor) if isinstance(tensor, ast.Name) and not _vector_jacobian(call) else None
    region = autocast_region(ctx, value) if value is not None else None
    ac = region[0] if region is not None else None
    float16 = ac is not None and region_dtype(ctx, ac) == "float16"
    return ac if float16 and (ac.device is not None or ac.dtype is not None) else None
