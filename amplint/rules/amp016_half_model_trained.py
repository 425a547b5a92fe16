from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import DTYPES, calls, is_backward, method_call


def _halved(ctx: FileContext, call: cst.Call) -> str | None:
    """The code of ``m`` for ``m.half()``, ``m.to(torch.float16)``, ``m.to(dtype=torch.half)``."""
    mc = method_call(call)
    if mc is None:
        return None
    if mc[1] == "half" and not call.args:
        return ctx.code(mc[0])
    if mc[1] == "to":
        for arg in call.args:
            if (arg.keyword is None or arg.keyword.value == "dtype") and \
                    DTYPES.get(ctx.resolves_to(arg.value, DTYPES.keys()) or "") == "float16":
                return ctx.code(mc[0])
    return None


class HalfModelTrained(Rule):
    """
    ## What it does
    Finds `model.half()` / `model.to(torch.float16)` on a model whose `.parameters()` a
    `torch.optim` optimizer then updates, in a file that runs a backward pass.

    ## Why is this bad?
    Pure float16 training keeps the weights themselves in float16: updates smaller than the
    weight's precision (about 1e-3 relative) round away, so learning stalls, and gradients
    underflow with no loss scaling. Mixed precision keeps float32 master weights and runs
    only the ops that benefit in float16.

    ## Example
    ```python
    model = Net().cuda().half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Fix
    ```python
    model = Net().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    # and run the forward under torch.autocast("cuda")
    ```

    ## Fix safety
    No automatic fix.

    ## False positives
    `.half()` for inference (no optimizer over that model's parameters) is not reported.
    Optimizers that keep float32 master weights themselves (apex's FP16_Optimizer,
    DeepSpeed) are not `torch.optim` and do not count.
    """

    code = "AMP016"
    name = "half-model-trained"
    summary = "Model converted to float16 and then trained (no float32 master weights)"
    fragments = (("optim", AnyOf(r"\.half\(\)", r"\.to\([^\n]*(?:float16|torch\.half)")),)  # a half model, an optimizer
    # A torch.optim optimizer and a backward pass.
    may_fire = staticmethod(lambda outline: outline.calls_under("torch.optim.") and bool(
        outline.method_calls("backward") or outline.calls_to({"torch.autograd.backward"})))

    valid = (
        Valid("""
import torch
model = Net().cuda().half().eval()
with torch.no_grad():
    out = model(x.half())
"""),
        Valid("""
import torch
model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters())
x = x.half()
loss = model(x.float()).mean()
loss.backward()
"""),
    )
    invalid = (
        Invalid("""
import torch
model = Net().cuda()
model.half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = loss_fn(model(x.cuda().half()), y)
    loss.backward()
    optimizer.step()
""", at=((4, 1, '`model` is converted to float16 and trained'),)),
        Invalid("""
import torch
def build(net):
    net = net.to(dtype=torch.float16)
    opt = torch.optim.Adam(net.parameters())
    return net, opt
def train(net, opt, x):
    net(x).mean().backward()
    opt.step()
""", at=((4, 11, '`net` is converted to float16 and trained'),)),
    )

    def check(self, ctx: FileContext) -> None:
        all_calls = calls(ctx)
        if not any(is_backward(ctx, c) for c in all_calls):
            return
        trained = set()
        for call in all_calls:
            optimizer = any(n.startswith("torch.optim.") for n in ctx.qualified_names(call.func))
            if optimizer and call.args:
                first = call.args[0].value
                if isinstance(first, cst.Call) and (mc := method_call(first)) and mc[1] == "parameters":
                    trained.add(ctx.code(mc[0]))
        for call in all_calls:
            model = _halved(ctx, call)
            if model is None:
                continue
            parent = ctx.parent(call)
            targets = {ctx.code(t.target) for t in parent.targets} if isinstance(parent, cst.Assign) else set()
            # `model.half()` converts model in place; `m = net.half()` makes m the half model.
            if model in trained or targets & trained:
                ctx.report(call, f"`{(targets & trained or {model}).pop()}` is converted to float16 and "
                                 "trained: updates round away without float32 master weights; "
                                 "use autocast + GradScaler")
