"""Assemble policy tables: one per device, in the JSON shape the linter reads."""

from __future__ import annotations

import datetime
import importlib
import traceback
from typing import Callable

import torch

from .. import __version__
from . import device_only, execute, simulate
from .dispatcher import autocast_devices, matches, ops_with_autocast_kernel
from .dtypes import supported_dtypes
from .intercept import dtype_name
from .spellings import spellings_for, trace_public_api

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


def import_extensions(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # whatever the module's own code raises, SystemExit too
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise ProbeUsageError(f"--import {name}: {_import_failure(exc)}") from None


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
    return names


def _probe_one(op, device, lowp, simulated: bool, executed: bool) -> dict:
    entry: dict = {"op": op.full}
    verdict = simulate.probe_op(op, device, lowp) if simulated else None
    if executed:
        run, outputs = execute.probe_op(op, device, lowp)
        if verdict is None:
            verdict = run
            if outputs:
                verdict.evidence["output_dtypes"] = outputs
        elif run.policy is None:
            verdict.evidence["execute"] = {"skipped": run.reason}
        else:
            verdict.evidence["execute"] = {"policy": run.policy, "output_dtypes": outputs}
            if run.policy != verdict.policy:
                entry["disagreement"] = f"simulated {verdict.policy}, executed {run.policy}"
    entry["policy"] = verdict.policy
    entry["evidence"] = verdict.evidence
    if verdict.policy is None:
        entry["reason"] = verdict.reason
    return entry


def build_table(device: str, lowp: torch.dtype, mode: str, patterns: tuple[str, ...],
                traces: dict) -> dict:
    """``auto`` simulates every op and, where the device is present, also executes each one
    and records any disagreement; ``execute`` only executes; ``simulate`` only simulates."""
    present = device_present(device)
    if mode == "execute" and not present:
        raise ProbeUsageError(f"--mode execute needs a {device} device, and none is present here")
    simulated = mode != "execute"
    executed = mode == "execute" or (mode == "auto" and present)
    ops = ops_with_autocast_kernel(device, patterns)
    spellings = spellings_for(traces, {op.full for op in ops})
    float64_spellings = spellings_for(traces, {op.full for op in ops}, float64=True)
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
    return table


def probe(devices: list[str], dtype: str | None, mode: str, patterns: tuple[str, ...],
          progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """One table per device. ``progress(done, total)`` counts the public-API trace and each
    device as one step."""
    total = len(devices) + 1
    # Which public calls reach which ops does not depend on the device: trace once.
    traces = trace_public_api("cpu")
    tables = []
    for device in devices:
        if progress:
            progress(len(tables) + 1, total)
        tables.append(build_table(device, resolve_dtype(device, dtype), mode, patterns, traces))
    if progress:
        progress(total, total)
    return tables
