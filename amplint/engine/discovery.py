"""Which files to check: .py files under the given paths, minus exclusions."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

from .config import Config


class PathError(Exception):
    """A path given on the command line that does not exist."""


def _ignored_by_git(folder: Path, files: list[Path]) -> set[Path]:
    """The files git ignores (.gitignore files, .git/info/exclude, the global excludes), asked
    of git itself; none outside a git work tree or without git, and none when the folder
    itself is ignored: a folder named on the command line is checked, as ruff does."""
    if not files:
        return set()
    listing = "".join(os.path.abspath(f) + "\0" for f in [folder, *files])
    try:
        answer = subprocess.run(["git", "check-ignore", "-z", "--stdin"], cwd=folder, input=listing.encode(),
                                capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    if answer.returncode not in (0, 1):  # 1: nothing ignored; 128: not a repository
        return set()
    ignored = {Path(p) for p in answer.stdout.decode(errors="surrogateescape").split("\0") if p}
    if Path(os.path.abspath(folder)) in ignored:
        return set()
    return {f for f in files if Path(os.path.abspath(f)) in ignored}


def python_files(paths: list[Path], config: Config) -> Iterator[Path]:
    """Folders are walked (excluded folders pruned, symlinked folders not followed, files git
    ignores left out); a file named explicitly is always checked. Each file is yielded once,
    in a stable order."""
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
            ignored = _ignored_by_git(path, found)
            candidates = sorted(f for f in found if f not in ignored)
        else:
            candidates = [path]
        for candidate in candidates:
            key = Path(os.path.normpath(candidate))
            if key not in seen:
                seen.add(key)
                yield candidate
