"""Jupyter notebooks (``.ipynb``, nbformat 4): their code cells linted as one text, the
findings placed in their cells, fixes written back into the cells they change.

- **Reading.** The notebook is plain JSON. The code cells' sources are joined in order,
  each ending with a newline, and linted once, as one module (names defined in one cell are
  known in the next, as when the notebook runs top to bottom). Markdown and raw cells, and
  code cells of a notebook whose kernel is not Python, are not read.
- **IPython syntax.** A line magic (``%time f()``), a shell escape (``!pip install x``,
  ``files = !ls``), a help request (``obj?``) and a cell magic (``%%time``) become a line
  Python accepts (``pass``, ``files = None``, an empty line), line for line, so every
  position maps back. A cell whose cell magic runs something other than Python
  (``%%bash``, ``%%writefile``) is left out of the linted text (its lines are empty there).
- **Positions.** A finding is placed in its cell: ``Location.cell`` is the cell's number
  (1-based, counting every cell of the notebook, markdown ones too, as Jupyter shows them)
  and its row is the row within that cell (columns are unchanged).
- **Fixing.** Fixes are applied as for a ``.py`` file, round after round, with two limits:
  a fix that would change a magic line (or any line of a cell that is not Python) is not
  applied, nor is one whose edit would span two cells; a fix grouped with such a fix is
  not applied either. Only the ``source`` of the cells that changed is rewritten, in the
  JSON text itself: every other byte of the file (outputs, metadata, the indentation and
  key order of the JSON, its final newline) stays as it was.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from . import source as source_io
from .diagnostics import INTERNAL_ERROR, Diagnostic, Edit, Fix, Location
from .rule import Rule
from .runner import FileResult, accepted_edits, lint_source

SUFFIX = ".ipynb"

# Cell magics whose body is Python: the body is linted, the magic line is not.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "python", "python3"})

# A notebook's findings point into its code cells; the text handed to the terminal formats
# (``FileResult.source``) holds every cell's text, in order, separated by this character
# (an empty text for markdown and raw cells). Source code never holds it: a Python file
# with a NUL is refused unread, and so is a notebook whose code has one.
CELL_SEPARATOR = "\0"

# Cache entries of a notebook are keyed by its bytes under this prefix, so that a .py file
# holding the same bytes (JSON is a Python expression) never answers from them.
_CACHE_PREFIX = b"amplint notebook\0"


def is_notebook(path: Path | str) -> bool:
    return str(path).endswith(SUFFIX)


def cell_text(source: str, cell: int) -> str | None:
    """The text of ``cell`` (1-based) in the text a notebook's findings point into."""
    parts = source.split(CELL_SEPARATOR)
    return parts[cell - 1] if 1 <= cell <= len(parts) else None


class NotebookError(Exception):
    """A file named .ipynb that cannot be read as a notebook; the message says why."""


# -- reading and writing the JSON ---------------------------------------------------------

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NON_ASCII_ESCAPE = re.compile(r"\\u(?:00[89a-fA-F]|0[1-9a-fA-F][0-9a-fA-F]|[1-9a-fA-F][0-9a-fA-F]{2})[0-9a-fA-F]")


@dataclass
class Notebook:
    text: str  # the file's JSON text (without a BOM)
    bom: bool
    cells: list[dict]
    python: bool  # whether the kernel runs Python (code cells of other kernels are not read)

    @classmethod
    def load(cls, data: bytes) -> "Notebook":
        bom = data.startswith(b"\xef\xbb\xbf")
        try:
            text = data[3 if bom else 0:].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotebookError(f"not a Jupyter notebook: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotebookError(f"not a Jupyter notebook: not valid JSON ({exc.msg}: line {exc.lineno}, "
                                f"column {exc.colno})") from None
        except RecursionError:
            raise NotebookError("not a Jupyter notebook: JSON nested too deeply") from None
        if not isinstance(raw, dict):
            raise NotebookError("not a Jupyter notebook: the JSON is not an object")
        version = raw.get("nbformat")
        if isinstance(version, int) and version < 4:
            raise NotebookError(f"nbformat {version} notebook: only nbformat 4 is read "
                                "(`jupyter nbconvert --to notebook --inplace` upgrades it)")
        cells = raw.get("cells")
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            raise NotebookError('not a Jupyter notebook: no "cells" list of objects at the top level')
        for number, cell in enumerate(cells, 1):
            if cell.get("cell_type") != "code":
                continue
            source = cell.get("source", "")
            if not (isinstance(source, str) or isinstance(source, list)
                    and all(isinstance(line, str) for line in source)):
                raise NotebookError(f'not a Jupyter notebook: the "source" of cell {number} is neither text '
                                    "nor a list of lines")
            if CELL_SEPARATOR in _joined(source):
                raise NotebookError(f"cell {number} contains a NUL character")
        return cls(text, bom, cells, _is_python(raw.get("metadata")))

    def code_cells(self) -> list[tuple[int, str]]:
        """(number, text) of each code cell that holds any text."""
        return [(number, text) for number, cell in enumerate(self.cells, 1)
                if cell.get("cell_type") == "code" and (text := _joined(cell.get("source", "")))]

    def display_source(self, texts: dict[int, str]) -> str:
        """The text findings point into: see ``CELL_SEPARATOR``."""
        return CELL_SEPARATOR.join(texts.get(number, "") for number in range(1, len(self.cells) + 1))

    def dumps(self, changed: dict[int, str]) -> bytes:
        """The file with the ``source`` of the ``changed`` cells (number: new text) replaced,
        and not one other byte changed."""
        spans = _source_spans(self.text)
        ascii_only = self.text.isascii() and _NON_ASCII_ESCAPE.search(self.text) is not None
        pieces, at = [], 0
        for number in sorted(changed):
            start, end = spans[number - 1]
            pieces += [self.text[at:start], _source_value(self.text[start:end], changed[number], ascii_only)]
            at = end
        pieces.append(self.text[at:])
        return (b"\xef\xbb\xbf" if self.bom else b"") + "".join(pieces).encode("utf-8")


def _joined(source: str | list[str]) -> str:
    return source if isinstance(source, str) else "".join(source)


def _is_python(metadata) -> bool:
    """Whether the notebook's kernel runs Python: its language_info (or kernelspec) says so,
    or says nothing."""
    if not isinstance(metadata, dict):
        return True
    for key, field in (("language_info", "name"), ("kernelspec", "language")):
        info = metadata.get(key)
        if isinstance(info, dict) and isinstance(info.get(field), str):
            return info[field].lower() == "python"
    return True


def _source_spans(text: str) -> list[tuple[int, int] | None]:
    """Where each cell's ``source`` value lies in the JSON text, (start, end), None for a cell
    without one. The text has been parsed by ``json.loads`` already; the last of duplicate
    keys counts, as there."""
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        return _WHITESPACE.match(text, i).end()

    def members(i: int) -> dict[str, tuple[int, int]]:
        """The object at ``i``: key -> span of its value."""
        found = {}
        i = skip(i + 1)
        while text[i] != "}":
            key, i = json.decoder.scanstring(text, i + 1)
            i = skip(skip(i) + 1)  # the colon
            end = decoder.raw_decode(text, i)[1]
            found[key] = (i, end)
            i = skip(end)
            if text[i] == ",":
                i = skip(i + 1)
        return found

    start, _ = members(skip(0))["cells"]
    spans, i = [], skip(start + 1)
    while text[i] != "]":
        spans.append(members(i).get("source"))
        i = skip(decoder.raw_decode(text, i)[1])
        if text[i] == ",":
            i = skip(i + 1)
    return spans


def _source_value(old: str, new_text: str, ascii_only: bool) -> str:
    """The JSON for a cell's new source, in the form and layout of its ``old`` JSON: a string
    stays a string; a list is a list of lines (each ending with a newline but the last), one
    per line at the old list's indentation if it spread over lines."""
    def dump(text: str) -> str:
        # a lone surrogate (JSON's "\ud800") cannot be written as UTF-8: escaped, as it was
        return json.dumps(text, ensure_ascii=ascii_only or not _encodable(text))

    if old.startswith('"'):
        return dump(new_text)
    items = [dump(line) for line in source_io.split_lines(new_text, keepends=True)]
    opening = re.match(r"\[(\r?\n)([ \t]*)", old)
    if opening is None:  # written on one line
        return "[" + (", " if re.search(r'",\s', old) or "," not in old else ",").join(items) + "]"
    newline, indent = opening.groups()
    closing = re.search(r"([ \t]*)\]$", old).group(1)
    if not items:
        return "[]"
    return "[" + newline + ("," + newline).join(indent + item for item in items) + newline + closing + "]"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- IPython syntax -----------------------------------------------------------------------

_HELP = re.compile(r"\?{1,2}[\w.%]*\s*|[\w.%]+\?{1,2}\s*")
_ASSIGNED_MAGIC = re.compile(r"([\w.\[\], *]+?\s*=\s*)[%!]")  # `files = !ls`
_LINE_END = re.compile(r"(\r\n|\r|\n)?\Z")


def _ending(line: str) -> str:
    return _LINE_END.search(line).group(0)


def _continues(line: str) -> bool:
    return line.rstrip("\r\n").endswith("\\")


def _magic_placeholder(line: str) -> str | None:
    """What a logical line of IPython syntax becomes, or None if it is Python."""
    body = line.rstrip("\r\n")
    code = body.lstrip()
    indent = body[:len(body) - len(code)]
    if code.startswith(("%", "!")) or _HELP.fullmatch(code):
        return indent + "pass" + _ending(line)
    assigned = _ASSIGNED_MAGIC.match(code)
    if assigned:
        return indent + assigned.group(1) + "None" + _ending(line)
    return None


class _LogicalLines:
    """Which lines start a logical line: not inside brackets, a string, or after a backslash.
    Only a line that starts one can be IPython syntax."""

    def __init__(self):
        self.depth = 0
        self.quote: str | None = None  # the quote of the string the line ends inside
        self.continued = False

    def at_start(self) -> bool:
        return self.depth == 0 and self.quote is None and not self.continued

    def feed(self, line: str) -> None:
        i, n, quote = 0, len(line), self.quote
        comment = False
        while i < n:
            c = line[i]
            if quote:
                if c == "\\":
                    i += 2
                elif line.startswith(quote, i):
                    i, quote = i + len(quote), None
                else:
                    i += 1
                continue
            if c == "#":
                comment = True
                break
            if c in "\"'":
                quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else c
                i += len(quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        if quote is not None and len(quote) == 1 and not _continues(line):
            quote = None  # an unterminated string: Python's error, not ours to carry on
        self.quote = quote
        self.continued = not comment and quote is None and _continues(line)


def _as_python(text: str) -> tuple[list[str], list[str], set[int], bool]:
    """A cell's lines, the same lines as Python (IPython syntax replaced), which of them are
    IPython syntax (0-based), and whether the first of those is a cell magic."""
    lines = source_io.split_lines(text, keepends=True)
    python = list(lines)
    magic: set[int] = set()
    first = lines[0].lstrip() if lines else ""
    start = 0
    if first.startswith("%%"):
        name = first[2:].split(None, 1)[0] if first[2:].strip() else ""
        if name not in _PYTHON_CELL_MAGICS:  # not Python at all: every line left out
            return lines, [_ending(line) for line in lines], set(range(len(lines))), True
        python[0], start = _ending(lines[0]), 1
        magic.add(0)
    state = _LogicalLines()
    in_magic = False
    for i in range(start, len(lines)):
        line = lines[i]
        if in_magic:  # a magic continued with a backslash
            magic.add(i)
            python[i] = _ending(line)
            in_magic = _continues(line)
            continue
        placeholder = _magic_placeholder(line) if state.at_start() else None
        if placeholder is not None:
            magic.add(i)
            python[i] = placeholder
            in_magic = _continues(line)
            continue
        state.feed(line)
    return lines, python, magic, bool(magic) and start == 1


# -- one text for all the cells -------------------------------------------------------------

_LINE_NUMBERS = re.compile(r"\b(lines?) ([0-9]+(?:, [0-9]+)*)\b")


class _Joined:
    """The code cells joined into one Python text, and the way back: positions to cells,
    edits to the cells' own text."""

    def __init__(self, cells: Sequence[tuple[int, str]]):
        self.cells = list(cells)
        self.starts: list[int] = []  # offset of each cell in the text
        self.first_rows: list[int] = []  # row (1-based) where each cell starts
        self.row_counts: list[int] = []
        self.offsets: list[tuple[list[int], list[int]]] = []  # per cell: line starts, in the text and in the cell's own
        # per cell: each magic line's (start, end) in the text (its newline included), and
        # whether it is a cell magic
        self.magic: list[list[tuple[int, int, bool]]] = []
        self.appended: list[bool] = []  # whether the cell's text got a final newline here
        pieces, offset, row = [], 0, 1
        for _, text in self.cells:
            lines, python, magic, cell_magic = _as_python(text)
            appended = bool(lines) and not _ending(lines[-1])
            if appended:
                lines[-1] += "\n"
                python[-1] += "\n"
            starts, own, spans = [offset], [0], []
            for i, (line, py) in enumerate(zip(lines, python)):
                if i in magic:
                    spans.append((starts[-1], starts[-1] + len(py), cell_magic and i == 0))
                starts.append(starts[-1] + len(py))
                own.append(own[-1] + len(line))
            self.starts.append(offset)
            self.first_rows.append(row)
            self.row_counts.append(len(lines))
            self.offsets.append((starts, own))
            self.magic.append(spans)
            self.appended.append(appended)
            pieces.extend(python)
            offset, row = starts[-1], row + len(lines)
        self.text = "".join(pieces)

    # positions

    def location(self, loc: Location) -> Location:
        if not self.cells:
            return loc
        i = max(0, bisect.bisect_right(self.first_rows, loc.row) - 1)
        return Location(loc.row - self.first_rows[i] + 1, loc.column, self.cells[i][0])

    def span(self, start: Location, end: Location) -> tuple[Location, Location]:
        """A range in the text as a range in a cell; one that runs into a later cell stops at
        the end of its first cell's last line."""
        first, last = self.location(start), self.location(end)
        if first.cell != last.cell and self.cells:
            i = [number for number, _ in self.cells].index(first.cell)
            lines = source_io.split_lines(self.cells[i][1])
            last = Location(len(lines), len(lines[-1]) + 1 if lines else 1, first.cell)
        return first, last

    def mapped(self, d: Diagnostic) -> Diagnostic:
        location, end = self.span(d.location, d.end_location)
        edits = [(*self.span(a, b), content) for a, b, content in d.edit_locations]
        fix = d.fix and dataclasses.replace(d.fix, message=self._lines_in_cells(d.fix.message, location.cell))
        return dataclasses.replace(d, message=self._lines_in_cells(d.message, location.cell), fix=fix,
                                   location=location, end_location=end, edit_locations=edits)

    def _lines_in_cells(self, message: str, cell: int | None) -> str:
        """A message's ``line N`` / ``lines N, M`` (rows of the joined text) as rows of their
        cells: ``line 4`` in the finding's own cell, ``line 4 of cell 2`` in another."""
        if not self.cells or "line" not in message:
            return message

        def rewrite(match: re.Match) -> str:
            rows = [int(n) for n in match.group(2).split(", ")]
            if any(not 1 <= row < self.first_rows[-1] + self.row_counts[-1] for row in rows):
                return match.group(0)
            places = [self.location(Location(row, 1)) for row in rows]
            cells = {p.cell for p in places}
            numbers = ", ".join(str(p.row) for p in places)
            if cells == {cell}:
                return f"{match.group(1)} {numbers}"
            if len(cells) == 1:
                return f"{match.group(1)} {numbers} of cell {places[0].cell}"
            return ", ".join(f"line {p.row} of cell {p.cell}" for p in places)

        return _LINE_NUMBERS.sub(rewrite, message)

    # edits

    def _cell_of(self, edit: Edit) -> int | None:
        """The cell an edit lies in (an index), or None where it may not be made: it spans two
        cells, or changes a line of IPython syntax."""
        i = bisect.bisect_right(self.starts, edit.start) - 1
        if i < 0 or edit.end > self.offsets[i][0][-1]:
            return None
        for start, end, cell_magic in self.magic[i]:
            if edit.start < end and edit.end > start:
                return None
            # an insertion where the magic line starts: a line of its own before it is fine
            # (but not before a cell magic, which must stay the cell's first line)
            if edit.start == edit.end == start and (cell_magic or not _ending(edit.content)):
                return None
        return i

    def placeable(self, fixes: list[Fix]) -> list[Fix]:
        """The fixes whose every edit can be made in one cell (and whose group's can)."""
        ok = [all(self._cell_of(e) is not None for e in fix.edits) for fix in fixes]
        blocked = {fix.group for fix, good in zip(fixes, ok) if fix.group and not good}
        return [fix for fix, good in zip(fixes, ok) if good and fix.group not in blocked]

    def apply(self, fixes: list[Fix]) -> tuple[list[tuple[int, str]], int]:
        """As many of the fixes as do not overlap, in source order, applied to the cells'
        own texts (magic lines as they are); (new cells, fixes applied)."""
        edits, applied = accepted_edits(fixes)
        by_cell: dict[int, list[Edit]] = {}
        for edit in edits:
            by_cell.setdefault(self._cell_of(edit), []).append(edit)
        cells = list(self.cells)
        for i, edits in by_cell.items():
            number, text = cells[i]
            text = text + "\n" if self.appended[i] else text
            pieces, at = [], 0
            for edit in edits:
                start, end = self._own(i, edit.start), self._own(i, edit.end)
                pieces += [text[at:start], edit.content]
                at = end
            pieces.append(text[at:])
            text = "".join(pieces)
            if self.appended[i] and text.endswith("\n"):
                text = text[:-1]
            cells[i] = (number, text)
        return cells, applied

    def _own(self, i: int, offset: int) -> int:
        """An offset in the text as one in cell ``i``'s own text (not inside a magic line)."""
        starts, own = self.offsets[i]
        line = bisect.bisect_right(starts, offset) - 1
        return own[line] + offset - starts[line]


# -- linting --------------------------------------------------------------------------------

def _lint(display: str, cells: list[tuple[int, str]], rules: Sequence[type[Rule]], *, fix: bool,
          unsafe: bool, load: Callable | None, use_prefilter: bool, preview: bool):
    """(findings placed in their cells, the cells after the fixes, fixes applied, the
    summaries of the project's other files read for them):
    ``runner.lint_source`` on the joined cells, its fixes applied cell by cell, those a
    notebook cannot take left out."""
    joined = {}  # each text linted: the cells it joins

    def remember(cells: list[tuple[int, str]]) -> str:
        j = _Joined(cells)
        joined[j.text] = j
        return j.text

    def apply(text: str, fixes) -> tuple[str, int]:
        placeable = joined[text].placeable(list(fixes))
        if not placeable:
            return text, 0
        new_cells, count = joined[text].apply(placeable)
        return remember(new_cells), count

    result = lint_source(display, remember(cells), rules, fix=fix, unsafe=unsafe, policy_loader=load,
                         use_prefilter=use_prefilter, apply=apply, preview=preview)
    final = joined[result.source]
    return ([final.mapped(d) for d in result.diagnostics], final.cells, result.fixes_applied,
            result.dependencies)


def _io_error(display: str, message: str) -> Diagnostic:
    return Diagnostic(INTERNAL_ERROR[0], "io-error", message, display, Location(1, 1), Location(1, 1))


def _unreadable(display: str, why: str) -> FileResult:
    result = FileResult(display, [_io_error(display, f"cannot check {display}: {why}")])
    result.internal_errors = 1
    return result


def _cell_diff(before: str, after: str, display: str, number: int) -> str:
    """A cell's change as a unified diff, named ``a/PATH:cell N`` (a cell's last line has no
    newline; the diff shows it as a line like the others)."""
    name = f"{display.lstrip('/')}:cell {number}"

    def lines(text: str) -> list[str]:
        return source_io.split_lines(text if _ending(text) else text + "\n", keepends=True)

    return "".join(difflib.unified_diff(lines(before), lines(after), fromfile=f"a/{name}", tofile=f"b/{name}"))


def lint_notebook(display: str, notebook: Notebook, rules: Sequence[type[Rule]], options,
                  load: Callable | None) -> tuple[FileResult, bytes | None]:
    """The notebook's findings (with ``--fix``/``--diff``: those left after the fixes), and
    the notebook's new bytes when a fix changed a cell (None otherwise). ``options`` is
    ``project.Options``."""
    if not notebook.python:
        return FileResult(display), None
    cells = notebook.code_cells()
    fixing = options.fix or options.diff
    diagnostics, fixed, applied, dependencies = _lint(
        display, cells, rules, fix=fixing, unsafe=options.unsafe_fixes, load=load, use_prefilter=options.use_prefilter,
        preview=options.preview)
    result = FileResult(display, diagnostics, fixes_applied=applied, dependencies=dependencies)
    result.internal_errors = sum(d.code == INTERNAL_ERROR[0] for d in diagnostics)
    changed = {number: text for (number, text), (_, old) in zip(fixed, cells) if text != old}
    if diagnostics:
        result.source = notebook.display_source(dict(fixed))
    if options.diff and changed:
        before = dict(cells)
        result.diff = "".join(_cell_diff(before[n], changed[n], display, n) for n in sorted(changed))
    return result, notebook.dumps(changed) if changed else None


def check_data(display: str, data: bytes, rules: Sequence[type[Rule]], options,
               load: Callable | None) -> tuple[FileResult, bytes | None]:
    """``lint_notebook`` on a notebook's bytes; one that cannot be read is reported as such."""
    try:
        notebook = Notebook.load(data)
    except NotebookError as exc:
        return _unreadable(display, str(exc)), None
    return lint_notebook(display, notebook, rules, options, load)


def check_file(path: Path, display: str, data: bytes, rules: Sequence[type[Rule]], options,
               load: Callable | None, cache=None) -> FileResult:
    """A notebook read from ``path`` (its bytes ``data``): cached like a .py file, by its
    bytes; fixes written back atomically, only if the file still holds ``data``."""
    try:
        notebook = Notebook.load(data)
    except NotebookError as exc:
        return _unreadable(display, str(exc))
    codes = [r.code for r in rules]
    key = _CACHE_PREFIX + data
    if cache is not None:
        cached = cache.get(key, codes, display)
        if cached is not None:
            source = notebook.display_source(dict(notebook.code_cells())) if cached else None
            return FileResult(display, cached, source=source, from_cache=True)
    result, new_data = lint_notebook(display, notebook, rules, options, load)
    if cache is not None and not result.internal_errors:
        cache.put(key, codes, result.diagnostics, result.dependencies)
    if new_data is not None and options.fix and not options.diff:
        try:
            source_io.write_atomically(path, new_data, expected=data)
        except (OSError, UnicodeEncodeError) as exc:
            # Nothing was written: the findings are those of the notebook on disk.
            plain = dataclasses.replace(options, fix=False, diff=False, progress=None)
            result, _ = lint_notebook(display, notebook, rules, plain, load)
            result.diagnostics.append(_io_error(display, f"cannot write fixes to {display}: {exc}"))
            result.internal_errors += 1
    return result
