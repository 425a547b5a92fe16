"""How much of the prefilter's work is wasted? The other side of ``prefilter_soundness.py``: for
every file, which rules pass the prefilter (fragments, then ``may_fire``), which of them then
report something, and the time libcst and the rules spend on files where nothing is reported.
Also how many files Python's ``ast`` reads only for one rule's ``may_fire``, how often that
test then lets the file through, and what each test costs (each on a fresh outline of the
file's tree: with the node index it builds, which the tests of a file share in a real run).

    python benchmarks/prefilter_precision.py .corpus/site [more folders ...] [--files N]

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
    args = parser.parse_args()
    rules = tuple(r for r in all_rules() if r.on_by_default)
    load = policy_loader(Config(Path(".").resolve()))
    prefilter = runner.prefilter(rules)
    outlined_for = Counter()  # rule -> files whose ast was read for its test
    only_for = Counter()  # rule -> files whose ast was read for its test alone
    selected = Counter()
    reporting = Counter()
    wasted: list[tuple[float, str, list[str]]] = []
    checked_seconds = 0.0
    test_seconds: Counter[str] = Counter()
    outlined = checked = 0
    paths = [p for root in args.roots for p in sorted(Path(root).rglob("*.py"))][:args.files]
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        tested = [r for r in prefilter.matching(text, ProjectHints(str(path))) if r.may_fire is not None]
        outlined_for.update(r.code for r in tested)
        outlined += bool(tested)
        if len(tested) == 1:
            only_for[tested[0].code] += 1
        chosen, outline = prefilter.select_with_outline(text, ProjectHints(str(path)))
        for rule in tested if outline is not None else ():
            fresh = Outline(outline.tree)
            fresh.project = outline.project
            start = time.perf_counter()
            rule.may_fire(fresh)
            test_seconds[rule.code] += time.perf_counter() - start
        if not chosen:
            continue
        checked += 1
        start = time.perf_counter()
        diagnostics, _ = runner.run_rules(str(path), text, chosen, load, outline)
        seconds = time.perf_counter() - start
        checked_seconds += seconds
        codes = {d.code for d in diagnostics}
        selected.update(r.code for r in chosen)
        reporting.update(r.code for r in chosen if r.code in codes)
        if not diagnostics:
            wasted.append((seconds, str(path), [r.code for r in chosen]))
    print(f"{len(paths)} files: Python's ast read {outlined} for a rule's test, libcst {checked}, "
          f"{len(wasted)} of them for nothing\n")
    print("| rule | ast read for its test | for it alone | its test (s) | passed the prefilter | reported |")
    print("|---|---|---|---|---|---|")
    for rule in rules:
        c = rule.code
        if outlined_for[c] or selected[c]:
            print(f"| {c} | {outlined_for[c]} | {only_for[c]} | {test_seconds[c]:.2f} | {selected[c]} | {reporting[c]} |")
    spent = sum(s for s, _, _ in wasted)
    print(f"\nlibcst parse and rules: {checked_seconds:.2f} s; on the {len(wasted)} files where nothing was "
          f"reported: {spent:.2f} s")
    for seconds, path, codes in sorted(wasted, reverse=True)[:args.worst]:
        print(f"  {seconds:.3f} s  {path}  {' '.join(codes)}")


if __name__ == "__main__":
    main()
