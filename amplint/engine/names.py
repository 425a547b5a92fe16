"""The names torch's autocast goes by, as the file's imports resolve them."""

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
