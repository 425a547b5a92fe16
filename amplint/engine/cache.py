"""Per-file results, keyed by everything that decides them, in .amplint_cache/ at the project
root. Entries are written atomically, so concurrent runs are safe; an entry that does not
load is ignored (and rewritten), never trusted. A result computed from summaries of the
project's other files (``project_index.Dependency``) records their digests, and stands only
while each summary, read again, still has its digest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from .. import __version__
from ..policy import policy_dir
from .diagnostics import Diagnostic, Edit, Fix, Location, Related
from .project_index import Dependency, dependency, relative_name
from . import summaries  # noqa: F401 - computes the `summary:` dependencies a cached result may hold
from .source import write_entry

DIRNAME = ".amplint_cache"


def _digest(paths) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _tables_digest() -> str:
    return _digest(policy_dir().rglob("*.json"))


def _linter_digest() -> str:
    """The linter's own code: a rule fixed between two installs of the same version (a
    pre-commit rev, an editable checkout) must not answer from the old rule's entries."""
    package = Path(__file__).resolve().parent.parent
    return _digest([*package.glob("*.py"), *(package / "engine").glob("*.py"), *(package / "rules").glob("*.py")])


class Cache:
    def __init__(self, root: Path, rule_codes: list[str], settings: dict):
        self.folder = root / DIRNAME / __version__
        self.linter = _linter_digest()
        salt = json.dumps({"rules": sorted(rule_codes), "settings": settings,
                           "tables": _tables_digest(), "linter": self.linter}, sort_keys=True)
        self.salt = hashlib.sha256(salt.encode()).hexdigest()

    def _path(self, data: bytes, rule_codes: list[str]) -> Path:
        key = hashlib.sha256(self.salt.encode() + ",".join(rule_codes).encode() + b"\0" + data).hexdigest()
        return self.folder / key[:2] / f"{key}.json"

    def get(self, data: bytes, rule_codes: list[str], display: str) -> list[Diagnostic] | None:
        """The findings stored for this content, or None: none stored, or computed from a
        summary of other files that has changed since."""
        try:
            raw = json.loads(self._path(data, rule_codes).read_text(encoding="utf-8"))
            read = [Dependency(*d) for d in raw["dependencies"]]
            if any(dependency(d.kind, Path(d.root)) != d for d in read):
                return None
            return [_load(d, display) for d in raw["diagnostics"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, data: bytes, rule_codes: list[str], diagnostics: list[Diagnostic],
            dependencies: set[Dependency]) -> None:
        # Like .ruff_cache: the folder keeps itself out of version control.
        ignore = self.folder.parent / ".gitignore"
        try:
            if not ignore.exists():
                ignore.parent.mkdir(parents=True, exist_ok=True)
                ignore.write_text("*\n", encoding="utf-8")
        except OSError:
            pass  # a cache that cannot be written only costs speed
        write_entry(self._path(data, rule_codes),
                    {"diagnostics": [_dump(d) for d in diagnostics],
                     "dependencies": [[d.kind, d.root, d.digest] for d in sorted(dependencies)]})


def _dump(d: Diagnostic) -> dict:
    out = asdict(d)
    out.pop("path")  # the same content may live under another name
    # Other files are shown relative to the current folder, which another run may not share.
    out["related"] = [{**r, "path": os.path.abspath(r["path"])} for r in out["related"]]
    return out


def _shown(path: str) -> str:
    """An absolute path as findings show it: relative to the current folder where it lies below it."""
    return relative_name(Path(path), Path.cwd())


def _load(raw: dict, display: str) -> Diagnostic:
    fix = raw["fix"]
    if fix is not None:
        fix = Fix(fix["message"], tuple(Edit(**e) for e in fix["edits"]), fix["applicability"], fix["group"])
    return Diagnostic(
        code=raw["code"], name=raw["name"], message=raw["message"], path=display,
        location=Location(**raw["location"]), end_location=Location(**raw["end_location"]),
        fix=fix, url=raw["url"], detail=raw["detail"],
        edit_locations=[(Location(**a), Location(**b), c) for a, b, c in raw["edit_locations"]],
        related=tuple(Related(_shown(r["path"]), r["row"], r["message"]) for r in raw["related"]))


def clean(root: Path) -> bool:
    folder = root / DIRNAME
    if folder.is_dir():
        shutil.rmtree(folder)
        return True
    return False
