"""What one file cannot show: facts of the project a file belongs to, read from its other files.

`check` reads one file at a time, but some mistakes are mistakes because of another file: a
loss module is called by a trainer, elsewhere, under autocast. For a file, the project is the
folder of the nearest ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git`` above it,
else the outermost folder named on the command line that holds it (a downloaded source tree
with a ``requirements.txt``: ``name_folders``), unless a package (folders with
``__init__.py``) holds that folder or is an installed distribution: then the outermost
package, with the other top-level packages of its distribution that it imports
(``project_folders``). Its facts are read
once per run (``forget`` starts a new one), when a rule asks or, where files are spread over
processes, by one of them for all (``project_facts``): the torch it declares (``torch_requirement``),
and a literal scan of the project's ``.py`` files for ``autocast`` (and the words of the
framework settings that turn it on: Lightning's ``precision="16-mixed"``, accelerate's
``mixed_precision="fp16"``, transformers' ``TrainingArguments(fp16=True)``). Each module that
mentions one is summarized from Python's ``ast``, by its content alone (``_summary``), and a run with a result cache keeps the summaries
there, so that a later run parses only the modules that changed. Folders the default
configuration excludes (virtual environments, build output, hidden folders) are not read;
neither is anything outside the project. What a file's findings read of these facts is
recorded as a ``Dependency`` (a digest of the summary), which the result cache checks before
it answers for the file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import astuple, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import source as source_io
from .names import AUTOCAST, AUTOCAST_DEVICE, DTYPES
from .outline import Outline, contains, dotted, named_parameters, walk
from .switches import (CONFIG_SUFFIXES, MAX_CONFIG_BYTES, ConfigKey, Flag, config_keys_in, flags_in, may_define_flags,
                       may_hold_amp_key, turns_on)
from . import torch_requirement
from .torch_requirement import declared_torch

# Folders no project's files are taken from, and the exclude list a configuration starts with.
DEFAULT_EXCLUDE = (".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "build", "dist",
                   "site-packages", "node_modules", ".tox", ".nox", ".mypy_cache", ".amplint_cache",
                   ".ipynb_checkpoints")

_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# A project bigger than this is not read whole (a home folder taken for a project).
MAX_PROJECT_FILES = 20_000


def relative_name(path: Path, base: Path) -> str:
    """``path`` as named from ``base`` where it lies below it, else as given (how findings name
    another file: from the project's root, or from the current folder)."""
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


@dataclass(frozen=True)
class AutocastSite:
    """An autocast call that may be enabled, somewhere in the project outside its models'
    own code (a trainer's, an engine's, a training step's), or a framework setting that makes
    the framework open the region itself (``setting``)."""
    path: Path
    row: int
    device: str | None  # None when the device is not a literal (`device_type=self.device.type`)
    setting: str | None = None  # `Trainer(precision="16-mixed")`
    # "float16" / "bfloat16" when a literal or the setting says; None when not given (the
    # device's default: float16 on CUDA); DYNAMIC when an expression decides.
    dtype: str | None = None
    # The one class a framework setting trains, where its code fits a model it builds right
    # there (``_trained_class``), and the module that defines it; None where it trains what it
    # is given.
    trains: tuple[str, Path] | None = None

    def may_be_float16(self) -> bool:
        """Whether the region may run in float16: a literal float16, or no dtype on a device
        whose default is float16 (CUDA, or a device that is not a literal)."""
        return self.dtype == "float16" or (self.dtype is None and self.device in (None, "cuda"))

    def shown_path(self) -> str:
        """The file as a path relative to the current folder where it lies below it."""
        return relative_name(self.path, Path.cwd())

    def where(self, root: Path) -> str:
        return f"{project_name(self.path, root)}:{self.row}" + (f", `{self.setting}`" if self.setting else "")


DYNAMIC = "dynamic"
# Framework settings under which the framework runs training steps under autocast, on the
# device it trains on: (constructors, keyword, literal values that turn mixed precision on).
# A keyword of None: constructing it turns it on (mmcv's `Fp16OptimizerHook`, whose runner
# then runs the `@auto_fp16` forwards, losses included, under float16 autocast).
_FRAMEWORK_SETTINGS = (
    (frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
                "lightning.fabric.Fabric", "lightning.Fabric"}),
     "precision", frozenset({"16-mixed", "bf16-mixed", "16", "bf16", 16})),
    (frozenset({"accelerate.Accelerator"}), "mixed_precision", frozenset({"fp16", "bf16"})),
    (frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"}), "fp16",
     frozenset({True})),
    (frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments"}), "bf16",
     frozenset({True})),
    (frozenset({f"mmcv.runner{module}.{name}" for module in ("", ".hooks", ".hooks.optimizer")
                for name in ("Fp16OptimizerHook", "GradientCumulativeFp16OptimizerHook")}), None, frozenset()),
    # mmengine's wrapper runs `optim_context` (the model's forward and losses) under autocast
    (frozenset({"mmengine.optim.AmpOptimWrapper", "mmengine.optim.optimizer.AmpOptimWrapper"}), None, frozenset()),
    # detectron2's trainer runs the model (losses included) under autocast
    (frozenset({"detectron2.engine.AMPTrainer", "detectron2.engine.train_loop.AMPTrainer"}), None, frozenset()),
)
_FRAMEWORK_CLASSES = frozenset().union(*(names for names, _, _ in _FRAMEWORK_SETTINGS))
# What a file that sets one must contain: a class's name and the keyword given (`precision`
# alone is a metric); plain searches first, they are many times faster than the expression.
_FRAMEWORK_WORDS = (b"Trainer", b"Fabric", b"Accelerator", b"TrainingArguments")
_SETTING = re.compile(rb"(?:precision|fp16|bf16)\s*=")
_CONSTRUCTED_SETTINGS = (b"Fp16OptimizerHook", b"AmpOptimWrapper", b"AMPTrainer")
# A config module of mmcv 1.x that sets `fp16 = dict(loss_scale=...)`: its runner builds the
# Fp16OptimizerHook.
_MMCV_FP16 = re.compile(rb"^fp16\s*=\s*dict\(", re.MULTILINE)


def _setting_dtype(keyword: str | None, value: object) -> str | None:
    if keyword is None:
        return "float16"
    text = str(value)
    return "bfloat16" if "bf16" in text or keyword == "bf16" else "float16"


def _literal_dtype(outline: Outline, call: ast.Call) -> str | None:
    """The dtype an autocast call passes: its name for a literal ``torch.float16`` /
    ``torch.bfloat16``; None when none is given; DYNAMIC for an expression."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return DYNAMIC
    given = next((k.value for k in call.keywords if k.arg == "dtype"), None)
    if given is None:
        return None
    names = outline.qualified_names(given)
    for name in ("float16", "half", "bfloat16"):
        if f"torch.{name}" in names:
            return "bfloat16" if name == "bfloat16" else "float16"
    return DYNAMIC


def _walked(name: str) -> bool:
    # `.mim` is where an installed OpenMMLab package keeps the configs its tools train with
    return name not in DEFAULT_EXCLUDE and (not name.startswith(".") or name == ".mim")


def project_root(path: Path) -> Path | None:
    """The project ``path`` belongs to (see the module's docstring); None for a file that is
    in no package and under no project marker. A marker folder whose walk would not reach the
    file (it lies in a hidden, virtual-environment or site-packages folder below it) is not
    the file's project: an installed package is its own."""
    return _folder_root(path.resolve().parent)


# The folders a run was asked to check, resolved: roots of the projects no marker names.
_NAMED: set[Path] = set()


def name_folders(folders: Iterable[Path]) -> None:
    """Take ``folders`` (those named on the command line) as this run's named folders."""
    _NAMED.clear()
    _NAMED.update(Path(os.path.realpath(f)) for f in folders if os.path.isdir(f))
    _folder_root.cache_clear()


def named_folders() -> frozenset[Path]:
    return frozenset(_NAMED)


@lru_cache(maxsize=None)
def _folder_root(folder: Path) -> Path | None:
    """``project_root`` of the files of one folder."""
    marked = _nearest_marked(folder)
    if marked is not None and all(_walked(part) for part in folder.relative_to(marked).parts):
        return marked
    package = _outermost_package(folder)
    named = next((f for f in (*reversed(folder.parents), folder) if f in _NAMED), None)
    if named is not None and (package is None or package.is_relative_to(named)) and not _installed(folder, named):
        return named
    return package


def _installed(folder: Path, named: Path) -> bool:
    """Whether ``folder`` lies in a folder of installed distributions (a ``site-packages``,
    pip's ``--target``) at or below ``named``: an installed package is its own project, and
    the other files there are in none."""
    return any(_holds_distributions(f) for f in (folder, *folder.parents) if f.is_relative_to(named))


@lru_cache(maxsize=None)
def _holds_distributions(folder: Path) -> bool:
    return any(folder.glob("*.dist-info"))


# Each asked once per folder and run, from its parent's answer: the folders of a tree share
# their ancestors.
@lru_cache(maxsize=None)
def _nearest_marked(folder: Path) -> Path | None:
    """The folder itself, or its nearest ancestor, that holds a project marker."""
    if _marked(folder):
        return folder
    parent = folder.parent
    return None if parent == folder else _nearest_marked(parent)


@lru_cache(maxsize=None)
def _outermost_package(folder: Path) -> Path | None:
    """The outermost folder of the unbroken chain of packages from ``folder`` up; None when
    ``folder`` is no package."""
    if not _package(folder):
        return None
    parent = folder.parent
    return (None if parent == folder else _outermost_package(parent)) or folder


@lru_cache(maxsize=None)
def _marked(folder: Path) -> bool:
    return any((folder / marker).exists() for marker in _PROJECT_MARKERS)


@lru_cache(maxsize=None)
def _package(folder: Path) -> bool:
    return (folder / "__init__.py").exists()


# This run's answers about projects, by (question, project root): filled as rules ask, or ahead
# of a project's checks by ``project_facts`` in one process, and ``adopt``ed by the others.
_FACTS: dict[tuple[str, Path], object] = {}


def _per_project(question: Callable[[Path], object]) -> Callable:
    """``question(root)``, asked once per project and run."""
    def answer(root: Path):
        key = (question.__name__, root)
        if key not in _FACTS:
            _FACTS[key] = question(root)
        return _FACTS[key]
    answer.__name__, answer.__doc__ = question.__name__, question.__doc__
    return answer


@lru_cache(maxsize=None)
def project_folders(root: Path) -> tuple[Path, ...]:
    """The folders a project's files are read from: its root; for an installed package, also
    the other top-level packages of its distribution (as its ``top_level.txt``, else its
    ``RECORD``, lists them) that the package's modules import: ``training`` runs ``sam2``'s
    models with ``sam2``'s configs, one source tree installed as both. A sibling that only
    imports the package (its examples, its tests) is not code the package runs."""
    if not _package(root) or not _holds_distributions(root.parent):
        return (root,)
    names = set().union(*(torch_requirement.top_level_names(d) for d in torch_requirement.distributions_holding(root)))
    siblings = sorted(n for n in names - {root.name} if _package(root.parent / n))
    if not siblings:
        return (root,)
    imports = re.compile(rb"^[ \t]*(?:from|import)[ \t]+(" + b"|".join(re.escape(n.encode()) for n in siblings)
                         + rb")\b", re.MULTILINE)
    imported = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if _walked(d))
        for name in files:
            if name.endswith(".py"):
                imported.update(m.decode() for m in imports.findall(_read(Path(folder) / name) or b""))
    return (root, *(root.parent / n for n in siblings if n in imported))


def project_name(path: Path, root: Path) -> str:
    """How the project names one of its files: from its root (``pkg/utils.py``); a file of
    another of its folders (``project_folders``) from the root too (``../sam2/config.yaml``),
    so that ``root / name`` is the file again."""
    for folder in project_folders(root)[1:]:
        if path.is_relative_to(folder):
            return f"../{folder.name}/{path.relative_to(folder).as_posix()}"
    return relative_name(path, root)


@lru_cache(maxsize=32)
def _files(root: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The project's ``.py`` files and its config files (``switches.CONFIG_SUFFIXES``), from
    each of its folders."""
    python, configs = [], []
    for top in project_folders(root):
        for folder, dirs, files in os.walk(top):
            if _KEEP_BETWEEN_RUNS:  # a file added or removed changes its folder
                _SEEN[Path(folder)] = _signature(folder)
            dirs[:] = sorted(d for d in dirs if _walked(d))
            for name in sorted(files):
                if name.endswith(".py"):
                    python.append(Path(folder) / name)
                elif name.endswith(CONFIG_SUFFIXES):
                    configs.append(Path(folder) / name)
    return tuple(python), tuple(configs)


def _python_files(root: Path) -> tuple[Path, ...]:
    return _files(root)[0]


# Where the summaries of a run with a result cache are kept: (folder, the linter's digest).
_STORE: list[tuple[Path, str]] = []


def keep_summaries(folder: Path, linter: str) -> None:
    """Keep the modules' summaries (``_summary``) in ``folder``, by content and ``linter`` (the
    digest of the code that made them): a later run reads them instead of parsing the modules.
    The first result cache of a run keeps them for every project it reads (summaries depend
    on nothing a configuration sets)."""
    if not _STORE:
        _STORE.append((folder, linter))


_SUMMARIES: dict[Path, dict | None] = {}  # this run's, by path
_PARSED: set[Path] = set()  # the modules this process parsed for them
# Summaries by the digest of the content they were made from, kept from one run to the next
# where the process asks (``keep_between_runs``); the oldest go first past the bound.
_BY_CONTENT: dict[bytes, dict | None] = {}
_MAX_BY_CONTENT = 4096
_KEEP_BETWEEN_RUNS: list[bool] = []


def keep_between_runs() -> None:
    """Keep what was read of the projects from one run to the next, in this process, while
    the files and folders it was read from are unchanged on disk (``new_run``); and the
    modules' summaries by their content, across changes. A language server checks a document
    after each edit while the rest of its project stays as it is on disk: the project is read
    once, and after a change only the modules whose content is new are parsed again."""
    _KEEP_BETWEEN_RUNS[:] = [True]


def new_run() -> None:
    """Before a run: read the projects' files again when next asked, unless this process keeps
    what it read (``keep_between_runs``) and none of the modules and config files it read, nor
    any folder it listed, changed on disk since."""
    if not (_KEEP_BETWEEN_RUNS and _SEEN and all(_signature(path) == seen for path, seen in _SEEN.items())):
        forget()


# What the files read and the folders listed were on disk when read: (modified, size, inode).
_SEEN: dict[Path, tuple[int, int, int] | None] = {}


def _declaration_looked_at(path: Path) -> None:
    """A file or folder that the torch the project declares is looked for in, before it is
    read: kept between runs like the modules, while it is unchanged."""
    if _KEEP_BETWEEN_RUNS:
        _SEEN.setdefault(path, _signature(path))


torch_requirement.READ_HOOKS.append(_declaration_looked_at)


def _signature(path: Path | str) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino


def parsed_here() -> set[Path]:
    """The modules this process has parsed for their summaries, and whose outlines it keeps
    for their checks (``Outline.parse``): checked here, they are not parsed again."""
    return _PARSED


def _summary(path: Path) -> dict | None:
    """What the project's scans need of one module, from its content alone: its autocast sites
    (``_sites_of``), the names of the functions it defines, and what may be an autocast wrapper
    (``_candidates_of``). None for a module that cannot be read or parsed."""
    if path not in _SUMMARIES:
        _SUMMARIES[path] = _summarize(path)
    return _SUMMARIES[path]


def _summarize(path: Path) -> dict | None:
    data = _read(path)
    if data is None:
        return None
    entry = None
    if _STORE:
        folder, linter = _STORE[0]
        key = hashlib.sha256(linter.encode() + b"\0" + data).hexdigest()
        entry = folder / key[:2] / f"{key}.json"
        try:
            return json.loads(entry.read_text(encoding="utf-8"))["summary"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    digest = hashlib.blake2b(data, digest_size=20).digest() if _KEEP_BETWEEN_RUNS else None
    if digest is not None and digest in _BY_CONTENT:
        summary = _BY_CONTENT[digest]
    else:
        outline = _outline_of(data, keep=True)
        if outline is not None:
            _PARSED.add(path)
        summary = None if outline is None else {
            "sites": _sites_of(outline),
            "defs": sorted({n.name for kind in (ast.FunctionDef, ast.AsyncFunctionDef) for n in outline.nodes(kind)}),
            **_candidates_of(outline)}
        if digest is not None:
            if len(_BY_CONTENT) >= _MAX_BY_CONTENT:
                del _BY_CONTENT[next(iter(_BY_CONTENT))]
            _BY_CONTENT[digest] = summary
    if entry is not None:
        source_io.write_entry(entry, {"summary": summary})
    return summary


def _outline_of(data: bytes | None, keep: bool = False) -> Outline | None:
    """A project module's outline; None when it cannot be read, decoded or parsed. ``keep``:
    for this process's check of the file (``Outline.parse``)."""
    try:
        return Outline.parse(source_io.decode(data).text, keep) if data is not None else None
    except source_io.SourceError:
        return None


_BYTES: dict[Path, bytes | None] = {}  # what ``_read`` read, by path


def _read(path: Path) -> bytes | None:
    """A project file's bytes, read once per run by every scan of the project (None: unreadable)."""
    if path not in _BYTES:
        if _KEEP_BETWEEN_RUNS:  # before reading: a change while it is read shows next time
            _SEEN[path] = _signature(path)
        try:
            _BYTES[path] = source_io.read_file(path)
        except (OSError, source_io.SourceError):  # a FIFO or device named like a module is not read
            _BYTES[path] = None
    return _BYTES[path]


def bytes_read(path: Path) -> bytes | None:
    """The bytes of ``path`` (absolute) this process's scans of its project read; None if they
    did not read it."""
    return _BYTES.get(path)


def _sites_of(outline: Outline) -> list[list]:
    """A module's autocast sites (``AutocastSite`` without its path): [row, device, setting, dtype],
    and for a call whose ``enabled=`` is its function's parameter, that switch (``_switch_parameter``)."""
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
        found.append([call.lineno, _autocast_device(outline, call), None, _literal_dtype(outline, call),
                      _switch_parameter(outline, call, enabled)])
    for call in outline.calls_to(_FRAMEWORK_CLASSES):
        names = outline.qualified_names(call.func)
        for classes, keyword, values in _FRAMEWORK_SETTINGS:
            if names.isdisjoint(classes):
                continue
            if keyword is None:
                found.append([call.lineno, None, f"{_dotted_name(call.func)}(...)", "float16"])
                continue
            value = next((k.value for k in call.keywords if k.arg == keyword), None)
            if isinstance(value, ast.Constant) and value.value in values and type(value.value) in (str, int, bool):
                found.append([call.lineno, None, f"{keyword}={value.value!r}", _setting_dtype(keyword, value.value),
                              None, _trained_class(outline, call)])
    return found + _config_module_sites(outline)


def _trained_class(outline: Outline, setting: ast.Call) -> list | None:
    """For a framework object built with a mixed-precision setting (``trainer = Trainer(...)``),
    the one class every ``trainer.fit(model, ...)`` of the same function trains, where the
    function builds that model right there (``model = Net(...)``, ``Net.load_from_checkpoint(...)``,
    or the call inline): [its name, and the module and level of the ``from ... import`` that
    binds it (None and 0 for a class of this module)]. None where it fits what it is given, or
    nothing."""
    parent = outline.parents.get(id(setting))
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)):
        return None
    function = parent
    while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        function = outline.parents.get(id(function))
    if function is None:
        return None
    trainer = parent.targets[0].id
    built = {}  # a name bound once in the function, to what it is bound
    for node in walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            built[node.targets[0].id] = node.value if node.targets[0].id not in built else None
    trained = set()
    for node in walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == trainer:
            model = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "model"), None)
            if isinstance(model, ast.Name):
                model = built.get(model.id)
            trained.add(_class_built(outline, model, _parameters(function)))
    if len(trained) != 1 or None in trained:
        return None
    name = trained.pop()
    imported = next(((node.module, node.level) for node in outline.nodes(ast.ImportFrom)
                     for alias in node.names if (alias.asname or alias.name) == name), (None, 0))
    return [name, *imported]


def _parameters(function: ast.AST) -> set[str]:
    return {a.arg for a in named_parameters(function.args)} if not isinstance(function, ast.Module) else set()


def _class_built(outline: Outline, value: ast.expr | None, given: set[str]) -> str | None:
    """The name of the class ``Net(...)`` or ``Net.load_from_checkpoint(...)`` builds, where
    it is handed none of ``given`` (the function's parameters: ``LitClassifier(model)`` runs
    whatever model its caller passes)."""
    if not isinstance(value, ast.Call) or any(isinstance(n, ast.Name) and n.id in given for n in walk(value)):
        return None
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr.startswith("load_from"):
        func = func.value
    return func.id if isinstance(func, ast.Name) and func.id[:1].isupper() else None


def _trained_where(root: Path, path: Path, trained: list | None) -> tuple[str, Path] | None:
    """A trained class (``_trained_class``) with the module that defines it: the site's own,
    the project module it is imported from, or, for another library's, the site's."""
    if trained is None:
        return None
    name, module, level = trained
    found = project_module(root, path, module, level) if module or level else None
    return name, found if found is not None else path


def _switch_parameter(outline: Outline, call: ast.Call, enabled: ast.expr | None) -> list | None:
    """For ``enabled=flag`` where ``flag`` is a parameter of the function around the call that
    its body never rebinds: [the function's name, the parameter, its position as callers pass
    it (``self`` left out of a method's), its default (True, False, or None when not a
    literal or none)]; None otherwise."""
    if not isinstance(enabled, ast.Name):
        return None
    function = outline.parents.get(id(call))
    while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        function = outline.parents.get(id(function))
    if function is None or function.args.vararg is not None:
        return None
    params = [*function.args.posonlyargs, *function.args.args]
    names = [p.arg for p in params]
    if enabled.id not in names or any(
            isinstance(n, ast.Name) and n.id == enabled.id and not isinstance(n.ctx, ast.Load)
            for n in walk(function)):
        return None
    method = isinstance(outline.parents.get(id(function)), ast.ClassDef) and names[:1] in (["self"], ["cls"])
    defaults = dict(zip(names[len(names) - len(function.args.defaults):], function.args.defaults))
    default = defaults.get(enabled.id)
    literal = default.value if isinstance(default, ast.Constant) and isinstance(default.value, bool) else None
    return [function.name, enabled.id, names.index(enabled.id) - (1 if method else 0), literal]


def _switched_off(root: Path, switch: list) -> bool:
    """Whether every call in the project of the function a site's ``enabled=`` parameter
    belongs to (``_switch_parameter``) turns the region off: there is at least one, each
    passes a literal False or leaves a False default, none passes ``*args``/``**kwargs``, and
    the function is not handed on uncalled (a callback could pass anything)."""
    name, parameter, index, default = switch
    key = (f"switched-off:{name}:{parameter}:{index}:{default}", root)
    if key not in _FACTS:
        calls = 0
        off = True
        for _, tree in _parsed_where(root, lambda data: name.encode() in data):
            called = set()
            for node in walk(tree):
                if not isinstance(node, ast.Call) or _called_name(node.func) != name:
                    continue
                called.add(id(node.func))
                calls += 1
                given = next((k.value for k in node.keywords if k.arg == parameter), None)
                if given is None and index < len(node.args):
                    given = node.args[index]
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    off = False
                elif given is None:
                    off = off and default is False
                else:
                    off = off and isinstance(given, ast.Constant) and given.value is False
            if any(_called_name(node) == name and id(node) not in called for node in walk(tree)
                   if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load)):
                off = False
            if not off:
                break
        _FACTS[key] = off and calls > 0
    return _FACTS[key]


def _called_name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


# How a setting a training script makes behind its switch begins (``_config_module_sites``).
_SWITCHED = "if "


def _config_module_sites(outline: Outline) -> list[list]:
    """The settings of a config module (mmengine, mmcv 1.x) that make the runner open the
    region: an optimizer wrapper of type ``AmpOptimWrapper`` (as ``dict(type=...)`` or a dict
    literal, its ``dtype`` picking the precision; or a training script's
    ``cfg.optim_wrapper.type = 'AmpOptimWrapper'``, which sets it for whatever config it is given),
    and a module-level ``fp16 = dict(...)``."""
    found = []
    for node in outline.nodes(ast.Assign):
        if getattr(node.value, "value", None) != "AmpOptimWrapper" or not isinstance(node.value, ast.Constant):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Attribute) and target.attr == "type" or \
                isinstance(target, ast.Subscript) and getattr(target.slice, "value", None) == "type":
            setting = f"{_dotted_name(target)} = 'AmpOptimWrapper'"
            guard = _guarding_test(outline, node)  # the switch: `if args.amp:`
            found.append([node.lineno, None, f"{_SWITCHED}{_dotted_name(guard)}: {setting}" if guard else setting,
                          "float16"])
    for node in outline.nodes(ast.Call) + outline.nodes(ast.Dict):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id == "dict"):
                continue
            fields = {k.arg: k.value for k in node.keywords if k.arg is not None}
        else:
            fields = {k.value: v for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        kind = fields.get("type")
        if isinstance(kind, ast.Constant) and kind.value == "AmpOptimWrapper":
            dtype = fields.get("dtype")
            named = dtype.value if isinstance(dtype, ast.Constant) and isinstance(dtype.value, str) else ""
            found.append([node.lineno, None, "type='AmpOptimWrapper'",
                          "bfloat16" if "bf" in named else "float16" if not named or "16" in named else None])
    for statement in outline.tree.body:
        if isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == ["fp16"] \
                and isinstance(statement.value, (ast.Call, ast.Dict)):
            found.append([statement.lineno, None, "fp16 = dict(...)", "float16"])
    return sorted(found, key=lambda site: site[0])


def _guarding_test(outline: Outline, node: ast.AST) -> ast.expr | None:
    """The test of the outermost ``if`` of its function whose body holds ``node``: the switch a
    user turns (``if args.amp:``), the tests inside it being the script's own cases."""
    child, parent, test = node, outline.parents.get(id(node)), None
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if isinstance(parent, ast.If) and any(s is child for s in parent.body):
            test = parent.test
        child, parent = parent, outline.parents.get(id(parent))
    return test


def _dotted_name(expr: ast.expr) -> str:
    try:
        return ast.unparse(expr)
    except Exception:  # noqa: BLE001 - only a label
        return "?"


def _autocast_device(outline: Outline, call: ast.Call) -> str | None:
    api = next(iter(outline.qualified_names(call.func) & AUTOCAST))
    if api in AUTOCAST_DEVICE:
        return AUTOCAST_DEVICE[api]
    given = next((k.value for k in call.keywords if k.arg == "device_type"),
                 call.args[0] if call.args else None)
    return given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else None


@_per_project
def autocast_sites(root: Path) -> tuple[AutocastSite, ...]:
    """Every autocast call of the project that is not disabled by a literal ``enabled=False``
    or by a parameter that every call of its function sets False (``_switched_off``), in path
    order, then every key of its config files that turns mixed precision on
    (``switches.turns_on``: the framework that reads the file opens the region). A training
    script's switch that applies to whatever config it is given (``if args.amp:
    cfg.optim_wrapper.type = 'AmpOptimWrapper'``) comes first: a config sets it for one model."""
    found: list[AutocastSite] = []
    for count, path in enumerate(_python_files(root)):
        if count >= MAX_PROJECT_FILES:
            break
        data = _read(path)
        if data is None:
            continue
        if _may_hold_sites(data):
            summary = _summary(path)
            found.extend(AutocastSite(path, *site[:4], trains=_trained_where(root, path, site[5]) if len(site) > 5
                                      else None)
                         for site in (summary["sites"] if summary else ())
                         if len(site) < 5 or site[4] is None or not _switched_off(root, site[4]))
    for key in config_keys(root):  # a config file that turns it on for the framework that reads it
        on, dtype = turns_on(key)
        if on:
            found.append(AutocastSite(root / key.path, key.row, None, f"{'.'.join(key.key)}: {key.value}", dtype))
    return tuple(sorted(found, key=lambda site: not switched_setting(site)))


def switched_setting(site: AutocastSite) -> bool:
    """Whether a site is a setting a training script makes behind a switch (``if args.amp: ...``)."""
    return (site.setting or "").startswith(_SWITCHED)


def _may_hold_sites(data: bytes) -> bool:
    return b"autocast" in data or any(name in data for name in _CONSTRUCTED_SETTINGS) \
        or b"fp16" in data and _MMCV_FP16.search(data) is not None \
        or (any(name in data for name in _FRAMEWORK_WORDS) and _SETTING.search(data) is not None)


@dataclass(frozen=True)
class AutocastWrapper:
    """A project's own autocast: a function or method that returns an autocast context
    (``return torch.autocast(...)``, ``return accelerator.autocast()``), a ``@contextmanager``
    that yields inside one, a ``functools.partial`` of one, an alias, or a subclass of
    ``torch.autocast``; each may wrap another of the project's wrappers (resolved to a fixed
    point). ``name`` is how code calls it (``maybe_autocast(...)``, ``self.amp_context()``)."""
    path: Path
    row: int
    name: str
    device: str | None = None

    def where(self, root: Path) -> str:
        return f"{project_name(self.path, root)}:{self.row}"

    def shown_path(self) -> str:
        return relative_name(self.path, Path.cwd())


_CONTEXT_MANAGERS = frozenset({"contextlib.contextmanager", "contextlib.asynccontextmanager"})
_PARTIAL = frozenset({"functools.partial"})


def _top_level_names(root: Path) -> frozenset[str]:
    """The names the project's own modules are imported by, at their top (``mypkg`` for
    ``mypkg.utils``): its packages and modules at the root or below ``src/``, and the root's
    own name when the root is a package."""
    found = {root.name} if (root / "__init__.py").exists() else set()
    found.update(folder.name for folder in project_folders(root)[1:])
    for folder in (root, root / "src"):
        try:
            for entry in folder.iterdir():
                if entry.suffix == ".py":
                    found.add(entry.stem)
                elif entry.is_dir() and (entry / "__init__.py").exists():
                    found.add(entry.name)
        except OSError:
            continue
    return frozenset(found)


def _project_name(names: set[str], own: frozenset[str]) -> str | None:
    """The last part of a qualified name that one of the project's own modules defines."""
    return next((n.rsplit(".", 1)[-1] for n in names if "." in n and n.split(".", 1)[0] in own), None)


# What a module's code may make of autocast, before the project's wrappers are known: each
# "opener" is a list of alternatives, any of which opens a region (the branches of
# `autocast(...) if amp else nullcontext()`), tried in order. An alternative is
# ["torch", device] (torch's own autocast), ["always"] (a framework's `x.autocast()`),
# ["qualified", names] (a call of an imported name: a wrapper if one of the project's own
# modules defines it) or ["name", name] (a wrapper if the project has one by that name).
# Resolving them against the wrappers known so far (``_opens``) needs no parse.


def _alternatives(outline: Outline, expr: ast.expr | None) -> list[list]:
    """The alternatives by which ``expr`` may make an enabled autocast context."""
    if isinstance(expr, ast.IfExp):
        return _alternatives(outline, expr.body) + _alternatives(outline, expr.orelse)
    if not isinstance(expr, ast.Call):
        return []
    if any(k.arg == "enabled" and isinstance(k.value, ast.Constant) and k.value.value is False
           for k in expr.keywords):
        return []  # a float32 island, not a region
    names = outline.qualified_names(expr.func)
    if not names.isdisjoint(AUTOCAST):
        return [["torch", _autocast_device(outline, expr)]]
    if names:  # another library's function, or one of the project's own modules'
        return [["qualified", sorted(names)]]
    func = expr.func
    if isinstance(func, ast.Attribute):
        return [["always"]] if func.attr == "autocast" else [["name", func.attr]]
    return [["name", func.id]] if isinstance(func, ast.Name) else []


def _reference(outline: Outline, expr: ast.expr) -> list[list]:
    """The alternative by which ``expr`` (a base class, an aliased or partial callable) may
    name an autocast: as ``_alternatives``, for a name instead of a call."""
    names = outline.qualified_names(expr)
    if not names.isdisjoint(AUTOCAST):
        return [["torch", None]]
    if names:
        return [["qualified", sorted(names)]]
    return [["name", expr.id]] if isinstance(expr, ast.Name) else []


def _opens(alternatives: list[list], known: set[str], own: frozenset[str]) -> tuple[bool, str | None]:
    """Whether one of ``alternatives`` opens a region, given the wrappers ``known``; the
    device of the first that does, when torch's autocast names it."""
    for alternative in alternatives:
        kind = alternative[0]
        if kind == "torch":
            return True, alternative[1]
        if kind == "always" or (kind == "name" and alternative[1] in known) \
                or (kind == "qualified" and _project_name(set(alternative[1]), own) in known):
            return True, None
    return False, None


def _candidates_of(outline: Outline) -> dict[str, list]:
    """What in a module may be an autocast wrapper, as ``_wrappers_of`` resolves it:
    functions with the openers of their `return`s (and, for a ``@contextmanager``, of the
    `with` items around a `yield`), in the order of ``ast.walk`` over their bodies; classes
    with their bases; names assigned an alias or a ``functools.partial``."""
    functions = []
    returns = [r for r in outline.nodes(ast.Return) if _alternatives(outline, r.value)]
    for node in [*outline.nodes(ast.FunctionDef), *outline.nodes(ast.AsyncFunctionDef)]:
        if node.name.startswith("__"):
            continue
        managed = any(outline.qualified_names(d.func if isinstance(d, ast.Call) else d) & _CONTEXT_MANAGERS
                      for d in node.decorator_list)
        if not managed and not any(contains(node, r) for r in returns):
            continue
        body_nodes = [n for stmt in node.body for n in walk(stmt)]
        openers = [o for r in body_nodes if isinstance(r, ast.Return) for o in [_alternatives(outline, r.value)] if o]
        withs = [[_alternatives(outline, item.context_expr) for item in w.items] for w in body_nodes
                 if isinstance(w, (ast.With, ast.AsyncWith))
                 and any(isinstance(n, (ast.Yield, ast.YieldFrom)) for s in w.body for n in walk(s))] \
            if managed else []
        if openers or any(any(item) for w in withs for item in w):
            functions.append([node.name, node.lineno, openers, withs])
    classes = [[node.name, node.lineno, [a for b in node.bases for a in _reference(outline, b)]]
               for node in outline.nodes(ast.ClassDef)]
    aliases = []
    for node in outline.nodes(ast.Assign):
        value = node.value
        if isinstance(value, ast.Call) and not outline.qualified_names(value.func).isdisjoint(_PARTIAL) \
                and value.args:
            value = value.args[0]
        elif not isinstance(value, (ast.Name, ast.Attribute)):
            continue
        targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        reference = _reference(outline, value)
        if targets and reference:
            aliases.append([targets, node.lineno, reference])
    return {"functions": functions, "classes": [c for c in classes if c[2]], "aliases": aliases}


def _wrappers_of(path: Path, summary: dict, known: set[str], own: frozenset[str]) -> list[AutocastWrapper]:
    """The autocast wrappers a module defines, given the names of those already known."""
    found = []
    for name, row, openers, withs in summary["functions"]:
        if name in known:
            continue
        opened = next((device for o in openers for hit, device in [_opens(o, known, own)] if hit), False)
        if opened is False:
            opened = next((device for w in withs for item in w for hit, device in [_opens(item, known, own)] if hit),
                          False)
        if opened is not False:
            found.append(AutocastWrapper(path, row, name, opened))
    for name, row, bases in summary["classes"]:
        if name not in known and _opens(bases, known, own)[0]:
            found.append(AutocastWrapper(path, row, name))
    for targets, row, reference in summary["aliases"]:
        if _opens(reference, known, own)[0]:
            found.extend(AutocastWrapper(path, row, t) for t in targets if t not in known)
    return found


_DEF = re.compile(rb"\bdef\s+(\w+)\s*\(")


@_per_project
def autocast_wrappers(root: Path) -> tuple[AutocastWrapper, ...]:
    """The project's own autocast wrappers (``AutocastWrapper``), in path order. Files that
    mention ``autocast`` are read first, then those that mention a wrapper found, until no new
    one appears. A name counts only where every function or method the project defines by
    that name is a wrapper: a method ``context()`` that opens autocast in one class and does
    something else in another does not make every ``x.context()`` a region."""
    paths = list(_python_files(root))[:MAX_PROJECT_FILES]
    found: dict[str, list[AutocastWrapper]] = {}
    read: dict[Path, dict] = {}
    words: list[bytes] = [b"autocast"]
    own = _top_level_names(root)
    for _ in range(6):
        new: list[AutocastWrapper] = []
        for path in paths:
            if path not in read:
                data = _read(path)
                if data is None or not any(w in data for w in words):
                    continue
            summary = read[path] = read.get(path) or _summary(path)
            if summary is None:
                continue
            new.extend(w for w in _wrappers_of(path, summary, set(found), own) if w.name not in found)
        if not new:
            break
        for w in new:
            found.setdefault(w.name, []).append(w)
        words = [w.name.encode() for w in new]
    if not found:
        return ()
    # Names some function of a file never read (it mentions no autocast) also defines.
    ambiguous = set()
    for path in paths:
        data = None if path in read else _read(path)
        if data is not None and b"def " in data:
            ambiguous.update(m.decode() for m in _DEF.findall(data) if m.decode() in found)
    for path, summary in read.items():
        if summary is None:
            continue
        wrapped = {w.name for ws in found.values() for w in ws if w.path == path}
        ambiguous |= (set(summary["defs"]) & set(found)) - wrapped
    return tuple(sorted((w for name, ws in found.items() if name not in ambiguous for w in ws),
                        key=lambda w: (w.path, w.row)))


# Config files past this many are not read (a project that keeps data as JSON files).
MAX_CONFIG_FILES = 2_000
def flags_named(root: Path, dest: str) -> tuple[Flag, ...]:
    """The command-line flags the project's modules define (``switches.flags_in``) that set
    ``dest`` (``--amp`` for ``args.amp``); read once per name and run, from the modules that
    mention it."""
    key = (f"flags:{dest}", root)
    if key not in _FACTS:
        spellings = (dest.encode(), dest.replace("_", "-").encode())
        _FACTS[key] = tuple(
            f for path, tree in _parsed_where(root, lambda data: any(s in data for s in spellings)
                                              and may_define_flags(data))
            for f in flags_in(tree, project_name(path, root)) if f.dest == dest)
    return _FACTS[key]


def _parsed_where(root: Path, mentions: Callable[[bytes], bool]) -> Iterator[tuple[Path, ast.Module]]:
    """The project's modules whose bytes pass ``mentions`` (the first step of what is asked of
    them), parsed with Python's ``ast``; those that do not parse are left out."""
    for path in _python_files(root):
        data = _read(path)
        if data is None or not mentions(data):
            continue
        try:
            yield path, ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue


def modules_mentioning(root: Path, word: str) -> tuple[Path, ...]:
    """The project's modules whose text has ``word`` (a name a rule follows across modules)."""
    key = (f"mentions:{word}", root)
    if key not in _FACTS:
        encoded = word.encode()
        _FACTS[key] = tuple(path for path in _python_files(root)[:MAX_PROJECT_FILES]
                            if (data := _read(path)) is not None and encoded in data)
    return _FACTS[key]


def configs_mentioning(root: Path, word: str) -> tuple[Path, ...]:
    """The project's config files (``switches.CONFIG_SUFFIXES``) whose text has ``word``."""
    key = (f"config-mentions:{word}", root)
    if key not in _FACTS:
        encoded = word.encode()
        found = []
        for path in _files(root)[1][:MAX_CONFIG_FILES]:
            try:
                if path.stat().st_size <= MAX_CONFIG_BYTES and encoded in (_read(path) or b""):
                    found.append(path)
            except OSError:
                continue
        _FACTS[key] = tuple(found)
    return _FACTS[key]


def mentions_dependency(root: Path, word: str) -> Dependency:
    """Which modules mention ``word``, and their texts, as a summary a file's result depends on:
    a module that starts to mention it, or one that changes, checks the file again."""
    return dependency(f"mentions:{word}", root)


@_per_project
def config_keys(root: Path) -> tuple[ConfigKey, ...]:
    """The AMP keys of the project's config files (``switches.config_keys_in``), read as data."""
    keys: list[ConfigKey] = []
    for path in _files(root)[1][:MAX_CONFIG_FILES]:
        try:
            if path.stat().st_size > MAX_CONFIG_BYTES:
                continue
        except OSError:
            continue
        text = (_read(path) or b"").decode("utf-8", errors="replace")
        if may_hold_amp_key(text):
            keys += config_keys_in(text, project_name(path, root))
    return tuple(keys)


def wrapper_names(root: Path) -> frozenset[str]:
    return frozenset(w.name for w in autocast_wrappers(root))


def _module_file(root: Path, importer: Path, module: str | None, level: int) -> Path | None:
    """The project's file for ``from <level dots><module> import ...`` in ``importer``."""
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
    else:
        if not module:
            return None
        names = module.split(".")
        top = names[0]
        bases = [root, root / "src"]
        if (root / "__init__.py").exists():
            # The project is a package: the import names it by its folders, and those above it
            # where they are namespace packages (`megatron.core.utils` from `megatron/core`).
            bases = [root.parents[i] for i in range(min(len(names), len(root.parts) - 1))
                     if root.parts[len(root.parts) - 1 - i:] == tuple(names[:i + 1])] or bases
        folders = project_folders(root)
        if any(folder.name == top for folder in folders[1:]):
            bases = [root.parent]  # another top-level package of the distribution
        base = next((b for b in bases if (b / top).exists() or (b / f"{top}.py").exists()), None)
        if base is None:
            return None
    target = base.joinpath(*module.split(".")) if module else base
    for candidate in (target.with_name(target.name + ".py"), target / "__init__.py"):
        try:
            resolved = candidate.resolve() if candidate.is_file() else None
            if resolved is not None and any(resolved.is_relative_to(f.resolve()) for f in project_folders(root)):
                return candidate
        except OSError:
            continue
    return None


_STAR_BUSY: list[tuple[Path, Path]] = []  # the modules being read, outermost first
_STAR_DONE: dict[tuple[Path, Path], dict[str, frozenset[str]]] = {}
_STAR_CUT: list[int] = []  # depths at which a cycle was cut


def _star_bindings(root: Path, path: Path) -> dict[str, frozenset[str]]:
    """The names ``from <project module> import *`` binds, as imports: what that module's own
    top-level imports bind (and its star imports, in turn), limited to its literal
    ``__all__`` when it has one. Each module is read once (fastai's modules star-import each
    other: followed naively, the paths multiply); a module met again inside its own cycle adds
    nothing there, and what was read below a cut is not kept (the answer must not depend on
    which file a process checked first)."""
    key = (root, path)
    if key in _STAR_DONE:
        return _STAR_DONE[key]
    if key in _STAR_BUSY:
        _STAR_CUT.append(_STAR_BUSY.index(key))
        return {}
    depth = len(_STAR_BUSY)
    _STAR_BUSY.append(key)
    try:
        found = _read_star_bindings(root, path)
    finally:
        _STAR_BUSY.pop()
    if not any(cut < depth for cut in _STAR_CUT):  # nothing below was cut short by a module above
        _STAR_DONE[key] = found
    if not _STAR_BUSY:
        _STAR_CUT.clear()
    return found


def _read_star_bindings(root: Path, path: Path) -> dict[str, frozenset[str]]:
    outline = _outline_of(_read(path))
    if outline is None:
        return {}
    found: dict[str, set[str]] = {}
    exported = None
    for stmt in outline.tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets) \
                and isinstance(stmt.value, (ast.List, ast.Tuple)):
            exported = {e.value for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".")[0]
                found.setdefault(local, set()).add(alias.name if alias.asname else local)
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.names[0].name == "*":
                target = _module_file(root, path, stmt.module, stmt.level)
                if target is not None:
                    for name, qualified in _star_bindings(root, target).items():
                        found.setdefault(name, set()).update(qualified)
            elif stmt.module and not stmt.level:
                for alias in stmt.names:
                    found.setdefault(alias.asname or alias.name, set()).add(f"{stmt.module}.{alias.name}")
    return {name: frozenset(q) for name, q in found.items()
            if (exported is None and not name.startswith("_")) or (exported is not None and name in exported)}


@lru_cache(maxsize=4096)
def star_imports(root: Path, path: Path) -> dict[str, frozenset[str]]:
    """What the module-level ``from <project module> import *`` of the file at ``path`` bind,
    as imports (fastai's ``from .torch_imports import *`` binds ``nn`` to ``torch.nn``): the
    names one file's own imports cannot resolve."""
    outline = _outline_of(_read(path))
    found: dict[str, set[str]] = {}
    for stmt in outline.tree.body if outline is not None else ():
        if isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*":
            target = _module_file(root, path, stmt.module, stmt.level)
            if target is not None and target != path:
                for name, qualified in _star_bindings(root, target).items():
                    found.setdefault(name, set()).update(qualified)
    return {name: frozenset(q) for name, q in found.items()}


def project_function(root: Path, importer: Path, module: str | None, level: int, name: str
                     ) -> tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef | None] | None:
    """The project's module that ``importer`` imports as ``from <level dots><module> import
    name`` and its module-level function ``name`` (None: it defines none, it re-exports the
    name from elsewhere); None for another library's module."""
    path = _module_file(root, importer, module, level) if module or level else None
    if path is None:
        return None
    return path, _function(path, name)


def project_module(root: Path, importer: Path, module: str | None, level: int) -> Path | None:
    """The project's module that ``importer`` imports as ``from <level dots><module> import
    ...``; None for another library's module."""
    return _module_file(root, importer, module, level) if module or level else None


def module_text(path: Path) -> str | None:
    """A project module's text, read once per run; None when it cannot be read or decoded."""
    data = _read(path)
    try:
        return source_io.decode(data).text if data is not None else None
    except source_io.SourceError:
        return None


def module_dependency(root: Path, path: Path) -> Dependency:
    """A module of the project, its whole text, as a summary a file's result depends on."""
    return dependency(f"module:{project_name(path.resolve(), root.resolve())}", root)


def _function(path: Path, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    outline = _outline_of(_read(path))
    return next((s for s in outline.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and s.name == name), None) if outline is not None else None


def function_dependency(root: Path, path: Path, name: str) -> Dependency:
    """A module-level function of the project (``project_function``) as a summary a file's
    result depends on: its code and place (or that the module defines none)."""
    return dependency(f"function:{project_name(path.resolve(), root.resolve())}:{name}", root)


def _function_summary(root: Path, shown: str, name: str) -> object:
    found = _function(root.resolve() / shown, name)
    return ast.dump(found, include_attributes=True) if found is not None else None


def keyword_passes(root: Path, name: str) -> tuple[tuple[str, int], ...]:
    """Where a call in the project's modules passes ``name=...`` (a keyword argument), as
    (path from the root, row); read once per name and run."""
    key = (f"keyword:{name}", root)
    if key not in _FACTS:
        encoded = name.encode()
        word = re.compile(rb"\b" + re.escape(encoded) + rb"\s*=(?!=)")
        _FACTS[key] = tuple(
            (project_name(path, root), node.lineno)  # the plain word first: found far faster than the pattern
            for path, tree in _parsed_where(root, lambda data: encoded in data and word.search(data) is not None)
            for node in walk(tree) if isinstance(node, ast.Call) and any(k.arg == name for k in node.keywords))
    return _FACTS[key]


@dataclass(frozen=True)
class DtypeChoice:
    """A dtype a function of the project gives back (``dtype_choices``): where it is returned
    (path from the root, row), the dtype (None: ``return None``, the device's default), the
    test it is returned under, as code (None: always), and the function's parameters."""

    path: str
    row: int
    dtype: str | None
    when: str | None
    parameters: tuple[str, ...]


_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _returned_dtypes(outline: Outline, function: ast.AST) -> list[tuple[int, str | None, str | None]] | None:
    """(row, dtype, test) of each `return` of ``function`` (its own, not a nested function's),
    with the test of the innermost `if` around it (``not (...)`` in its `else`) or of a
    conditional expression; None when some `return` gives something else than a literal
    torch dtype or None (autocast's default), or none gives a dtype."""
    found: list[tuple[int, str | None, str | None]] = []

    def given(expr: ast.expr | None, row: int, test: str | None) -> bool:
        if isinstance(expr, ast.IfExp):
            return given(expr.body, row, ast.unparse(expr.test)) \
                and given(expr.orelse, row, f"not ({ast.unparse(expr.test)})")
        if isinstance(expr, ast.Constant) and expr.value is None:
            found.append((row, None, test))
            return True
        dtype = next((DTYPES[q] for q in outline.qualified_names(expr) if q in DTYPES), None) \
            if expr is not None else None
        if dtype is not None:
            found.append((row, dtype, test))
        return dtype is not None

    def visit(statements: list[ast.stmt], test: str | None) -> bool:
        for statement in statements:
            if isinstance(statement, ast.Return):
                if not given(statement.value, statement.lineno, test):
                    return False
            elif isinstance(statement, ast.If):
                if not (visit(statement.body, ast.unparse(statement.test))
                        and visit(statement.orelse, f"not ({ast.unparse(statement.test)})")):
                    return False
            elif not isinstance(statement, _NESTED_SCOPES):
                blocks = [getattr(statement, f, []) for f in ("body", "orelse", "finalbody")]
                blocks += [h.body for h in getattr(statement, "handlers", [])]
                blocks += [c.body for c in getattr(statement, "cases", [])]
                if not all(visit(b, test) for b in blocks):
                    return False
        return True

    return found if visit(function.body, None) and any(dtype for _, dtype, _ in found) else None


def dtype_choices(root: Path, name: str, attribute: bool) -> tuple[DtypeChoice, ...]:
    """The dtypes the project's functions named ``name`` give back where every `return` of
    each is a literal torch dtype or None (a config's property that maps a precision setting
    to a dtype, a ``get_dtype(...)`` helper): ``attribute``: read as an attribute, so properties
    only; else called, so functions and methods only. None at all when some function of that
    name gives something else: then the name says nothing of a dtype. Read once per name and run."""
    key = (f"dtype-choices:{name}:{attribute}", root)
    if key not in _FACTS:
        defined = re.compile(rb"\bdef\s+" + re.escape(name.encode()) + rb"\s*\(")
        found: list[DtypeChoice] | None = []
        encoded = name.encode()
        for path, tree in _parsed_where(root, lambda data: encoded in data and defined.search(data) is not None):
            outline = Outline(tree)
            for function in (*outline.nodes(ast.FunctionDef), *outline.nodes(ast.AsyncFunctionDef)):
                if function.name != name:
                    continue
                returned = _returned_dtypes(outline, function)
                is_property = any((dotted(d) or [""])[-1] in ("property", "cached_property")
                                  for d in function.decorator_list)
                if returned is None or is_property is not attribute:
                    found = None
                    break
                parameters = tuple(p.arg for p in named_parameters(function.args))
                found.extend(DtypeChoice(project_name(path, root), row, dtype, test, parameters)
                             for row, dtype, test in returned)
            if found is None:
                break
        _FACTS[key] = tuple(found or ())
    return _FACTS[key]


@_per_project
def scaler_states_saved(root: Path) -> tuple[tuple[str, int], ...]:
    """Where the project's modules take a GradScaler's state to save it, as (path from the
    root, row): ``X.state_dict()`` of something named like a scaler (``self.scaler``,
    ``trainer.grad_scaler``), or a dict key that names one (``"scaler": ...``)."""
    found = []
    for path, tree in _parsed_where(root, lambda data: b"scaler" in data.lower() and b"state_dict" in data):
        for node in walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "state_dict" \
                    and "scaler" in _dotted_name(node.func.value).lower():
                found.append((project_name(path, root), node.lineno))
            elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                    and "scaler" in k.value.lower() for k in node.keys):
                found.append((project_name(path, root), node.lineno))
    return tuple(found)


def keyword_dependency(root: Path, name: str) -> Dependency:
    return dependency(f"keyword:{name}", root)


class ProjectHints:
    """What the prefilter and the file's outline may ask of the project a checked file belongs
    to, asked lazily: the names of the project's autocast wrappers (a backward inside ``with
    amp_ctx():`` is inside autocast although the file never says ``autocast``), whether it
    passes a keyword somewhere, and what the file's star imports bring in. Each answer read is recorded as a ``Dependency`` (``read``),
    so a cached result that it decided stays valid only while the answer does."""

    def __init__(self, path: str | Path | None):
        self._path = path
        self.read: set[Dependency] = set()

    @property
    def path(self) -> str | Path | None:
        """The checked file's path (None for text that names no file)."""
        return self._path

    @property
    def root(self) -> Path | None:
        if "_root" not in self.__dict__:
            path = Path(self._path) if self._path is not None else None
            try:
                self.__dict__["_root"] = project_root(path) if path is not None and path.is_file() else None
            except OSError:
                self.__dict__["_root"] = None
        return self.__dict__["_root"]

    @property
    def wrapper_names(self) -> frozenset[str]:
        root = self.root
        if root is None:
            return frozenset()
        self.read.add(dependency("autocast-wrappers", root))
        return wrapper_names(root)

    def passes_any(self, names: tuple[str, ...]) -> bool:
        """Whether a call in the project passes one of ``names`` as a keyword (``keyword_passes``)."""
        root = self.root
        if root is None:
            return False
        for name in names:
            self.read.add(keyword_dependency(root, name))
            if keyword_passes(root, name):
                return True
        return False

    def star_imports(self) -> dict[str, frozenset[str]]:
        """``star_imports`` of the file (read from disk: the text checked is the file's)."""
        root = self.root
        if root is None:
            return {}
        path = Path(self._path).resolve()
        self.read.add(star_dependency(root, path))
        return star_imports(root, path)


@dataclass(frozen=True, order=True)
class Dependency:
    """A summary of a project's other files that a file's findings were computed from: its
    ``kind`` (``SUMMARIES``), the project's ``root`` and a digest of what it held then. A
    cached result stands only while every summary it read still has that digest."""
    kind: str
    root: str
    digest: str


def _sites_summary(root: Path) -> object:
    return [[s.path.as_posix(), s.row, s.device, s.setting, s.dtype,
             s.trains and [s.trains[0], s.trains[1].as_posix()]] for s in autocast_sites(root)]


def _requirement_summary(root: Path) -> object:
    required = declared_torch(root)
    return None if required is None else [required.floor, required.declared, required.source,
                                          required.ceiling, required.ceiling_inclusive]


def _wrappers_summary(root: Path) -> object:
    return [[w.path.as_posix(), w.row, w.name, w.device] for w in autocast_wrappers(root)]


SUMMARIES = {"autocast-sites": _sites_summary, "torch-requirement": _requirement_summary,
             "autocast-wrappers": _wrappers_summary,
             "config-keys": lambda root: [astuple(k) for k in config_keys(root)]}


def star_dependency(root: Path, path: Path) -> Dependency:
    """What a file's star imports of project modules bind, as a summary its result depends on."""
    return dependency(f"star-imports:{project_name(path, root.resolve())}", root)


def _star_summary(root: Path, shown: str) -> object:
    path = root.resolve() / shown
    return sorted((k, sorted(v)) for k, v in star_imports(root, path).items())


# Summaries other engine modules compute, by the prefix of their kind (``summary:`` for a
# function's, ``summaries.py``): a handler takes the root and the rest of the kind.
_PREFIXED: dict[str, Callable[[Path, str], object]] = {}


def summarized_by(prefix: str, handler: Callable[[Path, str], object]) -> None:
    """Let ``dependency`` compute kinds ``prefix:...`` with ``handler`` (an engine module that
    keeps its own summaries registers itself when imported)."""
    _PREFIXED[prefix] = handler


# Summaries read from files beyond the project's modules and config files (requirements files, an
# installed distribution's METADATA beside the root): their digests are never taken from a store.
_READ_BEYOND_FILES = frozenset({"torch-requirement"})


def _fingerprint(root: Path) -> str:
    """What every other summary of the project is computed from: the paths and contents of its
    modules and config files (of a config file the scans never read, its size)."""
    key = ("fingerprint", root)
    if key not in _FACTS:
        digest = hashlib.blake2b(digest_size=20)
        python, configs = _files(root)
        for index, path in enumerate(configs):
            try:
                size = path.stat().st_size
            except OSError:
                size = -1
            data = _read(path) if index < MAX_CONFIG_FILES and 0 <= size <= MAX_CONFIG_BYTES else None
            digest.update(f"{project_name(path, root)}\0{size}\0{-1 if data is None else len(data)}\0".encode())
            digest.update(data or b"")
        for path in python:
            data = _read(path)
            digest.update(f"{project_name(path, root)}\0{-1 if data is None else len(data)}\0".encode())
            digest.update(data or b"")
        _FACTS[key] = digest.hexdigest()
    return _FACTS[key]


def _stored(kind: str, root: Path) -> Path | None:
    """Where a run with a result cache keeps the digest of summary ``kind`` of the project as
    its files are now (``_fingerprint``), for a later run over the unchanged project."""
    if not _STORE or kind in _READ_BEYOND_FILES:
        return None
    folder, linter = _STORE[0]
    key = hashlib.sha256("\0".join((linter, str(root), _fingerprint(root), kind)).encode()).hexdigest()
    return folder / "project" / key[:2] / f"{key}.json"


def dependency(kind: str, root: Path) -> Dependency:
    """The summary ``kind`` of the project at ``root`` as it is now."""
    key = (f"dependency:{kind}", root)
    if key not in _FACTS:
        entry = _stored(kind, root)
        try:
            if entry is not None:
                _FACTS[key] = Dependency(kind, str(root), json.loads(entry.read_text(encoding="utf-8"))["digest"])
                return _FACTS[key]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if kind.startswith("star-imports:"):
            text = json.dumps(_star_summary(root, kind.split(":", 1)[1]))
        elif kind.startswith("module:"):
            text = module_text(root.resolve() / kind.split(":", 1)[1]) or ""
        elif kind.startswith("keyword:"):
            text = json.dumps(keyword_passes(root, kind.split(":", 1)[1]))
        elif kind.startswith("dtype-choices:"):
            name, attribute = kind.split(":")[1:]
            text = json.dumps([astuple(c) for c in dtype_choices(root, name, attribute == "True")])
        elif kind.startswith("flags:"):
            text = json.dumps([astuple(f) for f in flags_named(root, kind.split(":", 1)[1])])
        elif kind.split(":", 1)[0] in _PREFIXED:
            text = json.dumps(_PREFIXED[kind.split(":", 1)[0]](root, kind.split(":", 1)[1]), default=str)
        elif kind.startswith("mentions:"):
            word = kind.split(":", 1)[1]
            text = json.dumps([[project_name(path, root), hashlib.sha256(_read(path) or b"").hexdigest()]
                               for path in modules_mentioning(root, word)]
                              + [project_name(path, root) for path in configs_mentioning(root, word)])
        elif kind == "scaler-states":  # read only when a rule asks: not among the SUMMARIES handed over
            text = json.dumps(scaler_states_saved(root))
        elif kind.startswith("function:"):
            text = json.dumps(_function_summary(root, *kind.split(":", 1)[1].rsplit(":", 1)))
        else:
            text = json.dumps(SUMMARIES[kind](root))
        _FACTS[key] = Dependency(kind, str(root), hashlib.sha256(text.encode()).hexdigest())
        if entry is not None:
            source_io.write_entry(entry, {"digest": _FACTS[key].digest})
    return _FACTS[key]


def projects_of(paths: Iterable[str | Path], real_folders: dict[str, str] | None = None
                ) -> tuple[list[Path | None], list[Path]]:
    """The project of each of ``paths`` (None: none), as ``project_root`` finds it, asked once
    per folder (``real_folders``: folders, as the paths name them, with their symlinks
    resolved, where known); and the projects, those with the most of ``paths`` first."""
    real_folders = real_folders or {}
    folders: dict[str, Path | None] = {}
    found = []
    for path in paths:
        folder = os.path.dirname(path)
        if folder not in folders:
            real = real_folders.get(folder) or os.path.realpath(os.path.dirname(os.path.abspath(path)))
            folders[folder] = _folder_root(Path(real))
        found.append(folders[folder])
    return found, [root for root, _ in Counter(r for r in found if r is not None).most_common()]


def project_facts(root: Path) -> dict[tuple[str, Path], object]:
    """Every answer the checks of a project's files may ask of it, read now: handed with its
    files to the processes that check them (``adopt``), so that one reading serves them all."""
    for kind in SUMMARIES:
        dependency(kind, root)
    return {key: value for key, value in _FACTS.items() if key[1] == root}


def adopt(facts: dict[tuple[str, Path], object]) -> None:
    """Take answers another process read (``project_facts``) as this run's."""
    _FACTS.update(facts)


def forget() -> None:
    """Read the project's files again when next asked: a new run sees them as they are now."""
    _files.cache_clear()
    _BYTES.clear()
    _SEEN.clear()
    _SUMMARIES.clear()
    _PARSED.clear()
    Outline.forget_kept()
    _STORE.clear()
    _FACTS.clear()
    _NAMED.clear()
    _folder_root.cache_clear()
    project_folders.cache_clear()
    torch_requirement.top_level_names.cache_clear()
    _holds_distributions.cache_clear()
    _nearest_marked.cache_clear()
    _outermost_package.cache_clear()
    _marked.cache_clear()
    _package.cache_clear()
    star_imports.cache_clear()
    _STAR_DONE.clear()
    declared_torch.cache_clear()
