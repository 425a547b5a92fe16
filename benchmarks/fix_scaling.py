"""Does the time of `amplint check` grow linearly with findings that carry a fix? (Issue #16: it
grew with their square.) Generated files of 8-line training steps, each with a backward pass
inside autocast and a clip (one AMP001 and, once fixed, one AMP002 finding per step), checked
and fixed at several sizes; medians of several runs, and each size's seconds per line as a
ratio against the smallest size's, measured in the same run (1.0 everywhere: linear).

    python benchmarks/fix_scaling.py                       # 400 .. 50,000 lines, 3 runs each
    python benchmarks/fix_scaling.py --sizes 400,4000 --runs 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = "import torch\nfrom torch.nn.utils import clip_grad_norm_\n\n"
STEP = """def step_{i}(model, opt, scaler, x):
    with torch.autocast("cuda"):
        loss = model(x).sum()
        scaler.scale(loss).backward()
    clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()

"""


def generated(lines: int) -> str:
    steps = max(1, (lines - HEADER.count("\n")) // STEP.count("\n"))
    return HEADER + "".join(STEP.format(i=i) for i in range(steps))


def seconds(args: list[str], path: Path, original: Path) -> float:
    shutil.copyfile(original, path)  # --fix rewrites it
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--output-format", "concise",
                    *args, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="400,1600,6400,25000,50000", help="lines per file, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    modes = {"check --select AMP001": ["--select", "AMP001"],
             "check --fix --select AMP001,AMP002": ["--fix", "--select", "AMP001,AMP002"]}
    with tempfile.TemporaryDirectory() as tmp:
        originals, lines = {}, {}
        for size in sizes:
            text = generated(size)
            originals[size] = Path(tmp, f"original_{size}.py")
            originals[size].write_text(text)
            lines[size] = text.count("\n")
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.runs):  # sizes in turns: a machine's drift weighs on every size alike
            for mode, flags in modes.items():
                for size in sizes:
                    times.setdefault((mode, size), []).append(
                        seconds(flags, Path(tmp, f"step_{size}.py"), originals[size]))
    print(f"medians of {args.runs} runs; ratio: seconds per line against the {lines[sizes[0]]:,}-line file's\n")
    print("| mode | lines | steps | seconds | ratio per line |")
    print("|---|---|---|---|---|")
    for mode in modes:
        base = statistics.median(times[(mode, sizes[0])]) / lines[sizes[0]]
        for size in sizes:
            median = statistics.median(times[(mode, size)])
            steps = (lines[size] - HEADER.count("\n")) // STEP.count("\n")
            print(f"| {mode} | {lines[size]:,} | {steps:,} | {median:.2f} | {median / lines[size] / base:.2f} |")


if __name__ == "__main__":
    main()
