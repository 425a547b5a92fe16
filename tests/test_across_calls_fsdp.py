"""float16 training with no autocast at all: FSDP's `MixedPrecision(param_dtype=torch.float16)`
(FSDP2's `MixedPrecisionPolicy`) built in one module, handed to `FullyShardedDataParallel` or
`fully_shard` in another, and the training loop's plain `loss.backward()` in a third (AMP009).
Real projects on disk, the real CLI."""

import json

from click.testing import CliRunner

from amplint.cli import main
from projects import findings, write_files

MODEL = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, width=512, depth=8, classes=1000):
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
"""

# FSDP1: the policy a config module builds, the wrap a builder module applies.
POLICIES = """\
import torch
from torch.distributed.fsdp import MixedPrecision

fp16_policy = MixedPrecision(
    param_dtype=torch.float16,
    reduce_dtype=torch.float16,
    buffer_dtype=torch.float16,
)
bf16_policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
"""

BUILD = """\
import functools

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from .model import Block
from .policies import {policy}


def wrap_model(model, device_id):
    auto_wrap = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={{Block}})
    return FSDP(model, auto_wrap_policy=auto_wrap, mixed_precision={policy}, device_id=device_id)
"""

TRAIN = """\
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .build import wrap_model
from .model import Net


def main(loader, epochs):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    model = wrap_model(Net(), rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(epochs):
        for inputs, targets in loader:
            logits = model(inputs.cuda(rank))
            loss = F.cross_entropy(logits, targets.cuda(rank))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
"""

# The same loop with FSDP's own scaler.
TRAIN_SCALED = """\
import torch
import torch.nn.functional as F
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from .build import wrap_model
from .model import Net


def main(loader, rank):
    model = wrap_model(Net(), rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = ShardedGradScaler()
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs.cuda(rank)), targets.cuda(rank))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
"""

# FSDP2: a helper returns the policy; another shards the model in place and returns nothing.
FSDP2_PRECISION = """\
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy


def get_policy():
    return MixedPrecisionPolicy(param_dtype=torch.{dtype}, reduce_dtype=torch.float32)
"""

FSDP2_SHARDING = """\
from torch.distributed.fsdp import fully_shard

from .precision import get_policy


def apply_fsdp(model, mesh):
    policy = get_policy()
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
"""

FSDP2_TRAINER = """\
import torch

from .model import Net
from .sharding import apply_fsdp


class Trainer:
    def __init__(self, mesh, lr):
        model = Net()
        apply_fsdp(model, mesh)
        self.model = model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def compute_loss(self, batch):
        logits = self.model(batch["inputs"])
        return torch.nn.functional.cross_entropy(logits, batch["targets"])

    def train_step(self, batch):
        loss = self.compute_loss(batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()
"""

# The same trainer with torch.amp.GradScaler, which handles FSDP2's sharded gradients.
FSDP2_TRAINER_SCALED = """\
import torch
from torch.amp import GradScaler

from .model import Net
from .sharding import apply_fsdp


class Trainer:
    def __init__(self, mesh, lr):
        model = Net()
        apply_fsdp(model, mesh)
        self.model = model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.scaler = GradScaler("cuda")

    def train_step(self, batch):
        loss = torch.nn.functional.cross_entropy(self.model(batch["inputs"]), batch["targets"])
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return loss.detach()
"""


def _project(tmp_path, files: dict[str, str]):
    return write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'proj'\n",
                                           "trainer/__init__.py": "", "trainer/model.py": MODEL, **files})


def _findings(root, monkeypatch):
    return findings(root, "AMP009", monkeypatch)


def _row(root, name: str, text: str) -> int:
    return next(i for i, line in enumerate((root / name).read_text().splitlines(), 1) if text in line)


def test_fsdp1_policy_wrap_and_loop_in_three_modules(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": BUILD.format(policy="fp16_policy"),
                               "trainer/train.py": TRAIN})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("trainer/train.py", _row(root, "trainer/train.py", "loss.backward()"))
    assert message.startswith(
        "FSDP computes in float16 here (`MixedPrecision(param_dtype=torch.float16, ...)`, trainer/policies.py:4, "
        f"handed to `FSDP` at trainer/build.py:{_row(root, 'trainer/build.py', 'return FSDP')}, through "
        f"`wrap_model()` on line {_row(root, 'trainer/train.py', 'wrap_model(Net()')}): no ShardedGradScaler "
        "scales `loss.backward()`, so small gradients underflow to zero")
    assert [(f, r) for f, r, _ in related] == [
        ("trainer/policies.py", 4), ("trainer/build.py", _row(root, "trainer/build.py", "return FSDP")),
        ("trainer/train.py", _row(root, "trainer/train.py", "wrap_model(Net()"))]


def test_fsdp2_policy_helper_in_place_sharding_and_a_trainer_class(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/precision.py": FSDP2_PRECISION.format(dtype="float16"),
                               "trainer/sharding.py": FSDP2_SHARDING, "trainer/trainer.py": FSDP2_TRAINER})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("trainer/trainer.py", _row(root, "trainer/trainer.py", "loss.backward()"))
    wrap = _row(root, "trainer/sharding.py", "fully_shard(model,")
    assert "(`MixedPrecisionPolicy(param_dtype=torch.float16, ...)`, trainer/precision.py:6, handed to " \
           f"`fully_shard` at trainer/sharding.py:{wrap}, through `apply_fsdp()` on line 10)" in message
    assert [(f, r) for f, r, _ in related] == [("trainer/precision.py", 6), ("trainer/sharding.py", wrap),
                                               ("trainer/trainer.py", 10)]


def test_a_model_passed_to_the_loop_and_a_policy_chosen_by_a_flag(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/run.py": """\
        import argparse

        import torch
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

        from .model import Net


        def train_epoch(model, loader, optimizer):
            for step, (images, labels) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--fp16", action="store_true")
            args = parser.parse_args()
            dtype = torch.float16 if args.fp16 else torch.bfloat16
            model = fully_shard(Net(), mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                train_epoch(model, loader=None, optimizer=optimizer)
        """})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("trainer/run.py", 12)
    assert message.startswith(
        "FSDP computes in float16 here when `--fp16` is set (trainer/run.py:19) (`MixedPrecisionPolicy(param_dtype="
        "dtype)` handed to `fully_shard` at line 22, through `train_epoch()` on line 25): no ShardedGradScaler "
        "scales `loss.backward()`")
    assert [(f, r) for f, r, _ in related] == [("trainer/run.py", 19), ("trainer/run.py", 22), ("trainer/run.py", 25)]


def test_a_bfloat16_policy_needs_no_scaler(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": BUILD.format(policy="bf16_policy"),
                               "trainer/train.py": TRAIN, "trainer/sharding.py": FSDP2_SHARDING,
                               "trainer/precision.py": FSDP2_PRECISION.format(dtype="bfloat16"),
                               "trainer/trainer.py": FSDP2_TRAINER})
    assert _findings(root, monkeypatch) == []


def test_a_sharded_grad_scaler_scales_the_loss(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": BUILD.format(policy="fp16_policy"),
                               "trainer/train.py": TRAIN_SCALED, "trainer/trainer.py": FSDP2_TRAINER_SCALED,
                               "trainer/precision.py": FSDP2_PRECISION.format(dtype="float16"),
                               "trainer/sharding.py": FSDP2_SHARDING})
    assert _findings(root, monkeypatch) == []


def test_a_float16_policy_never_handed_to_fsdp(tmp_path, monkeypatch):
    """The policy is built and exported, but the wrap takes none (FSDP then trains in float32),
    and a policy given as a variable of unknown dtype is no evidence."""
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision

        from .policies import fp16_policy  # kept for the evaluation script


        def wrap_model(model, device_id):
            return FSDP(model, device_id=device_id)


        def wrap_configured(model, param_dtype):
            return FSDP(model, mixed_precision=MixedPrecision(param_dtype=param_dtype))
        """, "trainer/train.py": TRAIN, "trainer/tune.py": TRAIN.replace(
        "from .build import wrap_model", "from .build import wrap_configured as wrap_model")})
    assert _findings(root, monkeypatch) == []


def test_a_frozen_float16_teacher_is_not_what_the_backward_trains(tmp_path, monkeypatch):
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/distill.py": """\
        import torch
        import torch.nn.functional as F
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from .policies import bf16_policy, fp16_policy


        def distill(student, teacher, loader, optimizer, temperature=2.0):
            teacher = FSDP(teacher, mixed_precision=fp16_policy)
            student = FSDP(student, mixed_precision=bf16_policy)
            teacher.eval()
            for inputs, _ in loader:
                with torch.no_grad():
                    soft_targets = F.softmax(teacher(inputs) / temperature, dim=-1)
                logits = student(inputs)
                loss = F.kl_div(F.log_softmax(logits / temperature, dim=-1), soft_targets, reduction="batchmean")
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        """})
    assert _findings(root, monkeypatch) == []


def test_a_loop_that_scales_when_given_a_scaler(tmp_path, monkeypatch):
    """The library's loop backpropagates unscaled only on the branch without a scaler; its
    caller wraps the float16 model and passes a ShardedGradScaler."""
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": BUILD.format(policy="fp16_policy"),
                               "trainer/loop.py": """\
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        from .build import wrap_model
        from .model import Net


        def train_one_epoch(model, loader, optimizer, scaler=None):
            for inputs, targets in loader:
                loss = model(inputs).log_softmax(-1).gather(1, targets[:, None]).mean().neg()
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                optimizer.zero_grad()


        def main(loader, optimizer_factory, rank):
            model = wrap_model(Net(), rank)
            optimizer = optimizer_factory(model.parameters())
            train_one_epoch(model, loader, optimizer, scaler=ShardedGradScaler())
        """})
    assert _findings(root, monkeypatch) == []


def test_a_cached_result_follows_the_policy_module(tmp_path, monkeypatch):
    """The loop's finding rests on two other modules: a cached result stands only while they do."""
    root = _project(tmp_path, {"trainer/policies.py": POLICIES, "trainer/build.py": BUILD.format(policy="fp16_policy"),
                               "trainer/train.py": TRAIN})
    monkeypatch.chdir(root)

    def rows():
        result = CliRunner().invoke(main, ["check", "--select", "AMP009", "--output-format", "json", "."])
        return [(f["filename"], f["location"]["row"]) for f in json.loads(result.output)]

    found = [("trainer/train.py", _row(root, "trainer/train.py", "loss.backward()"))]
    assert rows() == found
    (root / "trainer" / "policies.py").write_text(POLICIES.replace("=torch.float16", "=torch.bfloat16"))
    assert rows() == []
    (root / "trainer" / "policies.py").write_text(POLICIES)
    assert rows() == found
    (root / "trainer" / "build.py").write_text(BUILD.format(policy="bf16_policy"))
    assert rows() == []
