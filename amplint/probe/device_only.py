"""Autocast kernels that only a device build registers, which a CPU build's dispatcher cannot show.

The probe's truth is the dispatcher of the installed torch. Some autocast kernels are compiled
only into a device build: on a CPU-only wheel their op has no Autocast<Device> kernel at all,
so the probe would leave them out of that device's table. They are listed here, each with the
PyTorch source that registers it, and added to the table marked ``"supplement"`` (with the
source as evidence) only when this torch's dispatcher lacks the kernel. A device build's own
dispatcher wins: where the kernel is registered, the probe classifies it as any other op,
and `--mode execute` on that device confirms or corrects what is written here.
"""

from __future__ import annotations

import torch

# What a CPU build can still tell: the op's schema (registered in every build) and, from the
# source, the policy. Nothing here is used where the dispatcher has a kernel for the op.
DEVICE_ONLY_KERNELS: list[dict] = [
    {
        "device": "cuda",
        "op": "aten::_cudnn_rnn",
        "policy": "lower_precision_fp",
        "dtype": "float16",
        "python": ["torch.nn.GRU", "torch.nn.LSTM", "torch.nn.RNN"],
        "source": "pytorch/pytorch aten/src/ATen/native/cudnn/AutocastRNN.cpp: "
                  "_cudnn_rnn_cast_reflatten, registered by TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m) "
                  "as m.impl(\"_cudnn_rnn\", ...); compiled only with cuDNN (AT_CUDNN_ENABLED)",
        "note": "cuDNN RNNs (nn.LSTM/GRU/RNN on CUDA when cuDNN accepts the input) run in float16 "
                "whatever the autocast dtype: the wrapper casts input, hidden states and the "
                "flattened weights to at::kHalf. From PyTorch's source, not from this build's "
                "dispatcher (a CPU build has no cuDNN); to be confirmed on a GPU with "
                "amplint probe --device cuda --mode execute --ops _cudnn_rnn",
    },
]


def _key(device: str) -> str:
    return "Autocast" + ("PrivateUse1" if device == "privateuseone" else device.upper())


def supplement(device: str, probed: set[str], wanted) -> list[dict]:
    """Entries for ``device``'s device-only kernels that this dispatcher lacks and the probe
    did not find; ``wanted(op)`` applies the --ops patterns."""
    entries = []
    for known in DEVICE_ONLY_KERNELS:
        op = known["op"]
        if known["device"] != device or op in probed or not wanted(op):
            continue
        name, _, overload = op.partition(".")
        if torch._C._dispatch_has_kernel_for_dispatch_key(op, _key(device)):
            continue  # the build has it: the probe classified it, this list does not apply
        try:
            torch._C._get_schema(name, overload)
        except RuntimeError:
            continue  # no such op in this torch at all
        entries.append({
            "op": op,
            "policy": known["policy"],
            "evidence": {"supplement": True, "source": known["source"], "dtype": known["dtype"]},
            "python": list(known["python"]),
            "note": known["note"],
        })
    return entries
