"""How much of the prefilter's work is wasted? The other side of ``prefilter_soundness.py``: for
every file, which rules pass the prefilter (their fragments), which of them then report
something, how many files Python's ``ast`` parses for one rule alone, and the time the parse
and the rules spend on files where nothing is reported.

    python benchmarks/prefilter_precision.py .corpus/site [more folders ...] [--files N] [--preview]

Prints a table per rule and the costliest files checked for nothing.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from amplint.engine import runner
from amplint.engine.config import Config
from amplint.engine.outline import Outline
from amplint.engine.project import policy_loader
from amplint.engine.project_index import ProjectHints
from amplint.engine.rule import all_rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", default=[".corpus/site"])
    parser.add_argument("--files", type=int, default=None, help="only the first N files")
    parser.add_argument("--worst", type=int, default=20, help="how many wasted files to list")
    parser.add_argument("--preview", action="store_true", help="the prefilter and rules of preview mode")
    args = parser.parse_args()
    rules = tuple(r for r in all_rules() if r.on_by_default and (args.preview or not r.preview))
    load = policy_loader(Config(Path(".").resolve()))
    prefilter = runner.prefilter(rules, args.preview)
    selected, only_for, reporting = Counter(), Counter(), Counter()
    wasted: list[tuple[float, str, list[str]]] = []
    checked_seconds, checked = 0.0, 0
    paths = [p for root in args.roots for p in sorted(Path(root).rglob("*.py"))][:args.files]
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        hints = ProjectHints(str(path))
        chosen = prefilter.matching(text, hints)
        if not chosen:
            continue
        checked += 1
        selected.update(r.code for r in chosen)
        if len(chosen) == 1:
            only_for[chosen[0].code] += 1
        start = time.perf_counter()
        outline = Outline.parse(text)
        if outline is not None:
            outline.project = hints
        diagnostics, _ = runner.run_rules(str(path), text, chosen, load, outline, args.preview)
        seconds = time.perf_counter() - start
        checked_seconds += seconds
        codes = {d.code for d in diagnostics}
        reporting.update(r.code for r in chosen if r.code in codes)
        if not diagnostics:
            wasted.append((seconds, str(path), [r.code for r in chosen]))
    print(f"{len(paths)} files: Python's ast parsed {checked} for the rules, {len(wasted)} of them for nothing\n")
    print("| rule | passed the prefilter | for it alone | reported |")
    print("|---|---|---|---|")
    for rule in rules:
        c = rule.code
        if selected[c]:
            print(f"| {c} | {selected[c]} | {only_for[c]} | {reporting[c]} |")
    spent = sum(s for s, _, _ in wasted)
    print(f"\nparse and rules: {checked_seconds:.2f} s; on the {len(wasted)} files where nothing was "
          f"reported: {spent:.2f} s")
    for seconds, path, codes in sorted(wasted, reverse=True)[:args.worst]:
        print(f"  {seconds:.3f} s  {path}  {' '.join(codes)}")


if __name__ == "__main__":
    main()
