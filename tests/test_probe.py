"""The probe against the real torch dispatcher: known facts, completeness, freshness, bad input."""

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from amplint.probe import tables  # noqa: E402
from amplint.probe.command import policies_readme  # noqa: E402
from amplint.probe.render import FORMATS, diff, render  # noqa: E402
from conftest import ROOT  # noqa: E402

POLICY_DIR = ROOT / "policies" / f"torch-{'.'.join(torch.__version__.split('.')[:2])}"


def policy(table: dict, op: str) -> str | None:
    return next((e["policy"] for e in table["ops"] if e["op"] == op), None)


def test_devices_come_from_the_dispatcher(probed_all):
    assert {"cpu", "cuda", "xpu", "mps", "mtia"} <= set(probed_all)


@pytest.mark.parametrize("device", ["cpu", "cuda", "xpu", "mps", "mtia"])
def test_every_op_with_an_autocast_kernel_is_classified(probed_all, device):
    table = probed_all[device]
    assert table["counts"]["ops"] > 50
    unclassified = [(e["op"], e.get("reason")) for e in table["ops"] if e["policy"] is None]
    assert unclassified == []


CUDA_FACTS = {
    "lower_precision_fp": ["aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
                           "aten::conv2d"],
    "fp32": ["aten::layer_norm", "aten::exp", "aten::log", "aten::mse_loss"],
    "promote": ["aten::addcmul", "aten::addcdiv", "aten::atan2", "aten::index_put", "aten::scatter_add"],
    "fp32_set_opt_dtype": ["aten::sum", "aten::prod", "aten::cumsum", "aten::softmax.int",
                           "aten::log_softmax.int"],
    "fp32_append_dtype": ["aten::norm.Scalar"],
    "banned": ["aten::binary_cross_entropy"],
}


@pytest.mark.parametrize("expected,op", [(p, op) for p, ops in CUDA_FACTS.items() for op in ops])
def test_known_cuda_policies(probed_all, expected, op):
    assert policy(probed_all["cuda"], op) == expected


def test_banned_keeps_torchs_message(probed_all):
    entry = next(e for e in probed_all["cuda"]["ops"] if e["op"] == "aten::binary_cross_entropy")
    assert "unsafe to autocast" in entry["evidence"]["message"]
    assert "torch.nn.BCELoss" in entry["python"]
    assert "torch.nn.functional.binary_cross_entropy" in entry["python"]


def test_evidence_names_the_casts_and_redispatch(probed_all):
    mm = next(e for e in probed_all["cuda"]["ops"] if e["op"] == "aten::mm")
    assert sorted(mm["evidence"]["casts"]) == [["mat2", "float32", "float16"], ["self", "float32", "float16"]]
    norm = next(e for e in probed_all["cuda"]["ops"] if e["op"] == "aten::norm.Scalar")
    assert norm["evidence"]["redispatch"]["op"] == "aten::norm.ScalarOpt_dtype"
    assert norm["evidence"]["redispatch"]["args"]["dtype"] == "float32"


def test_python_spellings_are_found_by_calling(probed_all):
    cuda = {e["op"]: e["python"] for e in probed_all["cuda"]["ops"]}
    assert {"torch.mm", "torch.Tensor.mm"} <= set(cuda["aten::mm"])
    assert {"torch.nn.functional.linear", "torch.nn.Linear"} <= set(cuda["aten::linear"])
    assert "torch.Tensor.__matmul__" in cuda["aten::matmul"]
    assert "torch.nn.Conv2d" in cuda["aten::conv2d"]


def test_known_cpu_facts(probed_all):
    cpu = probed_all["cpu"]
    assert cpu["default_dtype"] == "bfloat16"
    for op in ("aten::cat", "aten::stack", "aten::index_copy"):
        assert policy(cpu, op) == "promote", op
    assert policy(cpu, "aten::binary_cross_entropy") == "fp32"
    assert policy(cpu, "aten::softmax.int") is None  # no cpu autocast kernel at all
    assert policy(cpu, "aten::layer_norm") is None
    assert all(e["op"] not in ("aten::softmax.int", "aten::layer_norm") for e in cpu["ops"])


def test_cpu_simulation_agrees_with_execution(probed_all):
    cpu = probed_all["cpu"]
    assert cpu["mode"] == "simulate+execute"
    executed = [e for e in cpu["ops"] if "policy" in e["evidence"].get("execute", {})]
    assert len(executed) >= 0.95 * len(cpu["ops"])  # issue #15 item 6: samples for nearly every op
    assert [e["disagreement"] for e in cpu["ops"] if "disagreement" in e] == []
    for e in executed:  # the real output dtype follows the policy
        outputs = e["evidence"]["execute"]["output_dtypes"]
        if e["policy"] == "lower_precision_fp" and "fp32" in outputs:
            assert outputs["fp32"] == "bfloat16", e["op"]
        if e["policy"] == "fp32" and "lowp" in outputs:
            assert outputs["lowp"] != "bfloat16", e["op"]  # float32, or complex64 for ffts


def test_supported_dtypes_are_asked_of_torch(probed_all):
    assert probed_all["cpu"]["supported_dtypes"] == ["float16", "bfloat16"]
    assert probed_all["cpu"]["dtype_checks"]["float64"].startswith("disabled")
    assert probed_all["xpu"]["dtype_checks"]["float32"].startswith("disabled")


def _comparable(table: dict) -> dict:
    return {k: v for k, v in table.items() if k not in ("generated", "amplint_version")}


@pytest.mark.parametrize("device", ["cpu", "cuda", "xpu", "mps", "mtia", "maia"])
def test_committed_tables_are_fresh(probed_all, device):
    committed = json.loads((POLICY_DIR / f"{device}.json").read_text())
    regenerated = json.loads(render([probed_all[device]], "json"))
    assert _comparable(committed) == _comparable(regenerated), (
        "stale table: run amplint probe --device all --format json --output-dir " + str(POLICY_DIR))


def test_committed_readme_is_fresh(probed_all):
    ordered = [probed_all[d] for d in sorted(probed_all)]
    committed = (POLICY_DIR / "README.md").read_text()
    fresh = policies_readme(ordered)
    strip = lambda text: "\n".join(l for l in text.splitlines() if not l.startswith("Probed from"))  # noqa: E731
    assert strip(committed) == strip(fresh)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders(probed_all, fmt):
    text = render([probed_all["cuda"]], fmt)
    assert "aten::mm" in text and "lower_precision_fp" in text


def test_diff_between_devices(probed_all):
    d = diff(probed_all["cuda"], probed_all["cpu"])
    changed = {e["op"]: (e["from"], e["to"]) for e in d["changed"]}
    assert changed["aten::binary_cross_entropy"] == ("banned", "fp32")
    assert {"op": "aten::cat", "policy": "promote"} in d["added"]
    assert any(e["op"] == "aten::softmax.int" for e in d["removed"])


def test_crash_in_one_op_is_reported_and_the_run_goes_on(monkeypatch):
    from amplint.probe import simulate
    real = simulate.probe_op

    def flaky(op, device, lowp):
        if op.full == "aten::mm":
            raise RuntimeError("interception broke")
        return real(op, device, lowp)

    monkeypatch.setattr(simulate, "probe_op", flaky)
    table = tables.build_table("cuda", torch.float16, "simulate", ("mm", "bmm"), {})  # no spellings
    by_op = {e["op"]: e for e in table["ops"]}
    assert "interception broke" in by_op["aten::mm"]["reason"]
    assert by_op["aten::bmm"]["policy"] == "lower_precision_fp"


def test_custom_op_from_import(tmp_path, run_amplint):
    (tmp_path / "myext_ops.py").write_text(textwrap.dedent("""
        import torch

        @torch.library.custom_op("myext::fused_proj", mutates_args=())
        def fused_proj(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x @ w

        @fused_proj.register_fake
        def _(x, w):
            return x.new_empty(x.shape[0], w.shape[1])

        torch.library.register_autocast("myext::fused_proj", "cuda", torch.float16)
    """))
    result = run_amplint("probe", "--import", "myext_ops", "--device", "cuda", "--ops", "myext::*",
                         "--format", "json", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    [entry] = table["ops"]
    assert entry["op"] == "myext::fused_proj"
    assert entry["policy"] == "lower_precision_fp"
    assert "torch.ops.myext.fused_proj" in entry["python"]


def test_unknown_device_names_the_known_ones(run_amplint):
    result = run_amplint("probe", "--device", "gpu")
    assert result.returncode == 2
    assert "unknown device 'gpu'" in result.stderr and "cuda" in result.stderr and "cpu" in result.stderr


def test_unsupported_dtype_is_a_usage_error(run_amplint):
    result = run_amplint("probe", "--device", "cpu", "--dtype", "float64")
    assert result.returncode == 2
    assert "does not support dtype 'float64'" in result.stderr


def test_execute_needs_the_device(run_amplint):
    result = run_amplint("probe", "--device", "cuda", "--mode", "execute", "--ops", "mm")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert result.returncode == 2 and "needs a cuda device" in result.stderr


def test_missing_torch_says_how_to_install(tmp_path, run_amplint):
    # A module named torch that fails to import stands in for an absent torch.
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch')\n")
    result = run_amplint("probe", "--device", "cuda", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    assert "pip install 'amplint[probe]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_probe_diff_cli(run_amplint):
    result = run_amplint("probe", "diff", POLICY_DIR / "cuda.json", POLICY_DIR / "cpu.json")
    assert result.returncode == 0
    assert "~ aten::binary_cross_entropy  banned → fp32" in result.stdout


def test_readme_lists_where_the_docs_differ(probed_all):
    from amplint.probe.docs import differences
    cuda = differences(probed_all["cuda"])
    # The docs never mention einsum or the upsampling ops; the dispatcher casts them.
    assert "`aten::einsum` (lower_precision_fp): has an autocast kernel, not in the docs' lists" in cuda
    assert any(line.startswith("`__rdiv__`: docs say float32") for line in cuda)
    # Where both name an op, they agree on cuda: no documented op has another policy.
    assert not [line for line in cuda if "; dispatcher:" in line]
    assert differences(probed_all["mps"]) is None
    assert "## Where PyTorch's documentation differs" in (POLICY_DIR / "README.md").read_text()


def test_probing_leaves_this_process_as_it_was():
    """The probe runs thousands of public callables under its interceptor, autocast switched on
    and off; whatever they leave behind is undone (autograd still records a graph afterwards).
    Tensor.index fails through functorch.dim, whose frames hold dispatch-key guards."""
    from amplint.probe.check_spellings import check_table
    from amplint.probe.spellings import trace_spellings

    trace_spellings("cuda", only={"torch.Tensor.index", "torch.nn.LSTM", "torch.nonzero"})
    tables.build_table("cpu", torch.bfloat16, "auto", ("mm", "conv2d"), {})
    check_table(json.loads((POLICY_DIR / "cuda.json").read_text()), only={"torch.mm", "torch.Tensor.index"})
    x = torch.ones(2, requires_grad=True)
    assert (x * 2).grad_fn is not None
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def test_ops_that_match_nothing_is_a_usage_error(run_amplint):
    result = run_amplint("probe", "--device", "cuda", "--ops", "nomatch*")
    assert result.returncode == 2 and result.stdout == ""  # as the other usage errors
    assert "Error: --ops 'nomatch*' matches no op with an autocast kernel on cuda" in result.stderr
    assert "(conv2d, conv*, *softmax*)" in result.stderr  # how patterns are matched


def _legend_rows(unclassified: str) -> list[str]:
    from amplint.probe.html_page import NO_KERNEL_MEANING, POLICY_MEANINGS
    rows = [(policy or unclassified, meaning) for policy, meaning in POLICY_MEANINGS.items()]
    assert {name for name, _ in rows} >= {"lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype",
                                          "promote", "banned"}
    width = max(len(name) for name, _ in rows + [("(not listed)", "")])
    return [f"{name.ljust(width)}  {meaning}" for name, meaning in rows + [("(not listed)", NO_KERNEL_MEANING)]]


def test_the_policy_names_are_explained_in_help_text_and_html_alike(run_amplint, probes_of_all_devices):
    from amplint.probe.html_page import POLICY_MEANINGS, tables_page
    from amplint.probe.render import _detail
    helped = run_amplint("probe", "--help")
    assert helped.returncode == 0
    assert "Policies (what autocast does to an op):\n" in helped.stdout
    help_lines = [line.strip() for line in helped.stdout.splitlines()]
    for row in _legend_rows("unclassified"):
        assert row in help_lines, row
    # Under the text table; softmax has no cpu autocast kernel: a warning, the others probed.
    _, runs = probes_of_all_devices
    result = runs["softmax.int"]  # probe --device all --mode simulate --ops softmax.int
    assert result.returncode == 0, result.stderr
    assert "amplint probe: warning: --ops 'softmax.int' matches no op on cpu" in result.stderr
    assert "aten::softmax.int  fp32_set_opt_dtype" in result.stdout
    tail = result.stdout.split("\npolicies:\n")[1]
    assert [line.strip() for line in tail.splitlines()] == _legend_rows("UNCLASSIFIED")
    assert result.stdout.count("\npolicies:\n") == 1  # once, after every device's table
    page = tables_page([json.loads((POLICY_DIR / "cuda.json").read_text())], _detail)
    for policy, meaning in POLICY_MEANINGS.items():
        assert f"<b>{policy or 'unclassified'}</b> {meaning}</span>" in page


# `probe diff`: every recorded field, any file the probe writes, malformed files in one line.

def _committed(device: str) -> dict:
    return json.loads((POLICY_DIR / f"{device}.json").read_text())


def _op_entry(table: dict, op: str) -> dict:
    return next(e for e in table["ops"] if e["op"] == op)


def test_diff_reports_dtype_and_spelling_changes(tmp_path, run_amplint):
    old = _committed("cuda")
    new = json.loads(json.dumps(old))
    new["default_dtype"] = "bfloat16"
    new["supported_dtypes"] = [d for d in new["supported_dtypes"] if d != "float64"]
    mm = _op_entry(new, "aten::mm")
    mm["python"] = [p for p in mm["python"] if p != "torch.mm"] + ["torch.Tensor.mm_new"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(old))
    b.write_text(json.dumps(new))
    result = run_amplint("probe", "diff", a, b)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2] == "0 added, 0 removed, 1 changed, 2 table settings changed"
    assert "~ default_dtype  float16 → bfloat16" in lines
    assert "~ supported_dtypes  -float64" in lines
    assert "~ aten::mm  python +torch.Tensor.mm_new -torch.mm" in lines
    as_json = json.loads(run_amplint("probe", "diff", a, b, "--format", "json").stdout)
    [changed] = as_json["changed"]
    assert changed["op"] == "aten::mm" and "policy" not in changed["fields"]
    assert changed["fields"]["python"] == {"added": ["torch.Tensor.mm_new"], "removed": ["torch.mm"]}
    assert {s["field"] for s in as_json["settings"]} == {"default_dtype", "supported_dtypes"}
    page = run_amplint("probe", "diff", a, b, "--format", "html").stdout
    assert "changed: python +torch.Tensor.mm_new -torch.mm" in page
    assert "default_dtype: float16 → bfloat16" in page


def test_diff_of_a_table_with_itself_is_empty(run_amplint):
    result = run_amplint("probe", "diff", POLICY_DIR / "cpu.json", POLICY_DIR / "cpu.json")
    assert result.returncode == 0
    assert result.stdout.splitlines()[2] == "0 added, 0 removed, 0 changed"


def test_diff_reads_multi_device_files(tmp_path, run_amplint):
    both = tmp_path / "all.json"
    both.write_text(json.dumps([_committed("cpu"), _committed("cuda")]))
    result = run_amplint("probe", "diff", both, POLICY_DIR / "cuda.json")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{both}: not a policy table: holds tables for 2 devices (cpu, cuda): choose one with --device" \
        in result.stderr
    chosen = run_amplint("probe", "diff", both, POLICY_DIR / "cuda.json", "--device", "cuda")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines()[2] == "0 added, 0 removed, 0 changed"
    missing = run_amplint("probe", "diff", both, both, "--device", "mps")
    assert missing.returncode == 2 and "no table for device 'mps' (has: cpu, cuda)" in missing.stderr


def _broken_entry(table: dict) -> dict:
    del table["ops"][0]["policy"]
    return table


MALFORMED = {
    "not json": (b"{not json", "Expecting property name"),
    "not utf-8": (b"\xff\xfe\x00garbage", "codec can't decode"),
    "a number": (b"3", "expected a JSON object (one device's table), found int"),
    "empty list": (b"[]", "an empty list of tables"),
    "no ops": (json.dumps({k: v for k, v in _committed("cpu").items() if k != "ops"}).encode(), "no 'ops' field"),
    "ops not a list": (json.dumps({**_committed("cpu"), "ops": {"a": 1}}).encode(), "'ops' is dict, expected list"),
    "entry without policy": (json.dumps(_broken_entry(_committed("cpu"))).encode(), "has no policy"),
    "bad casts": (json.dumps({**_committed("cpu"), "ops": [{"op": "aten::mm", "policy": "fp32",
                                                           "evidence": {"casts": [1]}}]}).encode(),
                  "'evidence.casts' is not a list of [input, from, to]"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "not a policy table"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_diff_names_a_malformed_table_in_one_line(tmp_path, run_amplint, name):
    content, said = MALFORMED[name]
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    for args in ((bad, POLICY_DIR / "cpu.json"), (POLICY_DIR / "cpu.json", bad)):
        result = run_amplint("probe", "diff", *args, "--format", "html")
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
        [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert error.startswith(f"Error: {bad}: not a policy table: ") and said in error, error


IMPORT_FAILURES = {
    "raises": ("import torch\nraise RuntimeError('no GPU for the extension')\n",
               "--import brokenext: RuntimeError: no GPU for the extension (", "brokenext.py:2)"),
    "syntax": ("def f(:\n", "--import brokenext: SyntaxError: ", "brokenext.py"),
    "exits": ("import sys\nsys.exit(3)\n", "--import brokenext: SystemExit: 3 (", "brokenext.py:2)"),
    "missing dependency": ("import no_such_dependency_xyz\n",
                           "--import brokenext: No module named 'no_such_dependency_xyz'", ""),
}


@pytest.mark.parametrize("name", IMPORT_FAILURES)
def test_import_failures_are_one_clear_line(tmp_path, run_amplint, name):
    source, said, where = IMPORT_FAILURES[name]
    (tmp_path / "brokenext.py").write_text(source)
    result = run_amplint("probe", "--import", "brokenext", "--device", "cpu", "--ops", "mm",
                         env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert said in error and where in error, error


def test_a_failed_kernel_invariant_is_no_ban():
    # On a CUDA build, cuDNN's RNN autocast kernel asserts its weight layout before casting: a
    # sample that breaks that invariant must not read as the kernel refusing the op (banned).
    from amplint.probe.classify import is_refusal
    from amplint.probe.samples import SPECIFIC

    cuda = json.loads((ROOT / "policies" / "torch-2.13" / "cuda.json").read_text())
    bce = next(e for e in cuda["ops"] if e["op"] == "aten::binary_cross_entropy")
    assert is_refusal(bce["evidence"]["message"])
    assert not is_refusal('RuntimeError: (weight_stride0 == 3) || (weight_stride0 == 5) INTERNAL ASSERT FAILED '
                          'at "/pytorch/aten/src/ATen/cudnn/AutocastRNN.cpp":49, please report a bug to PyTorch.')
    rnn = SPECIFIC["_cudnn_rnn"].values
    assert (rnn["weight_stride0"], rnn["proj_size"]) == (2, 0)  # no biases, no projection: the layout it asserts
