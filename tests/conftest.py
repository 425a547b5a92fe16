import dataclasses
import json
import os
import sys
import traceback
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


# The probes of every device this torch knows that the tests read, each by the real CLI: the
# tables (auto mode, as the committed ones were), the HTML page, and a text table of one op.
PROBES_OF_ALL_DEVICES = {
    "json": ["probe", "--device", "all", "--format", "json", "--output", "{folder}/probed_all.json"],
    "html": ["probe", "--device", "all", "--format", "html", "--output", "{folder}/ops.html"],
    "softmax.int": ["probe", "--device", "all", "--mode", "simulate", "--ops", "softmax.int"],
}


@dataclasses.dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def _run_probes(folder: Path) -> dict[str, dict]:
    """In one process: the probe traces torch's public API (most of its time) once for them all."""
    from click.testing import CliRunner

    from amplint.cli import main

    runs = {}
    for name, args in PROBES_OF_ALL_DEVICES.items():
        result = CliRunner().invoke(main, [arg.format(folder=folder) for arg in args])
        stderr = result.stderr
        if result.exc_info and not isinstance(result.exception, SystemExit):  # a crash: its traceback
            stderr += "".join(traceback.format_exception(*result.exc_info))
        runs[name] = {"returncode": result.exit_code, "stdout": result.stdout, "stderr": stderr}
    return runs


@pytest.fixture(scope="session")
def probes_of_all_devices(tmp_path_factory, worker_id) -> tuple[Path, dict[str, CliRun]]:
    """The folder the runs of PROBES_OF_ALL_DEVICES wrote their files in, and each run: once per
    test session. Under xdist the first worker to need them runs them, the others wait for them."""
    pytest.importorskip("torch")
    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent) / "probes_of_all_devices"
    done = folder / "runs.json"
    with FileLock(f"{folder}.lock"):
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            done.write_text(json.dumps(_run_probes(folder)))
        runs = json.loads(done.read_text())
    return folder, {name: CliRun(**run) for name, run in runs.items()}


@pytest.fixture(scope="session")
def probed_all(probes_of_all_devices) -> dict[str, dict]:
    """Every device this torch knows, probed as the committed tables were: its tables by device."""
    folder, runs = probes_of_all_devices
    path = folder / "probed_all.json"
    assert path.is_file(), runs["json"].stderr
    return {t["device"]: t for t in json.loads(path.read_text())}


def pytest_collection_modifyitems(items):
    """The modules that read the probes of every device run first: under xdist's load scheduling
    the first worker's first batch holds them all, so it probes while the others test and none
    waits for it."""
    probing = {item.path for item in items if "probes_of_all_devices" in item.fixturenames}
    items.sort(key=lambda item: item.path not in probing)
