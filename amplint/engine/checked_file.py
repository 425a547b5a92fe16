"""What a check of one file may ask apart from its tree (``ast_context.AstContext`` adds what
the tree says): the file's path and text, positions by offset, the op-policy tables, and the
facts of the project it belongs to (``project_index``), each answer recorded as a
``Dependency`` of the file's findings."""

from __future__ import annotations

import bisect
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .diagnostics import Diagnostic, Fix, Location, Related
from .project_index import (
    AutocastSite,
    AutocastWrapper,
    Dependency,
    DtypeChoice,
    autocast_sites,
    autocast_wrappers,
    config_keys,
    dependency,
    dtype_choices,
    flags_named,
    keyword_dependency,
    keyword_passes,
    mentions_dependency,
    module_dependency,
    modules_mentioning,
    module_text,
    project_module,
    project_root,
    scaler_states_saved,
)
from .source import split_lines
from .torch_requirement import TorchRequirement, declared_torch

if TYPE_CHECKING:
    from ..policy import PolicyLoader, PolicyTable
    from .outline import Outline
    from .rule import Rule
    from .switches import ConfigKey, Flag


class CheckedFile:
    """One file being checked, as every rule sees it whatever tree it reads."""

    def __init__(self, path: str, source: str, policy_loader: "PolicyLoader | None" = None, preview: bool = False,
                 outline: "Outline | None" = None):
        self.path = path
        self.source = source
        self.outline = outline  # the file as Python's ast sees it, where it was parsed so
        self.preview = preview  # whether findings on preview paths are reported
        self.policy_loader = policy_loader
        self.diagnostics: list[Diagnostic] = []
        self._rule: type[Rule] | None = None
        self.dependencies: set[Dependency] = set()  # what of the project's other files was read

    @cached_property
    def _line_starts(self) -> list[int]:
        starts, offset = [0], 0
        for line in split_lines(self.source, keepends=True):
            offset += len(line)
            starts.append(offset)
        return starts

    def location(self, offset: int) -> Location:
        row = bisect.bisect_right(self._line_starts, offset) - 1
        return Location(row + 1, offset - self._line_starts[row] + 1)

    def policy(self, device: str | None = None) -> "PolicyTable":
        """The op-policy table for ``device`` (default: the configured device)."""
        if self.policy_loader is None:
            raise RuntimeError("this run has no policy tables")
        return self.policy_loader(device)

    @cached_property
    def _project_root(self) -> Path | None:

        path = Path(self.path)
        return project_root(path) if path.is_file() else None

    def project_source(self, module: str | None, level: int) -> tuple[Path, str] | None:
        """The path and text of the module of this file's project that ``from <level
        dots><module> import ...`` reads here; None for another library's module, this file
        itself, or one that cannot be read. The file's findings then depend on that text."""
        root = self._project_root
        if root is None:
            return None
        path = project_module(root, Path(self.path), module, level)
        if path is None or path.resolve() == Path(self.path).resolve():
            return None
        self.dependencies.add(module_dependency(root, path))
        text = module_text(path)
        return None if text is None else (path.resolve(), text)

    def project(self) -> "tuple[Path, tuple[AutocastSite, ...]] | None":
        """The root of the project this file belongs to and the autocast calls in its files
        (``project_index``); None for a file that is not on disk or in no project. The file's
        findings then depend on those calls: its cached result stands while they stay."""

        root = self._project_root
        if root is None:
            return None
        self.dependencies.add(dependency("autocast-sites", root))
        return root, autocast_sites(root)

    def autocast_wrappers(self) -> "dict[str, list[AutocastWrapper]]":
        """The project's own autocast wrappers (``project_index.autocast_wrappers``) by the
        name code calls them by; empty for a file that is not on disk or in no project. The
        file's findings then depend on them."""
        if "_wrappers" not in self.__dict__:

            found: dict = {}
            root = self._project_root
            if root is not None:
                self.dependencies.add(dependency("autocast-wrappers", root))
                for wrapper in autocast_wrappers(root):
                    found.setdefault(wrapper.name, []).append(wrapper)
            self.__dict__["_wrappers"] = found
        return self.__dict__["_wrappers"]

    def flags_named(self, dest: str) -> "tuple[Flag, ...]":
        """The command-line flags of this file's project that set ``dest`` (``project_index``);
        none for a file that is not on disk or in no project. The file's findings then depend
        on them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(dependency(f"flags:{dest}", root))
        return flags_named(root, dest)

    def dtype_choices(self, name: str, attribute: bool) -> "tuple[DtypeChoice, ...]":
        """The dtypes the project's functions (``attribute``: properties) named ``name`` give
        back (``project_index.dtype_choices``); none for a file that is not on disk or in no
        project. The file's findings then depend on them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(dependency(f"dtype-choices:{name}:{attribute}", root))
        return dtype_choices(root, name, attribute)

    def project_mentions(self, word: str) -> "tuple[Path, ...]":
        """The modules of this file's project whose text has ``word`` (``project_index``); none
        for a file that is not on disk or in no project. The file's findings then depend on them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(mentions_dependency(root, word))
        return modules_mentioning(root, word)

    def keyword_passes(self, name: str) -> tuple[tuple[str, int], ...]:
        """Where a call in this file's project passes ``name=...`` (``project_index``); none
        for a file that is not on disk or in no project. The file's findings then depend on
        them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(keyword_dependency(root, name))
        return keyword_passes(root, name)

    def config_keys(self) -> "tuple[ConfigKey, ...]":
        """The AMP keys of the config files of this file's project (``project_index``); none
        for a file that is not on disk or in no project. The file's findings then depend on
        them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(dependency("config-keys", root))
        return config_keys(root)

    def scaler_states_saved(self) -> tuple[tuple[str, int], ...]:
        """Where this file's project takes a GradScaler's state to save it (``project_index``);
        none for a file that is not on disk or in no project. The file's findings then depend
        on them."""
        root = self._project_root
        if root is None:
            return ()
        self.dependencies.add(dependency("scaler-states", root))
        return scaler_states_saved(root)

    def project_root(self) -> Path | None:
        """The root of this file's project (``project_index.project_root``)."""
        return self._project_root

    def torch_requirement(self, without_floor: bool = False) -> "TorchRequirement | None":
        """The torch the project of this file declares it supports (``torch_requirement``),
        when the configuration names no ``torch-version`` (which takes precedence); None then,
        for a file that is not on disk or in no project, or one that declares no lower bound
        (``without_floor``: one that declares neither a lower nor an upper bound; a requirement
        with only a ceiling, ``torch<2.4``, then comes with its ``floor`` None).
        The file's findings then depend on that declaration."""

        if self.policy_loader is None or self.policy_loader.torch_version is not None:
            return None
        root = self._project_root
        if root is None:
            return None
        self.dependencies.add(dependency("torch-requirement", root))
        required = declared_torch(root)
        return required if required is None or without_floor or required.floor is not None else None

    def _add(self, start: int, end: int, message: str, fix: Fix | None, related: tuple[Related, ...],
             preview: bool) -> None:
        """A finding of the running rule from offset ``start`` to ``end``. ``preview``: it rests
        on a path of the rule whose triaged precision is below the bar, and is reported only in
        preview mode."""
        if preview and not self.preview:
            return
        rule = self._rule
        self.diagnostics.append(Diagnostic(
            code=rule.code, name=rule.name, message=message, path=self.path,
            location=self.location(start), end_location=self.location(end), fix=fix,
            url=rule.url(),
            edit_locations=[(self.location(e.start), self.location(e.end), e.content)
                            for e in (fix.edits if fix else ())],
            related=related))
