"""The embedding API: check_source and load_policy."""

import amplint
from conftest import ROOT

CODE = """\
import torch
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).mean()
    loss.backward()
"""


def test_check_source_reports_with_positions():
    [d] = amplint.check_source(CODE)
    assert (d.code, d.location.row, d.location.column) == ("AMP001", 4, 5)
    assert d.fix is not None and d.fix.applicability == "safe"


def test_check_source_select_and_fix():
    assert amplint.check_source(CODE, select=["AMP002"]) == []
    assert amplint.check_source(CODE, fix=True) == []


FIXED = """\
import torch
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).mean()
loss.backward()
"""


def test_check_source_with_fix_hands_back_the_fixed_text():
    result = amplint.check_source(CODE, fix=True)
    assert isinstance(result, amplint.CheckResult) and isinstance(result, list)
    assert result.source == FIXED and result.fixes_applied == 1 and list(result) == []
    # Nothing to fix: the code as given, and its findings.
    plain = amplint.check_source(CODE)
    assert plain.source == CODE and plain.fixes_applied == 0 and [d.code for d in plain] == ["AMP001"]
    again = amplint.check_source(FIXED, fix=True)
    assert again.source == FIXED and again.fixes_applied == 0 and again == []


def test_check_source_fixes_as_the_command_line_does():
    faulty = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()
    result = amplint.check_source(faulty, fix=True, preview=True)
    assert result.source == (ROOT / "fixtures" / "fixed" / "train_amp.py").read_text()
    assert result.fixes_applied == 4 and result == []
    # An unsafe fix only when asked for, as --fix --unsafe-fixes; the findings left point into the text.
    models = (ROOT / "fixtures" / "faulty" / "models.py").read_text()
    safe = amplint.check_source(models, select=["AMP003"], fix=True, preview=True)
    [left] = safe
    assert safe.source == models and left.code == "AMP003" and left.fix.applicability == "unsafe"
    unsafe = amplint.check_source(models, select=["AMP003"], fix=True, unsafe_fixes=True, preview=True)
    assert unsafe == [] and unsafe.fixes_applied == 1
    assert unsafe.source == models.replace(
        "torch.zeros(tokens.shape[0], 1, tokens.shape[2], device=tokens.device)",
        "tokens.new_zeros(tokens.shape[0], 1, tokens.shape[2])")
    assert amplint.check_source(models, select=["AMP003"], unsafe_fixes=True, preview=True).source == models  # no fix asked


def test_load_policy():
    table = amplint.load_policy("cuda")
    assert table.policy("aten::mm") == "lower_precision_fp"
    assert "torch.nn.BCELoss" in table.spellings_with("banned")
    assert amplint.load_policy("cpu").default_dtype == "bfloat16"
