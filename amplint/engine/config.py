"""``[tool.amplint]`` in pyproject.toml: finding it, validating it, and selecting rules."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..policy import PolicyError, user_tables
from .rule import Rule, all_rules
from .diagnostics import INTERNAL_ERROR, SYNTAX_ERROR
from .project_index import DEFAULT_EXCLUDE

KNOWN_KEYS = {"select", "ignore", "extend-select", "exclude", "extend-exclude",
              "per-file-ignores", "device", "torch-version", "policies", "preview"}


class ConfigError(Exception):
    """A configuration mistake; the message names the file and the key or code."""


@dataclass
class Config:
    root: Path  # the folder of the pyproject.toml, or the current folder
    source: Path | None = None
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    extend_exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    device: str = "cuda"
    torch_version: str | None = None
    policies: str | None = None  # a project's own tables (absolute), merged over the committed ones
    # Rules, and paths of rules, whose triaged precision is still below the bar run only here.
    preview: bool = False

    def rules(self, select: list[str] | None = None, ignore: Iterable[str] = (),
              extend_select: Iterable[str] = ()) -> list[type[Rule]]:
        """Selected rules: the command line's --select replaces the file's, --ignore adds; without
        a select, the rules that are on by default."""
        chosen = select if select is not None else self.select
        extend = list(self.extend_select) + list(extend_select)
        ignored = set(self.ignore) | set(ignore)
        return [r for r in all_rules()
                if (self.preview or not r.preview)
                and ((r.on_by_default if chosen is None else _matches(r.code, chosen))
                    or _matches(r.code, extend))
                and not _matches(r.code, ignored)]

    def ignored_for(self, path: Path) -> set[str]:
        ignored: set[str] = set()
        if not self.per_file_ignores:
            return ignored
        rel = _relative(path, self.root)
        for pattern, codes in self.per_file_ignores.items():
            matches = _matcher((pattern,))
            if matches(rel) or matches(path.name):
                ignored.update(codes)
        return ignored

    def is_excluded(self, path: Path) -> bool:
        """Whether a pattern matches one of the path's parts, or the whole path (relative to
        the root), or a folder above it."""
        return self._excludes(_relative(path, self.root))

    def excluded_names(self, folder: Path, names: Iterable[str], real: str | None = None) -> set[str]:
        """Those of ``names`` whose ``folder / name`` ``is_excluded``: the folder's part of the
        question answered once (discovery asks it of every entry of every folder). ``real``:
        the folder with its symlinks resolved, where the caller knows it."""
        rel_folder = _relative_folder(str(folder) or ".", str(self.root), real)
        if rel_folder is None:  # outside the root: matched as given
            return {n for n in names if self.is_excluded(folder / n)}
        if rel_folder and self._excludes(rel_folder, whole=False):
            return set(names)
        part_matches = self._exclusion[0]
        return {n for n in names if part_matches(n)
                or self._excludes(f"{rel_folder}/{n}" if rel_folder else n, parts=False)}

    @property
    def _exclusion(self) -> tuple[Callable[[str], bool], Callable[[str], bool]]:
        return _exclusion(tuple(self.exclude + self.extend_exclude))

    def _excludes(self, rel: str, parts: bool = True, whole: bool = True) -> bool:
        part_matches, whole_matches = self._exclusion
        if parts and any(part_matches(part) for part in rel.split("/") if part not in ("", ".")):
            return True
        return whole and whole_matches(rel)


@lru_cache(maxsize=None)
def _exclusion(patterns: tuple[str, ...]) -> tuple[Callable[[str], bool], Callable[[str], bool]]:
    """For exclude patterns: whether a name matches one, and whether a relative path or a
    folder above it does."""
    return _matcher(patterns), _matcher(patterns + tuple(p.rstrip("/") + "/*" for p in patterns))


@lru_cache(maxsize=None)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """One compiled expression for ``fnmatch.fnmatch(name, p) for any p in patterns``:
    discovery asks it of every file and folder."""
    if not patterns:
        return lambda name: False
    match = re.compile("|".join(fnmatch.translate(os.path.normcase(p)) for p in patterns)).match
    return lambda name: match(os.path.normcase(name)) is not None


@lru_cache(maxsize=64)
def _resolved(folder: str) -> Path:
    return Path(folder).resolve()


@lru_cache(maxsize=4096)
def _relative_folder(folder: str, root: str, real: str | None = None) -> str | None:
    """``folder`` relative to ``root`` (``""`` for the root itself), symlinks resolved (or
    ``real``, the folder resolved), as a POSIX path; None when it lies outside."""
    try:
        rel = (Path(real) if real else Path(folder).resolve()).relative_to(_resolved(root)).as_posix()
    except ValueError:
        return None
    return "" if rel == "." else rel


def _relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root``, symlinked folders resolved (a file is matched where it
    appears, its folder once per folder), or as given when it lies outside. Strings, not
    paths: discovery asks it of every file."""
    if path.name in ("", ".", ".."):
        folder, name = str(path), ""
    else:
        folder, name = os.path.dirname(path) or ".", path.name
    rel = _relative_folder(folder, str(root))
    if rel is None:
        return path.as_posix()
    return f"{rel}/{name}" if rel and name else rel or name or "."


def _matches(code: str, selectors: Iterable[str]) -> bool:
    # "AMP" selects every rule, "AMP00" a range, "AMP002" one rule, as in ruff.
    return any(code.startswith(s) for s in selectors)


def validate_codes(codes: Iterable[str], where: str) -> list[str]:
    known = [r.code for r in all_rules()]
    out = []
    for code in codes:
        code = code.strip().upper()
        if not code:
            continue
        engine = {SYNTAX_ERROR[0]: SYNTAX_ERROR[1], INTERNAL_ERROR[0]: INTERNAL_ERROR[1]}
        if code in engine:
            raise ConfigError(f"{where}: {code} ({engine[code]}) is the engine's, not a rule's: it is always "
                              "reported; leave the file out with `extend-exclude` instead")
        if code != "ALL" and not any(k.startswith(code) for k in known):
            raise ConfigError(f"{where}: unknown rule code {code!r} (known: {', '.join(known)})")
        out.append("AMP" if code == "ALL" else code)
    return out


def _amplint_table(path: Path) -> object | None:
    """The ``[tool.amplint]`` value of a TOML file (None when it has none)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read TOML: {getattr(exc, 'strerror', None) or exc}") from None
    tool = data.get("tool", {})
    return tool.get("amplint") if isinstance(tool, dict) else None


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml with a [tool.amplint] table, looking upward from ``start``."""
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else [*start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _amplint_table(candidate) is not None:
            return candidate
    return None


def load(start: Path) -> Config:
    pyproject = find_pyproject(start)
    if pyproject is None:
        return Config(root=Path.cwd())
    return _from_table(_amplint_table(pyproject), pyproject, pyproject.parent)


def load_file(path: Path) -> Config:
    """``--config PATH``: that file's ``[tool.amplint]`` for every file checked. As ruff does
    with its ``--config``, relative patterns (exclude, per-file-ignores) and the cache are
    then anchored at the current folder, not at the file's."""
    if not path.exists():
        raise ConfigError(f"--config {path}: no such file")
    if not path.is_file():
        raise ConfigError(f"--config {path}: not a file")
    data = _amplint_table(path)
    if data is None:
        raise ConfigError(f"--config {path}: has no [tool.amplint] table")
    return _from_table(data, path, Path.cwd())


def _from_table(data: object, pyproject: Path, root: Path) -> Config:
    where = f"{pyproject} [tool.amplint]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KNOWN_KEYS))})")
    config = Config(root=root, source=pyproject)

    def str_list(key: str) -> list[str]:
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: {key!r} must be a list of strings")
        return value

    if "select" in data:
        config.select = validate_codes(str_list("select"), f"{where} select")
    if "ignore" in data:
        config.ignore = validate_codes(str_list("ignore"), f"{where} ignore")
    if "extend-select" in data:
        config.extend_select = validate_codes(str_list("extend-select"), f"{where} extend-select")
    if "exclude" in data:
        config.exclude = str_list("exclude")
    if "extend-exclude" in data:
        config.extend_exclude = str_list("extend-exclude")
    if "per-file-ignores" in data:
        pfi = data["per-file-ignores"]
        if not isinstance(pfi, dict):
            raise ConfigError(f"{where}: 'per-file-ignores' must be a table of pattern = [codes]")
        for pattern, codes in pfi.items():
            if not isinstance(codes, list):
                raise ConfigError(f"{where}: per-file-ignores {pattern!r} must be a list of codes")
            config.per_file_ignores[pattern] = validate_codes(codes, f"{where} per-file-ignores {pattern!r}")
    for key, attr in (("device", "device"), ("torch-version", "torch_version")):
        if key in data:
            if not isinstance(data[key], str):
                raise ConfigError(f"{where}: {key!r} must be a string")
            setattr(config, attr, data[key])
    if "preview" in data:
        if not isinstance(data["preview"], bool):
            raise ConfigError(f"{where}: 'preview' must be true or false")
        config.preview = data["preview"]
    if "policies" in data:
        if not isinstance(data["policies"], str) or not data["policies"]:
            raise ConfigError(f"{where}: 'policies' must be a folder's path (a string)")
        # Relative to the pyproject.toml that names it (with --config too).
        folder = os.path.normpath(os.path.join(os.path.abspath(pyproject.parent), data["policies"]))
        try:
            user_tables(folder)
        except PolicyError as exc:
            raise ConfigError(f"{where}: policies {data['policies']!r}: {exc}") from None
        config.policies = folder
    return config


@dataclass
class Overrides:
    """The command line's settings, laid over every file's configuration: ``select`` replaces
    the file's, ``ignore`` and ``extend_select`` add to it; ``exclude`` replaces the file's
    exclude list (defaults included), ``extend_exclude`` adds to its own. The patterns match
    as the configuration's do, a path in them (`vision/train.py`) read from the current
    folder, where it was typed, whichever project's root the file has."""

    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    exclude: list[str] | None = None
    extend_exclude: list[str] = field(default_factory=list)
    preview: bool | None = None  # --preview / --no-preview: replaces the file's

    def apply(self, config: Config) -> Config:
        if self.preview is not None and self.preview != config.preview:
            config = dataclasses.replace(config, preview=self.preview)
        if self.exclude is None and not self.extend_exclude:
            return config
        exclude = config.exclude if self.exclude is None else _anchored(self.exclude, config.root)
        return dataclasses.replace(config, exclude=list(exclude), extend_exclude=[
            *config.extend_exclude, *_anchored(self.extend_exclude, config.root)])


def _anchored(patterns: list[str], root: Path) -> list[str]:
    """Patterns typed relative to the current folder, relative to ``root`` instead. A name
    (no slash) or a pattern that starts with a wildcard matches anywhere and stays as it is;
    a path outside ``root`` can match nothing under it and is dropped."""
    here, root_path = os.path.realpath(os.getcwd()), os.path.realpath(root)
    out = []
    for pattern in patterns:
        first = pattern.split("/", 1)[0]
        if "/" not in pattern.rstrip("/") or any(ch in first for ch in "*?[") or here == root_path:
            out.append(pattern)
            continue
        relative = os.path.relpath(os.path.join(here, pattern), root_path)
        if relative == ".":
            out.append("*")
        elif relative != ".." and not relative.startswith(".." + os.sep):
            out.append(Path(relative).as_posix() + "/" * pattern.endswith("/"))
    return out


class Resolver:
    """Which configuration each file gets, as ruff resolves it: the nearest pyproject.toml
    with a ``[tool.amplint]`` table above the file (so a project nested in another, checked
    in the same run, keeps its own settings), or the defaults rooted at the current folder;
    or, given ``fixed`` (``--config``), that one configuration for every file. The command
    line's ``overrides`` apply on top of each. Each folder is looked up once."""

    def __init__(self, fixed: Config | None = None, overrides: Overrides | None = None,
                 rules: list[type[Rule]] | None = None):
        self.overrides = overrides or Overrides()
        self.fixed = None if fixed is None else self.overrides.apply(fixed)
        self._given_rules = rules  # a caller's own selection, for every configuration
        self._default: Config | None = None
        self._by_folder: dict[str, Config] = {}
        self._by_given_folder: dict[str, Config] = {}
        self._by_resolved: dict[Path, Config] = {}
        self._rules: dict[int, list[type[Rule]]] = {}

    def for_folder(self, folder: Path, real: str | None = None) -> Config:
        """The configuration of the files in ``folder`` (``real``: with its symlinks resolved,
        where the caller knows it)."""
        if self.fixed is not None:
            return self.fixed
        key = os.path.abspath(folder)
        config = self._by_folder.get(key)
        if config is None:
            config = self._by_folder[key] = self._nearest(Path(real) if real else Path(key).resolve())
        return config

    def for_file(self, path: Path) -> Config:
        folder = os.path.dirname(path)  # as given: asked of every file, answered once per folder
        config = self._by_given_folder.get(folder)
        if config is None:
            config = self._by_given_folder[folder] = self.for_folder(Path(os.path.abspath(path)).parent)
        return config

    def _nearest(self, folder: Path) -> Config:
        passed = []
        for candidate in [folder, *folder.parents]:
            config = self._by_resolved.get(candidate)
            if config is not None:
                break
            passed.append(candidate)
            pyproject = candidate / "pyproject.toml"
            try:
                present = pyproject.is_file()
            except OSError:  # a folder that cannot be looked into holds no configuration we can use
                present = False
            if present:
                data = _amplint_table(pyproject)
                if data is not None:
                    config = self.overrides.apply(_from_table(data, pyproject, pyproject.parent))
                    break
        else:
            if self._default is None:
                self._default = self.overrides.apply(Config(root=Path.cwd()))
            config = self._default
        for candidate in passed:
            self._by_resolved[candidate] = config
        return config

    def rules_for(self, config: Config) -> list[type[Rule]]:
        """The rules selected for files under ``config``, the command line's selection on top."""
        if self._given_rules is not None:
            return self._given_rules
        rules = self._rules.get(id(config))
        if rules is None:
            o = self.overrides
            rules = self._rules[id(config)] = config.rules(select=o.select, ignore=o.ignore,
                                                           extend_select=o.extend_select)
        return rules
