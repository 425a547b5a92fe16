"""Probe a present device by running real ops under ``torch.autocast``.

The same observation as the simulation (casts, then the re-dispatched op) is made by a
dispatch mode on real tensors, and every op runs for real, so the output dtypes are real.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import samples
from .classify import Verdict, classify, is_refusal
from .dispatcher import OpName
from .intercept import OUTPUT_LABEL, Observation, _cast, bind, describe, dtype_name, op_name


class _Recording(TorchDispatchMode):
    def __init__(self, labels: dict[int, str]):
        super().__init__()
        self.labels = labels
        self.obs = Observation()
        self.outputs: list[torch.Tensor] = []  # the re-dispatched op's, alive so their ids stay theirs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        cast = _cast(func, args, kwargs)
        redispatched = cast is None and self.obs.op is None
        if redispatched:  # noted before it runs: a kernel that fails was still reached
            self.obs.op = op_name(func)
            self.obs.args = describe(bind(func._schema, args, kwargs))
        out = func(*args, **kwargs)
        if redispatched:
            self.outputs = [v for v in tree_leaves(out) if isinstance(v, torch.Tensor)]
        elif cast is not None:
            _, src, dst = cast
            if self.obs.op is None:
                label = self.labels.get(id(args[0]), "?")
                self.obs.casts.append((label, dtype_name(src), dtype_name(dst)))
                self.labels[id(out)] = label
            elif any(args[0] is t for t in self.outputs):
                self.obs.output_casts.append((OUTPUT_LABEL, dtype_name(src), dtype_name(dst)))
        return out


@contextlib.contextmanager
def _quiet_native_warnings():
    """Ops run on sample data print C++ deprecation and resize warnings straight to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _run(packet, sample, labels, device, lowp, autocast: bool) -> tuple[Observation, object]:
    mode = _Recording(dict(labels))
    try:
        with _quiet_native_warnings(), torch.autocast(device, dtype=lowp, enabled=autocast), \
                torch._C._AutoDispatchBelowAutograd(), mode:
            out = packet(*sample.args, **sample.kwargs)
    except Exception as exc:
        mode.obs.error = f"{type(exc).__name__}: {exc}".strip()
        return mode.obs, None
    return mode.obs, out


def _dtypes(args: dict) -> str:
    """The dtypes of an op's tensor arguments, as ``describe`` wrote them."""
    return "/".join(sorted({v for v in tree_leaves(args) if isinstance(v, str) and "float" in v})) or "its inputs"


def probe_op(op: OpName, device: str, lowp: torch.dtype) -> tuple[Verdict, dict[str, str]]:
    """The verdict from real execution, and each configuration's real output dtype."""
    # Sample values decide some ops' errors (cholesky of a random matrix): seed for stable tables.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _probe_op(op, device, lowp)


def _probe_op(op: OpName, device: str, lowp: torch.dtype) -> tuple[Verdict, dict[str, str]]:
    labels: dict[int, str] = {}

    def make(label, dtype, shape, fill):
        t = fill(shape, dtype).to(device)
        labels[id(t)] = label
        return t

    schema, packet = op.schema(), op.packet()
    base = op.name.split("::", 1)[-1]
    last_error = "no sample could be built"
    for shape in samples.SHAPES:
        for optional_tensors in (True, False):
            labels.clear()
            try:
                configs = samples.build(schema, base, make, shape, lowp, optional_tensors)
            except ValueError as exc:
                return Verdict(None, reason=str(exc)), {}
            observed, outputs, banned = {}, {}, None
            for sample in configs:
                obs, out = _run(packet, sample, labels, device, lowp, autocast=True)
                if obs.error:
                    baseline, _ = _run(packet, sample, labels, device, lowp, autocast=False)
                    if baseline.error is None and obs.reached:
                        # Not a ban: autocast re-dispatched, and the kernel fails on the dtypes
                        # it was given (a bfloat16 LSTM on a CPU without bfloat16 support).
                        return Verdict(None, reason=f"not executable on this machine: {obs.op} fails on "
                                       f"{_dtypes(obs.args)} under autocast: {obs.error.splitlines()[0]}"), {}
                    if baseline.error is None and is_refusal(obs.error):  # refused by the autocast kernel itself
                        banned = obs.error
                    last_error = obs.error
                    break
                observed[sample.config] = obs
                first = out[0] if isinstance(out, (tuple, list)) else out
                if isinstance(first, torch.Tensor):
                    outputs[sample.config] = dtype_name(first.dtype)
            else:
                return classify(op.full, observed, dtype_name(lowp)), outputs
            if banned:
                return classify(op.full, observed, dtype_name(lowp), banned_message=banned), outputs
    return Verdict(None, reason="not executable with generated samples: " + last_error.splitlines()[0]), {}
