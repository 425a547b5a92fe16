"""Ecosystem check: amplint on real PyTorch projects, with invariants on its fixes.

    python benchmarks/ecosystem.py [--report ecosystem.md] [--preview] [--corpus DIR ...]

Installs the pinned corpus (as benchmarks/lint_speed.py does; `--corpus` names folders of
releases installed with `pip install --no-deps --target` instead), then for each project:
`amplint check` (findings per rule, internal errors), and `--fix --unsafe-fixes` on a copy
with three invariants: every fixed file still compiles, a second --fix changes nothing, and
no fixable finding is left. `--preview` runs the preview rules too, in every step. Writes a
markdown report; exits 1 on any internal error or broken invariant.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_speed import install_corpus  # noqa: E402


def projects(site: Path) -> dict[str, list[Path]]:
    """Each installed distribution and the top-level folders/modules it put in ``site``."""
    found = {}
    for dist in metadata.distributions(path=[str(site)]):
        # The files it installed inside the folder (a RECORD also lists scripts put above it).
        tops = {Path(str(f)).parts[0] for f in dist.files or () if str(f).endswith(".py")} - {"..", "."}
        found[f'{dist.metadata["Name"]} {dist.version}'] = sorted(site / t for t in tops if not t.endswith(".dist-info"))
    return dict(sorted(found.items()))


# `--preview` when asked: every run of `amplint check` below takes it.
MODE: list[str] = []


def amplint(*args: str, cwd: Path | None = None) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--exit-zero", *MODE,
                          "--output-format", "json", *args], capture_output=True, text=True, cwd=cwd)
    return json.loads(out.stdout or "[]")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


def check_project(name: str, paths: list[Path]) -> dict:
    files = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*.py"))]
    row = {"project": name, "files": len(files),
           "lines": sum(p.read_bytes().count(b"\n") for p in files), "broken": []}
    findings = amplint(*map(str, paths))
    row["findings"] = collections.Counter(d["code"] for d in findings)
    row["internal"] = [d for d in findings if d["code"] == "AMP999"]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        for path in paths:
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, copy / path.name)
        before = snapshot(copy)
        subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--exit-zero", *MODE, "--fix",
                        "--unsafe-fixes", "."], cwd=copy, capture_output=True)
        after = snapshot(copy)
        changed = [f for f in after if after[f] != before.get(f)]
        row["changed"] = len(changed)
        for f in changed:
            try:
                compile(after[f], f, "exec")
            except SyntaxError as exc:
                row["broken"].append(f"{f} no longer compiles: {exc}")
        subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--exit-zero", *MODE, "--fix",
                        "--unsafe-fixes", "."], cwd=copy, capture_output=True)
        if snapshot(copy) != after:
            row["broken"].append("a second --fix changed files again")
        left = [d for d in amplint(".", cwd=copy) if d["fix"] is not None]
        if left:
            row["broken"].append(f"{len(left)} fixable findings left after --fix, e.g. "
                                 f"{left[0]['filename']}:{left[0]['location']['row']} {left[0]['code']}")
    return row


def report(rows: list[dict]) -> str:
    codes = sorted({c for r in rows for c in r["findings"]})
    lines = ["| project | files | lines | " + " | ".join(codes) + " | internal errors | files fixed | invariants |",
             "|---|---|---|" + "---|" * len(codes) + "---|---|---|"]
    for r in rows:
        cells = [str(r["findings"].get(c, 0)) for c in codes]
        lines.append(f"| {r['project']} | {r['files']} | {r['lines']:,} | " + " | ".join(cells) +
                     f" | {len(r['internal'])} | {r['changed']} | {'ok' if not r['broken'] else 'BROKEN'} |")
    for r in rows:
        for item in r["broken"] + [f"internal error: {d['filename']}: {d['message']}" for d in r["internal"]]:
            lines.append(f"\n- {r['project']}: {item}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path("ecosystem.md"))
    parser.add_argument("--preview", action="store_true", help="with the preview rules")
    parser.add_argument("--corpus", type=Path, nargs="+", help="folders of releases installed with pip --target")
    args = parser.parse_args()
    MODE[:] = ["--preview"] if args.preview else []
    sites = [folder.resolve() for folder in args.corpus] if args.corpus else [install_corpus()]
    rows = [check_project(name, paths) for site in sites for name, paths in projects(site).items() if paths]
    text = report(rows)
    args.report.write_text(text, encoding="utf-8")
    print(text)
    sys.exit(1 if any(r["broken"] or r["internal"] for r in rows) else 0)


if __name__ == "__main__":
    main()
