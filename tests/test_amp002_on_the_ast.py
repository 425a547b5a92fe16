"""AMP002 (gradient clipping on scaled gradients) reads Python's ast: its fix inserts `S.unscale_(optimizer)` as a text edit that keeps the file's line
endings, tabs and comments (before the statement that clips, on one line with it in a one-line
suite), and gradient hooks that clamp are found where a helper of another module registers
them. Through the real CLI on projects written to disk."""

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from amplint.cli import main


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(textwrap.dedent(text).lstrip("\n").encode())
    return root


def _findings(root: Path) -> list[dict]:
    result = CliRunner().invoke(main, ["check", "--select", "AMP002", "--output-format", "json", "--no-cache",
                                       str(root)])
    return sorted(json.loads(result.stdout), key=lambda d: (d["filename"], d["location"]["row"]))


def _fixed(root: Path, name: str) -> str:
    CliRunner().invoke(main, ["check", "--select", "AMP002", "--fix", "--no-cache", str(root)])
    return (root / name).read_bytes().decode()


def test_the_unscale_goes_above_the_clip_with_the_files_crlf_tabs_and_comments(tmp_path):
    train = ("import torch\r\n"
             "\r\n"
             "def train_epoch(model, loader, optimizer, scaler, max_norm):\r\n"
             "\tfor x, y in loader:\r\n"
             "\t\twith torch.autocast(\"cuda\"):\r\n"
             "\t\t\tloss = model(x, y)\r\n"
             "\t\tscaler.scale(loss).backward()\r\n"
             "\t\t# keep the update small\r\n"
             "\t\ttorch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\r\n"
             "\t\tscaler.step(optimizer)\r\n"
             "\t\tscaler.update()\r\n"
             "\t\toptimizer.zero_grad()\r\n")
    root = _project(tmp_path, {"train.py": train})
    found = _findings(root)
    assert [(Path(d["filename"]).name, d["location"]["row"], d["location"]["column"]) for d in found] == \
        [("train.py", 9, 3)]
    assert "still scaled by `scaler`: `scaler.scale(...).backward()` on line 7" in found[0]["message"]
    assert found[0]["fix"]["message"] == "Insert `scaler.unscale_(optimizer)` before the clip"
    assert _fixed(root, "train.py") == train.replace(
        "\t\t# keep the update small\r\n", "\t\t# keep the update small\r\n\t\tscaler.unscale_(optimizer)\r\n")
    assert _findings(root) == []


def test_a_one_line_suite_gets_the_unscale_on_its_line_and_an_elif_gets_it_above_the_if(tmp_path):
    root = _project(tmp_path, {"engine.py": """
        import torch
        from torch.nn.utils import clip_grad_value_


        class Engine:
            def step(self, loss):
                self.grad_scaler.scale(loss).backward()
                if self.clip_value: clip_grad_value_(self.model.parameters(), self.clip_value)
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()

            def step_with_check(self, loss, mode):
                self.grad_scaler.scale(loss).backward()
                if mode == "plain":
                    pass
                elif torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0).isnan():
                    self.skipped += 1
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()
        """})
    found = _findings(root)
    assert [(d["location"]["row"], d["location"]["column"]) for d in found] == [(8, 29), (16, 14)]
    assert all("still scaled by `self.grad_scaler`" in d["message"] for d in found)
    fixed = _fixed(root, "engine.py")
    assert ("        if self.clip_value: self.grad_scaler.unscale_(self.optimizer); "
            "clip_grad_value_(self.model.parameters(), self.clip_value)\n") in fixed
    assert ("        self.grad_scaler.scale(loss).backward()\n"
            "        self.grad_scaler.unscale_(self.optimizer)\n"
            "        if mode == \"plain\":\n") in fixed


def test_several_optimizers_stepped_get_no_fix_and_an_unscaled_clip_no_finding(tmp_path):
    root = _project(tmp_path, {"gan.py": """
        import torch


        def gan_step(scaler, loss, generator, opt_g, opt_d):
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(generator.parameters(), 5.0)
            scaler.step(opt_g)
            scaler.step(opt_d)
            scaler.update()


        def generator_step(scaler, loss, generator, opt_g):
            scaler.scale(loss).backward()
            scaler.unscale_(opt_g)
            torch.nn.utils.clip_grad_norm_(generator.parameters(), 5.0)
            scaler.step(opt_g)
            scaler.update()
        """})
    found = _findings(root)
    assert [(d["location"]["row"], d["fix"]) for d in found] == [(6, None)]


def test_clamping_hooks_registered_by_a_helper_of_another_module(tmp_path):
    root = _project(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/grads.py": """
            def install_grad_clamp(model, bound):
                def clamp_grad(grad):
                    return grad.clamp(-bound, bound)
                for p in model.parameters():
                    p.register_hook(clamp_grad)


            def install_scaled_clamp(model, bound, scaler):
                for p in model.parameters():
                    p.register_hook(lambda grad: grad.clamp(-bound * scaler.get_scale(), bound * scaler.get_scale()))
            """,
        "pkg/fit.py": """
            import torch
            from .grads import install_grad_clamp, install_scaled_clamp


            def fit(model, optimizer, loader, bound):
                scaler = torch.amp.GradScaler("cuda")
                install_grad_clamp(model, bound)
                for x, y in loader:
                    with torch.autocast("cuda"):
                        loss = model(x, y)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()


            def fit_scaled(model, optimizer, loader, bound):
                scaler = torch.amp.GradScaler("cuda")
                install_scaled_clamp(model, bound, scaler)
                for x, y in loader:
                    with torch.autocast("cuda"):
                        loss = model(x, y)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
    })
    found = _findings(root)
    assert [(Path(d["filename"]).name, d["location"]["row"], d["location"]["column"]) for d in found] == \
        [("fit.py", 7, 5)]
    assert found[0]["message"].startswith(
        "`install_grad_clamp` registers gradient hooks that clamp the gradients (`grad.clamp`, pkg/grads.py:3) "
        "during the backward pass, while the GradScaler (`scaler`, line 6) still scales them")
    assert [(Path(r["filename"]).name, r["location"]["row"], r["message"]) for r in found[0]["related"]] == \
        [("grads.py", 3, "the hook clamps the gradients here")]
    assert found[0]["fix"] is None


def test_a_method_hook_passed_by_keyword_and_one_that_reads_the_scale(tmp_path):
    root = _project(tmp_path, {"model_trainer.py": """
        import torch


        class Trainer:
            def __init__(self, model):
                self.model = model
                self.scaler = torch.cuda.amp.GradScaler()
                for p in model.parameters():
                    p.register_hook(hook=self._bounded)

            def _bounded(self, grad):
                return torch.clamp(grad, -1.0, 1.0)


        class ScaleAwareTrainer:
            def __init__(self, model):
                self.model = model
                self.scaler = torch.cuda.amp.GradScaler()
                for p in model.parameters():
                    p.register_hook(hook=self._bounded)

            def _bounded(self, grad):
                bound = self.scaler.get_scale()
                return torch.clamp(grad, -bound, bound)
        """})
    found = _findings(root)
    assert [(d["location"]["row"], d["location"]["column"]) for d in found] == [(9, 13)]
    assert ("gradient hooks registered here clamp the gradients (`torch.clamp` on line 12) during the backward "
            "pass, while the GradScaler (`self.scaler`, line 7)") in found[0]["message"]


BASES = {
    "trainers/__init__.py": "",
    "trainers/base.py": """
        import torch


        class BaseTrainer:
            def clip_gradients(self, max_norm=1.0):
                torch.nn.utils.clip_grad_value_(self.model.parameters(), max_norm)

            def unscaled_clip(self, max_norm=1.0):
                self.grad_scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_value_(self.model.parameters(), max_norm)
        """,
    "trainers/mixed.py": """
        from .base import BaseTrainer


        class MixedPrecisionTrainer(BaseTrainer):
            def log(self, message):
                print(message)
        """,
}


def _loop(base: str, call: str, extra: str = "") -> str:
    return f"""
        import torch
        from trainers.mixed import MixedPrecisionTrainer
        from vendor_lib import Callbacks


        class {base.split("(")[0]}({base.split("(")[1]}:
        {extra}
            def train_step(self, batch):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(batch).float().mean()
                self.grad_scaler.scale(loss).backward()
                {call}
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()
        """


def test_a_clip_in_a_method_of_a_base_class_of_another_module(tmp_path):
    # Two modules up: MixedPrecisionTrainer (trainers/mixed.py) inherits clip_gradients from
    # BaseTrainer (trainers/base.py).
    root = _project(tmp_path, {**BASES, "train.py": _loop("Trainer(MixedPrecisionTrainer)", "self.clip_gradients(0.5)")})
    [found] = _findings(root)
    assert (found["filename"], found["location"]["row"]) == (str(root / "train.py"), 12)
    assert "(`self.clip_gradients` clips them at trainers/base.py:6)" in found["message"]
    assert [(r["filename"], r["location"]["row"]) for r in found["related"]] == [
        (str(root / "trainers" / "base.py"), 6)]
    fixed = _fixed(root, "train.py")
    assert "        self.grad_scaler.unscale_(self.optimizer)\n        self.clip_gradients(0.5)\n" in fixed
    assert _findings(root) == []


def test_no_finding_where_the_method_self_runs_does_not_clip_scaled_gradients(tmp_path):
    files = {
        # The base's method unscales before it clips.
        "unscaled.py": _loop("Trainer(MixedPrecisionTrainer)", "self.unscaled_clip()"),
        # The class's own method comes first: it only logs.
        "overridden.py": _loop("Trainer(MixedPrecisionTrainer)", "self.clip_gradients()",
                               "    def clip_gradients(self):\n                print('no clipping')\n"),
        # A base that cannot be read comes first: it may define the method.
        "unreadable.py": _loop("Trainer(Callbacks, MixedPrecisionTrainer)", "self.clip_gradients()"),
    }
    assert _findings(_project(tmp_path, {**BASES, **files})) == []


def test_a_clip_in_a_method_of_a_base_class_of_the_same_file(tmp_path):
    text = textwrap.dedent(BASES["trainers/base.py"]) + textwrap.dedent(
        _loop("Trainer(BaseTrainer)", "self.clip_gradients()")).replace(
        "from trainers.mixed import MixedPrecisionTrainer\n", "")
    root = _project(tmp_path, {"train.py": text})
    [found] = _findings(root)
    assert "(`self.clip_gradients` clips them on line 6)" in found["message"] and not found.get("related")
