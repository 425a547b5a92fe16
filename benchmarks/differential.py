"""The differential run: generated training loops, each run on the CPU under `amplint trace` and
checked by `amplint check`, their codes compared (only the codes a run can show).

    python benchmarks/differential.py [--loops 500] [--report benchmarks/differential-report.md]

Prints, per code, the loops where both report it, where only the linter does and where only the
trace does, and each disagreement's class (tests/differential.py says why each class differs);
writes the same as a short markdown report. Exit 1 when a disagreement fits no class.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from differential import CODES, EXPLANATIONS, compare, cpu_loops, explain  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=500)
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "differential-report.md")
    args = parser.parse_args()
    start = time.perf_counter()
    loops = cpu_loops(args.loops)
    per_code, classes, unexplained, failed = Counter(), Counter(), [], 0
    with tempfile.TemporaryDirectory() as folder:
        for code in loops:
            outcome = compare(code, Path(folder))
            failed += outcome.failed is not None
            for found in outcome.lint & outcome.trace:
                per_code[(found, "both")] += 1
            for found, side in outcome.disagreements().items():
                per_code[(found, side)] += 1
                kind = explain(outcome, found, side)
                classes[(found, side, kind or "UNEXPLAINED")] += 1
                if kind is None:
                    unexplained.append((found, side, outcome))
    seconds = time.perf_counter() - start
    rows = [(c, per_code[(c, "both")], per_code[(c, "lint only")], per_code[(c, "trace only")]) for c in CODES]
    lines = [f"{len(loops)} loops ({failed} stopped by an error), {seconds:.0f} s",
             "", "code     both  lint only  trace only"]
    lines += [f"{c:7}  {b:4}  {lo:9}  {to:10}" for c, b, lo, to in rows]
    lines += ["", "disagreements by class:"]
    lines += [f"  {c} {side:10} {kind:32} {n}" for (c, side, kind), n in sorted(classes.items())]
    print("\n".join(lines))
    for code, side, outcome in unexplained[:5]:
        print(f"\nUNEXPLAINED {code} ({side}); run: {outcome.failed or 'ran to the end'}\n{outcome.source}")
    report = ["# Differential run: `amplint trace` (CPU) against `amplint check`", "",
              f"`python benchmarks/differential.py --loops {args.loops}`: {len(loops)} generated training loops "
              f"(tests/training_loops.py, CPU regions and scalers), {failed} of them stopped by an error; "
              f"{seconds:.0f} s. Per code, the loops where both report it, where only one does:", "",
              "| code | both | lint only | trace only |", "|---|---|---|---|"]
    report += [f"| {c} | {b} | {lo} | {to} |" for c, b, lo, to in rows]
    report += ["", "## Disagreements by class", "", "| code | side | class | loops |", "|---|---|---|---|"]
    report += [f"| {c} | {side} | {kind} | {n} |" for (c, side, kind), n in sorted(classes.items())]
    report += ["", "## Why each class differs", ""]
    report += [f"- **{kind}**: {text}" for kind, text in EXPLANATIONS.items()]
    report += ["", f"Unexplained: {len(unexplained)}."]
    args.report.write_text("\n".join(report) + "\n", encoding="utf-8")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
