"""What autocast and PyTorch's type promotion make of a value's dtype, whichever tree the value
was read from: a value's dtype with the node that made it so (the evidence a finding names),
what the policy tables say an op's output is, and how two operands promote."""

from __future__ import annotations

from typing import NamedTuple

FP32_FAMILY = frozenset({"fp32", "fp32_set_opt_dtype", "fp32_append_dtype"})
FLOAT32_FACTORIES = frozenset({"torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty",
                               "torch.full", "torch.linspace", "torch.eye"})
# Methods that give a fixed dtype, that keep their receiver's, and reductions to one value.
DTYPE_METHODS = {"float": "float32", "half": "lowp", "bfloat16": "lowp"}
SAME_DTYPE_METHODS = frozenset({"cpu", "cuda", "detach", "clone", "contiguous", "abs", "neg", "clamp", "clamp_min",
                                "clamp_max", "squeeze", "unsqueeze", "view", "reshape", "flatten", "t",
                                "transpose", "permute", "expand", "expand_as"})
FULL_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "norm", "prod"})


class Typed(NamedTuple):
    """A value's dtype and whether it is a 0-dim tensor or a Python number (those take part in
    type promotion only when their category is higher: a float32 0-dim tensor or a float added
    to a float16 tensor leaves it float16), and the node that made it so."""
    dtype: str | None  # "lowp", "float32", "number", or None (unknown)
    zero_dim: bool
    producer: object = None


UNKNOWN = Typed(None, False)


def policies_of(table, spelling: str | None) -> set[str]:
    if table is None or spelling is None:
        return set()
    return {table.policy(op) for op in table.ops_reached_by(spelling)}


def casts_back(table, spelling: str | None) -> bool:
    """Whether every op ``spelling`` reaches casts its output back to its input's dtype under
    autocast (an extension's wrapper that runs in float32, as torchvision's roi_align does)."""
    ops = table.ops_reached_by(spelling) if table is not None and spelling is not None else []
    return bool(ops) and all(table.casts_back(op) for op in ops)


def by_policy(table, spelling: str | None, node) -> Typed:
    """What autocast makes of the output of the ops ``spelling`` reaches, by the table."""
    policies = policies_of(table, spelling)
    if policies == {"lower_precision_fp"}:
        return Typed("lowp", False, node)
    if policies and policies <= FP32_FAMILY:
        return Typed("float32", False, node)
    return UNKNOWN


def promoted(left: Typed, right: Typed) -> Typed:
    """PyTorch's promotion of two floating operands: a Python number or a 0-dim tensor leaves
    a tensor with dimensions its dtype; otherwise float32 wins over float16/bfloat16."""
    if left.dtype == "number" or right.dtype == "number":
        other = right if left.dtype == "number" else left
        return other
    if None in (left.dtype, right.dtype):
        return UNKNOWN
    if left.zero_dim != right.zero_dim:
        return left if right.zero_dim else right
    return left if left.dtype == "float32" or right.dtype != "float32" else right
