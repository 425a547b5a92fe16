"""Output formats for diagnostics: text, json, sarif, github. Each is a pure function."""

from __future__ import annotations

from typing import Callable

from ..engine.diagnostics import Diagnostic
from . import github, json_format, sarif, text

FORMATS: dict[str, Callable[[list[Diagnostic]], str]] = {
    "text": text.render,
    "json": json_format.render,
    "sarif": sarif.render,
    "github": github.render,
}
