"""flake8 runs amplint's rules as the AMP codes: `flake8 --select AMP` (registered as an entry point)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import __version__
from .engine import config as config_mod
from .engine.rule import all_rules
from .engine.runner import lint_source
from .policy import loader


class Plugin:
    name = "amplint"
    version = __version__

    def __init__(self, tree, filename: str, lines: list[str]):
        self.filename = filename
        self.source = "".join(lines)

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        try:
            settings = config_mod.load(Path(self.filename).resolve().parent)
        except config_mod.ConfigError:
            settings = config_mod.Config(root=Path.cwd())
        result = lint_source(self.filename, self.source, list(all_rules()),
                             policy_loader=loader(settings.device, settings.torch_version))
        for d in result.diagnostics:
            # flake8 counts columns from 0; amplint prints them from 1, as ruff does.
            yield d.location.row, d.location.column - 1, f"{d.code} {d.message}", type(self)
