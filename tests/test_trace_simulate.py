"""`amplint trace --simulate cuda`: a small CNN and a small transformer run forward and backward
under CUDA's autocast policy on this CPU-only torch, and every op the committed cuda table lists
ran in the dtype its policy gives; AMP003 and AMP008 from the simulation; --model/--input errors;
the page in headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402

from amplint.cli import main  # noqa: E402
from conftest import ROOT  # noqa: E402
from test_html import browser  # noqa: E402,F401 - the headless Chromium fixture

MODELS = """\
import math
import torch
from torch import nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.proj(attn @ v)
        return x + self.mlp(self.norm2(x))


class SmallTransformer(nn.Module):
    def __init__(self, vocab=100, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.embed(ids)))


class Padded(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        pad = torch.zeros(h.shape[0], 1, device=h.device)  # <AMP003>
        return torch.cat([h, pad], dim=1)


class BceInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        target = torch.ones(x.shape[0], 1, device=x.device)
        return F.binary_cross_entropy(torch.sigmoid(self.lin(x)), target)  # <AMP008>
"""

TABLE = {e["op"]: e["policy"] for e in
         json.loads((ROOT / "policies" / "torch-2.13" / "cuda.json").read_text(encoding="utf-8"))["ops"]}
ORDER = ["float16", "bfloat16", "float32", "float64"]


def expected_dtype(policy: str, inputs: list[str]) -> str:
    """What the table's policy makes of an op's floating inputs under float16 autocast."""
    if policy == "lower_precision_fp":
        return "float16"
    if policy in ("fp32", "fp32_set_opt_dtype", "fp32_append_dtype"):
        return "float32"
    assert policy == "promote", policy
    return max(inputs, key=ORDER.index)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    (folder / "models.py").write_text(MODELS, encoding="utf-8")
    return folder


def simulate_cli(folder: Path, monkeypatch, model: str, *inputs: str, fmt: str = "json", report: Path | None = None):
    monkeypatch.chdir(folder)
    args = ["trace", "--simulate", "cuda", "--model", f"models:{model}", "--output-format", fmt]
    for spec in inputs:
        args += ["--input", spec]
    if report is not None:
        args += ["--report", str(report)]
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.parametrize("model, spec, listed", [
    ("SmallCNN", "randn(2,3,16,16)", {"aten::convolution", "aten::addmm"}),
    ("SmallTransformer", "randint(100, (2,7))", {"aten::native_layer_norm", "aten::addmm", "aten::bmm"}),
])
def test_dtype_map_matches_the_cuda_table_op_by_op(models, monkeypatch, tmp_path, model, spec, listed):
    result = simulate_cli(models, monkeypatch, model, spec, report=tmp_path / "full.json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    full = json.loads((tmp_path / "full.json").read_text(encoding="utf-8"))
    assert full["error"] is None and set(full["gradients"]) == {"float32"}  # the backward ran
    seen = set()
    for op in full["ops"]:
        assert op["policy"] == TABLE.get(op["op"]), op
        if op["policy"] is not None:
            seen.add(op["op"])
            assert op["output"] == expected_dtype(op["policy"], op["inputs"]), op
    assert listed <= seen, seen
    modules = {m["module"]: m for m in full["modules"]}
    head = modules[f"{model}.head"]
    assert head["autocast_output_dtypes"] == ["float16"] and head["input_dtypes"] in (["float16"], ["float32"])
    if model == "SmallTransformer":
        # softmax is fp32_set_opt_dtype: the attention weights come out float32, the next @ casts them back.
        assert any(op["op"] == "aten::_softmax" and op["output"] == "float32" for op in full["ops"])
        assert modules["SmallTransformer.blocks.0.norm1"]["autocast_output_dtypes"] == ["float32"]


def test_python_api_takes_a_model_and_example_inputs(models, monkeypatch):
    monkeypatch.syspath_prepend(str(models))
    import models as user_models
    from amplint.trace.simulate import simulate

    model = user_models.SmallCNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = simulate(model, torch.randn(2, 3, 8, 8), dtype=torch.bfloat16)
    assert result.error is None and not result.tracer.findings
    assert {m["module"]: m["autocast_output_dtypes"] for m in result.tracer.dtype_map}["SmallCNN.head"] == ["bfloat16"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched


@pytest.mark.parametrize("model, code", [("Padded", "AMP003"), ("BceInside", "AMP008")])
def test_findings_point_at_the_model_source(models, monkeypatch, model, code):
    result = simulate_cli(models, monkeypatch, model, "randn(3,4)")
    findings = json.loads(result.stdout)
    row = next(i for i, line in enumerate(MODELS.splitlines(), 1) if f"# <{code}>" in line)
    assert [(f["code"], f["filename"], f["location"]["row"]) for f in findings] == [(code, "models.py", row)]
    if code == "AMP003":
        assert result.exit_code == 1 and "`aten::cat`" in findings[0]["message"]
    else:  # CUDA's autocast kernel refuses binary_cross_entropy: the simulated step fails as on a GPU
        assert result.exit_code == 1 and "unsafe to autocast" in result.stderr


@pytest.mark.parametrize("model, spec, message", [
    ("Nope", "randn(2,4)", "--model 'models:Nope': models has no Nope"),
    ("Padded", "__import__('os').system('touch pwned')", "--input \"__import__('os').system('touch pwned')\" is not"),
    ("Padded", "randn(2, 4, dtype=torch.evil)", "only dtype= is accepted"),
    ("Padded", "randn(2, -4)", "the shape must be non-negative integers"),
])
def test_bad_model_or_input_is_one_error_line_and_exit_2(models, monkeypatch, model, spec, message):
    result = simulate_cli(models, monkeypatch, model, spec)
    assert result.exit_code == 2
    assert result.stderr.startswith("amplint: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not (models / "pwned").exists()


def test_simulated_page_renders_in_chromium(models, monkeypatch, tmp_path, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    result = simulate_cli(models, monkeypatch, "SmallTransformer", "randint(100, (2,7))", fmt="html")
    assert result.exit_code == 0, result.output
    page = tmp_path / "simulate.html"
    page.write_text(result.stdout, encoding="utf-8")
    browser.get(page.as_uri())
    assert "--simulate cuda" in browser.find_element(By.TAG_NAME, "h1").text
    rows = {r.get_attribute("data-module"): r.get_attribute("data-dtype")
            for r in browser.find_elements(By.CSS_SELECTOR, "tr.module")}
    assert rows["SmallTransformer.head"] == "float16" and rows["SmallTransformer.blocks.0.norm1"] == "float32"
