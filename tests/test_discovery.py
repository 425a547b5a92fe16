"""Discovery asks a folder's exclusions once for all its entries (``Config.excluded_names``):
the answers must be those of ``Config.is_excluded`` asked of each path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amplint.engine.config import Config
from amplint.engine.project_index import DEFAULT_EXCLUDE

TREE = [
    "src/pkg/__init__.py", "src/pkg/train.py", "src/pkg/generated/model_pb2.py", "src/pkg/legacy/old.py",
    "src/pkg/legacy/deep/older.py", "src/build/out.py", "build/lib/x.py", ".venv/lib/site.py",
    "docs/conf.py", "tests/test_train.py", "tests/data/sample.py", "notebooks/run.ipynb",
]

PATTERNS = [
    [],  # the defaults only
    ["generated", "*_pb2.py"],
    ["src/pkg/legacy"],
    ["src/pkg/legacy/"],
    ["tests/data/*", "docs"],
    ["*.ipynb", "deep"],
]


@pytest.mark.parametrize("extend", PATTERNS)
@pytest.mark.parametrize("checked_from", ["root", "outside"])
def test_excluded_names_answers_as_is_excluded(tmp_path, monkeypatch, extend, checked_from):
    root = tmp_path / "project"
    for name in TREE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("import torch\n")
    config = Config(root=root if checked_from == "root" else tmp_path / "elsewhere",
                    exclude=list(DEFAULT_EXCLUDE), extend_exclude=extend)
    monkeypatch.chdir(root)
    asked = 0
    for folder, dirs, files in os.walk("."):
        here = Path(folder)
        names = dirs + files
        expected = {n for n in names if config.is_excluded(here / n)}
        assert config.excluded_names(here, names) == expected, (folder, extend)
        asked += len(names)
    assert asked >= len(TREE)


def test_a_pattern_reaches_every_file_below_an_excluded_folder(tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "src/pkg/legacy/deep").mkdir(parents=True)
    monkeypatch.chdir(root)
    config = Config(root=root, extend_exclude=["src/pkg/legacy"])
    assert config.excluded_names(Path("src/pkg/legacy/deep"), ["a.py", "b.py"]) == {"a.py", "b.py"}
    assert config.excluded_names(Path("src/pkg"), ["legacy", "train.py"]) == {"legacy"}


def test_walked_folders_resolve_as_the_system_resolves_them(tmp_path, monkeypatch):
    """Discovery resolves each walked folder from the resolved top (os.walk enters no
    symlinked folder): the paths it hands on are those ``os.path.realpath`` gives, through a
    symlinked top, a relative top and ``..``; a project found through them is the same, and
    the exclusions read relative to a root that is itself reached through a symlink."""
    from amplint.engine.config import Resolver
    from amplint.engine.discovery import python_files
    from amplint.engine.project_index import forget, projects_of

    real = tmp_path / "real"
    for name in TREE:
        (real / name).parent.mkdir(parents=True, exist_ok=True)
        (real / name).write_text("import torch\n")
    (real / "pyproject.toml").write_text('[project]\nname = "p"\n\n[tool.amplint]\nextend-exclude = ["docs"]\n')
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    (real / "src/pkg/linked").symlink_to(real / "build", target_is_directory=True)  # not entered
    monkeypatch.chdir(tmp_path / "link" / "src")
    forget()
    expected = sorted(os.path.relpath(p, real) for p in python_files([real], Resolver()))
    assert "src/pkg/train.py" in expected and "docs/conf.py" not in expected  # the project's table
    for top in (Path("../../link"), Path(".."), tmp_path / "link"):
        folders: dict[str, str] = {}
        found = list(python_files([top], Resolver(), None, False, folders))
        assert folders and all(os.path.realpath(f) == r for f, r in folders.items())
        assert sorted(os.path.relpath(p, top) for p in found) == expected
        roots, ordered = projects_of(found, folders)
        assert ordered == [real] and set(roots) == {real}
