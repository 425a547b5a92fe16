"""#15 item 1: spellings traced per device, and every mapped spelling called under its device's
(simulated) autocast with the op's output dtype checked against the table's policy.

The suite runs a slice (a few seconds); benchmarks/spelling_dtypes.py runs every (op, spelling)
pair of every table (about 1,900, ~20 s) and prints each that does not agree."""

import json

import pytest

torch = pytest.importorskip("torch")

from amplint.probe.check_spellings import check_table  # noqa: E402
from conftest import ROOT  # noqa: E402

POLICY_DIR = ROOT / "policies" / f"torch-{'.'.join(torch.__version__.split('.')[:2])}"
DEVICES = ["cpu", "cuda", "mps", "xpu", "mtia", "maia"]

# Spellings of every policy, composites that decompose by device, and the example.
SLICE = {"torch.mm", "torch.nn.functional.linear", "torch.nn.Linear", "torch.Tensor.norm", "torch.norm",
         "torch.nn.functional.normalize", "torch.arccos", "torch.cumsum", "torch.dot", "torch.cat",
         "torch.nn.functional.softmax", "torch.nn.functional.binary_cross_entropy", "torch.nn.BCELoss",
         "torch.nn.functional.cross_entropy", "torch.cov", "torch.nn.GRU", "torch.nn.LSTM", "torch.prod",
         "torch.nn.functional.nll_loss", "torch.nn.functional.interpolate"}

# (op, spelling) pairs that do not check out, each with why: not skipped, listed. A pair not
# here must agree; a pair here that starts agreeing must be taken off (the test says so).
KNOWN = {
    ("aten::_cudnn_rnn", s): "device-only supplement: a CPU build has no AutocastCUDA kernel to reach"
    for s in ("torch.nn.GRU", "torch.nn.LSTM", "torch.nn.RNN")
} | {
    ("aten::log_softmax.int", s): "cross_entropy_loss passes dtype=input's dtype to log_softmax, which "
    "fp32_set_opt_dtype keeps: it runs in the autocast dtype, not float32 as the table's entry implies"
    for s in ("torch.nn.functional.cross_entropy", "torch.nn.CrossEntropyLoss",
              "torch.nn.functional.linear_cross_entropy", "torch.nn.LinearCrossEntropyLoss")
}


def _table(device):
    return json.loads((POLICY_DIR / f"{device}.json").read_text())


@pytest.fixture(scope="module")
def sliced():
    return {d: check_table(_table(d), only=SLICE) for d in DEVICES}


@pytest.mark.parametrize("device", DEVICES)
def test_mapped_spellings_run_in_the_policys_dtype(sliced, device):
    results = sliced[device]
    assert len(results) > 15
    bad = [f"{r.op} via {r.spelling} ({r.policy}): {r.status}: {r.detail}" for r in results
           if r.status != "ok" and (r.op, r.spelling) not in KNOWN]
    assert bad == [], "\n".join(bad)
    stale = [f"{r.op} via {r.spelling}" for r in results if r.status == "ok" and (r.op, r.spelling) in KNOWN]
    assert stale == [], f"now agree; take them off KNOWN: {stale}"
    checked = {r.policy for r in results if r.status == "ok"}
    assert {"lower_precision_fp", "fp32"} <= checked


def test_every_policy_is_checked_somewhere(sliced):
    checked = {r.policy for rs in sliced.values() for r in rs if r.status == "ok"}
    assert {"lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned"} <= checked


def test_the_check_catches_a_wrong_mapping():
    """The issue's example, put back: on mps, Tensor.norm(p=2, dim=1) reaches norm.ScalarOpt_dim
    (torch.functional.norm takes another path there), which has no MPS autocast kernel; mapping it
    to linalg_vector_norm (fp32) fails the check, as the cpu-traced table did."""
    table = _table("mps")
    entry = next(e for e in table["ops"] if e["op"] == "aten::linalg_vector_norm")
    assert "torch.Tensor.norm" not in entry["python"]
    entry["python"] = ["torch.Tensor.norm"]
    [result] = check_table({**table, "ops": [entry]})
    assert result.status != "ok"


def test_spellings_are_traced_per_device():
    by_device = {d: {e["op"]: e.get("python", []) for e in _table(d)["ops"]} for d in ("cpu", "mps", "cuda")}
    # torch.functional.norm sends cpu/cuda to linalg_vector_norm, other devices to _VF.norm.
    assert "torch.Tensor.norm" in by_device["cuda"]["aten::linalg_vector_norm"]
    assert "torch.Tensor.norm" not in by_device["mps"]["aten::linalg_vector_norm"]
    assert "torch.Tensor.norm" in by_device["mps"]["aten::frobenius_norm.dim"]
    # at::lstm takes oneDNN's layer on cpu only.
    assert "torch.nn.LSTM" in by_device["cpu"]["aten::mkldnn_rnn_layer"]
    # MPS runs its own _fused_rms_norm kernel (native_functions.yaml says so), not the composite's
    # pow/rsqrt (the cpu trace's path, which the mps table used to copy).
    assert [op for op, names in by_device["mps"].items() if "torch.nn.functional.rms_norm" in names] == []
    assert "torch.nn.functional.rms_norm" in by_device["cuda"]["aten::rms_norm"]


def test_spellings_this_build_cannot_trace_on_a_device_are_listed():
    for device in DEVICES[1:]:
        listed = _table(device).get("spellings_traced_on_cpu", [])
        assert "torch.nonzero" in listed, device  # a device guard this build cannot make
    assert "spellings_traced_on_cpu" not in _table("cpu")
