"""Rules read Python's ``ast``: positions count characters (``ast`` counts bytes), a file
Python cannot parse is reported, ``# noqa`` bookkeeping (AMP100) sees their findings, and a
fix edits the text at the nodes' offsets, the rest as it was."""

from amplint.engine.rule import rule_by_code
from amplint.engine.runner import lint_source
from amplint.policy import loader

_TABLES = loader("cuda")

HALF_TRAINING = """\
import torch

model = Net().cuda().half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss_fn(model(x.cuda().half()), y).backward()
    optimizer.step()
"""


def _lint(source, codes, **kw):
    return lint_source("train.py", source, [rule_by_code(c) for c in codes], policy_loader=_TABLES, **kw)


def test_columns_count_characters_not_bytes():
    # "é" and "→" are two and three bytes in UTF-8: ast's column of the call is 4 past its character's.
    source = HALF_TRAINING.replace("optimizer = torch", 'tag = "é→"; optimizer = torch')
    found = _lint(source, ["AMP016"]).diagnostics
    line = source.splitlines()[3]
    assert [(d.location.row, d.location.column) for d in found] == [(4, line.index("torch.optim") + 1)]
    end = line.index("lr=0.1)") + len("lr=0.1)") + 1
    assert (found[0].end_location.row, found[0].end_location.column) == (4, end)


def test_a_file_python_cannot_parse_is_reported():
    found = _lint(HALF_TRAINING + "def broken(:\n", ["AMP016"]).diagnostics
    assert [(d.code, d.location.row) for d in found] == [("AMP000", 8)]


def test_noqa_of_a_rule_on_the_ast_is_used_or_reported_unused():
    source = HALF_TRAINING.replace("lr=0.1)", "lr=0.1)  # noqa: AMP016").replace(
        "    optimizer.step()", "    optimizer.step()  # noqa: AMP016")
    found = _lint(source, ["AMP016", "AMP100"]).diagnostics
    assert [(d.code, d.location.row) for d in found] == [("AMP100", 7)]
    assert "no such finding on this line" in found[0].message


def test_a_fix_edits_the_text_at_the_nodes_offsets():
    # AMP013 on the ast: the softmax's own text (its line breaks and comments) is kept, after
    # characters of several bytes on the same line.
    source = ('import torch\nimport torch.nn.functional as F\nnote = "ß"; p = torch.log(F.softmax(\n'
              '    logits,  # the scores\n    dim=-1))\n')
    result = _lint(source, ["AMP013"], fix=True)
    assert result.source == ('import torch\nimport torch.nn.functional as F\nnote = "ß"; p = F.log_softmax(\n'
                             '    logits,  # the scores\n    dim=-1)\n')
    assert result.diagnostics == [] and result.fixes_applied == 1


def test_a_backward_moved_out_of_its_region_keeps_its_text():
    # AMP001's fix on the ast: the tail of the `with` body dedented to the block's own
    # indentation, the comment above it and a call's continuation lines moving with it.
    source = ('import torch\nfor x in loader:\n    with torch.autocast("cuda"):\n        loss = model(x)\n'
              '        # scale, then step\n        scaler.scale(loss).backward()  # scaled\n'
              '        scaler.step(\n            optimizer,\n        )\n    print("done")\n')
    result = _lint(source, ["AMP001"], fix=True)
    assert result.source == ('import torch\nfor x in loader:\n    with torch.autocast("cuda"):\n        loss = model(x)\n'
                             '    # scale, then step\n    scaler.scale(loss).backward()  # scaled\n'
                             '    scaler.step(\n        optimizer,\n    )\n    print("done")\n')
    assert result.diagnostics == [] and result.fixes_applied == 1


def test_a_backward_moved_out_keeps_tabs_and_line_endings():
    source = 'import torch\r\nwith torch.autocast("cuda"):\r\n\tloss = model(x)\r\n\tloss.backward()\r\n'
    result = _lint(source, ["AMP001"], fix=True)
    assert result.source == 'import torch\r\nwith torch.autocast("cuda"):\r\n\tloss = model(x)\r\nloss.backward()\r\n'


def test_no_backward_is_moved_where_the_text_would_change():
    # A string spanning lines (dedenting would change it), a body on the `with` line, the
    # backward sharing its line with the forward: reported, not fixed.
    for source in ('import torch\nwith torch.autocast("cuda"):\n    loss = model(x)\n    loss.backward()\n'
                   '    print("""step\n    done""")\n',
                   'import torch\nwith torch.autocast("cuda"): loss = model(x); loss.backward()\n',
                   'import torch\nwith torch.autocast("cuda"):\n    loss = model(x); loss.backward()\n'):
        result = _lint(source, ["AMP001"], fix=True)
        assert result.source == source and result.fixes_applied == 0
        assert [d.code for d in result.diagnostics] == ["AMP001"]


def test_a_rule_on_the_ast_run_alone_sees_the_projects_star_imports(tmp_path, monkeypatch):
    # No selected rule has a prefilter test of its own: the outline the rule reads still
    # resolves `from .common import *` through the project.
    from projects import findings, write_files

    root = write_files(tmp_path, {
        "pyproject.toml": "[project]\nname = 'pkg'\n",
        "pkg/__init__.py": "",
        "pkg/common.py": "import torch\nfrom torch import nn\n",
        "pkg/train.py": """\
            from .common import *

            def evaluate(model, x):
                with torch.autocast("cpu", dtype=torch.float64):
                    return model(x)
            """,
    })
    assert [(path, row) for path, row, *_ in findings(root, "AMP011", monkeypatch)] == [("pkg/train.py", 4)]
