"""A custom autograd.Function judged by what its backward does, across modules (AMP014): the
Function in `ops/`, a module that applies it with its float32 parameter in `models/`, and the
training loop that runs the model under autocast in `train.py`. The backward multiplies the
float16 gradient by that parameter outside autocast and raises; a backward that only scales,
negates or casts, a Function with custom_fwd/custom_bwd, and a project without autocast stay
silent. Real projects on disk, the real CLI."""

import json
import textwrap

from click.testing import CliRunner

from amplint.cli import main
from projects import findings, write_files

FUSED = """\
import torch
from torch.autograd import Function


class _FusedLinearFn(Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x.mm(weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_input = grad_output.mm(weight)
        grad_weight = grad_output.t().mm(x)
        return grad_input, grad_weight
"""

LAYERS = """\
import torch
from torch import nn

from ..ops.fused import _FusedLinearFn


class FusedLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        nn.init.kaiming_uniform_(self.weight)

    def forward(self, x):
        return _FusedLinearFn.apply(x, self.weight)
"""

TRAIN = """\
import torch

from .models.layers import FusedLinear


def train(loader, epochs=1):
    model = FusedLinear(256, 10).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(epochs):
        for inputs, targets in loader:
            with torch.autocast(device_type="cuda"):
                logits = model(inputs.cuda())
                loss = torch.nn.functional.cross_entropy(logits, targets.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
"""

# Through a helper the package re-exports, with the parameter of a torch.nn layer passed by
# keyword, the weight kept on ctx; the trainer turns bfloat16 autocast on through Accelerate.
PROJECTION = """\
import torch
import torch.nn.functional as F


class _Projection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.weight = weight
        ctx.save_for_backward(hidden)
        return F.linear(hidden, weight)

    @staticmethod
    def backward(ctx, grad_out):
        (hidden,) = ctx.saved_tensors
        grad_hidden = F.linear(grad_out, ctx.weight.t())
        grad_weight = grad_out.flatten(0, -2).t() @ hidden.flatten(0, -2)
        return grad_hidden, grad_weight


def project(hidden, weight):
    return _Projection.apply(hidden, weight)
"""

OPS_INIT = """\
from .projection import project
"""

HEAD = """\
from torch import nn

from proj.ops import project


class ClassifierHead(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, classes, bias=False)

    def forward(self, features):
        return project(self.norm(features), weight=self.out.weight)
"""

ACCELERATE_TRAIN = """\
import torch
from accelerate import Accelerator

from .models.head import ClassifierHead


def main(loader):
    accelerator = Accelerator(mixed_precision="bf16")
    model = ClassifierHead(512, 100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for features, labels in loader:
        loss = (model(features) - labels).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
"""


def _project(tmp_path, files: dict[str, str]):
    packages = dict.fromkeys(("proj/__init__.py", "proj/ops/__init__.py", "proj/models/__init__.py"), "")
    return write_files(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'proj'\n", **packages, **files})


def _findings(root, monkeypatch):
    return findings(root, "AMP014", monkeypatch, "--preview")


def _row(text: str, line: str) -> int:
    return next(i for i, code in enumerate(text.splitlines(), 1) if line in code)


def _base(**changes):
    files = {"proj/ops/fused.py": FUSED, "proj/models/layers.py": LAYERS, "proj/train.py": TRAIN}
    files.update(changes)
    return files


def test_backward_multiplying_the_half_gradient_by_a_float32_parameter_applied_elsewhere(tmp_path, monkeypatch):
    root = _project(tmp_path, _base())
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/ops/fused.py", _row(FUSED, "grad_input = grad_output.mm(weight)"))
    assert "`grad_output.mm(weight)` in `_FusedLinearFn.backward` multiplies the incoming gradient by the " \
           "forward's `weight`" in message
    assert "`FusedLinear.forward` passes as `self.weight`, an `nn.Parameter` that `FusedLinear` makes at line " \
           f"{_row(LAYERS, 'self.weight = nn.Parameter')}" in message
    apply_row = _row(LAYERS, "_FusedLinearFn.apply(")
    autocast_row = _row(TRAIN, "torch.autocast(")
    assert f"(`_FusedLinearFn.apply(x, self.weight)`, proj/models/layers.py:{apply_row})" in message
    assert f"under this project's autocast (proj/train.py:{autocast_row}) the forward's `x.mm(weight.t())` " \
           "gives float16" in message
    assert '`@torch.amp.custom_fwd(device_type="cuda")`' in message and \
           '`@torch.amp.custom_bwd(device_type="cuda")`' in message
    assert related == [("proj/train.py", autocast_row, "autocast entered here"),
                       ("proj/models/layers.py", apply_row,
                        "`_FusedLinearFn.apply(x, self.weight)` passes a float32 parameter")]


def test_through_a_reexported_helper_with_a_layers_parameter_under_a_framework_setting(tmp_path, monkeypatch):
    root = _project(tmp_path, {"proj/ops/projection.py": PROJECTION, "proj/ops/__init__.py": OPS_INIT,
                               "proj/models/head.py": HEAD, "proj/train.py": ACCELERATE_TRAIN})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/ops/projection.py", _row(PROJECTION, "grad_hidden = F.linear("))
    helper_row = _row(PROJECTION, "return _Projection.apply(")
    call_row = _row(HEAD, "return project(")
    setting_row = _row(ACCELERATE_TRAIN, "Accelerator(")
    assert "`F.linear(grad_out, ctx.weight.t())` in `_Projection.backward`" in message
    assert "`ClassifierHead.forward` passes through `project` (`_Projection.apply(hidden, weight)`, " \
           f"proj/ops/projection.py:{helper_row}) as `self.out.weight`, a parameter of the `torch.nn.Linear` " \
           "that `ClassifierHead` builds" in message
    assert f"(`project(self.norm(features), weight=self.out.weight)`, proj/models/head.py:{call_row})" in message
    assert "gives bfloat16" in message
    assert related == [("proj/train.py", setting_row, "autocast on (mixed_precision='bf16')"),
                       ("proj/models/head.py", call_row,
                        "`project(self.norm(features), weight=self.out.weight)` passes a float32 parameter"),
                       ("proj/ops/projection.py", helper_row, "`project` hands it to `_Projection.apply`")]


def test_module_derived_from_a_torch_layer_passes_its_inherited_weight(tmp_path, monkeypatch):
    layers = """\
    import torch.nn as nn

    from proj.ops.fused import _FusedLinearFn


    class FusedLinear(nn.Linear):
        def forward(self, x):
            return _FusedLinearFn.apply(x, self.weight)
    """
    root = _project(tmp_path, _base(**{"proj/models/layers.py": layers}))
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/ops/fused.py", _row(FUSED, "grad_input = grad_output.mm(weight)"))
    assert "as `self.weight`, the parameter `FusedLinear` inherits from `torch.nn.Linear`" in message
    assert related[1][:2] == ("proj/models/layers.py", _row(textwrap.dedent(layers), "_FusedLinearFn.apply("))


def test_dtype_agnostic_backward_is_silent(tmp_path, monkeypatch):
    """Scaling and negating the gradient by Python numbers, an elementwise product (promoted,
    no error), `zeros_like`: the same dtypes with and without autocast."""
    fused = """\
    import torch
    from torch.autograd import Function


    class _FusedLinearFn(Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            ctx.scale = 0.5
            return x.mm(weight.t())

        @staticmethod
        def backward(ctx, grad_output):
            x, weight = ctx.saved_tensors
            grad_input = grad_output.neg() * ctx.scale
            grad_weight = torch.zeros_like(weight) + grad_output.sum() * weight
            return grad_input, grad_weight
    """
    root = _project(tmp_path, _base(**{"proj/ops/fused.py": fused}))
    assert _findings(root, monkeypatch) == []


def test_backward_that_casts_what_it_saved_is_silent(tmp_path, monkeypatch):
    fused = FUSED.replace("grad_output.mm(weight)", "grad_output.mm(weight.to(grad_output.dtype))") \
        .replace("grad_output.t().mm(x)", "grad_output.float().t().mm(x.float())")
    root = _project(tmp_path, _base(**{"proj/ops/fused.py": fused}))
    assert _findings(root, monkeypatch) == []


def test_function_with_custom_fwd_and_custom_bwd_is_silent(tmp_path, monkeypatch):
    fused = FUSED.replace("    @staticmethod\n    def forward",
                          '    @staticmethod\n    @torch.amp.custom_fwd(device_type="cuda")\n    def forward') \
        .replace("    @staticmethod\n    def backward",
                 '    @staticmethod\n    @torch.amp.custom_bwd(device_type="cuda")\n    def backward')
    assert fused.count("custom_") == 2
    root = _project(tmp_path, _base(**{"proj/ops/fused.py": fused}))
    assert _findings(root, monkeypatch) == []


def test_project_without_autocast_is_silent(tmp_path, monkeypatch):
    train = TRAIN.replace('with torch.autocast(device_type="cuda"):', "if True:")
    root = _project(tmp_path, _base(**{"proj/train.py": train}))
    assert _findings(root, monkeypatch) == []


def test_parameter_made_in_half_precision_is_silent(tmp_path, monkeypatch):
    """A bfloat16 parameter meets a bfloat16 gradient: nothing is mixed."""
    layers = LAYERS.replace("torch.empty(n_out, n_in)", "torch.empty(n_out, n_in, dtype=torch.bfloat16)")
    root = _project(tmp_path, _base(**{"proj/models/layers.py": layers}))
    assert _findings(root, monkeypatch) == []


def test_activation_passed_where_the_weight_goes_is_silent(tmp_path, monkeypatch):
    """What the call passes is not shown to be a float32 parameter: it may well be float16."""
    layers = LAYERS.replace("_FusedLinearFn.apply(x, self.weight)", "_FusedLinearFn.apply(x, x.detach())")
    root = _project(tmp_path, _base(**{"proj/models/layers.py": layers}))
    assert _findings(root, monkeypatch) == []


def test_name_bound_to_apply_called_through_its_module(tmp_path, monkeypatch):
    """`fused_linear = _FusedLinearFn.apply` in the Function's module; the layer imports the
    module and calls `fused.fused_linear(...)`."""
    fused = FUSED + "\n\nfused_linear = _FusedLinearFn.apply\n"
    layers = LAYERS.replace("from ..ops.fused import _FusedLinearFn", "from ..ops import fused") \
        .replace("_FusedLinearFn.apply(x, self.weight)", "fused.fused_linear(x, self.weight)")
    root = _project(tmp_path, _base(**{"proj/ops/fused.py": fused, "proj/models/layers.py": layers}))
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/ops/fused.py", _row(FUSED, "grad_input = grad_output.mm(weight)"))
    alias_row = _row(fused, "fused_linear = _FusedLinearFn.apply")
    call_row = _row(layers, "fused.fused_linear(")
    assert "`FusedLinear.forward` passes through `fused_linear` (`fused_linear = _FusedLinearFn.apply`, " \
           f"proj/ops/fused.py:{alias_row}) as `self.weight`" in message
    assert related[1:] == [("proj/models/layers.py", call_row,
                            "`fused.fused_linear(x, self.weight)` passes a float32 parameter"),
                           ("proj/ops/fused.py", alias_row, "`fused_linear` hands it to `_FusedLinearFn.apply`")]


def test_an_edit_of_the_applying_module_rechecks_the_function_through_the_cache(tmp_path, monkeypatch):
    root = _project(tmp_path, _base())
    monkeypatch.chdir(root)

    def cached_rows():
        result = CliRunner().invoke(main, ["check", "--select", "AMP014", "--preview", "--output-format", "json",
                                           "."])
        return [(f["filename"], f["location"]["row"]) for f in json.loads(result.output)]

    found = [("proj/ops/fused.py", _row(FUSED, "grad_input = grad_output.mm(weight)"))]
    assert cached_rows() == found
    assert cached_rows() == found  # answered from the cache
    layers = root / "proj" / "models" / "layers.py"
    layers.write_text(LAYERS.replace("_FusedLinearFn.apply(x, self.weight)", "_FusedLinearFn.apply(x, x.detach())"))
    assert cached_rows() == []
    layers.write_text(LAYERS)
    assert cached_rows() == found
