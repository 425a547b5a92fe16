"""Assemble policy tables: one per device, in the JSON shape the linter reads."""

from __future__ import annotations

import datetime
import importlib
import sys
import traceback
from typing import Callable

import torch

from .. import __version__
from . import classify, device_only, execute, simulate
from .dispatcher import autocast_devices, matches, ops_with_autocast_kernel
from .dtypes import supported_dtypes
from .intercept import EXPLICIT_DTYPE_MARK, FLOAT64_MARK, dtype_name
from .spellings import PublicApiTraces, spellings_for

MODES = ("auto", "simulate", "execute")


class ProbeUsageError(ValueError):
    """Bad input from the user: the CLI turns it into exit code 2."""


def device_present(device: str) -> bool:
    if device == "cpu":
        return True
    module = getattr(torch, device, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available and is_available())


def resolve_devices(requested: str) -> list[str]:
    known = autocast_devices()
    if requested == "all":
        return known
    if requested not in known:
        raise ProbeUsageError(
            f"unknown device {requested!r}: this torch ({torch.__version__}) has autocast for "
            + ", ".join(known) + " (or 'all')")
    return [requested]


def resolve_dtype(device: str, dtype: str | None) -> torch.dtype:
    if dtype is None:
        return torch.get_autocast_dtype(device)
    verdicts, _ = supported_dtypes(device)
    if verdicts.get(dtype) != "enabled":
        accepted = [d for d, v in verdicts.items() if v == "enabled"]
        raise ProbeUsageError(
            f"autocast on {device} does not support dtype {dtype!r} "
            f"({verdicts.get(dtype, 'not a floating dtype')}); it accepts: {', '.join(accepted)}")
    return getattr(torch, dtype)


# The user's Python names for the ops of the modules ``--import`` imported: op name (no
# overload) -> ``mypkg.ops.fused_mm`` and the like. Filled by ``import_extensions``.
_imported_names: dict[str, set[str]] = {}
_imported_modules: list[str] = []
# The ops those imports defined: torch's public API cannot reach them.
_imported_ops: set[str] = set()


def import_extensions(modules: tuple[str, ...]) -> None:
    before = set(sys.modules)
    ops_before = set(torch._C._dispatch_get_all_op_names())
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # whatever the module's own code raises, SystemExit too
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise ProbeUsageError(f"--import {name}: {_import_failure(exc)}") from None
    _imported_modules[:] = list(modules)
    _imported_ops.clear()
    _imported_ops.update(set(torch._C._dispatch_get_all_op_names()) - ops_before)
    _imported_names.clear()
    # The modules the imports brought in, and those named (already imported or not) with
    # their submodules: where the project's own ops get their Python names.
    roots = tuple(modules)
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name not in before or module_name in roots
                                  or module_name.startswith(tuple(r + "." for r in roots))):
            continue
        for qualname, spelling in _python_names_in(module_name, module):
            _imported_names.setdefault(qualname, set()).add(spelling)


def _python_names_in(module_name: str, module) -> list[tuple[str, str]]:
    """(``ns::op``, Python name) for each op object a module holds: the functions
    ``torch.library.custom_op`` made (under the module's name for them, and where their
    function was defined), and ``torch.ops.ns.op`` handles kept under another name."""
    from torch._library.custom_ops import CustomOpDef
    from torch._ops import OpOverload, OpOverloadPacket

    found = []
    try:
        attributes = list(vars(module).items())
    except TypeError:
        return found
    for attr, value in attributes:
        if attr.startswith("__"):
            continue
        if isinstance(value, CustomOpDef):
            found.append((value._qualname, f"{module_name}.{attr}"))
            init = getattr(value, "_init_fn", None)
            defined_in = getattr(init, "__module__", None)
            if defined_in and "<" not in getattr(init, "__qualname__", "<"):
                found.append((value._qualname, f"{defined_in}.{init.__qualname__}"))
        elif isinstance(value, OpOverloadPacket):
            found.append((value._qualified_op_name, f"{module_name}.{attr}"))
        elif isinstance(value, OpOverload) and value.name().endswith(".default"):
            found.append((value.name()[: -len(".default")], f"{module_name}.{attr}"))
    return [(q, s) for q, s in found if not q.startswith("aten::")]


def _import_failure(exc: BaseException) -> str:
    """``ErrorType: message`` of a failed import, with the module's line where it was raised."""
    said = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    if isinstance(exc, ModuleNotFoundError):
        return said or text
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename]
    if own:
        return f"{text} ({own[-1].filename}:{own[-1].lineno})"
    return text


def _spellings(op: str, found: dict[str, list[str]]) -> list[str]:
    names = list(found.get(op, []))
    namespace, _, base = op.split(".")[0].partition("::")
    if namespace != "aten":  # extension ops are called through torch.ops
        names.append(f"torch.ops.{namespace}.{base}")
        # and by the names the imported modules give them (custom_op functions)
        names += sorted(_imported_names.get(f"{namespace}::{base}", set()) - set(names))
    return names


def _probe_one(op, device, lowp, simulated: bool, executed: bool) -> dict:
    entry: dict = {"op": op.full}
    verdict = simulate.probe_op(op, device, lowp) if simulated else None
    if executed:
        run, outputs = execute.probe_op(op, device, lowp)
        found = []  # what the execution shows that the verdict does not say
        if verdict is None:
            verdict = run
            if outputs:
                verdict.evidence["output_dtypes"] = outputs
        elif run.policy is None:
            verdict.evidence["execute"] = {"skipped": run.reason}
        else:
            verdict.evidence["execute"] = {"policy": run.policy, "output_dtypes": outputs}
            if run.cast_back:
                verdict.evidence["execute"]["cast_back"] = True
            if run.policy != verdict.policy:
                found.append(f"simulated {verdict.policy}, executed {run.policy}")
            if run.cast_back != verdict.cast_back:
                found.append(f"simulated cast_back {verdict.cast_back}, executed {run.cast_back}")
        if verdict.policy is not None:
            found += classify.unexplained_outputs(verdict, outputs, dtype_name(lowp))
        if found:
            entry["disagreement"] = "; ".join(found)
    entry["policy"] = verdict.policy
    if verdict.cast_back:
        entry["cast_back"] = True
    entry["evidence"] = verdict.evidence
    if verdict.policy is None:
        entry["reason"] = verdict.reason
    return entry


def build_table(device: str, lowp: torch.dtype, mode: str, patterns: tuple[str, ...],
                traces: dict) -> dict:
    """``auto`` simulates every op and, where the device is present, also executes each one
    and records any disagreement; ``execute`` only executes; ``simulate`` only simulates."""
    present = device_present(device)
    simulated = mode != "execute"
    executed = mode == "execute" or (mode == "auto" and present)
    ops = ops_with_autocast_kernel(device, patterns)
    wanted = {op.full for op in ops}
    spellings = spellings_for(traces, wanted)
    float64_spellings = spellings_for(traces, wanted, FLOAT64_MARK)
    explicit_dtype_spellings = spellings_for(traces, wanted, EXPLICIT_DTYPE_MARK)
    entries = []
    for op in ops:
        try:
            entry = _probe_one(op, device, lowp, simulated, executed)
        except Exception as exc:  # one op that breaks the interception must not end the run
            entry = {"op": op.full, "policy": None, "evidence": {},
                     "reason": f"probe crashed: {type(exc).__name__}: {exc}"}
        entry["python"] = _spellings(op.full, spellings)
        if op.full in float64_spellings:
            # They cast to float64 before the op: autocast leaves it alone, it runs in float64.
            entry["python_float64"] = float64_spellings[op.full]
        if op.full in explicit_dtype_spellings:
            # They pass the op a dtype (cross_entropy gives log_softmax its input's): it runs
            # in that one, whatever autocast does to its inputs.
            entry["python_explicit_dtype"] = explicit_dtype_spellings[op.full]
        entries.append(entry)
    probed_ops = {e["op"] for e in entries}
    entries += device_only.supplement(device, probed_ops, lambda op: not patterns or matches(op, patterns))
    entries.sort(key=lambda e: e["op"])
    verdicts, note = supported_dtypes(device)
    table = {
        "torch_version": torch.__version__.split("+")[0],
        "torch_build": torch.__version__,
        "device": device,
        "dtype": dtype_name(lowp),
        "default_dtype": dtype_name(torch.get_autocast_dtype(device)),
        "supported_dtypes": [d for d, v in verdicts.items() if v == "enabled"],
        # Device types torch.autocast accepts at all (a "cuda:0" index is allowed too).
        "autocast_devices": sorted(torch._C._autocast_supported_devices()),
        "dtype_checks": verdicts,
        "mode": "+".join(m for m, on in (("simulate", simulated), ("execute", executed)) if on),
        "amplint_version": __version__,
        "generated": datetime.date.today().isoformat(),
        "counts": {
            "ops": len(entries),
            "unclassified": sum(e["policy"] is None for e in entries),
            "disagreements": sum("disagreement" in e for e in entries),
        },
        "ops": entries,
    }
    if note:
        table["dtype_checks_note"] = note
    if getattr(traces, "traced_on_cpu", None):
        # No call of these completed on the device only because this build lacks its support:
        # their spellings are as traced on cpu.
        table["spellings_traced_on_cpu"] = list(traces.traced_on_cpu)
    if _imported_modules:  # a table of a project's own ops, for [tool.amplint] policies
        table["imports"] = list(_imported_modules)
    return table


_PUBLIC_API_TRACES: dict[tuple, PublicApiTraces] = {}


def traced(device: str) -> dict:
    """The public API's traces on ``device``, shared with the other devices traced in this
    process where they do not depend on the device (see PublicApiTraces); traced again for
    other torch ops (an --import that registers ops, or patches torch)."""
    key = (len(torch._C._dispatch_get_all_op_names()), tuple(_imported_modules))
    return _PUBLIC_API_TRACES.setdefault(key, PublicApiTraces()).traces(device)


def probe(devices: list[str], dtype: str | None, mode: str, patterns: tuple[str, ...],
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """One table per device. ``progress(done, total)`` counts the public-API trace and each
    device as one step."""
    total = len(devices) + 1
    # Bad requests are said before the long work.
    lowps = {device: resolve_dtype(device, dtype) for device in devices}
    absent = [device for device in devices if mode == "execute" and not device_present(device)]
    if absent:
        raise ProbeUsageError(f"--mode execute needs a {absent[0]} device, and none is present here")
    # Which public calls reach which ops depends on the device (torch.norm takes another path
    # on mps, at::lstm another on cpu): traced per device where the path can differ (see
    # PublicApiTraces), unless every op asked for is one the --import modules defined
    # (`--ops 'mylib::*'`).
    selected = {op.full for d in devices for op in ops_with_autocast_kernel(d, patterns)}
    untraced = selected and selected <= _imported_ops
    tables = []
    for device in devices:
        if progress:
            progress(len(tables) + 1, total)
        traces = {} if untraced else traced(device)
        tables.append(build_table(device, lowps[device], mode, patterns, traces))
    if progress:
        progress(total, total)
    return tables
