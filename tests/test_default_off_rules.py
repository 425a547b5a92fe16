"""Style rules are off by default: a select that names them (or a prefix of them) turns them on."""

from pathlib import Path

import amplint
from amplint.engine.config import Config, load

CODE = """\
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(3, device=x.device, dtype=x.dtype)
"""


def _codes(config: Config, **selection) -> set[str]:
    return {r.code for r in config.rules(**selection)}


def test_a_default_off_rule_needs_a_select(tmp_path: Path):
    config = Config(root=tmp_path)
    assert "AMP020" not in _codes(config) and "AMP003" in _codes(config)
    assert "AMP020" in _codes(config, select=["AMP020"])
    assert "AMP020" in _codes(config, select=["AMP"])
    assert "AMP020" in _codes(config, extend_select=["AMP020"])
    assert "AMP020" not in _codes(config, select=["AMP"], ignore=["AMP020"])


def test_pyproject_select_turns_it_on(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nextend-select = ["AMP020"]\n')
    assert "AMP020" in _codes(load(tmp_path))


def test_check_source_follows_the_default():
    assert amplint.check_source(CODE) == []
    [d] = amplint.check_source(CODE, select=["AMP020"])
    assert d.code == "AMP020" and d.fix.applicability == "safe"
