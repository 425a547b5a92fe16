from __future__ import annotations

import ast
from functools import lru_cache

from ..engine.context import FileContext
from ..engine.outline import Outline
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import (AUTOCAST, AUTOCAST_DEVICE, DTYPES, autocast_calls, disables_itself,
                                enabled_autocast_calls, region_table)
from ..policy import committed_tables



@lru_cache(maxsize=None)
def _accepted() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """What every committed table accepts: the autocast devices, and each device's dtypes."""
    tables = committed_tables()
    devices = frozenset.intersection(*(frozenset(t.autocast_devices) for t in tables))
    dtypes: dict[str, frozenset[str]] = {}
    for t in tables:
        dtypes[t.device] = dtypes.get(t.device, frozenset(t.supported_dtypes)) & frozenset(t.supported_dtypes)
    return devices, dtypes


def _may_fire(outline: Outline) -> bool:
    """An enabled autocast call with a literal device some table may not accept, or a dtype
    named by torch's name that its device's table may not support: what check() reports, with
    the tables' answers taken as narrowly as any committed table gives them."""
    devices, dtypes = _accepted()
    for call in enabled_autocast_calls(outline):
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue  # autocast_call binds nothing then: no literal device or dtype to judge
        for name in outline.qualified_names(call.func) & AUTOCAST:
            per_device = AUTOCAST_DEVICE.get(name)
            bound = dict(zip(("enabled", "dtype") if per_device else ("device_type", "dtype"), call.args))
            bound.update((k.arg, k.value) for k in call.keywords)
            device = per_device or getattr(bound.get("device_type"), "value", None)
            if not isinstance(device, str):
                continue  # not a literal: check() does not judge it
            base = device.split(":")[0]
            if base not in devices:
                return True
            dtype = next((DTYPES[n] for n in outline.qualified_names(bound["dtype"]) if n in DTYPES), None) \
                if "dtype" in bound else None
            if dtype is not None and dtype not in dtypes.get(base, frozenset()):
                return True
    return False


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
    # An autocast call with a dtype, or with a literal device other than cuda and cpu.
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = model(x)
with torch.autocast("cuda:0", dtype=torch.float16):
    out = model(x)
with torch.autocast(device_type=x.device.type):
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

    def check(self, ctx: FileContext) -> None:
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
