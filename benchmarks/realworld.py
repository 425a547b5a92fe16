"""Recall and precision of `amplint check` on labelled real-world AMP code.

    python benchmarks/realworld.py [--list] [--family R2]

benchmarks/realworld_cases.jsonl holds key lines in pinned PyPI releases (copied from the
planners' labelled set): a `bug` amplint must report with a code of the case's family on that
line, or correct-but-tricky code (`ok`) where it must stay silent. Each release is installed once
(`pip install --no-deps`) under .corpus/realworld/. Cases that need another file to be seen
(`cross_file`) are scored apart: a single-file linter cannot see them. Prints a markdown table
per family and overall, with the date.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "realworld_cases.jsonl"
SITE = ROOT / ".corpus" / "realworld"
# Which codes count as reporting a family's mistake.
FAMILY_CODES = {
    "R1": {"AMP001"}, "R2": {"AMP002"}, "R3": {"AMP003", "AMP019"}, "R4": {"AMP004"},
    "R5": {"AMP005", "AMP006", "AMP007"}, "R6": {"AMP008"}, "R7": {"AMP009", "AMP010", "AMP011"},
    "R8": {"AMP006", "AMP007", "AMP012", "AMP013", "AMP014", "AMP015", "AMP016", "AMP017", "AMP018"},
}


def installer() -> Path:
    """A pip older than 24.1: newer ones refuse releases whose metadata PEP 508 now rejects
    (catalyst 21.9's `tensorboardX (<2.3.0>=2.1.0)`)."""
    venv = SITE / "pip"
    if not (venv / "bin" / "pip").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "pip<24.1"], check=True)
    return venv / "bin" / "pip"


def install(pin: str) -> Path:
    target = SITE / pin
    if not (target / ".installed").exists():
        subprocess.run([str(installer()), "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", str(target), pin], check=True)
        (target / ".installed").touch()
    return target


def key_line_matches(case: dict, path: Path) -> bool:
    try:
        line = path.read_text(encoding="utf-8", errors="replace").splitlines()[case["line"] - 1]
    except (OSError, IndexError):
        return False
    return hashlib.sha1(line.strip().encode()).hexdigest() == case["line_sha1"]


def findings(paths: list[Path]) -> dict[Path, set[tuple[int, str]]]:
    out = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--exit-zero",
                          "--output-format", "json", *map(str, paths)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"amplint exited {out.returncode}: {out.stderr[-2000:]}")
    found: dict[Path, set[tuple[int, str]]] = collections.defaultdict(set)
    for d in json.loads(out.stdout or "[]"):
        found[Path(d["filename"]).resolve()].add((d["location"]["row"], d["code"]))
    return found


def ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="one line per case with its verdict")
    parser.add_argument("--family", help="only the cases of this family (R1 .. R8)")
    args = parser.parse_args()

    cases = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    if args.family:
        cases = [c for c in cases if c["rule"] == args.family]
    for case in cases:
        case["file"] = (install(case["source"].removeprefix("pypi:")) / case["path"]).resolve()
    shifted = [c["id"] for c in cases if not key_line_matches(c, c["file"])]
    if shifted:
        sys.exit(f"key lines that do not match their release: {' '.join(shifted)}")

    found = findings(sorted({c["file"] for c in cases}))
    tally: dict[tuple[str, bool], collections.Counter] = collections.defaultdict(collections.Counter)
    for case in cases:
        on_line = {code for row, code in found[case["file"]] if row == case["line"]}
        reported = bool(on_line & FAMILY_CODES[case["rule"]])
        verdict = {("bug", True): "found", ("bug", False): "missed",
                   ("ok", True): "false alarm", ("ok", False): "silent"}[(case["label"], reported)]
        cross = bool(case.get("cross_file"))
        tally[(case["rule"], cross)][verdict] += 1
        tally[("all", cross)][verdict] += 1
        if args.list:
            print(f"{verdict:11} {'cross-file ' if cross else ''}{case['id']}  {case['path']}:{case['line']}"
                  f"  {sorted(on_line)}")

    print(f"\nReal-world cases, {date.today().isoformat()} (`python benchmarks/realworld.py`)\n")
    print("| family | scope | bugs found | recall | ok cases silent | false alarms | precision |")
    print("|---|---|---|---|---|---|---|")
    for (family, cross), t in sorted(tally.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        bugs, oks = t["found"] + t["missed"], t["silent"] + t["false alarm"]
        print(f"| {family} | {'cross-file' if cross else 'one file'} | {t['found']}/{bugs} | "
              f"{ratio(t['found'], bugs)} | {t['silent']}/{oks} | {t['false alarm']} | "
              f"{ratio(t['found'], t['found'] + t['false alarm'])} |")


if __name__ == "__main__":
    main()
