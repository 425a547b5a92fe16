"""flake8 runs amplint's rules as the AMP codes: `flake8 --select AMP` (registered as an entry point).

Each file is checked with the configuration `amplint check` would use for it: the nearest
pyproject.toml with a ``[tool.amplint]`` table above the file (above the current folder for
stdin), read by amplint's own loader. Its select / ignore / extend-select choose the rules,
per-file-ignores drop rules for the file, device and torch-version pick the policy table.
flake8's own --select / --ignore / --per-file-ignores then filter what is reported, as for any
plugin. A configuration amplint refuses (exit 2 for `amplint check`) is reported on line 1 of
each file as AMP999, with amplint's message; the file is not checked."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from . import __version__
from .engine import config as config_mod
from .engine.diagnostics import INTERNAL_ERROR
from .engine.runner import lint_source
from .policy import PolicyError, loader


@lru_cache(maxsize=256)
def _settings(start: Path):
    """The configuration, the rules it selects and the policy loader for files at ``start``
    (a file, or the folder where a missing one would be); a ConfigError is not cached."""
    settings = config_mod.load(start)
    rules = settings.rules()
    load = loader(settings.device, settings.torch_version)
    if any(r.uses_policy for r in rules):
        try:
            load()
        except PolicyError as exc:  # as `amplint check` words it
            where = f"{settings.source} [tool.amplint]" if settings.source else "configuration"
            raise config_mod.ConfigError(f"{where}: device / torch-version: {exc}") from None
    return settings, rules, load


class Plugin:
    name = "amplint"
    version = __version__

    def __init__(self, tree, filename: str, lines: list[str]):
        self.filename = filename
        self.source = "".join(lines)

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        path = Path(self.filename)
        # As the command line does: a path that is not there (flake8's "stdin", or a
        # --stdin-display-name) takes the configuration of the current folder.
        start = path.parent if os.path.exists(path) else Path.cwd()
        try:
            settings, rules, load = _settings(start.resolve())
        except config_mod.ConfigError as exc:
            yield 1, 0, f"{INTERNAL_ERROR[0]} amplint configuration error: {exc}", type(self)
            return
        ignored = settings.ignored_for(path)
        rules = [r for r in rules if not any(r.code.startswith(i) for i in ignored)]
        if not rules:
            return
        result = lint_source(self.filename, self.source, rules, policy_loader=load)
        for d in result.diagnostics:
            # flake8 counts columns from 0; amplint prints them from 1, as ruff does.
            yield d.location.row, d.location.column - 1, f"{d.code} {d.message}", type(self)
