"""A check frees what it built when it ends: its context, tree and facts go by reference
counting, with no cycle left for Python's cycle collector. A cycle through the context keeps
the whole model of the file alive past the check, and the collection that then walks it runs
inside the next check (in a language server, between an edit and its findings). Real checks
of the fixtures' training scripts and of class hierarchies across modules, through the
entry the server uses."""

import ast
import gc
import shutil
from pathlib import Path

import pytest

from amplint.engine.ast_context import AstContext
from amplint.server import lint

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

BASE = """\
import torch


class BaseTrainer:
    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def step(self):
        self.scaler.step(self.optimizer)
        self.scaler.update()
"""

TRAINER = """\
import torch
from unknown_framework import Callbacks
from .base import BaseTrainer


class AmpTrainer(BaseTrainer, Callbacks):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.scaler = torch.amp.GradScaler("cuda")

    def fit(self, loader):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = self.model(x).float().mean()
                self.backward(loss)
            self.on_step_end()
            self.step()


class Deep(AmpTrainer):
    def run(self, loader):
        self.fit(loader)
        self.backward(self.model(loader).sum())
"""


def _alive(source: str) -> tuple[int, int]:
    """Contexts and trees of ``source`` still alive: the check's own, as nothing kept on
    purpose was read from this text."""
    contexts = [o for o in gc.get_objects() if isinstance(o, AstContext) and o.source == source]
    modules = sum(isinstance(o, ast.Module) for o in gc.get_objects())
    return len(contexts), modules


def _check_leaves_nothing(path: Path, source: str) -> None:
    lint.check(str(path), source)  # the project's other modules read and kept on purpose
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        _, modules_before = _alive(source)
        checked, _ = lint.check(str(path), source)
        contexts, modules = _alive(source)
    finally:
        if enabled:
            gc.enable()
    assert checked.failure is None
    assert contexts == 0
    assert modules <= modules_before  # fewer when a kept outline was taken


@pytest.mark.parametrize("name", sorted(p.relative_to(FIXTURES).as_posix()
                                        for p in FIXTURES.glob("[cf]*/*.py")))
def test_a_check_of_a_training_script_leaves_nothing_for_the_cycle_collector(name, tmp_path):
    shutil.copytree(FIXTURES / name.split("/")[0], tmp_path / "scripts")
    path = tmp_path / "scripts" / name.split("/")[1]
    # A buffer being edited: its text is not the file's.
    _check_leaves_nothing(path, path.read_text() + "\nLEARNING_RATE = 3e-4\n")


def test_a_check_that_reads_a_class_hierarchy_across_modules_leaves_nothing(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["torch>=2.4"]\n')
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text("")
    (tmp_path / "demo" / "base.py").write_text(BASE)
    (tmp_path / "demo" / "trainer.py").write_text(TRAINER)
    checked, _ = lint.check(str(tmp_path / "demo" / "trainer.py"), TRAINER)
    # The hierarchy was read: the backward in the base class's method runs inside the region.
    assert [(d.code, d.location.row) for d in checked.diagnostics if d.code == "AMP001"] == [("AMP001", 15)]
    _check_leaves_nothing(tmp_path / "demo" / "trainer.py", TRAINER + "\n# edited\n")
