"""``# noqa`` comments: per line (all codes, or a list) and per file (``# amplint: noqa``)."""

from __future__ import annotations

import re
import tokenize
from dataclasses import dataclass, field

from .source import split_lines

_LINE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_FILE = re.compile(r"#\s*amplint\s*:\s*noqa\b", re.IGNORECASE)


@dataclass
class Suppressions:
    whole_file: bool = False
    lines: dict[int, frozenset[str] | None] = field(default_factory=dict)  # None: every code

    def suppresses(self, row: int, code: str) -> bool:
        if self.whole_file:
            return True
        if row not in self.lines:
            return False
        codes = self.lines[row]
        return codes is None or code in codes


def _comments(source: str):
    # Each line ended by "\n" whatever its ending was: tokenize (through StringIO) would take
    # a file with lone "\r" endings for one long line.
    lines = iter([line + "\n" for line in split_lines(source)])
    try:
        for tok in tokenize.generate_tokens(lambda: next(lines, "")):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return


def parse(source: str) -> Suppressions:
    found = Suppressions()
    if "noqa" not in source.lower():
        return found
    for row, comment in _comments(source):
        if _FILE.search(comment):
            found.whole_file = True
        match = _LINE.search(comment)
        if match:
            codes = match.group("codes")
            found.lines[row] = None if codes is None else frozenset(
                c.upper() for c in re.split(r"[\s,]+", codes) if c)
    return found
