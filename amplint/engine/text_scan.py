"""Reading code from a place in its text, for the prefilter's text tests (``rule.TextTest``):
what stands before a call or a literal, what a call is given, without parsing the file.

Text is not a syntax tree: a string or a comment may hold anything. So each reading stops
with None where one could mislead it (a quote or a `#` in the way), and the caller then
answers as if the file might fire.
"""

from __future__ import annotations

_SPACE = " \t\n\r\f\\"
_LIMIT = 5000  # characters read for a bracket, at most


def space_before(text: str, end: int) -> int | None:
    """Where the space (line breaks included) that ends at ``end`` starts; None when it
    crosses the end of a line that holds a `#` (a comment may hide code between)."""
    while end > 0 and text[end - 1] in _SPACE:
        end -= 1
        if text[end] == "\n" and "#" in text[text.rfind("\n", 0, end) + 1:end]:
            return None
    return end


def word_before(text: str, end: int) -> int:
    """Where the name (or number) that ends at ``end`` starts."""
    start = end
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return start


def enclosing_bracket(text: str, at: int) -> int | None:
    """The innermost bracket still open at ``at``; -1 when none is, None when a quote or a
    `#` is in the way, or the bracket is too far back."""
    depth = 0
    for place in range(at - 1, max(-1, at - 1 - _LIMIT), -1):
        char = text[place]
        if char in "\"'#":
            return None
        if char in ")]}":
            depth += 1
        elif char in "([{":
            if depth == 0:
                return place
            depth -= 1
    return -1 if at - 1 < _LIMIT else None


def call_arguments(text: str, opening: int) -> list[str] | None:
    """The arguments of the call whose `(` is at ``opening``, as text, split at its own
    commas; None when a quote or a `#` inside could mislead the reading, or the call is too
    long."""
    arguments, depth, start = [], 0, opening + 1
    for place in range(opening + 1, min(len(text), opening + _LIMIT)):
        char = text[place]
        if char in "\"'#":
            return None
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                last = text[start:place]
                return arguments + [last] if last.strip() else arguments
            depth -= 1
        elif char == "," and depth == 0:
            arguments.append(text[start:place])
            start = place + 1
    return None
