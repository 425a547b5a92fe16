"""Cast-back (issue #15 item 3): an autocast kernel that runs an op in float32 and casts the
output back to the input's dtype, as torchvision's roi_align wrapper does. The probe (simulated
and executed on cpu, by the real CLI) records `cast_back`; execution checks output dtypes
against the policy and fails on a disagreement; the linter's dtype inference follows the
input's dtype through such an op. The ops are real custom ops of a package the test writes."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

CASTPKG_OPS = textwrap.dedent("""\
    import torch

    _lib = torch.library.Library("castlib", "FRAGMENT")
    _CPU_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    @torch.library.custom_op("castlib::roi_pool", mutates_args=())
    def roi_pool(x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return x * boxes.mean()

    @roi_pool.register_fake
    def _(x, boxes):
        return torch.empty_like(x)

    def _roi_pool_cast_back(x, boxes):
        # As torchvision's roi_align wrapper: run in float32, give back the input's dtype.
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):
            return roi_pool(x.float(), boxes.float()).to(x.dtype)

    _lib.impl("roi_pool", _roi_pool_cast_back, "AutocastCPU")

    @torch.library.custom_op("castlib::roi_pool_fp32", mutates_args=())
    def roi_pool_fp32(x: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return x * boxes.mean()

    @roi_pool_fp32.register_fake
    def _(x, boxes):
        return torch.empty_like(x)

    def _roi_pool_in_float32(x, boxes):
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):
            return roi_pool_fp32(x.float(), boxes.float())

    _lib.impl("roi_pool_fp32", _roi_pool_in_float32, "AutocastCPU")

    @torch.library.custom_op("castlib::upcast_mm", mutates_args=())
    def upcast_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).float()  # float32 whatever autocast gives it ...

    @upcast_mm.register_fake
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[1])  # ... which its fake kernel does not say

    torch.library.register_autocast("castlib::upcast_mm", "cpu", torch.bfloat16)
""")

# The same code twice: through the op that casts back, and through the one that stays float32.
TRAIN = textwrap.dedent("""\
    import torch
    import castpkg

    def pooled_features(x, w, boxes):
        with torch.autocast("cpu"):
            h = torch.mm(x, w)
            pooled = castpkg.roi_pool(h, boxes)
        return torch.mm(pooled, torch.randn(64, 10))

    def float32_features(x, w, boxes):
        with torch.autocast("cpu"):
            h = torch.mm(x, w)
            pooled = castpkg.roi_pool_fp32(h, boxes)
        return torch.mm(pooled, torch.randn(64, 10))

    class Head(torch.nn.Module):
        def forward(self, feats, boxes):
            pooled = torch.ops.castlib.roi_pool(feats, boxes)
            return pooled + torch.zeros(pooled.shape[1], device=feats.device)

    class Float32Head(torch.nn.Module):
        def forward(self, feats, boxes):
            pooled = torch.ops.castlib.roi_pool_fp32(feats, boxes)
            return pooled + torch.zeros(pooled.shape[1], device=feats.device)
""")


def _amplint(*args, cwd: Path):
    return subprocess.run([sys.executable, "-m", "amplint", *map(str, args)], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(cwd)}, capture_output=True, text=True)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The project, and the result of probing its ops on cpu (simulated, then executed)."""
    project = tmp_path_factory.mktemp("castproject")
    (project / "castpkg").mkdir()
    (project / "castpkg" / "ops.py").write_text(CASTPKG_OPS)
    (project / "castpkg" / "__init__.py").write_text("from .ops import roi_pool, roi_pool_fp32, upcast_mm\n")
    (project / "train.py").write_text(TRAIN)
    result = _amplint("probe", "--import", "castpkg", "--device", "cpu", "--ops", "castlib::*",
                      "--format", "json", "--output-dir", ".amplint/policies", cwd=project)
    table = json.loads((project / ".amplint" / "policies" / "cpu.json").read_text())
    return project, result, {e["op"]: e for e in table["ops"]}


def test_the_probe_records_cast_back_simulated_and_executed(probed):
    _, _, entries = probed
    back = entries["castlib::roi_pool"]
    assert back["policy"] == "fp32" and back["cast_back"] is True
    assert back["evidence"]["output_casts"] == [["output", "float32", "bfloat16"]]
    assert back["evidence"]["execute"]["cast_back"] is True
    assert back["evidence"]["execute"]["output_dtypes"]["lowp"] == "bfloat16"
    assert "disagreement" not in back
    kept = entries["castlib::roi_pool_fp32"]
    assert kept["policy"] == "fp32" and "cast_back" not in kept
    assert kept["evidence"]["execute"]["output_dtypes"]["lowp"] == "float32"


def test_an_output_dtype_the_policy_does_not_predict_fails_the_probe(probed):
    _, result, entries = probed
    assert entries["castlib::upcast_mm"]["disagreement"] == \
        "fp32 inputs gave float32, lower_precision_fp predicts bfloat16"
    assert result.returncode == 1, result.stderr
    assert "amplint probe: disagreement: cpu castlib::upcast_mm: fp32 inputs gave float32" in result.stderr
    assert "castlib::roi_pool:" not in result.stderr


def test_the_linter_follows_the_input_through_a_cast_back_op(probed):
    project = probed[0]
    (project / "pyproject.toml").write_text('[tool.amplint]\ndevice = "cpu"\npolicies = ".amplint/policies"\n')
    result = _amplint("check", "--preview", "train.py", "--output-format", "json", "--no-cache", cwd=project)
    found = sorted((d["location"]["row"], d["code"]) for d in json.loads(result.stdout))
    # The cast-back op's output is the region's bfloat16 (AMP019) and the model's activations
    # (AMP003); the float32 op's output is float32 in both places: nothing to report.
    assert found == [(8, "AMP019"), (19, "AMP003")], result.stdout + result.stderr
