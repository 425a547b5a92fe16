"""How fast is `amplint check`? Medians over several runs, as ratios against baselines measured
in the same run, on a pinned corpus of real PyTorch projects.

    python benchmarks/lint_speed.py                 # the whole corpus (slow: minutes per run)
    python benchmarks/lint_speed.py --files 400     # the first 400 files, for a quick look
    python benchmarks/lint_speed.py --verify        # also: same findings with/without prefilter and jobs
    python benchmarks/lint_speed.py --quick         # without the parse floor, flake8 and TorchFix
    python benchmarks/lint_speed.py --corpus DIR    # another corpus (one never tuned on)
    python benchmarks/lint_speed.py --against REV   # also the commit REV, cold, in turns with this tree

The corpus is installed with `pip install --no-deps --target .corpus/site`; ruff, flake8 and
TorchFix go into their own virtual environment in .corpus/tools. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / ".corpus"
PACKAGES = ["diffusers==0.42.1", "composer==0.32.1", "fastai==2.8.12", "super-gradients==3.7.1",
            "kornia==0.9.0", "peft==0.21.2", "trl==1.16.0", "sentence-transformers==6.2.0",
            "torchtune==0.6.1", "colossalai==0.5.0", "espnet==202511",
            "pytorch-metric-learning==2.9.0", "anomalib==2.7.0"]
TOOLS = ["ruff", "flake8", "torchfix"]


def install_corpus() -> Path:
    site = CORPUS / "site"
    if not site.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", str(site), *PACKAGES], check=True)
    return site


def install_tools() -> Path:
    venv = CORPUS / "tools"
    if not (venv / "bin" / "ruff").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *TOOLS], check=True)
    return venv / "bin"


def subset(site: Path, count: int | None) -> Path:
    if count is None:
        return site
    target = CORPUS / f"subset-{count}"
    if not target.is_dir():
        for path in sorted(site.rglob("*.py"))[:count]:
            dest = target / path.relative_to(site)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    return target


def checkout(revision: str) -> Path:
    """The package of a git revision of this project, in a folder of its own (byte-compiled, as
    this tree's is): `python -m amplint` run there runs that revision."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    folder = CORPUS / f"at-{sha[:12]}"
    if not (folder / "amplint").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "amplint", "policies"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "amplint")], check=True)
    return folder


def timed(cmd: list[str], runs: int, cwd: Path | None = None) -> float:
    return timed_in_turns({"": (cmd, cwd)}, runs)[""]


def timed_in_turns(commands: dict[str, tuple[list[str], Path | None]], runs: int) -> dict[str, float]:
    """Median seconds of each command, run in turns (one run of each per round): a machine
    that slows down or speeds up during the benchmark weighs on every ratio alike."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (cmd, cwd) in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


PARSE_FLOOR = """
import ast, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).rglob("*.py")):
    try:
        ast.parse(p.read_text(encoding="utf-8", errors="replace"))
    except Exception:
        pass
"""


def verify(corpus: Path) -> str:
    """Same findings with and without the prefilter, with one job and with several."""
    from amplint.engine.rule import all_rules
    from amplint.engine.runner import lint_source
    from amplint.policy import loader

    rules, load = list(all_rules()), loader("cuda")
    for path in sorted(corpus.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        a = lint_source(str(path), text, rules, policy_loader=load)
        b = lint_source(str(path), text, rules, policy_loader=load, use_prefilter=False)
        if [(d.code, d.location) for d in a.diagnostics] != [(d.code, d.location) for d in b.diagnostics]:
            return f"prefilter changed the findings of {path}"
    outputs = [subprocess.run([sys.executable, "-m", "amplint", "check", "--exit-zero", "--output-format",
                               "json", "--jobs", str(j), str(corpus)], capture_output=True, text=True).stdout
               for j in (1, os.cpu_count() or 2)]
    if json.loads(outputs[0]) != json.loads(outputs[1]):
        return "--jobs changed the findings"
    return "identical with and without the prefilter, and with --jobs 1 and --jobs N"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=None, help="only the first N files")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--corpus", type=Path, help="a folder to check instead of the pinned corpus")
    parser.add_argument("--quick", action="store_true",
                        help="leave out the single runs of the parse floor, flake8 and TorchFix "
                             "(most of a whole-corpus run's half hour) and the target against TorchFix")
    parser.add_argument("--against", metavar="REV",
                        help="also time the git revision REV, cold with default jobs, in turns with this tree "
                             "(a change measured against its parent on a machine whose speed drifts)")
    args = parser.parse_args()

    # What an installed amplint runs: its modules byte-compiled (as pip does on install). An
    # editable install under PYTHONDONTWRITEBYTECODE would compile every module on every run.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "amplint")], check=True)
    corpus = subset(args.corpus.resolve() if args.corpus else install_corpus(), args.files)
    tools = install_tools()
    files = list(corpus.rglob("*.py"))
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    amplint = [sys.executable, "-m", "amplint", "check", "--exit-zero", "--no-cache"]
    warm = [sys.executable, "-m", "amplint", "check", "--exit-zero", str(corpus)]
    # the cache is the checked folder's: filled and read from there
    subprocess.run(warm, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=corpus)  # fill the cache
    one_file = str(ROOT / "fixtures" / "faulty" / "train_amp.py")

    commands = {
        "ruff (default rules, --no-cache)": ([str(tools / "ruff"), "check", "--no-cache", "--exit-zero",
                                              str(corpus)], None),
        "amplint, --jobs 1": ([*amplint, "--jobs", "1", str(corpus)], None),
        "amplint, default jobs": ([*amplint, str(corpus)], ROOT),
        "amplint, warm cache (nothing changed)": (warm, corpus),
    }
    against = f"amplint at {args.against}, default jobs" if args.against else None
    if against:
        commands[against] = ([*amplint, str(corpus)], checkout(args.against))
    rows = timed_in_turns(commands, args.runs)
    if not args.quick:
        rows["Python's ast parse of every file (1 process)"] = timed([sys.executable, "-c", PARSE_FLOOR, str(corpus)], 1)
        rows["flake8 (default rules)"] = timed([str(tools / "flake8"), "--exit-zero", str(corpus)], 1)
        rows["TorchFix"] = timed([str(tools / "torchfix"), str(corpus)], 1)
    single = timed_in_turns({
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "python -c 'import libcst'": ([sys.executable, "-c", "import libcst"], None),
        "amplint check one file": ([*amplint, one_file], None),
    }, args.runs * 3)
    base = rows["ruff (default rules, --no-cache)"]
    print(f"Corpus: {len(files)} files, {lines:,} lines ({'first %d files' % args.files if args.files else 'all'}); "
          f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, median of {args.runs} runs in turns"
          + ("." if args.quick else " (single runs for the parse floor, flake8 and TorchFix).") + "\n")
    print("| command | seconds | × ruff |\n|---|---|---|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.2f} | {seconds / base:.1f} |")
    pass_time = single["python -c pass"]
    print("\n| single file (pre-commit) | seconds | × `python -c pass` |\n|---|---|---|")
    for name, seconds in single.items():
        print(f"| {name} | {seconds:.3f} | {seconds / pass_time:.1f} |")
    cold, warm_time = rows["amplint, default jobs"], rows["amplint, warm cache (nothing changed)"]
    targets = [] if args.quick else [
        ("cold check vs TorchFix", rows["TorchFix"] / cold, "× faster", "≥ 20", rows["TorchFix"] / cold >= 20)]
    if against:
        print(f"\nThis tree's cold check takes {cold / rows[against]:.2f}× the time of {args.against}'s.")
    targets += [
        ("cold check vs ruff", cold / base, "× ruff's time", "≤ 3.5", cold / base <= 3.5),
        ("warm rerun vs ruff", warm_time / base, "× ruff's time", "≤ 1", warm_time <= base),
        ("one file vs `import libcst`", single["amplint check one file"] / single["python -c 'import libcst'"],
         "× its time", "≤ 2", single["amplint check one file"] <= 2 * single["python -c 'import libcst'"]),
    ]
    print("\n| target | measured | goal | met |\n|---|---|---|---|")
    for name, ratio, unit, goal, met in targets:
        print(f"| {name} | {ratio:.1f}{unit} | {goal} | {'yes' if met else 'no'} |")
    if args.verify:
        print("\nFindings:", verify(corpus))


if __name__ == "__main__":
    main()
