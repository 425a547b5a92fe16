"""What the dispatcher knows: autocast devices and the ops that have an autocast kernel on each."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import torch

_AUTOCAST_LINE = re.compile(r"^Autocast(\w+): (fallthrough )?registered")

# Dispatch-key suffixes whose device string is not simply the lower-cased suffix.
_KEY_TO_DEVICE = {"PrivateUse1": "privateuseone"}


@dataclass(frozen=True)
class OpName:
    """An operator overload as the dispatcher spells it: ``aten::norm.Scalar``."""

    name: str  # "aten::norm"
    overload: str  # "Scalar", or "" for the default overload

    @property
    def full(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @classmethod
    def parse(cls, full: str) -> "OpName":
        name, _, overload = full.partition(".")
        return cls(name, overload)

    def schema(self) -> torch._C.FunctionSchema:
        return torch._C._get_schema(self.name, self.overload)

    def packet(self):
        namespace, _, base = self.name.partition("::")
        packet = getattr(getattr(torch.ops, namespace), base)
        return getattr(packet, self.overload or "default")


def device_of_key(key: str) -> str:
    return _KEY_TO_DEVICE.get(key, key.lower())


def autocast_kernels(op: str) -> dict[str, bool]:
    """Map each Autocast<Device> key in op's dispatch table to whether it holds a real kernel."""
    table = torch._C._dispatch_dump_table(op)
    found = {}
    for line in table.splitlines():
        match = _AUTOCAST_LINE.match(line)
        if match:
            found[device_of_key(match.group(1))] = match.group(2) is None
    return found


def all_ops() -> list[str]:
    return sorted(torch._C._dispatch_get_all_op_names())


def autocast_devices() -> list[str]:
    """Devices with an autocast dispatch key in this torch, read off a dispatch table.

    Python's DispatchKey enum omits some keys (AutocastMTIA, AutocastMAIA), so the
    dump of an op that every autocast key knows is the reliable source.
    """
    devices: set[str] = set()
    for op in ("aten::mm", "aten::add.Tensor"):
        devices.update(autocast_kernels(op))
    # A key that no op has a kernel for (IPU, HPU, PrivateUse1 in a stock build)
    # is still a device torch knows; keep those that torch also calls autocast-capable.
    return sorted(d for d in devices if torch._C._is_autocast_available(d))


def ops_with_autocast_kernel(device: str, patterns: tuple[str, ...] = ()) -> list[OpName]:
    key = "Autocast" + next((k for k, v in _KEY_TO_DEVICE.items() if v == device), device.upper())
    selected = []
    for full in all_ops():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(full, key):
            continue
        if patterns and not matches(full, patterns):
            continue
        selected.append(OpName.parse(full))
    return selected


def matches(full: str, patterns: tuple[str, ...]) -> bool:
    short = full.split("::", 1)[-1]
    return any(fnmatch.fnmatchcase(full, p) or fnmatch.fnmatchcase(short, p) for p in patterns)


# A device's own kernel for an op that also has a C++ composite one: eager mode on that device
# runs the kernel (MPS's _mps_linear), elsewhere the composite's decomposition.
_BACKEND_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "mtia": "MTIA", "maia": "MAIA",
                "hpu": "HPU", "privateuseone": "PrivateUse1"}


def has_device_kernel(op: str, device: str) -> bool:
    """Whether ``op`` (``aten::linear``) has a kernel of ``device``'s own backend key.

    A CPU build registers only CPU kernels; for other devices the answer comes from the
    dispatch section of PyTorch's native_functions.yaml, shipped with torch in
    torchgen/packaged (kernels registered outside it, XPU's torch-xpu-ops, are not seen)."""
    key = _BACKEND_KEY.get(device, device.upper())
    if torch._C._dispatch_has_kernel_for_dispatch_key(op, key):
        return True
    return key in _native_dispatch().get(op, ())


_NATIVE_DISPATCH: dict[str, frozenset[str]] | None = None


def _native_dispatch() -> dict[str, frozenset[str]]:
    """``aten::op.overload`` -> the dispatch keys native_functions.yaml gives it a kernel for;
    read line by line (its format is regular, and the probe does not depend on a YAML parser)."""
    global _NATIVE_DISPATCH
    if _NATIVE_DISPATCH is not None:
        return _NATIVE_DISPATCH
    found: dict[str, set[str]] = {}
    try:
        import torchgen
        from pathlib import Path
        text = (Path(torchgen.__file__).parent / "packaged/ATen/native/native_functions.yaml").read_text()
    except (ImportError, OSError):
        text = ""
    op, in_dispatch = None, False
    for line in text.splitlines():
        if line.startswith("- func:"):
            op, in_dispatch = "aten::" + line.split(":", 1)[1].strip().split("(", 1)[0], False
        elif line.startswith("  dispatch:"):
            in_dispatch = True
        elif in_dispatch and line.startswith("    ") and ":" in line and op:
            keys = line.split(":", 1)[0]
            found.setdefault(op, set()).update(k.strip() for k in keys.split(","))
        elif not line.startswith("    "):
            in_dispatch = False
    _NATIVE_DISPATCH = {k: frozenset(v) for k, v in found.items()}
    return _NATIVE_DISPATCH
