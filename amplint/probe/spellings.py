"""Which public Python calls reach which ops, found by calling them under the interception.

No list of spellings is written by hand: every public callable of torch, torch.Tensor,
torch.nn.functional, torch.linalg, torch.special and every nn module class is called with
ProbeTensors in a few argument patterns, and each op that reaches the Python key is noted.
A call that fails part-way still reached the ops it reached.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .dispatcher import has_device_kernel
from .intercept import BUILD_LACKS_DEVICE, DeviceDependence, ProbeTensor, trace_ops

SHAPES = ((4, 4), (2, 4, 4), (2, 4, 4, 4), (2, 4, 4, 4, 4), (4,))

# Operator methods worth a spelling; other dunders are protocol, not math.
_OPERATOR_DUNDERS = ("__matmul__", "__rmatmul__", "__mul__", "__rmul__", "__add__", "__radd__",
                     "__sub__", "__rsub__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__")

# Methods that are not ops and touch state outside the tensor (hooks, storage, processes).
_NOT_OPS = {"backward", "register_hook", "register_post_accumulate_grad_hook", "share_memory_",
            "pin_memory", "apply_", "map_", "map2_", "record_stream", "numpy", "tolist", "item",
            "storage", "untyped_storage", "cuda", "cpu", "to", "new_tensor", "retain_grad"}

# nn classes that only hold other modules or wrap execution.
_CONTAINERS = {"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
               "ParameterDict", "Container", "DataParallel", "Identity"}

# Constructor arguments for nn modules, tried in order: (features), (in, out), (in, out, k)...
_MODULE_CTOR_ARGS = ((), (4,), (4, 4), (4, 4, 2), (1, 4), (4, 1), (2,))

# Names of parameters that take something other than a tensor, with a value that fits SHAPES.
_PARAM_VALUES: dict[str, Any] = {
    "dim": 1, "normalized_shape": (4,), "num_groups": 1, "kernel_size": 2, "output_size": 2,
    "equation": "ij,jk->ik", "pad": (1, 1), "p": 2.0, "groups": 1, "upscale_factor": 2,
    "downscale_factor": 2, "size": 4, "n_fft": 4, "num_classes": 4, "chunks": 2, "sections": 2,
    "split_size_or_sections": 2, "dims": (0,), "shape": (16,), "repeats": 2, "k": 1,
    "maxnorm": 1.0,
}

# Calls whose op is chosen by a keyword that has a default (F.interpolate's mode): each
# variant is traced on every shape, besides the usual patterns. Keyed by the callable's or
# module class's own name; values are keyword arguments (for a module, its constructor's).
_UPSAMPLE_MODES = [{"size": 4, "mode": m} for m in
                   ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")]
_UPSAMPLE_MODES += [{"size": 4, "mode": m, "antialias": True} for m in ("bilinear", "bicubic")]
_KEYWORD_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "torch.nn.functional.interpolate": _UPSAMPLE_MODES,
    "torch.nn.functional.upsample": [v for v in _UPSAMPLE_MODES if "antialias" not in v],
    "torch.nn.Upsample": [{"size": 4, "mode": v["mode"]} for v in _UPSAMPLE_MODES if "antialias" not in v],
}
# Calls whose op depends on the input's rank (nll_loss2d for 4-d input, upsample_nearest2d):
# traced on every shape instead of stopping at the first that completes.
_EVERY_SHAPE = {"torch.nn.functional.nll_loss", "torch.nn.functional.cross_entropy", "torch.nn.NLLLoss",
                "torch.nn.CrossEntropyLoss", "torch.nn.UpsamplingNearest2d", "torch.nn.UpsamplingBilinear2d",
                "torch.nn.functional.upsample_nearest", "torch.nn.functional.upsample_bilinear"}
_INDEX_PARAMS = {"index", "indices", "target_indices"}


def public_callables() -> Iterator[tuple[str, Callable]]:
    variable_functions = torch._C._VariableFunctions
    for name in sorted(dir(torch)):
        obj = getattr(torch, name, None)
        if name.startswith("_") or not callable(obj) or inspect.isclass(obj):
            continue
        if getattr(variable_functions, name, None) is obj or getattr(obj, "__module__", "") == "torch.functional":
            yield f"torch.{name}", obj
    for name in sorted(dir(torch.Tensor)):
        if (name.startswith("_") and name not in _OPERATOR_DUNDERS) or name in _NOT_OPS:
            continue
        obj = getattr(torch.Tensor, name, None)
        if callable(obj) and not inspect.isclass(obj):
            yield f"torch.Tensor.{name}", obj
    for module_name in ("torch.nn.functional", "torch.linalg", "torch.special"):
        module = __import__(module_name, fromlist=["_"])
        for name in sorted(dir(module)):
            obj = getattr(module, name, None)
            if not name.startswith("_") and callable(obj) and not inspect.isclass(obj):
                yield f"{module_name}.{name}", obj


def public_modules() -> Iterator[tuple[str, type]]:
    for name in sorted(dir(torch.nn)):
        obj = getattr(torch.nn, name)
        if (inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and name not in _CONTAINERS
                and not name.startswith("_") and not name.startswith("Lazy")):
            yield f"torch.nn.{name}", obj


def _by_parameter_names(fn: Callable, tensor: Callable[[], torch.Tensor]) -> list[Any] | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    args = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty:
            continue
        if p.name in _INDEX_PARAMS:
            return None
        args.append(_PARAM_VALUES.get(p.name) if p.name in _PARAM_VALUES else tensor())
    return args


def _argument_patterns(fn: Callable, tensor: Callable[[], torch.Tensor],
                       shape: tuple[int, ...], device: str) -> Iterator[list[Any]]:
    named = _by_parameter_names(fn, tensor)
    if named:
        yield named
    index = ProbeTensor(shape, torch.long, device)
    yield [tensor()]
    yield [tensor(), tensor()]
    yield [tensor(), tensor(), tensor()]
    yield [tensor(), 1]
    yield [[tensor(), tensor()]]
    yield [_PARAM_VALUES["equation"], tensor(), tensor()]
    yield [tensor(), index]
    # Class targets: one index per sample, no class dimension (F.cross_entropy -> nll_loss).
    yield [tensor(), ProbeTensor(shape[:1] + shape[2:], torch.long, device)]
    yield [tensor(), 2.0, 1, 1.0]  # (input, p, dim, maxnorm): renorm
    yield [tensor(), (index,), tensor()]
    yield [tensor(), 1, index, tensor()]


@dataclass
class SpellingTrace:
    """What the calls of one public spelling reached on a device."""

    chains: set[tuple[str, ...]] = field(default_factory=set)  # each op reached, with its callers
    completed: bool = False  # some call ran to its end
    lacks_device: bool = False  # some call stopped because this build lacks the device's support
    dependence: DeviceDependence = field(default_factory=DeviceDependence)  # over all its calls


def trace_spellings(device: str, only: set[str] | None = None) -> dict[str, SpellingTrace]:
    """Each public spelling (those in ``only``) called on ``device`` as walk_public_api calls it.
    Inputs claim to live on ``device``, so Python code and C++ composites that choose their path
    by the device (torch.norm on mps, at::lstm's oneDNN layer on cpu) take the path they take
    there (autocast off: the path is the same)."""
    traced: dict[str, SpellingTrace] = {}

    def visit(spelling, call):
        found = traced.setdefault(spelling, SpellingTrace())
        errors: list[BaseException] = []
        chains, ok = trace_ops(call, device, errors, found.dependence)
        found.chains.update(chains)
        found.completed |= ok
        found.lacks_device |= any(m in str(e) for e in errors for m in BUILD_LACKS_DEVICE)
        return ok

    walk_public_api(device, visit, only=only)
    return traced


def may_differ_on(trace: SpellingTrace, traced_on: str, device: str) -> bool:
    """Whether a spelling's ``trace`` on ``traced_on`` could differ on ``device``: some call
    asked about the device, or met a composite op that one of the two devices has a kernel of
    its own for (eager mode there runs that, not the composite's decomposition)."""
    return trace.dependence.asked_device or any(
        has_device_kernel(op, device) != has_device_kernel(op, traced_on) for op in trace.dependence.composites)


class Traces(dict):
    """Spelling -> the op call chains it reaches on a device; ``traced_on_cpu``: the spellings
    that no call completed on the device because this build lacks the device's support (a
    device guard, a DispatchStub kernel), whose chains are those traced on cpu instead (the
    best this build can show)."""

    traced_on_cpu: list[str]


class PublicApiTraces:
    """The public API traced on several devices, once for what does not depend on the device.

    The first device asked is traced in full. On each other device, a spelling is traced again
    only where its trace could differ there (may_differ_on): some call asked about the device
    (read a tensor's device, passed a device to an op, initialised one, found this build lacking
    its support), or met a composite op that one of the two devices has a kernel of its own for
    and the other not. Every other spelling's calls took a path no device answer chose: its
    trace is shared.
    Traces are kept for the life of the object (tables.traced keeps one per process).
    """

    def __init__(self):
        self._first: tuple[str, dict[str, SpellingTrace]] | None = None
        self._by_device: dict[str, dict[str, SpellingTrace]] = {}
        self._on_cpu: dict[str, SpellingTrace] = {}  # spellings traced on cpu for another device

    def spelling_traces(self, device: str) -> dict[str, SpellingTrace]:
        if device not in self._by_device:
            if self._first is None:
                traced = trace_spellings(device)
                self._first = (device, traced)
            else:
                first_device, first = self._first
                again = {spelling for spelling, t in first.items() if may_differ_on(t, first_device, device)}
                traced = {**first, **trace_spellings(device, only=again)}
            self._by_device[device] = traced
        return self._by_device[device]

    def traces(self, device: str) -> Traces:
        traced = self.spelling_traces(device)
        traces = Traces({spelling: t.chains for spelling, t in traced.items()})
        traces.traced_on_cpu = [] if device == "cpu" else sorted(
            spelling for spelling, t in traced.items() if t.lacks_device and not t.completed)
        if traces.traced_on_cpu:
            on_cpu = self._by_device.get("cpu") or self._cpu_traces(set(traces.traced_on_cpu))
            for spelling in traces.traced_on_cpu:
                traces[spelling] = on_cpu[spelling].chains if spelling in on_cpu else set()
        return traces

    def _cpu_traces(self, spellings: set[str]) -> dict[str, SpellingTrace]:
        missing = spellings - set(self._on_cpu)
        if missing:
            self._on_cpu.update(trace_spellings("cpu", only=missing))
        return self._on_cpu


def walk_public_api(device: str, visit: Callable[[str, Callable[[], Any]], bool],
                    floating: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
                    only: set[str] | None = None) -> None:
    """Call every public spelling (those in ``only``) with ProbeTensors on ``device`` in the
    argument patterns the trace tries, in its order: ``visit(spelling, call)`` runs the call and
    says whether it completed. ``floating(shape)`` makes each floating input (float32 by default);
    a module runs with its parameters and buffers as ProbeTensors on the device too."""
    if floating is None:
        def floating(shape):
            return ProbeTensor(shape, torch.float32, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spelling, fn in public_callables():
            if only is not None and spelling not in only:
                continue
            # The first shape that some pattern completes with is shape enough.
            for shape in SHAPES:
                def tensor(shape=shape):
                    return floating(shape)
                completed = False
                for args in _argument_patterns(fn, tensor, shape, device):
                    completed |= visit(spelling, lambda: fn(*args))
                if completed and spelling not in _EVERY_SHAPE:
                    break
            _walk_variants(visit, spelling, lambda kw: (lambda x: fn(x, **kw)), floating)
        for spelling, cls in public_modules():
            if only is not None and spelling not in only:
                continue
            _walk_variants(visit, spelling, lambda kw: on_device(cls(**kw), device), floating)
            for ctor in _MODULE_CTOR_ARGS:
                try:
                    module = on_device(cls(*ctor), device)
                except Exception:
                    continue
                completed = False
                for shape in SHAPES:
                    x = floating(shape)
                    target = ProbeTensor(shape[:1] + shape[2:], torch.long, device)  # class targets
                    for args in ([x], [x, x], [x, x, x], [x, target]):
                        completed |= visit(spelling, lambda: module(*args))
                    if completed and spelling not in _EVERY_SHAPE:
                        break
                if completed:
                    break


def on_device(module: torch.nn.Module, device: str) -> Callable[..., Any]:
    """``module``'s forward with its parameters and buffers as ProbeTensors on ``device``, as a
    module moved there has them (at::gru refuses an input and weights on different devices)."""
    state = {name: ProbeTensor(t.shape, t.dtype, device)
             for name, t in [*module.named_parameters(), *module.named_buffers()]}
    return lambda *args: torch.func.functional_call(module, state, args)


def _walk_variants(visit, spelling: str, make: Callable[[dict], Callable], floating) -> None:
    """The keyword variants of ``spelling`` (see _KEYWORD_VARIANTS), each on every shape."""
    for kwargs in _KEYWORD_VARIANTS.get(spelling, []):
        try:
            call = make(kwargs)
        except Exception:
            continue
        for shape in SHAPES:
            x = floating(shape)
            visit(spelling, lambda: call(x))


def spellings_for(traces: dict[str, set[tuple[str, ...]]], wanted: set[str],
                  mark: str = "") -> dict[str, list[str]]:
    """Map each op in ``wanted`` (ops with an autocast kernel) to the spellings whose calls reach it.

    An op nested under another op of ``wanted`` does not count: that outer op's autocast
    kernel excludes autocast for everything it calls. An op reached in a way that trace_ops
    marks does not count either, as autocast's policy does not decide the dtype it runs in
    then: with only float64 inputs (autocast leaves float64 alone), no floating input
    (nothing to cast), or given a ``dtype`` (it runs in that one). ``mark`` (FLOAT64_MARK,
    EXPLICIT_DTYPE_MARK) returns the spellings that reach the op only so marked instead
    (``torch.float_power`` -> pow, ``F.cross_entropy`` -> log_softmax).
    """
    spellings: dict[str, set[str]] = defaultdict(set)
    for spelling, chains in traces.items():
        for chain in chains:
            op, at, chain_mark = chain[-1].partition("@")
            chain = (*chain[:-1], op)
            first = next((o for o in chain if o in wanted), None)
            if first is not None and first == op and at + chain_mark == mark:
                spellings[first].add(spelling)
    if mark:  # only the spellings that never reach the op otherwise
        plain = spellings_for(traces, wanted)
        spellings = {op: names - set(plain.get(op, [])) for op, names in spellings.items()}
        spellings = {op: names for op, names in spellings.items() if names}
    return {op: sorted(names) for op, names in spellings.items()}
