"""Reading and writing Python source exactly as it was: encoding, BOM, line endings, mode."""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import json
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
    """Lines as Python counts them: only \\r\\n, \\r and \\n end one.
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
    with os.fdopen(fd, "rb", buffering=0) as handle:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            kind = next((name for test, name in _KINDS if test(status.st_mode)), "something else")
            raise SourceError(f"not a regular file ({kind}); only regular files are read")
        # Reads sized from the file: one of MAX_FILE_BYTES + 1 allocates that much for each file.
        data = handle.read(min(status.st_size, MAX_FILE_BYTES) + 1)
        while len(data) <= MAX_FILE_BYTES:  # until the end: it may have grown since
            more = handle.read(min(MAX_FILE_BYTES + 1 - len(data), 1 << 16))
            if not more:
                break
            data += more
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


def write_entry(path: Path, value: object) -> None:
    """A cache entry: ``value`` as JSON, written atomically (a reader sees the old entry, the new
    one or none; concurrent runs may write the same entry), its folder made if need be. An entry
    that cannot be written only costs speed: nothing is raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(value, handle)
        os.replace(tmp, path)
    except OSError:
        pass


def write_atomically(path: Path, data: bytes, expected: bytes | None = None) -> None:
    """Write ``data`` to ``path``, keeping its permission bits; a file without write permission
    is left alone (renaming over it would succeed). A symlink stays a symlink: the file it
    points to is the one written. With ``expected``, the file is written only if it still holds
    exactly that (or already holds ``data``); otherwise ChangedOnDisk, and nothing is written.

    A file with one name is replaced in one step (a new file, flushed to disk, renamed over
    it): a reader never sees half a file. A file with more names (hard links) is written in
    place instead, as ruff does, so that every name still shows one file, fixed: see
    ``_write_in_place``."""
    path = Path(os.path.realpath(path))
    before = path.stat()
    mode = before.st_mode
    if not mode & stat.S_IWUSR:
        raise PermissionError(f"{path} is read-only")
    if before.st_nlink > 1:
        _write_in_place(path, data, expected, before)
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".amplint")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
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


def _write_in_place(path: Path, data: bytes, expected: bytes | None, before: os.stat_result) -> None:
    """Overwrite a hard-linked file through its own inode (a rename would give this name a new
    file and leave the other names with the old text). The file opened must be the one looked
    at, a regular file, holding ``expected``; room for the new text is reserved before a byte
    changes (running out of space then leaves the file as it was); the whole text is written,
    the file cut to its length and flushed to disk before this returns. Should writing fail
    midway, the old text is put back. Owner, mode and every other name are untouched."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            raise ChangedOnDisk(f"{path} changed on disk while amplint ran; fixes not written")
        current = _read_all(fd)
        if expected is not None:
            if current == data:  # another run wrote the same fixes first
                return
            if current != expected:
                raise ChangedOnDisk(f"{path} changed on disk while amplint ran; fixes not written")
        if len(data) > len(current) and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, len(data))
            except OSError as exc:  # ENOSPC, EFBIG: nothing written yet
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
        try:
            _write_all(fd, data)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # what was there, in the blocks it had
                _write_all(fd, current)
                os.ftruncate(fd, len(current))
                os.fsync(fd)
            raise
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if not written:
            raise OSError(errno.ENOSPC, "no room to write")
        view = view[written:]
