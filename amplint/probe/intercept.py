"""Observe what an autocast kernel does, without running any kernel.

Inputs are wrapper-subclass tensors that claim to live on the target device. Autocast is
switched on for that device through the low-level TLS switches (``torch.autocast`` would
disable itself when the device is absent), and autograd is excluded so that composite ops
reach the Python dispatch key undecomposed. The Python key sits below Autocast: there we
see each cast the autocast kernel makes (``_to_copy``) and then the op it re-dispatches to,
with its overload and arguments. The op's output is then computed on the meta device and the
call goes on, to see whether the kernel casts that output (back to its input's dtype, as
torchvision's roi_align wrapper does); where no meta kernel can compute it, the call stops there.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

# Autocast casts with Tensor.to(dtype); with autograd excluded that reaches us as aten::to
# undecomposed, and as aten::_to_copy where it was decomposed.
_CAST_OPS = {"aten::to", "aten::_to_copy"}


class _Stop(Exception):
    """Raised at the Python key to end an observation: the re-dispatched op was seen and
    no meta kernel can compute its output for the call to go on with."""


# What reading a tensor's device dispatches, for a tensor that asks (ProbeTensor).
_DEVICE_OF = torch.ops.prim.device.default

# The label of the re-dispatched op's outputs, in an observation.
OUTPUT_LABEL = "output"


@dataclass
class Observation:
    casts: list[tuple[str, str, str]] = field(default_factory=list)  # (input, from, to)
    op: str | None = None  # the overload autocast re-dispatched to
    args: dict[str, Any] = field(default_factory=dict)  # its arguments, tensors as dtype names
    output_casts: list[tuple[str, str, str]] = field(default_factory=list)  # casts of its output, after it
    error: str | None = None
    accepted: bool = False  # the re-dispatched op computed its output from these arguments

    @property
    def reached(self) -> bool:
        return self.op is not None


class ProbeTensor(torch.Tensor):
    """A tensor with metadata only; every op on it is recorded instead of run. Every read of
    its device, from Python (``x.device``, ``x.is_cuda``) or C++ (``input.is_cuda()``,
    ``input.options()``), comes to ``__torch_dispatch__`` too, as ``prim::device``, and is
    noted: a traced call that reads it may take another path on another device."""

    label: str
    probe_device: torch.device

    @staticmethod
    def __new__(cls, shape, dtype, device, label=""):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device, dispatch_device=True)
        t.label = label
        t.probe_device = torch.device(device)
        return t

    def __repr__(self):
        # Not torch's, which runs ops on the values to print them (error messages that show
        # a tensor would reach those ops, and slowly).
        return f"ProbeTensor({tuple(self.shape)}, {self.dtype}, {self.probe_device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is _DEVICE_OF:
            _RECORDER.note_device_asked()
            return args[0].probe_device
        return _RECORDER.record(func, args, kwargs or {})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(value: Any) -> Any:
    """A JSON-friendly picture of an argument: tensors become their dtype's name."""
    def one(v):
        if isinstance(v, torch.Tensor):
            return dtype_name(v.dtype)
        if isinstance(v, torch.dtype):
            return dtype_name(v)
        if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            return str(v)
        return v
    return tree_map(one, value)


@dataclass
class DeviceDependence:
    """What a traced call asked that another device could answer otherwise (see run_traced)."""

    asked_device: bool = False  # read a tensor's device, named a device, initialised one, or lacked its support
    composites: set[str] = field(default_factory=set)  # composite ops it met: followed unless the device has a kernel


class _Recorder:
    """Routes every op that reaches a ProbeTensor's Python key to the armed handler, and
    notes device reads in the armed trace's DeviceDependence."""

    def __init__(self):
        self.handler: Callable | None = None
        self.dependence: DeviceDependence | None = None

    def record(self, func, args, kwargs):
        if self.handler is None:
            raise RuntimeError("ProbeTensor used outside an observation")
        return self.handler(func, args, kwargs)

    def note_device_asked(self):
        if self.dependence is not None:
            self.dependence.asked_device = True


def op_name(func) -> str:
    schema = func._schema
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def _cast(func, args, kwargs) -> tuple[str, torch.dtype, torch.dtype] | None:
    """(input label, from, to) when ``func`` is one of the casts autocast makes."""
    if func._schema.name not in _CAST_OPS:
        return None
    src = args[0]
    dtype = bind(func._schema, args, kwargs).get("dtype") or src.dtype
    return getattr(src, "label", "?"), src.dtype, dtype


_RECORDER = _Recorder()


def bind(schema, args, kwargs) -> dict[str, Any]:
    """The call's arguments by schema name."""
    named = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            named[arg.name] = args[i]
        elif arg.name in kwargs:
            named[arg.name] = kwargs[arg.name]
    return named


@contextlib.contextmanager
def autocast_switched_on(device: str, dtype: torch.dtype):
    """Enable autocast for ``device`` in this thread the way the context manager does, minus its checks."""
    prev_enabled = torch.is_autocast_enabled(device)
    prev_dtype = torch.get_autocast_dtype(device)
    torch.set_autocast_enabled(device, True)
    torch.set_autocast_dtype(device, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device, prev_enabled)
        torch.set_autocast_dtype(device, prev_dtype)


def observe(call: Callable[[], Any]) -> Observation:
    """Run ``call``, recording the casts, the first re-dispatched op and the casts of its
    output; never raises."""
    obs = Observation()

    def handler(func, args, kwargs):
        cast = _cast(func, args, kwargs)
        if cast is not None:
            label, src, dst = cast
            if not obs.reached:
                obs.casts.append((label, dtype_name(src), dtype_name(dst)))
            elif label == OUTPUT_LABEL:
                obs.output_casts.append((label, dtype_name(src), dtype_name(dst)))
            return ProbeTensor(args[0].shape, dst, args[0].probe_device, label=label)
        redispatched = not obs.reached
        if redispatched:
            obs.op = op_name(func)
            obs.args = describe(bind(func._schema, args, kwargs))
        try:
            out = _meta_output(func, args, kwargs)
        except Exception:  # no meta kernel for these arguments: what follows is not seen
            raise _Stop from None
        if redispatched:
            obs.accepted = True
            for t in _tensors(out):
                t.label = OUTPUT_LABEL
        return out

    try:
        _run_armed(handler, call)
    except _Stop:
        pass
    except Exception as exc:  # the op's own error is evidence (banned ops raise here)
        if not obs.reached:  # a failure after the re-dispatch does not undo what was seen
            obs.error = f"{type(exc).__name__}: {exc}".strip()
    return obs


# Appended to the last op of a traced chain: what makes autocast's policy for the op not
# decide the dtype it runs in, when the call reached it that way (see trace_ops).
FLOAT64_MARK = "@float64"
EXPLICIT_DTYPE_MARK = "@explicit_dtype"
NO_FLOAT_MARK = "@no_float"


def trace_ops(call: Callable[[], Any], device: str = "cpu", errors: list[BaseException] | None = None,
              dependence: DeviceDependence | None = None) -> tuple[list[tuple[str, ...]], bool]:
    """The ops a call reaches, each as its chain of callers ending in the op, and whether
    the call completed; never raises (what the call raised is appended to ``errors``).

    Composite ops are followed into their decomposition, as eager mode on ``device`` does;
    every other op continues with an output computed on the meta device, so the call goes on
    to the ops after it. The last op of a chain is marked where autocast's policy would not
    decide its dtype: reached with only float64 inputs (FLOAT64_MARK: autocast never casts
    float64, torch.float_power casts to it first), with no floating input at all
    (NO_FLOAT_MARK: nothing to cast; torch.nanmean sums a mask), or given a ``dtype``
    (EXPLICIT_DTYPE_MARK: the op runs in it, whatever autocast does to its inputs;
    cross_entropy passes log_softmax its input's dtype). What the call asked of the device
    is noted in ``dependence``.
    """
    reached: list[tuple[str, ...]] = []

    def on_op(stack, func, args, kwargs):
        reached.append((*stack[:-1], stack[-1] + reach_mark(func, args, kwargs)))

    dependence = dependence if dependence is not None else DeviceDependence()
    try:
        run_traced(call, device, on_op, dependence=dependence)
    except Exception as exc:  # reaching an op is the fact we want; failing later does not undo it
        if any(m in str(exc) for m in BUILD_LACKS_DEVICE):
            dependence.asked_device = True
        if errors is not None:
            errors.append(exc)
        return reached, False
    return reached, True


def reach_mark(func, args, kwargs) -> str:
    """How trace_ops marks an op reached with these arguments ("" for none; see there)."""
    tensors = _tensors((args, kwargs))
    floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
    if not floats and not any(t.dtype.is_complex for t in tensors):
        return NO_FLOAT_MARK
    if floats and all(d == torch.float64 for d in floats):
        return FLOAT64_MARK
    if passed_dtype(func, args, kwargs) is not None:
        return EXPLICIT_DTYPE_MARK
    return ""


_DTYPE_ARGUMENT: dict[Any, int | None] = {}  # op overload -> position of its `dtype` argument


def passed_dtype(func, args, kwargs) -> torch.dtype | None:
    """The op's ``dtype`` argument in this call, if it has one and it is given."""
    if func not in _DTYPE_ARGUMENT:
        _DTYPE_ARGUMENT[func] = next((i for i, a in enumerate(func._schema.arguments) if a.name == "dtype"), None)
    index = _DTYPE_ARGUMENT[func]
    if index is None:
        return None
    return args[index] if index < len(args) else kwargs.get("dtype")


def run_traced(call: Callable[[], Any], device: str, on_op: Callable, on_output: Callable | None = None,
               dependence: DeviceDependence | None = None) -> None:
    """Run ``call`` with every op on a ProbeTensor seen at the Python key: ``on_op(stack, func,
    args, kwargs)`` first (``stack``: the ops' names, callers first, ending in this one), then the
    op runs as eager mode on ``device`` would (its C++ composite kernel, unless the device has a
    kernel of its own; else on meta), then ``on_output(stack, func, args, kwargs, out)``.
    Raises what the call raises. Autocast, where the caller switched it on, acts above all this.

    ``dependence`` gets what of the call's path another device could change: whether it read a
    ProbeTensor's device, passed a device to an op, initialised a device or found this build
    lacking one's support (``asked_device``), and the composite ops it met (followed or not as
    the device has a kernel of its own). A call that asks neither takes this path on every device.
    """
    from .dispatcher import has_device_kernel

    dependence = dependence if dependence is not None else DeviceDependence()
    stack: list[str] = []
    calls = [0]  # ops seen so far

    def handler(func, args, kwargs):
        name = op_name(func)
        stack.append(name)
        calls[0] += 1
        try:
            on_op(stack, func, args, kwargs)
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
            if composite:
                dependence.composites.add(name)
            if composite and not has_device_kernel(name, device):
                # The C++ composite kernel, as eager mode runs it; not func.decompose(), which
                # prefers a Python decomposition (F.interpolate would reach _unsafe_index, not
                # the upsample_* op eager CUDA calls). Factories it calls with the device reach
                # the mode again (torch pops a mode while its handler runs).
                calls_before = calls[0]
                try:
                    with _DeviceWatch(device, dependence), _autocast_as_outside(stack, outside, device):
                        out = func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
                except RuntimeError as exc:
                    # A composite with TensorOptions (to.dtype_layout) guards the device first,
                    # which a build without the device cannot do: nothing below it was reached.
                    if "is not linked with support for" not in str(exc) or calls[0] != calls_before:
                        raise
                    dependence.asked_device = True
                    out = _meta_output(func, args, kwargs)
            else:
                out = _data_dependent(func, args, kwargs)
            if on_output is not None:
                on_output(stack, func, args, kwargs, out)
            return out
        finally:
            stack.pop()

    outside: dict = {}

    def armed_call():
        # The dispatch state the call starts in (autograd excluded, autocast as the caller set it).
        outside["tls"] = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())
        outside["autocast"] = torch.is_autocast_enabled(device)
        return call()

    with _lazy_inits_watched(device, dependence), _DeviceWatch(device, dependence):
        _run_armed(handler, armed_call, dependence)


def _autocast_key(device: str) -> str:
    return "Autocast" + ("PrivateUse1" if device == "privateuseone" else device.upper())


@contextlib.contextmanager
def _autocast_as_outside(stack: list[str], outside: dict, device: str):
    """Autocast for the ops a composite calls, as in eager mode. torch runs __torch_dispatch__
    with autocast off; eager mode reaches a composite with no autocast kernel of its own (arccos)
    with autocast on, so the ops it calls (acos) meet their autocast kernels. Under an op that
    has one (linear), autocast stays off: its kernel turned it off for what it calls."""
    key = _autocast_key(device)
    if not outside.get("autocast") or any(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.split("@")[0], key) for op in stack):
        yield
        return
    include, exclude = outside["tls"]
    previous = torch.is_autocast_enabled(device)
    torch.set_autocast_enabled(device, True)
    try:
        with torch._C._ForceDispatchKeyGuard(include, exclude):
            yield
    finally:
        torch.set_autocast_enabled(device, previous)


def _data_dependent(func, args, kwargs):
    """The op's output from meta; an answer that needs the values (``aten::equal``, which a
    composite such as cov asks before it goes on) is False, the branch values alone decide."""
    try:
        return _meta_output(func, args, kwargs)
    except NotImplementedError:
        returns = func._schema.returns
        if len(returns) == 1 and isinstance(returns[0].type, torch._C.BoolType):
            return False
        raise


# What a build without the device says when Python or C++ code needs the device's own support
# (a device guard, a DispatchStub kernel), where eager mode on the device would go on.
BUILD_LACKS_DEVICE = ("is not linked with support for", "An unexpected device type was provided",
                      "not compiled with")


class _DeviceWatch(TorchDispatchMode):
    """Sees every op of a traced call. One given a device (``torch.zeros(n, device=x.device)``
    in Python, ``at::empty(..., input.options())`` in a C++ composite, ``x.to("cuda")``) is
    noted in ``dependence``; a factory on the traced device, which this build has no kernels
    for (any but cpu), makes ProbeTensors there, shaped on meta. Every other op goes on to the
    ProbeTensor's handler, or runs for real."""

    def __init__(self, device: str, dependence: DeviceDependence):
        super().__init__()
        self.device = device
        self.dependence = dependence

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _DEVICE_OF:  # noted by the ProbeTensor
            return func(*args)
        # Ops take a device as an argument of their own (no schema has a list of them).
        if any(isinstance(v, torch.device) for v in (*args, *kwargs.values())):
            self.dependence.asked_device = True
        device = kwargs.get("device")
        if (device is None or self.device in ("cpu", "meta") or torch.device(device).type != self.device
                or any(isinstance(t, ProbeTensor) for t in _tensors((args, kwargs)))):
            return func(*args, **kwargs)
        out = func(*args, **{**kwargs, "device": "meta"})
        return tree_map(lambda v: ProbeTensor(v.shape, v.dtype, device) if isinstance(v, torch.Tensor) else v, out)


@contextlib.contextmanager
def _lazy_inits_watched(device: str, dependence: DeviceDependence):
    """Each device module's ``_lazy_init`` noted in ``dependence`` when Python code calls it
    (``torch.cuda.current_device()``): the traced device's answered as done (it would fail
    without one), every other device's run as it is (failing in a build without it)."""
    _answer_lazy_inits_in_cpp()
    patched = []
    for name, module in _device_modules():
        original = module._lazy_init

        def lazy_init(original=original, traced=name == device):
            dependence.asked_device = True
            if not traced:
                original()

        patched.append((module, original))
        module._lazy_init = lazy_init
    try:
        yield
    finally:
        for module, original in patched:
            module._lazy_init = original


_DEVICE_MODULES: list[tuple[str, Any]] | None = None


def _device_modules() -> list[tuple[str, Any]]:
    """(device, module) for autocast's devices whose module initialises lazily (torch.cuda)."""
    global _DEVICE_MODULES
    if _DEVICE_MODULES is None:
        from .dispatcher import autocast_devices
        modules = [(d, getattr(torch, d, None)) for d in autocast_devices()]
        _DEVICE_MODULES = [(d, m) for d, m in modules if callable(getattr(m, "_lazy_init", None))]
    return _DEVICE_MODULES


_CPP_LAZY_INITS_ANSWERED = False


def _answer_lazy_inits_in_cpp() -> None:
    """C++ (a factory's ``device=``, ``x.cuda()``) calls a device module's ``_lazy_init`` once
    and takes the device as initialised for the rest of the process once it returned. Answered
    here for every such device, once, before the first trace: every trace then meets the same
    C++ state, whichever devices this process traced before (a later trace of ``x.xpu()`` on
    mtia would otherwise depend on whether xpu had been traced first)."""
    global _CPP_LAZY_INITS_ANSWERED
    if _CPP_LAZY_INITS_ANSWERED:
        return
    _CPP_LAZY_INITS_ANSWERED = True
    for name, module in _device_modules():
        original, module._lazy_init = module._lazy_init, lambda: None
        try:
            torch.empty(0, device=name)
        except Exception:  # the initialisation is done; this build has no kernel to make it
            pass
        finally:
            module._lazy_init = original


# Meta kernels run through Python refs and are slow; the same (op, shapes, arguments)
# recurs across thousands of traced calls, so each result is computed once.
_META_CACHE: dict[str, Any] = {}


def _meta_output(func, args, kwargs):
    device = next(a.probe_device for a in _tensors((args, kwargs)) if isinstance(a, ProbeTensor))
    key = op_name(func) + repr(tree_map(
        lambda v: ("T", tuple(v.shape), v.dtype, v.stride()) if isinstance(v, torch.Tensor) else v,
        (args, kwargs)))
    if key not in _META_CACHE:
        def to_meta(v):
            if isinstance(v, torch.device):  # new_ones(..., device=x.device) and the like
                return torch.device("meta")
            if isinstance(v, torch.Tensor):
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            return v
        try:
            out = func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))
            _META_CACHE[key] = tree_map(
                lambda v: _TensorMeta(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v, out)
        except Exception as exc:
            _META_CACHE[key] = exc
    cached = _META_CACHE[key]
    if isinstance(cached, Exception):
        raise cached
    return tree_map(lambda v: ProbeTensor(v.shape, v.dtype, device)
                    if isinstance(v, _TensorMeta) else v, cached)


@dataclass(frozen=True)
class _TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _tensors(tree):
    return [v for v in tree_leaves(tree) if isinstance(v, torch.Tensor)]


def _run_armed(handler, call, dependence: DeviceDependence | None = None):
    previous = _RECORDER.handler, _RECORDER.dependence
    _RECORDER.handler, _RECORDER.dependence = handler, dependence
    try:
        # Without autograd, views need no ADInplaceOrView kernel either (it would make a
        # ProbeTensor from the Python key a differentiable view, and read its device).
        with torch._C._AutoDispatchBelowADInplaceOrView():
            try:
                call()
            except BaseException as exc:
                # The failed call's frames can hold torch's own dispatch-key guards (public
                # callables such as Tensor.index, through functorch.dim, make them). Freed
                # later by the cycle collector, they would exclude autograd again for the
                # rest of the process; freed now, they restore what this `with` set.
                traceback.clear_frames(exc.__traceback__)
                raise
    finally:
        _RECORDER.handler, _RECORDER.dependence = previous
