"""Which files to check: .py files under the given paths, minus exclusions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from .config import Config


class PathError(Exception):
    """A path given on the command line that does not exist."""


def python_files(paths: list[Path], config: Config) -> Iterator[Path]:
    """Folders are walked (excluded folders pruned, symlinked folders not followed); a file
    named explicitly is always checked. Each file is yielded once, in a stable order."""
    seen: set[Path] = set()
    for path in paths:
        if not path.exists() and not path.is_symlink():
            raise PathError(f"{path}: no such file or directory")
    for path in paths:
        if path.is_dir():
            found = []
            for folder, dirs, files in os.walk(path):
                here = Path(folder)
                dirs[:] = sorted(d for d in dirs if not config.is_excluded(here / d))
                found.extend(here / f for f in files
                             if f.endswith((".py", ".pyi")) and not config.is_excluded(here / f))
            candidates = sorted(found)
        else:
            candidates = [path]
        for candidate in candidates:
            key = Path(os.path.normpath(candidate))
            if key not in seen:
                seen.add(key)
                yield candidate
