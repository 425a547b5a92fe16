"""amplint: find and fix automatic-mixed-precision mistakes in PyTorch code.

Embedding API::

    import amplint
    for d in amplint.check_source(code, select=["AMP001", "AMP002"]):
        print(d.location.row, d.code, d.message)
    table = amplint.load_policy("cuda")          # the probe's table for torch's newest version
    table.policy("aten::mm")                     # 'lower_precision_fp'
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "check_source", "load_policy"]


def check_source(code: str, select: list[str] | None = None, *, path: str = "<string>",
                 device: str = "cuda", torch_version: str | None = None, fix: bool = False):
    """Lint Python source; returns the diagnostics (``amplint.engine.diagnostics.Diagnostic``),
    sorted. ``select`` takes codes or prefixes, as on the command line. With ``fix=True`` the
    diagnostics are those left after applying safe fixes."""
    from .engine.config import Config, validate_codes
    from .engine.runner import lint_source
    from .policy import loader

    config = Config(root=".", device=device, torch_version=torch_version)
    rules = config.rules(select=validate_codes(select, "select") if select is not None else None)
    return lint_source(path, code, rules, fix=fix, policy_loader=loader(device, torch_version)).diagnostics


def load_policy(device: str = "cuda", torch_version: str | None = None):
    """The op-policy table the probe generated for ``device`` (see ``amplint.policy.PolicyTable``)."""
    from .policy import load_policy as load

    return load(device, torch_version)
