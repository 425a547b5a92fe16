"""Call every Python spelling a table maps to an op under that device's autocast, simulated at
the dispatcher, and check the dtype the op runs in against what the table says of it.

A spelling under ``python`` is checked against the op's policy, with inputs chosen so that the
policy and "no autocast kernel" disagree: float32 inputs for a lower_precision_fp op (expect the
autocast dtype), inputs of the autocast dtype for the fp32 family (expect float32), float32 and
the autocast dtype mixed for promote (expect one dtype, the widest), and for banned the call must
fail with the kernel's message. A spelling under ``python_explicit_dtype`` passes the op a dtype:
given inputs of the autocast dtype, the op must run in the dtype passed. One under
``python_float64`` must reach it in float64. The op is watched at the Python key, below
autocast, where it is reached not nested in another op with an autocast kernel (the spellings'
own rule, see spellings_for), in the way its list says (intercept.reach_mark). A spelling that
no generated call brings to its op that way, or that fails before it, is reported as such,
never skipped.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .intercept import (EXPLICIT_DTYPE_MARK, FLOAT64_MARK, ProbeTensor, autocast_switched_on, passed_dtype,
                        reach_mark, run_traced)
from .spellings import walk_public_api

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
# The inputs each policy is checked with.
_CONFIG = {"lower_precision_fp": "fp32", "fp32": "lowp", "fp32_set_opt_dtype": "lowp",
           "fp32_append_dtype": "lowp", "promote": "mixed", "banned": "fp32"}
# An entry's lists of spellings, each with the marks (intercept.reach_mark) a reach of the op
# it counts may have: below autocast, a dtype passed may be the one fp32_set_opt_dtype sets.
LISTS = {"python": ("", EXPLICIT_DTYPE_MARK), "python_explicit_dtype": (EXPLICIT_DTYPE_MARK,),
         "python_float64": (FLOAT64_MARK,)}


@dataclass
class Result:
    device: str
    op: str
    spelling: str
    policy: str
    status: str  # "ok", "wrong" (reached, another dtype), "not reached", "no policy"
    detail: str = ""
    listed: str = "python"  # the entry's list that names the spelling (see LISTS)


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


def _short(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _judge(listed: str, policy: str, lowp: torch.dtype, inputs: list, outputs: list | None,
           passed) -> str | None:
    """None when what the op received and returned fits what ``listed`` says; else what was seen."""
    runs_in = set(outputs) if outputs else set(inputs)
    if policy == "fp32_set_opt_dtype" and not outputs and passed is not None:
        runs_in = {passed}
    if listed == "python_float64":
        expected, said = {torch.float64}, "python_float64"
    elif listed == "python_explicit_dtype":
        expected, said = {passed}, "the dtype passed"
    elif policy == "lower_precision_fp":
        expected, said = {lowp}, policy
    elif policy == "promote":
        # Given float32 and the autocast dtype, one dtype reaches the op; a spelling whose inputs
        # reach it all of one dtype (an LSTM's own outputs to stack) shows that dtype.
        if len(set(inputs)) > 1:
            return f"inputs reached the op unpromoted: {sorted(map(str, set(inputs)))}"
        expected, said = set(inputs) or {torch.float32}, policy
    else:
        expected, said = {torch.float32}, policy
    if not runs_in:
        return "the op had no floating input or output to judge"
    if runs_in != expected:
        return (f"runs in {', '.join(sorted(_short(d) for d in runs_in))}, "
                f"{said} predicts {_short(next(iter(expected)))}")
    return None


def check_table(table: dict, only: set[str] | None = None) -> list[Result]:
    """One Result per (op, spelling) of ``table``'s lists (spellings in ``only``, where given)."""
    device, lowp = table["device"], getattr(torch, table["dtype"])
    wanted = {e["op"] for e in table["ops"] if e.get("policy")}
    results: list[Result] = []
    todo: dict[tuple[str, str], list[tuple[dict, str]]] = defaultdict(list)  # (spelling, config) -> (entry, list)
    for e in table["ops"]:
        for listed in LISTS:
            for spelling in e.get(listed, []):
                if only is not None and spelling not in only:
                    continue
                if e.get("policy") not in _CONFIG:
                    results.append(Result(device, e["op"], spelling, str(e.get("policy")), "no policy", "", listed))
                    continue
                if e.get("evidence", {}).get("supplement"):
                    results.append(Result(device, e["op"], spelling, e["policy"], "not reached",
                                          "supplement: this build has no autocast kernel for the op", listed))
                    continue
                config = _CONFIG[e["policy"]] if listed == "python" else "lowp"
                todo[(spelling, config)].append((e, listed))
    on_cpu = set(table.get("spellings_traced_on_cpu", []))
    for (spelling, config), group in sorted(todo.items(), key=lambda kv: kv[0]):
        for result in _check_spelling(device, lowp, spelling, config, group, wanted):
            if result.status == "not reached" and spelling in on_cpu:
                result.detail = f"its ops are as traced on cpu (spellings_traced_on_cpu): {result.detail}"
            results.append(result)
    return results


def _check_spelling(device, lowp, spelling, config, group, wanted) -> list[Result]:
    verdicts: dict[tuple[str, str], Result] = {}  # (op, list) -> its verdict
    errors: list[str] = []
    count = [0]

    def floating(shape):
        count[0] += 1
        dtype = lowp if config == "lowp" or (config == "mixed" and count[0] > 1) else torch.float32
        return ProbeTensor(shape, dtype, device)

    def visit(_spelling, call):
        seen: dict[tuple[str, str], tuple] = {}  # (op, list) -> (depth, inputs, outputs, dtype passed)

        def on_op(stack, func, args, kwargs):
            if any(o in wanted for o in stack[:-1]):
                return
            mark = reach_mark(func, args, kwargs)
            for e, listed in group:
                key = (e["op"], listed)
                if (key not in verdicts and key not in seen and mark in LISTS[listed]
                        and _matches(stack[-1], e["op"], e["policy"])):
                    seen[key] = (len(stack), _floats((args, kwargs)), None, passed_dtype(func, args, kwargs))

        def on_output(stack, func, args, kwargs, out):
            for key, (depth, inputs, outputs, passed) in list(seen.items()):
                if depth == len(stack) and outputs is None and _matches(stack[-1], key[0], "fp32_append_dtype"):
                    seen[key] = (depth, inputs, _floats(out), passed)

        error = None
        with autocast_switched_on(device, lowp):
            try:
                run_traced(call, device, on_op, on_output)
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        count[0] = 0
        for e, listed in group:
            op, policy, key = e["op"], e["policy"], (e["op"], listed)
            if key in verdicts:
                continue
            if policy == "banned" and listed == "python":
                message = (e.get("evidence", {}).get("message") or "").splitlines()[:1]
                if error and key not in seen and (not message or message[0][:60] in error or "autocast" in error):
                    verdicts[key] = Result(device, op, spelling, policy, "ok", error, listed)
                elif key in seen:
                    verdicts[key] = Result(device, op, spelling, policy, "wrong",
                                           "reached the op below autocast: the kernel did not refuse it", listed)
                continue
            if key in seen:
                _, inputs, outputs, passed = seen[key]
                wrong = _judge(listed, policy, lowp, inputs, outputs, passed)
                verdicts[key] = Result(device, op, spelling, policy, "wrong" if wrong else "ok", wrong or "", listed)
        if error:
            errors.append(error)
        if len(verdicts) == len(group):
            raise _Resolved
        return error is None

    try:
        walk_public_api(device, visit, floating=floating, only={spelling})
    except _Resolved:
        pass
    # Most calls fail binding their generated arguments (TypeError); the other errors say more.
    said = " | ".join(dict.fromkeys(e for e in errors if not e.startswith("TypeError"))) or (
        errors[-1][:200] if errors else "every generated call completed without reaching it")
    return [verdicts.get((e["op"], listed))
            or Result(device, e["op"], spelling, e["policy"], "not reached", said, listed)
            for e, listed in group]
