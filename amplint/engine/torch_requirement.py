"""The torch a project declares it supports, read from its root: ``[project] dependencies``
and ``optional-dependencies`` of ``pyproject.toml``, ``requirements*.txt`` (and the files
their ``-r`` lines include, inside the project), ``install_requires`` / ``extras_require`` of
``setup.cfg``, and the literal lists of ``setup.py``'s ``setup(...)`` call (read with Python's
``ast``; nothing is run). Every declaration counts, whatever its extra or environment marker:
the project supports the lowest version any of them admits. A declaration without a lower
bound (``torch``, ``torch<3``, a URL) admits no particular version and is left out.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class TorchRequirement:
    """The lowest torch version a project's declarations admit, and the one that admits it."""
    floor: str  # "2.1": a release, without pre-release or local parts
    declared: str  # "torch>=2.1,<3" as written, without its marker
    source: str  # the file that declares it, relative to the project's root: "requirements/base.txt"


_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*")
_SPECIFIER = re.compile(r"\s*(===|~=|==|!=|<=|>=|<|>)\s*v?(\d+(?:\.\d+)*)(\.\*)?[^,]*$")
_LOWER_BOUNDS = frozenset({"===", "~=", "==", ">=", ">"})  # `>2.2` admits 2.2.1: its floor is 2.2


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return parts


def floor_of(requirement: str) -> str | None:
    """The lowest torch release a PEP 508 requirement admits (``"torch>=2.1,<3"`` -> ``"2.1"``);
    None for another package, or a torch requirement without a lower bound."""
    match = _NAME.match(requirement)
    if match is None or re.sub(r"[-_.]+", "-", match.group(1)).lower() != "torch":
        return None
    rest = requirement[match.end():].split(";", 1)[0].strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    floors = []
    for specifier in rest.split(",") if rest else ():
        found = _SPECIFIER.match(specifier)
        if found is None:
            return None  # `torch @ https://...`, or not a requirement at all
        if found.group(1) in _LOWER_BOUNDS:
            floors.append(found.group(2))
    return max(floors, key=_release) if floors else None


def _declared(text: str) -> str:
    return re.sub(r"\s+", "", text.split(";", 1)[0])


def _from_pyproject(path: Path) -> list[str]:
    project = tomllib.loads(path.read_text(encoding="utf-8")).get("project")
    if not isinstance(project, dict):
        return []
    found = list(project.get("dependencies") or [])
    optional = project.get("optional-dependencies") or {}
    for group in optional.values() if isinstance(optional, dict) else ():
        found += group if isinstance(group, list) else []
    return [r for r in found if isinstance(r, str)]


def _from_requirements(path: Path, root: Path, seen: set[Path]) -> list[tuple[str, Path]]:
    """The requirements of a requirements file and of the files its ``-r`` lines include
    (those inside ``root``, each once): (requirement, the file that holds it)."""
    seen.add(path)
    found = []
    text = path.read_text(encoding="utf-8").replace("\\\n", "")
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        include = re.match(r"(?:-r|--requirement)(?:\s+|=|(?=\S))(\S+)", line)
        if include is not None:
            target = (path.parent / include.group(1)).resolve()
            if target not in seen and target.is_relative_to(root) and target.is_file():
                found += _from_requirements(target, root, seen)
        elif line and not line.startswith("-"):
            found.append((line, path))
    return found


def _from_setup_cfg(path: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text(encoding="utf-8"))
    values = []
    if parser.has_option("options", "install_requires"):
        values.append(parser.get("options", "install_requires"))
    if parser.has_section("options.extras_require"):
        values += [value for _, value in parser.items("options.extras_require")]
    return [line.strip() for value in values for line in value.splitlines() if line.strip()]


def _literal_strings(node: ast.expr, assigned: dict[str, ast.expr]) -> list[str]:
    """The strings of a literal list, tuple or dict of lists (a module-level name assigned
    once stands for its value); none for anything computed."""
    if isinstance(node, ast.Name) and node.id in assigned:
        node = assigned[node.id]
    if isinstance(node, ast.Dict):
        return [s for value in node.values for s in _literal_strings(value, assigned)]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _from_setup_py(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assigned: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
            assigned[name] = statement.value if name not in assigned else ast.Constant(None)  # twice: unknown
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "setup":
            for keyword in node.keywords:
                if keyword.arg in ("install_requires", "extras_require"):
                    found += _literal_strings(keyword.value, assigned)
    return found


def _declarations(root: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    readers = (("pyproject.toml", _from_pyproject), ("setup.cfg", _from_setup_cfg), ("setup.py", _from_setup_py))
    for name, read in readers:
        path = root / name
        if path.is_file():
            try:
                found += [(r, path) for r in read(path)]
            except (OSError, UnicodeDecodeError, ValueError, SyntaxError, RecursionError,
                    configparser.Error, tomllib.TOMLDecodeError):
                continue  # a file that cannot be read declares nothing we can use
    seen: set[Path] = set()
    for path in sorted(root.glob("requirements*.txt")):
        if path.resolve() not in seen:
            try:
                found += _from_requirements(path.resolve(), root.resolve(), seen)
            except (OSError, UnicodeDecodeError):
                continue
    return found


@lru_cache(maxsize=32)
def declared_torch(root: Path) -> TorchRequirement | None:
    """The lowest torch release the project at ``root`` declares it supports, or None when it
    declares no lower bound for torch."""
    lowest = None
    for requirement, path in _declarations(root):
        floor = floor_of(requirement)
        if floor is not None and (lowest is None or _release(floor) < _release(lowest.floor)):
            try:
                source = path.resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                source = path.as_posix()
            lowest = TorchRequirement(floor, _declared(requirement), source)
    return lowest
