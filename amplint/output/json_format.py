"""JSON with ruff's field names, so tools that read ruff's JSON read ours."""

from __future__ import annotations

import json

from ..engine.diagnostics import Diagnostic
from .text import statistics_rows


def _loc(location) -> dict:
    return {"row": location.row, "column": location.column}


def _in_cell(fields: dict, location) -> dict:
    """In a notebook, ``cell`` (1-based, every cell counted, as Jupyter numbers them) is added
    beside the locations, which are then relative to that cell (as ruff reports notebooks)."""
    return fields if location.cell is None else {**fields, "cell": location.cell}


def as_dict(d: Diagnostic) -> dict:
    fix = None
    if d.fix is not None:
        fix = {"applicability": d.fix.applicability, "message": d.fix.message,
               "edits": [_in_cell({"content": content, "location": _loc(start), "end_location": _loc(end)}, start)
                         for start, end, content in d.edit_locations]}
    out = {"code": d.code, "name": d.name, "message": d.message, "filename": d.path}
    out = {**_in_cell(out, d.location),
           "location": _loc(d.location), "end_location": _loc(d.end_location),
           "fix": fix, "noqa_row": d.location.row, "url": d.url}
    if d.related:  # another file the finding depends on (only then: ruff's fields stay as they are)
        out["related"] = [{"filename": r.path, "location": {"row": r.row, "column": 1}, "message": r.message}
                          for r in d.related]
    return out


def render(diagnostics: list[Diagnostic]) -> str:
    return json.dumps([as_dict(d) for d in diagnostics], indent=2) + "\n"


def render_statistics(diagnostics: list[Diagnostic]) -> str:
    """``--statistics`` as ruff writes it in JSON: code, name, count, fixable."""
    return json.dumps(statistics_rows(diagnostics), indent=2) + "\n"
