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


PRECISION = """\
    import torch


    def amp_dtype_of(name=None):
        if name is None:
            return None
        if name in ("bf16", "bfloat16"):
            return torch.bfloat16
        return torch.float16
    """

LOOP = """\
    import torch
    from .precision import amp_dtype_of


    class Loop:
        def __init__(self, cfg, model, optimizer):
            self.cfg, self.model, self.optimizer = cfg, model, optimizer
            self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.mixed.enabled)

        def step(self, batch):
            with torch.autocast("cuda", enabled=self.cfg.mixed.enabled,
                                dtype=amp_dtype_of(self.cfg.mixed.amp_dtype)):
                loss = self.model(batch)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
    """

RECIPE = """\
    run:
      epochs: 10
      mixed:
        enabled: true
        amp_dtype: bf16
    """


def _configured(root, **changed):
    files = {"pyproject.toml": '[project]\nname = "seg"\n', "seg/__init__.py": "", "seg/precision.py": PRECISION,
             "seg/loop.py": LOOP, "recipes/finetune.yaml": RECIPE}
    files.update(changed)
    return write_files(root, {name: text for name, text in files.items() if text is not None})


def test_a_scaler_for_a_region_a_config_sets_to_bfloat16_through_a_helper(tmp_path, monkeypatch):
    """`dtype=amp_dtype_of(cfg.mixed.amp_dtype)`, a helper that gives bfloat16 for `"bf16"`,
    and a recipe that sets `mixed.amp_dtype: bf16`: the scaler runs for a bfloat16 region."""
    [(path, row, message, related)] = findings(_configured(tmp_path), "AMP010", monkeypatch)
    assert (path, row) == ("seg/loop.py", 8)
    assert message == ("GradScaler built whatever the dtype, but the autocast region of line 11 runs in bfloat16 "
                       "with `run.mixed.amp_dtype: bf16` (recipes/finetune.yaml:5), for which `amp_dtype_of` gives "
                       "torch.bfloat16 (seg/precision.py:8): bfloat16 needs no loss scaling; build the scaler only "
                       "for float16 (or pass that choice as `enabled=`)")
    assert related == [("recipes/finetune.yaml", 5, "`run.mixed.amp_dtype: bf16`"),
                       ("seg/precision.py", 8, "`amp_dtype_of` gives torch.bfloat16 where "
                                               "`name in ('bf16', 'bfloat16')`")]


def test_a_method_that_maps_the_config_string_passed_by_keyword(tmp_path, monkeypatch):
    precision = """\
        import torch


        class Precision:
            def dtype(self, kind):
                if kind == "bfloat16":
                    return torch.bfloat16
                return torch.float16
        """
    loop = LOOP.replace("from .precision import amp_dtype_of", "from .precision import Precision") \
        .replace("dtype=amp_dtype_of(self.cfg.mixed.amp_dtype)", "dtype=Precision().dtype(kind=self.cfg.mixed.amp_dtype)")
    recipe = '{"train": {"mixed": {"enabled": true, "amp_dtype": "bfloat16"}}}\n'
    root = _configured(tmp_path, **{"seg/precision.py": precision, "seg/loop.py": loop,
                                    "recipes/finetune.yaml": None, "recipes/finetune.json": recipe})
    [(path, row, message, _)] = findings(root, "AMP010", monkeypatch)
    assert (path, row) == ("seg/loop.py", 8)
    assert "with `train.mixed.amp_dtype: bfloat16` (recipes/finetune.json:1), for which `dtype` gives " \
           "torch.bfloat16 (seg/precision.py:7)" in message


def test_silent_where_no_config_picks_bfloat16_or_the_scaler_follows_the_dtype(tmp_path, monkeypatch):
    """Each variant differs from the reported project in one thing."""
    variants = {
        # The recipe picks float16: the scaler is needed.
        "float16": {"recipes/finetune.yaml": RECIPE.replace("amp_dtype: bf16", "amp_dtype: fp16")},
        # Another key of that name, under a section the code does not read.
        "other key": {"recipes/finetune.yaml": RECIPE.replace("mixed:", "eval:")},
        # The scaler is built for float16 only.
        "gated": {"seg/loop.py": LOOP.replace('enabled=cfg.mixed.enabled)',
                                              'enabled=cfg.mixed.amp_dtype == "fp16")')},
        # The helper gives something else too: it says nothing of the dtype.
        "helper": {"seg/precision.py": PRECISION.replace("return None", "return getattr(torch, name)")},
        # The value passed is not what the helper tests.
        "argument": {"seg/loop.py": LOOP.replace("amp_dtype_of(self.cfg.mixed.amp_dtype)", "amp_dtype_of()")},
    }
    for name, changed in variants.items():
        root = tmp_path / name.replace(" ", "_")
        root.mkdir()
        assert findings(_configured(root, **changed), "AMP010", monkeypatch) == [], name
