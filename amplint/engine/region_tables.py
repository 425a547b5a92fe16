"""What the policy tables make of an autocast region: its device's table, whether torch turns
it off for its dtype, the dtype it runs in, for an autocast call (``regions.AutocastCall``):
only its device and dtype are read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..policy import PolicyTable
    from .checked_file import CheckedFile


class _Region(Protocol):
    device: str | None
    dtype: str | None
    dtype_given: bool


def region_table(ctx: "CheckedFile", ac: _Region) -> "PolicyTable":
    """The policy table for an autocast call's device (a literal, else the configured one)."""
    return ctx.policy(ac.device.split(":")[0] if ac.device else None)


def disables_itself(ctx: "CheckedFile", ac: _Region) -> bool:
    """Whether torch turns the region off for its dtype (AMP011's verdict): a literal dtype
    that the table of its literal, accepted device does not support. Torch warns "Disabling
    autocast" and runs the region as ``enabled=False`` would."""
    if ac.device is None or ac.dtype is None or ac.device.split(":")[0] not in ctx.policy().autocast_devices:
        return False
    table = region_table(ctx, ac)
    return table is not None and ac.dtype not in table.supported_dtypes


def region_dtype(ctx: "CheckedFile", ac: _Region) -> str | None:
    """The lower-precision dtype a region runs in: its literal dtype, else the device's default
    from the tables; None when an expression decides."""
    if ac.dtype is not None:
        return ac.dtype
    if ac.dtype_given:
        return None
    table = region_table(ctx, ac)
    return table.default_dtype if table is not None else None
