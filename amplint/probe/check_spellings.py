"""Call every Python spelling a table maps to an op under that device's autocast, simulated at
the dispatcher, and check the dtype the op runs in against the table's policy.

The inputs are chosen so that the policy and "no autocast kernel" disagree: float32 inputs for a
lower_precision_fp op (expect the autocast dtype), inputs of the autocast dtype for the fp32
family (expect float32), float32 and the autocast dtype mixed for promote (expect one dtype, the
widest), and for banned the call must fail with the kernel's message. The op is watched at the
Python key, below autocast, where it is reached not nested in another op with an autocast kernel
(the spellings' own rule, see spellings_for). A spelling that no generated call brings to its op,
or that fails before it, is reported as such, never skipped.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .intercept import ProbeTensor, autocast_switched_on, run_traced
from .spellings import walk_public_api

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
# The inputs each policy is checked with.
_CONFIG = {"lower_precision_fp": "fp32", "fp32": "lowp", "fp32_set_opt_dtype": "lowp",
           "fp32_append_dtype": "lowp", "promote": "mixed", "banned": "fp32"}


@dataclass
class Result:
    device: str
    op: str
    spelling: str
    policy: str
    status: str  # "ok", "wrong" (reached, another dtype), "not reached", "no policy"
    detail: str = ""


class _Resolved(Exception):
    """Every op the walk looks for was judged: stop walking."""


def _floats(tree) -> list[torch.dtype]:
    return [_REAL.get(t.dtype, t.dtype) for t in tree_leaves(tree)
            if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)]


def _matches(name: str, op: str, policy: str) -> bool:
    if name == op:
        return True
    # fp32_append_dtype re-dispatches to another overload of the op, with dtype=float32 appended.
    return policy == "fp32_append_dtype" and name.split(".")[0] == op.split(".")[0]


def _judge(policy: str, lowp: torch.dtype, inputs: list, outputs: list | None, bound_dtype) -> str | None:
    """None when what the op received and returned fits ``policy``; else what was seen."""
    runs_in = set(outputs) if outputs else set(inputs)
    if policy == "fp32_set_opt_dtype" and not outputs and bound_dtype is not None:
        runs_in = {bound_dtype}
    if policy == "lower_precision_fp":
        expected = {lowp}
    elif policy == "promote":
        # Given float32 and the autocast dtype, one dtype reaches the op; a spelling whose inputs
        # reach it all of one dtype (an LSTM's own outputs to stack) shows that dtype.
        if len(set(inputs)) > 1:
            return f"inputs reached the op unpromoted: {sorted(map(str, set(inputs)))}"
        expected = set(inputs) or {torch.float32}
    else:
        expected = {torch.float32}
    if not runs_in:
        return "the op had no floating input or output to judge"
    if runs_in != expected:
        return (f"runs in {', '.join(sorted(str(d).removeprefix('torch.') for d in runs_in))}, "
                f"{policy} predicts {str(next(iter(expected))).removeprefix('torch.')}")
    return None


def check_table(table: dict, only: set[str] | None = None) -> list[Result]:
    """One Result per (op, spelling) of ``table`` (spellings in ``only``, where given)."""
    device, lowp = table["device"], getattr(torch, table["dtype"])
    entries = [e for e in table["ops"] if e.get("python")]
    wanted = {e["op"] for e in table["ops"] if e.get("policy")}
    results: list[Result] = []
    todo: dict[tuple[str, str], list[dict]] = defaultdict(list)  # (spelling, config) -> entries
    for e in entries:
        for spelling in e["python"]:
            if only is not None and spelling not in only:
                continue
            if e.get("policy") not in _CONFIG:
                results.append(Result(device, e["op"], spelling, str(e.get("policy")), "no policy"))
                continue
            if e.get("evidence", {}).get("supplement"):
                results.append(Result(device, e["op"], spelling, e["policy"], "not reached",
                                      "supplement: this build has no autocast kernel for the op"))
                continue
            todo[(spelling, _CONFIG[e["policy"]])].append(e)
    for (spelling, config), group in sorted(todo.items(), key=lambda kv: kv[0]):
        results += _check_spelling(device, lowp, spelling, config, group, wanted)
    return results


def _check_spelling(device, lowp, spelling, config, group, wanted) -> list[Result]:
    verdicts: dict[str, Result] = {}
    errors: list[str] = []
    count = [0]

    def floating(shape):
        count[0] += 1
        dtype = lowp if config == "lowp" or (config == "mixed" and count[0] > 1) else torch.float32
        return ProbeTensor(shape, dtype, device)

    def visit(_spelling, call):
        seen: dict[str, tuple] = {}

        def on_op(stack, func, args, kwargs):
            if any(o in wanted for o in stack[:-1]):
                return
            for e in group:
                if e["op"] not in verdicts and e["op"] not in seen and _matches(stack[-1], e["op"], e["policy"]):
                    bound = kwargs.get("dtype")
                    seen[e["op"]] = (len(stack), _floats((args, kwargs)), None, bound)

        def on_output(stack, func, args, kwargs, out):
            for op, (depth, inputs, _, bound) in list(seen.items()):
                if depth == len(stack) and _matches(stack[-1], op, "fp32_append_dtype") \
                        and seen[op][2] is None:
                    seen[op] = (depth, inputs, _floats(out), bound)

        error = None
        with autocast_switched_on(device, lowp):
            try:
                run_traced(call, device, on_op, on_output)
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        count[0] = 0
        for e in group:
            op, policy = e["op"], e["policy"]
            if op in verdicts:
                continue
            if policy == "banned":
                message = (e.get("evidence", {}).get("message") or "").splitlines()[:1]
                if error and op not in seen and (not message or message[0][:60] in error or "autocast" in error):
                    verdicts[op] = Result(device, op, spelling, policy, "ok", error)
                elif op in seen:
                    verdicts[op] = Result(device, op, spelling, policy, "wrong",
                                          "reached the op below autocast: the kernel did not refuse it")
                continue
            if op in seen:
                _, inputs, outputs, bound = seen[op]
                wrong = _judge(policy, lowp, inputs, outputs, bound)
                verdicts[op] = Result(device, op, spelling, policy, "wrong" if wrong else "ok", wrong or "")
        if error:
            errors.append(error)
        if len(verdicts) == len(group):
            raise _Resolved
        return error is None

    try:
        walk_public_api(device, visit, floating=floating, only={spelling})
    except _Resolved:
        pass
    last = errors[-1] if errors else "every generated call completed without reaching it"
    return [verdicts.get(e["op"]) or Result(device, e["op"], spelling, e["policy"], "not reached", last[:200])
            for e in group]
