"""A document checked as `amplint check --stdin-filename PATH -` checks it: the same engine
entry (``check_buffer``), the configuration of the file's own project, the project's other
files read from disk. Called from one thread at a time (the engine's per-run state is the
process's)."""

from __future__ import annotations

import io
import tokenize
import traceback
from dataclasses import dataclass
from typing import Callable

from ..engine import config as config_mod
from ..engine.diagnostics import INTERNAL_ERROR, Diagnostic, Location
from ..engine.project import Options, check_buffer, collector_paused
from ..engine.runner import Abandoned, abandon_when
from ..engine.source import MAX_FILE_BYTES


@dataclass
class Checked:
    """A document's findings, and, when the check itself failed, why (for the client's log);
    none, ``abandoned``, for a check given up because its text was replaced."""

    diagnostics: list[Diagnostic]
    failure: str | None = None
    abandoned: bool = False


def _internal_error(name: str, message: str) -> Diagnostic:
    return Diagnostic(INTERNAL_ERROR[0], INTERNAL_ERROR[1], message, name, Location(1, 1), Location(1, 1))


def _failed(name: str, message: str, failure: str) -> Checked:
    return Checked([_internal_error(name, message)], failure)


def _encoded(text: str) -> bytes:
    """The bytes of the file the editor shows: in the encoding its coding cookie declares
    (the engine decodes them by it), UTF-8 without one. An unknown cookie gives UTF-8, which
    the engine then reports as it reports such a file."""
    head = "".join(text.splitlines(keepends=True)[:2]).encode("utf-8", errors="replace")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(head).readline)
    except SyntaxError:
        encoding = "utf-8"
    # The editor has taken a BOM off already; the engine reads the text the same without one.
    return text.encode("utf-8" if encoding == "utf-8-sig" else encoding)


def check(name: str, text: str, fix: bool = False,
          superseded: Callable[[], bool] = lambda: False) -> tuple[Checked, str | None]:
    """The findings of ``text`` shown as ``name`` (a path, or `-`), and with ``fix`` the text
    that `--fix` would hand back. A failure becomes an AMP999 finding on line 1. The check is
    given up between two rules once ``superseded()`` holds."""
    if len(text) > MAX_FILE_BYTES:  # no need to encode it to know: every character is a byte or more
        return _too_large(name), None
    try:
        data = _encoded(text)
    except UnicodeEncodeError as exc:
        message = f"cannot check {name}: its text cannot be encoded as {exc.encoding}: {exc.reason}"
        return _failed(name, message, message), None
    if len(data) > MAX_FILE_BYTES:
        return _too_large(name), None
    try:
        with collector_paused(), abandon_when(superseded):
            report = check_buffer(data, name, config_mod.Resolver(), Options(fix=fix, cache=False))
    except Abandoned:
        return Checked([], abandoned=True), None
    except config_mod.ConfigError as exc:
        return _failed(name, f"amplint configuration error: {exc}", str(exc)), None
    except Exception as exc:  # one document's failure must not take the server down
        return _failed(name, f"internal error while checking {name}: {type(exc).__name__}: {exc}",
                       traceback.format_exc()), None
    failure = "\n".join(d.detail or d.message for d in report.diagnostics if d.code == INTERNAL_ERROR[0])
    return Checked(report.diagnostics, failure or None), report.fixed_text if fix else None


def _too_large(name: str) -> Checked:
    # As the engine refuses such a file on disk (source.read_file).
    return Checked([_internal_error(name, f"cannot check {name}: larger than "
                                          f"{MAX_FILE_BYTES // (1024 * 1024)} MiB; not checked")])
