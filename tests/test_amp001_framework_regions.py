"""AMP001 where a framework opens the region and runs the backward: an optimizer wrapper's
`optim_context` runs autocast where the project makes the wrapper an AmpOptimWrapper (a
training script's `--amp`, a config's `dict(type='AmpOptimWrapper')`), and the wrapper's
`update_params(loss)` (or Lightning's `manual_backward(loss)`) is a backward pass, in the region
or in a method called there. Real multi-file projects, the real CLI."""

import pytest

from projects import findings, write_files

TRAIN_SCRIPT = """\
import argparse

from mmengine.config import Config
from mmengine.runner import Runner


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args()
    cfg = Config.fromfile(args.config)
    if args.amp:
        cfg.optim_wrapper.type = "AmpOptimWrapper"
    Runner.from_cfg(cfg).train()
"""
CONFIG = """\
optim_wrapper = dict(type="AmpOptimWrapper", optimizer=dict(type="Adam", lr=2e-4))
"""
GAN = """\
from mmengine.model import BaseModel


class TinyGAN(BaseModel):
    def train_step(self, data, optim_wrapper):
        disc_wrapper = optim_wrapper["discriminator"]
        with disc_wrapper.optim_context(self.discriminator):
            log_vars = self.train_discriminator(data, disc_wrapper)
        gen_wrapper = optim_wrapper["generator"]
        with gen_wrapper.optim_context(self.generator):
            loss = self.generator_loss(data)
            gen_wrapper.update_params(loss)
        return log_vars

    def train_discriminator(self, data, optimizer_wrapper):
        loss = self.discriminator_loss(data)
        optimizer_wrapper.update_params(loss)
        return {"loss_disc": loss.item()}
"""
# mmengine's own recipe: the forward and the loss in the context, the update after it
DETECTOR = """\
from mmengine.model import BaseModel


class TinyDetector(BaseModel):
    def train_step(self, data, optim_wrapper):
        with optim_wrapper.optim_context(self):
            losses = self._run_forward(data, mode="loss")
        parsed, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(parsed)
        return log_vars
"""


@pytest.mark.parametrize("switch, opened, place", [
    ({"tools/train.py": TRAIN_SCRIPT}, "when `--amp` is set (tools/train.py:10), as tools/train.py:14 sets "
                                       "`cfg.optim_wrapper.type = 'AmpOptimWrapper'`", ("tools/train.py", 14)),
    ({"configs/gan_fp16.py": CONFIG}, "with configs/gan_fp16.py:1, `type='AmpOptimWrapper'`",
     ("configs/gan_fp16.py", 1)),
], ids=["training-script", "config"])
def test_a_backward_in_an_amp_optimizer_wrappers_context(tmp_path, monkeypatch, switch, opened, place):
    root = write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'tinygan'\n",
                                           "tinygan/__init__.py": "", "tinygan/gan.py": GAN, **switch})
    found = findings(root, "AMP001", monkeypatch)
    assert [(f[0], f[1]) for f in found] == [("tinygan/gan.py", 8), ("tinygan/gan.py", 12)]
    helper, direct = found
    assert helper[2].startswith("`self.train_discriminator(...)` runs `optimizer_wrapper.update_params(loss)` "
                                "(tinygan/gan.py:17) inside an autocast region (an optimizer wrapper's "
                                f"`optim_context` runs autocast {opened})")
    assert direct[2].startswith(f"`update_params(...)` inside an autocast region (an optimizer wrapper's "
                                f"`optim_context` runs autocast {opened}): run the backward pass after")
    assert place in [(r[0], r[1]) for r in direct[3]]


def test_silent_where_the_update_follows_the_context_or_no_amp_wrapper_is_set(tmp_path, monkeypatch):
    root = write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'tinydet'\n",
                                           "tinydet/__init__.py": "", "tinydet/detector.py": DETECTOR,
                                           "tools/train.py": TRAIN_SCRIPT})
    assert findings(root, "AMP001", monkeypatch) == []
    # the wrapper is never an AmpOptimWrapper: its context does not autocast
    plain = write_files(tmp_path / "plain", {"pyproject.toml": "[project]\nname = 'tinygan'\n",
                                             "tinygan/__init__.py": "", "tinygan/gan.py": GAN,
                                             "configs/gan.py": CONFIG.replace("AmpOptimWrapper", "OptimWrapper")})
    assert findings(plain, "AMP001", monkeypatch) == []


def test_a_manual_backward_inside_torch_autocast(tmp_path, monkeypatch):
    root = write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'lit'\n", "lit/module.py": """\
        import torch
        import lightning.pytorch as pl


        class Gan(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                with torch.autocast("cuda"):
                    loss = self.loss(batch)
                    self.manual_backward(loss)
                opt.step()
        """})
    found = findings(root, "AMP001", monkeypatch)
    assert [(f[0], f[1]) for f in found] == [("lit/module.py", 14)]
    assert found[0][2].startswith("`manual_backward(...)` inside an autocast region")
