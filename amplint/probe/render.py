"""Policy tables and their differences as text, JSON, markdown and CSV. No torch here."""

from __future__ import annotations

import csv
import io
import json

from . import html_page

FORMATS = ("table", "json", "markdown", "csv", "html")


def _python(entry: dict, limit: int = 4) -> str:
    names = entry.get("python", [])
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "")


def _detail(entry: dict) -> str:
    if entry["policy"] is None:
        return entry.get("reason", "")
    ev = entry.get("evidence", {})
    if entry["policy"] == "banned":
        return ev.get("message", "").splitlines()[0].removeprefix("RuntimeError: ")
    parts = [f"{c[0]} {c[1]}→{c[2]}" for c in ev.get("casts", [])]
    redispatch = ev.get("redispatch", {})
    if redispatch.get("op") and redispatch["op"] != entry["op"]:
        parts.append(f"→ {redispatch['op']}")
    if "dtype" in redispatch.get("args", {}) and not ev.get("casts"):
        parts.append(f"dtype={redispatch['args']['dtype']}")
    return ", ".join(parts)


def _header(table: dict) -> str:
    return (f"torch {table['torch_version']} · device {table['device']} · dtype {table['dtype']} "
            f"· mode {table['mode']} · {table['counts']['ops']} ops, "
            f"{table['counts']['unclassified']} unclassified")


def render(tables: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(tables[0] if len(tables) == 1 else tables, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["device", "dtype", "op", "policy", "python", "detail"])
        for t in tables:
            for e in t["ops"]:
                writer.writerow([t["device"], t["dtype"], e["op"], e["policy"] or "",
                                 " ".join(e.get("python", [])), _detail(e)])
        return buf.getvalue()
    if fmt == "markdown":
        return "\n".join(markdown_table(t) for t in tables)
    if fmt == "html":
        return html_page.tables_page(tables, _detail)
    return "\n".join(text_table(t) for t in tables) + "\n" + policy_legend()


def policy_legend(unclassified: str = "UNCLASSIFIED", title: str = "policies:") -> str:
    """The policy names explained, in the words of the HTML page's legend
    (``html_page.POLICY_MEANINGS``): under the text table, and in `amplint probe --help`."""
    names = {policy or unclassified: meaning for policy, meaning in html_page.POLICY_MEANINGS.items()}
    names["(not listed)"] = html_page.NO_KERNEL_MEANING
    width = max(map(len, names))
    return "\n".join([title] + [f"  {name.ljust(width)}  {meaning}" for name, meaning in names.items()]) + "\n"


def text_table(table: dict) -> str:
    rows = [(e["op"], e["policy"] or "UNCLASSIFIED", _python(e, 2), _detail(e)) for e in table["ops"]]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(("op", "policy", "python"))]
    lines = [_header(table), ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(("op", "policy", "python"), widths)) + "  evidence")
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    return "\n".join(lines) + "\n"


def markdown_table(table: dict) -> str:
    lines = [f"### {table['device']} ({table['dtype']})", "", _header(table), "",
             f"Accepted autocast dtypes: {', '.join(table.get('supported_dtypes', []))}; "
             f"default {table.get('default_dtype')}.", "",
             "| op | policy | Python spellings | evidence |", "|---|---|---|---|"]
    for e in table["ops"]:
        esc = [s.replace("|", "\\|") for s in (e["op"], e["policy"] or "**unclassified**",
                                              ", ".join(f"`{p}`" for p in e.get("python", [])),
                                              _detail(e))]
        lines.append("| " + " | ".join(esc) + " |")
    return "\n".join(lines) + "\n"


def diff(a: dict, b: dict) -> dict:
    """Ops added, removed and changed in policy from table ``a`` to table ``b``."""
    pa = {e["op"]: e["policy"] for e in a["ops"]}
    pb = {e["op"]: e["policy"] for e in b["ops"]}
    return {
        "a": _label(a), "b": _label(b),
        "added": [{"op": op, "policy": pb[op]} for op in sorted(pb.keys() - pa.keys())],
        "removed": [{"op": op, "policy": pa[op]} for op in sorted(pa.keys() - pb.keys())],
        "changed": [{"op": op, "from": pa[op], "to": pb[op]}
                    for op in sorted(pa.keys() & pb.keys()) if pa[op] != pb[op]],
    }


DIFF_FORMATS = ("table", "json", "html")


def render_diff(a: dict, b: dict, fmt: str) -> str:
    d = diff(a, b)
    if fmt == "json":
        return json.dumps(d, indent=1) + "\n"
    if fmt == "html":
        return html_page.diff_page(a, b, d, _detail, _label)
    lines = [f"A: {d['a']}", f"B: {d['b']}",
             f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed", ""]
    for e in d["added"]:
        lines.append(f"+ {e['op']}  {e['policy']}")
    for e in d["removed"]:
        lines.append(f"- {e['op']}  {e['policy']}")
    for e in d["changed"]:
        lines.append(f"~ {e['op']}  {e['from']} → {e['to']}")
    return "\n".join(lines) + "\n"


def _label(table: dict) -> str:
    return f"torch {table['torch_version']} {table['device']} {table['dtype']} ({table['mode']})"
