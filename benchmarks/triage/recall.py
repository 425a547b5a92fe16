"""Recall on code nobody tuned on: of the AMP mistakes found by reading the held-out corpus
(hunt/*.jsonl), how many amplint reports, per family, by default and with --preview.

    python benchmarks/triage/recall.py            # the table
    python benchmarks/triage/recall.py --list     # each mistake, found or missed

Each line of hunt/*.jsonl is one mistake in a package of the held-out corpus (precision.py's
HELDOUT, installed by it): path and line (where a fix would change the code; `also`, other lines
a finding may sit on, such as the call of a loss built at `line`), line_sha1 (of the stripped
line, so a shifted file is refused), the family (score.py's R1-R8 of ../shared/realworld), and
`bug` (the shipped code or its defaults run into it) or `depends` (only under a setting the
package offers, which `why` names). They were found by reading the code around the training
loops, losses and custom autograd Functions of each package, not by running it, and before
amplint was run on them; a second reader then read each again (`second_reader`: its verdict,
whether the label holds, and why). A mistake the second reader rejected is left out. A mistake
counts as found when amplint reports a code of its family on one of its lines.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import precision

FAMILIES = {"R1": {"AMP001"}, "R2": {"AMP002", "AMP021"}, "R3": {"AMP003", "AMP019", "AMP020"},
            "R5": {"AMP005", "AMP006", "AMP007", "AMP017"}, "R6": {"AMP008"},
            "R7": {"AMP009", "AMP010", "AMP016"}, "R8": {"AMP011", "AMP012", "AMP013", "AMP014", "AMP015", "AMP018"}}


def hunted() -> list[dict]:
    found = []
    for file in sorted((precision.HERE / "hunt").glob("*.jsonl")):
        for n, text in enumerate(file.read_text().splitlines(), 1):
            if not text.strip():
                continue
            item = json.loads(text)
            path = precision.CORPORA[item["corpus"]] / item["path"]
            if precision.line_sha1(path, item["line"]) != item["line_sha1"]:
                sys.exit(f"{file.name}:{n}: {item['path']}:{item['line']} changed; find the line again")
            if item.get("second_reader", {}).get("verdict") == "rejected":
                continue
            found.append(item)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print each mistake, found or missed")
    args = ap.parse_args()
    bugs = hunted()
    reported = {}
    for mode in ("default", "preview"):
        for item in precision.findings(mode == "preview", sorted({b["corpus"] for b in bugs})):
            reported.setdefault((item["corpus"], item["path"], item["line"]), {}).setdefault(item["code"], mode)
    per = collections.defaultdict(collections.Counter)
    for bug in bugs:
        codes = {}
        for line in (bug["line"], *bug.get("also", ())):
            for code, mode in reported.get((bug["corpus"], bug["path"], line), {}).items():
                if code in FAMILIES[bug["family"]]:
                    codes[code] = "default" if "default" in (mode, codes.get(code)) else mode
        status = "default" if "default" in codes.values() else "preview" if codes else "missed"
        per[bug["family"]][status] += 1
        per[bug["family"]][bug["label"]] += 1
        if args.list:
            print(f"{status:8} {bug['family']} {bug['label']:8} {bug['path']}:{bug['line']} {sorted(codes)}")
    print(f"{'family':>7} {'mistakes':>8} {'bug':>4} {'depends':>7} {'default':>7} {'preview':>7} {'missed':>6}")
    total = collections.Counter()
    for family, n in sorted(per.items()):
        total.update(n)
        print(f"{family:>7} {n['bug'] + n['depends']:>8} {n['bug']:>4} {n['depends']:>7} {n['default']:>7} "
              f"{n['default'] + n['preview']:>7} {n['missed']:>6}")
    mistakes = total["bug"] + total["depends"]
    print(f"{'all':>7} {mistakes:>8} {total['bug']:>4} {total['depends']:>7} {total['default']:>7} "
          f"{total['default'] + total['preview']:>7} {total['missed']:>6}")
    print(f"recall {total['default'] / mistakes:.2f} by default, "
          f"{(total['default'] + total['preview']) / mistakes:.2f} with --preview")
    return 0


if __name__ == "__main__":
    sys.exit(main())
