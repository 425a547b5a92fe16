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
    if ev.get("supplement"):
        return (f"supplement (not in this build's dispatcher): {ev.get('dtype')}, per "
                + str(ev.get("source", "")).split(":")[0])
    if entry["policy"] == "banned":
        return next(iter(str(ev.get("message") or "").splitlines()), "").removeprefix("RuntimeError: ")
    parts = [f"{c[0]} {c[1]}→{c[2]}" for c in ev.get("casts", [])]
    redispatch = ev.get("redispatch", {})
    if redispatch.get("op") and redispatch["op"] != entry["op"]:
        parts.append(f"→ {redispatch['op']}")
    if "dtype" in redispatch.get("args", {}) and not ev.get("casts"):
        parts.append(f"dtype={redispatch['args']['dtype']}")
    if entry.get("cast_back"):
        parts.append("output cast back to the input's dtype")
    if entry.get("python_float64"):
        parts.append("runs in float64 (autocast leaves float64 alone) when reached by "
                     + ", ".join(entry["python_float64"]))
    if entry.get("python_explicit_dtype"):
        parts.append("runs in the dtype passed to it (not by this policy) when reached by "
                     + ", ".join(entry["python_explicit_dtype"]))
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


# Fields of a table that say what autocast accepts on the device (not which op does what).
TABLE_FIELDS = ("default_dtype", "supported_dtypes", "autocast_devices")
# Fields of an op's entry compared besides its policy.
_ENTRY_FIELDS = ("python", "python_float64", "python_explicit_dtype", "cast_back", "note", "disagreement")


class TableError(ValueError):
    """A file that is not a policy table the probe writes; the message says what is wrong."""


def check_table(data) -> dict:
    """``data`` as the probe writes one device's table, or TableError naming the first fault."""
    if not isinstance(data, dict):
        raise TableError(f"expected a JSON object (one device's table), found {type(data).__name__}")
    for key, kind in (("device", str), ("dtype", str), ("torch_version", str), ("mode", str),
                      ("ops", list)):
        if key not in data:
            raise TableError(f"no {key!r} field")
        if not isinstance(data[key], kind):
            raise TableError(f"{key!r} is {type(data[key]).__name__}, expected {kind.__name__}")
    for key in ("supported_dtypes", "autocast_devices", "python"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(v, str) for v in data[key])):
            raise TableError(f"{key!r} is not a list of names")
    for i, entry in enumerate(data["ops"]):
        where = f"ops[{i}]"
        if not isinstance(entry, dict):
            raise TableError(f"{where} is {type(entry).__name__}, expected an object")
        if not isinstance(entry.get("op"), str):
            raise TableError(f"{where} has no op name ('op')")
        where = f"{where} ({entry['op']})"
        if "policy" not in entry or not isinstance(entry["policy"], (str, type(None))):
            raise TableError(f"{where} has no policy (a name or null)")
        python = entry.get("python", [])
        if not (isinstance(python, list) and all(isinstance(p, str) for p in python)):
            raise TableError(f"{where}: 'python' is not a list of names")
        if not isinstance(entry.get("cast_back", False), bool):
            raise TableError(f"{where}: 'cast_back' is not true or false")
        evidence = entry.get("evidence", {})
        if not isinstance(evidence, dict):
            raise TableError(f"{where}: 'evidence' is not an object")
        casts = evidence.get("casts", [])
        if not (isinstance(casts, list) and all(isinstance(c, list) and len(c) == 3 for c in casts)):
            raise TableError(f"{where}: 'evidence.casts' is not a list of [input, from, to]")
        if not isinstance(evidence.get("redispatch", {}), dict):
            raise TableError(f"{where}: 'evidence.redispatch' is not an object")
    return data


def pick_table(data, device: str | None) -> dict:
    """One device's table from what a probe wrote: a single table, or the list that
    ``--device all --format json`` writes (then ``device`` chooses, unless it holds one)."""
    if isinstance(data, list):
        devices = [t.get("device") if isinstance(t, dict) else None for t in data]
        if not data:
            raise TableError("an empty list of tables")
        if device is None:
            if len(data) == 1:
                return check_table(data[0])
            raise TableError(f"holds tables for {len(data)} devices "
                             f"({', '.join(map(str, devices))}): choose one with --device")
        if device not in devices:
            raise TableError(f"no table for device {device!r} (has: {', '.join(map(str, devices))})")
        return check_table(data[devices.index(device)])
    table = check_table(data)
    if device is not None and table["device"] != device:
        raise TableError(f"is the table of device {table['device']!r}, not {device!r}")
    return table


def _list_change(old, new) -> dict:
    old, new = old or [], new or []
    return {"added": [v for v in new if v not in old], "removed": [v for v in old if v not in new]}


def diff(a: dict, b: dict) -> dict:
    """Ops added, removed and changed from table ``a`` to table ``b``: an op changed when its
    policy, its Python spellings, its note or its disagreement differ (``fields`` says which
    and how); ``settings`` lists the table-wide fields that differ (default dtype, accepted
    dtypes, autocast devices)."""
    ea = {e["op"]: e for e in a["ops"]}
    eb = {e["op"]: e for e in b["ops"]}
    changed = []
    for op in sorted(ea.keys() & eb.keys()):
        x, y = ea[op], eb[op]
        fields = {}
        if x["policy"] != y["policy"]:
            fields["policy"] = {"from": x["policy"], "to": y["policy"]}
        for key in _ENTRY_FIELDS:
            old, new = x.get(key), y.get(key)
            listed = key.startswith("python")
            if listed:
                old, new = sorted(old or []), sorted(new or [])
            if old == new:
                continue
            fields[key] = _list_change(old, new) if listed else {"from": old, "to": new}
        if fields:
            changed.append({"op": op, "from": x["policy"], "to": y["policy"], "fields": fields})
    settings = []
    for key in TABLE_FIELDS:
        old, new = a.get(key), b.get(key)
        if old == new:
            continue
        change = {"field": key, "from": old, "to": new}
        if isinstance(old, list) or isinstance(new, list):
            change.update(_list_change(old, new))
        settings.append(change)
    return {
        "a": _label(a), "b": _label(b),
        "added": [{"op": op, "policy": eb[op]["policy"]} for op in sorted(eb.keys() - ea.keys())],
        "removed": [{"op": op, "policy": ea[op]["policy"]} for op in sorted(ea.keys() - eb.keys())],
        "changed": changed,
        "settings": settings,
    }


def diff_summary(d: dict) -> str:
    line = f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed"
    if d.get("settings"):
        line += f", {len(d['settings'])} table setting{'s' if len(d['settings']) != 1 else ''} changed"
    return line


def _names(change: dict) -> str:
    return " ".join([f"+{v}" for v in change.get("added", [])] + [f"-{v}" for v in change.get("removed", [])])


def describe_change(change: dict) -> str:
    """What changed in one op's entry, in words: ``fp32 → promote; python +torch.x -torch.y``."""
    parts = []
    for key, what in change.get("fields", {}).items():
        if key == "policy":
            parts.append(f"{what['from']} → {what['to']}")
        elif key.startswith("python"):
            parts.append(f"{key} {_names(what)}")
        else:
            parts.append(f"{key} {what['from']!r} → {what['to']!r}")
    return "; ".join(parts)


DIFF_FORMATS = ("table", "json", "html")


def render_diff(a: dict, b: dict, fmt: str) -> str:
    d = diff(a, b)
    if fmt == "json":
        return json.dumps(d, indent=1) + "\n"
    if fmt == "html":
        return html_page.diff_page(a, b, d, _detail, _label, diff_summary(d), describe_change)
    lines = [f"A: {d['a']}", f"B: {d['b']}", diff_summary(d), ""]
    for s in d["settings"]:
        shown = _names(s) if "added" in s else f"{s['from']} → {s['to']}"
        lines.append(f"~ {s['field']}  {shown}")
    for e in d["added"]:
        lines.append(f"+ {e['op']}  {e['policy']}")
    for e in d["removed"]:
        lines.append(f"- {e['op']}  {e['policy']}")
    for e in d["changed"]:
        lines.append(f"~ {e['op']}  {describe_change(e)}")
    return "\n".join(lines) + "\n"


def _label(table: dict) -> str:
    return f"torch {table['torch_version']} {table['device']} {table['dtype']} ({table['mode']})"
