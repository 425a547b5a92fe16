"""A backward pass split from its autocast region by a call: the region in the training loop, the
backward in a helper of another module (or of the same class), and regions chosen at run time
(`ctx = torch.autocast if use_amp else nullcontext`). Real projects on disk, the real CLI."""

import json

from click.testing import CliRunner

from amplint.cli import main
from projects import findings, write_files

ENGINE = """\
def apply_gradients(loss, optimizer, clip=None):
    loss.backward()
    if clip:
        clip(optimizer)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(model, batch, optimizer):
    inputs, targets = batch
    loss = model.loss(model(inputs), targets)
    apply_gradients(loss, optimizer)
    return loss.detach()


def forward_only(model, batch):
    return model(batch[0])


def make_closure(loss):
    def run():
        loss.backward()
    return run
"""


def _project(tmp_path, files: dict[str, str]):
    return write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'proj'\n",
                                           "trainer/__init__.py": "", **files})


def _findings(root, monkeypatch):
    return findings(root, "AMP001", monkeypatch)


def test_a_helper_of_another_module_runs_the_backward_inside_the_region(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/engine.py": ENGINE, "trainer/loop.py": """\
        import torch
        from .engine import apply_gradients, train_step


        def fit(model, loader, optimizer):
            for inputs, targets in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model.loss(model(inputs), targets)
                    apply_gradients(loss, optimizer)


        def fit_steps(model, loader, optimizer):
            for batch in loader:
                with torch.autocast(device_type="cuda"):
                    train_step(model, batch, optimizer)
        """})
    found = _findings(root, monkeypatch)
    assert [(f, r) for f, r, _, _ in found] == [("trainer/loop.py", 9), ("trainer/loop.py", 15)]
    direct, nested = found
    assert "`apply_gradients(...)` runs `loss.backward()` (trainer/engine.py:2)" in direct[2]
    assert direct[3] == [("trainer/engine.py", 2, "`loss.backward()`, in `apply_gradients`")]
    # a helper of a helper: the message says which one runs it
    assert "`train_step(...)` runs `loss.backward()` (trainer/engine.py:2 through `apply_gradients`)" in nested[2]


def test_a_module_imported_whole_and_a_method_of_the_same_class(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/engine.py": ENGINE, "train.py": """\
        import torch
        from trainer import engine


        class Runner:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = model, optimizer

            def _update(self, loss):
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

            def epoch(self, loader):
                for batch in loader:
                    with torch.autocast("cuda"):
                        loss = self.model(batch)
                        self._update(loss)

            def epoch_engine(self, loader):
                for batch in loader:
                    with torch.autocast("cuda"):
                        engine.train_step(self.model, batch, self.optimizer)
        """})
    found = _findings(root, monkeypatch)
    assert [(f, r) for f, r, _, _ in found] == [("train.py", 18), ("train.py", 23)]
    assert "`self._update(...)` runs `loss.backward()` (train.py:11)" in found[0][2]
    assert "`engine.train_step(...)` runs `loss.backward()` (trainer/engine.py:2 through `apply_gradients`)" \
        in found[1][2]


def test_a_region_chosen_at_run_time_names_its_switch(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/engine.py": ENGINE, "main.py": """\
        import argparse
        import contextlib

        import torch
        from trainer.engine import apply_gradients


        def parse():
            parser = argparse.ArgumentParser()
            parser.add_argument("--amp", action="store_true")
            return parser.parse_args()


        def run(model, loader, optimizer, args):
            autocast_ctx = torch.autocast if args.amp else contextlib.nullcontext
            for x, y in loader:
                with autocast_ctx("cuda"):
                    loss = model.loss(model(x), y)
                    apply_gradients(loss, optimizer)


        def run_plain(model, loader, optimizer, use_amp):
            amp = torch.autocast("cuda", dtype=torch.float16) if use_amp else contextlib.nullcontext()
            for x, y in loader:
                with amp:
                    loss = model.loss(model(x), y)
                    loss.backward()
        """})
    found = _findings(root, monkeypatch)
    assert [(f, r) for f, r, _, _ in found] == [("main.py", 19), ("main.py", 27)]
    assert "inside an autocast region (when `--amp` is set (main.py:10))" in found[0][2]
    assert ("main.py", 10, "`--amp` is defined here") in found[0][3]
    assert "`backward()` inside an autocast region (when `use_amp` is true)" in found[1][2]


def test_correct_loops_beside_them_stay_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/engine.py": ENGINE, "trainer/loop.py": """\
        import contextlib

        import torch
        from .engine import apply_gradients, forward_only, make_closure


        def fit(model, loader, optimizer, use_amp):
            ctx = torch.autocast if use_amp else contextlib.nullcontext
            for batch in loader:
                with ctx("cuda"):
                    out = forward_only(model, batch)
                    loss = model.loss(out, batch[1])
                    step = make_closure(loss)   # builds a backward, runs none here
                apply_gradients(loss, optimizer)
                step()


        def evaluate(model, loader):
            quiet = contextlib.nullcontext
            with quiet():
                for batch in loader:
                    forward_only(model, batch)


        def fit_off(model, loader, optimizer):
            for batch in loader:
                with torch.autocast("cuda", enabled=False):
                    loss = model.loss(forward_only(model, batch), batch[1])
                    apply_gradients(loss, optimizer)
        """})
    assert _findings(root, monkeypatch) == []


def test_an_edit_of_the_helper_rechecks_its_caller_through_the_cache(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/engine.py": ENGINE, "trainer/loop.py": """\
        import torch
        from .engine import train_step


        def fit(model, loader, optimizer):
            for batch in loader:
                with torch.autocast("cuda"):
                    train_step(model, batch, optimizer)
        """})
    monkeypatch.chdir(root)

    def cached_rows():
        result = CliRunner().invoke(main, ["check", "--select", "AMP001", "--output-format", "json", "."])
        return [(f["filename"], f["location"]["row"]) for f in json.loads(result.output)]

    assert cached_rows() == [("trainer/loop.py", 8)]
    assert cached_rows() == [("trainer/loop.py", 8)]  # answered from the cache
    engine = root / "trainer" / "engine.py"
    engine.write_text(ENGINE.replace("    apply_gradients(loss, optimizer)\n", "    return loss\n", 1))
    assert cached_rows() == []
    engine.write_text(ENGINE)
    assert cached_rows() == [("trainer/loop.py", 8)]


PROFILING = """\
import time

import torch


def measure(model, x):
    start = time.perf_counter()
    out = model(x)
    out.float().sum().backward()
    return time.perf_counter() - start, torch.cuda.max_memory_allocated()


def sweep(model, sizes):
    return [measure(model, torch.randn(n, 3, 224, 224)) for n in sizes]


def fit_step(model, x, y, optimizer):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_a_backward_that_no_optimizer_steps_on_is_a_measurement_and_stays_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/profiling.py": PROFILING, "trainer/batch_size.py": """\
        import copy

        import torch
        from .profiling import measure, sweep


        def pick_batch_size(model, sizes, use_amp=True):
            with torch.autocast("cuda", enabled=use_amp):
                probe = copy.deepcopy(model).train()
                timings = sweep(probe, sizes)
                single = measure(probe, torch.randn(1, 3, 224, 224))
            return max(n for n, (seconds, memory) in zip(sizes, timings) if memory < 8e9), single
        """})
    assert _findings(root, monkeypatch) == []


def test_the_same_helpers_are_reported_where_an_optimizer_steps_on_their_gradients(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/profiling.py": PROFILING, "trainer/loop.py": """\
        import torch
        from .profiling import fit_step, measure


        def fit(model, loader, optimizer):
            for x, y in loader:
                with torch.autocast("cuda"):
                    fit_step(model, x, y, optimizer)


        def warm_up(model, loader, optimizer):
            for x, _ in loader:
                with torch.autocast("cuda"):
                    measure(model, x)
                optimizer.step()
        """})
    assert [(f[0], f[1]) for f in _findings(root, monkeypatch)] == [("trainer/loop.py", 8), ("trainer/loop.py", 14)]
