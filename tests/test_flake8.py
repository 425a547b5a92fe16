"""The flake8 plugin, run by the real flake8 on a fixture."""

import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("flake8")


def test_flake8_select_amp_reports_amplint_findings():
    path = ROOT / "fixtures" / "faulty" / "train_amp.py"
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    # The same positions amplint prints (flake8 shows columns from 1 too).
    assert f"{path}:34:13: AMP001 `backward()` inside an autocast region" in out.stdout
    assert all(" AMP0" in line for line in lines)
    ours = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--output-format", "concise",
                           str(path)],
                          capture_output=True, text=True).stdout
    assert sorted(line.split(" ", 2)[:2] for line in lines) == \
        sorted(line.split(" ", 2)[:2] for line in ours.splitlines())


def test_flake8_noqa_is_honoured(tmp_path):
    path = tmp_path / "t.py"
    path.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()  # noqa: AMP004\n")
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _project(tmp_path, settings: str):
    """The faulty fixtures in src/ (legacy_trainer.py in src/legacy/) under a [tool.amplint]."""
    (tmp_path / "src" / "legacy").mkdir(parents=True)
    for path in (ROOT / "fixtures" / "faulty").glob("*.py"):
        folder = "src/legacy" if path.name == "legacy_trainer.py" else "src"
        (tmp_path / folder / path.name).write_text(path.read_text())
    (tmp_path / "pyproject.toml").write_text("[tool.amplint]\n" + settings)
    return tmp_path


def _findings(output: str) -> list[tuple[str, str]]:
    """(path:row:col:, code) of each line, sorted."""
    return sorted(tuple(line.split(" ", 2)[:2]) for line in output.splitlines())


def test_flake8_honours_tool_amplint_as_amplint_does(tmp_path):
    project = _project(tmp_path, 'ignore = ["AMP013"]\nextend-select = ["AMP020"]\n'
                                 'per-file-ignores = {"src/legacy/*" = ["AMP004"]}\ndevice = "cpu"\n')
    ours = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--output-format", "concise",
                           "src"], cwd=project, capture_output=True, text=True)
    expected = _findings(ours.stdout)
    codes = {code for _, code in expected}
    # The settings matter here: each one changes what amplint reports on these files.
    assert "AMP020" in codes and "AMP013" not in codes and "AMP014" not in codes  # AMP014: cuda only
    assert ("src/train_amp.py:31:14:", "AMP004") in expected
    assert not any(where.startswith("src/legacy/") and code == "AMP004" for where, code in expected)
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", "src"], cwd=project,
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert _findings(out.stdout) == expected
    # Found from the file's folder, not from the current one.
    elsewhere = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", str(project / "src")],
                               cwd=project.parent, capture_output=True, text=True)
    assert _findings(elsewhere.stdout.replace(f"{project}/", "")) == expected


def test_flake8_stdin_takes_the_configuration_of_the_current_folder(tmp_path):
    project = _project(tmp_path, 'per-file-ignores = {"src/legacy/*" = ["AMP004"]}\nignore = ["AMP001"]\n')
    source = (project / "src" / "train_amp.py").read_text()

    def codes(*args):
        out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", *args, "-"], cwd=project,
                             input=source, capture_output=True, text=True)
        return {line.split(" ", 2)[1] for line in out.stdout.splitlines()}

    assert codes() == {"AMP002", "AMP004"}
    assert codes("--stdin-display-name", "src/legacy/train.py") == {"AMP002"}


@pytest.mark.parametrize("settings,message", [
    ('selekt = ["AMP001"]\n', "unknown key 'selekt'"),
    ('ignore = ["AMP404"]\n', "unknown rule code 'AMP404'"),
    ('torch-version = "0.1"\n', "device / torch-version: "),
])
def test_flake8_reports_a_configuration_amplint_refuses(tmp_path, settings, message):
    (tmp_path / "pyproject.toml").write_text("[tool.amplint]\n" + settings)
    (tmp_path / "t.py").write_text((ROOT / "fixtures" / "faulty" / "train_amp.py").read_text())
    refused = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "t.py"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and message in refused.stderr
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", "t.py"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    [line] = out.stdout.splitlines()  # that, and no findings from settings amplint would not use
    assert line.startswith("t.py:1:1: AMP999 amplint configuration error: ")
    assert f"{tmp_path / 'pyproject.toml'} [tool.amplint]" in line and message in line
