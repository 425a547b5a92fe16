"""Reading and writing Python source exactly as it was: encoding, BOM, line endings, mode."""

from __future__ import annotations

import codecs
import io
import os
import re
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message says why."""


@dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return codecs.BOM_UTF8 + data if self.bom else data


_LINE_END = re.compile(r"\r\n|\r|\n")


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """Lines as Python and libcst count them: only \\r\\n, \\r and \\n end one.
    (``str.splitlines`` also splits at form feeds and other separators, which would shift
    every line number after them.)"""
    lines, start = [], 0
    for end in _LINE_END.finditer(text):
        lines.append(text[start:end.end() if keepends else end.start()])
        start = end.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


# Larger files are not Python anyone wrote by hand; reading one must not exhaust memory.
MAX_FILE_BYTES = 64 * 1024 * 1024

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def read_file(path: Path) -> bytes:
    """A regular file's bytes, at most ``MAX_FILE_BYTES`` of them. Anything else (a FIFO, which
    would block forever; a device such as /dev/zero, which never ends) is refused with a
    SourceError saying what it is, before a byte is read; opening does not block either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "something else")
            raise SourceError(f"not a regular file ({kind}); only regular files are read")
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise SourceError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; not read")
    return data


def decode(data: bytes) -> SourceText:
    if b"\x00" in data:
        raise SourceError("binary file (contains NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise SourceError(f"cannot determine encoding: {exc}") from None
    bom = encoding == "utf-8-sig"
    if bom:
        encoding, data = "utf-8", data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot decode as {encoding}: {exc}") from None
    return SourceText(text, encoding, bom)


class ChangedOnDisk(OSError):
    """The file no longer holds what was checked: someone else wrote it meanwhile."""


def write_atomically(path: Path, data: bytes, expected: bytes | None = None) -> None:
    """Replace ``path`` in one step, keeping its permission bits; a reader never sees half a file.
    A file without write permission is left alone (renaming over it would succeed). A symlink
    stays a symlink: the file it points to is the one replaced. With ``expected``, the file
    is replaced only if it still holds exactly that (or already holds ``data``)."""
    path = Path(os.path.realpath(path))
    mode = path.stat().st_mode
    if not mode & stat.S_IWUSR:
        raise PermissionError(f"{path} is read-only")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".amplint")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode & 0o7777)
        if expected is not None:
            current = path.read_bytes()
            if current == data:  # another run wrote the same fixes first
                os.unlink(tmp)
                return
            if current != expected:
                raise ChangedOnDisk(f"{path} changed on disk while amplint ran; fixes not written")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
