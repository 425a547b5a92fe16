"""Which files to check: .py files under the given paths, minus exclusions."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

from .config import Config, Resolver


class PathError(Exception):
    """A path given on the command line that does not exist or cannot be looked at."""


# git runs commands a repository's own configuration names: core.fsmonitor when it reads the
# index, hooks (post-index-change) if it writes one, a pager. Each is switched off on git's
# command line, which overrides every configuration file, so checking an untrusted checkout
# runs nothing of its own. (check-ignore runs no filters, diff or merge drivers, or helpers.)
SAFE_GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "--no-pager"]


def _ignored_by_git(folder: Path, files: list[Path]) -> set[Path]:
    """The files git ignores (.gitignore files, .git/info/exclude, the global excludes), asked
    of git itself; none outside a git work tree or without git, and none when the folder
    itself is ignored: a folder named on the command line is checked, as ruff does. Names go
    to git and come back as bytes: a file name need not be valid UTF-8."""
    if not files:
        return set()
    listing = b"".join(os.fsencode(os.path.abspath(f)) + b"\0" for f in [folder, *files])
    try:
        answer = subprocess.run([*SAFE_GIT, "check-ignore", "-z", "--stdin"], cwd=folder, input=listing,
                                capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    if answer.returncode not in (0, 1):  # 1: nothing ignored; 128: not a repository
        return set()
    ignored = {os.fsdecode(p) for p in answer.stdout.split(b"\0") if p}
    if not ignored or os.path.abspath(folder) in ignored:
        return set()
    return {f for f in files if os.path.abspath(f) in ignored}


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise PathError(f"{path}: cannot access: {exc.strerror or exc}") from None
    return True


def python_files(paths: list[Path], config: Config | Resolver, unreadable: list[tuple[Path, str]] | None = None,
                 force_exclude: bool = False, real_folders: dict[str, str] | None = None) -> Iterator[Path]:
    """Folders are walked (excluded folders pruned, symlinked folders not followed, files git
    ignores left out); a file named explicitly is always checked, unless ``force_exclude``
    and the configuration excludes it (pre-commit names every file). Each file is yielded
    once, in a stable order. Folders that cannot be listed go to ``unreadable`` with the reason.
    With a ``Resolver``, what a folder holds is excluded by the configuration of that folder
    (a nested project's own ``exclude``, relative to its own root). ``real_folders`` is given
    each walked folder (as its files' paths name it) with its symlinks resolved."""
    config_of = config.for_folder if isinstance(config, Resolver) else lambda folder, real=None: config
    seen: set[str] = set()
    for path in paths:
        if not _exists(path):
            raise PathError(f"{path}: no such file or directory")

    def on_error(exc: OSError) -> None:
        if unreadable is not None:
            unreadable.append((Path(exc.filename), f"cannot list folder: {exc.strerror or exc}"))

    for path in paths:
        if force_exclude and config_of(Path(os.path.abspath(path)).parent).is_excluded(path):
            continue
        if path.is_dir():
            found = []
            top, real_top = os.fspath(path), os.path.realpath(path)
            for folder, dirs, files in os.walk(path, onerror=on_error):
                here = Path(folder)
                # os.walk enters no symlinked folder: below the top, a folder resolves to the
                # resolved top and the rest of its path (no system call per folder).
                real = real_top + folder[len(top):]
                if real_folders is not None:
                    real_folders[str(here)] = real
                settings = config_of(here, real)
                excluded = settings.excluded_names(here, dirs, real)
                dirs[:] = sorted(d for d in dirs if d not in excluded)
                wanted = [f for f in files if f.endswith((".py", ".pyi", ".ipynb"))]
                excluded = settings.excluded_names(here, wanted, real)
                found.extend(here / f for f in wanted if f not in excluded)
            ignored = _ignored_by_git(path, found)
            candidates = sorted(f for f in found if f not in ignored)
        else:
            candidates = [path]
        for candidate in candidates:
            key = os.path.normpath(candidate)
            if key not in seen:
                seen.add(key)
                yield candidate
