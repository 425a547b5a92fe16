"""Python spellings the probe finds by tracing: eager's C++ composite path, keyword variants,
class targets, float64 paths. The tables come from the session's probe of every device."""

import pytest

torch = pytest.importorskip("torch")

from amplint.probe import tables  # noqa: E402
from amplint.probe.render import _detail as render_detail, render  # noqa: E402


@pytest.fixture
def cuda(probed_all) -> dict:
    return {e["op"]: e for e in probed_all["cuda"]["ops"]}


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


def test_cross_entropy_passes_log_softmax_a_dtype(cuda):
    """cross_entropy's C++ kernel calls log_softmax(input, dim, input.scalar_type()), and the
    fp32_set_opt_dtype kernel keeps a dtype passed: log_softmax runs in the input's dtype, not in
    float32. The trace lists cross_entropy apart; it still reaches nll_loss (fp32), whose output
    (the loss) is float32."""
    log_softmax = cuda["aten::log_softmax.int"]
    losses = {"torch.nn.functional.cross_entropy", "torch.nn.CrossEntropyLoss"}
    assert losses <= set(log_softmax["python_explicit_dtype"])
    assert not losses & set(log_softmax["python"])
    assert "torch.nn.functional.log_softmax" in log_softmax["python"]
    assert losses <= set(cuda["aten::nll_loss"]["python"])
    assert "runs in the dtype passed to it" in render_detail(log_softmax)


def test_cross_entropy_runs_log_softmax_in_half_under_cuda_autocast():
    """What the table says, seen at the dispatcher: under (simulated) CUDA autocast, half logits
    reach log_softmax with dtype=float16 and it returns float16; nll_loss gets float32."""
    from amplint.probe.intercept import ProbeTensor, autocast_switched_on, run_traced
    seen = {}

    def on_output(stack, func, args, kwargs, out):
        if stack[-1] == "aten::log_softmax.int":  # (input, dim, dtype)
            seen[stack[-1]] = (args[0].dtype, args[2], out.dtype)
        if stack[-1] == "aten::nll_loss":
            seen[stack[-1]] = (args[0].dtype, out.dtype)

    logits = ProbeTensor((2, 4), torch.float16, "cuda")
    target = ProbeTensor((2,), torch.long, "cuda")
    with autocast_switched_on("cuda", torch.float16):
        run_traced(lambda: torch.nn.functional.cross_entropy(logits, target), "cuda",
                   lambda *_: None, on_output)
    assert seen["aten::log_softmax.int"] == (torch.float16, torch.float16, torch.float16)
    assert seen["aten::nll_loss"] == (torch.float32, torch.float32)


def test_ops_reached_with_no_floating_input_are_not_spellings_of_them(cuda):
    """torch.nanmean counts the non-NaN elements with sum over a boolean mask: autocast has
    nothing to cast there (a half input's nanmean runs in half), so nanmean is no spelling of
    sum's fp32_set_opt_dtype."""
    entry = cuda["aten::sum.dim_IntList"]
    assert "torch.sum" in entry["python"]
    assert not {"torch.nanmean", "torch.Tensor.nanmean"} & set(entry["python"])
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sums(TorchDispatchMode):
        inputs: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.sum.dim_IntList:
                self.inputs.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    with Sums() as sums:
        torch.nanmean(torch.tensor([1.0, float("nan")]))
    assert sums.inputs == [torch.bool]


def test_float_power_really_returns_float64_under_autocast():
    """What the table says, run for real on cpu (bfloat16 autocast)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.float_power(torch.ones(2), 2).dtype == torch.float64
        assert torch.ones(2).float_power(torch.ones(2)).dtype == torch.float64


def test_rnn_modules_reach_their_rnn_ops(probed_all):
    by_op = {e["op"]: e["python"] for e in probed_all["cpu"]["ops"]}
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
    only_mm = tables.build_table("cuda", torch.float16, "simulate", ("mm",), {})  # no spellings
    assert [e["op"] for e in only_mm["ops"]] == ["aten::mm"]
