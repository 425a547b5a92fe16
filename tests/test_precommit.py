"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit in a temporary git repo."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

FAULTY = textwrap.dedent("""\
    import torch
    scaler = torch.cuda.amp.GradScaler()
""")


_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _git(*args, cwd):
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**_GIT_IDENTITY, "HOME": str(cwd), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory):
    """A snapshot of this checkout as a git repo, which pre-commit can install hooks from."""
    repo = tmp_path_factory.mktemp("amplint-hooks")
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy2(ROOT / name, repo / name)
    shutil.copytree(ROOT / "amplint", repo / "amplint", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "policies", repo / "policies")
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "snapshot", cwd=repo)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    return repo, rev


def _pre_commit(project, home, *args):
    # HOME and pre-commit's cache (hook environments, virtualenv's caches) live outside the
    # project, so they never end up in its git index.
    return subprocess.run([sys.executable, "-m", "pre_commit", *args], cwd=project,
                          capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin",
                               "PRE_COMMIT_HOME": str(home / "pre-commit-cache")})


def test_hooks_fail_fix_and_pass_and_block_a_notebook(tmp_path, hook_repo):
    pytest.importorskip("pre_commit")
    repo, rev = hook_repo
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    _git("init", "-q", cwd=project)
    (project / ".pre-commit-config.yaml").write_text(textwrap.dedent(f"""\
        repos:
          - repo: {repo}
            rev: {rev}
            hooks:
              - id: amplint
              - id: amplint-fix
                stages: [manual]
    """))
    (project / "train.py").write_text(FAULTY)
    (project / "clean.py").write_text("x = 1\n")
    # pre-commit names every file; the configured excludes still apply (--force-exclude).
    (project / "pyproject.toml").write_text('[tool.amplint]\nextend-exclude = ["vendored"]\n')
    (project / "vendored").mkdir()
    (project / "vendored" / "old.py").write_text(FAULTY)
    _git("add", "train.py", "clean.py", "pyproject.toml", "vendored/old.py", ".pre-commit-config.yaml", cwd=project)

    checked = _pre_commit(project, home, "run", "amplint", "--all-files")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "train.py:2:10: AMP004" in checked.stdout and "vendored" not in checked.stdout

    fixed = _pre_commit(project, home, "run", "amplint-fix", "--all-files", "--hook-stage", "manual")
    assert fixed.returncode == 1  # pre-commit fails a hook that changed files
    assert 'torch.amp.GradScaler("cuda")' in (project / "train.py").read_text()
    assert (project / "vendored" / "old.py").read_text() == FAULTY

    _git("add", "train.py", "clean.py", ".pre-commit-config.yaml", cwd=project)
    again = _pre_commit(project, home, "run", "amplint", "--all-files")
    assert again.returncode == 0, again.stdout + again.stderr
    untracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project,
                               capture_output=True, text=True, check=True).stdout
    assert "??" not in untracked  # amplint's cache folder ignores itself

    only_clean = _pre_commit(project, home, "run", "amplint", "--files", "clean.py")
    assert only_clean.returncode == 0

    # A staged notebook with a mistake: the hook pre-commit installed runs on `git commit` and refuses it.
    (project / "explore.ipynb").write_text(_notebook("%matplotlib inline\nimport torch", FAULTY))
    _git("add", "explore.ipynb", cwd=project)
    installed = _pre_commit(project, home, "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    commit = subprocess.run(["git", "commit", "-m", "explore"], cwd=project, capture_output=True, text=True,
                            env={**_GIT_IDENTITY, "HOME": str(home), "PATH": "/usr/bin:/bin",
                                 "PRE_COMMIT_HOME": str(home / "pre-commit-cache")})
    assert commit.returncode == 1, commit.stdout + commit.stderr
    assert "explore.ipynb:cell 2:2:10: AMP004" in commit.stdout + commit.stderr
    log = subprocess.run(["git", "log", "--oneline"], cwd=project, capture_output=True, text=True)
    assert log.returncode != 0  # nothing was committed: the branch has no commit yet


def _notebook(*cells: str) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
         "source": source.splitlines(keepends=True)} for i, source in enumerate(cells)]}, indent=1) + "\n"
