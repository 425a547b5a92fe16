"""Terminal formats: ``concise`` (``path:line:col: CODE message``, one line per finding) and
``full`` (the same line, then the source with a caret under the finding and the fix)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from ..engine.diagnostics import Diagnostic
from ..engine.notebook import cell_text
from ..engine.source import split_lines

_CONTEXT = 1  # source lines shown before and after the finding
_TAB = "    "


class Style:
    """ANSI colours by role (``style.code("AMP001")``), or nothing at all."""

    _ROLES = {"bold": "1", "code": "1;31", "caret": "1;31", "gutter": "1;34", "fix": "1;36"}

    def __init__(self, color: bool):
        self.color = color

    def __getattr__(self, role: str):
        sgr = self._ROLES.get(role)
        if sgr is None:
            raise AttributeError(role)
        return lambda text: f"\x1b[{sgr}m{text}\x1b[0m" if self.color and text else text


def _fix_marker(d: Diagnostic) -> str:
    return "[*]" if d.fix.applicability == "safe" else "[unsafe fix]"


def _headline(d: Diagnostic, style: Style) -> str:
    cell = "" if d.location.cell is None else f"cell {d.location.cell}:"  # a notebook's, as ruff shows it
    where = f"{style.bold(d.path)}:{cell}{d.location.row}:{d.location.column}:"
    return f"{where} {style.code(d.code)} {d.message}"


def concise(diagnostics: list[Diagnostic], *, sources: Mapping[str, str] | None = None,
            color: bool = False) -> str:
    style = Style(color)
    lines = []
    for d in diagnostics:
        line = _headline(d, style)
        if d.fix is not None:
            line += f" {style.fix(_fix_marker(d))} {d.fix.message}"
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def _display(line: str, column: int) -> tuple[str, int]:
    """The line with tabs expanded, and where 1-based ``column`` lands in it (0-based)."""
    before = line[: column - 1].replace("\t", _TAB)
    return line.replace("\t", _TAB), len(before)


def _snippet(d: Diagnostic, lines: list[str], style: Style) -> list[str]:
    first = max(1, d.location.row - _CONTEXT)
    last = min(len(lines), max(d.end_location.row, d.location.row) + _CONTEXT)
    width = len(str(last))
    bar = style.gutter(" " * width + " |")
    out = [bar]
    for row in range(first, last + 1):
        text = lines[row - 1]
        shown, start = _display(text, d.location.column if row == d.location.row else 1)
        out.append(f"{style.gutter(str(row).rjust(width) + ' |')} {shown}".rstrip())
        if row == d.location.row:
            if d.end_location.row == row:
                end = _display(text, d.end_location.column)[1]
            else:  # a multi-line finding: underline to the end of its first line
                end = len(shown.rstrip())
            carets = "^" * max(1, end - start)
            out.append(f"{bar} {' ' * start}{style.caret(carets)} {style.code(d.code)}")
    out.append(bar)
    return out


def full(diagnostics: list[Diagnostic], *, sources: Mapping[str, str] | None = None,
         color: bool = False) -> str:
    style = Style(color)
    blocks = []
    for d in diagnostics:
        block = [_headline(d, style)]
        text = (sources or {}).get(d.path)
        if text is not None and d.location.cell is not None:  # a notebook: the rows are its cell's
            text = cell_text(text, d.location.cell)
        lines = split_lines(text) if text is not None else []
        if 1 <= d.location.row <= len(lines):
            block.extend(_snippet(d, lines, style))
        if d.fix is not None:
            pad = " " * (len(str(min(len(lines), d.end_location.row + _CONTEXT))) + 1)
            block.append(f"{pad}{style.gutter('=')} {style.bold('help')}: {d.fix.message} "
                         f"{style.fix(_fix_marker(d))}")
        blocks.append("\n".join(block) + "\n")
    return "\n".join(blocks)


def statistics_rows(diagnostics: list[Diagnostic]) -> list[dict]:
    """Findings per rule, most first; ``fixable``: whether ``--fix`` (safe fixes) fixes one of them."""
    counts = Counter((d.code, d.name) for d in diagnostics)
    safe = Counter(d.code for d in diagnostics if d.fix is not None and d.fix.applicability == "safe")
    return [{"code": code, "name": name, "count": n, "fixable": safe[code] > 0}
            for (code, name), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def statistics(diagnostics: list[Diagnostic]) -> str:
    return "".join(f"{row['count']:5d}\t{row['code']}\t{'[*] ' if row['fixable'] else ''}{row['name']}\n"
                   for row in statistics_rows(diagnostics))
