"""Per-rule precision from triage: amplint's findings on real projects, labelled by reading the code.

    python benchmarks/triage/precision.py                 # the table (docs/triage.md holds the last one)
    python benchmarks/triage/precision.py --markdown      # the same, as markdown
    python benchmarks/triage/precision.py --todo FILE     # the findings still to label, as JSON lines
    python benchmarks/triage/precision.py --preview       # also count the rules that run only with --preview
    python benchmarks/triage/precision.py --corpus heldout  # one corpus only (repeat for more)

Three corpora: the dev corpus of benchmarks/lint_speed.py (installed in .corpus/site), the pinned
releases of ../shared/realworld (installed by its score.py in the temp folder amplint-realworld),
and a held-out corpus (HELDOUT below, installed in .corpus/heldout by this script when missing):
packages chosen after the rules were written and never used to tune them, so its labels measure
the rules on code they were not fitted to.
Each label in labels/*.jsonl names one finding: corpus, path (relative to the corpus folder),
line, line_sha1 (of the stripped line, so a shifted file is refused), code, and the verdict:
`true` (a real mistake), `false` (no mistake: the reason says what the rule missed) or `depends`
(a mistake only under a configuration the code does not fix), with a one-line reason.

Of each rule's findings, 40 drawn at random (seeded, so the draw is stable) or all where it has
fewer are the sample to label. Precision is true / (true + false); `depends` is shown beside it.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPORA = {"dev": ROOT / ".corpus" / "site", "realworld": Path(tempfile.gettempdir()) / "amplint-realworld",
           "heldout": ROOT / ".corpus" / "heldout"}
HELDOUT = ["ultralytics==8.4.190", "accelerate==1.15.0", "monai==1.6.1", "speechbrain==1.1.2",
           "pytorch-ignite==0.5.5", "mmengine==0.10.7", "mmdet==3.3.0", "yolov5==7.0.14", "litgpt==0.5.13",
           "pyannote.audio==4.0.7", "lightly==1.6.0", "open_clip_torch==3.3.0", "k-diffusion==0.1.1.post1",
           "pytorch-lightning==2.6.6", "transformers==5.24.0", "timm==1.0.31", "torchdistill==1.1.5",
           "mace-torch==0.3.16", "chemprop==2.3.1", "neuralforecast==3.3.0", "pytorch-forecasting==1.8.0",
           "mmagic==1.2.0", "mmaction2==1.2.0", "salesforce-lavis==1.0.2", "deepchem==2.8.0",
           "schnetpack==2.1.1", "tianshou==2.0.1", "pytorchvideo==0.1.5", "torchtitan==0.3.0",
           "nemo-toolkit==3.0.0", "fairseq2==0.8.1", "pytorch-tabular==1.2.0", "axolotl==0.19.0",
           "basicsr==1.3.3.3", "nanotron==0.4", "poutyne==1.19.0", "pytorch-accelerated==0.1.61",
           "lightning-bolts==0.7.0", "lightning-flash==0.8.2", "pytorch-tabnet==4.1.0"]
SAMPLE_PER_RULE = 40
THRESHOLD = 0.9


def line_sha1(path: Path, row: int) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return hashlib.sha1(lines[row - 1].strip().encode()).hexdigest()


def install_heldout() -> None:
    folder = CORPORA["heldout"]
    if not folder.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", str(folder), *HELDOUT], check=True)


def findings(preview: bool, corpora: list[str]) -> list[dict]:
    """amplint's findings on each corpus named, keyed as labels are."""
    if "heldout" in corpora:
        install_heldout()
    found = []
    for corpus in corpora:
        folder = CORPORA[corpus]
        if not folder.is_dir():
            sys.exit(f"{folder} is missing: install it first (see this script's docstring)")
        cmd = [sys.executable, "-m", "amplint", "check", "--no-cache", "--exit-zero", "--output-format",
               "json", *(["--preview"] if preview else []), str(folder)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            sys.exit(out.stderr[-2000:])
        for d in json.loads(out.stdout or "[]"):
            path = Path(d["filename"]).resolve()
            found.append({"corpus": corpus, "path": str(path.relative_to(folder.resolve())),
                          "line": d["location"]["row"], "code": d["code"], "message": d["message"],
                          "line_sha1": line_sha1(path, d["location"]["row"])})
    return found


def key(item: dict) -> tuple:
    return item["corpus"], item["path"], item["line"], item["code"]


def labels() -> dict[tuple, dict]:
    out = {}
    for file in sorted((HERE / "labels").glob("*.jsonl")):
        for n, text in enumerate(file.read_text().splitlines(), 1):
            if text.strip():
                label = json.loads(text)
                if label["label"] not in ("true", "false", "depends"):
                    sys.exit(f"{file.name}:{n}: label must be true, false or depends")
                out[key(label)] = label
    return out


def sample(found: list[dict]) -> list[dict]:
    by_rule = collections.defaultdict(list)
    for item in sorted(found, key=key):
        by_rule[item["code"]].append(item)
    drawn = []
    for code, items in sorted(by_rule.items()):
        drawn += items if len(items) <= SAMPLE_PER_RULE else random.Random(code).sample(items, SAMPLE_PER_RULE)
    return drawn


def table(found: list[dict], known: dict[tuple, dict], markdown: bool) -> tuple[str, list[str]]:
    rows, below = [], []
    per_rule = collections.defaultdict(collections.Counter)
    for item in found:
        label = known.get(key(item))
        if label and label["line_sha1"] != item["line_sha1"]:
            sys.exit(f"{item['path']}:{item['line']}: the labelled line changed; relabel it")
        per_rule[item["code"]]["findings"] += 1
        per_rule[item["code"]][label["label"] if label else "unlabelled"] += 1
    head = ["rule", "findings", "labelled", "true", "false", "depends", "precision"]
    for code, n in sorted(per_rule.items()):
        judged = n["true"] + n["false"]
        precision = n["true"] / judged if judged else None
        if precision is not None and precision < THRESHOLD:
            below.append(code)
        rows.append([code, n["findings"], n["findings"] - n["unlabelled"], n["true"], n["false"],
                     n["depends"], "—" if precision is None else f"{precision:.2f}"])
    total = collections.Counter()
    for n in per_rule.values():
        total.update(n)
    judged = total["true"] + total["false"]
    rows.append(["all", total["findings"], total["findings"] - total["unlabelled"], total["true"],
                 total["false"], total["depends"], f"{total['true'] / judged:.2f}" if judged else "—"])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    else:
        lines = ["  ".join(f"{c:>9}" for c in head)] + ["  ".join(f"{c!s:>9}" for c in r) for r in rows]
    return "\n".join(lines), below


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--preview", action="store_true", help="run amplint with --preview")
    ap.add_argument("--todo", type=Path, help="write the sampled findings without a label here")
    ap.add_argument("--corpus", action="append", choices=sorted(CORPORA), help="only this corpus (default: all)")
    args = ap.parse_args()
    found = findings(args.preview, args.corpus or list(CORPORA))
    known = labels()
    drawn = sample(found)
    if args.todo:
        todo = [item for item in drawn if key(item) not in known]
        args.todo.write_text("".join(json.dumps(item) + "\n" for item in todo))
        print(f"{len(todo)} sampled findings without a label written to {args.todo}")
    text, below = table(found, known, args.markdown)
    print(text)
    if below:
        print(f"below {THRESHOLD}: {', '.join(below)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
