"""The instrumentation of a real run: wraps autocast, GradScaler, the optimizers, backward and
the clip functions, watches every module's forward, and counts the ops that run inside an
enabled autocast region with a TorchDispatchMode (pushed only while such a region is open).

Everything is installed by ``Tracer.install()`` and put back by ``Tracer.uninstall()``.
Findings carry the static rules' codes and the user's own file:line: the first stack frame
outside torch, amplint, the standard library and site-packages.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import warnings

with warnings.catch_warnings():
    # torch warns at import when numpy is absent (as the probe does, ignore it: tracing needs no numpy).
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.nn.utils.clip_grad as _clip_grad
    from torch.utils._python_dispatch import TorchDispatchMode

from ..engine.diagnostics import Diagnostic, Location


class TraceStop(SystemExit):
    """Raised in the traced program once ``steps`` optimizer steps have run, at its next forward
    of a top-level module, backward, ``scaler.scale`` or optimizer step. It is a SystemExit, so
    ``except Exception`` in the program does not swallow it; the runner treats it as a clean end."""

    def __init__(self, steps: int):
        super().__init__(0)
        self.steps = steps

    def __str__(self) -> str:
        return f"amplint trace: stopped after {self.steps} optimizer steps"


# --- where the user's code is ---------------------------------------------------------------

def _library_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(torch.__file__), str(Path(__file__).resolve().parent.parent)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    dirs.update(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    out = set()
    for d in dirs:
        out.add(os.path.join(d, ""))
        out.add(os.path.join(os.path.realpath(d), ""))
    return tuple(sorted(out))


_LIBRARY_DIRS = _library_dirs()


@functools.lru_cache(maxsize=4096)
def _is_library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    return filename.startswith(_LIBRARY_DIRS) or os.path.realpath(filename).startswith(_LIBRARY_DIRS)


def display_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


@dataclass(frozen=True)
class Site:
    """A place in the user's code: 1-based row and column, the end of the call expression."""

    path: str
    row: int
    column: int
    end_row: int
    end_column: int


def _site_of_frame(frame) -> Site:
    row, end_row, col, end_col = frame.f_lineno, frame.f_lineno, 0, 0
    try:
        positions = list(frame.f_code.co_positions())
        pos = positions[frame.f_lasti // 2]
        if pos[0] is not None:
            row, end_row = pos[0], pos[1] or pos[0]
            col, end_col = pos[2] or 0, pos[3] or 0
    except (AttributeError, IndexError):
        pass
    return Site(display_path(frame.f_code.co_filename), row, col + 1, end_row, end_col + 1)


def user_site(frame=None) -> Site | None:
    """The first frame outside torch, amplint, the standard library and site-packages."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if not _is_library(frame.f_code.co_filename):
            return _site_of_frame(frame)
        frame = frame.f_back
    return None


def user_site_of_traceback(tb) -> Site | None:
    """The innermost user frame of a traceback (where the user's call that raised is)."""
    found = None
    while tb is not None:
        if not _is_library(tb.tb_frame.f_code.co_filename):
            frame = tb.tb_frame
            row = tb.tb_lineno
            site = _site_of_frame(frame)
            # tb_lasti is the instruction of this traceback entry (f_lasti moved on since).
            try:
                pos = list(frame.f_code.co_positions())[tb.tb_lasti // 2]
                site = Site(site.path, pos[0] or row, (pos[2] or 0) + 1, pos[1] or row, (pos[3] or 0) + 1)
            except (AttributeError, IndexError, TypeError):
                site = Site(site.path, row, 1, row, 1)
            found = site
        tb = tb.tb_next
    return found


# --- what is recorded ----------------------------------------------------------------------

@dataclass
class StepRecord:
    step: int  # 1-based
    via: str  # "scaler.step" or "optimizer.step"
    loss_scale: float | None  # the scale the step's gradients were unscaled with
    skipped: bool  # the scaler found inf/NaN gradients and did not run optimizer.step
    scale_after_update: float | None = None
    first_nonfinite_module: str | None = None  # the first module (forward hook order) with inf/NaN output

    def as_dict(self) -> dict:
        return {"step": self.step, "via": self.via, "loss_scale": self.loss_scale, "skipped": self.skipped,
                "scale_after_update": self.scale_after_update,
                "first_nonfinite_module": self.first_nonfinite_module}


@dataclass
class ModuleRecord:
    name: str
    type: str
    calls: int = 0
    input_dtypes: set = field(default_factory=set)
    output_dtypes: set = field(default_factory=set)
    ops: dict = field(default_factory=dict)  # dtype name -> ops run in it inside enabled autocast
    autocast_output_dtypes: set = field(default_factory=set)  # outputs of calls inside an enabled region

    def as_dict(self) -> dict:
        return {"module": self.name, "type": self.type, "calls": self.calls,
                "input_dtypes": sorted(self.input_dtypes), "output_dtypes": sorted(self.output_dtypes),
                "autocast_output_dtypes": sorted(self.autocast_output_dtypes),
                "ops": dict(sorted(self.ops.items()))}


@dataclass
class _Region:
    device: str
    enabled: bool
    dtype: torch.dtype
    pushed_mode: "TorchDispatchMode | None" = None


@dataclass
class _ScalerState:
    scaled_backward: bool = False  # a backward of a scaled loss ran since the last update
    unscaled: set = field(default_factory=set)  # ids of optimizers unscale_d since the last update
    stepped: dict = field(default_factory=dict)  # optimizer id -> Site of its scaler.step since update
    last_iteration: set = field(default_factory=set)  # optimizer ids stepped before the last update
    updates: int = 0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensors(value, depth: int = 0):
    """The tensors of a module's input or output, one level into tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 2 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)


_OUT_OF_REGION = "<outside any module>"


class _OpCounter(TorchDispatchMode):
    """Counts ops per module and output dtype; sees ops below the Autocast key (after its casts)."""

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.tracer._op(func, out)
        return out


# --- the tracer -----------------------------------------------------------------------------

class Tracer:
    """Instrument torch for one run. ``findings`` (Diagnostics), ``steps`` (StepRecords) and
    ``dtype_map`` (one dict per module) are filled as the program runs.

    ``steps``: stop the program (TraceStop) after that many optimizer steps; None: never.
    ``codes``: the codes to report (None: all). ``device``: the device whose policy table is read,
    besides the region's own, for banned ops (AMP008), as the linter's configured ``device``."""

    CODES = ("AMP001", "AMP002", "AMP005", "AMP006", "AMP007", "AMP008", "AMP009", "AMP010")

    def __init__(self, steps: int | None = None, codes=None, device: str | None = "cuda",
                 torch_version: str | None = None):
        self.max_steps = steps
        self.codes = None if codes is None else set(codes)
        self.findings: list[Diagnostic] = []
        self.steps: list[StepRecord] = []
        self.modules: dict[str, ModuleRecord] = {}
        self.module_tree: dict[str, str] = {}  # every module of each model that ran: name -> type
        self.device = device
        self.torch_version = torch_version
        self._seen: set = set()
        self._installed = False
        self._patches: list = []
        self._handles: list = []
        self._regions: list[_Region] = []
        self._devices: set[str] = {"cpu", "cuda"}
        self._region_dtypes_since_step: set[str] = set()
        self._mstack: list = []  # (module, name)
        self._names: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._root_count: dict[str, int] = {}
        self._scalers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._scaled_outputs: dict[int, tuple] = {}  # id(tensor) -> (weakref to it, scaler)
        self._optimizers: "weakref.WeakSet" = weakref.WeakSet()
        self._in_backward = False
        self._in_scaler_step = False
        self._optimizer_ran = False
        self._internal = False
        self._stop_pending = False
        self._nonfinite: str | None = None
        self._pending_outputs: list = []  # (module name, output) of the open top-level forward
        self._banned: dict[str, dict[str, str]] = {}  # op -> {table device: torch's message}
        self._op_cache: dict = {}

    # -- public ---------------------------------------------------------------------------------

    @property
    def dtype_map(self) -> list[dict]:
        return [m.as_dict() for m in self.modules.values()]

    @property
    def step_count(self) -> int:
        return len(self.steps)

    def __enter__(self) -> "Tracer":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def install(self) -> None:
        if self._installed:
            return
        self._load_banned()
        self._patch_autocast()
        self._patch_backward()
        self._patch_scaler()
        self._patch_optimizers()
        self._patch_clip()
        mod = torch.nn.modules.module
        self._handles.append(mod.register_module_forward_pre_hook(self._forward_pre))
        self._handles.append(mod.register_module_forward_hook(self._forward_post, always_call=True))
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        for region in reversed(self._regions):
            if region.pushed_mode is not None:
                region.pushed_mode.__exit__(None, None, None)
                region.pushed_mode = None
        self._regions.clear()
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
        for owner, attr, original in reversed(self._patches):
            setattr(owner, attr, original)
        self._patches.clear()
        self._installed = False

    def note_exception(self, exc: BaseException) -> None:
        """The program died with ``exc``: a banned op that torch itself refused (on cuda) is AMP008."""
        if "unsafe to autocast" in str(exc):
            site = user_site_of_traceback(exc.__traceback__)
            first = str(exc).strip().splitlines()[0]
            self._report("AMP008", f"torch refused an op under autocast ({first}): use "
                         "`binary_cross_entropy_with_logits` / `BCEWithLogitsLoss` on the logits", site)

    # -- findings -------------------------------------------------------------------------------

    def _report(self, code: str, message: str, site: Site | None) -> None:
        if site is None or (self.codes is not None and code not in self.codes):
            return
        key = (code, site.path, site.row, site.column)
        if key in self._seen:
            return
        self._seen.add(key)
        name, url = _rule_name(code)
        self.findings.append(Diagnostic(
            code=code, name=name, message=message, path=site.path,
            location=Location(site.row, site.column), end_location=Location(site.end_row, site.end_column),
            url=url))

    def _maybe_stop(self) -> None:
        if self._stop_pending:
            self._stop_pending = False
            raise TraceStop(len(self.steps))

    def _patch(self, owner, attr: str, wrapper) -> None:
        original = getattr(owner, attr)
        self._patches.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    # -- AMP008's tables ------------------------------------------------------------------------

    def _load_banned(self) -> None:
        from ..policy import PolicyError, available_versions, load_policy

        version = self.torch_version
        if version is None:
            minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
            version = minor if minor in available_versions() else None
        devices = {"cpu", "cuda", "xpu", "mps"} | ({self.device} if self.device else set())
        for device in sorted(devices):
            try:
                table = load_policy(device, version)
            except (PolicyError, OSError, ValueError, KeyError):
                continue
            for entry in table.data["ops"]:
                if entry["policy"] == "banned":
                    self._banned.setdefault(entry["op"], {})[device] = table.message_for(entry["op"]) or ""

    def _banned_for(self, op: str, region_device: str) -> str | None:
        """The table device that bans ``op``: the region's own first, then the configured one."""
        tables = self._banned.get(op)
        if not tables:
            return None
        if region_device in tables:
            return region_device
        if self.device in tables:
            return self.device
        return None

    # -- autocast ---------------------------------------------------------------------------------

    def _patch_autocast(self) -> None:
        cls = torch.amp.autocast_mode.autocast
        orig_enter, orig_exit = cls.__enter__, cls.__exit__
        tracer = self

        @functools.wraps(orig_enter)
        def __enter__(ac):
            result = orig_enter(ac)
            device = getattr(ac, "device", None)
            if isinstance(device, str):
                tracer._region_enter(device)
            return result

        @functools.wraps(orig_exit)
        def __exit__(ac, *exc):
            if isinstance(getattr(ac, "device", None), str):
                tracer._region_exit()
            return orig_exit(ac, *exc)

        self._patch(cls, "__enter__", __enter__)
        self._patch(cls, "__exit__", __exit__)

    def _region_enter(self, device: str) -> None:
        enabled = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device)
        region = _Region(device, enabled, dtype)
        self._devices.add(device)
        if enabled:
            self._region_dtypes_since_step.add(_dtype_name(dtype))
            if not any(r.pushed_mode is not None for r in self._regions):
                region.pushed_mode = _OpCounter(self)
                region.pushed_mode.__enter__()
        self._regions.append(region)

    def _region_exit(self) -> None:
        if not self._regions:
            return
        region = self._regions.pop()
        if region.pushed_mode is not None:
            region.pushed_mode.__exit__(None, None, None)

    def _enabled_devices(self) -> list[str]:
        found = []
        for device in sorted(self._devices):
            try:
                if torch.is_autocast_enabled(device):
                    found.append(device)
            except RuntimeError:
                pass
        return found

    def _op(self, func, out) -> None:
        if self._internal or not self._regions:
            return
        region = self._regions[-1]
        if not region.enabled:
            return
        info = self._op_cache.get(func)
        if info is None:
            schema = func._schema
            info = (schema.name, schema.name + ("." + schema.overload_name if schema.overload_name else ""))
            self._op_cache[func] = info
        if info[0] in self._banned or info[1] in self._banned:
            self._banned_op(info[0] if info[0] in self._banned else info[1], region)
        tensor = out if isinstance(out, torch.Tensor) else next(_tensors(out), None)
        dtype = _dtype_name(tensor.dtype) if tensor is not None else "none"
        if self._mstack:
            module, name = self._mstack[-1]
            record = self.modules[name]
        else:
            record = self.modules.get(_OUT_OF_REGION)
            if record is None:
                record = self.modules[_OUT_OF_REGION] = ModuleRecord(_OUT_OF_REGION, "")
        record.ops[dtype] = record.ops.get(dtype, 0) + 1

    def _banned_op(self, op: str, region: _Region) -> None:
        device = self._banned_for(op, region.device)
        if device is None:
            return
        dtype = _dtype_name(region.dtype)
        if device == region.device:
            where = f"the {device} policy bans it"
        else:
            where = (f"this {region.device} run survives it, but the {device} policy (the configured device) "
                     f"bans it: torch raises there")
        self._report("AMP008", f"`{op}` ran under {region.device} autocast ({dtype}); {where} (\"unsafe to "
                     "autocast\"): use `binary_cross_entropy_with_logits` / `BCEWithLogitsLoss` on the logits, "
                     "or compute the loss outside the region", user_site())

    # -- modules ----------------------------------------------------------------------------------

    def _name_of(self, module) -> str:
        name = self._names.get(module)
        if name is not None:
            return name
        base = type(module).__name__
        count = self._root_count.get(base, 0) + 1
        self._root_count[base] = count
        root = base if count == 1 else f"{base}#{count}"
        for qual, sub in module.named_modules():
            if sub not in self._names:
                self._names[sub] = root if not qual else f"{root}.{qual}"
                self.module_tree[self._names[sub]] = type(sub).__name__
        return self._names[module]

    def _forward_pre(self, module, args) -> None:
        if not self._mstack:
            self._maybe_stop()
        name = self._name_of(module)
        record = self.modules.get(name)
        if record is None:
            record = self.modules[name] = ModuleRecord(name, type(module).__name__)
        record.calls += 1
        for t in _tensors(args):
            record.input_dtypes.add(_dtype_name(t.dtype))
        self._mstack.append((module, name))

    def _forward_post(self, module, args, output) -> None:
        if not self._mstack or self._mstack[-1][0] is not module:
            return
        _, name = self._mstack.pop()
        record = self.modules[name]
        in_region = bool(self._regions) and self._regions[-1].enabled
        for t in _tensors(output):
            record.output_dtypes.add(_dtype_name(t.dtype))
            if in_region:
                record.autocast_output_dtypes.add(_dtype_name(t.dtype))
            if self._nonfinite is None and t.is_floating_point() and self._mstack:
                # Checked once per top-level forward: outputs that autograd keeps anyway wait for the
                # top-level module's; others are checked here (not kept alive longer than they would be).
                if t.requires_grad:
                    self._pending_outputs.append((name, t))
                elif not self._finite(t):
                    self._nonfinite = name
        if not self._mstack:
            pending, self._pending_outputs = self._pending_outputs, []
            if self._nonfinite is None and any(not self._finite(t) for t in _tensors(output)):
                self._nonfinite = next((n for n, t in pending if not self._finite(t)), name)

    def _finite(self, t) -> bool:
        if not t.is_floating_point() or t.device.type == "meta":
            return True
        self._internal = True
        try:
            with torch.no_grad():
                return bool(torch.isfinite(t).all())
        except Exception:  # tensors that cannot be read here (functorch transforms, fakes)
            return True
        finally:
            self._internal = False

    # -- backward ---------------------------------------------------------------------------------

    def _patch_backward(self) -> None:
        tracer = self
        orig_tensor_backward = torch.Tensor.backward
        orig_backward = torch.autograd.backward
        orig_grad = torch.autograd.grad

        @functools.wraps(orig_tensor_backward)
        def backward(tensor, gradient=None, *args, **kwargs):
            with tracer._backward_call([tensor], "backward()", unit_grad=gradient is None):
                return orig_tensor_backward(tensor, gradient, *args, **kwargs)

        @functools.wraps(orig_backward)
        def autograd_backward(tensors, grad_tensors=None, *args, **kwargs):
            listed = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            with tracer._backward_call(listed, "torch.autograd.backward()", unit_grad=grad_tensors is None):
                return orig_backward(listed if not isinstance(tensors, torch.Tensor) else tensors,
                                     grad_tensors, *args, **kwargs)

        @functools.wraps(orig_grad)
        def autograd_grad(outputs, *args, **kwargs):
            listed = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
            with tracer._backward_call(listed, "torch.autograd.grad()", unit_grad=False):
                return orig_grad(listed if not isinstance(outputs, torch.Tensor) else outputs, *args, **kwargs)

        self._patch(torch.Tensor, "backward", backward)
        self._patch(torch.autograd, "backward", autograd_backward)
        self._patch(torch.autograd, "grad", autograd_grad)

    def _backward_call(self, tensors, what: str, unit_grad: bool):
        tracer = self

        class _Call:
            def __enter__(self):
                self.outer = not tracer._in_backward
                if self.outer:
                    tracer._before_backward(tensors, what, unit_grad)
                    tracer._in_backward = True

            def __exit__(self, *exc):
                if self.outer:
                    tracer._in_backward = False
                return False

        return _Call()

    def _before_backward(self, tensors, what: str, unit_grad: bool) -> None:
        if what != "torch.autograd.grad()":
            self._maybe_stop()
        site = None
        enabled = self._enabled_devices()
        if enabled:
            site = user_site()
            regions = ", ".join(enabled)
            self._report("AMP001", f"`{what}` called while {regions} autocast is enabled: run the backward "
                         "pass after the `with` block", site)
        scalers = [self._scaled_outputs[id(t)][1] for t in tensors
                   if id(t) in self._scaled_outputs and self._scaled_outputs[id(t)][0]() is t]
        for scaler in scalers:
            self._state(scaler).scaled_backward = True
        if (not scalers and unit_grad and what != "torch.autograd.grad()"
                and "float16" in self._region_dtypes_since_step):
            self._report("AMP009", f"`{what}` of a loss computed under float16 autocast with no GradScaler: "
                         "small gradients underflow to zero; scale the loss with `torch.amp.GradScaler`",
                         site or user_site())

    # -- GradScaler -------------------------------------------------------------------------------

    def _state(self, scaler) -> _ScalerState:
        state = self._scalers.get(scaler)
        if state is None:
            state = self._scalers[scaler] = _ScalerState()
        return state

    def _patch_scaler(self) -> None:
        tracer = self
        cls = torch.amp.grad_scaler.GradScaler
        orig_scale, orig_unscale, orig_step, orig_update = cls.scale, cls.unscale_, cls.step, cls.update

        @functools.wraps(orig_scale)
        def scale(scaler, outputs):
            tracer._maybe_stop()
            if scaler.is_enabled():
                tracer._before_scale(scaler)
            result = orig_scale(scaler, outputs)
            if scaler.is_enabled():
                for t in _tensors(result):
                    tracer._scaled_outputs[id(t)] = (weakref.ref(t), scaler)
                if len(tracer._scaled_outputs) > 256:  # forget the dead ones
                    tracer._scaled_outputs = {k: v for k, v in tracer._scaled_outputs.items() if v[0]() is not None}
            return result

        @functools.wraps(orig_unscale)
        def unscale_(scaler, optimizer):
            try:
                result = orig_unscale(scaler, optimizer)
            except RuntimeError as exc:
                if not tracer._in_scaler_step and "unscale_()" in str(exc):
                    tracer._report("AMP007", f"`scaler.unscale_(optimizer)` again before `scaler.update()`: "
                                   f"torch raises \"{exc}\"", user_site())
                raise
            tracer._state(scaler).unscaled.add(id(optimizer))
            return result

        @functools.wraps(orig_step)
        def step(scaler, optimizer, *args, **kwargs):
            tracer._maybe_stop()
            site = user_site()
            state = tracer._state(scaler)
            tracer._in_scaler_step, tracer._optimizer_ran = True, False
            try:
                result = orig_step(scaler, optimizer, *args, **kwargs)
            except RuntimeError as exc:
                if "step() has already been called since the last update()" in str(exc):
                    first = state.stepped.get(id(optimizer))
                    tracer._report("AMP006", "`scaler.step(optimizer)` again with no `scaler.update()` since its "
                                   f"step at line {first.row if first else '?'}: torch raises \"{exc}\"", site)
                raise
            finally:
                tracer._in_scaler_step = False
            state.stepped.setdefault(id(optimizer), site)
            enabled = scaler.is_enabled()
            scale = float(scaler.get_scale()) if enabled else None
            tracer._finish_step("scaler.step", scale, skipped=enabled and not tracer._optimizer_ran)
            return result

        @functools.wraps(orig_update)
        def update(scaler, *args, **kwargs):
            try:
                result = orig_update(scaler, *args, **kwargs)
            except AssertionError as exc:
                if scaler.is_enabled() and "No inf checks were recorded" in str(exc):
                    tracer._report("AMP006", "`scaler.update()` with no `scaler.step(optimizer)` since the last "
                                   f"update: torch raises \"{exc}\"", user_site())
                raise
            state = tracer._state(scaler)
            state.last_iteration = set(state.stepped) or state.last_iteration
            state.stepped.clear()
            state.unscaled.clear()
            state.scaled_backward = False
            state.updates += 1
            if scaler.is_enabled() and tracer.steps and tracer.steps[-1].via == "scaler.step":
                tracer.steps[-1].scale_after_update = float(scaler.get_scale())
            return result

        self._patch(cls, "scale", scale)
        self._patch(cls, "unscale_", unscale_)
        self._patch(cls, "step", step)
        self._patch(cls, "update", update)

    def _before_scale(self, scaler) -> None:
        state = self._state(scaler)
        if state.stepped and state.last_iteration and state.last_iteration <= set(state.stepped):
            first = min(state.stepped.values(), key=lambda s: (s.path, s.row))
            self._report("AMP006", "`scaler.step()` with no `scaler.update()` before the next `scaler.scale()`: "
                         "the loss scale never adapts and the next step raises", first)
        dtypes = self._region_dtypes_since_step
        if dtypes and dtypes == {"bfloat16"}:
            self._report("AMP010", "`scaler.scale()` on a loss computed under bfloat16 autocast only: bfloat16 "
                         "has float32's range, a GradScaler is not needed", user_site())

    def finish(self) -> None:
        """The program ended: a scaler stepped but never updated is AMP006."""
        for scaler, state in list(self._scalers.items()):
            if state.stepped and not state.updates and scaler.is_enabled():
                first = min(state.stepped.values(), key=lambda s: (s.path, s.row))
                self._report("AMP006", "`scaler.step()` with no `scaler.update()` in the whole run: the loss "
                             "scale never adapts", first)

    # -- optimizers -------------------------------------------------------------------------------

    def _patch_optimizers(self) -> None:
        tracer = self
        cls = torch.optim.Optimizer
        orig_init = cls.__init__

        @functools.wraps(orig_init)
        def __init__(optimizer, *args, **kwargs):
            orig_init(optimizer, *args, **kwargs)
            tracer._optimizers.add(optimizer)

        self._patch(cls, "__init__", __init__)
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self._handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(register_optimizer_step_post_hook(self._optimizer_post))

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        if self._in_scaler_step:
            self._optimizer_ran = True
            return
        self._maybe_stop()
        if any(s.scaled_backward for scaler, s in self._scalers.items() if scaler.is_enabled()):
            self._report("AMP005", "`optimizer.step()` called directly after a scaled backward: the gradients "
                         "are still multiplied by the loss scale; call `scaler.step(optimizer)`", user_site())

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        if not self._in_scaler_step:
            self._finish_step("optimizer.step", None, skipped=False)

    def _finish_step(self, via: str, scale: float | None, skipped: bool) -> None:
        self.steps.append(StepRecord(len(self.steps) + 1, via, scale, skipped,
                                     first_nonfinite_module=self._nonfinite))
        self._nonfinite = None
        self._region_dtypes_since_step = set()
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            self._stop_pending = True

    # -- clipping ---------------------------------------------------------------------------------

    def _patch_clip(self) -> None:
        tracer = self
        for fname in ("clip_grad_norm_", "clip_grad_value_"):
            original = getattr(_clip_grad, fname)

            def make(original, fname):
                @functools.wraps(original)
                def clip(parameters, *args, **kwargs):
                    if not isinstance(parameters, torch.Tensor):
                        parameters = list(parameters)
                    tracer._before_clip(fname, [parameters] if isinstance(parameters, torch.Tensor) else parameters)
                    return original(parameters, *args, **kwargs)
                return clip

            wrapper = make(original, fname)
            self._patch(_clip_grad, fname, wrapper)
            if getattr(torch.nn.utils, fname, None) is original:
                self._patch(torch.nn.utils, fname, wrapper)

    def _before_clip(self, fname: str, parameters: list) -> None:
        ids = {id(p) for p in parameters}
        owners = [opt for opt in list(self._optimizers)
                  if any(id(p) in ids for group in opt.param_groups for p in group["params"])]
        for scaler, state in list(self._scalers.items()):
            if not state.scaled_backward or not scaler.is_enabled():
                continue
            missing = [o for o in owners if id(o) not in state.unscaled] if owners else \
                ([None] if not state.unscaled else [])
            if missing:
                self._report("AMP002", f"`{fname}` on gradients the GradScaler has scaled and not unscaled: "
                             "call `scaler.unscale_(optimizer)` before clipping", user_site())
                return


@functools.lru_cache(maxsize=None)
def _rule_name(code: str) -> tuple[str, str | None]:
    from ..engine.rule import rule_by_code

    rule = rule_by_code(code)
    return (rule.name, rule.url()) if rule else (code, None)
