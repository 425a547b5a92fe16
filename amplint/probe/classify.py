"""Name what an autocast kernel did, with PyTorch's own CastPolicy names, from observations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .intercept import Observation

POLICIES = (
    "lower_precision_fp",
    "fp32",
    "fp32_set_opt_dtype",
    "fp32_append_dtype",
    "promote",
    "banned",
)


@dataclass
class Verdict:
    policy: str | None
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why no policy could be named


def _casts_to(obs: Observation | None, dtype: str) -> list[list[str]]:
    if obs is None or not obs.reached:
        return []
    return [[name, src, dst] for name, src, dst in obs.casts if dst == dtype and src != dst]


def _redispatch(obs: Observation) -> dict[str, Any]:
    return {"op": obs.op, "args": obs.args}


def classify(op: str, observed: dict[str, Observation], lowp: str,
             banned_message: str | None = None) -> Verdict:
    """``observed`` maps an input configuration (see samples) to what autocast did with it."""
    if banned_message is not None:
        return Verdict("banned", {"message": banned_message})

    fp32_in, lowp_in = observed.get("fp32"), observed.get("lowp")
    mixed, lowp_dtype = observed.get("mixed"), observed.get("lowp_dtype")
    if lowp_in is None or not lowp_in.reached:
        return Verdict(None, reason="the op was never re-dispatched with these arguments")

    # fp32_append_dtype: the kernel calls another overload, appending dtype=float32.
    if lowp_in.op != op and lowp_in.args.get("dtype") == "float32":
        return Verdict("fp32_append_dtype", {
            "input": "all " + lowp, "redispatch": _redispatch(lowp_in)})

    if fp32_in is not None and (cast := _casts_to(fp32_in, lowp)):
        return Verdict("lower_precision_fp", {
            "input": "all float32", "casts": cast, "redispatch": _redispatch(fp32_in)})

    if cast := _casts_to(lowp_in, "float32"):
        return Verdict("fp32", {
            "input": "all " + lowp, "casts": cast, "redispatch": _redispatch(lowp_in)})

    if lowp_in.args.get("dtype") == "float32":
        evidence = {"input": "all " + lowp + ", dtype=None", "casts": [],
                    "redispatch": _redispatch(lowp_in)}
        if lowp_dtype is not None and lowp_dtype.reached:
            # An explicit dtype is kept: what separates set_opt_dtype from a forced cast.
            evidence["explicit_dtype_kept"] = lowp_dtype.args.get("dtype") == lowp
        return Verdict("fp32_set_opt_dtype", evidence)

    if mixed is not None and (cast := _casts_to(mixed, "float32")):
        return Verdict("promote", {
            "input": "float32 and " + lowp, "casts": cast, "redispatch": _redispatch(mixed),
            "all_lowp_casts": _casts_to(lowp_in, "float32")})

    return Verdict(None, reason="autocast made no observable change for any input configuration")
