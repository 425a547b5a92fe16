"""The instrumentation of a real run: wraps autocast, GradScaler, the optimizers, backward and
the clip functions, watches every module's forward (and counts the overflow and underflow of its
half outputs), and counts the ops that run inside an enabled autocast region with a
TorchDispatchMode (pushed only while such a region is open), which also follows the float32
tensors that factories make there to the ops where they meet half ones (AMP003).

Everything is installed by ``Tracer.install()`` and put back by ``Tracer.uninstall()``.
Findings carry the static rules' codes and the user's own file:line: the first stack frame
outside torch, amplint, the standard library and site-packages.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
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
    return _display_path(filename, os.getcwd())


@functools.lru_cache(maxsize=1024)
def _display_path(filename: str, cwd: str) -> str:
    # Cached: relpath costs more than the rest of a step's bookkeeping (scaler.step notes its line).
    try:
        rel = os.path.relpath(filename, cwd)
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


@functools.lru_cache(maxsize=4096)
def _positions(code, lasti: int) -> tuple | None:
    """(row, end_row, col, end_col) of the instruction at ``lasti``, or None; cached because
    co_positions() is walked from the start of the code object on every call."""
    pos = next(itertools.islice(code.co_positions(), lasti // 2, None), None)
    return pos if pos is not None and pos[0] is not None else None


def _site(code, lasti: int, lineno: int) -> Site:
    pos = _positions(code, lasti)
    if pos is None:
        return Site(display_path(code.co_filename), lineno, 1, lineno, 1)
    row, end_row, col, end_col = pos
    return Site(display_path(code.co_filename), row, (col or 0) + 1, end_row or row, (end_col or 0) + 1)


def _site_of_frame(frame) -> Site:
    return _site(frame.f_code, frame.f_lasti, frame.f_lineno)


def user_frame(frame=None):
    """The first frame outside torch, amplint, the standard library and site-packages, or None."""
    frame = frame or sys._getframe(1)
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_site(frame=None) -> Site | None:
    """The user's file:line of the current call (see ``user_frame``)."""
    frame = user_frame(frame or sys._getframe(1))
    return None if frame is None else _site_of_frame(frame)


def user_site_of_traceback(tb) -> Site | None:
    """The innermost user frame of a traceback (where the user's call that raised is)."""
    found = None
    while tb is not None:
        if not _is_library(tb.tb_frame.f_code.co_filename):
            # tb_lasti is the instruction of this traceback entry (f_lasti moved on since).
            found = _site(tb.tb_frame.f_code, tb.tb_lasti, tb.tb_lineno)
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


# A half value's bits without the sign: (shift to its exponent field, width of that field).
_EXPONENT_FIELD = {torch.float16: (10, 5), torch.bfloat16: (7, 8)}
# Half outputs' values are counted in every call during the first steps, then in one step of this
# many: seven tensor ops per module output, the largest part of the trace's cost in a long run.
NUMERICS_EVERY = 8


@dataclass
class ModuleRecord:
    """One module's dtypes; the sets and ``ops`` hold torch.dtype (None: an op with no tensor
    output), named in ``as_dict``."""

    name: str
    type: str
    calls: int = 0
    input_dtypes: set = field(default_factory=set)
    output_dtypes: set = field(default_factory=set)
    ops: dict = field(default_factory=dict)  # dtype -> ops run in it inside enabled autocast
    autocast_output_dtypes: set = field(default_factory=set)  # outputs of calls inside an enabled region
    # The values of its float16/bfloat16 outputs under enabled autocast: how many, and (an int64
    # tensor on their device, added to without reading it back: no device sync per call) how many
    # are nonzero, have a nonzero exponent (zero and subnormal ones have none), are inf or NaN.
    half_calls: int = 0
    half_values: int = 0
    half_value_counts: "torch.Tensor | None" = None

    def as_dict(self) -> dict:
        return {"module": self.name, "type": self.type, "calls": self.calls,
                "input_dtypes": _dtype_names(self.input_dtypes), "output_dtypes": _dtype_names(self.output_dtypes),
                "autocast_output_dtypes": _dtype_names(self.autocast_output_dtypes),
                "ops": dict(sorted((_dtype_name(d) if d is not None else "none", n) for d, n in self.ops.items())),
                "half_outputs": self.half_outputs()}

    def half_outputs(self) -> dict | None:
        """Overflow and underflow in its half outputs, as fractions of the values counted:
        ``overflow`` inf or NaN; ``zero`` exactly zero (flushed to zero, or zero by design: ReLU,
        dropout, padding); ``subnormal`` below the dtype's smallest normal, where precision is
        being lost on the way to zero; the calls and values counted (see NUMERICS_EVERY). None: no
        half output under autocast was counted."""
        if self.half_value_counts is None:
            return None
        nonzero, normal_or_wider, overflow = self.half_value_counts.tolist()
        total = self.half_values
        return {"calls_counted": self.half_calls, "values": total, "overflow": overflow / total,
                "zero": (total - nonzero) / total, "subnormal": (nonzero - normal_or_wider) / total}


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


def _dtype_names(dtypes) -> list[str]:
    return sorted(_dtype_name(d) for d in dtypes)


_HALF = (torch.float16, torch.bfloat16)


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


def _autocast_would_disable(device_type, dtype) -> bool:
    """torch.autocast's reasons to warn and disable an enabled region (AMP011)."""
    if device_type == "cuda":
        return not torch.cuda.is_available()
    return dtype is not None and dtype not in _HALF


# Factories that make the default dtype (float32) when given no dtype (AMP003 follows what they make).
_FACTORIES = frozenset(f"aten::{name}" for name in (
    "zeros", "ones", "empty", "empty_strided", "full", "rand", "randn", "arange", "linspace", "logspace", "eye"))


def _next_autograd_node() -> int:
    """The sequence number autograd gives the next node it makes in this thread."""
    with torch.enable_grad():
        made = torch.zeros((), requires_grad=True).neg()
    return made.grad_fn._sequence_nr() + 1


class _OpCounter(TorchDispatchMode):
    """Counts ops per module and output dtype, and follows float32 tensors made in the region
    (AMP003); sees ops below the Autocast key (after its casts)."""

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            out = func(*args, **(kwargs or {}))
        except Exception as exc:
            self.tracer._op_failed(func, args, kwargs, exc)
            raise
        self.tracer._op(func, args, kwargs, out)
        return out


@dataclass(frozen=True)
class _Made:
    """A float32 tensor a factory made without dtype in an enabled region: where (the user's
    frame, kept as code and instruction so that no frame stays alive) and by which factory."""

    code: object
    lasti: int
    lineno: int
    factory: str
    device: str

    def site(self) -> Site:
        return _site(self.code, self.lasti, self.lineno)


# --- the tracer -----------------------------------------------------------------------------

class Tracer:
    """Instrument torch for one run. ``findings`` (Diagnostics), ``steps`` (StepRecords) and
    ``dtype_map`` (one dict per module) are filled as the program runs.

    ``steps``: stop the program (TraceStop) after that many optimizer steps; None: never.
    ``codes``: the codes to report (None: all). ``device``: the device whose policy table is read,
    besides the region's own, for banned ops (AMP008), as the linter's configured ``device``."""

    CODES = ("AMP001", "AMP002", "AMP003", "AMP005", "AMP006", "AMP007", "AMP008", "AMP009", "AMP010", "AMP011")

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
        # The sequence number of the first autograd node a float16 region opened since the last
        # step may have made (None: no such region; 0: not known, any node may be of one).
        self._float16_nodes_from: int | None = None
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
        self._promote: dict[str, set[str]] = {}  # table device -> ops its autocast promotes to the widest dtype
        self._op_cache: dict = {}
        self._op_counter = _OpCounter(self)  # one mode, pushed while an enabled region is open
        self._made: dict[int, tuple] = {}  # id(tensor) -> (weakref to it, _Made): AMP003's float32 tensors
        self._met: set[_Made] = set()  # made tensors already reported
        self._upcasts: list = []  # (tensor, half dtype) of the half -> float32 casts just before this op
        self._disabled_by_torch: "weakref.WeakSet" = weakref.WeakSet()  # autocast objects torch disabled
        self._warned: set = set()  # (code, line, message) of torch's warnings given again (AMP011)
        self._last_counted: tuple | None = None  # (tensor, its _version, counts): an output modules share

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
        self._load_tables()
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
        self._upcasts, self._last_counted = [], None  # let go of the program's tensors
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

    # -- the policy tables: banned ops (AMP008), promoted ops (AMP003) ---------------------------

    def _load_tables(self) -> None:
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
                elif entry["policy"] == "promote":
                    self._promote.setdefault(device, set()).add(entry["op"])

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
        orig_init, orig_enter, orig_exit = cls.__init__, cls.__enter__, cls.__exit__
        tracer = self

        @functools.wraps(orig_init)
        def __init__(ac, device_type, dtype=None, enabled=True, cache_enabled=None):
            if not (enabled and _autocast_would_disable(device_type, dtype)):
                orig_init(ac, device_type, dtype, enabled, cache_enabled)
            else:
                # torch warns at its caller (stacklevel=2), here: its warning is given again at ours,
                # once per place as the default filter would (catch_warnings resets that memory).
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    orig_init(ac, device_type, dtype, enabled, cache_enabled)
                caller = sys._getframe(1)
                for caught_warning in caught:
                    key = (caller.f_code, caller.f_lineno, str(caught_warning.message))
                    if key not in tracer._warned:
                        tracer._warned.add(key)
                        warnings.warn(caught_warning.message, stacklevel=2)
            if enabled and not getattr(ac, "_enabled", True):  # asked for, and torch warned and disabled it
                tracer._disabled_by_torch.add(ac)

        @functools.wraps(orig_enter)
        def __enter__(ac):
            result = orig_enter(ac)
            device = getattr(ac, "device", None)
            if ac in tracer._disabled_by_torch:
                tracer._disabled_region(ac)
            if isinstance(device, str):
                tracer._region_enter(device)
            return result

        @functools.wraps(orig_exit)
        def __exit__(ac, *exc):
            if isinstance(getattr(ac, "device", None), str):
                tracer._region_exit()
            return orig_exit(ac, *exc)

        self._patch(cls, "__init__", __init__)
        self._patch(cls, "__enter__", __enter__)
        self._patch(cls, "__exit__", __exit__)

    def _disabled_region(self, ac) -> None:
        """AMP011: torch.autocast warned and disabled a region the program asked to enable."""
        device, dtype = ac.device, _dtype_name(ac.fast_dtype)
        if device == "cuda" and not torch.cuda.is_available():
            why = "CUDA is not available in this run"
        else:
            why = f"{device} autocast does not support {dtype} (it accepts float16 and bfloat16)"
        self._report("AMP011", f"torch disabled this autocast region ({device}, {dtype}): {why}, so torch warned and "
                     "every op in it runs in float32; pass a dtype the device supports, and `enabled=False` "
                     "to turn mixed precision off", user_site())

    def _region_enter(self, device: str) -> None:
        enabled = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device)
        region = _Region(device, enabled, dtype)
        self._devices.add(device)
        if enabled:
            self._region_dtypes_since_step.add(_dtype_name(dtype))
            outermost = not any(r.pushed_mode is not None for r in self._regions)
            if dtype == torch.float16 and self._float16_nodes_from is None:
                # Inside an outer region the op counter would count the probe as the program's.
                self._float16_nodes_from = _next_autograd_node() if outermost else 0
            if outermost:
                region.pushed_mode = self._op_counter
                region.pushed_mode.__enter__()
        self._regions.append(region)

    def _region_exit(self) -> None:
        if not self._regions:
            return
        region = self._regions.pop()
        if region.pushed_mode is not None:
            region.pushed_mode.__exit__(None, None, None)
            # Made tensors are followed within the region that made them: the next ops are not seen.
            self._upcasts, self._made = [], {}

    def _enabled_devices(self) -> list[str]:
        found = []
        for device in sorted(self._devices):
            try:
                if torch.is_autocast_enabled(device):
                    found.append(device)
            except RuntimeError:
                pass
        return found

    def _op_info(self, func) -> tuple:
        """(op name, the banned table entry it matches or None), cached per overload."""
        info = self._op_cache.get(func)
        if info is None:
            schema = func._schema
            name = schema.name
            full = name + ("." + schema.overload_name if schema.overload_name else "")
            banned = name if name in self._banned else full if full in self._banned else None
            info = self._op_cache[func] = (name, banned)
        return info

    def _op(self, func, args, kwargs, out) -> None:
        if not self._regions:
            return
        region = self._regions[-1]
        if not region.enabled or self._internal:
            return
        name, banned = self._op_info(func)
        if banned is not None:
            self._banned_op(banned, region)
        tensor = out if isinstance(out, torch.Tensor) else next(_tensors(out), None)
        dtype = tensor.dtype if tensor is not None else None
        if self._mstack:
            record = self.modules[self._mstack[-1][1]]
        else:
            record = self.modules.get(_OUT_OF_REGION)
            if record is None:
                record = self.modules[_OUT_OF_REGION] = ModuleRecord(_OUT_OF_REGION, "")
        record.ops[dtype] = record.ops.get(dtype, 0) + 1
        if name in _FACTORIES:
            if dtype == torch.float32 and not (kwargs and kwargs.get("dtype") is not None):
                self._note_made(tensor, name, region.device)
            return
        if self._made:
            self._follow_made(name, args, kwargs, out, region)
        if name == "aten::_to_copy" and dtype == torch.float32 and args[0].dtype in _HALF:
            # Autocast casts a promote op's half inputs just before it runs (cat, stack on cpu).
            self._upcasts.append((tensor, args[0].dtype))
        elif self._upcasts:
            self._upcasts = []

    # -- AMP003: float32 tensors made in the region that meet half activations --------------------

    def _note_made(self, tensor, factory: str, device: str) -> None:
        frame = user_frame()
        if frame is None:
            return
        made = _Made(frame.f_code, frame.f_lasti, frame.f_lineno, factory, device)
        if made in self._met:
            return
        self._made[id(tensor)] = (weakref.ref(tensor), made)
        if len(self._made) > 256:  # forget the dead ones
            self._made = {k: v for k, v in self._made.items() if v[0]() is not None}

    def _made_and_half(self, args, kwargs):
        """The first made tensor among an op's tensor arguments (one level into lists) and the
        first half dtype among the others: (_Made or None, dtype or None, upcast: bool)."""
        made = half = None
        upcast = False
        for value in (*args, *(kwargs.values() if kwargs else ())):
            for t in (value,) if isinstance(value, torch.Tensor) else value if isinstance(value, (list, tuple)) else ():
                if not isinstance(t, torch.Tensor):
                    continue
                entry = self._made.get(id(t))
                if entry is not None and entry[0]() is t:
                    made = made or entry[1]
                elif t.dtype in _HALF:
                    half = half or t.dtype
                elif half is None:
                    for u, source in self._upcasts:
                        if u is t:
                            half, upcast = source, True
        return made, half, upcast

    def _follow_made(self, name: str, args, kwargs, out, region: _Region) -> None:
        made, half, upcast = self._made_and_half(args, kwargs)
        if made is None:
            return
        outputs = [t for t in _tensors(out) if t.dtype == torch.float32]
        if half is None:
            # Computed from a made tensor and float32 only (views, in-place ops, arithmetic): still made.
            for t in outputs:
                self._made[id(t)] = (weakref.ref(t), made)
        elif outputs and made not in self._met:
            if not upcast:
                self._met_half(made, half, name, "which promoted the result to float32")
            elif name in self._promote.get(region.device, ()):
                self._met_half(made, half, name, f"where {region.device} autocast promoted the {_dtype_name(half)} "
                               "inputs to float32")

    def _op_failed(self, func, args, kwargs, exc: Exception) -> None:
        """An op under enabled autocast raised: a made tensor meeting half ones explains it (AMP003)."""
        if not self._made or not self._regions or not self._regions[-1].enabled or self._internal:
            return
        made, half, _ = self._made_and_half(args, kwargs)
        if made is not None and half is not None and made not in self._met:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._met_half(made, half, self._op_info(func)[0], f"which raised \"{first}\"")

    def _met_half(self, made: _Made, half: torch.dtype, op: str, outcome: str) -> None:
        self._met.add(made)
        site, meeting = made.site(), user_site()
        elsewhere = meeting is not None and meeting.path != site.path
        where = "" if meeting is None else f" at {meeting.path + ':' if elsewhere else ''}line {meeting.row}"
        factory = made.factory.removeprefix("aten::")
        fix = f" (or `x.new_{factory}(...)`)" if factory in ("zeros", "ones", "empty", "full") else ""
        self._report("AMP003", f"`torch.{factory}` without `dtype=` made a float32 tensor here under {made.device} "
                     f"autocast; it met {_dtype_name(half)} activations in `{op}`{where}, {outcome}: pass "
                     f"`dtype=x.dtype`{fix}", site)

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
        for t in (args[0],) if len(args) == 1 and isinstance(args[0], torch.Tensor) else _tensors(args):
            record.input_dtypes.add(t.dtype)
        self._mstack.append((module, name))

    def _forward_post(self, module, args, output) -> None:
        if not self._mstack or self._mstack[-1][0] is not module:
            return
        _, name = self._mstack.pop()
        record = self.modules[name]
        in_region = bool(self._regions) and self._regions[-1].enabled
        steps = len(self.steps)
        # Not under functorch transforms (vmap, grad): their tensors' counts would escape them.
        count = (in_region and (steps < NUMERICS_EVERY or steps % NUMERICS_EVERY == 0)
                 and torch._C._functorch.peek_interpreter_stack() is None)
        for t in (output,) if isinstance(output, torch.Tensor) else _tensors(output):
            record.output_dtypes.add(t.dtype)
            if in_region:
                record.autocast_output_dtypes.add(t.dtype)
                if count and t.dtype in _HALF and type(t) is torch.Tensor and t.numel():
                    self._count_values(record, t)
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

    def _count_values(self, record: ModuleRecord, t: torch.Tensor) -> None:
        """Add a half output's values to the module's counts (see ModuleRecord), computed on the
        bits (integer ops: fast where half arithmetic is not) without a device sync."""
        record.half_calls += 1
        record.half_values += t.numel()
        last = self._last_counted
        # Plain tensors only (checked by the caller), so no dispatch mode or subclass needs to see
        # these ops (nor count them as the module's); integer views and results need no autograd.
        with torch._C._DisableTorchDispatch():
            if last is not None and last[0] is t and last[1] == t._version:
                counts = last[2]  # the same tensor, returned by the module that called this one
            else:
                shift, width = _EXPONENT_FIELD[t.dtype]
                field = t.view(torch.int16) & 0x7FFF  # the magnitude's bits; then, in place, its exponent
                nonzero = torch.count_nonzero(field)
                normal_or_wider = torch.count_nonzero(field.bitwise_right_shift_(shift))
                overflow = torch.count_nonzero(field.add_(1).bitwise_right_shift_(width))  # all-ones: inf, NaN
                counts = torch.stack([nonzero, normal_or_wider, overflow])
                self._last_counted = (t, t._version, counts)
            if record.half_value_counts is None:
                record.half_value_counts = counts.clone()
            else:
                record.half_value_counts.add_(counts)

    def _finite(self, t) -> bool:
        if not t.is_floating_point() or t.device.type == "meta":
            return True
        last = self._last_counted
        if last is not None and last[0] is t and last[1] == t._version:
            with torch._C._DisableTorchDispatch():
                return not last[2][2]  # a half output just counted: its inf/NaN count
        self._internal = True
        # isfinite runs as several ops: a plain tensor's skip the dispatch modes (ours would count them).
        no_modes = torch._C._DisableTorchDispatch() if type(t) is torch.Tensor else contextlib.nullcontext()
        try:
            with torch.no_grad(), no_modes:
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
            outer = tracer._enter_backward([tensor], "backward()", unit_grad=gradient is None)
            try:
                return orig_tensor_backward(tensor, gradient, *args, **kwargs)
            finally:
                if outer:
                    tracer._in_backward = False

        @functools.wraps(orig_backward)
        def autograd_backward(tensors, grad_tensors=None, *args, **kwargs):
            listed = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            outer = tracer._enter_backward(listed, "torch.autograd.backward()", unit_grad=grad_tensors is None)
            try:
                return orig_backward(listed if not isinstance(tensors, torch.Tensor) else tensors,
                                     grad_tensors, *args, **kwargs)
            finally:
                if outer:
                    tracer._in_backward = False

        @functools.wraps(orig_grad)
        def autograd_grad(outputs, *args, **kwargs):
            listed = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
            outer = tracer._enter_backward(listed, "torch.autograd.grad()", unit_grad=False)
            try:
                return orig_grad(listed if not isinstance(outputs, torch.Tensor) else outputs, *args, **kwargs)
            finally:
                if outer:
                    tracer._in_backward = False

        self._patch(torch.Tensor, "backward", backward)
        self._patch(torch.autograd, "backward", autograd_backward)
        self._patch(torch.autograd, "grad", autograd_grad)

    def _enter_backward(self, tensors, what: str, unit_grad: bool) -> bool:
        """Before a backward call: checks it unless one is already running (Tensor.backward calls
        torch.autograd.backward). True when this call is the outer one."""
        if self._in_backward:
            return False
        self._before_backward(tensors, what, unit_grad)
        self._in_backward = True
        return True

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
                and "float16" in self._region_dtypes_since_step and self._may_hold_float16_ops(tensors)):
            self._report("AMP009", f"`{what}` of a loss computed under float16 autocast with no GradScaler: "
                         "small gradients underflow to zero; scale the loss with `torch.amp.GradScaler`",
                         site or user_site())

    def _may_hold_float16_ops(self, tensors) -> bool:
        """Whether the graph behind ``tensors`` may hold ops of a float16 region opened since the
        last step. Autograd numbers the nodes it makes in order (per thread), and a node is made
        after those of its inputs: a loss whose own node is older than the region's first holds
        none of its ops (a float32 loss computed before the region, backpropagated inside it)."""
        start = self._float16_nodes_from
        return start is not None and any(
            t.grad_fn is not None and t.grad_fn._sequence_nr() >= start for t in tensors)

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
        self._float16_nodes_from = None
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
