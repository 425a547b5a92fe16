"""The torch a project declares it supports, read from its root: ``[project] dependencies``
and ``optional-dependencies`` of ``pyproject.toml``, ``requirements*.txt`` (and the files
their ``-r`` lines include, inside the project), ``install_requires`` / ``extras_require`` of
``setup.cfg``, and the literal lists of ``setup.py``'s ``setup(...)`` call (read with Python's
``ast``; nothing is run). Every declaration counts, whatever its extra or environment marker.

An installed package (a package folder of a site-packages or ``pip install --target``
folder, which ``project_index`` takes for its own project) declares what its distribution
does: the ``Requires-Dist`` lines of the ``METADATA`` in the ``*.dist-info`` folder beside it
whose ``top_level.txt`` (or, without one, ``RECORD``) lists the package. Those that apply only
to an extra (``; extra == "all"``) are left out: a plain install does not bring them. The
files are read as text, never run.

The declarations are taken together, as the set of the releases any of them admits:

- the floor is the lowest release any declaration admits (``torch>=2.1`` and ``torch>=1.12``:
  1.12); a declaration without a lower bound (``torch``, ``torch<3``, a URL) names none;
- the ceiling is the highest any admits: of one declaration, its tightest upper bound
  (``torch<2.3,>=2.1``: below 2.3, ``torch==2.1.*``: below 2.2, ``torch~=2.1``: below 3,
  ``torch~=2.1.0``: below 2.2, ``torch<=2.2.1``: 2.2.1 at most); over several, the loosest,
  and none at all when one declaration has no upper bound (``torch``, ``torch>=2.1``, a URL):
  then every newer torch may be installed.

So a ceiling never claims less than every declaration admits: a project that declares
``torch<2.3`` in ``setup.py`` and a bare ``torch`` in ``requirements-dev.txt`` has none.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from .outline import walk

# Told of every file and folder a declaration is looked for in, before it is read (whether it
# exists or not): a process that keeps the answer between runs keeps it while none changes.
READ_HOOKS: list[Callable[[Path], None]] = []


def _looked_at(path: Path) -> Path:
    for hook in READ_HOOKS:
        hook(path)
    return path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class TorchRequirement:
    """The lowest and highest torch releases a project's declarations admit, and the
    declaration that sets the floor (without a floor: the one that sets the ceiling)."""
    floor: str | None  # "2.1": a release, without pre-release or local parts; None: no lower bound
    declared: str  # "torch>=2.1,<3" as written, without its marker
    source: str  # the file that declares it, relative to the project's root: "requirements/base.txt";
    # for an installed distribution's, "OpenNMT_py-3.5.1.dist-info/METADATA" (beside the root)
    ceiling: str | None = None  # "2.3": every admitted release lies below it; None: no upper bound
    ceiling_inclusive: bool = False  # `<=2.2.1`, `==2.2.1`: the ceiling itself is admitted too

    def admits_from(self, version: str) -> bool:
        """Whether some release the declarations admit is ``version`` (a release: "2.4") or
        newer; True without a ceiling."""
        return self.ceiling is None or _admits_from((_release(self.ceiling), self.ceiling_inclusive), version)


_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*")
_SPECIFIER = re.compile(r"\s*(===|~=|==|!=|<=|>=|<|>)\s*v?(\d+(?:\.\d+)*)(\.\*)?([^,]*)$")
_LOWER_BOUNDS = frozenset({"===", "~=", "==", ">=", ">"})  # `>2.2` admits 2.2.1: its floor is 2.2
# A version's part after its release: a pre-release or development one lies below the release
# (`<=2.4rc1` admits nothing of 2.4 itself), a post-release above it (`<2.4.post1` admits 2.4).
_BELOW_RELEASE = re.compile(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)(?![a-z])", re.IGNORECASE)
# (release, whether it is admitted itself): the highest a specifier admits
Ceiling = tuple[tuple[int, ...], bool]


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return parts


def _admits_from(ceiling: Ceiling, version: str) -> bool:
    release, inclusive = ceiling
    wanted = _release(version)
    return release > wanted or (release == wanted and inclusive)


def _upper_bound(operator: str, version: str, wildcard: bool, suffix: str) -> Ceiling | None:
    """The highest release one specifier admits (``<2.3``: below 2.3); None when it sets no
    upper bound (``>=``, ``>``, ``!=``)."""
    release = _release(version)
    below = _BELOW_RELEASE.match(suffix.strip()) is not None  # `2.4rc1` lies below 2.4
    if operator == "<":
        return release, bool(suffix.strip()) and not below  # `<2.4.post1` admits 2.4
    if operator in ("<=", "==", "==="):
        if wildcard:  # `==2.1.*`: below 2.2
            parts = tuple(int(p) for p in version.split("."))
            return _release(".".join(map(str, parts[:-1] + (parts[-1] + 1,)))), False
        return release, not below
    if operator == "~=":  # `~=2.1`: >=2.1, ==2.*; `~=2.1.0`: >=2.1.0, ==2.1.*
        parts = tuple(int(p) for p in version.split("."))
        if len(parts) < 2:
            return None  # not a valid specifier: no bound known
        return _release(".".join(map(str, parts[:-2] + (parts[-2] + 1,)))), False
    return None


def _bounds(requirement: str) -> tuple[str | None, Ceiling | None] | None:
    """The lowest torch release a PEP 508 requirement admits and the highest (``"torch>=2.1,<2.3"``
    -> ``("2.1", ((2, 3), False))``), each None where it sets no such bound; None for another
    package. The one parser of requirements here: ``floor_of`` and ``ceiling_of`` read it."""
    match = _NAME.match(requirement)
    if match is None or re.sub(r"[-_.]+", "-", match.group(1)).lower() != "torch":
        return None
    rest = requirement[match.end():].split(";", 1)[0].strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    floors, ceilings = [], []
    for specifier in rest.split(",") if rest else ():
        found = _SPECIFIER.match(specifier)
        if found is None or found.group(4).lstrip().startswith("!"):
            return None, None  # `torch @ https://...`, an epoch, or not a requirement at all
        operator, version, wildcard, suffix = found.groups()
        if operator in _LOWER_BOUNDS:
            floors.append(version)
        ceiling = _upper_bound(operator, version, wildcard is not None, suffix)
        if ceiling is not None:
            ceilings.append(ceiling)
    return max(floors, key=_release) if floors else None, min(ceilings) if ceilings else None


def floor_of(requirement: str) -> str | None:
    """The lowest torch release a PEP 508 requirement admits (``"torch>=2.1,<3"`` -> ``"2.1"``);
    None for another package, or a torch requirement without a lower bound."""
    bounds = _bounds(requirement)
    return None if bounds is None else bounds[0]


def ceiling_of(requirement: str) -> tuple[str, bool] | None:
    """The highest torch release a PEP 508 requirement admits, and whether it is admitted
    itself: ``"torch<2.3,>=2.1"`` -> ``("2.3", False)`` (below 2.3), ``"torch<=2.2.1"`` ->
    ``("2.2.1", True)``, ``"torch==2.1.*"`` -> ``("2.2", False)``; None for another package, or
    a torch requirement without an upper bound."""
    bounds = _bounds(requirement)
    if bounds is None or bounds[1] is None:
        return None
    release, inclusive = bounds[1]
    return ".".join(map(str, release)), inclusive


def _declared(text: str) -> str:
    declared = re.sub(r"\s+", "", text.split(";", 1)[0])
    return re.sub(r"^([^(]+)\((.*)\)$", r"\1\2", declared)  # METADATA's `torch (<2.3,>=2.1)`


def _from_pyproject(path: Path) -> list[str]:
    project = tomllib.loads(_looked_at(path).read_text(encoding="utf-8")).get("project")
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
    text = _looked_at(path).read_text(encoding="utf-8").replace("\\\n", "")
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        include = re.match(r"(?:-r|--requirement)(?:\s+|=|(?=\S))(\S+)", line)
        if include is not None:
            target = (path.parent / include.group(1)).resolve()
            if target not in seen and target.is_relative_to(root) and _looked_at(target).is_file():
                found += _from_requirements(target, root, seen)
        elif line and not line.startswith("-"):
            found.append((line, path))
    return found


def _from_setup_cfg(path: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(_looked_at(path).read_text(encoding="utf-8"))
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
    tree = ast.parse(_looked_at(path).read_text(encoding="utf-8"))
    assigned: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
            assigned[name] = statement.value if name not in assigned else ast.Constant(None)  # twice: unknown
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "setup":
            for keyword in node.keywords:
                if keyword.arg in ("install_requires", "extras_require"):
                    found += _literal_strings(keyword.value, assigned)
    return found


@lru_cache(maxsize=None)  # read once per run (``project_index.forget``): every project beside it asks
def top_level_names(dist_info: Path) -> frozenset[str]:
    """The top-level names an installed distribution holds: its ``top_level.txt``, else the
    first parts of the paths its ``RECORD`` lists (inside the folder it was installed to)."""
    top_level = _looked_at(dist_info / "top_level.txt")
    if top_level.is_file():
        return frozenset(line.strip().replace("\\", "/").split("/")[0]
                         for line in top_level.read_text(encoding="utf-8").splitlines() if line.strip())
    record = _looked_at(dist_info / "RECORD")
    if not record.is_file():
        return frozenset()
    names = set()
    for line in record.read_text(encoding="utf-8").splitlines():
        path = line.split(",", 1)[0].strip().strip('"')
        first = path.replace("\\", "/").split("/", 1)[0]
        if first and first not in ("..", ".") and not first.endswith((".dist-info", ".data")):
            names.add(first.removesuffix(".py"))
    return frozenset(names)


def _from_metadata(path: Path) -> list[str]:
    """The ``Requires-Dist`` requirements of a distribution's ``METADATA`` (its headers, up
    to the first empty line), but those that apply only to an extra."""
    found = []
    for line in _looked_at(path).read_text(encoding="utf-8").split("\n\n", 1)[0].splitlines():
        if line[:1].isspace():
            continue  # a continuation of a header, of a description say
        name, _, value = line.partition(":")
        if name.strip().lower() == "requires-dist" and value.strip():
            marker = value.split(";", 1)[1] if ";" in value else ""
            if not re.search(r"\bextra\s*==", marker):
                found.append(value.strip())
    return found


def distributions_holding(root: Path) -> list[Path]:
    """The ``.dist-info`` folders of the installed distributions beside the package folder
    ``root`` that hold it (none for a folder that is not a package)."""
    if not _looked_at(root / "__init__.py").is_file():
        return []
    found = []
    for dist_info in sorted(_looked_at(root.parent).glob("*.dist-info")):
        try:
            if root.name in top_level_names(dist_info):
                found.append(dist_info)
        except (OSError, UnicodeDecodeError):
            continue
    return found


def _distribution_of(root: Path) -> list[Path]:
    """The ``METADATA`` of the installed distributions that hold the package folder ``root``."""
    return [d / "METADATA" for d in distributions_holding(root) if _looked_at(d / "METADATA").is_file()]


def _declarations(root: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    _looked_at(root)  # its listing: a declaration file added or removed
    readers = (("pyproject.toml", _from_pyproject), ("setup.cfg", _from_setup_cfg), ("setup.py", _from_setup_py))
    for name, read in readers:
        path = root / name
        if path.is_file():
            try:
                found += [(r, path) for r in read(path)]
            except (OSError, UnicodeDecodeError, ValueError, SyntaxError, RecursionError,
                    configparser.Error, tomllib.TOMLDecodeError):
                continue  # a file that cannot be read declares nothing we can use
    for path in _distribution_of(root):
        try:
            found += [(r, path) for r in _from_metadata(path)]
        except (OSError, UnicodeDecodeError):
            continue
    seen: set[Path] = set()
    for path in sorted(root.glob("requirements*.txt")):
        if path.resolve() not in seen:
            try:
                found += _from_requirements(path.resolve(), root.resolve(), seen)
            except (OSError, UnicodeDecodeError):
                continue
    return found


def _source(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        pass
    try:
        return path.resolve().relative_to(root.resolve().parent).as_posix()  # a dist-info beside it
    except ValueError:
        return path.as_posix()


@lru_cache(maxsize=32)
def declared_torch(root: Path) -> TorchRequirement | None:
    """The torch releases the project at ``root`` declares it supports (see the module's
    docstring: the lowest any declaration admits, the highest any admits), or None when it
    declares neither a lower nor an upper bound for torch."""
    lowest = highest = None  # (bound, requirement, path)
    unbounded = False  # some declaration admits every newer torch
    for requirement, path in _declarations(root):
        bounds = _bounds(requirement)
        if bounds is None:
            continue
        floor, ceiling = bounds
        if floor is not None and (lowest is None or _release(floor) < _release(lowest[0])):
            lowest = (floor, requirement, path)
        if ceiling is None:
            unbounded = True
        elif highest is None or ceiling > highest[0]:
            highest = (ceiling, requirement, path)
    if lowest is None and (unbounded or highest is None):
        return None
    ceiling, inclusive = (None, False) if unbounded or highest is None else \
        (".".join(map(str, highest[0][0])), highest[0][1])
    _, requirement, path = lowest if lowest is not None else highest
    return TorchRequirement(lowest[0] if lowest is not None else None, _declared(requirement),
                            _source(path, root), ceiling, inclusive)
