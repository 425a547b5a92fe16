"""The fixtures end to end through the real CLI: faulty code reports, correct code is silent,
--fix produces exactly the expected files, and fixed code has no undefined names."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

FIXTURES = ROOT / "fixtures"


def _pyflakes_undefined(folder):
    out = subprocess.run([sys.executable, "-m", "pyflakes", str(folder)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "undefined name" in line]


def test_correct_code_is_silent(run_amplint):
    result = run_amplint("check", FIXTURES / "correct")
    assert result.returncode == 0, result.stdout
    assert result.stdout == ""


def test_faulty_code_has_a_scenario_for_every_rule(run_amplint):
    from amplint.engine.rule import all_rules
    by_default = run_amplint("check", "--output-format", "concise", FIXTURES / "faulty")
    assert by_default.returncode == 1
    reported = {line.split()[1] for line in by_default.stdout.splitlines()}
    # AMP003's scenario is on a preview path: a factory meeting a module's output in a forward.
    assert reported == {r.code for r in all_rules() if r.on_by_default and not r.preview} - {"AMP003"}
    preview = run_amplint("check", "--preview", "--output-format", "concise", FIXTURES / "faulty")
    assert {line.split()[1] for line in preview.stdout.splitlines()} == {r.code for r in all_rules() if r.on_by_default}
    every = run_amplint("check", "--preview", "--output-format", "concise", "--select", "AMP", FIXTURES / "faulty")
    assert {line.split()[1] for line in every.stdout.splitlines()} == {r.code for r in all_rules()}


@pytest.fixture
def faulty_copy(tmp_path):
    target = tmp_path / "project"
    shutil.copytree(FIXTURES / "faulty", target)
    return target


def test_fix_produces_the_expected_files(run_amplint, faulty_copy):
    result = run_amplint("check", "--preview", "--fix", faulty_copy)
    assert result.returncode == 1  # the unsafe AMP003 fix is left for --unsafe-fixes
    assert "AMP003" in result.stdout and "Fixed 8 findings in 3 files." in result.stderr
    for expected in sorted((FIXTURES / "fixed").glob("*.py")):
        assert (faulty_copy / expected.name).read_text() == expected.read_text(), expected.name
    again = run_amplint("check", "--preview", "--fix", faulty_copy)
    assert "Fixed" not in again.stderr
    for expected in sorted((FIXTURES / "fixed").glob("*.py")):
        assert (faulty_copy / expected.name).read_text() == expected.read_text(), expected.name


def test_unsafe_fixes_leave_no_fixable_finding_and_no_undefined_names(run_amplint, faulty_copy):
    before = _pyflakes_undefined(faulty_copy)
    run_amplint("check", "--preview", "--fix", "--unsafe-fixes", faulty_copy)
    remaining = json.loads(run_amplint("check", "--preview", "--output-format", "json", faulty_copy).stdout)
    assert remaining and all(d["fix"] is None for d in remaining)
    for path in faulty_copy.glob("*.py"):
        compile(path.read_text(), str(path), "exec")
    assert _pyflakes_undefined(faulty_copy) == before == []


def test_diff_shows_the_fix_and_writes_nothing(run_amplint, faulty_copy):
    before = {p.name: p.read_bytes() for p in faulty_copy.glob("*.py")}
    result = run_amplint("check", "--preview", "--diff", faulty_copy)
    assert result.returncode == 1
    assert "+        scaler.unscale_(optimizer)" in result.stdout
    assert "-from torch.cuda.amp import GradScaler, autocast" in result.stdout
    assert {p.name: p.read_bytes() for p in faulty_copy.glob("*.py")} == before
    # git's a/ b/ prefixes on an absolute path, without a doubled slash
    where = str(faulty_copy / "train_amp.py").lstrip("/")
    assert f"--- a/{where}\n+++ b/{where}\n" in result.stdout
