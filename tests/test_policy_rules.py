"""Policy-driven rules read policies/ through one loader: the configured device and torch
version change their answers."""

import json
import shutil
import textwrap

import pytest

from amplint import policy as policy_mod
from amplint.engine.rule import all_rules
from amplint.engine.runner import lint_source
from amplint.policy import load_policy, loader

SNIPPET = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F

    def train_step(model, x, y, optimizer, device):
        with torch.autocast(device_type=device):
            loss = F.binary_cross_entropy(torch.sigmoid(model(x)), y)
        loss.backward()
        optimizer.step()
""")


def _codes(source, device, version=None):
    policy_rules = [r for r in all_rules() if r.uses_policy]
    result = lint_source("t.py", source, policy_rules, policy_loader=loader(device, version))
    return sorted({d.code for d in result.diagnostics})


def test_policy_rules_are_marked():
    assert {r.code for r in all_rules() if r.uses_policy} >= {"AMP008", "AMP009", "AMP011", "AMP019"}


def test_device_changes_the_answer():
    # cuda: binary_cross_entropy is banned and the default dtype is float16 (needs a scaler).
    assert _codes(SNIPPET, "cuda") == ["AMP008", "AMP009"]
    # cpu: binary_cross_entropy is allowed (fp32) and the default dtype is bfloat16.
    assert _codes(SNIPPET, "cpu") == []
    # mps: float16 by default, and binary_cross_entropy has no mps autocast kernel.
    assert _codes(SNIPPET, "mps") == ["AMP009"]


@pytest.fixture
def two_versions(tmp_path, monkeypatch):
    """The committed 2.13 tables plus a copy labelled 2.99 in which binary_cross_entropy is
    allowed on cuda: a stand-in for a future torch's probe output."""
    root = tmp_path / "policies"
    shutil.copytree(policy_mod.policy_dir(), root)
    future = root / "torch-2.99"
    shutil.copytree(root / "torch-2.13", future)
    table = json.loads((future / "cuda.json").read_text())
    for entry in table["ops"]:
        if entry["op"] == "aten::binary_cross_entropy":
            entry["policy"] = "fp32"
    table["torch_version"] = "2.99.0"
    (future / "cuda.json").write_text(json.dumps(table))
    monkeypatch.setattr(policy_mod, "policy_dir", lambda: root)
    load_policy.cache_clear()
    yield
    load_policy.cache_clear()


def test_torch_version_changes_the_answer(two_versions):
    assert policy_mod.available_versions() == ["2.13", "2.99"]
    assert "AMP008" in _codes(SNIPPET, "cuda", "2.13")
    assert "AMP008" not in _codes(SNIPPET, "cuda", "2.99")
    assert "AMP008" not in _codes(SNIPPET, "cuda")  # default: the newest tables


def test_configured_device_through_the_cli(tmp_path, run_amplint):
    (tmp_path / "train.py").write_text(SNIPPET)
    assert "AMP008" in run_amplint("check", "train.py", cwd=tmp_path).stdout
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\ndevice = "cpu"\n')
    result = run_amplint("check", "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\ndevice = "gpu"\n')
    result = run_amplint("check", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "no policy table for device 'gpu'" in result.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\ntorch-version = "1.0"\n')
    result = run_amplint("check", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "torch-version '1.0'" in result.stderr
