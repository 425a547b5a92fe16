"""A ban is an autocast kernel refusing arguments the op itself accepts. An autocast kernel that
fails to read the probe's generated arguments (PyTorch 2.11's Dimname overloads, given a string
for a dimension's name) is no ban: the op refuses them without autocast too. The ops are real
custom ops of a package the test writes, probed on cpu by the real CLI, simulated and executed."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

REFUSEPKG = textwrap.dedent("""\
    import torch

    _lib = torch.library.Library("refuselib", "FRAGMENT")
    _CPU_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    ENDS = {"first": 0, "last": -1}

    @torch.library.custom_op("refuselib::pick", mutates_args=())
    def pick(x: torch.Tensor, end: str) -> torch.Tensor:
        return x.select(-1, ENDS[end]).clone()

    @pick.register_fake
    def _(x, end):
        if end not in ENDS:
            raise RuntimeError(f"pick: no end named {end!r}")
        return x.new_empty(x.shape[:-1])

    def _pick_in_float32(x, end):
        index = ENDS.get(end)
        if index is None:  # the argument is read before the cast
            raise RuntimeError(f"pick: no end named {end!r}")
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):
            return pick(x.float(), end)

    _lib.impl("pick", _pick_in_float32, "AutocastCPU")

    @torch.library.custom_op("refuselib::squashed_loss", mutates_args=())
    def squashed_loss(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x).log().mean()

    @squashed_loss.register_fake
    def _(x):
        return x.new_empty(())

    def _refuse(x):
        raise RuntimeError("refuselib.squashed_loss is unsafe to autocast: take the logits")

    _lib.impl("squashed_loss", _refuse, "AutocastCPU")
""")


@pytest.fixture(scope="module", params=["simulate", "execute"])
def entries(request, tmp_path_factory):
    project = tmp_path_factory.mktemp("refuseproject")
    (project / "refusepkg.py").write_text(REFUSEPKG)
    result = subprocess.run(
        [sys.executable, "-m", "amplint", "probe", "--import", "refusepkg", "--device", "cpu", "--mode",
         request.param, "--ops", "refuselib::*", "--format", "json", "-o", "cpu.json"],
        cwd=project, env={**os.environ, "PYTHONPATH": str(project)}, capture_output=True, text=True)
    assert result.returncode in (0, 1), result.stderr
    table = json.loads((project / "cpu.json").read_text())
    return {e["op"]: e for e in table["ops"]}


def test_a_kernel_refusing_what_the_op_accepts_is_a_ban(entries):
    loss = entries["refuselib::squashed_loss"]
    assert loss["policy"] == "banned"
    assert "unsafe to autocast" in loss["evidence"]["message"]


def test_arguments_the_op_refuses_too_are_no_ban(entries):
    pick = entries["refuselib::pick"]
    assert pick["policy"] is None
    assert "no end named 'mean'" in pick["reason"]
