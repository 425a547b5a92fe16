"""What a rule reports: a diagnostic, with an optional fix made of text edits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Applicability = Literal["safe", "unsafe"]

# The codes the engine itself reports, with their names.
SYNTAX_ERROR = ("AMP000", "syntax-error")
INTERNAL_ERROR = ("AMP999", "internal-error")


@dataclass(frozen=True, order=True)
class Edit:
    """Replace source[start:end] (character offsets) with ``content``."""

    start: int
    end: int
    content: str


@dataclass(frozen=True)
class Fix:
    message: str
    edits: tuple[Edit, ...]
    applicability: Applicability = "safe"
    # Fixes that share a group (an import rewrite and every use of it) apply together or not at all.
    group: str | None = None


@dataclass(frozen=True)
class Location:
    row: int  # 1-based
    column: int  # 1-based, as ruff prints it
    # In a Jupyter notebook: the cell (1-based, every cell counted); ``row`` is then the
    # row within that cell. None in a Python file.
    cell: int | None = None


@dataclass(frozen=True)
class Related:
    """Another place a finding depends on (in another file, often): shown in the message,
    and as a related location in SARIF and JSON."""
    path: str
    row: int
    message: str


@dataclass
class Diagnostic:
    code: str
    name: str
    message: str
    path: str
    location: Location
    end_location: Location
    fix: Fix | None = None
    url: str | None = None
    detail: str | None = None  # e.g. the traceback of an internal error
    # For fixes: edit positions converted to rows/columns, set by the engine.
    edit_locations: list[tuple[Location, Location, str]] = field(default_factory=list)
    related: tuple[Related, ...] = ()

    @property
    def sort_key(self):
        return (self.path, self.location.cell or 0, self.location.row, self.location.column, self.code)
