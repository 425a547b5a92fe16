"""The result cache: warm runs parse nothing, answers are identical, bad entries are ignored."""

import textwrap
from pathlib import Path

import pytest

from amplint.engine import project
from amplint.engine.config import Config
from amplint.engine.rule import all_rules

FAULTY = textwrap.dedent("""\
    import torch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).mean()
        loss.backward()
""")


def _run(root: Path, **options):
    config = Config(root=root)
    return project.check_paths([root], config, list(all_rules()), project.Options(**options))


@pytest.fixture
def tree(tmp_path):
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(FAULTY)
    return tmp_path


def _seen(report):
    return [(d.path, d.code, d.location, d.fix) for d in report.diagnostics]


def test_warm_run_parses_nothing_and_answers_the_same(tree, monkeypatch):
    cold = _run(tree)
    assert (tree / ".amplint_cache" / ".gitignore").read_text() == "*\n"

    def no_linting(*args, **kwargs):
        raise AssertionError("an unchanged file was linted again")

    monkeypatch.setattr(project, "lint_source", no_linting)
    assert _seen(_run(tree)) == _seen(cold)


def test_changed_file_and_other_rules_miss_the_cache(tree):
    cold = _run(tree)
    (tree / "m0.py").write_text(FAULTY.replace("loss.backward()", "pass"))
    warm = _run(tree)
    assert len(warm.diagnostics) == len(cold.diagnostics) - 1
    config = Config(root=tree)
    only_amp002 = project.check_paths([tree], config, [r for r in all_rules() if r.code == "AMP002"],
                                      project.Options())
    assert only_amp002.diagnostics == []


def test_another_linter_code_misses_the_cache(tree, monkeypatch):
    """Same version, other code (a fixed rule in a new pre-commit rev): nothing is reused."""
    from amplint.engine import cache

    cold = _run(tree)
    linted = []
    real = project.lint_source
    monkeypatch.setattr(project, "lint_source", lambda *a, **k: linted.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(cache, "_linter_digest", lambda: "another amplint")
    assert _seen(_run(tree)) == _seen(cold)
    assert linted  # the three files share one content: linted once, then from the new entry


def test_corrupt_entries_are_ignored_and_rewritten(tree):
    cold = _run(tree)
    for entry in (tree / ".amplint_cache").rglob("*.json"):
        entry.write_text('[{"code": "AMP00')
    assert _seen(_run(tree)) == _seen(cold)
    assert _seen(_run(tree)) == _seen(cold)


def test_no_cache_and_clean(tree, run_amplint):
    result = run_amplint("check", "--no-cache", ".", cwd=tree)
    assert result.returncode == 1 and not (tree / ".amplint_cache").exists()
    run_amplint("check", ".", cwd=tree)
    assert (tree / ".amplint_cache").is_dir()
    assert run_amplint("clean", cwd=tree).returncode == 0
    assert not (tree / ".amplint_cache").exists()
