"""Which method `self.m()` runs, asked by the function summaries (a backward in a base class's
method of another module, reached from an autocast region) and by the flows, in one walk of
the bases (`classes.bases_in_order`): depth first where no two bases share a base, no answer
where they do (Python looks the shared base up last); and which of two same-named
functions a call runs. Real projects on disk, the real CLI; real parses."""

import ast
import textwrap

from amplint.engine.ast_context import AstContext
from amplint.engine.outline import Outline
from amplint.engine.regions import called_function
from amplint.policy import loader
from projects import findings, write_files

BASE = """\
class BaseTrainer:
    def apply_gradients(self, loss):
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
"""


def _project(tmp_path, files: dict[str, str]):
    return write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'proj'\n",
                                           "trainers/__init__.py": "", **files})


def test_a_backward_in_a_base_class_method_of_another_module_is_seen_from_the_region(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainers/base.py": BASE, "trainers/classifier.py": """\
        import torch
        from .base import BaseTrainer


        class ClassifierTrainer(BaseTrainer):
            def fit(self, loader):
                for x, y in loader:
                    with torch.autocast("cuda"):
                        loss = self.model(x, y)
                        self.apply_gradients(loss)
        """})
    found = findings(root, "AMP001", monkeypatch)
    assert [(f[0], f[1]) for f in found] == [("trainers/classifier.py", 10)]
    assert "`self.apply_gradients(...)` runs `loss.backward()` (trainers/base.py:3)" in found[0][2]


def test_an_override_between_the_class_and_the_base_hides_the_bases_backward(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainers/base.py": BASE, "trainers/classifier.py": """\
        import torch
        from .base import BaseTrainer


        class Accumulating(BaseTrainer):
            def apply_gradients(self, loss):
                self.pending.append(loss.detach())


        class ClassifierTrainer(Accumulating):
            def fit(self, loader):
                for x, y in loader:
                    with torch.autocast("cuda"):
                        loss = self.model(x, y)
                        self.apply_gradients(loss)
        """})
    assert findings(root, "AMP001", monkeypatch) == []


def test_in_a_diamond_the_shared_bases_method_is_not_taken_for_the_one_python_runs(tmp_path, monkeypatch):
    # Python runs Deferred.apply_gradients (Trainer, Logging, Deferred, BaseTrainer): no
    # backward there; a walk depth first would reach BaseTrainer's first.
    root = _project(tmp_path, {"trainers/base.py": BASE, "trainers/mixed.py": """\
        import torch
        from .base import BaseTrainer


        class Logging(BaseTrainer):
            def log(self, value):
                print(value)


        class Deferred(BaseTrainer):
            def apply_gradients(self, loss):
                self.pending.append(loss.detach())


        class Trainer(Logging, Deferred):
            def fit(self, loader):
                for x, y in loader:
                    with torch.autocast("cuda"):
                        loss = self.model(x, y)
                        self.apply_gradients(loss)
        """})
    assert findings(root, "AMP001", monkeypatch) == []


def test_a_call_runs_the_last_function_of_its_name():
    source = textwrap.dedent("""\
        def step(model, x):
            model(x).sum().backward()


        def step(model, x):
            return model(x)


        out = step(net, batch)
        """)
    ctx = AstContext("example.py", source, Outline.parse(source), loader("cuda"))
    call = next(c for c in ctx.outline.nodes(ast.Call) if getattr(c.func, "id", "") == "step")
    assert called_function(ctx, call).lineno == 5
