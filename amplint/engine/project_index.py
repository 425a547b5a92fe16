"""What one file cannot show: facts of the project a file belongs to, read from its other files.

`check` reads one file at a time, but some mistakes are mistakes because of another file: a
loss module is called by a trainer, elsewhere, under autocast. For a file, the project is the
folder of the nearest ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git`` above it,
else the outermost package (folders with ``__init__.py``) that holds it. Its facts are read
once per run (``forget`` starts a new one) and only when a rule asks: the torch it declares
(``torch_requirement``), and a literal scan of the project's ``.py`` files for
``autocast`` (and the words of the framework settings that turn it on: Lightning's
``precision="16-mixed"``, accelerate's ``mixed_precision="fp16"``, transformers'
``TrainingArguments(fp16=True)``), then Python's ``ast`` of those that mention one (never
libcst: a project is thousands of files). Folders the default configuration excludes (virtual environments, build
output, hidden folders) are not read; neither is anything outside the project. What a file's
findings read of these facts is recorded as a ``Dependency`` (a digest of the summary), which
the result cache checks before it answers for the file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import source as source_io
from .config import DEFAULT_EXCLUDE
from .outline import Outline
from .semantics import AUTOCAST, AUTOCAST_DEVICE
from .torch_requirement import declared_torch

_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# A project bigger than this is not read whole (a home folder taken for a project).
MAX_PROJECT_FILES = 20_000


@dataclass(frozen=True)
class AutocastSite:
    """An autocast call that may be enabled, somewhere in the project outside its models'
    own code (a trainer's, an engine's, a training step's), or a framework setting that makes
    the framework open the region itself (``setting``)."""
    path: Path
    row: int
    device: str | None  # None when the device is not a literal (`device_type=self.device.type`)
    setting: str | None = None  # `Trainer(precision="16-mixed")`

    def shown_path(self) -> str:
        """The file as a path relative to the current folder where it lies below it."""
        try:
            return self.path.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return self.path.as_posix()

    def where(self, root: Path) -> str:
        try:
            shown = self.path.relative_to(root).as_posix()
        except ValueError:
            shown = self.path.as_posix()
        return f"{shown}:{self.row}" + (f", `{self.setting}`" if self.setting else "")


# Framework settings under which the framework runs training steps under autocast, on the
# device it trains on: (constructors, keyword, literal values that turn mixed precision on).
_FRAMEWORK_SETTINGS = (
    (frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
                "lightning.fabric.Fabric", "lightning.Fabric"}),
     "precision", frozenset({"16-mixed", "bf16-mixed", "16", "bf16", 16})),
    (frozenset({"accelerate.Accelerator"}), "mixed_precision", frozenset({"fp16", "bf16"})),
    (frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"}), "fp16",
     frozenset({True})),
    (frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"}), "bf16",
     frozenset({True})),
)
_FRAMEWORK_CLASSES = frozenset().union(*(names for names, _, _ in _FRAMEWORK_SETTINGS))
# What a file that sets one must contain: a class's name and the keyword given (`precision`
# alone is a metric); plain searches first, they are many times faster than the expression.
_FRAMEWORK_WORDS = (b"Trainer", b"Fabric", b"Accelerator", b"TrainingArguments")
_SETTING = re.compile(rb"(?:precision|fp16|bf16)\s*=")


def _walked(name: str) -> bool:
    return name not in DEFAULT_EXCLUDE and not name.startswith(".")


def project_root(path: Path) -> Path | None:
    """The project ``path`` belongs to (see the module's docstring); None for a file that is
    in no package and under no project marker. A marker folder whose walk would not reach the
    file (it lies in a hidden, virtual-environment or site-packages folder below it) is not
    the file's project: an installed package is its own."""
    folder = path.resolve().parent
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in _PROJECT_MARKERS):
            if all(_walked(part) for part in folder.relative_to(candidate).parts):
                return candidate
            break
    outermost = None
    for candidate in (folder, *folder.parents):
        if not (candidate / "__init__.py").exists():
            break
        outermost = candidate
    return outermost


def _python_files(root: Path):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if _walked(d))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder) / name


def _sites_in(path: Path, text: str) -> list[AutocastSite]:
    outline = Outline.parse(text)
    if outline is None:
        return []
    models = [(c.lineno, c.end_lineno) for c in outline.nodes(ast.ClassDef)
              if any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "forward" for s in c.body)
              or any(getattr(b, "attr", getattr(b, "id", "")).endswith("Module") for b in c.bases)]
    found = []
    for call in outline.calls_to(AUTOCAST):
        if any(first <= call.lineno <= last for first, last in models):
            continue  # a model running part of its own forward under autocast: not where losses run
        enabled = next((k.value for k in call.keywords if k.arg == "enabled"), None)
        if isinstance(enabled, ast.Constant) and enabled.value is False:
            continue
        api = next(iter(outline.qualified_names(call.func) & AUTOCAST))
        if api in AUTOCAST_DEVICE:
            device = AUTOCAST_DEVICE[api]
        else:
            given = next((k.value for k in call.keywords if k.arg == "device_type"),
                         call.args[0] if call.args else None)
            device = given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else None
        found.append(AutocastSite(path, call.lineno, device))
    for call in outline.calls_to(_FRAMEWORK_CLASSES):
        names = outline.qualified_names(call.func)
        for classes, keyword, values in _FRAMEWORK_SETTINGS:
            value = next((k.value for k in call.keywords if k.arg == keyword), None)
            if not names.isdisjoint(classes) and isinstance(value, ast.Constant) and value.value in values \
                    and type(value.value) in (str, int, bool):
                found.append(AutocastSite(path, call.lineno, None, f"{keyword}={value.value!r}"))
    return found


@lru_cache(maxsize=32)
def autocast_sites(root: Path) -> tuple[AutocastSite, ...]:
    """Every autocast call of the project that is not disabled by a literal ``enabled=False``,
    in path order."""
    found: list[AutocastSite] = []
    for count, path in enumerate(_python_files(root)):
        if count >= MAX_PROJECT_FILES:
            break
        try:
            data = source_io.read_file(path)
            if b"autocast" in data or (any(name in data for name in _FRAMEWORK_WORDS) and _SETTING.search(data)):
                found.extend(_sites_in(path, source_io.decode(data).text))
        except (OSError, source_io.SourceError):
            continue
    return tuple(found)


@dataclass(frozen=True, order=True)
class Dependency:
    """A summary of a project's other files that a file's findings were computed from: its
    ``kind`` (``SUMMARIES``), the project's ``root`` and a digest of what it held then. A
    cached result stands only while every summary it read still has that digest."""
    kind: str
    root: str
    digest: str


def _sites_summary(root: Path) -> object:
    return [[s.path.as_posix(), s.row, s.device, s.setting] for s in autocast_sites(root)]


def _requirement_summary(root: Path) -> object:
    required = declared_torch(root)
    return None if required is None else [required.floor, required.declared, required.source]


SUMMARIES = {"autocast-sites": _sites_summary, "torch-requirement": _requirement_summary}


@lru_cache(maxsize=64)
def dependency(kind: str, root: Path) -> Dependency:
    """The summary ``kind`` of the project at ``root`` as it is now."""
    text = json.dumps(SUMMARIES[kind](root))
    return Dependency(kind, str(root), hashlib.sha256(text.encode()).hexdigest())


def forget() -> None:
    """Read the project's files again when next asked: a new run sees them as they are now."""
    autocast_sites.cache_clear()
    declared_torch.cache_clear()
    dependency.cache_clear()
