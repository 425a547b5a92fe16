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
