"""What the command line does for a person at a terminal: colours and a progress bar. Both
switch themselves off when the output is not a terminal, so pipes and CI logs stay plain."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

# Runs shorter than this many steps finish before a bar would help.
PROGRESS_MIN_STEPS = {"files": 200, "steps": 3}
_WIDTH = 30
_REDRAW_SECONDS = 0.1


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def use_color(choice: str, stream: TextIO) -> bool:
    """``always``/``never`` as asked; ``auto``: a terminal, and no NO_COLOR (no-color.org)."""
    if choice != "auto":
        return choice == "always"
    return _isatty(stream) and not os.environ.get("NO_COLOR")


@contextmanager
def progress_bar(label: str, unit: str, stream: TextIO | None = None
                 ) -> Iterator[Callable[[int, int], None] | None]:
    """A callback ``(done, total)`` drawing a bar on stderr, or None when stderr is not a
    terminal. The bar is erased when the block ends."""
    stream = stream or sys.stderr
    if not _isatty(stream):
        yield None
        return
    drawn = [0.0, 0]  # last redraw time, width of what is on screen

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if total < PROGRESS_MIN_STEPS[unit] or (done < total and now - drawn[0] < _REDRAW_SECONDS):
            return
        filled = _WIDTH * done // max(total, 1)
        line = f"{label} [{'#' * filled}{'-' * (_WIDTH - filled)}] {done}/{total} {unit}"
        stream.write("\r" + line.ljust(drawn[1]))
        stream.flush()
        drawn[0], drawn[1] = now, len(line)

    try:
        yield update
    finally:
        if drawn[1]:
            stream.write("\r" + " " * drawn[1] + "\r")
            stream.flush()
