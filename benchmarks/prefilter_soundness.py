"""Does the prefilter ever drop a finding? For every rule and every file whose fragments match
(their text tests, ``TextTest``, left out) but whose text tests or ``may_fire`` test turn the
rule away, run the rule's check anyway: any finding it makes there is one the prefilter lost.
Faster than ``lint_speed.py --verify`` (which parses every file with libcst): only the files a
test turned away are parsed.

    python benchmarks/prefilter_soundness.py .corpus/site [more folders ...] [--select AMP003,AMP018]

Prints each lost finding and, at the end, the files read and the findings lost (0 is the goal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from amplint.engine import runner
from amplint.engine.config import Config
from amplint.engine.project import policy_loader
from amplint.engine.project_index import ProjectHints
from amplint.engine.rule import TextTest, all_rules


def _without_text_tests(rule):
    """The rule with its fragments' text tests left out (a class of its own, found by no one)."""
    fragments = tuple(tuple(item for item in f if not isinstance(item, TextTest)) if isinstance(f, tuple) else f
                      for f in rule.fragments)
    return type(rule.__name__, (rule,), {"fragments": fragments})


def main(roots: list[str], select: set[str] | None) -> int:
    rules = [r for r in all_rules() if r.on_by_default and (select is None or r.code in select)]
    load = policy_loader(Config(Path(".").resolve()))
    alone = {r: runner.prefilter((r,)) for r in rules}
    coarse = {r: runner.prefilter((_without_text_tests(r),)) for r in rules}
    files = lost = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            files += 1
            turned_away = [r for r in rules if coarse[r].matching(text, ProjectHints(str(path)))
                           and not alone[r].select_with_outline(text, ProjectHints(str(path)))[0]]
            if not turned_away:
                continue
            codes = {r.code for r in turned_away}
            diagnostics, _ = runner.run_rules(str(path), text, turned_away, load)
            for d in diagnostics:
                if d.code in codes:
                    lost += 1
                    print(f"lost: {d.code} {path}:{d.location.row}", flush=True)
    print(f"{files} files read, {lost} findings lost")
    return 1 if lost else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", default=[".corpus/site"])
    parser.add_argument("--select", help="comma-separated rule codes (default: every rule on by default)")
    args = parser.parse_args()
    sys.exit(main(args.roots, set(args.select.split(",")) if args.select else None))
