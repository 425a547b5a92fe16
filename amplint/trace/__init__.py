"""`amplint trace`: AMP mistakes, numerics and per-module dtypes seen in a real training run.

On the probe's side of the wall: it imports torch; nothing in the linter imports it.

    with amplint.tracing() as t:      # or amplint.trace.tracing()
        train()
    t.findings, t.steps, t.dtype_map
"""

from __future__ import annotations

_LAZY = ("StepRecord", "Tracer", "TraceStop")


def __getattr__(name: str):
    # torch is imported when a tracer is asked for, not with the package (`amplint trace --help`).
    if name in _LAZY:
        from . import tracer
        return getattr(tracer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tracing(steps: int | None = None, select=None, device: str | None = "cuda"):
    """A Tracer to use as a context manager: instruments torch inside the ``with`` block.

    ``steps``: raise TraceStop (a SystemExit) after that many optimizer steps; None: never.
    ``select``: the codes to report (None: every runtime code). ``device``: the device whose
    policy table also judges banned ops (AMP008), as the linter's ``device`` setting."""
    from .tracer import Tracer

    return Tracer(steps=steps, codes=None if select is None else set(select), device=device)


__all__ = ["StepRecord", "Tracer", "TraceStop", "tracing"]
