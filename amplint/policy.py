"""The linter's only view of the probe: the JSON tables in policies/, and a project's own
(``[tool.amplint] policies``), merged over them. No torch here."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Callable


class PolicyError(Exception):
    """No table for the configured device or torch version; the message lists what exists."""


def policy_dir() -> Path:
    """Tables ship inside the wheel as amplint/_policies; a source checkout reads policies/."""
    packaged = Path(__file__).parent / "_policies"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "policies"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def available_versions() -> list[str]:
    root = policy_dir()
    found = [p.name.removeprefix("torch-") for p in root.glob("torch-*") if p.is_dir()]
    return sorted(found, key=_version_key)


class PolicyTable:
    """One device's table: what autocast does to each op, and which Python calls reach it."""

    def __init__(self, data: dict):
        self.data = data
        self.device: str = data["device"]
        self.dtype: str = data["dtype"]
        self.default_dtype: str = data["default_dtype"]
        self.supported_dtypes: list[str] = data["supported_dtypes"]
        self.torch_version: str = data["torch_version"]
        self.autocast_devices: list[str] = data["autocast_devices"]
        self._policy = {e["op"]: e["policy"] for e in data["ops"]}
        # Ops whose autocast kernel casts the output back to the input's dtype (roi_align's).
        self._cast_back = {e["op"] for e in data["ops"] if e.get("cast_back") is True}
        self._by_spelling: dict[str, list[str]] = {}
        self._with_policy: dict[str, frozenset[str]] = {}
        for entry in data["ops"]:
            for spelling in entry.get("python", []):
                self._by_spelling.setdefault(spelling, []).append(entry["op"])

    def policy(self, op: str) -> str | None:
        return self._policy.get(op)

    def casts_back(self, op: str) -> bool:
        """Whether the op's output has its input's dtype under autocast, whatever it runs in."""
        return op in self._cast_back

    def ops_reached_by(self, spelling: str) -> list[str]:
        """The ops with an autocast kernel that ``spelling`` (e.g. ``torch.nn.BCELoss``) reaches."""
        return self._by_spelling.get(spelling, [])

    def spellings_reaching(self, wanted: Callable[[str], bool]) -> set[str]:
        """The spellings that reach some op for which ``wanted(op)`` holds."""
        return {s for s, ops in self._by_spelling.items() if any(wanted(o) for o in ops)}

    def spellings_with(self, policy: str) -> frozenset[str]:
        """The spellings that reach some op of ``policy``; found once per policy (rules ask
        for each call they judge)."""
        if policy not in self._with_policy:
            self._with_policy[policy] = frozenset(
                s for s, ops in self._by_spelling.items() if any(self._policy[o] == policy for o in ops))
        return self._with_policy[policy]

    def message_for(self, op: str) -> str | None:
        entry = next((e for e in self.data["ops"] if e["op"] == op), None)
        return entry.get("evidence", {}).get("message") if entry else None


@lru_cache(maxsize=1)
def committed_tables() -> tuple[PolicyTable, ...]:
    """Every table in policies/, all torch versions and devices (read once per process: the
    rules ask for each spelling they meet)."""
    return tuple(PolicyTable(json.loads(path.read_text(encoding="utf-8")))
                 for path in sorted(policy_dir().glob("*/*.json")))


def _committed_path(device: str, torch_version: str | None) -> Path:
    versions = available_versions()
    if not versions:
        raise PolicyError(f"no policy tables found in {policy_dir()}")
    version = torch_version or versions[-1]
    if version not in versions:
        raise PolicyError(f"no policy tables for torch-version {version!r} (have: {', '.join(versions)})")
    return policy_dir() / f"torch-{version}" / f"{device}.json"


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


@lru_cache(maxsize=None)
def load_policy(device: str = "cuda", torch_version: str | None = None,
                policies: str | None = None) -> PolicyTable:
    """The table for ``device`` and ``torch_version`` (default: the newest committed), with
    the tables of folder ``policies`` (a project's own, written by ``amplint probe``) merged
    over it: see ``merged``."""
    path = _committed_path(device, torch_version)
    version = path.parent.name.removeprefix("torch-")
    committed = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    user = None
    if policies is not None:
        tables = user_tables(policies)
        user = tables.get((version, device)) or tables.get((None, device))
    if committed is None and user is None:
        devices = sorted(p.stem for p in path.parent.glob("*.json"))
        raise PolicyError(f"no policy table for device {device!r} in torch {version} "
                          f"(have: {', '.join(devices)})")
    if user is None:
        return PolicyTable(committed)
    return PolicyTable(merged(committed, user[1], version, user[0]))


def merged(committed: dict | None, user: dict, version: str, source: Path) -> dict:
    """A project's table over the committed one. Of the same torch minor version as the
    committed table, every entry of the project's wins; of another, only those for ops the
    committed table lacks (the project's own) are added, and torch's ops keep the committed
    answers. Without a committed table for the device, the project's table alone."""
    if committed is None:
        return {**user, "user_tables": str(source)}
    same = _minor(str(user["torch_version"])) == _minor(str(committed.get("torch_version", version)))
    known = {e["op"] for e in committed["ops"]}
    taken = [e for e in user["ops"] if same or e["op"] not in known]
    replaced = {e["op"] for e in taken}
    ops = sorted([e for e in committed["ops"] if e["op"] not in replaced] + taken, key=lambda e: e["op"])
    return {**committed, "ops": ops, "user_tables": str(source)}


_REQUIRED = {"device": str, "dtype": str, "default_dtype": str, "supported_dtypes": list,
             "torch_version": str, "autocast_devices": list, "ops": list}


def _check_table(data: object) -> str | None:
    """Why ``data`` is not a policy table the probe wrote (None when it is one)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not a table"
    for key, kind in _REQUIRED.items():
        if key not in data:
            return f"field {key!r} missing"
        if not isinstance(data[key], kind):
            return f"field {key!r} is not a {kind.__name__}"
    for i, entry in enumerate(data["ops"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
            return f"ops[{i}] has no 'op' name"
        if not (entry.get("policy") is None or isinstance(entry["policy"], str)):
            return f"ops[{i}] ({entry['op']}): 'policy' is not a string"
        for key in ("python", "python_float64", "python_explicit_dtype"):
            names = entry.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                return f"ops[{i}] ({entry['op']}): {key!r} is not a list of names"
        if not isinstance(entry.get("evidence", {}), dict):
            return f"ops[{i}] ({entry['op']}): 'evidence' is not an object"
        if not isinstance(entry.get("cast_back", False), bool):
            return f"ops[{i}] ({entry['op']}): 'cast_back' is not true or false"
    return None


def _table_files(folder: Path) -> list[tuple[str | None, Path]]:
    """(torch version of a ``torch-X.Y`` subfolder or None, file) for each JSON file."""
    found = [(None, p) for p in sorted(folder.glob("*.json"))]
    for sub in sorted(folder.glob("torch-*")):
        if sub.is_dir():
            found += [(sub.name.removeprefix("torch-"), p) for p in sorted(sub.glob("*.json"))]
    return found


def _fingerprint(folder: str) -> tuple:
    try:
        return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for _, p in _table_files(Path(folder)))
    except OSError:
        return ()


def user_tables(folder: str | Path) -> dict[tuple[str | None, str], tuple[Path, dict]]:
    """A project's tables (``amplint probe --import mypkg --output-dir FOLDER``): by (torch
    version of their ``torch-X.Y`` subfolder, or None for the folder itself; device). A
    folder that is missing, holds no table or a file that is not one raises PolicyError."""
    return _user_tables(str(folder), _fingerprint(str(folder)))


@lru_cache(maxsize=16)
def _user_tables(folder: str, fingerprint: tuple) -> dict[tuple[str | None, str], tuple[Path, dict]]:
    root = Path(folder)
    if not root.exists():
        raise PolicyError(f"{folder}: no such folder (write it with "
                          "`amplint probe --import mypkg --output-dir FOLDER`)")
    if not root.is_dir():
        raise PolicyError(f"{folder}: not a folder")
    found: dict[tuple[str | None, str], tuple[Path, dict]] = {}
    for version, path in _table_files(root):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PolicyError(f"{path}: not a policy table: {reason}") from None
        for table in data if isinstance(data, list) else [data]:  # --device all --format json
            problem = _check_table(table)
            if problem is not None:
                raise PolicyError(f"{path}: not a policy table: {problem}")
            key = (version, table["device"])
            if key in found:
                raise PolicyError(f"{path}: a second table for device {table['device']!r} "
                                  f"(the first is in {found[key][0]})")
            found[key] = (path, table)
    if not found:
        raise PolicyError(f"{folder}: holds no policy table (write them with "
                          "`amplint probe --import mypkg --output-dir FOLDER`)")
    return found


def user_tables_digest(folder: str | Path) -> str:
    """What a project's tables hold, for the cache's key."""
    digest = hashlib.sha256()
    for _, path in _table_files(Path(folder)):
        digest.update(str(path).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            pass
    return digest.hexdigest()


_seen: dict[str, tuple] = {}  # a project's tables folder -> its files when last read


class PolicyLoader:
    """What the lint engine asks for tables: ``load(None)`` is the configured device's table
    (raising PolicyError if there is none), ``load("mps")`` another device's, or None. With
    ``policies``, a project's tables are merged over the committed ones. ``torch_version`` is
    the configured one (None: not configured, the newest tables)."""

    def __init__(self, device: str, torch_version: str | None, policies: str | None):
        self.device, self.torch_version, self.policies = device, torch_version, policies

    def __call__(self, requested: str | None = None) -> PolicyTable | None:
        try:
            return load_policy(requested or self.device, self.torch_version, self.policies)
        except PolicyError:
            if requested is None:
                raise
            return None


def loader(device: str = "cuda", torch_version: str | None = None, policies: str | None = None) -> PolicyLoader:
    if policies is not None:
        now = _fingerprint(policies)
        if _seen.setdefault(policies, now) != now:  # rewritten since: read them again
            _seen[policies] = now
            load_policy.cache_clear()
    return PolicyLoader(device, torch_version, policies)
