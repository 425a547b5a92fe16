"""The differential test, small: ten generated training loops run on the CPU under `amplint trace`
and checked by `amplint check`; every disagreement on a code falls in a class that
tests/differential.py explains, and loops that ran to their end agree but for those classes.
The large run is benchmarks/differential.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from differential import compare, cpu_loops, explain  # noqa: E402


def test_trace_and_linter_agree_on_generated_loops(tmp_path):
    outcomes = [compare(code, tmp_path) for code in cpu_loops(10)]
    assert any(o.failed is None for o in outcomes) and any(o.lint & o.trace for o in outcomes)
    unexplained = [(code, side, o.source, o.lint, o.trace, o.failed) for o in outcomes
                   for code, side in o.disagreements().items() if explain(o, code, side) is None]
    assert not unexplained, unexplained
