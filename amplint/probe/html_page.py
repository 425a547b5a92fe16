"""Policy tables as one self-contained HTML page: ops as rows, tables (devices, torch versions)
as columns, each cell coloured by policy, a legend, a filter box and the evidence on hover.
No torch here, and nothing fetched from the network: styles and script are inline."""

from __future__ import annotations

import html

# What each policy means: the one text of the legend here, of the one under the text table
# and of `amplint probe --help` (render.policy_legend), so that they cannot drift apart.
POLICY_MEANINGS = {
    "lower_precision_fp": "runs in the lower-precision dtype",
    "fp32": "runs in float32",
    "fp32_set_opt_dtype": "float32 unless a dtype is passed",
    "fp32_append_dtype": "float32 via an appended dtype argument",
    "promote": "runs in the widest input dtype",
    "banned": "raises under autocast",
    None: "not classified",
}
NO_KERNEL_MEANING = "no autocast kernel (runs as called)"

# Colours chosen to stay apart for the common kinds of colour blindness (Tableau 10; fp32's
# blue lightened) and light enough for CELL_TEXT_COLOR on each to reach WCAG AA (4.5:1).
CELL_TEXT_COLOR = "#000"
POLICY_COLORS = {policy: (color, POLICY_MEANINGS[policy]) for policy, color in {
    "lower_precision_fp": "#f28e2b",
    "fp32": "#5a85b3",
    "fp32_set_opt_dtype": "#76b7b2",
    "fp32_append_dtype": "#59a14f",
    "promote": "#b07aa1",
    "banned": "#e15759",
    None: "#bab0ac",
}.items()}

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.sub { color: #555; margin: 0 0 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 12px; margin: 8px 0 12px; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.swatch { width: 14px; height: 14px; border-radius: 3px; display: inline-block; }
#filter { font: inherit; padding: 4px 8px; width: 320px; }
#count { color: #555; margin-left: 8px; }
table { border-collapse: collapse; margin-top: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; white-space: nowrap; }
th { background: #f5f5f5; position: sticky; top: 0; }
td.op { font-family: ui-monospace, monospace; }
td.policy { color: %s; text-align: center; font-size: 12px; }
td.absent { color: #aaa; text-align: center; }
td.status { font-size: 12px; }
tr.hidden { display: none; }
""" % CELL_TEXT_COLOR

# The filter matches op names and Python spellings; `#filter=text` in the URL pre-fills it.
_SCRIPT = """
const box = document.getElementById('filter');
const rows = Array.from(document.querySelectorAll('tbody tr'));
const count = document.getElementById('count');
function apply() {
  const words = box.value.toLowerCase().split(/\\s+/).filter(Boolean);
  let shown = 0;
  for (const row of rows) {
    const hay = row.dataset.search;
    const keep = words.every(w => hay.includes(w));
    row.classList.toggle('hidden', !keep);
    if (keep) shown++;
  }
  count.textContent = shown + ' of ' + rows.length + ' ops';
}
box.addEventListener('input', apply);
const m = location.hash.match(/^#filter=(.*)$/);
if (m) box.value = decodeURIComponent(m[1]);
apply();
"""


def _legend() -> str:
    items = []
    for policy, (color, meaning) in POLICY_COLORS.items():
        name = policy or "unclassified"
        items.append(f'<span><i class="swatch" style="background:{color}"></i><b>{name}</b> '
                     f'{html.escape(meaning)}</span>')
    items.append('<span><i class="swatch" style="border:1px solid #ccc"></i><b>—</b> '
                 f'{html.escape(NO_KERNEL_MEANING)}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _cell(entry: dict | None, detail: str) -> str:
    if entry is None:
        return '<td class="absent">—</td>'
    policy = entry["policy"]
    color = POLICY_COLORS.get(policy, POLICY_COLORS[None])[0]
    tip = "\n".join(filter(None, [f"{entry['op']}: {policy or 'unclassified'}", detail,
                                  ("Python: " + ", ".join(entry.get("python", [])))
                                  if entry.get("python") else ""]))
    return (f'<td class="policy" style="background:{color}" data-policy="{policy or "unclassified"}" '
            f'title="{html.escape(tip)}">{html.escape(policy or "unclassified")}</td>')


def page(title: str, subtitle: str, columns: list[str], rows: list[tuple[str, list, str | None]],
         detail) -> str:
    """``rows``: (op, one table entry or None per column, a status text or None)."""
    with_status = any(status for _, _, status in rows)
    head = "<th>op</th>" + ("<th>change</th>" if with_status else "") + \
        "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for op, entries, status in rows:
        spellings = {p for e in entries if e for p in e.get("python", [])}
        search = " ".join([op, *sorted(spellings)]).lower()
        cells = "".join(_cell(e, detail(e) if e else "") for e in entries)
        status_cell = f'<td class="status">{html.escape(status or "")}</td>' if with_status else ""
        body.append(f'<tr data-search="{html.escape(search)}"><td class="op">{html.escape(op)}</td>'
                    f"{status_cell}{cells}</tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(subtitle)}</p>
{_legend()}
<input id="filter" type="search" placeholder="Filter ops or Python spellings, e.g. softmax" autofocus>
<span id="count"></span>
<table><thead><tr>{head}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
<script>{_SCRIPT}</script>
</body></html>
"""


def tables_page(tables: list[dict], detail) -> str:
    """Every op of every table; one column per table."""
    by_column = [{e["op"]: e for e in t["ops"]} for t in tables]
    ops = sorted(set().union(*by_column))
    columns = [f"{t['device']} ({t['dtype']})" for t in tables]
    versions = sorted({t["torch_version"] for t in tables})
    modes = sorted({t["mode"] for t in tables})
    subtitle = (f"torch {', '.join(versions)} · mode {', '.join(modes)} · {len(ops)} ops with an "
                "autocast kernel on at least one device · generated by amplint probe")
    rows = [(op, [c.get(op) for c in by_column], None) for op in ops]
    return page("What autocast does to each op", subtitle, columns, rows, detail)


def diff_page(a: dict, b: dict, changes: dict, detail, label, summary: str, describe) -> str:
    """The ops that differ between two tables, with both tables' policies side by side; a
    changed op's status says what changed (policy, spellings, note); table-wide settings
    that changed are listed above the grid."""
    ea, eb = ({e["op"]: e for e in t["ops"]} for t in (a, b))
    rows = [(c["op"], [ea.get(c["op"]), eb.get(c["op"])],
             f"changed: {describe(c)}" if kind == "changed" else kind)
            for kind in ("added", "removed", "changed") for c in changes[kind]]
    rows.sort(key=lambda r: r[0])
    settings = "; ".join(
        f"{s['field']}: {s['from']} → {s['to']}" for s in changes.get("settings", []))
    subtitle = f"{summary} · generated by amplint probe diff" + (f" · {settings}" if settings else "")
    return page(f"Autocast policy changes: {label(a)} → {label(b)}", subtitle,
                [f"A: {label(a)}", f"B: {label(b)}"], rows, detail)
