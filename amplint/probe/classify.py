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
    cast_back: bool = False  # the kernel casts the op's output back to its input's dtype


# The real-valued dtype an op's output has for the dtype it runs in (an fft's complex64 is float32).
_REAL = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}


def expected_output(policy: str | None, cast_back: bool, config: str, lowp: str) -> str | None:
    """The output dtype a policy predicts for an input configuration (see samples), where it
    predicts one: the dtype the op runs in, or with ``cast_back`` the inputs' own."""
    if policy == "lower_precision_fp" and config == "fp32":
        return "float32" if cast_back else lowp
    if policy in ("fp32", "fp32_set_opt_dtype", "fp32_append_dtype") and config == "lowp":
        return lowp if cast_back else "float32"
    return None


def unexplained_outputs(verdict: Verdict, outputs: dict[str, str], lowp: str) -> list[str]:
    """The real output dtypes (by configuration) that ``verdict`` does not predict."""
    found = []
    for config, real in sorted(outputs.items()):
        expected = expected_output(verdict.policy, verdict.cast_back, config, lowp)
        floating = real in _REAL or "float" in real  # an index or a rank says nothing of the dtype run in
        if expected is not None and floating and _REAL.get(real, real) != expected:
            found.append(f"{config} inputs gave {real}, {verdict.policy}"
                         f"{' with cast_back' if verdict.cast_back else ''} predicts {expected}")
    return found


def _casts_to(obs: Observation | None, dtype: str) -> list[list[str]]:
    if obs is None or not obs.reached:
        return []
    return [[name, src, dst] for name, src, dst in obs.casts if dst == dtype and src != dst]


def _redispatch(obs: Observation) -> dict[str, Any]:
    return {"op": obs.op, "args": obs.args}


def _cast_back(verdict: Verdict, obs: Observation, input_dtype: str) -> Verdict:
    """``verdict`` with what the kernel did to the op's output: cast it back to ``input_dtype``,
    the dtype of the inputs it was given (torchvision's roi_align wrapper does)."""
    back = [list(c) for c in obs.output_casts if c[2] == input_dtype and c[1] != c[2]]
    if back:
        verdict.cast_back = True
        verdict.evidence["output_casts"] = back
    return verdict


def is_refusal(message: str) -> bool:
    """Whether an error the autocast kernel raised where the op itself runs is the kernel
    refusing the op (a banned op), rather than the sample breaking one of the kernel's own
    invariants: PyTorch words a failed invariant "INTERNAL ASSERT FAILED", never a refusal."""
    return "INTERNAL ASSERT FAILED" not in message


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
        return _cast_back(Verdict("fp32_append_dtype", {
            "input": "all " + lowp, "redispatch": _redispatch(lowp_in)}), lowp_in, lowp)

    if fp32_in is not None and (cast := _casts_to(fp32_in, lowp)):
        return _cast_back(Verdict("lower_precision_fp", {
            "input": "all float32", "casts": cast, "redispatch": _redispatch(fp32_in)}), fp32_in, "float32")

    if cast := _casts_to(lowp_in, "float32"):
        return _cast_back(Verdict("fp32", {
            "input": "all " + lowp, "casts": cast, "redispatch": _redispatch(lowp_in)}), lowp_in, lowp)

    if lowp_in.args.get("dtype") == "float32":
        evidence = {"input": "all " + lowp + ", dtype=None", "casts": [],
                    "redispatch": _redispatch(lowp_in)}
        if lowp_dtype is not None and lowp_dtype.reached:
            # An explicit dtype is kept: what separates set_opt_dtype from a forced cast.
            evidence["explicit_dtype_kept"] = lowp_dtype.args.get("dtype") == lowp
        return _cast_back(Verdict("fp32_set_opt_dtype", evidence), lowp_in, lowp)

    if mixed is not None and (cast := _casts_to(mixed, "float32")):
        return Verdict("promote", {
            "input": "float32 and " + lowp, "casts": cast, "redispatch": _redispatch(mixed),
            "all_lowp_casts": _casts_to(lowp_in, "float32")})

    return Verdict(None, reason="autocast made no observable change for any input configuration")
