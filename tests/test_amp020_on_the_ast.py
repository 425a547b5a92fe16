"""AMP020 (a factory that spells out a tensor's device and dtype) reads Python's ast: found in
a module's forward or an autocast region, silent where `x` may not be a floating tensor, and
its fix is a text edit that keeps the call's own layout. Through the real CLI on projects
written to disk."""

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from amplint.cli import main


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def _findings(root: Path) -> list[tuple[str, int, int, str, bool]]:
    result = CliRunner().invoke(main, ["check", "--select", "AMP020", "--output-format", "json", "--no-cache",
                                       str(root)])
    return sorted((Path(d["filename"]).name, d["location"]["row"], d["location"]["column"], d["message"],
                   d["fix"] is not None) for d in json.loads(result.stdout))


def _fixed(root: Path, name: str) -> str:
    CliRunner().invoke(main, ["check", "--select", "AMP020", "--fix", "--no-cache", str(root)])
    return (root / name).read_text()


def test_a_forward_s_factories_become_new_methods_keeping_their_layout(tmp_path):
    root = _project(tmp_path, {"pooling.py": """
        import torch
        from torch import nn


        class MaskedMeanPool(nn.Module):
            def forward(self, hidden, lengths):
                pooled = torch.zeros(
                    hidden.size(0), hidden.size(-1),  # (batch, features)
                    device=hidden.device,
                    dtype=hidden.dtype,
                )
                weights = (torch.ones(lengths.numel(), dtype=hidden.dtype, device=hidden.device))
                for i, n in enumerate(lengths.tolist()):
                    pooled[i] = hidden[i, :n].mean(0) * weights[i]
                return pooled
        """})
    assert _findings(root) == [
        ("pooling.py", 7, 18, ("`torch.zeros(..., device=hidden.device, dtype=hidden.dtype)` is "
                               "`hidden.new_zeros(...)`"), True),
        ("pooling.py", 12, 20, ("`torch.ones(..., device=hidden.device, dtype=hidden.dtype)` is "
                                "`hidden.new_ones(...)`"), True),
    ]
    fixed = _fixed(root, "pooling.py")
    # The kept arguments where they were, at the file's own indentation; no parentheses added.
    assert "        pooled = hidden.new_zeros(\n            hidden.size(0), hidden.size(-1))\n" in fixed
    assert "        weights = (hidden.new_ones(lengths.numel()))\n" in fixed
    assert "device=" not in fixed


def test_an_autocast_region_and_a_registered_buffer(tmp_path):
    root = _project(tmp_path, {
        "train.py": """
            import torch
            import torch.nn.functional as F


            def train_step(model, batch, optimizer):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(batch["x"])
                    smoothing = torch.full(logits.shape, 0.1 / logits.size(-1),
                                           dtype=logits.dtype, device=logits.device, requires_grad=False)
                    loss = F.kl_div(logits.log_softmax(-1), smoothing, reduction="batchmean")
                loss.backward()
                optimizer.step()
            """,
        "norm.py": """
            import torch
            from torch import nn


            class RunningNorm(nn.Module):
                def __init__(self, features, encoder):
                    super().__init__()
                    self.encoder = encoder
                    for name in ("running_scale", "running_shift"):
                        self.register_buffer(name, torch.ones(features))

                def forward(self, x):
                    scale = torch.ones(x.size(-1), device=self.running_scale.device, dtype=self.running_scale.dtype)
                    # A submodule has a device and a dtype, and no new_zeros: silent.
                    shift = torch.zeros(x.size(-1), device=self.encoder.device, dtype=self.encoder.dtype)
                    return self.encoder(x) * scale + shift
            """})
    assert _findings(root) == [
        ("norm.py", 13, 17, ("`torch.ones(..., device=self.running_scale.device, dtype=self.running_scale.dtype)` "
                             "is `self.running_scale.new_ones(...)`"), True),
        ("train.py", 8, 21, ("`torch.full(..., device=logits.device, dtype=logits.dtype)` is "
                             "`logits.new_full(...)`"), True),
    ]
    assert "smoothing = logits.new_full(logits.shape, 0.1 / logits.size(-1),\n" \
           "                               requires_grad=False)\n" in _fixed(root, "train.py")


def test_silent_where_new_methods_do_not_say_the_same(tmp_path):
    root = _project(tmp_path, {"heads.py": """
        import torch
        from torch import nn


        def make_padding(x):  # neither a forward nor in an autocast region
            return torch.zeros(4, device=x.device, dtype=x.dtype)


        def evaluate(model, x):
            with torch.autocast("cuda", enabled=False):
                return model(x) + torch.ones(3, device=x.device, dtype=x.dtype)


        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("ratio", torch.ones(1))

            def forward(self, x, input_ids, y):
                other = torch.zeros(x.shape[0], device=x.device, dtype=y.dtype)  # two tensors
                ids = torch.zeros(3, device=input_ids.device, dtype=input_ids.dtype)  # integers
                return other, ids


        class Tail(nn.Module):
            def forward(self, x):
                # `ratio` is a buffer of Head, not of Tail: it may be a submodule here.
                return torch.ones(1, device=self.ratio.device, dtype=self.ratio.dtype) * x
        """})
    assert _findings(root) == []


def test_a_tensor_that_comes_from_a_call_is_found_without_a_fix(tmp_path):
    root = _project(tmp_path, {"model.py": """
        import torch


        class Decoder(torch.nn.Module):
            def forward(self, x):
                state = torch.empty(x.size(0), device=next(self.parameters()).device,
                                    dtype=next(self.parameters()).dtype)
                return state.copy_(x)
        """})
    [(name, row, column, message, fixable)] = _findings(root)
    assert (name, row, column, fixable) == ("model.py", 6, 17, False)
    assert message.startswith("`torch.empty(..., device=next(self.parameters()).device, dtype=")
