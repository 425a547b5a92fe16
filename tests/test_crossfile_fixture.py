"""fixtures/crossfile: a project whose AMP mistakes each need another of its files to be seen
(the project's own autocast wrapper, losses run under the trainer's or a framework setting's
float16 autocast, the output of a loss's model there, a loss class handed to a builder,
gradient hooks that clamp registered by a helper). The real CLI, in process; the project
index read from disk as `amplint check` reads it."""

import json
import shutil

from click.testing import CliRunner

from amplint.cli import main
from amplint.engine.project_index import forget
from conftest import ROOT

PROJECT = ROOT / "fixtures" / "crossfile"


def _check(folder, *extra):
    forget()
    result = CliRunner().invoke(main, ["check", "--preview", "--no-cache", "--output-format", "json", *extra, str(folder)])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout) if "--diff" not in extra else result.stdout


def test_every_cross_file_rule_names_the_file_that_causes_it():
    found = {(d["filename"].rsplit("/", 1)[-1], d["location"]["row"], d["code"]): d for d in _check(PROJECT)}
    assert set(found) == {
        ("trainer.py", 17, "AMP001"),  # backward inside `with mixed_precision():` (utils.py)
        ("trainer.py", 12, "AMP002"),  # utils.py's helper registers clamping gradient hooks
        ("utils.py", 28, "AMP002"),  # clips before the step; the scaled backward is the caller's
        ("losses.py", 44, "AMP003"),  # float32 table, index-put the scorer's half output
        ("losses.py", 13, "AMP008"),  # nn.BCELoss in a loss the trainer runs under autocast
        ("losses.py", 26, "AMP008"),  # nn.BCELoss handed to a builder
        ("lit_module.py", 17, "AMP008"),  # training_step under precision="16-mixed"
        ("losses.py", 33, "AMP018"),  # 1e-8 guarding a division in a loss under float16 autocast
    }
    wrapper = found[("trainer.py", 17, "AMP001")]
    assert "`mixed_precision` opens autocast, trainer_app/utils.py:10" in wrapper["message"]
    assert [(r["filename"].rsplit("/", 1)[-1], r["location"]["row"]) for r in wrapper["related"]] == [("utils.py", 10)]
    for key in (("losses.py", 13, "AMP008"), ("losses.py", 33, "AMP018"), ("losses.py", 44, "AMP003")):
        assert "trainer_app/lit_module.py:24" in found[key]["message"] and found[key]["related"]
    hooks = found[("trainer.py", 12, "AMP002")]
    assert "(`grad.clamp`, trainer_app/utils.py:36)" in hooks["message"]
    assert [(r["filename"].rsplit("/", 1)[-1], r["location"]["row"]) for r in hooks["related"]] == [("utils.py", 36)]


def test_one_file_named_sees_its_project_and_fix_works_per_file(tmp_path):
    copy = tmp_path / "crossfile"
    shutil.copytree(PROJECT, copy)
    trainer = copy / "trainer_app" / "trainer.py"
    # Named alone (pre-commit): the wrapper is still known, though trainer.py never says autocast.
    assert [(d["location"]["row"], d["code"]) for d in _check(trainer)] == [(12, "AMP002"), (17, "AMP001")]
    _check(trainer, "--fix")
    assert [(d["location"]["row"], d["code"]) for d in _check(trainer)] == [(12, "AMP002")]  # no fix
    assert "            loss = self.criterion(self.model(x), y)\n        self.scaler.scale(loss).backward()" \
        in trainer.read_text()
