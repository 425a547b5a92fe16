"""Issue #16: what a hostile repository or a careless user can throw at `amplint check`, on real
git repositories: names that are not UTF-8, special files, commands the repository configures,
fixes on files with many findings."""

import json
import os
import subprocess
import sys

import libcst as cst
import pytest

from amplint.engine import source as source_io
from amplint.engine.rule import rule_by_code
from amplint.engine.runner import lint_source
from conftest import ROOT

FAULTY = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()
FIXED = (ROOT / "fixtures" / "fixed" / "train_amp.py").read_text()
BAD_NAME = os.fsdecode(b"bad\xffname.py")  # not UTF-8: the name's byte 0xff comes back as a surrogate


def _amplint(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "amplint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _git_repo(path):
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    return path


def test_a_file_name_that_is_not_utf8_is_checked_reported_and_fixed(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / BAD_NAME).write_text(FAULTY)
    (repo / ".gitignore").write_text("ignored.py\n")
    (repo / "ignored.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "json", ".", cwd=repo)
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)
    assert {f["filename"] for f in findings} == {"bad\ufffdname.py"}  # git's answer still applied
    assert any(f["code"] == "AMP001" and f["location"] == {"row": 34, "column": 13} for f in findings)
    concise = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=repo)
    assert "bad\ufffdname.py:34:13: AMP001 " in concise.stdout
    fixed = _amplint("check", "--no-cache", "--fix", ".", cwd=repo)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert (repo / BAD_NAME).read_text() == FIXED


def test_checking_a_repository_runs_no_command_its_git_config_names(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / "train.py").write_text(FAULTY)
    subprocess.run(["git", "add", "train.py"], cwd=repo, check=True)  # an index for fsmonitor to refresh
    subprocess.run(["git", "config", "core.fsmonitor", "touch FSMONITOR_RAN; echo"], cwd=repo, check=True)
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    hook = hooks / "post-index-change"
    hook.write_text("#!/bin/sh\ntouch HOOK_RAN\n")
    hook.chmod(0o755)
    # The commands work: git run directly runs both.
    (repo / "train.py").touch()
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, check=True)
    for marker in ("FSMONITOR_RAN", "HOOK_RAN"):
        (repo / marker).unlink()
    (repo / ".gitignore").write_text("generated/\n")
    (repo / "generated").mkdir()
    (repo / "generated" / "g.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=repo)
    assert result.returncode == 1
    assert not (repo / "FSMONITOR_RAN").exists() and not (repo / "HOOK_RAN").exists()
    assert "generated" not in result.stdout and "train.py:34:13: AMP001" in result.stdout  # .gitignore honoured


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_special_files_are_reported_not_read(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / "train.py").write_text(FAULTY)
    os.mkfifo(repo / "f.py")  # reading one blocks until a writer comes: forever
    (repo / "z.py").symlink_to("/dev/zero")  # never ends
    for args in (["."], ["f.py", "z.py", "train.py"]):
        result = _amplint("check", "--no-cache", "--output-format", "concise", *args, cwd=repo, timeout=60)
        assert result.returncode == 2  # files it could not check
        assert "f.py:1:1: AMP999 cannot check f.py: not a regular file (a FIFO)" in result.stdout
        assert "z.py:1:1: AMP999 cannot check z.py: not a regular file (a character device)" in result.stdout
        assert "train.py:34:13: AMP001" in result.stdout  # the others still checked


def test_a_file_over_the_size_cap_is_reported_not_read(tmp_path):
    big = tmp_path / "huge.py"
    with open(big, "wb") as handle:
        handle.truncate(source_io.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    (tmp_path / "train.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "huge.py:1:1: AMP999 cannot check huge.py: larger than 64 MiB; not read" in result.stdout
    assert "train.py:34:13: AMP001" in result.stdout


def _training_steps(count: int) -> str:
    step = ("def step_{i}(model, opt, scaler, x):\n"
            "    with torch.autocast(\"cuda\"):\n"
            "        loss = model(x).sum()\n"
            "        scaler.scale(loss).backward()\n"
            "    clip_grad_norm_(model.parameters(), 1.0)\n"
            "    scaler.step(opt)\n"
            "    scaler.update()\n\n")
    return "import torch\nfrom torch.nn.utils import clip_grad_norm_\n\n" + "".join(
        step.format(i=i) for i in range(count))


def test_a_structural_fix_renders_what_it_changes_not_the_whole_file(monkeypatch):
    # Rendering the whole module for each fix made time grow with findings x file size.
    def whole_module(*args, **kwargs):
        raise AssertionError("a fix rendered the whole module")

    monkeypatch.setattr(cst.Module, "deep_replace", whole_module)
    result = lint_source("t.py", _training_steps(30), [rule_by_code("AMP001"), rule_by_code("AMP002")], fix=True)
    fixed_step = ("def step_{i}(model, opt, scaler, x):\n"
                  "    with torch.autocast(\"cuda\"):\n"
                  "        loss = model(x).sum()\n"
                  "    scaler.scale(loss).backward()\n"
                  "    scaler.unscale_(opt)\n"
                  "    clip_grad_norm_(model.parameters(), 1.0)\n"
                  "    scaler.step(opt)\n"
                  "    scaler.update()\n\n")
    assert result.source == "import torch\nfrom torch.nn.utils import clip_grad_norm_\n\n" + "".join(
        fixed_step.format(i=i) for i in range(30))
    assert result.fixes_applied == 60 and result.diagnostics == []
