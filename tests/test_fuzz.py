"""Property tests. Training loops assembled from random correct and faulty snippets: whatever
the combination, the engine does not crash, the prefilter drops no finding, --fix output
parses, a second --fix changes nothing, and no fixable finding is left. Random valid Python
(hypothesmith): no crash, and the prefilter keeps every finding. AMPLINT_FUZZ_EXAMPLES=2000
runs longer."""

import os
import textwrap

import hypothesmith
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from amplint.engine.rule import all_rules
from amplint.engine.runner import INTERNAL_ERROR, lint_source
from amplint.policy import loader
from training_loops import training_loops

RULES = list(all_rules())
LOAD = loader("cuda")


@settings(max_examples=int(os.environ.get("AMPLINT_FUZZ_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(training_loops())
def test_fixes_are_trustworthy(code):
    checked = lint_source("loop.py", code, RULES, policy_loader=LOAD)
    assert not [d for d in checked.diagnostics if d.code == INTERNAL_ERROR[0]], code
    unfiltered = lint_source("loop.py", code, RULES, policy_loader=LOAD, use_prefilter=False)
    assert [(d.code, d.location) for d in checked.diagnostics] == \
        [(d.code, d.location) for d in unfiltered.diagnostics], "the prefilter dropped a finding"
    fixed = lint_source("loop.py", code, RULES, policy_loader=LOAD, fix=True, unsafe=True)
    assert not [d for d in fixed.diagnostics if d.code == INTERNAL_ERROR[0]], (code, fixed.diagnostics)
    compile(fixed.source, "loop.py", "exec")
    again = lint_source("loop.py", fixed.source, RULES, policy_loader=LOAD, fix=True, unsafe=True)
    assert again.source == fixed.source, (code, fixed.source)
    assert not [d for d in again.diagnostics if d.fix is not None], (fixed.source, again.diagnostics)


def _in_region(code: str) -> str:
    return "import torch\nwith torch.autocast('cuda'):\n" + textwrap.indent(code or "pass\n", "    ")


@settings(max_examples=int(os.environ.get("AMPLINT_FUZZ_EXAMPLES", "40")) // 2, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(hypothesmith.from_grammar(), hypothesmith.from_node()), st.booleans())
def test_random_valid_python_never_crashes_the_engine(code, in_region):
    """Any valid Python (hypothesmith), with every rule run (no prefilter), alone and inside an
    autocast region: no internal error, whatever --fix writes still parses, and the prefilter
    keeps every finding."""
    if in_region:
        code = _in_region(code)
        assume(_compiles(code))  # indenting can break code with line continuations in strings
    for fix in (False, True):
        result = lint_source("random.py", code, RULES, policy_loader=LOAD, fix=fix, unsafe=True,
                             use_prefilter=False)
        crashed = [d for d in result.diagnostics if d.code == INTERNAL_ERROR[0]]
        assert not crashed, (code, crashed[0].detail)
        if fix:
            compile(result.source, "random.py", "exec")
        else:
            filtered = lint_source("random.py", code, RULES, policy_loader=LOAD)
            assert [(d.code, d.location) for d in filtered.diagnostics] == \
                [(d.code, d.location) for d in result.diagnostics], code


def _compiles(code: str) -> bool:
    try:
        compile(code, "random.py", "exec")
    except (SyntaxError, ValueError):
        return False
    return True
