"""Which lower-precision dtypes autocast accepts on a device, asked of torch itself."""

from __future__ import annotations

import contextlib
import warnings
from unittest import mock

import torch

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@contextlib.contextmanager
def _cuda_assumed_present():
    """torch.autocast('cuda') disables itself without a GPU before it looks at the dtype."""
    if torch.cuda.is_available():
        yield None
        return
    with mock.patch("torch.cuda.amp.common.amp_definitely_not_available", return_value=False), \
            mock.patch("torch.cuda.is_bf16_supported", return_value=True):
        yield "no CUDA device here: torch's device-availability checks were answered 'present'; " \
              "bfloat16 also needs a GPU with bf16 support (torch.cuda.is_bf16_supported())"


def supported_dtypes(device: str) -> tuple[dict[str, str], str | None]:
    """Map each floating dtype to 'enabled' or to what torch said when it refused it."""
    from .intercept import dtype_name

    verdicts = {}
    note_cm = _cuda_assumed_present() if device == "cuda" else contextlib.nullcontext()
    with note_cm as note:
        for dtype in FLOATING:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    ctx = torch.autocast(device, dtype=dtype)
                    # Entering sets the dtype in C++, which has checks of its own.
                    with ctx:
                        pass
                except Exception as exc:
                    verdicts[dtype_name(dtype)] = f"error: {str(exc).splitlines()[0]}"
                    continue
            if ctx._enabled:
                verdicts[dtype_name(dtype)] = "enabled"
            else:
                said = " ".join(str(w.message).splitlines()[0] for w in caught)
                verdicts[dtype_name(dtype)] = f"disabled: {said}".strip()
    return verdicts, note
