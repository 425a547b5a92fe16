"""`amplint trace --output-format html` / `--report page.html`: the module tree coloured by output
dtype and the loss-scale curve, from real tiny CPU training runs, checked as files and in a real
headless Chromium (the op grid's browser fixture: the same skip rules when Chromium is absent)."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402

from amplint.cli import main  # noqa: E402
from conftest import ROOT  # noqa: E402
from test_html import _css_property, browser, contrast_ratio  # noqa: E402,F401 - browser: the fixture

# A small MLP under bfloat16 CPU autocast, no GradScaler; `unused` never runs; forward returns float32.
BF16 = """\
import torch
from torch import nn
import torch.nn.functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.out = nn.Linear(16, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.body(x)).float()

torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""

# float16 with a GradScaler whose first scale is too large: float16 gradients overflow, the first
# steps are skipped and the scale halves until they fit, then grows back every 2 good steps.
FP16 = """\
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20, growth_interval=2)
for _ in range(20):
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def _trace(tmp_path: Path, monkeypatch, source: str, *args) -> tuple:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["trace", *map(str, args), "--", "python", script.name],
                                catch_exceptions=False)
    return result, script


def _data(page: str) -> dict:
    raw = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(raw.replace("<\\/", "</"))


@pytest.fixture(scope="module")
def bf16_page(tmp_path_factory):
    """The page on stdout (`--output-format html`), the program's own output on stderr."""
    tmp = tmp_path_factory.mktemp("bf16")
    with pytest.MonkeyPatch.context() as mp:
        result, _ = _trace(tmp, mp, "print(\"program output\")\n" + BF16, "--steps", "4", "--output-format", "html")
    assert result.exit_code == 0, result.output
    assert "program output" not in result.stdout and "program output" in result.stderr
    page = tmp / "trace.html"
    page.write_text(result.stdout, encoding="utf-8")
    return page


@pytest.fixture(scope="module")
def fp16_page(tmp_path_factory):
    """The page written by `--report page.html` (the text report still on stdout)."""
    tmp = tmp_path_factory.mktemp("fp16")
    with pytest.MonkeyPatch.context() as mp:
        result, _ = _trace(tmp, mp, FP16, "--steps", "12", "--report", tmp / "page.html")
    assert result.exit_code == 0, result.output
    assert "Steps:" in result.stdout
    return tmp / "page.html"


def test_page_is_self_contained_and_holds_the_trace(bf16_page):
    page = bf16_page.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "nothing may be fetched"
    assert "<script src" not in page and "<link" not in page
    data = _data(page)
    assert len(data["steps"]) == 4 and all(s["loss_scale"] is None for s in data["steps"])
    kinds = dict(re.findall(r'data-module="([^"]+)" data-dtype="([^"]+)"', page))
    assert kinds["Net.body.0"] == kinds["Net.body.2"] == kinds["Net.out"] == "bfloat16"
    assert kinds["Net"] == "float32"  # forward ends in .float()
    assert kinds["Net.unused"] == "not run"  # in the model's tree, never called
    assert 'id="no-scale"' in page and "<polyline" not in page  # no GradScaler: no curve


def test_report_html_suffix_writes_the_page_and_json_stays_json(fp16_page, tmp_path, monkeypatch):
    assert fp16_page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    result, _ = _trace(tmp_path, monkeypatch, FP16, "--steps", "2", "--report", tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text())["steps"][0]["step"] == 1


def test_bf16_tree_legend_and_keyboard_details_in_a_real_browser(browser, bf16_page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(bf16_page.as_uri())
    rows = {r.get_attribute("data-module"): r for r in browser.find_elements(By.CSS_SELECTOR, "tr.module")}
    for name in ("Net.body.0", "Net.body.2", "Net.out"):
        row = rows[name]
        assert row.is_displayed() and row.get_attribute("data-dtype") == "bfloat16"
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert cells[1:3] == ["Linear", "bfloat16"] and cells[5] == "bfloat16"
        assert re.fullmatch(r"bfloat16 \d+", cells[6])  # the ops column: every op of a Linear in bfloat16
    # Nested modules are indented under their parent.
    indent = {n: float(rows[n].find_element(By.CSS_SELECTOR, "td.module").value_of_css_property("padding-left")[:-2])
              for n in ("Net", "Net.body", "Net.body.0")}
    assert indent["Net"] < indent["Net.body"] < indent["Net.body.0"]
    legend = browser.find_element(By.ID, "legend")
    assert legend.is_displayed()
    assert [c.text for c in legend.find_elements(By.CSS_SELECTOR, ".chip")] == \
        ["float32", "float16", "bfloat16", "mixed", "other", "not run"]
    assert browser.find_element(By.ID, "no-scale").is_displayed()

    # Keyboard: Tab reaches the rows in order; the focused row's details appear in the detail box.
    from selenium.webdriver.common.action_chains import ActionChains

    browser.execute_script("document.activeElement && document.activeElement.blur()")
    detail = browser.find_element(By.ID, "detail")
    seen = []
    for _ in range(len(rows)):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        focused = browser.switch_to.active_element.get_attribute("data-module")
        seen.append(focused)
        if focused == "Net.body.0":
            assert "Net.body.0 (Linear): bfloat16" in detail.text and "ops under autocast by dtype: bfloat16" in detail.text
    assert seen[:3] == ["Net", "Net.body", "Net.body.0"]


def test_fp16_loss_scale_curve_in_a_real_browser(browser, fp16_page, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(fp16_page.as_uri())
    steps = _data(fp16_page.read_text(encoding="utf-8"))["steps"]
    assert len(steps) == 12
    rows = {r.get_attribute("data-module"): r.get_attribute("data-dtype")
            for r in browser.find_elements(By.CSS_SELECTOR, "tr.module")}
    assert rows["Sequential.0"] == rows["Sequential.2"] == "float16"
    curve = browser.find_element(By.CSS_SELECTOR, "#loss-scale polyline")
    assert curve.is_displayed()
    points = curve.get_attribute("points").split()
    assert len(points) == len(steps)
    ys = [float(p.split(",")[1]) for p in points]
    # Higher scale, higher on the page: y follows log2 of the scale.
    for (a, ya), (b, yb) in zip(zip(steps, ys), zip(steps[1:], ys[1:])):
        assert (ya > yb) == (a["loss_scale"] < b["loss_scale"]) or a["loss_scale"] == b["loss_scale"]
    marks = browser.find_elements(By.CSS_SELECTOR, "#loss-scale g.point")
    skipped = [m.get_attribute("data-step") for m in marks if m.get_attribute("data-skipped") == "true"]
    assert len(marks) == len(steps)
    assert skipped == [str(s["step"]) for s in steps if s["skipped"]] and skipped  # the first steps overflow
    assert len(browser.find_elements(By.CSS_SELECTOR, "#loss-scale g.point path.skip")) == len(skipped)
    assert not all(s["skipped"] for s in steps)
    # A step's point is reachable with the keyboard and tells its scale.
    assert marks[0].get_attribute("tabindex") == "0"
    browser.execute_script("arguments[0].focus()", marks[0])
    assert browser.find_element(By.ID, "detail").text.startswith(f"step 1: loss scale {steps[0]['loss_scale']:g}")
    png = tmp_path / "trace.png"
    assert browser.save_screenshot(str(png)) and png.stat().st_size > 10_000
    if os.environ.get("AMPLINT_SCREENSHOT"):  # regenerates docs/trace-page.png (docs/trace.md's picture)
        browser.get("about:blank")
        browser.get(fp16_page.as_uri())
        browser.set_window_size(1100, 900)
        browser.save_screenshot(str(ROOT / "docs" / "trace-page.png"))
        browser.set_window_size(1400, 900)


def test_page_text_meets_wcag_aa_on_every_colour(bf16_page, fp16_page):
    """Every text on a colour, as the browser paints it: module cells (one per kind, every kind
    forced to appear) and legend chips, text colour from the stylesheet; body text on white."""
    from amplint.trace.html_page import DTYPE_COLORS, page

    kinds = {"float32": ["float32"], "float16": ["float16"], "bfloat16": ["bfloat16"],
             "mixed": ["bfloat16", "float32"], "other": ["int64"]}
    modules = [{"module": f"M.{k}", "type": "T", "calls": 1, "input_dtypes": [], "output_dtypes": d,
                "autocast_output_dtypes": d, "ops": {}} for k, d in kinds.items()]
    pages = [page(modules, [], [], tree={"M.unrun": "T"}), bf16_page.read_text(encoding="utf-8"),
             fp16_page.read_text(encoding="utf-8")]
    seen = set()
    for text in pages:
        css = re.search(r"<style>(.*?)</style>", text, re.S).group(1)
        body_fg, body_bg = _css_property(css, "body", "color"), _css_property(css, "body", "background")
        assert contrast_ratio(body_fg, body_bg) >= 4.5
        for selector, pattern in (("td.module", r'<tr class="module"[^>]*data-dtype="([^"]+)"[^>]*>'
                                                r'<td class="module" style="background:([^;"]+)'),
                                  (".chip", r'<b class="chip" style="background:([^;"]+)">([^<]+)</b>')):
            fg = _css_property(css, selector, "color")
            for a, b in re.findall(pattern, text):
                kind, bg = (a, b) if selector == "td.module" else (b, a)
                seen.add(kind)
                assert contrast_ratio(fg, bg) >= 4.5, (kind, fg, bg, contrast_ratio(fg, bg))
        sub = _css_property(css, ".sub", "color")
        assert contrast_ratio(sub, body_bg) >= 4.5
    assert seen == set(DTYPE_COLORS)
