"""Jupyter notebooks through the real CLI: findings placed in cells, folder scans, --fix and
--diff writing back only the changed cells, JSON fields, IPython syntax, noqa, the cache, and
files that are not notebooks.

The notebooks are written here the way Jupyter writes them (``json.dumps(nb, indent=1,
ensure_ascii=False)`` and a newline), from realistic cells: the fixture
``fixtures/faulty/train_amp.py`` split into cells, with a markdown cell, a cell of magics and
cells that carry outputs."""

import hashlib
import json
import os
import stat
import subprocess

import pytest
from click.testing import CliRunner

from amplint.cli import main
from conftest import ROOT

FAULTY = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()


def _code(text, outputs=(), execution_count=None, metadata=None):
    return {"cell_type": "code", "execution_count": execution_count,
            "id": hashlib.sha256(text.encode()).hexdigest()[:8],
            "metadata": metadata or {}, "outputs": list(outputs), "source": text.splitlines(keepends=True)}


def _markdown(text):
    return {"cell_type": "markdown", "id": "md", "metadata": {}, "source": text.splitlines(keepends=True)}


def _notebook(cells, language="python"):
    return {"cells": cells,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": language,
                                        "name": "python3"},
                         "language_info": {"codemirror_mode": {"name": "ipython", "version": 3},
                                           "file_extension": ".py", "name": language, "version": "3.11.4"}},
            "nbformat": 4, "nbformat_minor": 5}


def _dumps(nb):
    """As Jupyter (nbformat) writes a notebook."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _chunks(text):
    """The fixture's top-level statements grouped into cells, as someone pasting it into a
    notebook would: a new cell at each top-level def, decorator or `if`; trailing blank lines
    dropped, and no final newline (as Jupyter stores a cell)."""
    lines = text.splitlines(keepends=True)
    starts = [0] + [i for i, line in enumerate(lines) if line.startswith(("def ", "@", "if "))
                    and not lines[i - 1].startswith("@")]
    ends = starts[1:] + [len(lines)]
    return ["".join(lines[a:b]).rstrip("\n") for a, b in zip(starts, ends)]


STREAM = {"name": "stdout", "output_type": "stream", "text": ["epoch 0: loss 2.3012 acc 0.112\n",
                                                              "epoch 1: loss 1.8821 acc 0.351\n"]}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
PLOT = {"data": {"image/png": PNG,
                 "text/plain": ["<Figure size 640x480 with 1 Axes>"]},
        "metadata": {"needs_background": "light"}, "output_type": "display_data"}
MAGICS = "%load_ext autoreload\n%autoreload 2\n!nvidia-smi --query-gpu=name --format=csv"


def _training_notebook():
    """(notebook, the cells that hold the fixture's code (numbers), the fixture's code as a
    .py file made of exactly those cells)."""
    chunks = _chunks(FAULTY)
    cells = [_markdown("# Image classifier\n\nMixed-precision training of `ResNetLite` (é, 日本).\n"),
             _code(MAGICS, execution_count=1)]
    numbers = []
    for i, chunk in enumerate(chunks):
        outputs = [STREAM, PLOT] if chunk.startswith("if ") else []
        cells.append(_code(chunk, outputs=outputs, execution_count=i + 2 if outputs else None,
                           metadata={"tags": ["train"]} if "train_one_epoch" in chunk else None))
        numbers.append(len(cells))
        if i == 1:
            cells.append({"cell_type": "raw", "id": "raw", "metadata": {}, "source": ["raw text"]})
    return _notebook(cells), numbers, "".join(chunk + "\n" for chunk in chunks)


def _cell_of_row(numbers, chunks_text, row):
    """Where row ``row`` of the .py made of the cells lies: (cell number, row in the cell)."""
    first = 1
    for number, chunk in zip(numbers, chunks_text):
        count = len(chunk.splitlines())
        if row < first + count:
            return number, row - first + 1
        first += count
    raise AssertionError(row)


def _invoke(*args, input=None):
    return CliRunner().invoke(main, ["check", "--preview", "--no-cache", *args], input=input)


@pytest.fixture
def training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb, numbers, as_py = _training_notebook()
    (tmp_path / "train.ipynb").write_text(_dumps(nb), encoding="utf-8")
    (tmp_path / "same_cells.py").write_text(as_py, encoding="utf-8")
    return tmp_path, nb, numbers


def test_findings_are_placed_in_their_cells(training):
    tmp_path, nb, numbers = training
    py = json.loads(_invoke("--output-format", "json", "same_cells.py").stdout)
    result = _invoke("--output-format", "json", "train.ipynb")
    assert result.exit_code == 1
    found = json.loads(result.stdout)
    assert [d["code"] for d in found] == [d["code"] for d in py] == ["AMP004", "AMP001", "AMP002", "AMP004"]
    chunks = _chunks(FAULTY)
    for d, p in zip(found, py):
        cell, row = _cell_of_row(numbers, chunks, p["location"]["row"])
        assert (d["cell"], d["location"]["row"], d["location"]["column"]) == (cell, row, p["location"]["column"])
        assert d["noqa_row"] == row
        end_cell, end_row = _cell_of_row(numbers, chunks, p["end_location"]["row"])
        assert (end_cell, d["end_location"]) == (cell, {"row": end_row, "column": p["end_location"]["column"]})
    # the clip in train_one_epoch (cell 6): its message names the backward's row in that cell
    clip = found[2]
    assert clip["cell"] == 6 and "`scaler.scale(...).backward()` on line 12;" in clip["message"]
    assert nb["cells"][5]["source"][11].strip() == "scaler.scale(loss).backward()"

    text = _invoke("train.ipynb")
    assert text.stdout.startswith("train.ipynb:cell 6:9:14: AMP004 `torch.cuda.amp.autocast` is deprecated")
    # the snippet shows the cell's own rows
    assert " 9 |         with torch.cuda.amp.autocast():\n" in text.stdout
    assert "12 |             scaler.scale(loss).backward()\n" in text.stdout
    concise = _invoke("--output-format", "concise", "train.ipynb").stdout.splitlines()
    assert [line.split(": ")[0] for line in concise] == [
        "train.ipynb:cell 6:9:14", "train.ipynb:cell 6:12:13", "train.ipynb:cell 6:15:9", "train.ipynb:cell 8:6:14"]


def test_json_fields_of_notebook_and_python_findings(training):
    tmp_path, _, _ = training
    data = json.loads(_invoke("--output-format", "json", "train.ipynb", "same_cells.py").stdout)
    notebook = [d for d in data if d["filename"] == "train.ipynb"]
    python = [d for d in data if d["filename"] == "same_cells.py"]
    assert len(notebook) == len(python) == 4
    # a .py finding keeps exactly the fields it had; a notebook's adds "cell"
    assert all(set(d) == {"code", "name", "message", "filename", "location", "end_location", "fix",
                          "noqa_row", "url"} for d in python)
    assert all(set(d) == {"code", "name", "message", "filename", "cell", "location", "end_location", "fix",
                          "noqa_row", "url"} for d in notebook)
    for d in notebook:
        for edit in d["fix"]["edits"]:
            assert set(edit) == {"content", "location", "end_location", "cell"}
    first = notebook[0]
    assert first["fix"]["edits"] == [{"content": 'torch.amp.autocast("cuda")', "location": {"row": 9, "column": 14},
                                      "end_location": {"row": 9, "column": 39}, "cell": 6}]
    assert all("cell" not in edit for d in python for edit in d["fix"]["edits"])


def test_sarif_and_github_name_the_cell(training):
    sarif = json.loads(_invoke("--output-format", "sarif", "train.ipynb").stdout)
    first = sarif["runs"][0]["results"][0]
    assert first["properties"] == {"cell": 6}
    assert first["message"]["text"].startswith("cell 6: `torch.cuda.amp.autocast` is deprecated")
    assert first["locations"][0]["physicalLocation"]["region"]["startLine"] == 9
    github = _invoke("--output-format", "github", "train.ipynb").stdout.splitlines()
    assert github[0].startswith("::error title=amplint (AMP004),file=train.ipynb,line=9,col=14,")
    assert "::AMP004 cell 6: `torch.cuda.amp.autocast` is deprecated" in github[0]


def test_fix_rewrites_only_the_changed_cells_and_keeps_every_other_byte(training):
    tmp_path, nb, numbers = training
    path = tmp_path / "train.ipynb"
    os.chmod(path, 0o640)
    result = _invoke("--fix", "train.ipynb")
    assert result.exit_code == 0, result.output
    assert "Fixed 4 findings in 1 file." in result.stderr
    after_bytes = path.read_bytes()
    after = json.loads(after_bytes)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640

    # The same fixes as on the .py made of the same cells.
    assert _invoke("--fix", "same_cells.py").exit_code == 0
    fixed_py = (tmp_path / "same_cells.py").read_text()
    assert "".join("".join(after["cells"][n - 1]["source"]) + "\n" for n in numbers) == fixed_py
    changed = [n for n in range(1, len(nb["cells"]) + 1) if after["cells"][n - 1] != nb["cells"][n - 1]]
    assert changed == [6, 8]  # train_one_epoch, main: no other cell touched
    for n in changed:
        lines = after["cells"][n - 1]["source"]
        assert all(line.endswith("\n") for line in lines[:-1]) and not lines[-1].endswith("\n")
    assert 'with torch.amp.autocast("cuda"):' in "".join(after["cells"][5]["source"])
    assert "scaler.unscale_(optimizer)" in "".join(after["cells"][5]["source"])

    # Byte for byte: the notebook as Jupyter writes it with only those cells' source replaced
    # (so outputs, metadata, markdown and raw cells, indentation, key order and the final
    # newline are as they were).
    expected = json.loads(json.dumps(nb))
    for n in changed:
        expected["cells"][n - 1]["source"] = after["cells"][n - 1]["source"]
    assert after_bytes.decode("utf-8") == _dumps(expected)
    assert after["cells"][-1]["outputs"] == [STREAM, PLOT] and after["metadata"] == nb["metadata"]
    assert _invoke("train.ipynb").exit_code == 0  # nothing left


def test_diff_shows_the_changed_cells_and_writes_nothing(training):
    tmp_path, _, _ = training
    before = (tmp_path / "train.ipynb").read_bytes()
    result = _invoke("--diff", "train.ipynb")
    assert result.exit_code == 1
    assert (tmp_path / "train.ipynb").read_bytes() == before
    headers = [line for line in result.stdout.splitlines() if line.startswith(("--- ", "+++ "))]
    assert headers == ["--- a/train.ipynb:cell 6", "+++ b/train.ipynb:cell 6",
                       "--- a/train.ipynb:cell 8", "+++ b/train.ipynb:cell 8"]
    assert "+        with torch.amp.autocast(\"cuda\"):\n" in result.stdout
    assert "Would fix 4 findings in 1 file." in result.stderr


MAGIC_CELL = """\
def step(model, x, scaler, opt):
    with torch.autocast("cuda"):
        loss = model(x).mean()
        scaler.scale(loss).backward()
        %time torch.cuda.synchronize()
    scaler.step(opt)
    scaler.update()"""


def test_a_fix_that_would_touch_a_magic_line_is_not_applied(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = [_code("import torch\nfrom torch.cuda.amp import GradScaler\n%matplotlib inline"),
             _code("scaler = GradScaler()\nfiles = !ls data/\nlogits?"),
             _code(MAGIC_CELL),
             _code("%%bash\nnvidia-smi\n"),
             _code("%%time\nprobs = torch.log(torch.softmax(torch.randn(8, 4), dim=-1))", outputs=[STREAM])]
    nb = _notebook(cells)
    path = tmp_path / "magic.ipynb"
    path.write_text(_dumps(nb), encoding="utf-8")
    before = json.loads(_invoke("--output-format", "json", "magic.ipynb").stdout)
    assert [(d["code"], d["cell"], d["location"]["row"]) for d in before] == [
        ("AMP004", 1, 2), ("AMP001", 3, 4), ("AMP013", 5, 2)]
    assert "used at line 1 of cell 2" in before[0]["message"]

    result = _invoke("--fix", "--output-format", "concise", "magic.ipynb")
    assert result.exit_code == 1
    # The backward would move out of the region with the magic after it: left as it was.
    assert result.stdout.startswith("magic.ipynb:cell 3:4:9: AMP001 ")
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after["cells"][2] == nb["cells"][2] and after["cells"][3] == nb["cells"][3]
    # The other fixes are applied, the import's in two cells; the magic lines stay.
    assert after["cells"][0]["source"] == ["import torch\n", "from torch.amp import GradScaler\n", "%matplotlib inline"]
    assert after["cells"][1]["source"] == ['scaler = GradScaler("cuda")\n', "files = !ls data/\n", "logits?"]
    assert after["cells"][4]["source"] == ["%%time\n", "probs = torch.log_softmax(torch.randn(8, 4), dim=-1)"]
    assert after["cells"][4]["outputs"] == [STREAM]


def test_noqa_in_cells_suppresses_its_own_cells_row_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log_softmax = "torch.log(torch.softmax(x, dim=-1))"
    cells = [_code(f"import torch\nx = torch.randn(4)\ny = {log_softmax}  # noqa: AMP013"),
             _markdown("Row 3 of the next cell has no noqa."),
             _code(f"z = 1\nw = 2\ny = {log_softmax}"),
             _code(f"y = {log_softmax}  # noqa")]
    (tmp_path / "noqa.ipynb").write_text(_dumps(_notebook(cells)), encoding="utf-8")
    result = _invoke("--output-format", "concise", "noqa.ipynb")
    assert result.stdout.splitlines() == [
        "noqa.ipynb:cell 3:3:5: AMP013 log of softmax underflows to -inf in half precision: use log_softmax "
        "[*] Use log_softmax"]


def test_folder_scans_find_notebooks_minus_excluded_and_git_ignored(run_amplint, tmp_path):
    nb, _, _ = _training_notebook()
    for name in ("notebooks/train.ipynb", "notebooks/scratch/old.ipynb", "generated/train.ipynb"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(_dumps(nb), encoding="utf-8")
    (tmp_path / "notebooks" / "README.md").write_text("not checked\n")
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nextend-exclude = ["generated"]\n')
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("scratch/\n")
    result = run_amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert {line.split(":")[0] for line in lines} == {os.path.join("notebooks", "train.ipynb")}
    assert lines[0].startswith(os.path.join("notebooks", "train.ipynb") + ":cell 6:9:14: AMP004 ")
    assert "Found 4 findings in 1 file" in result.stderr
    # named, an ignored notebook is checked
    named = run_amplint("check", "--no-cache", "--output-format", "concise", "notebooks/scratch/old.ipynb",
                        cwd=tmp_path)
    assert named.stdout.startswith("notebooks/scratch/old.ipynb:cell 6:9:14: AMP004 ")


def test_files_that_are_not_notebooks_are_reported_and_the_rest_still_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "truncated.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ["imp')
    (tmp_path / "src" / "v3.ipynb").write_text('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}\n')
    (tmp_path / "src" / "list.ipynb").write_text("[]\n")
    (tmp_path / "src" / "bad_source.ipynb").write_text(
        '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code", "source": 3}]}')
    (tmp_path / "src" / "train.py").write_text(FAULTY)
    nb, _, _ = _training_notebook()
    (tmp_path / "src" / "train.ipynb").write_text(_dumps(nb), encoding="utf-8")
    result = _invoke("--output-format", "concise", "src")
    assert result.exit_code == 2  # a file that cannot be read, as for a .py file
    lines = result.stdout.splitlines()
    errors = [line for line in lines if " AMP999 " in line]
    assert errors == [
        "src/bad_source.ipynb:1:1: AMP999 cannot check src/bad_source.ipynb: not a Jupyter notebook: the "
        '"source" of cell 1 is neither text nor a list of lines',
        "src/list.ipynb:1:1: AMP999 cannot check src/list.ipynb: not a Jupyter notebook: the JSON is not an object",
        "src/truncated.ipynb:1:1: AMP999 cannot check src/truncated.ipynb: not a Jupyter notebook: not valid "
        "JSON (Unterminated string starting at: line 1, column 45)",
        "src/v3.ipynb:1:1: AMP999 cannot check src/v3.ipynb: nbformat 3 notebook: only nbformat 4 is read "
        "(`jupyter nbconvert --to notebook --inplace` upgrades it)",
    ]
    assert sum(line.startswith("src/train.ipynb:cell ") for line in lines) == 4
    assert sum(line.startswith("src/train.py:") for line in lines) == 4
    # --fix still fixes the readable ones and leaves the others as they were
    fixed = _invoke("--fix", "--output-format", "concise", "src")
    assert fixed.exit_code == 2 and "Fixed 8 findings in 2 files." in fixed.stderr
    assert (tmp_path / "src" / "list.ipynb").read_text() == "[]\n"


def test_a_notebook_of_another_language_is_not_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb, _, _ = _training_notebook()
    nb["metadata"] = {"kernelspec": {"language": "R", "name": "ir", "display_name": "R"},
                      "language_info": {"name": "R"}}
    (tmp_path / "r.ipynb").write_text(_dumps(nb), encoding="utf-8")
    result = _invoke("r.ipynb")
    assert result.exit_code == 0 and "All checks passed (1 file)." in result.stderr


def test_the_cache_keys_notebooks_by_their_content(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb, _, _ = _training_notebook()
    text = _dumps(nb)
    (tmp_path / "train.ipynb").write_text(text, encoding="utf-8")

    def check(*paths):
        return CliRunner().invoke(main, ["check", "--output-format", "json", *paths])

    first = check("train.ipynb")
    entries = list((tmp_path / ".amplint_cache").rglob("*.json"))
    assert len(entries) == 1
    again = check("train.ipynb")
    assert again.stdout == first.stdout and len(json.loads(again.stdout)) == 4
    assert all(d["cell"] for d in json.loads(again.stdout))
    # The full format shows the cell's source from a cached answer too.
    assert " 9 |         with torch.cuda.amp.autocast():" in CliRunner().invoke(main, ["check", "train.ipynb"]).stdout
    # The same bytes as a .py file (JSON reads as a Python expression) are not the notebook.
    (tmp_path / "copy.py").write_text(text, encoding="utf-8")
    assert json.loads(check("copy.py").stdout) == []
    # A changed cell: a new answer.
    nb["cells"][7]["source"] = [line.replace("torch.cuda.amp.GradScaler", "torch.amp.GradScaler")
                                for line in nb["cells"][7]["source"]]
    (tmp_path / "train.ipynb").write_text(_dumps(nb), encoding="utf-8")
    assert [d["code"] for d in json.loads(check("train.ipynb").stdout)] == ["AMP004", "AMP001", "AMP002"]
    # Outputs changed, code not: still the same findings.
    nb["cells"][-1]["outputs"] = []
    (tmp_path / "train.ipynb").write_text(_dumps(nb), encoding="utf-8")
    assert [d["code"] for d in json.loads(check("train.ipynb").stdout)] == ["AMP004", "AMP001", "AMP002"]
    # one entry per content checked: the notebook three times, the .py once
    assert len(list((tmp_path / ".amplint_cache").rglob("*.json"))) == 4


def test_a_notebook_from_stdin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb, _, _ = _training_notebook()
    text = _dumps(nb)
    result = _invoke("--output-format", "concise", "--stdin-filename", "nb/train.ipynb", "-", input=text)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith("nb/train.ipynb:cell 6:9:14: AMP004 ")
    fixed = _invoke("--fix", "--stdin-filename", "nb/train.ipynb", "-", input=text)
    handed_back = json.loads(fixed.stdout)
    assert 'with torch.amp.autocast("cuda"):' in "".join(handed_back["cells"][5]["source"])
    assert handed_back["cells"][0] == nb["cells"][0] and fixed.stdout.endswith("}\n")


def test_a_syntax_error_is_placed_in_its_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = [_code("import torch\nscaler = torch.cuda.amp.GradScaler()"), _markdown("## Broken"),
             _code("def step(model, x:\n    return model(x)")]
    (tmp_path / "broken.ipynb").write_text(_dumps(_notebook(cells)), encoding="utf-8")
    result = _invoke("--output-format", "concise", "broken.ipynb")
    assert result.exit_code == 1
    # (the column is Python's own, which differs between its versions)
    assert result.stdout.startswith("broken.ipynb:cell 3:1:") and " AMP000 syntax error" in result.stdout
