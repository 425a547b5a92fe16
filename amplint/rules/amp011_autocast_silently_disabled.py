from __future__ import annotations

from ..engine.ast_context import AstContext
from ..engine.region_tables import disables_itself, region_table
from ..engine.regions import autocast_calls
from ..engine.rule import Invalid, Rule, Valid


class AutocastSilentlyDisabled(Rule):
    """
    ## What it does
    Finds autocast regions that do nothing or fail, judged by the policy tables for the
    configured torch version: a device string autocast rejects (`"gpu"`), or a dtype the device
    does not accept (on cpu, xpu, mps, mtia and maia torch 2.13 accepts only float16 and
    bfloat16; `torch.autocast("cpu", dtype=torch.float32)` only warns "target dtype is not
    supported. Disabling autocast").

    ## Why is this bad?
    A rejected device string raises when the region is entered. An unsupported dtype only
    warns, once, and the region then runs everything in float32: the speed-up and memory
    saving you expect never happen, and nothing fails.

    ## Example
    ```python
    with torch.autocast("cpu", dtype=torch.float64):
        out = model(x)
    ```

    ## Fix
    ```python
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    ```

    ## Fix safety
    No automatic fix: which dtype was meant is the author's call.

    ## False positives
    Only literal devices and `torch.<dtype>` literals are judged. CUDA accepts any floating
    dtype here (torch does not check it), so only its device string is judged.
    """

    code = "AMP011"
    name = "autocast-silently-disabled"
    summary = "Autocast region with a dtype or device string autocast does not accept"
    uses_policy = True
    fragments = (r"autocast",)

    valid = (
        Valid("""
import torch
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = model(x)
with torch.autocast("cuda:0", dtype=torch.float16):
    out = model(x)
with torch.autocast(device_type=x.device.type):
    out = model(x)
with torch.autocast("cuda:1"), torch.cuda.amp.autocast(True):
    out = model(x)
with torch.autocast("cpu", torch.float16):
    out = model(x)
with torch.autocast("cpu", torch.float64, enabled=False):
    out = model(x)
with torch.autocast(**settings):
    out = model(x)
"""),
    )
    invalid = (
        Invalid("""
import torch
with torch.autocast("cpu", dtype=torch.float64):
    out = model(x)
""", at=((3, 6, 'autocast on cpu does not support float64 and disables itself'),)),
        Invalid("""
import torch
with torch.autocast(device_type="gpu", dtype=torch.float16):
    out = model(x)
""", at=((3, 6, "autocast rejects device 'gpu' (it raises)"),)),
        Invalid("""
import torch
with torch.cpu.amp.autocast(dtype=torch.float32):
    out = model(x)
""", at=((3, 6, 'autocast on cpu does not support float32 and disables itself'),)),
    )

    def check(self, ctx: AstContext) -> None:
        known = ctx.policy().autocast_devices
        for ac in autocast_calls(ctx):
            if ac.device is None or ac.enabled is False:
                continue
            base = ac.device.split(":")[0]
            if base not in known:
                ctx.report(ac.node, f"autocast rejects device {ac.device!r} (it raises): use one of "
                                    f"{', '.join(repr(d) for d in known)}")
                continue
            if disables_itself(ctx, ac):
                table = region_table(ctx, ac)
                verdict = table.data.get("dtype_checks", {}).get(ac.dtype, "")
                ctx.report(ac.node, f"autocast on {base} does not support {ac.dtype} and disables "
                                    f"itself ({verdict.removeprefix('disabled: ')}): everything in the "
                                    f"region runs in float32; supported: {', '.join(table.supported_dtypes)}")
