"""Run a generated training loop both ways: on the CPU under `amplint trace` (what happened) and
through `amplint check` (what the rules read), restricted to the codes a run can show. Shared by
tests/test_differential.py and benchmarks/differential.py."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from amplint.engine.rule import all_rules
from amplint.engine.runner import lint_source
from amplint.policy import loader
from amplint.trace.runner import run
from amplint.trace.tracer import Tracer
from training_loops import CPU_IMPORT, CPU_PRELUDE, CPU_REGIONS, CPU_SETUP, training_loops

CODES = Tracer.CODES
DEVICE = "cpu"  # the loops run here: both sides read the cpu policy table
RULES = [r for r in all_rules() if r.code in CODES]


@dataclass
class Outcome:
    source: str
    lint: set  # codes `amplint check` reports
    trace: set  # codes `amplint trace` reports
    failed: str | None  # the program's error, last line (a run stops there; the linter reads on)

    def disagreements(self) -> dict[str, str]:
        """code -> "lint only" / "trace only"."""
        return {c: "lint only" if c in self.lint else "trace only" for c in sorted(self.lint ^ self.trace)}


def cpu_loops(count: int) -> list[str]:
    """``count`` distinct runnable loops, the same ones on every call (derandomized hypothesis)."""
    found: list[str] = []

    @settings(max_examples=count * 3, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(training_loops(imports=[CPU_IMPORT], regions=CPU_REGIONS, setup=CPU_SETUP, call_function=True))
    def collect(code):
        if len(found) < count and code not in found:
            found.append(code)

    collect()
    return found


def compare(code: str, folder: Path) -> Outcome:
    source = CPU_PRELUDE + code
    script = folder / "loop.py"
    script.write_text(source, encoding="utf-8")
    checked = lint_source(str(script), source, RULES, policy_loader=loader(DEVICE))
    tracer = Tracer(steps=3, codes=set(CODES), device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation and GradScaler notes
        result = run([str(script)], tracer, stdout=io.StringIO())
    failed = result.error.strip().splitlines()[-1] if result.error else None
    return Outcome(code, {d.code for d in checked.diagnostics}, {d.code for d in tracer.findings}, failed)


# Each class of disagreement seen over the generated loops, with why the two differ.
EXPLANATIONS = {
    "run-stopped": "The program failed before the end (the snippets are drawn independently: a second "
                   "`loss.backward()` through a freed graph, `scaler.step` twice): the trace sees what ran "
                   "up to the error, the linter reads every path. Legitimate.",
    "update-after-plain-step": "AMP006 from the trace only: `scaler.update()` after a plain `optimizer.step()` "
                               "and no `scaler.step`; torch raises (no inf checks recorded) and the trace "
                               "reports the update. The linter reports the `optimizer.step()` that bypasses "
                               "the scaler (AMP005) and counts it as the iteration's step, as AMP017 does (with "
                               "the scaler disabled the update is a no-op): one mistake, reported once. "
                               "Legitimate.",
    "loss-from-before-the-region": "AMP009 from the linter only: `loss.backward()` inside a float16 region where "
                                   "`loss` is the prelude's, computed in float32 before any region (the snippet "
                                   "assigns `loss` only after that backward, or never). The trace follows the loss: "
                                   "autograd numbers its nodes in the order it makes them, so a loss older than the "
                                   "region holds none of its ops, and nothing underflows for want of a scaler. The "
                                   "linter takes a backward inside a float16 region for the backward of a loss made "
                                   "there, as real loops make it, and reports the region; AMP001 reports that "
                                   "backward on both sides. An imprecision of the linter, left.",
}


def _lines(outcome: Outcome) -> list[str]:
    """The generated snippet's lines (without the prelude), stripped."""
    return [line.strip() for line in outcome.source.removeprefix(CPU_PRELUDE).splitlines()]


def _first_update_after_plain_step(outcome: Outcome) -> bool:
    """The snippet's first `scaler.update()` follows `optimizer.step()` and no scaler step or unscale_."""
    before: list[str] = []
    for line in _lines(outcome):
        if line == "scaler.update()":
            return "optimizer.step()" in before and not any(
                b.startswith(("scaler.step(", "scaler.unscale_(")) for b in before)
        before.append(line)
    return False


def _backward_before_loss_assigned(outcome: Outcome) -> bool:
    """The snippet's first `loss.backward()` comes before any `loss = ` of its own: it runs on
    the prelude's loss."""
    for line in _lines(outcome):
        if line.startswith("loss = "):
            return False
        if line == "loss.backward()":
            return True
    return False


def explain(outcome: Outcome, code: str, side: str) -> str | None:
    """The EXPLANATIONS class of one disagreement, or None when none fits (a bug to look at)."""
    if side == "lint only" and outcome.failed:
        return "run-stopped"
    if code == "AMP006" and side == "trace only" and outcome.failed and "No inf checks were recorded" in \
            outcome.failed and "AMP005" in outcome.lint and _first_update_after_plain_step(outcome):
        return "update-after-plain-step"
    if code == "AMP009" and side == "lint only" and _backward_before_loss_assigned(outcome):
        return "loss-from-before-the-region"
    return None
