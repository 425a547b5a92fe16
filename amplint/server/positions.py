"""Places in a document, between the engine's terms (1-based rows, columns and character
offsets counted in code points) and the protocol's (0-based lines, characters counted in the
units the client and server agreed on: UTF-16 unless it asked for another)."""

from __future__ import annotations

import bisect
import difflib
import os

from lsprotocol import types
from pygls.workspace import PositionCodec

from ..engine.diagnostics import Location
from ..engine.source import split_lines


class Text:
    """A document's text, its lines counted as the engine counts them (only \\r\\n, \\r and
    \\n end one; Python's ``str.splitlines`` would also split at a form feed and shift every
    line after it)."""

    def __init__(self, text: str, codec: PositionCodec):
        self.text = text
        self.codec = codec
        self.lines = split_lines(text, keepends=True)
        # Where each line starts; after a final line break, the empty line that follows it.
        self.starts = [0]
        for line in self.lines:
            if line.endswith(("\n", "\r")):
                self.starts.append(self.starts[-1] + len(line))

    def position(self, offset: int) -> types.Position:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        start = self.starts[line]
        return types.Position(line, self.codec.client_num_units(self.text[start:offset]))

    def offset(self, position: types.Position) -> int:
        if position.line >= len(self.starts):
            return len(self.text)
        start = self.starts[position.line]
        end = self.starts[position.line + 1] if position.line + 1 < len(self.starts) else len(self.text)
        line = self.text[start:end].rstrip("\r\n")
        units = 0
        for index, char in enumerate(line):
            if units >= position.character:
                return start + index
            units += self.codec.client_num_units(char)
        return start + len(line)

    def location_offset(self, location: Location) -> int:
        """The offset of an engine location (1-based row and column, in code points)."""
        row = max(1, min(location.row, len(self.starts)))
        return min(self.starts[row - 1] + location.column - 1, len(self.text))

    def range(self, start: Location, end: Location) -> types.Range:
        return types.Range(self.position(self.location_offset(start)), self.position(self.location_offset(end)))

    def edit(self, start: int, end: int, content: str) -> types.TextEdit:
        return types.TextEdit(types.Range(self.position(start), self.position(end)), content)

    def edits_to(self, new_text: str) -> list[types.TextEdit]:
        """The edits that turn this text into ``new_text``: one per run of lines that differ,
        less what the run keeps at its ends, so that an editor keeps its marks and cursor
        where nothing changes."""
        new_lines = split_lines(new_text, keepends=True)
        old_starts = [0]
        for line in self.lines:
            old_starts.append(old_starts[-1] + len(line))
        matcher = difflib.SequenceMatcher(None, self.lines, new_lines, autojunk=False)
        edits = []
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            before, after = "".join(self.lines[i1:i2]), "".join(new_lines[j1:j2])
            head = len(os.path.commonprefix([before, after]))
            tail = len(os.path.commonprefix([before[head:][::-1], after[head:][::-1]]))
            edits.append(self.edit(old_starts[i1] + head, old_starts[i2] - tail, after[head:len(after) - tail]))
        return edits
