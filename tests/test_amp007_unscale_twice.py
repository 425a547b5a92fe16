"""AMP007 (unscale_ twice before update) on projects written to disk, through the real CLI: a
second unscale_ in the same step, an unscale_ after the scaler stepped, one every micro-batch
of an accumulation loop; the scaler's `enabled=` flag defined in another file of the project;
and the correct loops that look alike, on which it stays silent."""

import json

import pytest
from click.testing import CliRunner

from amplint.cli import main
from projects import write_files

CLI = """\
import argparse


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--max-norm", type=float, default=1.0)
    return parser.parse_args()
"""


def _findings(tmp_path, files):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'trainer'\n")
    write_files(tmp_path, files)
    result = CliRunner().invoke(main, ["check", "--select", "AMP007", "--output-format", "json", "--no-cache",
                                       str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def _related(finding):
    return [(r["filename"].rsplit("/", 1)[-1], r["location"]["row"], r["message"]) for r in finding["related"]]


def test_a_second_unscale_in_the_same_step_names_the_flag_that_turns_the_scaler_on(tmp_path):
    [finding] = _findings(tmp_path, {"cli.py": CLI, "train.py": """\
        import torch
        from cli import parse_args


        def train(model, loader, optimizer):
            args = parse_args()
            scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
            for inputs, targets in loader:
                with torch.autocast("cuda", enabled=args.amp):
                    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
        """})
    assert finding["filename"].endswith("train.py")
    assert (finding["location"]["row"], finding["location"]["column"]) == (15, 9)
    assert "`scaler.unscale_(optimizer)` again before `scaler.update()` (first on line 13)" in finding["message"]
    assert "it raises at runtime (when `--amp` is set (cli.py:6))" in finding["message"]
    assert _related(finding) == [("cli.py", 6, "`--amp` is defined here")]


def test_an_unscale_after_the_scaler_stepped_in_a_trainer_method(tmp_path):
    [finding] = _findings(tmp_path, {"trainer.py": """\
        import torch


        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = model, optimizer
                self.scaler = torch.amp.GradScaler("cuda")

            def train_step(self, batch, writer, step):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(**batch).loss
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.unscale_(self.optimizer)
                norms = [p.grad.norm() for p in self.model.parameters() if p.grad is not None]
                writer.add_scalar("grad_norm", torch.stack(norms).norm().item(), step)
                self.scaler.update()
                self.optimizer.zero_grad()
        """})
    assert finding["filename"].endswith("trainer.py")
    assert (finding["location"]["row"], finding["location"]["column"]) == (14, 9)
    assert finding["message"].startswith(
        "`self.scaler.unscale_(self.optimizer)` after `self.scaler.step(self.optimizer)` on line 13: "
        "unscale before stepping")
    assert "related" not in finding  # the scaler is always on: no switch to name


@pytest.mark.parametrize("loop", ["for step, batch in enumerate(loader):", "while step < total_steps:"])
def test_an_unscale_every_micro_batch_while_the_update_waits_for_the_boundary(tmp_path, loop):
    [finding] = _findings(tmp_path, {"accumulate.py": f"""\
        import torch


        def run(model, loader, optimizer, scaler, accumulation=4, total_steps=1000):
            step = 0
            batch = next(iter(loader))
            {loop}
                with torch.autocast("cuda"):
                    loss = model(batch).mean() / accumulation
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (step + 1) % accumulation == 0:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
                step += 1
        """})
    assert finding["filename"].endswith("accumulate.py")
    assert (finding["location"]["row"], finding["location"]["column"]) == (11, 9)
    assert ("`scaler.unscale_(optimizer)` runs again in the next iteration of the loop on line 7 before any "
            "`scaler.update()`: an iteration can end without `update()` after it") in finding["message"]


def test_correct_loops_that_look_alike_stay_silent(tmp_path):
    assert _findings(tmp_path, {"gan.py": """\
        import torch


        def train_gan(gen, disc, loader, opt_g, opt_d, scaler, accumulation=2):
            for i, real in enumerate(loader):
                with torch.autocast("cuda"):
                    loss_d, loss_g = disc.loss(real, gen), gen.loss(disc)
                scaler.scale(loss_d + loss_g).backward()
                if (i + 1) % accumulation != 0:
                    continue
                # one unscale_ per optimizer, each in its own iteration; one update at the end
                for opt in (opt_d, opt_g):
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
                    scaler.step(opt)
                scaler.update()
                opt_d.zero_grad()
                opt_g.zero_grad()


        def train_skip_non_finite(model, loader, optimizer, scaler):
            for batch in loader:
                scaler.scale(model(batch).mean()).backward()
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if not torch.isfinite(norm):
                    scaler.update()  # the skip path updates too: the next unscale_ is allowed
                    optimizer.zero_grad()
                    continue
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        """}) == []
