"""``path:line:col: CODE message``, as ruff's concise format prints it."""

from __future__ import annotations

from collections import Counter

from ..engine.diagnostics import Diagnostic


def render(diagnostics: list[Diagnostic]) -> str:
    lines = []
    for d in diagnostics:
        line = f"{d.path}:{d.location.row}:{d.location.column}: {d.code} {d.message}"
        if d.fix is not None:
            marker = "[*]" if d.fix.applicability == "safe" else "[unsafe fix]"
            line += f" {marker} {d.fix.message}"
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def statistics(diagnostics: list[Diagnostic]) -> str:
    counts = Counter((d.code, d.name) for d in diagnostics)
    fixable = Counter(d.code for d in diagnostics if d.fix is not None)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{n:5d}\t{code}\t{'[*] ' if fixable[code] else ''}{name}\n" for (code, name), n in rows)
