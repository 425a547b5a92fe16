"""A project's own tables (issue #15 item 4): `amplint probe --import mypkg --output-dir
.amplint/policies` writes them, `[tool.amplint] policies` makes the linter read them, merged
over the committed ones. Every table here is written by the real probe, from a package the
test writes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from amplint import policy as policy_mod  # noqa: E402

MYPKG_OPS = textwrap.dedent("""\
    import torch

    @torch.library.custom_op("mylib::fused_mm", mutates_args=())
    def fused_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    @fused_mm.register_fake
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[1])

    # Runs in float16 under CUDA autocast.
    torch.library.register_autocast("mylib::fused_mm", "cuda", torch.float16)

    @torch.library.custom_op("mylib::fused_loss", mutates_args=())
    def fused_loss(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (p - y).pow(2).mean()

    @fused_loss.register_fake
    def _(p, y):
        return p.new_empty(())

    # Refused under CUDA autocast, as torch refuses binary_cross_entropy.
    _lib = torch.library.Library("mylib", "FRAGMENT")

    def _refuse(p, y):
        raise RuntimeError("mylib::fused_loss is unsafe to autocast")

    _lib.impl("fused_loss", _refuse, "AutocastCUDA")
""")

# A project that replaces torch's own CUDA autocast kernel of binary_cross_entropy with one
# that runs it in float32: its table's entry for the aten op must win over the committed one.
MYPKG_BCE = textwrap.dedent("""\
    import torch

    _lib = torch.library.Library("aten", "IMPL")

    def _bce_in_float32(input, target, weight=None, reduction=1):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)):
            return torch.ops.aten.binary_cross_entropy.default(
                input.float(), target.float(), None if weight is None else weight.float(), reduction)

    _lib.impl("binary_cross_entropy", _bce_in_float32, "AutocastCUDA")
""")

TRAIN = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F
    import mypkg
    from mypkg.ops import fused_loss, fused_mm

    def step(x, w, y):
        with torch.autocast("cuda"):
            h = fused_mm(x, w)
            loss = fused_loss(h, y)
            again = mypkg.fused_loss(h, y)
            bce = F.binary_cross_entropy(torch.sigmoid(h), y)
        out = torch.mm(h, torch.randn(64, 10, device="cuda"))
        return loss, again, bce, out
""")


def _amplint(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "amplint", *map(str, args)], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)


def _write_package(root: Path, with_bce: bool = False) -> None:
    pkg = root / "mypkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "ops.py").write_text(MYPKG_OPS)
    (pkg / "__init__.py").write_text("from .ops import fused_loss, fused_mm\n")
    if with_bce:
        (pkg / "bce.py").write_text(MYPKG_BCE)


def _probe(project: Path, *imports: str, ops=("mylib::*",), out=".amplint/policies") -> Path:
    args = ["probe", "--device", "cuda", "--format", "json", "--output-dir", out]
    for name in imports:
        args += ["--import", name]
    for pattern in ops:
        args += ["--ops", pattern]
    result = _amplint(*args, cwd=project, env={"PYTHONPATH": str(project)})
    assert result.returncode == 0, result.stderr
    return project / out


@pytest.fixture(scope="module")
def probed_project(tmp_path_factory) -> Path:
    """A project with its package, the probe's tables of its ops, and a training step."""
    project = tmp_path_factory.mktemp("project")
    _write_package(project)
    _probe(project, "mypkg")
    (project / "train.py").write_text(TRAIN)
    return project


@pytest.fixture
def project(probed_project, tmp_path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(probed_project, copy)
    return copy


@pytest.fixture(scope="module")
def probed_project_with_bce(probed_project, tmp_path_factory) -> Path:
    """The project whose package also replaces torch's CUDA autocast kernel of
    binary_cross_entropy, re-probed with it imported: its ops and binary_cross_entropy."""
    project = tmp_path_factory.mktemp("project_with_bce") / "project"
    shutil.copytree(probed_project, project)
    _write_package(project, with_bce=True)
    _probe(project, "mypkg", "mypkg.bce", ops=("mylib::*", "binary_cross_entropy"))
    return project


@pytest.fixture
def project_with_bce(probed_project_with_bce, tmp_path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(probed_project_with_bce, copy)
    return copy


def _findings(project: Path, *extra) -> list[tuple[int, str, str]]:
    result = _amplint("check", "train.py", "--output-format", "json", "--no-cache", *extra, cwd=project)
    assert result.returncode in (0, 1), result.stderr
    return sorted((d["location"]["row"], d["code"], d["message"]) for d in json.loads(result.stdout))


def _use_tables(project: Path, folder: str = ".amplint/policies") -> None:
    (project / "pyproject.toml").write_text(f'[tool.amplint]\npolicies = "{folder}"\n')


def test_probe_writes_the_projects_ops_with_their_python_names(probed_project):
    table = json.loads((probed_project / ".amplint" / "policies" / "cuda.json").read_text())
    assert table["imports"] == ["mypkg"]
    entries = {e["op"]: e for e in table["ops"]}
    assert set(entries) == {"mylib::fused_mm", "mylib::fused_loss"}
    assert entries["mylib::fused_mm"]["policy"] == "lower_precision_fp"
    assert entries["mylib::fused_loss"]["policy"] == "banned"
    for name in ("fused_mm", "fused_loss"):
        # torch.ops, where the custom_op function is defined, and where the package re-exports it
        assert {f"torch.ops.mylib.{name}", f"mypkg.ops.{name}", f"mypkg.{name}"} <= \
            set(entries[f"mylib::{name}"]["python"])


def test_without_policies_the_projects_ops_are_unknown(project):
    codes = [(row, code) for row, code, _ in _findings(project)]
    assert codes == [(11, "AMP008")]  # torch's own binary_cross_entropy only


def test_the_linter_sees_the_projects_ops(project):
    _use_tables(project)
    found = _findings(project)
    assert [(row, code) for row, code, _ in found] == [
        (9, "AMP008"), (10, "AMP008"), (11, "AMP008"), (12, "AMP019")]
    assert "`mypkg.ops.fused_loss` reaches `mylib::fused_loss`, which autocast refuses on cuda" in found[0][2]
    assert "`mypkg.fused_loss` reaches `mylib::fused_loss`" in found[1][2]
    # the committed tables stay for torch's ops
    assert "`torch.nn.functional.binary_cross_entropy` reaches `aten::binary_cross_entropy`" in found[2][2]
    assert "`h` comes out of an autocast region in lower precision" in found[3][2]


def test_tables_are_read_from_the_pyproject_folder(project):
    _use_tables(project)
    (project / "sub").mkdir()
    shutil.move(project / "train.py", project / "sub" / "train.py")
    result = _amplint("check", "train.py", "--output-format", "json", "--no-cache", cwd=project / "sub")
    assert sorted(d["location"]["row"] for d in json.loads(result.stdout)) == [9, 10, 11, 12]


def test_the_projects_entry_wins_for_the_same_op(project_with_bce):
    """The project's package replaces torch's CUDA autocast kernel of binary_cross_entropy with a
    float32 one; its table (probed with the package imported) says so, and wins."""
    project = project_with_bce
    table = json.loads((project / ".amplint" / "policies" / "cuda.json").read_text())
    assert {e["op"]: e["policy"] for e in table["ops"]}["aten::binary_cross_entropy"] == "fp32"
    _use_tables(project)
    assert [(row, code) for row, code, _ in _findings(project)] == [(9, "AMP008"), (10, "AMP008"), (12, "AMP019")]


def test_another_torch_version_adds_only_the_projects_ops(project_with_bce, tmp_path, monkeypatch):
    """Tables the project probed with torch 2.13 over committed tables of another version: its
    own ops are added, torch's ops keep the committed version's answers."""
    project = project_with_bce
    # The committed tables, copied and labelled 2.99: a stand-in for a newer torch's.
    root = tmp_path / "policies"
    shutil.copytree(policy_mod.policy_dir() / "torch-2.13", root / "torch-2.99")
    cuda = json.loads((root / "torch-2.99" / "cuda.json").read_text())
    cuda["torch_version"] = "2.99.0"
    (root / "torch-2.99" / "cuda.json").write_text(json.dumps(cuda))
    monkeypatch.setattr(policy_mod, "policy_dir", lambda: root)
    policy_mod.load_policy.cache_clear()
    try:
        table = policy_mod.load_policy("cuda", None, str(project / ".amplint" / "policies"))
        assert table.policy("aten::binary_cross_entropy") == "banned"  # 2.99's answer stays
        assert table.policy("mylib::fused_loss") == "banned"
        assert table.ops_reached_by("mypkg.ops.fused_mm") == ["mylib::fused_mm"]
    finally:
        policy_mod.load_policy.cache_clear()


def test_a_subfolder_per_torch_version_is_chosen_like_the_committed_ones(project):
    shutil.move(project / ".amplint" / "policies", project / "torch-2.13")
    (project / ".amplint" / "policies").mkdir()
    shutil.move(project / "torch-2.13", project / ".amplint" / "policies" / "torch-2.13")
    _use_tables(project)
    assert [(row, code) for row, code, _ in _findings(project)] == \
        [(9, "AMP008"), (10, "AMP008"), (11, "AMP008"), (12, "AMP019")]


def test_the_cache_follows_the_tables(project):
    _use_tables(project)
    first = _amplint("check", "train.py", "--output-format", "json", cwd=project)
    assert len(json.loads(first.stdout)) == 4
    # Re-probed without the ban: the cached findings must not survive.
    (project / "mypkg" / "ops.py").write_text(MYPKG_OPS.split("# Refused")[0])
    _probe(project, "mypkg")
    again = _amplint("check", "train.py", "--output-format", "json", cwd=project)
    assert sorted(d["code"] for d in json.loads(again.stdout)) == ["AMP008", "AMP019"]


@pytest.mark.parametrize("setup,expected", [
    ("missing", "no such folder"),
    ("file", "not a folder"),
    ("empty", "holds no policy table"),
    ("not json", "cuda.json: not a policy table: "),
    ("field missing", "cuda.json: not a policy table: field 'ops' missing"),
    ("bad entry", "cuda.json: not a policy table: ops[0] has no 'op' name"),
    ("not a string", "'policies' must be a folder's path"),
])
def test_bad_tables_are_a_configuration_error(project, setup, expected):
    folder = project / ".amplint" / "policies"
    table = json.loads((folder / "cuda.json").read_text())
    value = '".amplint/policies"'
    if setup == "missing":
        shutil.rmtree(folder)
    elif setup == "file":
        shutil.rmtree(folder)
        folder.write_text("")
    elif setup == "empty":
        shutil.rmtree(folder)
        folder.mkdir()
    elif setup == "not json":
        (folder / "cuda.json").write_text("{not json")
    elif setup == "field missing":
        del table["ops"]
        (folder / "cuda.json").write_text(json.dumps(table))
    elif setup == "bad entry":
        table["ops"][0] = {"policy": "fp32"}
        (folder / "cuda.json").write_text(json.dumps(table))
    else:
        value = "3"
    (project / "pyproject.toml").write_text(f"[tool.amplint]\npolicies = {value}\n")
    result = _amplint("check", "train.py", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "pyproject.toml [tool.amplint]" in line and expected in line, line
