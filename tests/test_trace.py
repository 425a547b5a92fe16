"""`amplint trace`: real tiny CPU training runs (a 2-layer MLP, a few steps) under the tracer.

Each runtime finding is planted in a script the test writes, marked with `# <CODE>` on the line
the finding must point at; the script runs under `amplint trace` (in-process through click's
CliRunner, or as a real subprocess) and the finding's code, file and line are asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402

from amplint.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

HEADER = """\
import sys
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(10)]
"""


def write(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body), encoding="utf-8")
    return path


def marked_line(path: Path, code: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# <{code}>" in line)


def trace(tmp_path, monkeypatch, *args):
    """`amplint trace ARGS` in this process, from tmp_path (no pyproject: the default config)."""
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, ["trace", *map(str, args)], catch_exceptions=False)


def trace_json(tmp_path, monkeypatch, script: Path, *options):
    result = trace(tmp_path, monkeypatch, "--output-format", "json", *options, "--", "python", script.name)
    return result, json.loads(result.stdout)


def assert_only(findings: list[dict], code: str, script: Path):
    assert [(f["code"], f["filename"], f["location"]["row"]) for f in findings] == \
        [(code, script.name, marked_line(script, code))], findings


def test_amp001_backward_inside_autocast(tmp_path, monkeypatch):
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
                loss.backward()  # <AMP001>
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert result.exit_code == 1, result.stderr
    assert_only(findings, "AMP001", script)
    f = findings[0]
    assert f["name"] == "backward-inside-autocast" and f["fix"] is None and f["url"].endswith("amp001-backward-inside-autocast")
    assert f["location"]["column"] == 9 and f["end_location"] == {"row": f["location"]["row"], "column": 24}
    assert "stopped after 3 optimizer steps" in result.stderr


FP16_SCALER = """\
scaler = torch.amp.GradScaler("cpu")
for x, y in data:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
"""


def test_amp002_clip_without_unscale(tmp_path, monkeypatch):
    script = write(tmp_path, FP16_SCALER + """\
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # <AMP002>
    scaler.step(opt)
    scaler.update()
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert result.exit_code == 1
    assert_only(findings, "AMP002", script)


def test_amp002_clip_value_imported_by_name(tmp_path, monkeypatch):
    script = write(tmp_path, "from torch.nn.utils import clip_grad_value_\n" + FP16_SCALER + """\
    scaler.scale(loss).backward()
    clip_grad_value_(model.parameters(), 1.0)  # <AMP002>
    scaler.step(opt)
    scaler.update()
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP002", script)


def test_amp005_optimizer_step_bypasses_scaler(tmp_path, monkeypatch):
    script = write(tmp_path, FP16_SCALER + """\
    scaler.scale(loss).backward()
    opt.step()  # <AMP005>
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert result.exit_code == 1
    assert_only(findings, "AMP005", script)


def test_amp006_step_without_update_raises_in_torch(tmp_path, monkeypatch):
    script = write(tmp_path, FP16_SCALER + """\
    scaler.scale(loss).backward()
    scaler.step(opt)  # <AMP006>
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP006", script)
    assert result.exit_code == 1  # the program's own failure: torch raised at the second step
    assert "step() has already been called since the last update()" in result.stderr
    assert "Traceback" in result.stderr and "train.py" in result.stderr


def test_amp007_unscale_twice_reported_and_reraised(tmp_path, monkeypatch):
    script = write(tmp_path, FP16_SCALER + """\
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.unscale_(opt)  # <AMP007>
    scaler.step(opt)
    scaler.update()
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP007", script)
    assert "RuntimeError: unscale_() has already been called on this optimizer since the last update()." \
        in result.stderr


def test_amp008_banned_op_under_cpu_autocast(tmp_path, monkeypatch):
    # CPU's table does not ban binary_cross_entropy and torch does not raise on CPU; the configured
    # device (cuda, the default) bans it, as the static rule judges a region.
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                p = torch.sigmoid(model(x))
                loss = F.binary_cross_entropy(p, F.one_hot(y, 2).to(p.dtype))  # <AMP008>
            loss.backward()
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert result.exit_code == 1
    assert_only(findings, "AMP008", script)
    assert "aten::binary_cross_entropy" in findings[0]["message"] and "cuda" in findings[0]["message"]


def test_amp009_fp16_without_scaler(tmp_path, monkeypatch):
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()  # <AMP009>
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP009", script)


def test_amp009_not_for_a_loss_computed_before_the_float16_region(tmp_path, monkeypatch):
    """The loss is float32, computed before any region: backpropagated while a float16 region is
    open (AMP001), its graph holds none of the region's ops, so nothing underflows for want of
    a scaler. The region's own output, backpropagated after it, does."""
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with torch.autocast("cpu", dtype=torch.float16):
                hidden = model(x)
                loss.backward()  # <AMP001>
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP001", script)
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with torch.autocast("cpu", dtype=torch.float16):
                hidden = model(x)
            (loss + hidden.float().mean()).backward()  # <AMP009>
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP009", script)


def test_amp010_scaler_on_bfloat16_loss(tmp_path, monkeypatch):
    script = write(tmp_path, FP16_SCALER.replace("float16", "bfloat16") + """\
    scaler.scale(loss).backward()  # <AMP010>
    scaler.step(opt)
    scaler.update()
""")
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert_only(findings, "AMP010", script)


CORRECT = FP16_SCALER + """\
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    print(f"loss {loss.item():.8f}")
"""


def test_correct_loop_no_findings_steps_and_dtype_map(tmp_path, monkeypatch):
    script = write(tmp_path, CORRECT)
    report = tmp_path / "trace.json"
    result = trace(tmp_path, monkeypatch, "--report", report, "--", "python", script.name)
    assert result.exit_code == 0, result.output
    assert len(_losses(result.stdout)) == 3  # stopped after the default 3 steps
    assert "Steps:" in result.stdout and "Modules (dtype map):" in result.stdout
    data = json.loads(report.read_text())
    assert data["findings"] == [] and data["stopped_after_steps"] is True
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    assert all(s["via"] == "scaler.step" and s["loss_scale"] == 65536.0 and not s["skipped"] for s in data["steps"])


def test_select_and_ignore(tmp_path, monkeypatch):
    script = write(tmp_path, """\
        for x, y in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script, "--ignore", "AMP001")
    assert findings == [] and result.exit_code == 0
    result, findings = trace_json(tmp_path, monkeypatch, script, "--select", "AMP005")
    assert findings == [] and result.exit_code == 0


def test_dtype_map_bfloat16_linears(tmp_path, monkeypatch):
    script = write(tmp_path, """\
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    """)
    report = tmp_path / "trace.json"
    result = trace(tmp_path, monkeypatch, "--steps", "2", "--report", report, "--", "python", script.name)
    assert result.exit_code == 0
    modules = {m["module"]: m for m in json.loads(report.read_text())["modules"]}
    for name in ("Sequential.0", "Sequential.2"):
        assert modules[name]["type"] == "Linear"
        assert modules[name]["output_dtypes"] == ["bfloat16"]
        assert modules[name]["calls"] == 2
        assert modules[name]["ops"].get("bfloat16", 0) > 0 and "float32" not in modules[name]["ops"]
    assert modules["Sequential.0"]["input_dtypes"] == ["float32"]
    assert "Sequential.0" in result.stdout and "bfloat16" in result.stdout


def test_numerics_first_nonfinite_module_and_skipped_step(tmp_path, monkeypatch):
    # The first Linear overflows float16 (65504): its output holds inf, the scaler skips the step
    # and halves the scale.
    script = write(tmp_path, """\
        with torch.no_grad():
            model[0].weight.fill_(1e3)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x * 100), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    """)
    report = tmp_path / "trace.json"
    result = trace(tmp_path, monkeypatch, "--steps", "2", "--report", report, "--", "python", script.name)
    steps = json.loads(report.read_text())["steps"]
    assert steps[0]["first_nonfinite_module"] == "Sequential.0"
    assert steps[0]["skipped"] is True and steps[0]["loss_scale"] == 1024.0
    assert steps[0]["scale_after_update"] == 512.0 and steps[1]["loss_scale"] == 512.0
    assert result.exit_code == 0


def _losses(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("loss ")]


def test_same_losses_with_and_without_trace(tmp_path):
    script = write(tmp_path, CORRECT)
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    traced = subprocess.run([sys.executable, "-m", "amplint.trace", "--steps", "0", str(script), "--seed", "1"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert plain.returncode == 0 and traced.returncode == 0, traced.stderr
    assert len(_losses(plain.stdout)) == 10
    assert _losses(traced.stdout) == _losses(plain.stdout)


def test_subprocess_cli_argv_and_own_exit_code(tmp_path):
    script = write(tmp_path, """\
        print("argv", sys.argv[1:])
        sys.exit(int(sys.argv[2]))
    """)
    done = subprocess.run([sys.executable, "-m", "amplint", "trace", "--", "python", script.name, "--code", "3"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "argv ['--code', '3']" in done.stdout


def test_python_api(tmp_path):
    import amplint
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    original = torch.Tensor.backward
    with amplint.tracing() as t:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
                loss.backward(); line = sys._getframe().f_lineno  # noqa: E702
            opt.step()
    assert torch.Tensor.backward is original  # put back
    assert [(d.code, Path(d.path).name, d.location.row) for d in t.findings] == [("AMP001", "test_trace.py", line)]
    names = {m["module"]: m for m in t.dtype_map}
    assert names["Sequential.0"]["output_dtypes"] == ["bfloat16"]
    assert len(t.steps) == 2


def test_import_amplint_and_check_do_not_import_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        import amplint, amplint.cli
        from click.testing import CliRunner
        assert callable(amplint.tracing)
        r = CliRunner().invoke(amplint.cli.main, ["check", "--no-cache", {str(ROOT / 'fixtures' / 'correct')!r}])
        assert r.exit_code == 0, r.output
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# fixtures/correct: train_amp.py is the only one that runs a loop as a script, and its main() needs
# CUDA (torch.device("cuda"), model.to(device)): it is skipped. The others define functions only.
CPU_FIXTURES = ["amp_recipes.py", "gan_trainer.py", "legacy_trainer.py", "models.py", "segmentation_fp16.py"]


@pytest.mark.parametrize("name", CPU_FIXTURES)
def test_correct_fixtures_run_clean(tmp_path, monkeypatch, name):
    result = trace(tmp_path, monkeypatch, "--output-format", "json", "--", "python",
                   ROOT / "fixtures" / "correct" / name)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_correct_recipes_on_cpu_autocast_run_clean(tmp_path, monkeypatch):
    # The recipes of fixtures/correct/amp_recipes.py, re-targeted from cuda to cpu (a copy), each
    # called with a tiny MLP: float16 CPU autocast with an enabled CPU GradScaler.
    source = (ROOT / "fixtures" / "correct" / "amp_recipes.py").read_text(encoding="utf-8")
    (tmp_path / "recipes_cpu.py").write_text(source.replace('"cuda"', '"cpu"'), encoding="utf-8")
    script = write(tmp_path, """\
        import recipes_cpu as r
        loss_fn = nn.CrossEntropyLoss()
        r.typical_loop(model, data[:2], opt, loss_fn, 1)
        r.with_gradient_clipping(model, data[:2], opt, loss_fn, 1.0)
        r.with_gradient_accumulation(model, data[:4], opt, loss_fn, 2)
        r.with_gradient_penalty(model, data[:2], opt, loss_fn)
        other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        r.two_models_two_optimizers(model, other, data[:2], opt, torch.optim.SGD(other.parameters(), lr=0.1), loss_fn)
        r.bf16_training_without_scaler(model, data[:2], opt, loss_fn)
        r.cpu_inference(model, data[0][0])
        print("done")
    """, name="drive.py")
    result = trace(tmp_path, monkeypatch, "--steps", "0", "--output-format", "json", "--", "python", script.name)
    assert "done" in result.stderr  # the program's stdout goes to stderr with json
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == []


def marked_lines(path: Path, code: str) -> list[int]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [i for i, line in enumerate(lines, 1) if f"# <{code}>" in line]


def test_amp003_float32_factories_meet_half_activations(tmp_path, monkeypatch):
    # Three float32 factories in a forward under bfloat16 autocast: one concatenated (cpu autocast
    # promotes cat's inputs), one added (the add promotes), one index-put into (torch raises).
    script = write(tmp_path, """\
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(3, 3)

            def forward(self, h):
                pad = torch.zeros(h.shape[0], 1, device=h.device)  # <AMP003>
                h = torch.cat([h, pad], dim=1)
                bias = torch.ones(3, device=h.device)  # <AMP003>
                h = self.proj(h) + bias
                out = torch.zeros(h.shape[0], 3, device=h.device)  # <AMP003>
                out[torch.arange(h.shape[0])] = self.proj(torch.cat([h[:, :2], h[:, :1]], 1))
                return out

        head = Head()
        for x, y in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(head(model(x)), y)
            loss.backward()
            opt.step()
    """)
    result, findings = trace_json(tmp_path, monkeypatch, script)
    assert result.exit_code == 1  # the index-put raised in the program
    assert "Index put requires the source and destination dtypes match" in result.stderr
    assert [(f["code"], f["filename"], f["location"]["row"]) for f in findings] == \
        [("AMP003", script.name, row) for row in marked_lines(script, "AMP003")], findings
    cat, add, index_put = (f["message"] for f in findings)
    assert "`torch.zeros`" in cat and "`aten::cat`" in cat and "promoted the bfloat16 inputs" in cat
    assert "`torch.ones`" in add and "`aten::add`" in add and "promoted the result to float32" in add
    assert "`aten::index_put_`" in index_put and "raised" in index_put


def test_amp011_autocast_dtype_torch_disables(tmp_path, monkeypatch):
    # A precision switch that gives float32 for "no AMP": torch warns and runs the region in float32.
    script = write(tmp_path, """\
        precision = sys.argv[1]
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=amp_dtype):  # <AMP011>
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    """)
    with pytest.warns(UserWarning, match="Disabling autocast") as warned:
        result = trace(tmp_path, monkeypatch, "--output-format", "json", "--", "python", script.name, "fp32")
    assert_only(json.loads(result.stdout), "AMP011", script)
    assert "float32" in json.loads(result.stdout)[0]["message"]
    # torch's own warning is still given, once, at the program's line (not the tracer's)
    assert [(Path(w.filename).name, w.lineno) for w in warned] == [(script.name, marked_line(script, "AMP011"))]
    result = trace(tmp_path, monkeypatch, "--output-format", "json", "--", "python", script.name, "bf16")
    assert json.loads(result.stdout) == [] and result.exit_code == 0


def test_half_outputs_overflow_and_underflow_per_module():
    # One float16 Linear whose 4 outputs are, by construction: inf (overflow), a subnormal, 0, 1.
    import amplint
    from amplint.trace import report
    from amplint.trace.runner import TraceResult
    from torch import nn

    linear = nn.Linear(4, 4)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1e5, 0, 0, 0], [1e-6, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]))
        linear.bias.zero_()
    with amplint.tracing() as t:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.float16):
                linear(torch.ones(3, 4)).float().sum().backward()
    numerics = next(m for m in t.dtype_map if m["module"] == "Linear")["half_outputs"]
    assert numerics == {"calls_counted": 2, "values": 24, "overflow": 0.25, "zero": 0.25, "subnormal": 0.25}
    result = TraceResult(t, 0)
    assert "25%, 25%, 25%" in report.dtype_table(result)
    assert "half outputs: inf/NaN 25% · zero 25% · subnormal 25%" in report.html_page(result)
