"""The switches that turn AMP on beside the code — command-line flags and config-file keys of
the project — named by the findings that apply only when they are on; real projects on disk,
the real CLI."""

import json
import textwrap

import pytest

from amplint.engine.switches import config_keys_in, flags_in, turns_on

# A model whose float16 region, around a caller of `_pad`, is switched by `{enabled}`.
MODEL = """\
import torch
from torch import nn


class Matcher(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(8, 8)

    def forward(self, x, use_amp=False):
        with torch.autocast("cuda", enabled={enabled}):
            return self._pad(self.proj(x))

    def _pad(self, scores):
        keep = torch.nonzero(scores.amax(0) > 0).squeeze(1)
        full = torch.zeros(scores.shape[0], 16, device=scores.device)
        full[:, keep] = scores[:, keep]
        return full
"""

TRAIN_ARGPARSE = """\
import argparse

def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--amp", action="store_true", help="mixed precision")
    parser.add_argument("--mixed", dest="use_mixed", default=False, type=bool)
    return parser.parse_args()
"""

TRAIN_CLICK = """\
import click

@click.command()
@click.option("--half-precision/--full-precision", default=False)
def main(half_precision):
    pass
"""

TRAIN_TYPER = """\
import typer

def main(epochs: int = 3, amp: bool = typer.Option(False, "--amp", help="autocast")):
    pass
"""


@pytest.mark.parametrize("enabled,files,when,related", [
    ("self.cfg.amp", {"train.py": TRAIN_ARGPARSE}, "when `--amp` is set (train.py:6)",
     ("train.py", 6, "`--amp` is defined here")),
    ("self.cfg.use_mixed", {"train.py": TRAIN_ARGPARSE}, "when `--mixed` is true, default False (train.py:7)",
     ("train.py", 7, "`--mixed` is defined here")),
    ("self.cfg.half_precision", {"cli.py": TRAIN_CLICK},
     "when `--half-precision` is true, default False (cli.py:4)", ("cli.py", 4, "`--half-precision` is defined here")),
    ("self.cfg.amp", {"cli.py": TRAIN_TYPER}, "when `--amp` is set (cli.py:3)", ("cli.py", 3, "`--amp` is defined here")),
    ("self.cfg.SOLVER.AMP.ENABLED",
     {"configs/base.yaml": "MODEL:\n  NAME: matcher\nSOLVER:\n  LR: 0.1\n  AMP:\n    ENABLED: True\n"},
     "with `SOLVER.AMP.ENABLED: True` (configs/base.yaml:6)",
     ("configs/base.yaml", 6, "`SOLVER.AMP.ENABLED: True`")),
    ('self.cfg["fp16"]["enabled"]',
     {"ds_config.json": '{\n  "train_batch_size": 8,\n  "fp16": {\n    "enabled": true,\n    "loss_scale": 0\n  }\n}\n'},
     "with `fp16.enabled: true` (ds_config.json:4)", ("ds_config.json", 4, "`fp16.enabled: true`")),
    ("self.cfg.train.amp", {"config.toml": "[model]\nwidth = 8\n\n[train]\nlr = 0.1\namp = false\n"},
     "when `train.amp` is true (config.toml:6 has `false`)", ("config.toml", 6, "`train.amp: false`")),
    ("use_amp", {"train.py": "def step(model, x):\n    return model(x, use_amp=True)\n"},
     "when `use_amp` is true (a parameter of `forward`, default `False`)",
     ("m.py", 11, "`use_amp` defaults to `False`")),
    # a device that is not a literal: judged as the configured one (cuda), and said
    ('self.cfg.amp, device_type=str(x.device)', {"train.py": TRAIN_ARGPARSE},
     "when `--amp` is set (train.py:6) and `str(x.device)` is cuda", ("train.py", 6, "`--amp` is defined here")),
    # nothing in the project sets it: the expression itself
    ("self.cfg.run_fast", {"train.py": TRAIN_ARGPARSE}, "when `self.cfg.run_fast` is true", None),
])
def test_a_finding_under_a_switched_region_names_the_switch(tmp_path, run_amplint, enabled, files, when, related):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'matcher'\n")
    (tmp_path / "m.py").write_text(MODEL.format(enabled=enabled))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = run_amplint("check", "--no-cache", "--output-format", "json", "m.py", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert (finding["location"]["row"], finding["code"]) == (17, "AMP003")
    assert f"under the autocast of line 12 {when}, through the call on line 13" in finding["message"]
    found = [(r["filename"], r["location"]["row"], r["message"]) for r in finding["related"]]
    assert found == [("m.py", 13, "runs it under autocast")] + ([related] if related else [])


def test_several_places_that_set_a_switch_are_counted(tmp_path, run_amplint):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'matcher'\n")
    (tmp_path / "m.py").write_text(MODEL.format(enabled="self.cfg.train.amp"))
    for name in ("a", "b", "c"):
        (tmp_path / "configs" / f"{name}.yaml").parent.mkdir(exist_ok=True)
        (tmp_path / "configs" / f"{name}.yaml").write_text(f"train:\n  amp: {name != 'b'}\n")
    result = run_amplint("check", "--no-cache", "--output-format", "json", "m.py", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert "with `train.amp: True` (configs/a.yaml:2 and 2 more)" in finding["message"]


def test_config_files_are_read_as_data_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = f"amp: !!python/object/apply:os.system ['touch {marker}']\nfp16: true\n"
    assert [(k.key, k.value, k.row) for k in config_keys_in(text, "x.yaml")] == [(("fp16",), "true", 2)]
    assert not marker.exists()
    assert config_keys_in("amp: [unclosed", "bad.yaml") == []
    assert config_keys_in("amp = ", "bad.toml") == []


def test_flags_of_argparse_click_and_typer():
    import ast

    source = TRAIN_ARGPARSE + TRAIN_CLICK + textwrap.dedent(TRAIN_TYPER)
    found = [(f.option, f.dest, f.store_true, f.default) for f in flags_in(ast.parse(source), "t.py")]
    assert found == [("--epochs", "epochs", False, "10"), ("--amp", "amp", True, "False"),
                     ("--mixed", "use_mixed", False, "False"), ("--half-precision", "half_precision", False, "False"),
                     ("--amp", "amp", True, "False")]


@pytest.mark.parametrize("text,expected", [
    ("trainer:\n  precision: 16-mixed\n", (True, "float16")),
    ("trainer:\n  precision: bf16-mixed\n", (True, "bfloat16")),
    ("trainer:\n  precision: 32\n", (False, None)),
    ("mixed_precision: 'no'\n", (False, None)),
    ("mixed_precision: bf16\n", (True, "bfloat16")),
    ('{"fp16": {"enabled": true, "loss_scale": 0}}', (True, "float16")),
    ('{"bf16": {"enabled": "auto"}}', (False, None)),
    ("SOLVER:\n  AMP:\n    ENABLED: True\n", (True, None)),
    ("train:\n  use_amp: false\n", (False, None)),
])
def test_which_config_keys_turn_mixed_precision_on(text, expected):
    [key] = config_keys_in(text, "c.yaml")
    assert turns_on(key) == expected


@pytest.mark.parametrize("name,text,shown", [
    ("configs/trainer.yaml", "trainer:\n  max_epochs: 10\n  precision: 16-mixed\n", "configs/trainer.yaml:3, `trainer.precision: 16-mixed`"),
    ("accelerate.yaml", "compute_environment: LOCAL_MACHINE\nmixed_precision: fp16\n", "accelerate.yaml:2, `mixed_precision: fp16`"),
    ("ds_config.json", '{\n  "fp16": {\n    "enabled": true\n  }\n}\n', "ds_config.json:3, `fp16.enabled: true`"),
    ("train.toml", "[run]\nbf16 = true\n", "train.toml:2, `run.bf16: true`"),
])
def test_a_config_file_that_turns_it_on_opens_the_region(tmp_path, run_amplint, name, text, shown):
    # BCE in a Lightning step: refused under float16 autocast, which the config file turns on
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'seg'\n")
    (tmp_path / "lit.py").write_text(textwrap.dedent("""\
        import torch.nn.functional as F
        import lightning as L


        class Classifier(L.LightningModule):
            def training_step(self, batch, batch_idx):
                x, y = batch
                return F.binary_cross_entropy(self.net(x).sigmoid(), y)


        if __name__ == "__main__":
            L.Trainer().fit(Classifier())
        """))
    args = ("check", "--no-cache", "--preview", "--output-format", "json", "lit.py")
    assert json.loads(run_amplint(*args, cwd=tmp_path).stdout) == []
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
    [finding] = json.loads(run_amplint(*args, cwd=tmp_path).stdout)
    assert (finding["code"], finding["location"]["row"]) == ("AMP008", 8)
    assert f"runs code under autocast ({shown})" in finding["message"]


@pytest.mark.parametrize("name,text,shown", [
    ("configs/seg_amp.py", "optim_wrapper = dict(\n    type='AmpOptimWrapper',\n    optimizer=dict(type='SGD', lr=0.01),\n)\n",
     "configs/seg_amp.py:1, `type='AmpOptimWrapper'`"),
    ("configs/det_fp16.py", "_base_ = './det.py'\nfp16 = dict(loss_scale=512.0)\n", "configs/det_fp16.py:2, `fp16 = dict(...)`"),
    ("tools/train_net.py", "from detectron2.engine import AMPTrainer\n\ndef build(model, loader, opt):\n"
     "    return AMPTrainer(model, loader, opt)\n", "tools/train_net.py:4, `AMPTrainer(...)`"),
])
def test_an_mm_or_detectron2_setting_opens_the_region(tmp_path, run_amplint, name, text, shown):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'det'\n")
    (tmp_path / "losses.py").write_text(textwrap.dedent("""\
        import torch.nn.functional as F
        from torch import nn


        class MaskLoss(nn.Module):
            def forward(self, logits, target):
                return F.binary_cross_entropy(logits.sigmoid(), target)
        """))
    (tmp_path / "builder.py").write_text("from losses import MaskLoss\n\nLOSSES = {'mask': MaskLoss}\n")
    args = ("check", "--no-cache", "--preview", "--output-format", "json", "losses.py")
    assert json.loads(run_amplint(*args, cwd=tmp_path).stdout) == []
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
    [finding] = json.loads(run_amplint(*args, cwd=tmp_path).stdout)
    assert (finding["code"], finding["location"]["row"]) == ("AMP008", 7)
    assert f"runs code under autocast ({shown})" in finding["message"]


TRAIN_LOOP = """\
import argparse

import torch


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--clip", type=float, default=0.0)
    return parser.parse_args()


def train(args, model, loader, optimizer, device):
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
    for batch in loader:
        with torch.autocast(device_type=device.type, enabled=args.amp):
            loss = model(batch).mean()
{body}
"""


@pytest.mark.parametrize("body,code,row,says", [
    # the backward inside the region: only when the region is on
    ("            loss.backward()\n        optimizer.step()", "AMP001", 18,
     "`backward()` inside an autocast region (when `--amp` is set (train.py:8))"),
    # the clip on scaled gradients: only when the scaler is on
    ("        scaler.scale(loss).backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)\n"
     "        scaler.step(optimizer)\n        scaler.update()", "AMP002", 19,
     "still scaled by `scaler` (when `--amp` is set (train.py:8))"),
    # a disabled scaler's unscale_ does nothing: unscaling twice raises only when it is on
    ("        scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n        scaler.unscale_(optimizer)\n"
     "        scaler.step(optimizer)\n        scaler.update()", "AMP007", 20,
     "it raises at runtime (when `--amp` is set (train.py:8))"),
])
def test_scaler_and_region_findings_name_their_switch(tmp_path, run_amplint, body, code, row, says):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'loop'\n")
    (tmp_path / "train.py").write_text(TRAIN_LOOP.format(body=body))
    result = run_amplint("check", "--no-cache", "--output-format", "json", "train.py", cwd=tmp_path)
    found = [f for f in json.loads(result.stdout) if f["code"] == code]
    assert [f["location"]["row"] for f in found] == [row]
    assert says in found[0]["message"]
    assert ("train.py", 8, "`--amp` is defined here") in [
        (r["filename"], r["location"]["row"], r["message"]) for r in found[0]["related"]]


def test_fp16_without_a_scaler_names_the_switch_and_the_device(tmp_path, run_amplint):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'loop'\n")
    (tmp_path / "train.py").write_text(TRAIN_LOOP.replace(
        '    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)\n', "").format(
        body="        loss.backward()\n        optimizer.step()"))
    result = run_amplint("check", "--no-cache", "--output-format", "json", "train.py", cwd=tmp_path)
    [finding] = [f for f in json.loads(result.stdout) if f["code"] == "AMP009"]
    assert finding["message"].startswith(
        "float16 autocast (when `--amp` is set (train.py:8) and `device.type` is cuda) with a backward pass")


def test_a_library_step_called_without_its_optional_scaler(tmp_path, run_amplint):
    # the library's step takes an optional scaler; the project's script calls it without one
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'det'\n")
    (tmp_path / "engine.py").write_text(textwrap.dedent("""\
        import torch


        def train_one_epoch(model, loader, optimizer, scaler=None):
            for images, targets in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(images, targets)
                optimizer.zero_grad()
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
        """))
    (tmp_path / "train.py").write_text("from engine import train_one_epoch\n\n"
                                       "def main(model, loader, optimizer):\n"
                                       "    train_one_epoch(model, loader, optimizer)\n")
    result = run_amplint("check", "--no-cache", "--output-format", "json", ".", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert (finding["filename"], finding["location"]["row"], finding["code"]) == ("engine.py", 6, "AMP009")
    assert "when called without a scaler (`scaler` defaults to None, line 4)" in finding["message"]
    # turned off without a scaler: float32 training, nothing to report
    (tmp_path / "engine.py").write_text((tmp_path / "engine.py").read_text().replace(
        "dtype=torch.float16)", "dtype=torch.float16, enabled=scaler is not None)"))
    assert json.loads(run_amplint("check", "--no-cache", "--output-format", "json", ".", cwd=tmp_path).stdout) == []
