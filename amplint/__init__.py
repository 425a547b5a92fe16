"""amplint: find and fix automatic-mixed-precision mistakes in PyTorch code.

Embedding API::

    import amplint
    for d in amplint.check_source(code, select=["AMP001", "AMP002"]):
        print(d.location.row, d.code, d.message)
    result = amplint.check_source(code, fix=True)  # the findings left, a list as above
    result.source, result.fixes_applied          # the fixed text, how many fixes made it
    table = amplint.load_policy("cuda")          # the probe's table for torch's newest version
    table.policy("aten::mm")                     # 'lower_precision_fp'
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "CheckResult", "check_source", "load_policy", "tracing"]


class CheckResult(list):
    """What ``check_source`` returns: the diagnostics, sorted (it is a list of them, as it
    always was), with the text they point into and the fixes made to reach it:

    - ``source``: the text after the fixes with ``fix=True`` (the code as given when nothing
      was fixed, or without ``fix``);
    - ``fixes_applied``: how many findings the fixes resolved (0 without ``fix``).
    """

    def __init__(self, diagnostics=(), source: str = "", fixes_applied: int = 0):
        super().__init__(diagnostics)
        self.source = source
        self.fixes_applied = fixes_applied

    def __repr__(self) -> str:
        return f"CheckResult({list.__repr__(self)}, fixes_applied={self.fixes_applied})"


def check_source(code: str, select: list[str] | None = None, *, path: str = "<string>",
                 device: str = "cuda", torch_version: str | None = None, fix: bool = False,
                 unsafe_fixes: bool = False, preview: bool = False) -> CheckResult:
    """Lint Python source; returns the diagnostics (``amplint.engine.diagnostics.Diagnostic``),
    sorted, as a list (a ``CheckResult``). ``select`` takes codes or prefixes, as on the command
    line. With ``fix=True`` safe fixes are applied (``unsafe_fixes=True``: unsafe ones too, as
    ``--fix --unsafe-fixes``): the diagnostics are those left, at their positions in the fixed
    text, which is the result's ``source``; nothing is written anywhere. A ``path`` that names
    a file on disk brings in what ``amplint check`` reads of that file's project (the autocast
    calls of its other files, the torch it declares when ``torch_version`` is not given); any
    other path sees ``code`` alone. ``preview=True`` also runs the rules and paths that
    ``--preview`` runs."""
    from .engine.config import Config, validate_codes
    from .engine.project_index import forget
    from .engine.runner import lint_source
    from .policy import loader

    forget()  # a ``path`` on disk: its project's other files as they are now
    config = Config(root=".", device=device, torch_version=torch_version, preview=preview)
    rules = config.rules(select=validate_codes(select, "select") if select is not None else None)
    result = lint_source(path, code, rules, fix=fix, unsafe=unsafe_fixes and fix,
                         policy_loader=loader(device, torch_version), preview=preview)
    return CheckResult(result.diagnostics, code if result.source is None else result.source,
                       result.fixes_applied)


def load_policy(device: str = "cuda", torch_version: str | None = None):
    """The op-policy table the probe generated for ``device`` (see ``amplint.policy.PolicyTable``)."""
    from .policy import load_policy as load

    return load(device, torch_version)


def tracing(steps: int | None = None, select=None, device: str | None = "cuda"):
    """Trace a real run (imports torch, here only): ``with amplint.tracing() as t: train()``;
    then ``t.findings`` (Diagnostics), ``t.steps`` and ``t.dtype_map``. See ``amplint.trace``."""
    from .trace import tracing as make

    return make(steps=steps, select=select, device=device)
