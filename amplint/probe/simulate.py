"""Probe one device by observation at the dispatcher: nothing executes."""

from __future__ import annotations

import torch

from . import samples
from .classify import Verdict, classify, is_refusal
from .dispatcher import OpName
from .intercept import ProbeTensor, autocast_switched_on, dtype_name, observe


def probe_op(op: OpName, device: str, lowp: torch.dtype) -> Verdict:
    def make(label, dtype, shape, _fill):  # metadata only: no values
        return ProbeTensor(shape, dtype, device, label=label)

    try:
        schema = op.schema()
        packet = op.packet()
    except (RuntimeError, AttributeError) as exc:
        return Verdict(None, reason=f"no callable overload: {exc}")
    base = op.name.split("::", 1)[-1]
    last_error = "no sample could be built"
    for shape in samples.SHAPES:
        try:
            configs = samples.build(schema, base, make, shape, lowp)
        except ValueError as exc:
            return Verdict(None, reason=str(exc))
        observed, banned = {}, None
        for sample in configs:
            with autocast_switched_on(device, lowp):
                obs = observe(lambda: packet(*sample.args, **sample.kwargs))
            if obs.error:
                # A ban: the op accepts these arguments without autocast, and its autocast
                # kernel refuses them (not a sample the kernel cannot even read, as a string
                # given for a dimension's name).
                baseline = observe(lambda: packet(*sample.args, **sample.kwargs))
                if baseline.accepted and is_refusal(obs.error):
                    banned = obs.error
                    break
                last_error = obs.error
                break
            observed[sample.config] = obs
        else:
            return classify(op.full, observed, dtype_name(lowp))
        if banned:
            return classify(op.full, observed, dtype_name(lowp), banned_message=banned)
    return Verdict(None, reason=last_error.splitlines()[0])
