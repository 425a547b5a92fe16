"""What `amplint trace`'s instrumentation costs per training step, against the same run without it.

    python benchmarks/trace_overhead.py [--steps 200] [--runs 5]

A small MLP (256 -> 512 -> 10, batch 64) trained on the CPU with the whole AMP recipe (float16
autocast, GradScaler, unscale_, clip, step, update), one thread so that runs compare. Each run
times `--steps` steps after a warm-up; plain and traced runs alternate, and the medians and
their ratio are printed (the issue's goal: at most 1.5x the step time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import amplint


def _train(steps: int) -> float:
    """Seconds per step of a seeded run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()

    for _ in range(10):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, traced = [], []
    for _ in range(args.runs):
        plain.append(_train(args.steps))
        with amplint.tracing(steps=None, device="cpu"):
            traced.append(_train(args.steps))
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"| run | ms per step (median of {args.runs}) |\n|---|---|")
    print(f"| plain | {p * 1e3:.2f} |\n| under amplint.tracing() | {t * 1e3:.2f} |")
    print(f"\nRatio: {t / p:.2f}x the step time (goal <= 1.5x)")


if __name__ == "__main__":
    main()
