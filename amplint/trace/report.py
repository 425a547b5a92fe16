"""The trace's report: findings as `amplint check` prints them, the steps and the dtype map."""

from __future__ import annotations

import json

from ..output import json_format
from .html_page import percent
from .runner import TraceResult


def _scale(value) -> str:
    return "-" if value is None else f"{value:g}"


def steps_table(result: TraceResult) -> str:
    steps = result.tracer.steps
    if not steps:
        return "Steps: none (no optimizer step ran)\n"
    rows = [("step", "via", "loss scale", "after update", "skipped", "first inf/NaN module")]
    for s in steps:
        rows.append((str(s.step), s.via, _scale(s.loss_scale), _scale(s.scale_after_update),
                     "yes" if s.skipped else "no", s.first_nonfinite_module or "-"))
    return "Steps:\n" + _table(rows)


def dtype_table(result: TraceResult) -> str:
    modules = result.tracer.dtype_map
    if not modules:
        return "Modules: none ran\n"
    rows = [("module", "type", "calls", "inputs", "outputs", "ops under autocast (by dtype)",
             "half outputs: inf/NaN, zero, subnormal")]
    for m in modules:
        ops = ", ".join(f"{d} {n}" for d, n in m["ops"].items()) or "-"
        rows.append((m["module"], m["type"], str(m["calls"]), ",".join(m["input_dtypes"]) or "-",
                     ",".join(m["output_dtypes"]) or "-", ops, half_outputs_text(m.get("half_outputs"))))
    return "Modules (dtype map):\n" + _table(rows)


def half_outputs_text(numerics: dict | None) -> str:
    """A module's overflow and underflow (ModuleRecord.half_outputs) in one cell; '-': none counted."""
    if numerics is None:
        return "-"
    return ", ".join(percent(numerics[k]) for k in ("overflow", "zero", "subnormal"))


def _table(rows) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


def findings_text(result: TraceResult) -> str:
    return "".join(f"{d.path}:{d.location.row}:{d.location.column}: {d.code} {d.message}\n"
                   for d in sorted(result.tracer.findings, key=lambda d: d.sort_key))


def text(result: TraceResult) -> str:
    return "\n".join(part for part in (findings_text(result), steps_table(result), dtype_table(result)) if part)


def findings_json(result: TraceResult) -> str:
    """The findings with `amplint check --output-format json`'s fields."""
    return json_format.render(sorted(result.tracer.findings, key=lambda d: d.sort_key))


def full_json(result: TraceResult) -> str:
    """Everything: findings (check's fields), steps, the dtype map, how the program ended."""
    return json.dumps({
        "findings": [json_format.as_dict(d) for d in sorted(result.tracer.findings, key=lambda d: d.sort_key)],
        "steps": [s.as_dict() for s in result.tracer.steps],
        "modules": result.tracer.dtype_map,
        "exit_code": result.exit_code,
        "stopped_after_steps": result.stopped,
    }, indent=2) + "\n"


def html_page(result: TraceResult) -> str:
    """The page: the module tree coloured by output dtype, op counts, the loss-scale curve."""
    from . import html_page as page_mod

    return page_mod.page(result.tracer.dtype_map, [s.as_dict() for s in result.tracer.steps],
                         [json_format.as_dict(d) for d in sorted(result.tracer.findings, key=lambda d: d.sort_key)],
                         tree=dict(result.tracer.module_tree), command=result.command_line,
                         ending=result.ending)


def summary(result: TraceResult) -> str:
    n = len(result.tracer.findings)
    how = result.ending
    found = f"Found {n} finding{'s' * (n != 1)}" if n else "No AMP mistakes seen"
    return f"amplint trace: {found}; {how}."
