"""The embedding API: check_source and load_policy."""

import amplint

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


def test_load_policy():
    table = amplint.load_policy("cuda")
    assert table.policy("aten::mm") == "lower_precision_fp"
    assert "torch.nn.BCELoss" in table.spellings_with("banned")
    assert amplint.load_policy("cpu").default_dtype == "bfloat16"
