"""A region whose dtype a project function gives: `torch.autocast("cuda", dtype=cfg.amp_dtype)`
where `amp_dtype` is a property of the project's config, or `dtype=get_dtype(args.precision)`
a helper of another module, whose every `return` is a literal torch dtype. AMP009 judges such a
region float16 where one of those returns is torch.float16 and the project makes no
GradScaler, and says when it applies. Multi-file projects through the real CLI."""

import json

from click.testing import CliRunner

from amplint.cli import main
from projects import findings, write_files

CONFIG = """\
    import torch
    from dataclasses import dataclass


    @dataclass
    class TrainConfig:
        precision: str = "bf16-mixed"
        lr: float = 3e-4

        @property
        def amp_dtype(self) -> torch.dtype:
            if self.precision == "bf16-mixed":
                return torch.bfloat16
            elif self.precision == "16-mixed":
                return torch.float16
            raise ValueError(self.precision)
    """

TRAINER = """\
    import torch


    class Trainer:
        def __init__(self, cfg, model, optimizer):
            self.cfg, self.model, self.optimizer = cfg, model, optimizer

        def step(self, batch):
            with torch.autocast("cuda", dtype=self.cfg.amp_dtype):
                loss = self.model(**batch).loss
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
    """


def _project(tmp_path, **changed):
    files = {"pyproject.toml": '[project]\nname = "lm"\n', "lm/__init__.py": "", "lm/config.py": CONFIG,
             "lm/trainer.py": TRAINER}
    files.update({f"lm/{name}.py": text for name, text in changed.items()})
    return write_files(tmp_path, files)


def test_a_config_property_that_gives_float16_makes_the_region_float16(tmp_path, monkeypatch):
    [(path, row, message, related)] = findings(_project(tmp_path), "AMP009", monkeypatch)
    assert (path, row) == ("lm/trainer.py", 9)
    assert message.startswith("float16 autocast (when `self.cfg.amp_dtype` is torch.float16, where "
                              "`self.precision == '16-mixed'` (lm/config.py:15)) with a backward pass but no GradScaler: "
                              "`loss.backward()` on line 11 runs unscaled")
    assert related == [("lm/config.py", 15, "`amp_dtype` gives torch.float16 where `self.precision == '16-mixed'`")]


def test_a_helper_that_picks_the_dtype_by_a_conditional_expression(tmp_path, monkeypatch):
    helpers = """\
        import torch


        def autocast_dtype(name):
            return torch.float16 if name in ("fp16", "16") else torch.bfloat16
        """
    trainer = """\
        import torch
        from .helpers import autocast_dtype


        def train_epoch(model, loader, optimizer, args):
            for inputs, targets in loader:
                with torch.autocast(device_type="cuda", dtype=autocast_dtype(args.precision)):
                    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
                loss.backward()
                optimizer.step()
        """
    [(path, row, message, related)] = findings(_project(tmp_path, helpers=helpers, trainer=trainer), "AMP009",
                                               monkeypatch)
    assert (path, row) == ("lm/trainer.py", 7)
    assert "(when `autocast_dtype(args.precision)` is torch.float16, where `name in ('fp16', '16')` " \
           "(lm/helpers.py:5))" in message
    assert related == [("lm/helpers.py", 5, "`autocast_dtype` gives torch.float16 where `name in ('fp16', '16')`")]


def test_silent_where_the_dtype_is_not_shown_float16_or_a_scaler_may_pair_with_it(tmp_path, monkeypatch):
    """Each variant differs from the reported project in one thing."""
    bfloat16_only = CONFIG.replace("torch.float16", "torch.bfloat16")
    # The project makes a GradScaler (another trainer's): this one's backward may be handed it.
    scaled_elsewhere = "import torch\n\nSCALER = torch.amp.GradScaler('cuda')\n"
    # Another class of the project has an `amp_dtype` that is a setting, not a literal dtype.
    ambiguous = ("class EvalConfig:\n    def __init__(self, dtype):\n        self._dtype = dtype\n\n"
                 "    @property\n    def amp_dtype(self):\n        return self._dtype\n")
    # A method, not a property: `cfg.amp_dtype` is then not its value.
    method = CONFIG.replace("    @property\n", "")
    # The dtype bound in the function itself.
    local = TRAINER.replace('with torch.autocast("cuda", dtype=self.cfg.amp_dtype):',
                            'dtype = self.cfg.amp_dtype\n            with torch.autocast("cuda", dtype=dtype):')
    for name, changed in [("bfloat16", {"config": bfloat16_only}), ("scaler", {"amp": scaled_elsewhere}),
                          ("ambiguous", {"eval_config": ambiguous}), ("method", {"config": method}),
                          ("local", {"trainer": local})]:
        root = tmp_path / name
        root.mkdir()
        assert findings(_project(root, **changed), "AMP009", monkeypatch) == [], name


def test_the_finding_follows_the_property_across_cached_runs(tmp_path, monkeypatch):
    """The trainer's cached result rests on what `amp_dtype` gives: when the config stops
    giving float16, the trainer is checked again and the finding goes."""
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)

    def run():
        result = CliRunner().invoke(main, ["check", "--select", "AMP009", "--output-format", "json", "."])
        return [(f["filename"], f["code"]) for f in json.loads(result.output)]

    assert run() == run() == [("lm/trainer.py", "AMP009")]
    (tmp_path / "lm/config.py").write_text((tmp_path / "lm/config.py").read_text().replace("torch.float16",
                                                                                          "torch.bfloat16"))
    assert run() == []


def test_a_function_that_always_gives_float16_and_a_long_test_shown_cut(tmp_path, monkeypatch):
    always = "import torch\n\n\ndef training_dtype():\n    return torch.half\n"
    trainer = TRAINER.replace("dtype=self.cfg.amp_dtype", "dtype=training_dtype()").replace(
        "import torch\n", "import torch\n    from .dtypes import training_dtype\n", 1)
    [(_, _, message, related)] = findings(_project(tmp_path, dtypes=always, trainer=trainer), "AMP009", monkeypatch)
    assert "(when `training_dtype()` is torch.float16 (lm/dtypes.py:5))" in message
    assert related == [("lm/dtypes.py", 5, "`training_dtype` gives torch.float16")]

    long_test = CONFIG.replace('self.precision == "16-mixed"',
                               'self.precision in ("16-mixed", "fp16", "float16", "half", "amp_fp16", "16-true-mixed")')
    root = tmp_path / "long"
    root.mkdir()
    [(_, _, message, _)] = findings(_project(root, config=long_test), "AMP009", monkeypatch)
    assert "where `self.precision in ('16-mixed', 'fp16', 'float16', 'half', 'amp_fp16', '16-tru...`" \
           " (lm/config.py:15))" in message
