"""How long `amplint server` takes to answer an edit: from a didChange notification to the
publishDiagnostics of that version, on a ~1,000-line training module built from the fixtures'
training scripts (each copy's functions and classes renamed), in a project beside the models
module it imports. The first check (open) is reported apart; then each edit changes one line
and waits for its diagnostics before the next. The server waits ``DEBOUNCE_SECONDS`` after a
change before it checks (a burst of keystrokes is checked once): the latency is printed with
that wait and without it.

    python benchmarks/lsp_latency.py                # 40 edits
    python benchmarks/lsp_latency.py --edits 100 --lines 2000
    python benchmarks/lsp_latency.py --file .corpus/site/diffusers/training_utils.py

``--file`` times edits of a module of a real project instead (the dev corpus of
``lint_speed.py``), where the project's other files are many: the edits are not saved.
``--typing N`` then types: N bursts of five changes 120 ms apart, each timed from its last
change to the findings of that version.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from amplint.server.server import DEBOUNCE_SECONDS  # noqa: E402
from lsp_client import Client  # noqa: E402

SCRIPTS = ["faulty/train_amp.py", "faulty/gan_trainer.py", "faulty/legacy_trainer.py", "faulty/segmentation_fp16.py",
           "correct/train_amp.py", "correct/gan_trainer.py", "correct/legacy_trainer.py",
           "correct/segmentation_fp16.py", "correct/amp_recipes.py"]
_IMPORT = re.compile(r"^(?:import|from)\s.*$", re.MULTILINE)
_DEFINED = re.compile(r"^(?:def|class)\s+(\w+)", re.MULTILINE)
_DOCSTRING = re.compile(r'^"""(?:.|\n)*?"""\n', re.MULTILINE)
_MAIN = re.compile(r'^if __name__ == "__main__":\n(?:    .*\n|\n)*', re.MULTILINE)


def training_module(lines: int) -> str:
    """The fixtures' training scripts, their imports once at the top, copied with every
    top-level function and class renamed per copy until the module has ``lines`` lines."""
    imports: dict[str, None] = {}
    bodies = []
    for name in SCRIPTS:
        text = _MAIN.sub("", _DOCSTRING.sub("", (ROOT / "fixtures" / name).read_text(), count=1))
        imports.update(dict.fromkeys(_IMPORT.findall(text)))
        bodies.append(_IMPORT.sub("", text).strip("\n") + "\n")
    header = "\n".join(imports) + "\n"
    out, copy = [header], 0
    while sum(part.count("\n") for part in out) < lines:
        body = bodies[copy % len(bodies)]
        for defined in set(_DEFINED.findall(body)):
            body = re.sub(rf"\b{defined}\b", f"{defined}_{copy}", body)
        out.append("\n\n" + body)
        copy += 1
    return "".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=40)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--file", type=Path, help="a module of a real project, edited in place of the built one")
    parser.add_argument("--typing", type=int, default=0,
                        help="then N bursts of 5 changes 120 ms apart, as typed: from each burst's last change "
                             "to its findings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.file is not None:
            path = args.file.resolve()
            project, text = path.parent, path.read_text(encoding="utf-8")
        else:
            project = Path(tmp)
            (project / "pyproject.toml").write_text("[project]\nname = 'trainer'\ndependencies = ['torch>=2.4']\n")
            shutil.copy(ROOT / "fixtures" / "faulty" / "models.py", project / "models.py")
            path = project / "train.py"
            text = training_module(args.lines)
            path.write_text(text)
        client = Client(cwd=project)
        try:
            client.initialize(project)
            start = time.perf_counter()
            uri = client.open(path, text)
            findings = client.diagnostics(uri, 1)
            first = time.perf_counter() - start
            latencies = []
            lines = text.splitlines(keepends=True)
            for version in range(2, args.edits + 2):
                # A changed literal on a line of its own, as a typist's edit: the findings stay.
                edited = "".join(lines) + f"\nLEARNING_RATE = {version}e-4\n"
                start = time.perf_counter()
                client.change(uri, edited, version)
                client.diagnostics(uri, version)
                latencies.append(time.perf_counter() - start)
            typed = []
            version = args.edits + 1
            for _ in range(args.typing):
                for keystroke in range(5):
                    if keystroke:
                        time.sleep(0.12)
                    version += 1
                    client.change(uri, "".join(lines) + f"\nLEARNING_RATE = {version}e-4\n", version)
                start = time.perf_counter()
                client.diagnostics(uri, version)
                typed.append(time.perf_counter() - start)
            code = client.shutdown_and_exit()
        finally:
            client.kill()
    ms = sorted(1000 * s for s in latencies)
    debounce = 1000 * DEBOUNCE_SECONDS
    print(f"{text.count(chr(10))} lines, {len(findings)} findings; server exit status {code}")
    print(f"open -> first diagnostics: {1000 * first:.0f} ms")
    print(f"didChange -> publishDiagnostics over {len(ms)} edits: median {statistics.median(ms):.0f} ms, "
          f"min {ms[0]:.0f}, max {ms[-1]:.0f} (the {debounce:.0f} ms debounce included)")
    print(f"without the debounce: median {statistics.median(ms) - debounce:.0f} ms")
    if typed:
        print(f"typing, from the last change of a burst to its findings over {len(typed)} bursts: "
              f"median {1000 * statistics.median(typed):.0f} ms, max {1000 * max(typed):.0f} ms")


if __name__ == "__main__":
    main()
