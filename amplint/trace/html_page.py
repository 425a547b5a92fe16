"""The trace as one self-contained HTML page: the module tree of the traced model, each module
coloured by the dtype of its outputs under autocast, its op counts per dtype in a column and in a
detail box (on hover or keyboard focus), and the loss scale over the steps as an inline SVG.
No torch here, and nothing fetched from the network: styles and script are inline."""

from __future__ import annotations

import html
import json
import math

from ..probe.html_page import CELL_TEXT_COLOR

NOT_RUN = "not run"

# Colours light enough for CELL_TEXT_COLOR on each to reach WCAG AA (4.5:1); the dtype is also
# written in its own column, so nothing is told by colour alone.
DTYPE_COLORS = {
    "float32": ("#6f9fd1", "every output float32"),
    "float16": ("#f28e2b", "every output float16"),
    "bfloat16": ("#8cd17d", "every output bfloat16"),
    "mixed": ("#c49bc0", "outputs of more than one floating dtype"),
    "other": ("#e8c547", "no float32/float16/bfloat16 output (float64, integers, none)"),
    NOT_RUN: ("#e4e4e4", "never called in the traced steps"),
}
_HALF_AND_SINGLE = ("float32", "float16", "bfloat16")

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 20px 0 6px; }
.sub { color: #555; margin: 0 0 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 8px 14px; margin: 8px 0 12px; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.chip { color: %(text)s; padding: 1px 8px; border-radius: 3px; font-size: 12px; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ddd; padding: 3px 8px; white-space: nowrap; text-align: left; }
th { background: #f5f5f5; }
td.module { color: %(text)s; font-family: ui-monospace, monospace; }
tr.module:hover td, tr.module:focus td { outline: 2px solid #222; outline-offset: -2px; }
tr.module:focus { outline: none; }
td.ops { font-size: 12px; }
#detail { margin: 10px 0; padding: 8px 12px; border: 1px solid #bbb; border-radius: 4px; min-height: 2.8em;
          max-width: 900px; white-space: pre-wrap; }
.findings li { font-family: ui-monospace, monospace; font-size: 12px; }
svg text { fill: #222; font-size: 12px; }
svg .axis { stroke: #555; }
svg .grid { stroke: #e4e4e4; }
svg .curve { fill: none; stroke: #1f5fa0; stroke-width: 2; }
svg .point circle { fill: #1f5fa0; }
svg .point .skip { stroke: #c0282d; stroke-width: 3; }
svg .point:focus circle, svg .point:hover circle { stroke: #222; stroke-width: 2; }
""" % {"text": CELL_TEXT_COLOR}

# The detail box shows a row's or a curve point's data-detail on hover and on keyboard focus.
_SCRIPT = """
const detail = document.getElementById('detail');
const initial = detail.textContent;
for (const el of document.querySelectorAll('[data-detail]')) {
  const show = () => { detail.textContent = el.dataset.detail; };
  el.addEventListener('mouseenter', show);
  el.addEventListener('focus', show);
  el.addEventListener('blur', () => { detail.textContent = initial; });
}
"""


def output_kind(module: dict) -> str:
    """The colour key of one dtype-map entry (None: the module never ran)."""
    if not module or not (module.get("calls") or module.get("ops")):
        return NOT_RUN
    # The code outside any module has no calls, only ops: coloured by what its ops gave.
    dtypes = module.get("autocast_output_dtypes") or module.get("output_dtypes") or list(module.get("ops", {}))
    floating = {d for d in dtypes if d in _HALF_AND_SINGLE}
    if len(floating) > 1:
        return "mixed"
    return floating.pop() if floating else "other"


def percent(fraction: float) -> str:
    return "0" if fraction == 0 else f"{fraction * 100:.3g}%"


def _half_outputs_text(numerics: dict | None) -> str:
    if numerics is None:
        return ""
    return (f"\nhalf outputs: inf/NaN {percent(numerics['overflow'])} · zero {percent(numerics['zero'])} · "
            f"subnormal {percent(numerics['subnormal'])}")


def _ops_text(ops: dict) -> str:
    return ", ".join(f"{dtype} {count}" for dtype, count in ops.items()) or "-"


def _legend() -> str:
    items = [f'<span><b class="chip" style="background:{color}">{html.escape(kind)}</b> {html.escape(meaning)}</span>'
             for kind, (color, meaning) in DTYPE_COLORS.items()]
    return '<div class="legend" id="legend">' + "".join(items) + "</div>"


def _rows(modules: list[dict], tree: dict[str, str]) -> list[str]:
    by_name = {m["module"]: m for m in modules}
    names = list(tree) + [n for n in by_name if n not in tree]  # the model's order, then the rest
    rows = []
    for name in names:
        m = by_name.get(name, {})
        kind = output_kind(m)
        depth = name.count(".")
        short = name.rsplit(".", 1)[-1] if depth else name
        mtype = m.get("type", tree.get(name, ""))
        inputs = ", ".join(m.get("input_dtypes", [])) or "-"
        outputs = ", ".join(m.get("autocast_output_dtypes") or m.get("output_dtypes", [])) or "-"
        ops = _ops_text(m.get("ops", {}))
        detail = (f"{name} ({mtype or 'code outside modules'}): {kind}\n"
                  f"calls {m.get('calls', 0)} · inputs {inputs} · outputs {outputs}\n"
                  f"ops under autocast by dtype: {ops}{_half_outputs_text(m.get('half_outputs'))}")
        color = DTYPE_COLORS[kind][0]
        rows.append(
            f'<tr class="module" tabindex="0" data-module="{html.escape(name)}" data-dtype="{html.escape(kind)}" '
            f'data-detail="{html.escape(detail)}" title="{html.escape(detail)}">'
            f'<td class="module" style="background:{color};padding-left:{8 + 18 * depth}px">{html.escape(short)}</td>'
            f"<td>{html.escape(mtype)}</td><td>{html.escape(kind)}</td><td>{m.get('calls', 0)}</td>"
            f"<td>{html.escape(inputs)}</td><td>{html.escape(outputs)}</td>"
            f'<td class="ops">{html.escape(ops)}</td></tr>')
    return rows


def _curve(steps: list[dict]) -> str:
    points = [s for s in steps if s.get("loss_scale")]
    if not points:
        return ('<p class="sub" id="no-scale">No loss scale: no enabled GradScaler stepped in the traced '
                "steps.</p>")
    width, height, left, right, top, bottom = 680, 220, 130, 20, 12, 36
    logs = [math.log2(s["loss_scale"]) for s in points]
    low, high = math.floor(min(logs)), math.ceil(max(logs))
    if low == high:
        low, high = low - 1, high + 1
    first, last = points[0]["step"], points[-1]["step"]

    def x(step: int) -> float:
        return left + (width - left - right) * ((step - first) / (last - first) if last > first else 0.5)

    def y(log: float) -> float:
        return top + (height - top - bottom) * (high - log) / (high - low)

    parts = [f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}"/>',
             f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}"/>']
    stride = max(1, math.ceil((high - low) / 6))
    for e in range(low, high + 1, stride):
        parts.append(f'<line class="grid" x1="{left + 1}" y1="{y(e):.1f}" x2="{width - right}" y2="{y(e):.1f}"/>'
                     f'<text x="{left - 6}" y="{y(e) + 4:.1f}" text-anchor="end">2^{e}{f" = {2 ** e}" if e >= 0 else ""}</text>')
    for s in points:
        parts.append(f'<text x="{x(s["step"]):.1f}" y="{height - bottom + 16}" text-anchor="middle">{s["step"]}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 4}" text-anchor="middle">optimizer step</text>')
    coords = [(x(s["step"]), y(lg)) for s, lg in zip(points, logs)]
    parts.append('<polyline class="curve" points="' + " ".join(f"{px:.1f},{py:.1f}" for px, py in coords) + '"/>')
    for s, (px, py) in zip(points, coords):
        skipped = bool(s.get("skipped"))
        text = (f"step {s['step']}: loss scale {s['loss_scale']:g}"
                + (f", {s['scale_after_update']:g} after update" if s.get("scale_after_update") else "")
                + (" — skipped (inf/NaN gradients)" if skipped else ""))
        mark = (f'<path class="skip" d="M{px - 6:.1f},{py - 6:.1f}L{px + 6:.1f},{py + 6:.1f}'
                f'M{px - 6:.1f},{py + 6:.1f}L{px + 6:.1f},{py - 6:.1f}"/>' if skipped
                else f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4"/>')
        parts.append(f'<g class="point" tabindex="0" data-step="{s["step"]}" data-skipped="{str(skipped).lower()}" '
                     f'data-detail="{html.escape(text)}"><title>{html.escape(text)}</title>{mark}</g>')
    skipped = sum(bool(s.get("skipped")) for s in points)
    return (f'<svg id="loss-scale" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'xmlns="http://www.w3.org/2000/svg" aria-label="loss scale over {len(points)} steps, '
            f'{skipped} skipped">' + "".join(parts) + "</svg>"
            '<div class="legend"><span>● a step</span><span><b style="color:#c0282d">✕</b> a skipped step '
            "(the scaler found inf/NaN gradients and did not run optimizer.step)</span></div>")


def page(modules: list[dict], steps: list[dict], findings: list[dict], tree: dict[str, str] | None = None,
         command: str = "", ending: str = "") -> str:
    """``modules``: the dtype map (Tracer.dtype_map); ``steps``: StepRecord dicts; ``findings``:
    check's JSON dicts; ``tree``: every module of the model, name -> type, in the model's order."""
    tree = tree or {}
    title = "amplint trace" + (f": {command}" if command else "")
    n = len(findings)
    subtitle = " · ".join(filter(None, [ending, f"{n} finding{'s' * (n != 1)}", f"{len(tree) or len(modules)} modules",
                                        "generated by amplint trace"]))
    found = "".join(f'<li>{html.escape(f["filename"])}:{f["location"]["row"]}:{f["location"]["column"]}: '
                    f'{html.escape(f["code"])} {html.escape(f["message"])}</li>' for f in findings)
    data = json.dumps({"modules": modules, "steps": steps, "findings": findings, "tree": tree}).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(subtitle)}</p>
{'<h2>Findings</h2><ul class="findings">' + found + '</ul>' if found else ''}
<h2>Modules, coloured by the dtype of their outputs under autocast</h2>
{_legend()}
<table id="modules"><thead><tr><th>module</th><th>type</th><th>outputs under autocast</th><th>calls</th>
<th>input dtypes</th><th>output dtypes</th><th>ops under autocast, by dtype</th></tr></thead>
<tbody>
{chr(10).join(_rows(modules, tree))}
</tbody></table>
<div id="detail" role="status" aria-live="polite">Hover over a module or a step, or reach it with Tab, for its details.</div>
<h2>Loss scale over the optimizer steps</h2>
{_curve(steps)}
<script type="application/json" id="trace-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
