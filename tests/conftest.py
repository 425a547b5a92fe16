import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_amplint():
    """Run the installed CLI as a user does: a separate process, real exit code."""
    import subprocess

    def run(*args, cwd=None, env=None, input=None):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "amplint", *map(str, args)], cwd=cwd,
                              env=full_env, capture_output=True, text=True, input=input)
    return run


@pytest.fixture(scope="session")
def example_path(tmp_path_factory):
    """Where a rule's example is checked: ``example.py``, or, for an example with a
    ``project``, that file at the root of a folder (marked by an empty ``pyproject.toml``)
    holding the project's other files."""
    written = {}

    def path(example) -> str:
        if not example.project:
            return "example.py"
        if example not in written:
            root = tmp_path_factory.mktemp("project")
            (root / "pyproject.toml").write_text("")
            for name, text in example.project:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
            (root / "example.py").write_text(example.code)
            written[example] = str(root / "example.py")
        return written[example]
    return path


@pytest.fixture(scope="session")
def probed_all(tmp_path_factory, worker_id) -> dict[str, dict]:
    """Every device this torch knows, probed as the committed tables were (auto mode): once per
    test session. Under xdist the first worker to need it probes and leaves the tables (JSON, as
    the probe writes them) for the others, which wait for them."""
    pytest.importorskip("torch")
    import json

    from filelock import FileLock  # a dependency of torch

    from amplint.probe import tables

    def probe() -> dict[str, dict]:
        return {t["device"]: t for t in tables.probe(tables.resolve_devices("all"), None, "auto", ())}

    if worker_id == "master":  # not under xdist
        return probe()
    shared = tmp_path_factory.getbasetemp().parent / "probed_all.json"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_text(json.dumps(probe()))
        return json.loads(shared.read_text())
