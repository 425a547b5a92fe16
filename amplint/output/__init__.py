"""Output formats for diagnostics. Each is a pure function of the diagnostics; the terminal
formats also take the sources the findings point into, and whether to colour."""

from __future__ import annotations

from typing import Callable

from ..engine.diagnostics import Diagnostic
from . import github, json_format, sarif, text

FORMATS: dict[str, Callable[[list[Diagnostic]], str]] = {
    "full": text.full,
    "concise": text.concise,
    "json": json_format.render,
    "sarif": sarif.render,
    "github": github.render,
}
TERMINAL_FORMATS = frozenset({"full", "concise"})
