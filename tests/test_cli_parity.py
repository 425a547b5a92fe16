"""The options ruff users reach for (issue #16): --config, per-file configuration, --exclude and
--extend-exclude, --fix-only, --show-fixes, --add-noqa, AMP100 (unused-noqa) and shell completion.
Projects are temporary folders holding the fixtures' training code."""

import ast
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from amplint.cli import main
from conftest import ROOT

def _excerpt(path, function: str) -> str:
    """The fixture's torch imports and one function of it, as a file of its own."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    lines = source.splitlines(keepends=True)
    imports = [line for line in lines if line.startswith(("import torch", "import torch."))]
    return "".join(imports) + "\n\n" + "".join(lines[node.lineno - 1:node.end_lineno])


# The epoch loop of fixtures/faulty/train_amp.py: AMP004 at 14:14, AMP001 at 17:13, AMP002 at 20:9.
TRAIN = _excerpt(ROOT / "fixtures" / "faulty" / "train_amp.py", "train_one_epoch")
assert TRAIN.startswith("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\ndef train_one_epoch(")

# ResNetLite's class token from fixtures/faulty/models.py: AMP003 at 14:15, an unsafe fix only.
MODEL = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class ClassTokenHead(nn.Module):
        def __init__(self, width, num_classes):
            super().__init__()
            self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
            self.head = nn.Linear(width, num_classes)

        def forward(self, feats):
            tokens = feats.flatten(2).transpose(1, 2)
            # A learned-position-free class token, appended in front of the patch tokens.
            cls = torch.zeros(tokens.shape[0], 1, tokens.shape[2], device=tokens.device)
            tokens, _ = self.attn(*[torch.cat([cls, tokens], dim=1)] * 3)
            return self.head(tokens[:, 0])
''')

AMPLINT = Path(sys.executable).parent / "amplint"  # the installed console script (.venv/bin/amplint)


def _check(*args, input=None):
    return CliRunner().invoke(main, ["check", "--preview", "--no-cache", *map(str, args)], input=input)


def _findings(output: str) -> list[tuple[str, str]]:
    """(path:row:col, code) of each concise line."""
    return [(line.split(": ")[0], line.split(" ")[1]) for line in output.splitlines()]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def monorepo(tmp_path, monkeypatch):
    """A repository whose root project ignores AMP001, holding a project of its own in vision/
    that ignores AMP004 instead and leaves out its generated/ folder."""
    monkeypatch.chdir(tmp_path)
    return _write(tmp_path, {
        "pyproject.toml": '[project]\nname = "trainers"\n\n[tool.amplint]\nignore = ["AMP001"]\n',
        "train.py": TRAIN,
        "vision/pyproject.toml": '[tool.amplint]\nignore = ["AMP004"]\nextend-exclude = ["generated"]\n',
        "vision/train.py": TRAIN,
        "vision/generated/train_pb.py": TRAIN,
    })


# -- 1. --config ----------------------------------------------------------------------------

def test_config_file_replaces_discovery_and_anchors_patterns_at_the_current_folder(monorepo):
    _write(monorepo, {"ci/amplint.toml": '[tool.amplint]\nselect = ["AMP001", "AMP004"]\n'
                                         'per-file-ignores = {"vision/*" = ["AMP004"]}\n'})
    result = _check("--output-format", "concise", "--config", "ci/amplint.toml", ".")
    assert result.exit_code == 1, result.output
    # One file for every project: AMP001 back in the root's file, AMP002 nowhere (not selected),
    # vision's pyproject unread (its generated/ folder checked), the pattern read from here.
    assert _findings(result.stdout) == [
        ("train.py:14:14", "AMP004"), ("train.py:17:13", "AMP001"),
        ("vision/generated/train_pb.py:17:13", "AMP001"), ("vision/train.py:17:13", "AMP001")]


@pytest.mark.parametrize("content,message", [
    (None, "--config missing.toml: no such file"),
    ("[tool.amplint\nselect = \n", "missing.toml: cannot read TOML"),
    ('[project]\nname = "x"\n', "--config missing.toml: has no [tool.amplint] table"),
    ('[tool.amplint]\nselct = ["AMP001"]\n', "unknown key 'selct'"),
])
def test_config_file_missing_or_invalid_is_a_clear_error(monorepo, content, message):
    if content is not None:
        (monorepo / "missing.toml").write_text(content)
    result = _check("--config", "missing.toml", ".")
    assert result.exit_code == 2
    assert message in result.stderr and result.stdout == ""


# -- 2. per-file configuration ---------------------------------------------------------------

@pytest.mark.parametrize("paths", [(".",), ("vision", "train.py"), ("train.py", "vision/train.py")])
def test_each_file_takes_its_nearest_pyproject(monorepo, paths):
    result = _check("--output-format", "concise", *paths)
    assert result.exit_code == 1, result.output
    assert sorted(_findings(result.stdout)) == [
        # the root's settings: AMP001 ignored
        ("train.py:14:14", "AMP004"), ("train.py:20:9", "AMP002"),
        # vision's: AMP004 ignored (AMP001 reported), generated/ left out
        ("vision/train.py:17:13", "AMP001"), ("vision/train.py:20:9", "AMP002")]


def test_per_file_configuration_holds_in_worker_processes(tmp_path):
    """Enough files for the process pool: each worker applies each project's own settings."""
    files = {"pyproject.toml": '[tool.amplint]\nignore = ["AMP001"]\n',
             "vision/pyproject.toml": '[tool.amplint]\nselect = ["AMP004"]\n'}
    files.update({f"loops/epoch{i:02d}.py": TRAIN for i in range(40)})
    files.update({f"vision/loops/epoch{i:02d}.py": TRAIN for i in range(40)})
    _write(tmp_path, files)
    runs = [subprocess.run([str(AMPLINT), "check", "--preview", "--no-cache", "--output-format", "concise", "--jobs", jobs, "."],
                           cwd=tmp_path, capture_output=True, text=True) for jobs in ("1", "2")]
    assert runs[0].stdout == runs[1].stdout and runs[0].returncode == runs[1].returncode == 1
    codes = {(where.split("/")[0], code) for where, code in _findings(runs[0].stdout)}
    assert codes == {("loops", "AMP004"), ("loops", "AMP002"), ("vision", "AMP004")}
    assert len(runs[0].stdout.splitlines()) == 40 * 2 + 40


# -- 3. --exclude / --extend-exclude ---------------------------------------------------------

def test_extend_exclude_adds_and_exclude_replaces(monorepo):
    _write(monorepo, {"build/train.py": TRAIN, "legacy/train_v1.py": TRAIN})
    extended = _check("--output-format", "concise", "--extend-exclude", "legacy, vision/train.py", ".")
    assert {where.split(":")[0] for where, _ in _findings(extended.stdout)} == {"train.py"}
    # --exclude replaces the configured list, defaults included: build/ is checked again,
    # and vision's own extend-exclude still leaves out its generated/ folder.
    replaced = _check("--output-format", "concise", "--exclude", "legacy", ".")
    assert {where.split(":")[0] for where, _ in _findings(replaced.stdout)} == \
        {"build/train.py", "train.py", "vision/train.py"}


# -- 4. --fix-only ---------------------------------------------------------------------------

def test_fix_only_applies_fixes_and_reports_only_what_was_fixed(monorepo):
    _write(monorepo, {"model.py": MODEL})
    result = _check("--fix-only", "train.py", "model.py")
    # AMP003's unsafe fix is left, and with it a finding: --fix-only still exits 0, silently.
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "Fixed 2 findings in 1 file (1 more fixable with --unsafe-fixes)." in result.stderr
    fixed = (monorepo / "train.py").read_text()
    assert 'torch.amp.autocast("cuda")' in fixed and "scaler.unscale_(optimizer)" in fixed
    assert (monorepo / "model.py").read_text() == MODEL
    # The same run with --exit-non-zero-on-fix: 1 when something was fixed, 0 once nothing is.
    (monorepo / "train.py").write_text(TRAIN)
    assert _check("--fix-only", "--exit-non-zero-on-fix", "train.py").exit_code == 1
    again = _check("--fix-only", "--exit-non-zero-on-fix", "train.py")
    assert again.exit_code == 0 and "No fixes applied (1 file checked)." in again.stderr


# -- 5. --show-fixes -------------------------------------------------------------------------

def test_show_fixes_lists_the_fixes_per_file_and_rule(monorepo):
    _write(monorepo, {"model.py": MODEL, "legacy_trainer.py": (ROOT / "fixtures/faulty/legacy_trainer.py").read_text()})
    result = _check("--fix", "--show-fixes", "--output-format", "concise", "train.py", "model.py", "legacy_trainer.py")
    assert result.exit_code == 1  # AMP003 remains
    findings, listing = result.stdout.split("\n\n")
    assert _findings(findings) == [("model.py:14:15", "AMP003")]
    assert listing.splitlines() == [
        "Fixes applied:",
        "  legacy_trainer.py",
        "    AMP002 clip-grad-without-unscale: 1 finding fixed",
        "    AMP004 deprecated-amp-api: 1 finding fixed",
        "  train.py",
        "    AMP002 clip-grad-without-unscale: 1 finding fixed",
        "    AMP004 deprecated-amp-api: 1 finding fixed"]


def test_show_fixes_without_fix_marks_fixable_findings(monorepo):
    result = _check("--show-fixes", "--output-format", "concise", "train.py")
    assert result.exit_code == 1 and "Fixes applied" not in result.stdout
    assert result.stdout.count(" [*] ") == 2  # AMP004 and AMP002 (AMP001 is ignored here)
    assert (monorepo / "train.py").read_text() == TRAIN


# -- 6. --add-noqa ---------------------------------------------------------------------------

def test_add_noqa_suppresses_every_finding_keeping_encoding_endings_and_mode(tmp_path):
    legacy = tmp_path / "legacy_trainer.py"
    text = ("# -*- coding: latin-1 -*-\n# Entraîné avec l'ancienne API.\n"
            + (ROOT / "fixtures/faulty/legacy_trainer.py").read_text())
    legacy.write_bytes(text.replace("\n", "\r\n").encode("latin-1"))
    legacy.chmod(0o750)
    train = tmp_path / "train.py"
    train.write_text(TRAIN.replace("scaler.scale(loss).backward()", "scaler.scale(loss).backward()  # noqa: E501")
                     .replace("# Clip to keep", "# noqa: AMP002 (the next line's, not this one's)\n        # Clip"))
    result = subprocess.run([str(AMPLINT), "check", "--preview", "--no-cache", "--add-noqa", "."], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Added 5 noqa codes on 5 lines in 2 files." in result.stderr
    data = legacy.read_bytes()
    assert data.count(b"\r\n") == text.count("\n") and b"\n" not in data.replace(b"\r\n", b"")
    assert data.decode("latin-1").replace("\r\n", "\n") == text.replace(
        "from torch.cuda.amp import GradScaler, autocast\n",
        "from torch.cuda.amp import GradScaler, autocast  # noqa: AMP004\n").replace(
        "clip_grad_norm_(self.model.parameters(), self.max_grad_norm)\n",
        "clip_grad_norm_(self.model.parameters(), self.max_grad_norm)  # noqa: AMP002\n")
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o750
    lines = train.read_text().splitlines()
    assert "with torch.cuda.amp.autocast():  # noqa: AMP004" in lines[13]
    assert lines[16].endswith("scaler.scale(loss).backward()  # noqa: E501, AMP001")
    assert lines[20].endswith("nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)  # noqa: AMP002")
    # Nothing is left to report, and nothing is added twice.
    assert _check(tmp_path).exit_code == 0
    rerun = subprocess.run([str(AMPLINT), "check", "--preview", "--no-cache", "--add-noqa", "."], cwd=tmp_path,
                           capture_output=True, text=True)
    assert rerun.returncode == 0 and "Added 0 noqa codes on 0 lines in 0 files." in rerun.stderr


def test_add_noqa_leaves_lines_that_cannot_take_a_comment(tmp_path):
    path = tmp_path / "heads.py"
    source = textwrap.dedent('''\
        import torch
        import torch.nn.functional as F
        with torch.autocast("cuda"):
            log_probs = torch.log(F.softmax(class_logits, dim=-1)) + \\
                prior
    ''')
    path.write_text(source)
    result = _check("--add-noqa", "--output-format", "concise", path)
    assert result.exit_code == 1
    assert _findings(result.stdout) == [(f"{path}:4:17", "AMP013")]
    assert "Added 0 noqa codes" in result.stderr and "1 finding left as they were" in result.stderr
    assert path.read_text() == source


def test_add_noqa_does_not_combine_with_fixing(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    result = _check("--add-noqa", "--fix", tmp_path)
    assert result.exit_code == 2 and "--add-noqa cannot be combined with --fix" in result.stderr
    assert (tmp_path / "train.py").read_text() == TRAIN


# -- 7. AMP100 unused-noqa -------------------------------------------------------------------

STALE = (TRAIN
         .replace("scaler.scale(loss).backward()", "scaler.scale(loss).backward()  # noqa: AMP001, AMP002")
         .replace("scaler.update()", "scaler.update()  # noqa: AMP006, AMP06")
         .replace("total += loss.item()", "total += loss.item()  # noqa: AMP017 -- kept from the accumulation loop"))


def test_unused_noqa_is_off_by_default_and_reports_unused_and_unknown_codes(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(STALE)
    assert "AMP100" not in _check("--output-format", "concise", path).stdout
    result = _check("--extend-select", "AMP100", "--output-format", "concise", path)
    lines = [line for line in result.stdout.splitlines() if " AMP100 " in line]
    assert [line.split(": ")[0] for line in lines] == [f"{path}:17:44", f"{path}:22:26", f"{path}:23:31"]
    assert "AMP002 (no such finding on this line)" in lines[0] and "AMP001" not in lines[0].split("AMP100")[1]
    assert "AMP006 (no such finding on this line); AMP06 (not a rule's code)" in lines[1]
    # The code of a rule this run leaves out still counts when that rule would report there.
    narrow = _check("--select", "AMP100", "--output-format", "concise", path)
    assert [line.split(": ")[0] for line in narrow.stdout.splitlines()] == \
        [f"{path}:17:44", f"{path}:22:26", f"{path}:23:31"]


def test_unused_noqa_fix_removes_the_codes_or_the_comment(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(STALE)
    result = _check("--extend-select", "AMP100", "--fix", path)
    assert "Fixed 5 findings" in result.stderr
    lines = path.read_text().splitlines()
    assert lines[16].endswith("scaler.scale(loss).backward()  # noqa: AMP001")  # still suppressing
    assert lines[19].endswith("scaler.unscale_(optimizer)")  # AMP002's fix, one line more
    assert lines[22].endswith("scaler.update()")
    assert lines[23].endswith("total += loss.item()  # -- kept from the accumulation loop")
    assert " AMP001 " not in result.stdout and "AMP100" not in result.stdout


def test_unused_noqa_is_listed_and_documented():
    runner = CliRunner()
    listing = runner.invoke(main, ["rules"]).output.splitlines()
    assert listing[-1].split()[:3] == ["AMP100", "unused-noqa", "fix"]
    doc = runner.invoke(main, ["rule", "AMP100"]).output
    assert "## Design" in doc and "A rule, not an engine feature" in doc
    assert "## AMP100 unused-noqa" in (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")


# -- 8. The documentation and shell completion ----------------------------------------------------------

def test_shell_completion_through_click(tmp_path):
    env = {**os.environ, "_AMPLINT_COMPLETE": "bash_source"}
    script = subprocess.run([str(AMPLINT)], env=env, capture_output=True, text=True)
    assert script.returncode == 0 and "complete -o nosort -F _amplint_completion amplint" in script.stdout
    env = {**os.environ, "_AMPLINT_COMPLETE": "bash_complete", "COMP_WORDS": "amplint check --fix", "COMP_CWORD": "2"}
    words = subprocess.run([str(AMPLINT)], env=env, capture_output=True, text=True).stdout.splitlines()
    assert {"plain,--fix", "plain,--fix-only"} <= set(words)


def test_cli_page_documents_the_new_options():
    cli_page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for option in ("--config", "--exclude", "--extend-exclude", "--fix-only", "--show-fixes", "--add-noqa",
                   "AMP100", "_AMPLINT_COMPLETE=bash_source amplint"):
        assert option in cli_page, option
