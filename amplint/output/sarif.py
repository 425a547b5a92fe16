"""SARIF 2.1.0 for GitHub code scanning."""

from __future__ import annotations

import json
from pathlib import Path

from .. import __version__
from ..engine.diagnostics import Diagnostic
from ..engine.rule import all_rules

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _rule_descriptor(rule) -> dict:
    doc = rule.documentation()
    return {"id": rule.code, "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.summary},
            "help": {"text": doc, "markdown": doc},  # what code scanning shows under "Show more"
            "helpUri": rule.url(),
            "properties": {"fixable": rule.fixable}}


def _region(start, end) -> dict:
    return {"startLine": start.row, "startColumn": start.column,
            "endLine": end.row, "endColumn": end.column}


def _fix(d: Diagnostic, uri: str) -> dict:
    return {"description": {"text": f"{d.fix.message} ({d.fix.applicability} fix)"},
            "artifactChanges": [{"artifactLocation": {"uri": uri}, "replacements": [
                {"deletedRegion": _region(start, end), "insertedContent": {"text": content}}
                for start, end, content in d.edit_locations]}]}


def render(diagnostics: list[Diagnostic]) -> str:
    rules = list(all_rules())
    index = {r.code: i for i, r in enumerate(rules)}
    results = []
    for d in diagnostics:
        uri = Path(d.path).as_posix()
        result = {
            "ruleId": d.code,
            "level": "error" if d.code in ("AMP000", "AMP999") else "warning",
            # SARIF has no notebook cells: the rows are the cell's, the cell is named here.
            "message": {"text": d.message if d.location.cell is None else f"cell {d.location.cell}: {d.message}"},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri},
                "region": _region(d.location, d.end_location),
            }}],
        }
        if d.location.cell is not None:
            result["properties"] = {"cell": d.location.cell}
        if d.related:
            result["relatedLocations"] = [{
                "id": i, "message": {"text": r.message},
                "physicalLocation": {"artifactLocation": {"uri": Path(r.path).as_posix()},
                                     "region": {"startLine": r.row}}} for i, r in enumerate(d.related)]
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        if d.fix is not None and d.edit_locations:
            result["fixes"] = [_fix(d, uri)]
        results.append(result)
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "amplint", "version": __version__,
                                "informationUri": "https://github.com/amplint/amplint",
                                "rules": [_rule_descriptor(r) for r in rules]}},
            "results": results,
            # Columns count characters (code points); SARIF's default would be UTF-16 units.
            "columnKind": "unicodeCodePoints",
        }],
    }
    return json.dumps(log, indent=2) + "\n"
