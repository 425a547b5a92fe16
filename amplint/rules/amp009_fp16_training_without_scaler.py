from __future__ import annotations

import ast

import libcst as cst

from ..engine import flow
from ..engine.context import FileContext
from ..engine.diagnostics import Related
from ..engine.enabling import region_switch
from ..engine.flow import Event
from ..engine.outline import Outline
from ..engine.region_tables import region_dtype
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.sharded_precision import Float16Models, may_train_float16
from ..engine.semantics import (
    _SIGNATURES,
    AUTOCAST,
    AUTOCAST_DEVICE,
    DTYPES,
    AutocastCall,
    assigned_before,
    autocast_calls,
    autocast_region,
    calls,
    enabled_autocast_calls,
    enclosing_function,
    is_backward,
    known_scalers,
    method_call,
    scaled_backward_scaler,
    subtree,
)


def _may_be_judged(outline: Outline, call: ast.Call, file_scales: bool) -> bool:
    """Whether an enabled autocast call's region may be a float16 one ``check`` judges: no dtype
    given (the device's default decides) or a torch dtype that is float16; and, in a file
    that scales a loss (``S.scale(...)``), a literal device or dtype (a region both of whose
    are expressions may run in bfloat16 there, and is left alone). A dtype given as an
    expression (``dtype=self.amp_dtype``) leaves the region undecided: not judged."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True

    def argument(parameter: str, signature: tuple[str, ...]) -> ast.expr | None:
        position = signature.index(parameter)
        return next((k.value for k in call.keywords if k.arg == parameter),
                    call.args[position] if len(call.args) > position else None)

    for name in outline.qualified_names(call.func) & AUTOCAST:
        per_device = name in AUTOCAST_DEVICE
        signature = _SIGNATURES["per_device" if per_device else "generic"]
        dtype = argument("dtype", signature)
        dtypes = {DTYPES[q] for q in outline.qualified_names(dtype) if q in DTYPES} if dtype is not None else set()
        if dtype is not None and "float16" not in dtypes:
            continue
        device = None if per_device else argument("device_type", signature)
        literal_device = per_device or isinstance(device, ast.Constant) and isinstance(device.value, str)
        if literal_device or dtypes or not file_scales:
            return True
    return False


def _may_fire(outline: Outline) -> bool:
    """A backward pass in the file (``loss.backward()`` with no positional argument, or
    ``torch.autograd.backward``), and an enabled autocast call whose region may be a float16 one
    ``check`` judges (``_may_be_judged``) or a float16 FSDP wrap (``may_train_float16``)."""
    if not (any(not c.args for c in outline.method_calls("backward"))
            or outline.calls_to({"torch.autograd.backward"})):
        return False
    file_scales = bool(outline.method_calls("scale"))
    return any(_may_be_judged(outline, c, file_scales) for c in enabled_autocast_calls(outline)) \
        or may_train_float16(outline)


_CALL_DEPTH = 3  # how many in-file calls deep a region is followed to a backward pass


def _vector_jacobian(call: cst.Call) -> bool:
    """``out.backward(gradient=g)``: the gradient of a non-scalar output (a saliency map, an
    input gradient), not a loss trained with an optimizer; a loss scale has nothing to scale."""
    return any(a.keyword is not None and a.keyword.value == "gradient" for a in call.args)


def _owner(ctx: FileContext, func: cst.FunctionDef) -> cst.CSTNode | None:
    """The module or class a function is defined in directly; None when it is nested."""
    parent = ctx.parent(func)
    if isinstance(parent, cst.Module):
        return parent
    if isinstance(parent, cst.IndentedBlock) and isinstance(ctx.parent(parent), cst.ClassDef):
        return ctx.parent(parent)
    return None


class _TrainingPaths:
    """The unscaled backward pass a float16 region feeds, through the file's own functions: in
    the region's function, in a function called inside the region, or in a caller that runs
    the backward of what the region's function returns. A function that touches a GradScaler
    (calls ``.scale(...)``, uses or passes a known scaler, or calls a function of the file
    that does) ends the search: it scales on some path."""

    def __init__(self, ctx: FileContext):
        self.ctx = ctx
        self.calls_in: dict[int, list[cst.Call]] = {}  # by id of the function; id(None): the module
        for call in calls(ctx):
            self.calls_in.setdefault(id(enclosing_function(ctx, call)), []).append(call)
        self.functions: dict[tuple[int, str], cst.FunctionDef] = {}
        for func in ctx.nodes(cst.FunctionDef):
            owner = _owner(ctx, func)
            if owner is not None:
                self.functions[(id(owner), func.name.value)] = func
        # The calls of each function of the file (``_callee``) with the function they are in,
        # by id of the callee: found once, not once per region's function.
        self.callers: dict[int, list[tuple[cst.Call, cst.FunctionDef | None]]] = {}
        for found in self.calls_in.values():
            for call in found:
                caller = enclosing_function(ctx, call)
                callee = self._callee(call, caller)
                if callee is not None:
                    self.callers.setdefault(id(callee), []).append((call, caller))

    def file_scales(self) -> bool:
        return bool(known_scalers(self.ctx)) or self._scales(calls(self.ctx))

    def _scales(self, found: list[cst.Call]) -> bool:
        scalers = known_scalers(self.ctx)
        for call in found:
            mc = method_call(call)
            if mc is not None and (mc[1] == "scale" or self.ctx.code(mc[0]) in scalers):
                return True
            if any(isinstance(a.value, (cst.Name, cst.Attribute)) and self.ctx.code(a.value) in scalers
                   for a in call.args):
                return True
        return False

    def uses_scaler(self, func: cst.FunctionDef | None) -> bool:
        """``func`` touches a scaler itself or through a function of the file it calls
        (``if amp: self.backward_amp(loss) else: loss.backward()``)."""
        own = self.calls_in.get(id(func), [])
        return self._scales(own) or any(
            (callee := self._callee(c, func)) is not None and self._scales(self.calls_in.get(id(callee), []))
            for c in own)

    def unscaled_backwards(self, func: cst.FunctionDef | None) -> list[cst.Call]:
        if self.uses_scaler(func):
            return []
        return [c for c in self.calls_in.get(id(func), [])
                if is_backward(self.ctx, c) and scaled_backward_scaler(self.ctx, c) is None
                and not _vector_jacobian(c)]

    def _callee(self, call: cst.Call, caller: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The function of this file that ``f(...)`` or ``self.f(...)`` calls."""
        if isinstance(call.func, cst.Name):
            return self.functions.get((id(self.ctx.module), call.func.value))
        if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) \
                and call.func.value.value == "self" and caller is not None:
            return self.functions.get((id(_owner(self.ctx, caller)), call.func.attr.value))
        return None

    def unscaled_backward(self, ac: AutocastCall) -> cst.Call | None:
        func = enclosing_function(self.ctx, ac.node)
        if self.uses_scaler(func):
            return None
        own = self.unscaled_backwards(func)
        if own:
            return own[0]
        return self._in_callees(ac, func) or self._in_callers(func)

    def _in_callees(self, ac: AutocastCall, func: cst.FunctionDef | None) -> cst.Call | None:
        holder = self.ctx.parent(ac.node)
        if isinstance(holder, cst.WithItem):
            body = self.ctx.parent(holder).body
        elif isinstance(holder, cst.Decorator):
            body = self.ctx.parent(holder).body
        else:
            return None
        frontier = [(c, func) for c in self.calls_in.get(id(func), []) if self.ctx.contains(body, c)]
        seen: set[int] = set()
        for _ in range(_CALL_DEPTH):
            reached = []
            for call, caller in frontier:
                callee = self._callee(call, caller)
                if callee is None or id(callee) in seen or self.uses_scaler(callee):
                    continue
                seen.add(id(callee))
                backwards = self.unscaled_backwards(callee)
                if backwards:
                    return backwards[0]
                reached.append(callee)
            frontier = [(c, f) for f in reached for c in self.calls_in.get(id(f), [])]
        return None

    def _in_callers(self, func: cst.FunctionDef | None) -> cst.Call | None:
        """``loss = self.func(...)`` then ``loss.backward()`` in another function of the file."""
        if func is None:
            return None
        for call, caller in self.callers.get(id(func), []):
            assignment = self.ctx.parent(call)
            if not isinstance(assignment, cst.Assign) or len(assignment.targets) != 1 \
                    or not isinstance(assignment.targets[0].target, cst.Name):
                continue
            name = assignment.targets[0].target.value
            for backward in self.unscaled_backwards(caller):
                tensor = _backward_tensor(backward)
                if isinstance(tensor, cst.Name) and tensor.value == name \
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
        if event.kind == flow.BACKWARD:
            if scaled:
                self.beside.add(event)
                return fact
            return False, unscaled | {event}
        return fact


def _backward_tensor(call: cst.Call) -> cst.BaseExpression | None:
    """``loss`` of ``loss.backward()`` or ``torch.autograd.backward(loss)``."""
    positional = next((a.value for a in call.args if a.keyword is None and not a.star), None)
    mc = method_call(call)
    return mc[0] if mc is not None and mc[1] == "backward" and positional is None else positional


class Fp16TrainingWithoutScaler(Rule):
    """
    ## What it does
    Finds a float16 autocast region — `dtype=torch.float16`, or no dtype on a device whose
    default is float16 per the policy tables (cuda, xpu, mps, mtia) — that feeds an unscaled
    backward pass (`loss.backward()`, `torch.autograd.backward(...)`): one in the region's
    function, one in a function of the file called inside the region (followed three calls
    deep), or `loss.backward()` in a function of the file that got `loss` from the region's
    function. A function on that path that touches a GradScaler (calls `.scale(...)`, uses a
    scaler built in the file or a parameter named `scaler`, `grad_scaler` or `amp_scaler`, or
    passes one on, or calls a function of the file that does) scales on some branch and ends
    the search. When the device is an expression and no dtype is given, the region is float16
    only on a float16 device, so a GradScaler anywhere in the file silences it. In a function
    that scales, it finds a plain `loss.backward()` that some path runs in the same call as a
    scaled backward (before or after it), of a `loss` last assigned in a float16 region with a
    literal device or dtype: one loss scaled, another not (`if scaler is not None: ... else:
    loss.backward()` runs one or the other, and is not reported there). Such a branch is
    reported when the scaler is a parameter that defaults to None (a library's
    `train_one_epoch(..., scaler=None)`): called without one, the float16 region still runs
    and its loss backpropagates unscaled — unless the region's `enabled=` depends on the scaler
    (`enabled=scaler is not None`).

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
    here. A region whose dtype is an expression is not judged. A backward given an explicit
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
    fragments = ((AnyOf(r"\.backward\(", "autograd"),),)  # every finding is about a backward pass
    may_fire = staticmethod(_may_fire)

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

    def check(self, ctx: FileContext) -> None:
        paths = _TrainingPaths(ctx)
        file_has_scaler = paths.file_scales()
        reported: set[int] = set()  # ids of the autocast calls reported
        backwards: set[int] = set()  # ids of the backward passes they name
        for ac in autocast_calls(ctx):
            if ac.enabled is False or region_dtype(ctx, ac) != "float16":
                continue
            # float16 only as the configured device's default: the device is an expression that
            # may name a bfloat16 device, so a scaler anywhere in the file may be its pair.
            if ac.device is None and ac.dtype is None and file_has_scaler:
                continue
            backward = paths.unscaled_backward(ac)
            if backward is not None:
                reported.add(id(ac.node))
                backwards.add(id(backward))
                row = ctx.location(ctx.offsets(backward)[0]).row
                switch = region_switch(ctx, ac)
                ctx.report(ac.node, f"float16 autocast{f' ({switch.when})' if switch else ''} with a backward "
                                    f"pass but no GradScaler: `{ctx.code(backward.func)}()` on line {row} runs "
                                    "unscaled, so small gradients underflow to zero; use torch.amp.GradScaler "
                                    "(or bfloat16)", related=switch.related if switch else ())
        for scope in flow.flows(ctx):
            if scope.of(flow.SCALED_BACKWARD) and scope.of(flow.BACKWARD):
                self._check_beside_scaled(ctx, scope, reported)
        self._check_optional_scaler(ctx, reported)
        self._check_float16_fsdp(ctx, paths, backwards)

    def _check_float16_fsdp(self, ctx: FileContext, paths: _TrainingPaths, reported: set[int]) -> None:
        """An unscaled backward pass of a model that FSDP wraps with a float16 policy."""
        models = Float16Models(ctx)
        for function in (None, *ctx.nodes(cst.FunctionDef)):
            for backward in paths.unscaled_backwards(function):
                tensor = _backward_tensor(backward)
                if id(backward) in reported or (  # `(loss * loss_scale).backward()`: scaled by hand
                        isinstance(tensor, cst.BinaryOperation) and isinstance(tensor.operator, cst.Multiply)):
                    continue
                model = models.trained_by(backward)
                if model is not None:
                    when = f" {model.switch.when}" if model.switch else ""
                    ctx.report(backward, f"FSDP computes in float16 here{when} ({model.evidence()}): no "
                                         f"ShardedGradScaler scales `{ctx.code(backward.func)}()`, so small gradients "
                                         "underflow to zero; scale the loss with a ShardedGradScaler "
                                         "(torch.amp.GradScaler for `fully_shard`), or use a bfloat16 `param_dtype`",
                               related=model.related())

    def _check_optional_scaler(self, ctx: FileContext, reported: set[int]) -> None:
        """A training step whose scaler parameter defaults to None (a library's
        ``train_one_epoch(..., scaler=None)``) and that, on the branch where none was given,
        backpropagates a float16 autocast loss unscaled: the region does not depend on it."""
        for test in ctx.nodes(cst.If):
            name, without = _without_scaler_branch(test)
            function = enclosing_function(ctx, test) if name is not None else None
            param = next((p for p in function.params.params if p.name.value == name), None) if function else None
            if param is None or param.default is None or not _is_none(param.default):
                continue
            for call in ctx.nodes_within(cst.Call, without):
                if not is_backward(ctx, call) or scaled_backward_scaler(ctx, call) is not None:
                    continue
                ac = _float16_region_of_loss(ctx, call)
                if ac is None or id(ac.node) in reported or any(
                        isinstance(n, cst.Name) and n.value == name for a in ac.node.args for n in subtree(a.value)):
                    continue  # `enabled=scaler is not None`: no region without one
                reported.add(id(ac.node))
                param_row = ctx.location(ctx.offsets(param)[0]).row
                ctx.report(ac.node, f"float16 autocast when called without a scaler (`{name}` defaults to None, "
                                    f"line {param_row}): `{ctx.code(call.func)}()` on line {flow.line_of(ctx, call)} "
                                    "then runs unscaled, so small gradients underflow to zero; pass a "
                                    f"GradScaler, or turn the region off without one (`enabled={name} is not None`)",
                           related=(Related(ctx.path, param_row, f"`{name}` defaults to None"),))

    def _check_beside_scaled(self, ctx: FileContext, scope: flow.Flow, reported: set[int]) -> None:
        analysis = _BesideScaled()
        flow.propagate(scope, analysis)
        for event in sorted(analysis.beside, key=lambda e: ctx.order(e.node)):
            ac = _float16_region_of_loss(ctx, event.node)
            if ac is None or id(ac.node) in reported:
                continue
            reported.add(id(ac.node))
            scaled = min(scope.of(flow.SCALED_BACKWARD),
                         key=lambda e: abs(ctx.order(e.node) - ctx.order(event.node)))
            ctx.report(ac.node, f"float16 autocast whose loss skips the GradScaler: "
                                f"`{ctx.code(event.node.func)}()` on line {flow.line_of(ctx, event.node)} "
                                f"runs unscaled beside the scaled backward on line {flow.line_of(ctx, scaled.node)}, "
                                "so its small gradients underflow to zero; scale it too")


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _without_scaler_branch(test: cst.If) -> tuple[str | None, cst.CSTNode | None]:
    """For ``if scaler is not None:`` (``if scaler:``, ``if scaler is None:``, ``if not
    scaler:``) with an ``else``, the name tested and the branch that runs without it."""
    condition, given = test.test, True
    if isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.Not):
        condition, given = condition.expression, False
    if isinstance(condition, cst.Comparison) and len(condition.comparisons) == 1 \
            and _is_none(condition.comparisons[0].comparator):
        operator = condition.comparisons[0].operator
        if not isinstance(operator, (cst.Is, cst.IsNot)):
            return None, None
        given = given == isinstance(operator, cst.IsNot)
        condition = condition.left
    if not isinstance(condition, cst.Name) or not isinstance(test.orelse, cst.Else):
        return None, None
    return condition.value, (test.orelse.body if given else test.body)


def _float16_region_of_loss(ctx: FileContext, call: cst.Call) -> AutocastCall | None:
    """The float16 region (with a literal device or dtype) where the tensor ``call``
    backpropagates was last assigned; None when it is not a name assigned in one."""
    tensor = _backward_tensor(call)
    if not isinstance(tensor, cst.Name) or _vector_jacobian(call):
        return None
    value = assigned_before(ctx, tensor)
    region = autocast_region(ctx, value) if value is not None else None
    if region is None:
        return None
    ac = region[0]
    if region_dtype(ctx, ac) != "float16" or (ac.device is None and ac.dtype is None):
        return None
    return ac
