"""``# noqa`` comments: per line (all codes, or a list) and per file (``# amplint: noqa``);
where each directive and code stands (for AMP100, unused-noqa), and adding codes to the lines
of findings (``--add-noqa``)."""

from __future__ import annotations

import ast
import re
import tokenize
from dataclasses import dataclass, field

from .diagnostics import Edit
from .outline import Outline
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


def _tokens(source: str):
    # Each line ended by "\n" whatever its ending was: tokenize (through StringIO) would take
    # a file with lone "\r" endings for one long line.
    lines = iter([line + "\n" for line in split_lines(source)])
    return tokenize.generate_tokens(lambda: next(lines, ""))


def _comments(source: str):
    try:
        for tok in _tokens(source):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return


def _comments_from_outline(source: str, outline: Outline) -> list[tuple[int, str]] | None:
    """``_comments`` of the lines that say noqa, from the strings Python's ast found in
    ``source`` (no tokenizing of the file): a `#` outside every string starts a comment, one
    inside a string on one line is text. None where a `#` falls inside a string's span of
    several lines: comments may stand between the parts of `"a"  # c` / `"b"`."""
    strings = [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for kind in (ast.Constant, ast.JoinedStr)
               for n in outline.nodes(kind) if kind is ast.JoinedStr or isinstance(n.value, (str, bytes))]
    found = []
    for row, line in enumerate(split_lines(source), 1):
        if "noqa" not in line.lower():
            continue
        at = line.find("#")
        while at >= 0:
            place = (row, len(line[:at].encode("utf-8")))  # ast's columns count UTF-8 bytes
            around = [(start, end) for start, end in strings if start <= place < end]
            if not around:
                found.append((row, line[at:]))
                break
            if any(start[0] != end[0] for start, end in around):
                return None
            at = line.find("#", at + 1)
    return found


def parse(source: str, outline: Outline | None = None) -> Suppressions:
    """The ``# noqa`` comments of ``source``; with Python's ``outline`` of it, found from its
    strings where they decide it, instead of tokenizing the file."""
    found = Suppressions()
    if "noqa" not in source.lower():
        return found
    comments = None if outline is None else _comments_from_outline(source, outline)
    for row, comment in _comments(source) if comments is None else comments:
        if _FILE.search(comment):
            found.whole_file = True
        match = _LINE.search(comment)
        if match:
            codes = match.group("codes")
            found.lines[row] = None if codes is None else frozenset(
                c.upper() for c in re.split(r"[\s,]+", codes) if c)
    return found


_AMP_CODE = re.compile(r"AMP[0-9]+", re.IGNORECASE)


@dataclass(frozen=True)
class Code:
    code: str  # upper case
    start: int  # offsets in the source
    end: int


@dataclass(frozen=True)
class Directive:
    """A ``# noqa: CODES`` comment: where it stands (character offsets into the source), the
    comment it is part of, and each code with its place."""

    row: int
    start: int  # the directive's "#"
    end: int  # after its last code
    comment_end: int  # the comment runs to here (the end of the line's text)
    line_start: int
    codes: tuple[Code, ...]


def _line_starts(source: str) -> list[int]:
    starts, offset = [0], 0
    for line in split_lines(source, keepends=True):
        offset += len(line)
        starts.append(offset)
    return starts


def directives(source: str) -> list[Directive]:
    """Every ``# noqa`` directive that names codes, as ``parse`` reads them."""
    if "noqa" not in source.lower():
        return []
    found, starts = [], None
    try:
        for tok in _tokens(source):
            if tok.type != tokenize.COMMENT:
                continue
            match = _LINE.search(tok.string)
            if match is None or match.group("codes") is None:
                continue
            starts = starts or _line_starts(source)
            row, col = tok.start
            base = starts[row - 1] + col
            codes = tuple(Code(m.group().upper(), base + match.start("codes") + m.start(),
                               base + match.start("codes") + m.end())
                          for m in re.finditer(r"[A-Za-z]+[0-9]+", match.group("codes")))
            found.append(Directive(row, base + match.start(), base + match.end(), base + len(tok.string),
                                   starts[row - 1], codes))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return found


def removal(source: str, directive: Directive, unused: set[int]) -> Edit:
    """The edit that takes the codes at positions ``unused`` (indexes into its codes) out of a
    directive, or the whole directive when none is left: the comment too when it said nothing
    else, the whole line when the comment was all the line held."""
    kept = [c.code for i, c in enumerate(directive.codes) if i not in unused]
    if kept:
        first, last = directive.codes[0], directive.codes[-1]
        return Edit(first.start, last.end, ", ".join(kept))
    after = source[directive.end:directive.comment_end]
    if after.strip():
        # Other words follow in the same comment: they stay, still a comment.
        rest = directive.end + len(after) - len(after.lstrip())
        return Edit(directive.start, rest, "" if after.lstrip().startswith("#") else "# ")
    start = directive.start
    while start > directive.line_start and source[start - 1] in " \t\f":
        start -= 1
    if start == directive.line_start:  # the comment was the whole line: the line goes
        end = directive.comment_end
        ending = re.match(r"\r\n|\r|\n", source[end:end + 2])
        return Edit(start, end + (ending.end() if ending else 0), "")
    return Edit(start, directive.comment_end, "")


def is_amp_code(code: str) -> bool:
    return _AMP_CODE.fullmatch(code) is not None


@dataclass
class Added:
    """What ``add_codes`` did: the new text, how many codes it added on how many lines, and the
    rows that cannot take a comment (their line ends inside a string, or continues with a
    backslash)."""

    text: str
    codes: int = 0
    lines: int = 0
    refused: set[int] = field(default_factory=set)


def add_codes(source: str, wanted: dict[int, set[str]]) -> Added:
    """``source`` with ``# noqa: CODES`` on each row of ``wanted``: merged into a directive the
    line already has, after a comment it has, or appended to its code (trailing spaces
    replaced). Rows inside a string or continued by a backslash are refused; nothing is added
    to a text that does not tokenize."""
    open_rows, comments = set(), {}
    try:
        for tok in _tokens(source):
            if tok.type in (tokenize.NEWLINE, tokenize.NL):
                open_rows.add(tok.start[0])
            elif tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return Added(source, refused=set(wanted))
    lines = split_lines(source, keepends=True)
    starts = _line_starts(source)
    edits, added = [], Added(source)
    for row in sorted(wanted):
        if row not in open_rows or row > len(lines):
            added.refused.add(row)
            continue
        line = lines[row - 1]
        text_end = starts[row - 1] + len(line.rstrip("\r\n"))
        comment = comments.get(row)
        if comment is not None:
            match = _LINE.search(comment.string)
            base = starts[row - 1] + comment.start[1]
            if match is not None and match.group("codes") is None:
                continue  # a blanket `# noqa` already suppresses everything here
            if match is not None:
                named = {c.upper() for c in re.split(r"[\s,]+", match.group("codes")) if c}
                new = sorted(wanted[row] - named)
                if new:
                    edits.append(Edit(base + match.end(), base + match.end(), "".join(f", {c}" for c in new)))
                    added.codes, added.lines = added.codes + len(new), added.lines + 1
                continue
            at = base + len(comment.string.rstrip())
        else:
            at = starts[row - 1] + len(line.rstrip())
        codes = sorted(wanted[row])
        edits.append(Edit(at, text_end, f"  # noqa: {', '.join(codes)}"))
        added.codes, added.lines = added.codes + len(codes), added.lines + 1
    pieces, at = [], 0
    for edit in sorted(edits):
        pieces += [source[at:edit.start], edit.content]
        at = edit.end
    pieces.append(source[at:])
    added.text = "".join(pieces)
    return added
