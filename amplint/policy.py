"""The linter's only view of the probe: the JSON tables in policies/. No torch here."""

from __future__ import annotations

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
        self._by_spelling: dict[str, list[str]] = {}
        for entry in data["ops"]:
            for spelling in entry.get("python", []):
                self._by_spelling.setdefault(spelling, []).append(entry["op"])

    def policy(self, op: str) -> str | None:
        return self._policy.get(op)

    def ops_reached_by(self, spelling: str) -> list[str]:
        """The ops with an autocast kernel that ``spelling`` (e.g. ``torch.nn.BCELoss``) reaches."""
        return self._by_spelling.get(spelling, [])

    def spellings_reaching(self, wanted: Callable[[str], bool]) -> set[str]:
        """The spellings that reach some op for which ``wanted(op)`` holds."""
        return {s for s, ops in self._by_spelling.items() if any(wanted(o) for o in ops)}

    def spellings_with(self, policy: str) -> set[str]:
        return {s for s, ops in self._by_spelling.items() if any(self._policy[o] == policy for o in ops)}

    def message_for(self, op: str) -> str | None:
        entry = next((e for e in self.data["ops"] if e["op"] == op), None)
        return entry.get("evidence", {}).get("message") if entry else None


def committed_tables() -> list[PolicyTable]:
    """Every table in policies/, all torch versions and devices."""
    return [PolicyTable(json.loads(path.read_text(encoding="utf-8")))
            for path in sorted(policy_dir().glob("*/*.json"))]


@lru_cache(maxsize=None)
def load_policy(device: str = "cuda", torch_version: str | None = None) -> PolicyTable:
    versions = available_versions()
    if not versions:
        raise PolicyError(f"no policy tables found in {policy_dir()}")
    version = torch_version or versions[-1]
    if version not in versions:
        raise PolicyError(f"no policy tables for torch-version {version!r} (have: {', '.join(versions)})")
    folder = policy_dir() / f"torch-{version}"
    path = folder / f"{device}.json"
    if not path.is_file():
        devices = sorted(p.stem for p in folder.glob("*.json"))
        raise PolicyError(f"no policy table for device {device!r} in torch {version} "
                          f"(have: {', '.join(devices)})")
    return PolicyTable(json.loads(path.read_text(encoding="utf-8")))


def loader(device: str = "cuda", torch_version: str | None = None):
    """What the lint engine asks for tables: ``load(None)`` is the configured device's table
    (raising PolicyError if there is none), ``load("mps")`` another device's, or None."""
    def load(requested: str | None = None) -> PolicyTable | None:
        try:
            return load_policy(requested or device, torch_version)
        except PolicyError:
            if requested is None:
                raise
            return None
    return load
