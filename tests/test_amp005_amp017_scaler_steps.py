"""AMP005 (optimizer.step() after a scaled backward) and AMP017 (scaler.update() outside the
accumulation condition of scaler.step()) on projects written to disk, through the real CLI:
the mistakes in trainer methods and loops, AMP005's fixes (the line's indentation, comment,
tabs and CRLF kept), AMP017's scaler flag defined in another file; and the correct loops that
look alike, on which both stay silent."""

import json
import textwrap

from click.testing import CliRunner

from amplint.cli import main
from projects import write_files

CLI = """\
import argparse


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--accumulate", type=int, default=4)
    return parser.parse_args()
"""


def _write(root, files):
    write_files(root, {"pyproject.toml": "[project]\nname = 'trainer'\n", **files})


def _findings(root, code, files):
    _write(root, files)
    result = CliRunner().invoke(main, ["check", "--preview", "--select", code, "--output-format", "json",
                                       "--no-cache", str(root)])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def _fixed(root, files, name):
    _write(root, files)
    result = CliRunner().invoke(main, ["check", "--preview", "--select", "AMP005", "--fix", "--no-cache", "-q",
                                       str(root)])
    assert result.exit_code in (0, 1), result.output
    return (root / name).read_bytes()


def _where(finding):
    return finding["filename"].rsplit("/", 1)[-1], finding["location"]["row"], finding["location"]["column"]


def _related(finding):
    return [(r["filename"].rsplit("/", 1)[-1], r["location"]["row"], r["message"]) for r in finding["related"]]


# -- AMP005 ----------------------------------------------------------------------------------

TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, optimizer, scheduler):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaler = torch.amp.GradScaler("cuda")

    def train_step(self, batch):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(**batch).loss
        self.scaler.scale(loss).backward()
        self.optimizer.step()  # apply the update
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
"""


def test_a_trainer_method_steps_the_optimizer_itself_and_the_fix_goes_through_the_scaler(tmp_path):
    [finding] = _findings(tmp_path, "AMP005", {"trainer.py": TRAINER})
    assert _where(finding) == ("trainer.py", 13, 9)
    assert finding["message"] == ("`self.optimizer.step()` after `self.scaler.scale(...).backward()` (line 12) "
                                  "steps on scaled gradients: use `self.scaler.step(self.optimizer)`")
    assert "related" not in finding
    assert finding["fix"]["applicability"] == "safe"
    fixed = _fixed(tmp_path, {"trainer.py": TRAINER}, "trainer.py").decode()
    assert fixed == textwrap.dedent(TRAINER).replace("self.optimizer.step()  #", "self.scaler.step(self.optimizer)  #")


# A loop of a script, tab-indented, written on Windows, that never updates the scaler: the fix
# adds the update on a line of its own, as the file writes its lines.
NO_UPDATE = (
    "import torch\r\n"
    "from cli import parse_args\r\n"
    "\r\n"
    "\r\n"
    "def fit(model, loader, optim):\r\n"
    "\targs = parse_args()\r\n"
    "\tgrad_scaler = torch.amp.GradScaler(\"cuda\", enabled=args.amp)\r\n"
    "\tfor inputs, targets in loader:\r\n"
    "\t\twith torch.autocast(\"cuda\", enabled=args.amp):\r\n"
    "\t\t\tloss = torch.nn.functional.cross_entropy(model(inputs), targets)\r\n"
    "\t\tgrad_scaler.scale(loss).backward()\r\n"
    "\t\toptim.step()  # one step per batch\r\n"
    "\t\t# start the next batch from zero\r\n"
    "\t\toptim.zero_grad()\r\n"
).encode()


def test_a_loop_that_never_updates_the_scaler_gets_the_update_with_its_fix(tmp_path):
    [finding] = _findings(tmp_path, "AMP005", {"cli.py": CLI, "train.py": NO_UPDATE})
    assert _where(finding) == ("train.py", 12, 3)
    assert "`optim.step()` after `grad_scaler.scale(...).backward()` (line 11)" in finding["message"]
    assert "use `grad_scaler.step(optim)`" in finding["message"]
    assert finding["fix"]["message"] == "Use `grad_scaler.step(optim)` and `grad_scaler.update()`"
    fixed = _fixed(tmp_path, {"cli.py": CLI, "train.py": NO_UPDATE}, "train.py")
    assert fixed == NO_UPDATE.replace(b"\t\toptim.step()  # one step per batch\r\n",
                                      b"\t\tgrad_scaler.step(optim)  # one step per batch\r\n"
                                      b"\t\tgrad_scaler.update()\r\n")


def test_a_direct_step_next_to_the_scaler_step_or_updated_on_some_paths_has_no_fix(tmp_path):
    findings = _findings(tmp_path, "AMP005", {"engine.py": """\
        def step_twice(model, batch, opt, scaler):
            scaler.scale(model(batch).mean()).backward()
            scaler.step(opt)
            opt.step()
            scaler.update()


        def step_then_maybe_update(model, batch, optimizer, scaler, last_micro_batch):
            scaler.scale(model(batch).mean()).backward()
            optimizer.step()
            if last_micro_batch:
                scaler.update()
        """})
    assert [_where(f) for f in findings] == [("engine.py", 4, 5), ("engine.py", 10, 5)]
    assert "`opt.step()` after `scaler.scale(...).backward()` (line 2)" in findings[0]["message"]
    assert "`optimizer.step()` after `scaler.scale(...).backward()` (line 9)" in findings[1]["message"]
    assert [f["fix"] for f in findings] == [None, None]


def test_the_scaled_and_plain_paths_apart_are_not_reported(tmp_path):
    assert _findings(tmp_path, "AMP005", {"cli.py": CLI, "train.py": """\
        import torch
        from cli import parse_args


        class Trainer:
            def __init__(self, model, optimizer):
                self.args = parse_args()
                self.model, self.optimizer = model, optimizer
                self.scaler = torch.amp.GradScaler("cuda") if self.args.amp else None

            def train_step(self, batch):
                loss = self.model(**batch).loss
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    return
                self.optimizer.step()


        def fit(model, loader, optimizer, scheduler, scaler):
            for batch in loader:
                scaler.scale(model(batch).mean()).backward()
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
        """}) == []


# -- AMP017 ----------------------------------------------------------------------------------

def test_an_accumulation_loop_updates_every_micro_batch_under_a_flag_of_another_file(tmp_path):
    [finding] = _findings(tmp_path, "AMP017", {"cli.py": CLI, "train.py": """\
        import torch
        from cli import parse_args


        def train(model, loader, optimizer):
            args = parse_args()
            scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
            for i, (inputs, targets) in enumerate(loader):
                with torch.autocast("cuda", enabled=args.amp):
                    loss = torch.nn.functional.cross_entropy(model(inputs), targets) / args.accumulate
                scaler.scale(loss).backward()
                if (i + 1) % args.accumulate == 0:
                    scaler.step(optimizer)
                    optimizer.zero_grad(set_to_none=True)
                scaler.update()
        """})
    assert _where(finding) == ("train.py", 15, 9)
    assert finding["message"] == ("`scaler.update()` runs on every iteration but `scaler.step(...)` (line 13) only "
                                  "on some: move the update under the step's condition (when `--amp` is set "
                                  "(cli.py:6))")
    assert _related(finding) == [("cli.py", 6, "`--amp` is defined here")]


def test_a_method_called_once_per_micro_batch_steps_on_the_boundary_only(tmp_path):
    [finding] = _findings(tmp_path, "AMP017", {"trainer.py": """\
        import torch


        class Accumulator:
            def __init__(self, model, optimizer, every):
                self.model, self.optimizer, self.every = model, optimizer, every
                self.grad_scaler = torch.amp.GradScaler("cuda")
                self.micro_batches = 0

            def backward_and_maybe_step(self, loss):
                self.grad_scaler.scale(loss / self.every).backward()
                self.micro_batches += 1
                if self.micro_batches % self.every == 0:
                    self.grad_scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                    self.grad_scaler.step(self.optimizer)
                    self.optimizer.zero_grad()
                self.grad_scaler.update()
        """})
    assert _where(finding) == ("trainer.py", 18, 9)
    assert finding["message"].startswith("`self.grad_scaler.update()` runs on every iteration but "
                                         "`self.grad_scaler.step(...)` (line 16) only on some")
    assert "related" not in finding


def test_updates_on_the_iterations_that_stepped_are_not_reported(tmp_path):
    assert _findings(tmp_path, "AMP017", {"cli.py": CLI, "train.py": """\
        import torch
        from cli import parse_args


        def train(model, loader, optimizer):
            args = parse_args()
            scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
            for i, batch in enumerate(loader):
                scaler.scale(model(batch).mean() / args.accumulate).backward()
                if (i + 1) % args.accumulate:
                    continue
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()


        def train_clipped(model, loader, optimizer, scaler, max_norm):
            for i, batch in enumerate(loader):
                scaler.scale(model(batch).mean()).backward()
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if torch.isfinite(norm):
                    scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        """}) == []
