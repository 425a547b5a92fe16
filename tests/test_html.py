"""The op grid: `probe --format html` and `probe diff --format html`, checked as files and in a
real headless Chromium (installed from Debian when missing and possible, otherwise skipped
with the reason)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

POLICY_DIR = ROOT / "policies" / "torch-2.13"
DEVICES = ["cpu", "cuda", "maia", "mps", "mtia", "xpu"]


@pytest.fixture(scope="module")
def grid(probes_of_all_devices):
    """The page the README's command writes, from a real probe of the installed torch (the
    session's, see conftest.PROBES_OF_ALL_DEVICES)."""
    folder, runs = probes_of_all_devices
    out, result = folder / "ops.html", runs["html"]
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    return out


def test_grid_is_one_self_contained_page(grid):
    page = grid.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "nothing may be fetched"
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", page).group(1)
    assert re.findall(r"<th>(\w+) \(", header) == DEVICES
    rows = page.count("<tr data-search=")
    ops = set()
    for device in DEVICES:
        ops |= {e["op"] for e in json.loads((POLICY_DIR / f"{device}.json").read_text())["ops"]}
    assert rows == len(ops)
    assert 'data-policy="banned"' in page and 'data-policy="lower_precision_fp"' in page


def test_diff_page_shows_both_sides(run_amplint, tmp_path):
    out = tmp_path / "diff.html"
    result = run_amplint("probe", "diff", POLICY_DIR / "cpu.json", POLICY_DIR / "cuda.json",
                         "--format", "html", "--output", out)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert "<th>change</th>" in page and "A: torch 2.13.0" in page
    text = run_amplint("probe", "diff", POLICY_DIR / "cpu.json", POLICY_DIR / "cuda.json").stdout
    summary = text.splitlines()[2]  # "N added, M removed, K changed"
    assert summary in page


def _browser_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    paths = _browser_paths()
    if paths is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "chromium", "chromium-driver"], capture_output=True, timeout=600)
        paths = _browser_paths()
    if paths is None:
        pytest.skip("headless Chromium is not available: install the Debian packages chromium and "
                    "chromium-driver (this set-up installs them itself only as root with apt-get)")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,900"):
        options.add_argument(flag)
    from selenium.webdriver.chrome.service import Service
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=options)
    yield driver
    driver.quit()


def _visible_ops(driver) -> list[str]:
    from selenium.webdriver.common.by import By
    return [row.find_element(By.CSS_SELECTOR, "td.op").text
            for row in driver.find_elements(By.CSS_SELECTOR, "tbody tr") if row.is_displayed()]


def test_grid_in_a_real_browser_filters_and_shows_evidence(browser, grid, tmp_path):
    from selenium.webdriver.common.by import By
    browser.get(grid.as_uri())
    count = browser.find_element(By.ID, "count").text
    shown, total = map(int, re.match(r"(\d+) of (\d+) ops", count).groups())
    assert shown == total == len(_visible_ops(browser)) > 100

    box = browser.find_element(By.ID, "filter")
    box.send_keys("softmax")
    visible = _visible_ops(browser)
    assert visible and all("softmax" in op or _row_mentions(browser, op, "softmax") for op in visible)
    assert "aten::softmax.int" in visible and "aten::mm" not in visible
    assert browser.find_element(By.ID, "count").text == f"{len(visible)} of {total} ops"

    cell = browser.find_element(By.CSS_SELECTOR, 'td[data-policy="banned"]')
    assert "binary_cross_entropy" in cell.get_attribute("title")  # the evidence, on hover
    png = tmp_path / "grid.png"
    assert browser.save_screenshot(str(png)) and png.stat().st_size > 10_000
    target = os.environ.get("AMPLINT_SCREENSHOT")  # regenerates docs/probe.md's picture
    if target:
        browser.get(grid.as_uri())
        browser.save_screenshot(str(Path(target)))


def _row_mentions(driver, op: str, word: str) -> bool:
    from selenium.webdriver.common.by import By
    row = driver.find_element(By.XPATH, f'//tbody/tr[td[@class="op" and text()="{op}"]]')
    return word in row.get_attribute("data-search")


def test_filter_from_the_address_and_clearing_it(browser, grid):
    from selenium.webdriver.common.by import By
    browser.get("about:blank")
    browser.get(grid.as_uri() + "#filter=linalg")
    visible = _visible_ops(browser)
    assert "aten::linalg_cholesky" in visible and "aten::_convolution" not in visible
    assert all(_row_mentions(browser, op, "linalg") for op in visible)
    box = browser.find_element(By.ID, "filter")
    box.clear()
    box.send_keys(" ")  # an empty filter shows everything again
    shown, total = map(int, re.match(r"(\d+) of (\d+) ops", browser.find_element(By.ID, "count").text).groups())
    assert shown == total


def _rgb(color: str) -> tuple[float, float, float]:
    """#rgb, #rrggbb or a colour keyword the page might use, as 0..1 channels."""
    named = {"white": "#ffffff", "black": "#000000"}
    color = named.get(color.strip().lower(), color.strip().lower())
    digits = color.lstrip("#")
    if len(digits) == 3:
        digits = "".join(c * 2 for c in digits)
    assert re.fullmatch(r"[0-9a-f]{6}", digits), f"not a colour this test reads: {color!r}"
    return tuple(int(digits[i:i + 2], 16) / 255 for i in (0, 2, 4))


def _luminance(color: str) -> float:
    """WCAG 2 relative luminance."""
    def linear(c):
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = map(linear, _rgb(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(fg: str, bg: str) -> float:
    light, dark = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_contrast_ratio_matches_wcag_reference_values():
    assert round(contrast_ratio("#fff", "#000"), 2) == 21.0
    assert round(contrast_ratio("#777777", "#ffffff"), 2) == 4.48  # the classic "just fails AA"


def _css_property(css: str, selector: str, prop: str) -> str | None:
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        if selector in [s.strip() for s in selectors.split(",")]:
            found = re.search(rf"(?:^|;)\s*{prop}\s*:\s*([^;]+)", body)
            if found:
                return found.group(1).strip()
    return None


def test_grid_text_meets_wcag_aa_on_every_policy_colour():
    """Every policy cell of the page (one of each policy, unclassified too) as the browser
    would paint it: background from the cell's style, text colour from its style or else the
    stylesheet's `td.policy` rule."""
    from amplint.probe.render import render
    tables = [json.loads((POLICY_DIR / f"{d}.json").read_text()) for d in DEVICES]
    policies = ["lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote",
                "banned", None]
    tables[0]["ops"] += [{"op": f"test::every_{p}", "policy": p, "evidence": {}, "reason": "test"}
                         for p in policies]
    page = render(tables, "html")
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    default_text = _css_property(css, "td.policy", "color") or _css_property(css, "body", "color")
    cells = re.findall(r'<td class="policy" style="([^"]*)" data-policy="([^"]*)"', page)
    seen: dict[str, set[tuple[str, str]]] = {}
    for style, policy in cells:
        background = re.search(r"background(?:-color)?\s*:\s*([^;]+)", style).group(1)
        text = re.search(r"(?:^|;)\s*color\s*:\s*([^;]+)", style)
        seen.setdefault(policy, set()).add((text.group(1) if text else default_text, background))
    assert set(seen) == {p or "unclassified" for p in policies}
    low = {(policy, fg, bg, round(contrast_ratio(fg, bg), 2))
           for policy, pairs in seen.items() for fg, bg in pairs if contrast_ratio(fg, bg) < 4.5}
    assert low == set(), "below WCAG AA 4.5:1"
