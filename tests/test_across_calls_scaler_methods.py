"""A GradScaler driven by a trainer class across its methods (AMP006): the loss scaled in one
method, stepped in a second, updated in a third, some of them in a base class of another
module. Real projects on disk, the real CLI; each finding sits where the fix goes and names
the method and the call that join the two halves."""

import json

import pytest
from click.testing import CliRunner

from amplint.cli import main
from projects import write_files

BASE = """\
import torch


class BaseTrainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler("cuda")

    def end_step(self):
        self.scaler.update()  # base: end_step updates
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()  # base: optimizer_step updates
"""

# One update per optimizer: the second one's step unscales with a scale the first update changed.
GAN = """\
import torch


class GanTrainer:
    def __init__(self, generator, discriminator, lr):
        self.generator = generator
        self.discriminator = discriminator
        self.optimizers = {
            "generator": torch.optim.Adam(generator.parameters(), lr),
            "discriminator": torch.optim.Adam(discriminator.parameters(), lr),
        }
        self.scaler = torch.amp.GradScaler("cuda")

    def _backward(self, loss):
        self.scaler.scale(loss).backward()  # the scaled backward

    def _optimizer_step(self):
        for name, optimizer in self.optimizers.items():  # the loop
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.generator.parameters(), 1.0)
            self.scaler.step(optimizer)
            self.scaler.update()  # once per optimizer
            optimizer.zero_grad(set_to_none=True)

    def train_step(self, real, noise):
        with torch.autocast("cuda", dtype=torch.float16):
            fake = self.generator(noise)
            loss = self.discriminator(fake).mean() - self.discriminator(real).mean()
        self._backward(loss)  # joins backward
        self._optimizer_step()  # joins step
        return loss.detach()
"""

# The update is in another method: the early return on a non-finite norm never reaches it.
CLIPPING = """\
import math

import torch


class Trainer:
    def __init__(self, model, optimizer, max_norm=1.0):
        self.model = model
        self.optimizer = optimizer
        self.max_norm = max_norm
        self.scaler = torch.amp.GradScaler("cuda")
        self.skipped = 0

    def _clip_and_step(self):
        self.scaler.unscale_(self.optimizer)  # the unscale
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        if not math.isfinite(grad_norm):
            self.skipped += 1
            return None  # returns early
        self.scaler.step(self.optimizer)
        self._finish_step()  # joins update
        return grad_norm

    def _finish_step(self):
        self.scaler.update()  # the update
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batch):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        grad_norm = self._clip_and_step()  # joins helper
        return loss.detach(), grad_norm
"""

CLASSIFIER = """\
import torch

from .base import BaseTrainer


class ClassifierTrainer(BaseTrainer):
    def train_step(self, images, labels):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)  # the step
        if not torch.isfinite(loss):
            return None  # skips end_step
        self.end_step()  # joins base
        return loss.detach()


class DetectorTrainer(BaseTrainer):
    def train_step(self, images, targets):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = sum(self.model(images, targets).values())
        self.scaler.scale(loss).backward()
        self.optimizer_step()  # joins base step
        self.scaler.update()  # second update
        return loss.detach()
"""

# The base class named through its module, or under another name: the same early return.
SEGMENTATION = """\
import torch

{import_line}


class SegmentationTrainer({base}):
    def train_step(self, images, masks):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(self.model(images), masks)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)  # the step
        if not torch.isfinite(loss):
            return None  # skips end_step
        self.end_step()  # joins base
        return loss.detach()
"""

# A helper given its optimizer by keyword: the caller hands it the same one twice.
MULTITASK = """\
import torch


class MultiTaskTrainer:
    def __init__(self, model, optimizer, heads_optimizer):
        self.model = model
        self.optimizer = optimizer
        self.heads_optimizer = heads_optimizer
        self.scaler = torch.amp.GradScaler("cuda")

    def _apply(self, optimizer, zero_grad=True):
        self.scaler.step(optimizer)  # the step
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)

    def train_step(self, batch):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        self._apply(optimizer=self.optimizer)  # first call
        self._apply(optimizer=self.optimizer, zero_grad=False)  # second call
        self.scaler.update()
        return loss.detach()
"""

# Correct code of the same shapes: amplint stays silent on each.
SILENT = {
    "step_all_then_update_once": """\
        import torch


        class GanTrainer:
            def __init__(self, generator, discriminator, lr):
                self.generator = generator
                self.optimizers = [torch.optim.Adam(generator.parameters(), lr),
                                   torch.optim.Adam(discriminator.parameters(), lr)]
                self.scaler = torch.amp.GradScaler("cuda")

            def _backward(self, loss):
                self.scaler.scale(loss).backward()

            def _step_all(self):
                for optimizer in self.optimizers:
                    self.scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(self.generator.parameters(), 1.0)
                    self.scaler.step(optimizer)

            def _update(self):
                self.scaler.update()
                for optimizer in self.optimizers:
                    optimizer.zero_grad(set_to_none=True)

            def train_step(self, noise):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.generator(noise).mean()
                self._backward(loss)
                self._step_all()
                self._update()
        """,
    "update_after_the_last_optimizer": """\
        import torch


        class GanTrainer:
            def __init__(self, optimizers):
                self.optimizers = optimizers
                self.scaler = torch.amp.GradScaler("cuda")

            def _step_each(self):
                for index, optimizer in enumerate(self.optimizers):
                    self.scaler.step(optimizer)
                    if index == len(self.optimizers) - 1:
                        self.scaler.update()

            def train_step(self, loss):
                self.scaler.scale(loss).backward()
                self._step_each()
        """,
    "early_return_before_any_step": """\
        import torch

        from .base import BaseTrainer


        class AccumulatingTrainer(BaseTrainer):
            def __init__(self, model, optimizer, accumulation):
                super().__init__(model, optimizer)
                self.accumulation = accumulation
                self.micro_step = 0

            def train_step(self, batch):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(batch).mean() / self.accumulation
                self.scaler.scale(loss).backward()
                self.micro_step += 1
                if self.micro_step % self.accumulation:
                    return loss.detach()
                self.scaler.step(self.optimizer)
                self.end_step()
                return loss.detach()
        """,
    "update_in_finally": """\
        import torch

        from .base import BaseTrainer


        class ClassifierTrainer(BaseTrainer):
            def train_step(self, images, labels):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.cross_entropy(self.model(images), labels)
                self.scaler.scale(loss).backward()
                try:
                    self.scaler.step(self.optimizer)
                    if not torch.isfinite(loss):
                        return None
                finally:
                    self.end_step()
                return loss.detach()
        """,
    "update_every_path_of_the_caller_reaches": """\
        import math

        import torch


        class Trainer:
            def __init__(self, model, optimizer):
                self.model = model
                self.optimizer = optimizer
                self.scaler = torch.amp.GradScaler("cuda")

            def _clip_and_step(self):
                self.scaler.unscale_(self.optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                if not math.isfinite(grad_norm):
                    return None
                self.scaler.step(self.optimizer)
                return grad_norm

            def _finish_step(self):
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)

            def train_step(self, batch):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(batch).mean()
                self.scaler.scale(loss).backward()
                grad_norm = self._clip_and_step()
                self._finish_step()
                return loss.detach(), grad_norm
        """,
    "base_through_its_module_steps_and_updates_once": """\
        import torch

        from . import base


        class DetectorTrainer(base.BaseTrainer):
            def train_step(self, images, targets):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = sum(self.model(images, targets).values())
                self.scaler.scale(loss).backward()
                self.optimizer_step()
                return loss.detach()
        """,
    "each_optimizer_given_by_keyword_once": """\
        import torch


        class MultiTaskTrainer:
            def __init__(self, model, optimizer, heads_optimizer):
                self.model = model
                self.optimizer = optimizer
                self.heads_optimizer = heads_optimizer
                self.scaler = torch.amp.GradScaler("cuda")

            def _apply(self, optimizer):
                self.scaler.step(optimizer)
                optimizer.zero_grad(set_to_none=True)

            def train_step(self, batch):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(batch).mean()
                self.scaler.scale(loss).backward()
                self._apply(optimizer=self.optimizer)
                self._apply(optimizer=self.heads_optimizer)
                self.scaler.update()
        """,
    "scaler_given_by_keyword_to_what_steps": """\
        import torch


        class ScheduledTrainer:
            def __init__(self, model, optimizers):
                self.model = model
                self.optimizers = optimizers
                self.scaler = torch.amp.GradScaler("cuda")
                self.global_step = 0

            def train_step(self, batch):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(batch).mean()
                self.scaler.scale(loss).backward()
                self.optimizers.step_due(grad_scaler=self.scaler, step=self.global_step)
                self.scaler.update()
                self.global_step += 1
        """,
    "base_steps_and_updates_once": """\
        import torch

        from .base import BaseTrainer


        class DetectorTrainer(BaseTrainer):
            def train_step(self, images, targets):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = sum(self.model(images, targets).values())
                self.scaler.scale(loss).backward()
                self.optimizer_step()
                return loss.detach()
        """,
}


def _project(tmp_path, files: dict[str, str]):
    return write_files(tmp_path / "proj", {"pyproject.toml": '[project]\nname = "trainers"\n',
                                           "trainers/__init__.py": "", "trainers/base.py": BASE,
                                           **{f"trainers/{name}.py": text for name, text in files.items()}})


def _findings(root, monkeypatch):
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", "AMP006", "--output-format", "json", "--no-cache", "."])
    assert result.exit_code in (0, 1), result.output
    return [(f["filename"], f["location"]["row"], f["message"],
             {(r["filename"], r["location"]["row"], r["message"]) for r in f.get("related", [])})
            for f in json.loads(result.output)]


def _row(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


def test_an_update_once_per_optimizer_in_a_helper_is_found_on_the_update(tmp_path, monkeypatch):
    found = _findings(_project(tmp_path, {"gan": GAN}), monkeypatch)
    assert len(found) == 1
    path, row, message, related = found[0]
    assert (path, row) == ("trainers/gan.py", _row(GAN, "once per optimizer"))
    assert "`self.scaler.update()` runs once per optimizer" in message
    assert f"loop on line {_row(GAN, 'the loop')} in `_optimizer_step`" in message
    assert f"scaled backward (line {_row(GAN, 'the scaled backward')} in `_backward`, run by `self._backward(...)` " \
           f"on line {_row(GAN, 'joins backward')})" in message
    assert f"run by `self._optimizer_step()` on line {_row(GAN, 'joins step')}" in message
    assert related >= {("trainers/gan.py", _row(GAN, "joins step"), "`self._optimizer_step()` runs `_optimizer_step`"),
                       ("trainers/gan.py", _row(GAN, "the loop"), "the loop over the optimizers"),
                       ("trainers/gan.py", _row(GAN, "joins backward"), "`self._backward(...)` runs `_backward`"),
                       ("trainers/gan.py", _row(GAN, "the scaled backward"), "the scaled backward")}


def test_an_early_return_in_a_helper_that_skips_another_methods_update_is_found_on_the_return(tmp_path, monkeypatch):
    found = _findings(_project(tmp_path, {"clipping": CLIPPING}), monkeypatch)
    assert len(found) == 1
    path, row, message, related = found[0]
    assert (path, row) == ("trainers/clipping.py", _row(CLIPPING, "returns early"))
    assert f"`return` leaves `self.scaler.unscale_(self.optimizer)` (line {_row(CLIPPING, 'the unscale')} " \
           "in `_clip_and_step`)" in message
    assert f"(line {_row(CLIPPING, 'the update')} in `_finish_step`, run by `self._finish_step()` on line " \
           f"{_row(CLIPPING, 'joins update')})" in message
    assert f"(in `_clip_and_step`, run by `self._clip_and_step()` on line {_row(CLIPPING, 'joins helper')})" in message
    assert related >= {
        ("trainers/clipping.py", _row(CLIPPING, "joins helper"), "`self._clip_and_step()` runs `_clip_and_step`"),
        ("trainers/clipping.py", _row(CLIPPING, "joins update"), "`self._finish_step()` runs `_finish_step`"),
        ("trainers/clipping.py", _row(CLIPPING, "the update"), "the scaler's update"),
        ("trainers/clipping.py", _row(CLIPPING, "the unscale"), "the unscale")}


def test_a_subclass_returning_before_its_base_class_updates_is_found_on_the_return(tmp_path, monkeypatch):
    found = {row: (message, related) for path, row, message, related in
             _findings(_project(tmp_path, {"classifier": CLASSIFIER}), monkeypatch)}
    message, related = found[_row(CLASSIFIER, "skips end_step")]
    assert f"`return` leaves `self.scaler.step(self.optimizer)` (line {_row(CLASSIFIER, 'the step')})" in message
    assert f"(trainers/base.py:{_row(BASE, 'base: end_step')} in `end_step`, run by `self.end_step()` on line " \
           f"{_row(CLASSIFIER, 'joins base')})" in message
    assert related >= {("trainers/classifier.py", _row(CLASSIFIER, "joins base"), "`self.end_step()` runs `end_step`"),
                       ("trainers/base.py", _row(BASE, "base: end_step"), "the scaler's update")}


def test_an_update_after_a_base_class_method_that_updates_is_found_on_the_second_update(tmp_path, monkeypatch):
    found = {row: (message, related) for path, row, message, related in
             _findings(_project(tmp_path, {"classifier": CLASSIFIER}), monkeypatch)}
    assert set(found) == {_row(CLASSIFIER, "skips end_step"), _row(CLASSIFIER, "second update")}
    message, related = found[_row(CLASSIFIER, "second update")]
    assert f"called more than once per iteration (also on trainers/base.py:{_row(BASE, 'base: optimizer_step')} " \
           f"in `optimizer_step`, run by `self.optimizer_step()` on line {_row(CLASSIFIER, 'joins base step')})" \
           in message
    assert related >= {
        ("trainers/classifier.py", _row(CLASSIFIER, "joins base step"),
         "`self.optimizer_step()` runs `optimizer_step`"),
        ("trainers/base.py", _row(BASE, "base: optimizer_step"), "the scaler's update")}


@pytest.mark.parametrize("import_line, base", [("from . import base", "base.BaseTrainer"),
                                               ("import trainers.base as trainer_base", "trainer_base.BaseTrainer"),
                                               ("from .base import BaseTrainer as Base", "Base")])
def test_a_base_class_however_it_is_imported_is_read_for_the_update_a_return_skips(tmp_path, monkeypatch,
                                                                                    import_line, base):
    text = SEGMENTATION.format(import_line=import_line, base=base)
    found = _findings(_project(tmp_path, {"segmentation": text}), monkeypatch)
    assert len(found) == 1
    path, row, message, related = found[0]
    assert (path, row) == ("trainers/segmentation.py", _row(text, "skips end_step"))
    assert f"`return` leaves `self.scaler.step(self.optimizer)` (line {_row(text, 'the step')})" in message
    assert f"(trainers/base.py:{_row(BASE, 'base: end_step')} in `end_step`, run by `self.end_step()` on line " \
           f"{_row(text, 'joins base')})" in message
    assert related >= {("trainers/segmentation.py", _row(text, "joins base"), "`self.end_step()` runs `end_step`"),
                       ("trainers/base.py", _row(BASE, "base: end_step"), "the scaler's update")}


def test_a_helper_given_the_same_optimizer_by_keyword_twice_is_found_on_its_step(tmp_path, monkeypatch):
    found = _findings(_project(tmp_path, {"multitask": MULTITASK}), monkeypatch)
    assert len(found) == 1
    path, row, message, related = found[0]
    assert (path, row) == ("trainers/multitask.py", _row(MULTITASK, "the step"))
    assert f"`self.scaler.step(self.optimizer)` again before `self.scaler.update()` (first on line " \
           f"{_row(MULTITASK, 'the step')} in `_apply`, run by `self._apply(...)` on line " \
           f"{_row(MULTITASK, 'first call')})" in message
    assert f"(in `_apply`, run by `self._apply(...)` on line {_row(MULTITASK, 'second call')})" in message
    assert related >= {("trainers/multitask.py", _row(MULTITASK, "second call"), "`self._apply(...)` runs `_apply`"),
                       ("trainers/multitask.py", _row(MULTITASK, "first call"), "`self._apply(...)` runs `_apply`"),
                       ("trainers/multitask.py", _row(MULTITASK, "the step"), "the scaler's step")}


@pytest.mark.parametrize("name", sorted(SILENT))
def test_correct_trainers_of_the_same_shapes_are_left_alone(tmp_path, monkeypatch, name):
    assert _findings(_project(tmp_path, {name: SILENT[name]}), monkeypatch) == []
