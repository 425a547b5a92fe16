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
from unittest import mock
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


# The label of the re-dispatched op's outputs, in an observation.
OUTPUT_LABEL = "output"


@dataclass
class Observation:
    casts: list[tuple[str, str, str]] = field(default_factory=list)  # (input, from, to)
    op: str | None = None  # the overload autocast re-dispatched to
    args: dict[str, Any] = field(default_factory=dict)  # its arguments, tensors as dtype names
    output_casts: list[tuple[str, str, str]] = field(default_factory=list)  # casts of its output, after it
    error: str | None = None

    @property
    def reached(self) -> bool:
        return self.op is not None


class ProbeTensor(torch.Tensor):
    """A tensor with metadata only; every op on it is recorded instead of run."""

    label: str

    @staticmethod
    def __new__(cls, shape, dtype, device, label=""):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device)
        t.label = label
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
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


class _Recorder:
    """Routes every op that reaches a ProbeTensor's Python key to the armed handler."""

    def __init__(self):
        self.handler: Callable | None = None

    def record(self, func, args, kwargs):
        if self.handler is None:
            raise RuntimeError("ProbeTensor used outside an observation")
        return self.handler(func, args, kwargs)


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
            return ProbeTensor(args[0].shape, dst, args[0].device, label=label)
        redispatched = not obs.reached
        if redispatched:
            obs.op = op_name(func)
            obs.args = describe(bind(func._schema, args, kwargs))
        try:
            out = _meta_output(func, args, kwargs)
        except Exception:  # no meta kernel for these arguments: what follows is not seen
            raise _Stop from None
        if redispatched:
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


# Appended to the last op of a traced chain when that op's floating inputs are all float64.
FLOAT64_MARK = "@float64"


def trace_ops(call: Callable[[], Any], device: str = "cpu",
              errors: list[BaseException] | None = None) -> tuple[list[tuple[str, ...]], bool]:
    """The ops a call reaches, each as its chain of callers ending in the op, and whether
    the call completed; never raises (what the call raised is appended to ``errors``).

    Composite ops are followed into their decomposition, as eager mode on ``device`` does;
    every other op continues with an output computed on the meta device, so the call goes on
    to the ops after it.
    """
    reached: list[tuple[str, ...]] = []

    def on_op(stack, func, args, kwargs):
        floats = [t.dtype for t in _tensors((args, kwargs)) if t.dtype.is_floating_point]
        # Autocast never casts a float64 tensor: an op reached with only float64 inputs
        # runs in float64 whatever its policy (torch.float_power casts to float64 first).
        mark = FLOAT64_MARK if floats and all(d == torch.float64 for d in floats) else ""
        reached.append((*stack[:-1], stack[-1] + mark))

    try:
        run_traced(call, device, on_op)
    except Exception as exc:  # reaching an op is the fact we want; failing later does not undo it
        if errors is not None:
            errors.append(exc)
        return reached, False
    return reached, True


def run_traced(call: Callable[[], Any], device: str, on_op: Callable, on_output: Callable | None = None) -> None:
    """Run ``call`` with every op on a ProbeTensor seen at the Python key: ``on_op(stack, func,
    args, kwargs)`` first (``stack``: the ops' names, callers first, ending in this one), then the
    op runs as eager mode on ``device`` would (its C++ composite kernel, unless the device has a
    kernel of its own; else on meta), then ``on_output(stack, func, args, kwargs, out)``.
    Raises what the call raises. Autocast, where the caller switched it on, acts above all this."""
    from .dispatcher import has_device_kernel

    stack: list[str] = []
    calls = [0]  # ops seen so far

    def handler(func, args, kwargs):
        name = op_name(func)
        stack.append(name)
        calls[0] += 1
        try:
            on_op(stack, func, args, kwargs)
            if (torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
                    and not has_device_kernel(name, device)):
                # The C++ composite kernel, as eager mode runs it; not func.decompose(), which
                # prefers a Python decomposition (F.interpolate would reach _unsafe_index, not
                # the upsample_* op eager CUDA calls). Factories it calls with the device reach
                # the mode again (torch pops a mode while its handler runs).
                calls_before = calls[0]
                try:
                    with _device_factories(device, init=False), _autocast_as_outside(stack, outside, device):
                        out = func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
                except RuntimeError as exc:
                    # A composite with TensorOptions (to.dtype_layout) guards the device first,
                    # which a build without the device cannot do: nothing below it was reached.
                    if "is not linked with support for" not in str(exc) or calls[0] != calls_before:
                        raise
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

    with _device_factories(device):
        _run_armed(handler, armed_call)


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


class _DeviceFactories(TorchDispatchMode):
    """Factories given a device this build has no kernels for (``torch.zeros(n, device=x.device)``
    in Python, ``at::empty(..., input.options())`` in a C++ composite) make ProbeTensors there,
    shaped on meta; every other op goes on to the ProbeTensor's handler, or runs for real."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if (device is None or torch.device(device).type != self.device
                or any(isinstance(t, ProbeTensor) for t in _tensors((args, kwargs)))):
            return func(*args, **kwargs)
        out = func(*args, **{**kwargs, "device": "meta"})
        return tree_map(lambda v: ProbeTensor(v.shape, v.dtype, device) if isinstance(v, torch.Tensor) else v, out)


@contextlib.contextmanager
def _device_factories(device: str, init: bool = True):
    if device in ("cpu", "meta"):  # factories there run for real (cpu) or need nothing
        yield
        return
    lazy_init = getattr(getattr(torch, device, None), "_lazy_init", None)
    # Python's factories initialise the device first (and fail without one): answered as done.
    # torch then takes the device as initialised for the rest of this process.
    patch = mock.patch(f"torch.{device}._lazy_init") if init and lazy_init else contextlib.nullcontext()
    with patch, _DeviceFactories(device):
        yield


# Meta kernels run through Python refs and are slow; the same (op, shapes, arguments)
# recurs across thousands of traced calls, so each result is computed once.
_META_CACHE: dict[str, Any] = {}


def _meta_output(func, args, kwargs):
    device = next(a.device for a in _tensors((args, kwargs)) if isinstance(a, ProbeTensor))
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


def _run_armed(handler, call):
    previous, _RECORDER.handler = _RECORDER.handler, handler
    try:
        with torch._C._AutoDispatchBelowAutograd():
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
        _RECORDER.handler = previous
