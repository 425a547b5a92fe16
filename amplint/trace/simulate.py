"""`amplint trace --simulate cuda`: one forward and backward of a model under CUDA's autocast
policy, on a machine without a GPU.

The probe's simulation carries over (amplint.probe): tensors that claim to live on the device and
hold metadata only (ProbeTensor), CUDA's autocast switched on although torch finds no GPU
(probe.dtypes), and meta kernels computing every output. A training step needs more, because a
CPU-only torch has no device guard for CUDA: each simulated tensor carries a *shadow*, a meta
tensor that takes its place in autograd (which needs a guard for every tensor in its graph), so
the backward runs on the shadows; the few Tensor methods whose bindings take a guard run on a
twin that claims the meta device; factories given the device reach a dispatch mode that makes
them on meta. The ops are those an eager CUDA run dispatches, with one difference: attention
(`scaled_dot_product_attention`) runs its math backend, not a GPU's flash kernel.

The Tracer watches as in a real run: module names and dtypes, ops per dtype under autocast, banned
ops (AMP008). A float32 tensor made in the forward (a factory without ``dtype=``, ``.float()`` of
a mask) that meets half activations, promoted or refused, is AMP003.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import traceback
from unittest import mock
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..probe.dtypes import _cuda_assumed_present
from ..probe.intercept import ProbeTensor, dtype_name, op_name
from .runner import TraceResult
from .tracer import Tracer, user_site, user_site_of_traceback

# With an index: `Tensor.to` asks the device guard (absent here) to fill one in.
DEVICE = torch.device("cuda", 0)
META = torch.device("meta")
# What a simulation can find: the rest needs a training loop (`amplint trace -- python train.py`).
CODES = ("AMP003", "AMP008")
_HALF = (torch.float16, torch.bfloat16)
# Autograd is excluded below its key, where __torch_dispatch__ runs; the shadows need it back.
_AUTOGRAD = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
             | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
             | torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView))


class SimulationError(Exception):
    """A --model or --input that cannot be used; the message says why."""


class SimulatedTensor(ProbeTensor):
    """A ProbeTensor on the simulated device whose ``shadow`` (meta, with the same strides) takes
    its place in autograd; it never requires grad itself. ``origin``: where a float32 tensor made
    in the forward was made (AMP003), else None. Its ops reach the simulation's dispatch mode."""

    shadow: torch.Tensor
    origin: object

    @staticmethod
    def __new__(cls, shadow: torch.Tensor, device: torch.device = None, origin=None):
        t = torch.Tensor._make_wrapper_subclass(cls, shadow.shape, strides=shadow.stride(),
                                                storage_offset=shadow.storage_offset(), dtype=shadow.dtype,
                                                device=device or DEVICE)
        t.label, t.shadow, t.origin = "", shadow, origin
        return t

    def __repr__(self) -> str:  # printing reads values, which a simulation has none of
        return f"SimulatedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def _on_twin(method):
    """``method`` as run on a twin that claims the meta device (same shadow): the Python bindings
    of these methods take a device guard first, and a CPU-only torch has none for CUDA. The ops
    inside still reach the simulation and come back as simulated CUDA tensors."""
    unbound = getattr(torch.Tensor, method)

    def call(*args, **kwargs):
        originals = {}

        def twin(v):
            if isinstance(v, SimulatedTensor) and v.device == DEVICE:
                made = SimulatedTensor(v.shadow, META, v.origin)
                originals[id(made)] = v
                return made
            return v

        def back(v):  # a twin becomes its original again; new_tensor makes a plain meta tensor
            if not isinstance(v, torch.Tensor):
                return v
            if id(v) in originals:
                return originals[id(v)]
            return v if isinstance(v, SimulatedTensor) else SimulatedTensor(v, DEVICE)

        return tree_map(back, unbound(*tree_map(twin, args), **tree_map(twin, kwargs)))

    call.__name__ = method
    return call


for _method in ("__getitem__", "__setitem__", "contiguous", "copy_", "new_tensor"):
    setattr(SimulatedTensor, _method, _on_twin(_method))


def _to(self, *args, **kwargs):
    """`Tensor.to` without the device this tensor already has (its binding takes a device guard)."""
    rest = [v.dtype if isinstance(v, torch.Tensor) else v for v in args if not _is_device(v)]
    kept = {k: v for k, v in kwargs.items() if k != "device" or not _is_device(v)}
    return torch.Tensor.to(self, *rest, **kept) if rest or kept else self


SimulatedTensor.to = _to
SimulatedTensor.cuda = lambda self, *args, **kwargs: self


def _is_device(value) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


def _to_shadow(value):
    if isinstance(value, SimulatedTensor):
        return value.shadow
    if isinstance(value, torch.Tensor):
        return value.to(META)  # a CPU tensor (a 0-dim constant) met on the device
    return META if _is_device(value) else value


@dataclass(frozen=True)
class OpRecord:
    """One op that ran under autocast, as it reached the dispatcher below the Autocast key."""

    module: str
    op: str
    inputs: tuple[str, ...]  # the dtypes of its floating tensor arguments
    output: str  # the dtype of its first tensor output ("none": no tensor)


class SimulationTracer(Tracer):
    """A Tracer that also executes the simulated tensors' ops (on their shadows), logs each op run
    under autocast, and watches float32 tensors made in the forward (AMP003)."""

    def __init__(self, codes=None, torch_version: str | None = None):
        wanted = set(CODES) if codes is None else set(codes) & set(CODES)
        super().__init__(steps=None, codes=wanted, device="cuda", torch_version=torch_version)
        self.ops: list[OpRecord] = []
        self.in_forward = False

    def dispatch(self, func, args, kwargs):
        name = op_name(func)
        if name == "aten::_local_scalar_dense":
            raise SimulationError("the model reads a tensor's value (`.item()`, `bool(t)`, `if t ...`): a "
                                  "simulation has shapes and dtypes only")
        floats = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        stray = next((t for t in floats if isinstance(t, SimulatedTensor) and t.origin is not None
                      and t.dtype == torch.float32 and t.dim() > 0), None)
        half = next((t for t in floats if t.dtype in _HALF), None)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                             torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD):
            try:
                out = func(*tree_map(_to_shadow, args), **tree_map(_to_shadow, kwargs))
            except Exception as exc:
                if stray is not None and half is not None:
                    self._stray_float32(stray, half, name, f"torch refuses it: \"{str(exc).splitlines()[0]}\"")
                raise
        first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        if stray is not None and half is not None and first is not None and first.dtype == torch.float32:
            self._stray_float32(stray, half, name, "the result is promoted to float32")
        origin = self._origin(name, args, kwargs, stray, half, first)
        if self._regions and self._regions[-1].enabled and not self._internal:
            self.ops.append(OpRecord(self._mstack[-1][1] if self._mstack else "", name,
                                     tuple(dtype_name(t.dtype) for t in floats),
                                     dtype_name(first.dtype) if first is not None else "none"))
        return self._wrap(out, args, kwargs.get("device"), origin)

    def _origin(self, name, args, kwargs, stray, half, first):
        """The origin the op's output inherits: a float32 made in the forward stays one through
        float32-only ops; a factory given no dtype, and `.float()` of a mask, start one there."""
        if first is None or first.dtype != torch.float32 or half is not None:
            return None
        if stray is not None:
            return stray.origin
        if not self.in_forward:
            return None
        tensors = [v for v in tree_leaves(args) if isinstance(v, torch.Tensor)]
        if not tensors and kwargs.get("dtype") is None:
            return user_site()
        if name == "aten::_to_copy" and not tensors[0].is_floating_point():
            return user_site()
        return None

    @staticmethod
    def _wrap(out, args, device, origin):
        own = {id(a.shadow): a for a in tree_leaves(args) if isinstance(a, SimulatedTensor)}
        target = torch.device(device) if device is not None and not _is_device(device) else DEVICE

        def one(value):
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in own:  # in-place and out= ops return their argument
                kept = own[id(value)]
                kept.origin = kept.origin or origin
                return kept
            return SimulatedTensor(value, target, origin)

        return tree_map(one, out)

    def _stray_float32(self, stray: SimulatedTensor, half: torch.Tensor, op: str, outcome: str) -> None:
        self._report("AMP003", f"a float32 tensor made in the forward meets {dtype_name(half.dtype)} activations in "
                     f"`{op}` under cuda autocast: {outcome}; give the factory `dtype=x.dtype` "
                     "(or `x.new_zeros(...)`), or cast with `.to(x.dtype)`", stray.origin)


def _data_factory(original, tracer: SimulationTracer):
    """``torch.tensor``/``torch.as_tensor`` given the simulated device: made on meta (torch would
    copy the data onto the device with its dispatch modes switched off)."""
    def call(data, *args, device=None, **kwargs):
        if not _is_device(device):
            return original(data, *args, device=device, **kwargs)
        shadow = original(data, *args, device=META, **kwargs)
        fresh = tracer.in_forward and kwargs.get("dtype") is None and shadow.dtype == torch.float32
        return SimulatedTensor(shadow, DEVICE, user_site() if fresh else None)

    return call


class _Simulation(TorchDispatchMode):
    """Runs every op that involves a simulated tensor, or makes a tensor on the simulated device
    (C++ kernels make some: batch norm's reserve space), on the shadows; the rest as it is."""

    def __init__(self, tracer: SimulationTracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        if any(isinstance(v, SimulatedTensor) or _is_device(v) for v in leaves):
            return self.tracer.dispatch(func, args, kwargs)
        return func(*args, **kwargs)


@dataclass
class SimulationResult(TraceResult):
    """A simulated step: the findings and dtype map (``tracer``), every op run under autocast
    (``tracer.ops``), and the parameters' gradient dtypes after the backward."""

    description: str = ""
    gradients: dict = field(default_factory=dict)  # dtype name -> parameters with a gradient of it

    @property
    def command_line(self) -> str:
        return self.description

    @property
    def ending(self) -> str:
        if self.error:
            return "the simulated step failed"
        grads = ", ".join(f"{n} {d}" for d, n in sorted(self.gradients.items())) or "no parameter gradients"
        return f"simulated one forward and backward on cuda ({grads})"


def simulate(model: torch.nn.Module, *inputs, dtype: torch.dtype = torch.float16, select=None,
             torch_version: str | None = None, description: str = "") -> SimulationResult:
    """Run ``model(*inputs)`` under ``torch.autocast("cuda", dtype)`` and a backward of its
    floating outputs' sum, on simulated CUDA tensors: only the inputs' shapes and dtypes are used,
    and the model's own parameters are neither read nor changed. ``select``: the codes to report
    (of AMP003 and AMP008; None: both)."""
    tracer = SimulationTracer(codes=select, torch_version=torch_version)
    result = SimulationResult(tracer, 0, description=description or f"simulate cuda: {type(model).__name__}")
    state = {name: SimulatedTensor(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)
                                   .requires_grad_(isinstance(t, torch.nn.Parameter) and t.requires_grad))
             for name, t in [*model.named_parameters(), *model.named_buffers()]}
    args = [SimulatedTensor(torch.empty(t.shape, dtype=t.dtype, device=META)) if isinstance(t, torch.Tensor) else t
            for t in inputs]
    # torch initialises CUDA before a factory given the device (and fails without one): skipped, so
    # that the factory reaches the simulation. Once skipped, this process takes CUDA as initialised.
    with tracer, _cuda_assumed_present(), mock.patch("torch.cuda._lazy_init"), \
            mock.patch("torch.tensor", _data_factory(torch.tensor, tracer)), \
            mock.patch("torch.as_tensor", _data_factory(torch.as_tensor, tracer)), _Simulation(tracer):
        try:
            tracer.in_forward = True
            with torch.autocast("cuda", dtype=dtype):
                out = torch.func.functional_call(model, state, tuple(args))
            tracer.in_forward = False
            outputs = [t.shadow for t in tree_leaves(out)
                       if isinstance(t, SimulatedTensor) and t.is_floating_point() and t.shadow.requires_grad]
            if outputs:
                sum(t.float().sum() for t in outputs).backward()
        except Exception as exc:  # the model's own failure, or one a GPU would raise too
            tracer.note_exception(exc)
            result.exit_code, result.error = 1, _user_traceback(exc)
        finally:
            tracer.in_forward = False
    for tensor in state.values():
        if tensor.shadow.grad is not None:
            name = dtype_name(tensor.shadow.grad.dtype)
            result.gradients[name] = result.gradients.get(name, 0) + 1
    return result


def _user_traceback(exc: BaseException) -> str:
    if isinstance(exc, SimulationError):
        site = user_site_of_traceback(exc.__traceback__)
        return f"amplint: the simulation stopped{f' at {site.path}:{site.row}' if site else ''}: {exc}\n"
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def op_summary(result: SimulationResult) -> list[dict]:
    """The ops run under autocast, counted by (op, input dtypes, output dtype), in first-seen
    order, with the policy the cuda table gives each op (None: no autocast kernel)."""
    from ..policy import PolicyError, load_policy

    try:
        table = load_policy("cuda", result.tracer.torch_version)
    except (PolicyError, OSError, ValueError):
        table = None
    counts = Counter((r.op, r.inputs, r.output) for r in result.tracer.ops)
    modules: dict = {}
    for r in result.tracer.ops:
        modules.setdefault((r.op, r.inputs, r.output), []).append(r.module)
    return [{"op": op, "policy": table.policy(op) if table else None, "inputs": list(inputs), "output": output,
             "count": n, "modules": sorted(set(modules[(op, inputs, output)]))}
            for (op, inputs, output), n in counts.items()]


def ops_table(result: SimulationResult) -> str:
    rows = [("op", "cuda policy", "input dtypes", "output", "count")]
    for o in op_summary(result):
        rows.append((o["op"], o["policy"] or "-", ",".join(o["inputs"]) or "-", o["output"], str(o["count"])))
    if len(rows) == 1:
        return "Ops under cuda autocast: none ran\n"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "Ops under cuda autocast:\n" + "".join(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def text(result: SimulationResult) -> str:
    from . import report

    parts = (report.findings_text(result), report.dtype_table(result), ops_table(result))
    return "\n".join(part for part in parts if part)


def full_json(result: SimulationResult) -> str:
    """Everything: findings (check's fields), the dtype map, the ops, the gradients' dtypes."""
    from ..output import json_format

    return json.dumps({
        "findings": [json_format.as_dict(d) for d in sorted(result.tracer.findings, key=lambda d: d.sort_key)],
        "modules": result.tracer.dtype_map,
        "ops": op_summary(result),
        "gradients": result.gradients,
        "error": result.error,
    }, indent=2) + "\n"


# --- --model and --input --------------------------------------------------------------------

_FACTORIES = {"randn", "rand", "zeros", "ones", "empty", "randint"}
_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
           "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
           "bool": torch.bool}
INPUT_GRAMMAR = ("FACTORY(D1, D2, ...[, dtype=DTYPE]) with FACTORY one of randn, rand, zeros, ones, empty, or "
                 "randint([LOW,] HIGH, (D1, D2, ...)); DTYPE one of " + ", ".join(_DTYPES))


def parse_input(spec: str) -> torch.Tensor:
    """An example input from ``randn(8,3,224,224)``-like text, read with `ast` (nothing is
    evaluated): a meta tensor of that shape and dtype."""
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        raise SimulationError(f"--input {spec!r} is not {INPUT_GRAMMAR}") from None
    name = _dotted(node.func) if isinstance(node, ast.Call) else None
    name = name.removeprefix("torch.") if name else None
    if name not in _FACTORIES:
        raise SimulationError(f"--input {spec!r} is not {INPUT_GRAMMAR}")
    dtype = torch.int64 if name == "randint" else torch.float32
    for keyword in node.keywords:
        value = _dotted(keyword.value)
        value = value.removeprefix("torch.") if value else None
        if keyword.arg != "dtype" or value not in _DTYPES:
            raise SimulationError(f"--input {spec!r}: only dtype= is accepted, as one of {', '.join(_DTYPES)}")
        dtype = _DTYPES[value]
    positional = node.args
    if name == "randint":
        if not 2 <= len(positional) <= 3 or not all(isinstance(_int(a), int) for a in positional[:-1]):
            raise SimulationError(f"--input {spec!r}: randint takes [LOW,] HIGH, (D1, D2, ...)")
        positional = [positional[-1]]
    if len(positional) == 1 and isinstance(positional[0], (ast.Tuple, ast.List)):
        positional = positional[0].elts
    shape = [_int(a) for a in positional]
    if not shape or any(d is None or d < 0 for d in shape):
        raise SimulationError(f"--input {spec!r}: the shape must be non-negative integers, as randn(8, 3, 224, 224)")
    return torch.empty(shape, dtype=dtype, device=META)


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _int(node) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def load_model(spec: str) -> torch.nn.Module:
    """``pkg.module:factory``: the module imported from the current folder (or sys.path), and the
    factory called with no arguments (a module instance is used as it is)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SimulationError(f"--model {spec!r} is not pkg.module:factory")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module failed to import: say how, in one line
        raise SimulationError(f"--model {spec!r}: cannot import {module_name}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise SimulationError(f"--model {spec!r}: {module_name} has no {attr}")
    if not isinstance(target, torch.nn.Module):
        if not callable(target):
            raise SimulationError(f"--model {spec!r}: {attr} is neither a module nor a factory")
        try:
            target = target()
        except Exception as exc:
            raise SimulationError(f"--model {spec!r}: {attr}() raised {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(target, torch.nn.Module):
        raise SimulationError(f"--model {spec!r}: {attr}() returned a {type(target).__name__}, not a torch.nn.Module")
    return target
