"""Does the default prefilter drop a finding? A rule whose preview paths need less of a file
than its other paths has two sets of fragments (``preview_fragments``, asked in preview mode,
and ``fragments``): for every file the first match but the second do not, the rule's check is
run anyway, in default mode; any finding it makes there is one the prefilter lost. Only those
files are parsed. (``lint_speed.py --verify`` compares whole runs with and without the
prefilter.)

    python benchmarks/prefilter_soundness.py .corpus/site [more folders ...] [--select AMP003]

Prints each lost finding and, at the end, the files read and the findings lost (0 is the goal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from amplint.engine import runner
from amplint.engine.config import Config
from amplint.engine.outline import Outline
from amplint.engine.project import policy_loader
from amplint.engine.project_index import ProjectHints
from amplint.engine.rule import all_rules


def main(roots: list[str], select: set[str] | None) -> int:
    rules = [r for r in all_rules() if r.on_by_default and r.preview_fragments
             and (select is None or r.code in select)]
    load = policy_loader(Config(Path(".").resolve()))
    default = {r: runner.prefilter((r,)) for r in rules}
    preview = {r: runner.prefilter((r,), True) for r in rules}
    files = turned = lost = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            files += 1
            turned_away = [r for r in rules if preview[r].matching(text, ProjectHints(str(path)))
                           and not default[r].matching(text, ProjectHints(str(path)))]
            if not turned_away:
                continue
            turned += 1
            outline = Outline.parse(text)
            if outline is not None:
                outline.project = ProjectHints(str(path))
            codes = {r.code for r in turned_away}
            diagnostics, _ = runner.run_rules(str(path), text, turned_away, load, outline)
            for d in diagnostics:
                if d.code in codes:
                    lost += 1
                    print(f"lost: {d.code} {path}:{d.location.row}", flush=True)
    print(f"{files} files read, {turned} turned away by the default fragments alone, {lost} findings lost")
    return 1 if lost else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", default=[".corpus/site"])
    parser.add_argument("--select", help="comma-separated rule codes (default: every rule with preview fragments)")
    args = parser.parse_args()
    sys.exit(main(args.roots, set(args.select.split(",")) if args.select else None))
