"""Where PyTorch's documented op lists (Autocast Op Reference) disagree with the dispatcher.

The docs' lists are data (docs_op_reference.json, with its source); the dispatcher's answer
is the probed table. The dispatcher wins; this module only lists the differences.
"""

from __future__ import annotations

import json
from pathlib import Path

_REFERENCE = Path(__file__).with_name("docs_op_reference.json")
# A documented category covers these probed policies.
_COVERS = {
    "lower_precision_fp": {"lower_precision_fp"},
    "float32": {"fp32", "fp32_set_opt_dtype", "fp32_append_dtype"},
    "promote": {"promote"},
    "banned": {"banned"},
}


def reference() -> dict:
    return json.loads(_REFERENCE.read_text(encoding="utf-8"))


def _ops_for(name: str, table: dict) -> list[dict]:
    """The table's ops a documented name refers to: the aten op of that name (any overload),
    else ops reached by a public spelling ending in that name (``GRUCell``, ``__matmul__``)."""
    by_op = [e for e in table["ops"] if e["op"].split("::")[-1].split(".")[0] == name]
    if by_op:
        return by_op
    return [e for e in table["ops"] if any(p.split(".")[-1] == name for p in e.get("python", []))]


def differences(table: dict) -> list[str] | None:
    """Readable lines, one per disagreement; None when the docs have no list for the device."""
    documented = reference()["devices"].get(table["device"])
    if documented is None:
        return None
    lines, matched = [], set()
    for category, names in documented.items():
        for name in names:
            entries = _ops_for(name, table)
            matched.update(e["op"] for e in entries)
            if not entries:
                lines.append(f"`{name}`: docs say {category}; no op with an autocast kernel on "
                             f"{table['device']} matches it")
                continue
            wrong = [e for e in entries if e["policy"] not in _COVERS[category]]
            for e in wrong:
                lines.append(f"`{name}`: docs say {category}; dispatcher: `{e['op']}` is {e['policy']}")
    for e in table["ops"]:
        if e["op"] not in matched:
            lines.append(f"`{e['op']}` ({e['policy']}): has an autocast kernel, not in the docs' lists")
    return lines
