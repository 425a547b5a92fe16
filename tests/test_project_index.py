"""What one file cannot show: a loss module whose trainer, in another file, runs it under
autocast. Real projects on disk, the real CLI, one file named as pre-commit names it."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from amplint.cli import main
from amplint.engine.project_index import forget, project_root

LOSSES = """\
import torch
from torch import nn


class BinaryLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.sigmoid = nn.Sigmoid()
        self.loss = nn.BCELoss(reduction="mean")

    def forward(self, pred, label):
        return self.loss(self.sigmoid(pred), label.float())


def pairwise_loss(scores, labels):
    return torch.nn.functional.binary_cross_entropy(scores, labels)


def evaluate(scores, labels):
    return torch.nn.functional.binary_cross_entropy(scores, labels).item()
"""

TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, criterion, optimizer, use_amp):
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
        self.use_amp = use_amp

    def train_one_epoch(self, loader):
        for x, y in loader:
            with torch.autocast({device}, enabled=self.use_amp):
                loss = self.criterion(self.model(x), y)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
"""


# The package's public API: its losses are code the project uses (`reach`).
PACKAGE_INIT = "from .losses import BinaryLoss, evaluate, pairwise_loss\n"


def _project(tmp_path, device='"cuda"', trainer=None):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    package = tmp_path / "demo"
    package.mkdir()
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "losses.py").write_text(LOSSES)
    (package / "trainer.py").write_text(trainer if trainer is not None else TRAINER.format(device=device))
    return package


def _findings(tmp_path, monkeypatch, *paths, extra=()):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", "--preview", "--output-format", "json", "--no-cache", *extra, *paths])
    assert result.exit_code in (0, 1), result.output
    return [(d["filename"], d["location"]["row"], d["code"], d["message"]) for d in json.loads(result.stdout)]


@pytest.fixture(autouse=True)
def _fresh_index():
    forget()
    yield
    forget()


def test_loss_run_by_a_cuda_autocast_in_another_file(tmp_path, monkeypatch):
    _project(tmp_path)
    found = _findings(tmp_path, monkeypatch, "demo/losses.py")
    # the module's forward (at the call of the BCELoss it built) and a function named like a
    # loss; `evaluate` is not where a loss is computed for training
    assert [(f, row, code) for f, row, code, _ in found] == [
        ("demo/losses.py", 12, "AMP008"), ("demo/losses.py", 16, "AMP008")]
    message = found[0][3]
    assert "`torch.nn.BCELoss` reaches `aten::binary_cross_entropy`, which autocast refuses on cuda" in message
    assert "this project runs code under autocast (demo/trainer.py:12)" in message
    assert "`BinaryLoss.forward`" in message
    assert "`pairwise_loss`" in found[1][3]


def test_a_device_that_is_not_a_literal_is_judged_with_the_configured_device(tmp_path, monkeypatch):
    _project(tmp_path, device="device_type=self.device.type")
    assert [code for _, _, code, _ in _findings(tmp_path, monkeypatch, "demo/losses.py")] == ["AMP008", "AMP008"]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n[tool.amplint]\ndevice = 'cpu'\n")
    assert _findings(tmp_path, monkeypatch, "demo/losses.py") == []


@pytest.mark.parametrize("trainer", [
    TRAINER.format(device='"cpu", dtype=torch.bfloat16'),  # bf16 on the CPU: the op runs
    TRAINER.format(device='"cuda", enabled=False'),  # never enabled
    TRAINER.replace("            with torch.autocast({device}, enabled=self.use_amp):\n", "            if True:\n"),
    # only a model's own forward runs under autocast: that says nothing of the losses
    "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def forward(self, x):\n"
    "        with torch.autocast('cuda'):\n            return self.body(x)\n",
], ids=["cpu-bf16", "disabled", "no-autocast", "model-only"])
def test_silent_where_no_cuda_autocast_runs_the_project(tmp_path, monkeypatch, trainer):
    _project(tmp_path, trainer=trainer)
    assert _findings(tmp_path, monkeypatch, "demo/losses.py") == []


def test_silent_inside_autocast_disabled_with_float32_inputs(tmp_path, monkeypatch):
    package = _project(tmp_path)
    (package / "losses.py").write_text(textwrap.dedent("""\
        import torch
        import torch.nn.functional as F


        def assignment_loss(scores, labels):
            with torch.autocast("cuda", enabled=False):
                return F.binary_cross_entropy(scores.float(), labels.float())
        """))
    assert _findings(tmp_path, monkeypatch, "demo/losses.py") == []


def test_an_installed_package_is_its_own_project(tmp_path, monkeypatch):
    # pip's --target folder inside a hidden folder of a repository: the repository's autocast
    # is not the package's, and the package's trainer is found without any marker
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'outer'\n")
    (tmp_path / "outer_train.py").write_text(TRAINER.format(device='"cuda"'))
    site = tmp_path / ".deps" / "site"
    package = site / "demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "losses.py").write_text(LOSSES)
    assert project_root(package / "losses.py") == package
    assert _findings(tmp_path, monkeypatch, ".deps/site/demo/losses.py") == []
    (package / "engine").mkdir()
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "loop.py").write_text(TRAINER.format(device='"cuda"'))
    forget()
    found = _findings(tmp_path, monkeypatch, ".deps/site/demo/losses.py")
    assert [code for _, _, code, _ in found] == ["AMP008", "AMP008"]
    assert "(engine/loop.py:12)" in found[0][3]


def test_cached_findings_that_read_other_files_follow_them(tmp_path, monkeypatch):
    package = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(main, ["check", "--preview", "--output-format", "json", "demo/losses.py"])
    assert [d["code"] for d in json.loads(first.stdout)] == ["AMP008", "AMP008"]
    # the trainer drops autocast: the loss file did not change, its findings did
    (package / "trainer.py").write_text(TRAINER.replace(
        "            with torch.autocast({device}, enabled=self.use_amp):\n", "            if True:\n"))
    second = CliRunner().invoke(main, ["check", "--preview", "--output-format", "json", "demo/losses.py"])
    assert json.loads(second.stdout) == []


@pytest.mark.parametrize("script, shown", [
    ("import lightning as L\ntrainer = L.Trainer(accelerator='gpu', precision='16-mixed')\n",
     "train.py:2, `precision='16-mixed'`"),
    ("from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='bf16')\n",
     "train.py:2, `mixed_precision='bf16'`"),
    ("from transformers import TrainingArguments\nargs = TrainingArguments('out', fp16=True)\n",
     "train.py:2, `fp16=True`"),
])
def test_a_framework_setting_opens_the_region(tmp_path, monkeypatch, script, shown):
    package = _project(tmp_path, trainer="")
    (package / "lit.py").write_text(textwrap.dedent("""\
        import torch.nn.functional as F
        import lightning as L


        class Classifier(L.LightningModule):
            def training_step(self, batch, batch_idx):
                x, y = batch
                return F.binary_cross_entropy(self.net(x).sigmoid(), y)
        """))
    (tmp_path / "train.py").write_text(script + "\nfrom demo.lit import Classifier\n\nmodel = Classifier()\n")
    found = _findings(tmp_path, monkeypatch, "demo/lit.py")
    assert [(f, row, code) for f, row, code, _ in found] == [("demo/lit.py", 8, "AMP008")]
    assert f"runs code under autocast ({shown})" in found[0][3] and "`Classifier.training_step`" in found[0][3]


@pytest.mark.parametrize("script", [
    "import lightning as L\ntrainer = L.Trainer(precision='32-true')\n",
    "from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='no')\n",
    "from transformers import TrainingArguments\nargs = TrainingArguments('out', fp16=False)\n",
])
def test_a_framework_setting_without_mixed_precision_opens_none(tmp_path, monkeypatch, script):
    _project(tmp_path, trainer="")
    (tmp_path / "train.py").write_text(script)
    assert _findings(tmp_path, monkeypatch, "demo/losses.py") == []


def test_the_other_file_is_a_related_location_in_json_and_sarif(tmp_path, monkeypatch):
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    data = json.loads(CliRunner().invoke(main, ["check", "--preview", "--no-cache", "--output-format", "json",
                                                "demo/losses.py"]).stdout)
    assert data[0]["related"] == [{"filename": "demo/trainer.py", "location": {"row": 12, "column": 1},
                                   "message": "autocast entered here"}]
    sarif = json.loads(CliRunner().invoke(main, ["check", "--preview", "--no-cache", "--output-format", "sarif",
                                                 "demo/losses.py"]).stdout)
    related = sarif["runs"][0]["results"][0]["relatedLocations"]
    assert related == [{"id": 0, "message": {"text": "autocast entered here"},
                        "physicalLocation": {"artifactLocation": {"uri": "demo/trainer.py"},
                                             "region": {"startLine": 12}}}]


def test_a_folder_named_on_the_command_line_is_the_root_of_an_unmarked_source_tree(tmp_path, monkeypatch):
    # a downloaded source tree: a requirements file, packages, no project marker, no .git
    tree = tmp_path / "downloaded"
    (tree / "scripts").mkdir(parents=True)
    (tree / "requirements.txt").write_text("numpy\ntorch>=2.1,<3\n")
    (tree / "scripts" / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (tree / "lib").mkdir()
    (tree / "lib" / "__init__.py").write_text("")
    (tree / "lib" / "loop.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    for named in ("downloaded", "downloaded/scripts/train.py"):
        found = _findings(tmp_path, monkeypatch, named, extra=("--select", "AMP004"))
        declared = [message for _, _, _, message in found if "declares `torch>=2.1,<3` (requirements.txt)" in message]
        # named as a folder: the tree declares torch 2.1, which lacks torch.amp.GradScaler
        assert len(declared) == (2 if named == "downloaded" else 0), found
    # no safe fix that needs a newer torch than the tree declares
    monkeypatch.chdir(tmp_path)
    CliRunner().invoke(main, ["check", "--no-cache", "--select", "AMP004", "--fix", "downloaded"])
    assert "torch.cuda.amp.GradScaler()" in (tree / "lib" / "loop.py").read_text()
    assert "torch.cuda.amp.GradScaler()" in (tree / "scripts" / "train.py").read_text()


# A project helper that forces float32 for numerics: its `enabled` parameter is the region's
# switch, and every call the project makes of it sets it False, so it never turns autocast on.
FLOAT32_HELPER = """\
import torch


def precision_context(device_type, enabled=True):
    return torch.autocast(device_type, enabled=enabled)


class Rotary(torch.nn.Module):
    def forward(self, x):
        with precision_context(x.device.type, enabled=False):
            return x.float().cos()


def normalize(x):
    with precision_context("cuda", False):
        return x.float() / x.float().norm()
"""


@pytest.mark.parametrize("extra_call,expected", [
    ("", []),  # every call passes False: no region of the project turns autocast on
    ("with precision_context('cuda'):\n    pass\n", [12, 16]),  # the default, True
    ("with precision_context('cuda', enabled=use_amp):\n    pass\n", [12, 16]),  # a flag
    ("factory = precision_context\n", [12, 16]),  # handed on: a caller we cannot see
])
def test_a_helper_whose_enabled_switch_every_call_turns_off_is_no_region(tmp_path, monkeypatch, extra_call,
                                                                          expected):
    _project(tmp_path, trainer=FLOAT32_HELPER)
    (tmp_path / "demo" / "run.py").write_text(f"from .trainer import precision_context\nuse_amp = True\n{extra_call}")
    found = _findings(tmp_path, monkeypatch, "demo/losses.py")
    assert [row for _, row, _, _ in found] == expected
    if expected:
        assert "runs code under autocast (demo/trainer.py:5)" in found[0][3]


# A package of Lightning modules, one of whose command-line entry points trains one of them
# in mixed precision; the GAN's own entry point leaves the precision to its user.
LIT_MODULES = {
    "gan.py": """\
        import torch.nn.functional as F
        import lightning as L


        class GAN(L.LightningModule):
            def training_step(self, batch, batch_idx):
                fake = self.generator(batch)
                return F.binary_cross_entropy(self.discriminator(fake).sigmoid(), batch.new_ones(len(batch), 1))
        """,
    "heads.py": """\
        import torch
        import lightning as L


        class MarginLoss(torch.nn.Module):
            def forward(self, probs, y):
                return torch.nn.functional.binary_cross_entropy(probs, y)


        class Finetuner(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.criterion = MarginLoss()

            def training_step(self, batch, batch_idx):
                x, y = batch
                return self.criterion(self.head(x).sigmoid(), y)
        """,
    "finetune.py": """\
        import lightning as L
        from .heads import Finetuner


        def cli_main(data):
            model = Finetuner()
            trainer = L.Trainer(precision="16-mixed", max_epochs=10)
            trainer.fit(model, data)


        if __name__ == "__main__":
            cli_main(None)
        """,
    "gan_main.py": """        import lightning as L
        from .gan import GAN


        def cli_main(data, precision):
            L.Trainer(precision=precision).fit(GAN(), data)


        if __name__ == "__main__":
            cli_main(None, "32-true")
        """,
}


def _lit_project(tmp_path, extra: dict[str, str]):
    package = _project(tmp_path, trainer="")
    (package / "__init__.py").write_text("")
    for name, text in {**LIT_MODULES, **extra}.items():
        (package / name).write_text(textwrap.dedent(text))
    return package


def test_a_setting_that_trains_one_model_is_no_evidence_for_another_models_loss(tmp_path, monkeypatch):
    _lit_project(tmp_path, {})
    found = _findings(tmp_path, monkeypatch, "demo/gan.py", "demo/heads.py")
    # the finetuner's loss module (named by the module of the class it trains) is found; the GAN's is not
    assert [(f, row) for f, row, _, _ in found] == [("demo/heads.py", 7)]
    assert "runs code under autocast (demo/finetune.py:7, `precision='16-mixed'`)" in found[0][3]


def test_a_setting_that_trains_what_it_is_given_is_evidence_for_every_loss(tmp_path, monkeypatch):
    _lit_project(tmp_path, {"fit.py": """\
        import lightning as L


        def fit(model, data):
            L.Trainer(precision="16-mixed").fit(model, data)
        """})
    found = _findings(tmp_path, monkeypatch, "demo/gan.py")
    assert [(f, row) for f, row, _, _ in found] == [("demo/gan.py", 8)]
    # of the two settings, the one that can run the GAN: the other trains the finetuner only
    assert "runs code under autocast (demo/fit.py:5, `precision='16-mixed'`)" in found[0][3]


def test_a_model_built_from_what_the_caller_passes_runs_anything_and_stays_evidence(tmp_path, monkeypatch):
    _lit_project(tmp_path, {"finetune.py": """\
        import lightning as L
        from .heads import Finetuner


        def cli_main(backbone, data):
            trainer = L.Trainer(precision="16-mixed")
            trainer.fit(Finetuner(backbone), data)


        if __name__ == "__main__":
            cli_main(None, None)
        """})
    found = _findings(tmp_path, monkeypatch, "demo/gan.py")
    assert [(f, row) for f, row, _, _ in found] == [("demo/gan.py", 8)]
    assert "runs code under autocast (demo/finetune.py:6, `precision='16-mixed'`)" in found[0][3]


def _distribution(site, files: dict[str, str], top_level: list[str] | None):
    """A distribution as `pip install --target site` leaves it: ``files`` (path from ``site``)
    and its dist-info, listing the top-level packages in ``top_level.txt`` (None: only in the
    paths of its ``RECORD``)."""
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(text))
    dist_info = site / "segkit-1.2.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: segkit\nVersion: 1.2\n")
    (dist_info / "RECORD").write_text("".join(f"{name},sha256=x,1\n" for name in files)
                                      + "segkit-1.2.dist-info/METADATA,,\n")
    if top_level is not None:
        (dist_info / "top_level.txt").write_text("".join(f"{n}\n" for n in top_level))


SEGKIT_TRAINER = """\
import torch

from segkit.precision import amp_dtype_for


class Runner:
    def __init__(self, cfg, model, optimizer):
        self.cfg, self.model, self.optimizer = cfg, model, optimizer
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.solver.mixed.enabled)

    def step(self, batch):
        with torch.autocast("cuda", enabled=self.cfg.solver.mixed.enabled,
                            dtype=amp_dtype_for(self.cfg.solver.mixed.precision)):
            loss = self.model(batch)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
"""
SEGKIT_PRECISION = """\
import torch


def amp_dtype_for(name):
    if name == "bf16":
        return torch.bfloat16
    return torch.float16
"""
SEGKIT_CONFIG = """\
solver:
  mixed:
    enabled: true
    precision: bf16
"""


@pytest.mark.parametrize("top_level", [["segkit", "segtrain"], None], ids=["top_level.txt", "RECORD"])
def test_an_installed_distributions_packages_that_one_imports_are_one_project(tmp_path, monkeypatch, top_level):
    # `segtrain` runs what `segkit` defines and reads its configs: the scaler is built for a
    # bfloat16 run that segkit's config and function choose
    site = tmp_path / "site"
    _distribution(site, {"segtrain/__init__.py": "", "segtrain/runner.py": SEGKIT_TRAINER,
                         "segkit/__init__.py": "", "segkit/precision.py": SEGKIT_PRECISION,
                         "segkit/configs/finetune.yaml": SEGKIT_CONFIG}, top_level)
    assert project_root(site / "segtrain" / "runner.py") == site / "segtrain"
    found = _findings(tmp_path, monkeypatch, "site/segtrain/runner.py")
    assert [(f, row, code) for f, row, code, _ in found] == [("site/segtrain/runner.py", 9, "AMP010")]
    assert ("with `solver.mixed.precision: bf16` (../segkit/configs/finetune.yaml:4), for which `amp_dtype_for` "
            "gives torch.bfloat16 (../segkit/precision.py:6)") in found[0][3]


def test_a_sibling_package_that_only_imports_the_package_is_not_its_code(tmp_path, monkeypatch):
    # the distribution also installs its examples: their autocast trains a detector, not the
    # package's losses, and the package never imports them
    site = tmp_path / "site"
    files = {"demo/__init__.py": PACKAGE_INIT, "demo/losses.py": LOSSES,
             "demo_examples/__init__.py": "", "demo_examples/train.py": "import demo\n" + TRAINER.format(device='"cuda"')}
    _distribution(site, files, ["demo", "demo_examples"])
    assert _findings(tmp_path, monkeypatch, "site/demo/losses.py") == []
    # once the package runs that loop itself, its autocast is the package's
    (site / "demo" / "fit.py").write_text("from demo_examples.train import Trainer\n")
    forget()
    assert [code for _, _, code, _ in _findings(tmp_path, monkeypatch, "site/demo/losses.py")] == ["AMP008", "AMP008"]


def test_a_version_gate_from_a_sibling_package_of_the_distribution_is_followed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    files = {"corefab/__init__.py": "", "corefab/versions.py": """\
                 import torch
                 from packaging.version import Version
                 TORCH_AT_LEAST_2_4 = Version(torch.__version__) >= Version("2.4.0")
                 """,
             "corelight/__init__.py": "", "corelight/plugin.py": """\
                 import torch
                 from corefab.versions import TORCH_AT_LEAST_2_4


                 def make_scaler():
                     return torch.amp.GradScaler("cuda") if TORCH_AT_LEAST_2_4 else torch.cuda.amp.GradScaler()
                 """}
    _distribution(site, files, ["corefab", "corelight"])
    (site / "segkit-1.2.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: segkit\nVersion: 1.2\nRequires-Dist: torch>=2.1\n")
    assert _findings(tmp_path, monkeypatch, "site/corelight/plugin.py", extra=("--select", "AMP004")) == []


def test_a_training_scripts_switch_for_any_config_is_the_evidence_named_first(tmp_path, monkeypatch):
    # a config turns the AMP wrapper on for one detector; the training script's `--amp` turns it
    # on for whatever config it trains: that is what makes the loss run under autocast
    package = _project(tmp_path, trainer="")
    (package / "trainer.py").unlink()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "atss_amp.py").write_text(
        "_base_ = './atss.py'\noptim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic')\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "train.py").write_text(textwrap.dedent("""\
        import argparse


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--amp', action='store_true')
            args = parser.parse_args()
            cfg = load_config()
            if args.amp:
                if cfg.optim_wrapper.get('type') != 'AmpOptimWrapper':
                    cfg.optim_wrapper.type = 'AmpOptimWrapper'
            run(cfg)
        """))
    found = _findings(tmp_path, monkeypatch, "demo/losses.py")
    assert [code for _, _, code, _ in found] == ["AMP008", "AMP008"]
    assert ("this project runs code under autocast (when `--amp` is set (tools/train.py:6), as tools/train.py:11 "
            "sets `cfg.optim_wrapper.type = 'AmpOptimWrapper'` and 1 more)") in found[0][3]
