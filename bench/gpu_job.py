"""A training loop on the GPU whose bottleneck is known, for bench/bench_diagnose_gpu.py.

python gpu_job.py MODE WORKERS SECONDS RESULT [--device cuda|cpu]

  loader   a DataLoader whose __getitem__ sleeps SLEEP_S per sample (a batch of BATCH takes
           BATCH * SLEEP_S in one process), WORKERS worker processes, and a step that keeps the
           GPU busy for about STEP_MATMULS bf16 products of N x N (tens of ms on a Hopper
           card). With 0 workers the loop waits for data most of the time (input-bound); with
           8 a batch is ready before the step ends (gpu-bound).
  compute  no DataLoader: the batch is made on the GPU, the same step (gpu-bound).

The loop runs SECONDS (after WARMUP_S not counted), then writes {"steps", "seconds",
"steps_per_s", ...} to RESULT: the job times itself, so torch's import and the workers'
start stay out of the figure. ``--device cpu`` (with a far smaller N) exists to try the
bench's plumbing on a machine without a GPU; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

SLEEP_S = 0.002
BATCH = 32
FEATURES = 1024
STEP_MATMULS = 24
WARMUP_S = 2.0


class Slow(Dataset[Any]):
    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SLEEP_S)
        return torch.randn(FEATURES), torch.randint(0, 10, ())


def batches(mode: str, workers: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if mode == "compute":
        while True:
            yield (torch.randn(BATCH, FEATURES, device=device),
                   torch.randint(0, 10, (BATCH,), device=device))
    loader = DataLoader(Slow(), batch_size=BATCH, num_workers=workers,
                        persistent_workers=workers > 0)
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("loader", "compute"))
    parser.add_argument("workers", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("result")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    n = 8192 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    steps, started = 0, time.perf_counter()
    counted_from: float | None = None
    for x, y in batches(args.mode, args.workers, device):
        c = a
        for _ in range(STEP_MATMULS):  # the step's GPU work: products that keep the SMs busy
            c = torch.matmul(c, b) * n ** -0.5  # entries stay near 1
        loss = torch.nn.functional.cross_entropy(model(x), y) + c[0, 0].float() * 0.0
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        loss.item()  # a training log's sync: each step ends when its GPU work has
        now = time.perf_counter()
        if counted_from is None:
            if now - started >= WARMUP_S:
                counted_from = now
            continue
        steps += 1
        if now - counted_from >= args.seconds:
            break
    elapsed = time.perf_counter() - (counted_from or started)
    with open(args.result, "w", encoding="utf-8") as handle:
        json.dump({"mode": args.mode, "workers": args.workers, "device": str(device),
                   "steps": steps, "seconds": round(elapsed, 4),
                   "steps_per_s": round(steps / elapsed, 4), "pid": os.getpid()}, handle)


if __name__ == "__main__":
    main()
