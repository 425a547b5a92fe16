"""GitHub Actions workflow commands: one ``::error`` annotation per diagnostic."""

from __future__ import annotations

from ..engine.diagnostics import Diagnostic


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(diagnostics: list[Diagnostic]) -> str:
    lines = []
    for d in diagnostics:
        props = ",".join([
            f"title={_escape_property(f'amplint ({d.code})')}",
            f"file={_escape_property(d.path)}",
            f"line={d.location.row}", f"col={d.location.column}",
            f"endLine={d.end_location.row}", f"endColumn={d.end_location.column}",
        ])
        where = "" if d.location.cell is None else f"cell {d.location.cell}: "  # rows are the cell's
        lines.append(f"::error {props}::{_escape_data(f'{d.code} {where}{d.message}')}")
    return "".join(line + "\n" for line in lines)
