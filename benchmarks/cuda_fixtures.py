"""Drives the fixtures' trainers that have no script of their own on a CUDA GPU, so that
`amplint trace` sees them run: `amplint trace --steps 0 -- python benchmarks/cuda_fixtures.py
faulty` (or `correct`), from the repository's root (`benchmarks/cuda_check.sh` does).

Each trainer of `fixtures/<kind>/` (the GAN trainer, the pre-2.4 trainer class, the float16
segmentation functions, and for `correct` the recipes of PyTorch's AMP examples) is called with
tiny models and a few batches of random data. A call that raises (the faulty fixtures' mistakes
include some that do) is said on stderr and the next call runs.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

import torch
from torch import nn

KIND = sys.argv[1]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / KIND))

import gan_trainer  # noqa: E402
import legacy_trainer  # noqa: E402
import segmentation_fp16  # noqa: E402

torch.manual_seed(0)
NOISE = 8


def run(name: str, call) -> None:
    try:
        call()
        print(f"{name}: done", file=sys.stderr)
    except Exception as exc:  # the next trainer runs: a raise is one of the mistakes looked for
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"{name}: {type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: "
              f"{str(exc).splitlines()[0]}", file=sys.stderr)


def images(n: int, size: int = 8) -> list[torch.Tensor]:
    return [torch.randn(4, 3, size, size) for _ in range(n)]


def gan() -> gan_trainer.GanTrainer:
    generator = nn.Sequential(nn.Linear(NOISE, 3 * 8 * 8), nn.Unflatten(1, (3, 8, 8))).cuda()
    discriminator = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 1)).cuda()
    return gan_trainer.GanTrainer(generator, discriminator, accumulate=2)


trainer = gan()
run("GanTrainer.train_epoch", lambda: trainer.train_epoch(images(4), NOISE))
run("GanTrainer.finetune_discriminator",
    lambda: gan().finetune_discriminator([(x, torch.rand(4, 1)) for x in images(2)]))
run("GanTrainer.train_critic_gp", lambda: gan().train_critic_gp(images(2), NOISE))
with tempfile.TemporaryDirectory() as folder:
    run("GanTrainer.save", lambda: trainer.save(Path(folder) / "gan.pt"))

model = nn.Linear(8, 8).cuda()
legacy = legacy_trainer.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
run("Trainer.training_step",
    lambda: [legacy.training_step((torch.randn(4, 8).cuda(), torch.randn(4, 8).cuda())) for _ in range(3)])

segments = [(torch.randn(2, 3, 16, 16), torch.rand(2, 16, 16), torch.randint(0, 4, (2,))) for _ in range(2)]
run("segmentation train", lambda: segmentation_fp16.train(segments, epochs=1))
if KIND == "faulty":
    run("segmentation finetune_half", lambda: segmentation_fp16.finetune_half(segmentation_fp16.SegNet(), segments))
else:
    run("segmentation finetune", lambda: segmentation_fp16.finetune(
        segmentation_fp16.SegNet().cuda(), segments, torch.amp.GradScaler("cuda")))
run("segmentation embed", lambda: segmentation_fp16.embed(torch.randn(4, 32).cuda(), torch.randn(64, 32).cuda()))
run("segmentation evaluate_on_cpu", lambda: segmentation_fp16.evaluate_on_cpu(segmentation_fp16.SegNet(), segments))

if KIND == "correct":
    import amp_recipes as recipes

    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
    opt, opt_other = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(other.parameters(), lr=0.1)
    batches = [(torch.randn(4, 8).cuda(), torch.randint(0, 2, (4,)).cuda()) for _ in range(4)]
    loss_fn = nn.CrossEntropyLoss()
    run("typical_loop", lambda: recipes.typical_loop(net, batches[:2], opt, loss_fn, 1))
    run("with_gradient_clipping", lambda: recipes.with_gradient_clipping(net, batches[:2], opt, loss_fn, 1.0))
    run("with_gradient_accumulation", lambda: recipes.with_gradient_accumulation(net, batches, opt, loss_fn, 2))
    run("with_gradient_penalty", lambda: recipes.with_gradient_penalty(net, batches[:2], opt, loss_fn))
    run("two_models_two_optimizers",
        lambda: recipes.two_models_two_optimizers(net, other, batches[:2], opt, opt_other, loss_fn))
    run("bf16_training_without_scaler", lambda: recipes.bf16_training_without_scaler(net, batches[:2], opt, loss_fn))
    run("cpu_inference", lambda: recipes.cpu_inference(net.cpu(), batches[0][0].cpu()))
