"""Code the project never uses does not run under the autocast a trainer of another file opens:
AMP008's loss outside any region needs its class or function used (`reach.used`). Real projects
on disk, the real CLI."""

import json
import textwrap

from click.testing import CliRunner

from amplint.cli import main

TRAINER = """\
import torch


def fit(model, loader, optimizer):
    for batch in loader:
        with torch.autocast("cuda"):
            loss = model(batch)
        loss.backward()
        optimizer.step()
"""

LOSSES = """\
import torch
import torch.nn.functional as F
from torch import nn


class MaskLoss(nn.Module):
    def forward(self, probs, target):
        return F.binary_cross_entropy(probs, target)


def pairwise_loss(scores, labels):
    return F.binary_cross_entropy(torch.sigmoid(scores), labels)


class ProbeHead(nn.Module):
    def __init__(self):
        super(ProbeHead).__init__()
        self.proj = nn.Linear(8, 1)

    def forward(self, x, y):
        return nn.BCELoss()(torch.sigmoid(self.proj(x)), y)
"""


def _project(tmp_path, files: dict[str, str]):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "trainer.py").write_text(TRAINER)
    (root / "pkg" / "losses.py").write_text(LOSSES)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _rows(root, monkeypatch, *extra):
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", "AMP008", "--output-format", "json", "--no-cache",
                                       *extra, "."])
    assert result.exit_code in (0, 1), result.output
    return sorted((f["filename"], f["location"]["row"]) for f in json.loads(result.output))


def test_losses_nothing_uses_are_not_reported(tmp_path, monkeypatch):
    # only an unused model imports them; the probe head can never be built (`super(ProbeHead)`)
    root = _project(tmp_path, {"pkg/legacy.py": """\
        from torch import nn
        from .losses import MaskLoss, pairwise_loss


        class LegacyModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.loss = MaskLoss()

            def forward(self, x, y):
                return self.loss(x, y) + pairwise_loss(x, y)
        """, "pkg/probe.py": """\
        from .losses import ProbeHead

        HEADS = {"probe": ProbeHead}
        """})
    assert _rows(root, monkeypatch) == []


def test_losses_a_used_model_calls_are_reported(tmp_path, monkeypatch):
    root = _project(tmp_path, {"pkg/model.py": """\
        from torch import nn
        from .losses import MaskLoss, pairwise_loss


        class Segmenter(nn.Module):
            def __init__(self):
                super().__init__()
                self.loss = MaskLoss()

            def forward(self, x, y):
                return self.loss(x, y) + pairwise_loss(x, y)
        """, "pkg/build.py": """\
        from .model import Segmenter

        MODELS = {"segmenter": Segmenter}
        """})
    assert _rows(root, monkeypatch) == [("pkg/losses.py", 8), ("pkg/losses.py", 12)]


def test_a_re_export_a_config_file_and_a_registry_are_uses(tmp_path, monkeypatch):
    root = _project(tmp_path, {"pkg/__init__.py": "from .losses import MaskLoss\n",
                               "configs/train.yaml": "loss:\n  type: pairwise_loss\n",
                               "pkg/heads.py": """\
        import torch.nn.functional as F
        from torch import nn

        from .registry import HEADS


        @HEADS.register_module()
        class BinaryHead(nn.Module):
            def forward(self, probs, target):
                return F.binary_cross_entropy(probs, target)
        """, "pkg/registry.py": "HEADS = {}\n"})
    assert _rows(root, monkeypatch) == [("pkg/heads.py", 10), ("pkg/losses.py", 8), ("pkg/losses.py", 12)]
