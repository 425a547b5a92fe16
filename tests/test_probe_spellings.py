"""Python spellings the probe finds by tracing: eager's C++ composite path, keyword variants,
class targets, float64 paths. One trace of the public API, shared by the module."""

import pytest

torch = pytest.importorskip("torch")

from amplint.probe import tables  # noqa: E402
from amplint.probe.render import render  # noqa: E402


@pytest.fixture(scope="module")
def cuda() -> dict:
    [table] = tables.probe(["cuda"], None, "simulate", ())
    return {e["op"]: e for e in table["ops"]}


@pytest.mark.parametrize("op,spellings", [
    ("aten::upsample_nearest2d", ["torch.nn.functional.interpolate", "torch.nn.functional.upsample",
                                  "torch.nn.Upsample", "torch.nn.UpsamplingNearest2d"]),
    ("aten::upsample_bilinear2d", ["torch.nn.functional.interpolate", "torch.nn.Upsample",
                                   "torch.nn.UpsamplingBilinear2d"]),
    ("aten::upsample_trilinear3d", ["torch.nn.functional.interpolate", "torch.nn.Upsample"]),
    ("aten::upsample_bicubic2d", ["torch.nn.functional.interpolate"]),
    ("aten::_upsample_bilinear2d_aa", ["torch.nn.functional.interpolate"]),
    ("aten::_upsample_nearest_exact1d", ["torch.nn.functional.interpolate", "torch.nn.Upsample"]),
    ("aten::renorm", ["torch.renorm", "torch.Tensor.renorm"]),
    ("aten::nll_loss", ["torch.nn.functional.cross_entropy", "torch.nn.CrossEntropyLoss"]),
    ("aten::nll_loss2d", ["torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss"]),
    ("aten::log_softmax.int", ["torch.nn.functional.cross_entropy"]),
])
def test_spellings_reach_the_op_eager_cuda_calls(cuda, op, spellings):
    assert cuda[op]["policy"] in ("fp32", "fp32_set_opt_dtype")
    missing = [s for s in spellings if s not in cuda[op]["python"]]
    assert missing == [], f"{op} lacks {missing}"


def test_interpolate_does_not_stop_at_a_python_decomposition(cuda):
    # The Python decomposition of upsample_nearest2d.vec goes to _unsafe_index, which has no
    # autocast kernel; eager runs the C++ composite kernel, which calls upsample_nearest2d.
    nearest = [op for op, e in cuda.items() if "torch.nn.functional.interpolate" in e["python"]]
    assert {"aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d"} <= set(nearest)


def test_float_power_runs_in_float64_not_fp32(cuda):
    for op in ("aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor"):
        entry = cuda[op]
        assert "torch.float_power" not in entry["python"] and "torch.Tensor.float_power" not in entry["python"]
        assert {"torch.float_power", "torch.Tensor.float_power"} <= set(entry["python_float64"])
        assert "torch.pow" in entry["python"]  # pow itself is still fp32
    text = render([{"torch_version": "x", "device": "cuda", "dtype": "float16", "mode": "simulate",
                    "counts": {"ops": 1, "unclassified": 0}, "ops": [cuda["aten::pow.Tensor_Scalar"]]}], "table")
    assert "runs in float64 (autocast leaves float64 alone) when reached by torch.Tensor.float_power" in text


def test_float_power_really_returns_float64_under_autocast():
    """What the table says, run for real on cpu (bfloat16 autocast)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.float_power(torch.ones(2), 2).dtype == torch.float64
        assert torch.ones(2).float_power(torch.ones(2)).dtype == torch.float64


def test_rnn_modules_reach_their_rnn_ops():
    [cpu] = tables.probe(["cpu"], None, "simulate", ("mkldnn_rnn_layer", "linear"))
    by_op = {e["op"]: e["python"] for e in cpu["ops"]}
    assert "torch.nn.LSTM" in by_op["aten::mkldnn_rnn_layer"]  # eager cpu: the oneDNN RNN layer
    assert {"torch.nn.GRU", "torch.nn.RNN"} <= set(by_op["aten::linear"])


def test_device_only_kernel_is_supplemented_with_its_source(cuda):
    """A CPU build has no AutocastCUDA kernel for _cudnn_rnn; the cuda table still lists it,
    marked as a supplement with PyTorch's source, so the RNN modules reach an RNN op."""
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_cudnn_rnn", "AutocastCUDA"):
        entry = cuda["aten::_cudnn_rnn"]  # a cuDNN build: probed from its own dispatcher
        assert "supplement" not in entry["evidence"]
        return
    entry = cuda["aten::_cudnn_rnn"]
    assert entry["policy"] == "lower_precision_fp" and entry["evidence"]["supplement"] is True
    assert "AutocastRNN.cpp" in entry["evidence"]["source"] and entry["evidence"]["dtype"] == "float16"
    assert "confirmed on a GPU" in entry["note"]
    assert {"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN"} <= set(entry["python"])


def test_supplement_respects_device_and_patterns():
    from amplint.probe.device_only import supplement
    assert supplement("cpu", set(), lambda op: True) == []
    assert supplement("cuda", set(), lambda op: False) == []
    assert supplement("cuda", {"aten::_cudnn_rnn"}, lambda op: True) == []
    [only_mm] = tables.probe(["cuda"], None, "simulate", ("mm",))
    assert [e["op"] for e in only_mm["ops"]] == ["aten::mm"]
