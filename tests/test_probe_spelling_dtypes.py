"""#15 item 1: spellings traced per device, and every Python spelling a committed table maps to
an op called under its device's (simulated) autocast, the dtype the op runs in checked against
what the table says.

A pair that no generated call brings to its op is listed below with why, and what the check
says of it: the check must find exactly those (a new one fails, as does a listed one that
starts running). benchmarks/spelling_dtypes.py prints the same check for every table."""

import json
import re

import pytest

torch = pytest.importorskip("torch")

from amplint.probe.check_spellings import LISTS, check_table  # noqa: E402
from amplint.probe.intercept import DeviceDependence, ProbeTensor, trace_ops  # noqa: E402
from amplint.probe.spellings import may_differ_on, trace_spellings  # noqa: E402
from conftest import ROOT  # noqa: E402

POLICY_DIR = ROOT / "policies" / f"torch-{'.'.join(torch.__version__.split('.')[:2])}"
DEVICES = ["cpu", "cuda", "maia", "mps", "mtia", "xpu"]

# Why a pair cannot be checked, and a pattern of what the check says of it.
_REFUSES_LOW_PRECISION = (
    "the spelling refuses inputs of the autocast dtype before it reaches the op (PyTorch's own "
    "check); given float32, the op runs in float32 with its autocast kernel or without: nothing "
    "to tell apart", r"Low precision dtypes not supported|but got (Half|BFloat16)")
_DEVICE_ONLY_KERNEL = (
    "a supplement (device_only.py): this CPU build has no AutocastCUDA kernel for the op to reach",
    r"^supplement: this build has no autocast kernel")
_TRACED_ON_CPU = (
    "listed in the table's spellings_traced_on_cpu: this build cannot run the spelling on the "
    "device (a DispatchStub kernel it lacks), its ops are those it reaches on cpu",
    r"^its ops are as traced on cpu \(spellings_traced_on_cpu\)")
_ON_EVERY_ACCELERATOR = {
    ("aten::cumprod", "torch.linalg.vander"): _REFUSES_LOW_PRECISION,
    ("aten::linalg_matrix_norm", "torch.linalg.cond"): _REFUSES_LOW_PRECISION,
}
_TRANSFORMERS = {("aten::layer_norm", f"torch.nn.{m}"): _TRACED_ON_CPU
                 for m in ("Transformer", "TransformerDecoderLayer", "TransformerEncoderLayer")}
NOT_REACHED = {
    "cpu": {
        ("aten::linalg_svdvals", "torch.nuclear_norm"): _REFUSES_LOW_PRECISION,
        ("aten::stack", "torch.cartesian_prod"): (
            "meshgrid refuses the mixed dtypes a promote op is checked with; given one dtype, "
            "stack has nothing to promote", r"meshgrid expects all tensors to have the same dtype"),
    },
    "cuda": _ON_EVERY_ACCELERATOR | {("aten::_cudnn_rnn", f"torch.nn.{m}"): _DEVICE_ONLY_KERNEL
                                     for m in ("GRU", "LSTM", "RNN")},
    "maia": _ON_EVERY_ACCELERATOR,
    "mps": _ON_EVERY_ACCELERATOR | _TRANSFORMERS,
    "mtia": _ON_EVERY_ACCELERATOR,
    "xpu": _ON_EVERY_ACCELERATOR | _TRANSFORMERS,
}


def _table(device):
    return json.loads((POLICY_DIR / f"{device}.json").read_text())


@pytest.mark.parametrize("device", DEVICES)
def test_every_mapped_spelling_runs_in_the_dtype_its_table_says(device):
    table = _table(device)
    results = check_table(table)
    listed = {(e["op"], s, key) for e in table["ops"] for key in LISTS for s in e.get(key, [])}
    assert {(r.op, r.spelling, r.listed) for r in results} == listed  # every one called
    wrong = [f"{r.op} via {r.spelling} ({r.listed}, {r.policy}): {r.detail}" for r in results
             if r.status not in ("ok", "not reached")]
    assert wrong == [], "\n".join(wrong)
    not_reached = {(r.op, r.spelling): r.detail for r in results if r.status == "not reached"}
    unexplained = {pair: detail for pair, detail in not_reached.items() if pair not in NOT_REACHED[device]}
    assert unexplained == {}, "not reached, and not listed in NOT_REACHED with why"
    running = set(NOT_REACHED[device]) - set(not_reached)
    assert running == set(), "listed in NOT_REACHED, but the check now reaches them: take them off"
    for pair, detail in not_reached.items():
        assert re.search(NOT_REACHED[device][pair][1], detail), (pair, detail)
    # Every policy and every list the table uses is checked on some pair that runs.
    ok = [r for r in results if r.status == "ok"]
    assert {r.policy for r in ok if r.listed == "python"} == {
        e["policy"] for e in table["ops"] if e.get("python") and not e["evidence"].get("supplement")}
    assert {r.listed for r in ok} == {key for _, _, key in listed}


def test_the_check_finds_a_spelling_that_runs_in_another_dtype():
    """The WIP tables listed F.cross_entropy under log_softmax's fp32_set_opt_dtype: put back,
    the check sees log_softmax run in float16 (cross_entropy passes it the input's dtype)."""
    table = _table("cuda")
    entry = next(e for e in table["ops"] if e["op"] == "aten::log_softmax.int")
    assert "torch.nn.functional.cross_entropy" in entry["python_explicit_dtype"]
    wrong = {**entry, "python": ["torch.nn.functional.cross_entropy"], "python_explicit_dtype": []}
    [result] = check_table({**table, "ops": [wrong]})
    assert (result.status, result.detail) == ("wrong", "runs in float16, fp32_set_opt_dtype predicts float32")


def test_the_check_finds_a_spelling_that_does_not_reach_its_op():
    """The issue's example, put back: on mps, Tensor.norm(p=2, dim=1) reaches norm.ScalarOpt_dim
    (torch.functional.norm takes another path there), which has no MPS autocast kernel; mapping it
    to linalg_vector_norm (fp32) fails the check, as the cpu-traced table did."""
    table = _table("mps")
    entry = next(e for e in table["ops"] if e["op"] == "aten::linalg_vector_norm")
    assert "torch.Tensor.norm" not in entry["python"]
    [result] = check_table({**table, "ops": [{**entry, "python": ["torch.Tensor.norm"]}]})
    assert result.status == "not reached"


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
    for device in DEVICES:
        listed = _table(device).get("spellings_traced_on_cpu", [])
        if device == "cpu":
            assert listed == []
        else:
            assert "torch.nonzero" in listed, device  # a device guard this build cannot make
            assert "torch.Tensor.xpu" not in listed  # C++ takes every device as initialised


def _dependence(device, call) -> DeviceDependence:
    dependence = DeviceDependence()
    trace_ops(call, device, dependence=dependence)
    return dependence


def test_a_trace_notes_what_it_asked_of_the_device():
    x = ProbeTensor((4, 4), torch.float32, "cuda")
    assert _dependence("cuda", lambda: torch.mm(x, x)) == DeviceDependence()
    # F.linear is a composite (calling matmul, another): followed unless the device has a
    # kernel of its own (mps has).
    assert _dependence("cuda", lambda: torch.nn.functional.linear(x, x)) == DeviceDependence(
        composites={"aten::linear", "aten::matmul"})
    assert _dependence("cuda", lambda: torch.norm(x)).asked_device  # Python reads input.device.type
    assert _dependence("cuda", lambda: torch.softmax(x, 1)).asked_device  # C++ asks input.is_cuda()
    assert _dependence("cuda", lambda: torch.zeros(2, device="cuda")).asked_device  # names one
    assert _dependence("cuda", lambda: x.new_zeros(2, device=x.device)).asked_device


# Spellings whose path differs by device (see test_spellings_are_traced_per_device and
# PublicApiTraces) and some whose path does not.
_SLICE = {"torch.norm", "torch.Tensor.norm", "torch.nn.functional.normalize", "torch.nn.functional.linear",
          "torch.nn.Linear", "torch.nn.LSTM", "torch.nn.GRU", "torch.nn.functional.dropout",
          "torch.nn.functional.rms_norm", "torch.max_pool2d", "torch.cov", "torch.Tensor.xpu", "torch.nonzero",
          "torch.mm", "torch.nn.functional.interpolate", "torch.nn.functional.cross_entropy", "torch.cumsum"}


def test_traces_shared_between_devices_are_those_of_the_device():
    """The probe traces the public API in full on the first device only (PublicApiTraces); on
    each other device it traces again the spellings whose trace may differ there and shares
    the rest. For these spellings, the same as tracing them on the device itself."""
    on_cpu = trace_spellings("cpu", only=_SLICE)
    for device in ("cuda", "mps", "xpu"):
        again = {s for s, t in on_cpu.items() if may_differ_on(t, "cpu", device)}
        assert {"torch.norm", "torch.nn.LSTM", "torch.nn.functional.dropout"} <= again, device
        assert not {"torch.mm", "torch.cumsum"} & again, device  # shared
        shared = {**on_cpu, **trace_spellings(device, only=again)}
        own = trace_spellings(device, only=_SLICE)
        assert {s: (t.chains, t.completed, t.lacks_device) for s, t in shared.items()} == \
            {s: (t.chains, t.completed, t.lacks_device) for s, t in own.items()}, device
    # mps has kernels of its own for linear and max_pool2d: their composites' paths differ.
    assert may_differ_on(on_cpu["torch.nn.functional.linear"], "cpu", "mps")
    assert not may_differ_on(on_cpu["torch.nn.functional.linear"], "cpu", "cuda")


def test_a_trace_does_not_depend_on_the_devices_traced_before():
    """C++ initialises a device once per process (x.xpu() calls torch.xpu._lazy_init, which the
    probe answers while it traces xpu): the probe answers it for every device before its first
    trace, so x.xpu() traced on mtia does not change once xpu was traced."""
    def traced_on(device):
        t = trace_spellings(device, only={"torch.Tensor.xpu"})["torch.Tensor.xpu"]
        return t.chains, t.completed, t.lacks_device

    before = traced_on("mtia")
    traced_on("xpu")
    assert traced_on("mtia") == before
    assert before[1] and not before[2]
