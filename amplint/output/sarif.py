"""SARIF 2.1.0 for GitHub code scanning."""

from __future__ import annotations

import json
from pathlib import Path

from .. import __version__
from ..engine.diagnostics import Diagnostic
from ..engine.rule import all_rules

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _rule_descriptor(rule) -> dict:
    return {"id": rule.code, "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.documentation()},
            "helpUri": rule.url(),
            "properties": {"fixable": rule.fixable}}


def render(diagnostics: list[Diagnostic]) -> str:
    rules = list(all_rules())
    index = {r.code: i for i, r in enumerate(rules)}
    results = []
    for d in diagnostics:
        result = {
            "ruleId": d.code,
            "level": "error" if d.code in ("AMP000", "AMP999") else "warning",
            "message": {"text": d.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": Path(d.path).as_posix()},
                "region": {"startLine": d.location.row, "startColumn": d.location.column,
                           "endLine": d.end_location.row, "endColumn": d.end_location.column},
            }}],
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        results.append(result)
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "amplint", "version": __version__,
                                "informationUri": "https://github.com/amplint/amplint",
                                "rules": [_rule_descriptor(r) for r in rules]}},
            "results": results,
        }],
    }
    return json.dumps(log, indent=2) + "\n"
