"""The names torch's autocast and its dtypes go by, as the file's imports resolve them."""

from __future__ import annotations

# torch.autocast and torch.amp.autocast take the device first; the per-device classes do not.
_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
AUTOCAST_DEVICE = {
    "torch.cuda.amp.autocast": "cuda",
    "torch.cuda.amp.autocast_mode.autocast": "cuda",
    "torch.cpu.amp.autocast": "cpu",
    "torch.cpu.amp.autocast_mode.autocast": "cpu",
}
AUTOCAST = _GENERIC | frozenset(AUTOCAST_DEVICE)

# torch's floating dtypes by their qualified names, as their short names.
DTYPES = {
    "torch.float16": "float16", "torch.half": "float16", "torch.bfloat16": "bfloat16",
    "torch.float32": "float32", "torch.float": "float32", "torch.float64": "float64",
    "torch.double": "float64",
}
