"""What a rule claims about torch, run on the installed torch (CPU autocast in bfloat16): the
code it reports fails there, the code it accepts runs."""

import textwrap

import pytest

from amplint.engine.rule import all_rules
from amplint.engine.runner import lint_source
from amplint.policy import loader

torch = pytest.importorskip("torch")

FUNCTION = textwrap.dedent("""\
    import torch
    class {name}(torch.autograd.Function):
        @staticmethod{fwd}
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            return {forward}
        @staticmethod{bwd}
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            return {backward}
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(5, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = {name}.apply(x, w)
    y.float().sum().backward()
""")
FWD = '\n    @torch.amp.custom_fwd(device_type="cpu")'
BWD = '\n    @torch.amp.custom_bwd(device_type="cpu")'
MATMUL = ("x.mm(weight.t())", "(grad.mm(weight), grad.t().mm(x))")
ELEMENTWISE = ("x * weight.sum()", "(grad * weight.sum(), None)")


@pytest.mark.parametrize("name,fwd,bwd,ops,reported,error", [
    ("Linear", "", "", MATMUL, 2, RuntimeError),  # bfloat16 gradient, float32 weight
    ("Linear", FWD, BWD, MATMUL, 0, None),
    ("Linear", FWD, "", MATMUL, 1, RuntimeError),
    ("Linear", "", BWD, MATMUL, 1, AttributeError),  # custom_bwd reads what custom_fwd records
    ("Scale", "", "", ELEMENTWISE, 0, None),  # autocast leaves these ops alone
])
def test_amp014_reports_exactly_the_functions_that_break(name, fwd, bwd, ops, reported, error):
    code = FUNCTION.format(name=name, fwd=fwd, bwd=bwd, forward=ops[0], backward=ops[1])
    amp014 = [r for r in all_rules() if r.code == "AMP014"]
    assert len(lint_source("t.py", code, amp014, policy_loader=loader("cpu")).diagnostics) == reported
    if error is None:
        exec(compile(code, "t.py", "exec"), {})
    else:
        with pytest.raises(error):
            exec(compile(code, "t.py", "exec"), {})
