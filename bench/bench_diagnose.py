"""What `envbuild diagnose` costs the job it watches: the same CPU-torch training loop, bare
and under `envbuild diagnose -- …` (the probe as its sitecustomize, the sampler reading /proc
every 0.5 s beside it), interleaved run by run so that machine noise hits both alike.

The figure is the ratio of median loop times (diagnosed / bare; target <= 1.03). The job
times its own loop (a fixed number of optimizer steps over a DataLoader, so every probe hook
runs once per batch) and writes it to a file, so the interpreter's start and `import torch`
(seconds, and the noisiest part on a shared machine) stay out of the figure; the whole
process's wall time is printed beside it. Run from the checkout:
`PYTHONPATH=. python bench/bench_diagnose.py [ROUNDS]`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.03
STEPS = 400
JOB = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, started = 0, time.perf_counter()
while steps < STEPS:
    for x, y in DataLoader(data, batch_size=32, shuffle=True, num_workers=0):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if steps == STEPS:
            break
with open(sys.argv[1], "w") as out:
    json.dump({"loop_s": time.perf_counter() - started}, out)
""".replace("STEPS", str(STEPS))


def run(job: Path, result: Path, diagnosed: bool) -> tuple[float, float]:
    command = [sys.executable, str(job), str(result)]
    if diagnosed:
        command = [sys.executable, "-m", "envbuild", "diagnose", "--seconds", "600", "--", *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if diagnosed else dict(os.environ)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return float(json.loads(result.read_text())["loop_s"]), wall


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-diagnose-") as tmp:
        job, result = Path(tmp) / "job.py", Path(tmp) / "result.json"
        job.write_text(JOB)
        loops: dict[bool, list[float]] = {False: [], True: []}
        walls: dict[bool, list[float]] = {False: [], True: []}
        for i in range(rounds):
            for diagnosed in ((False, True) if i % 2 == 0 else (True, False)):
                loop, wall = run(job, result, diagnosed)
                loops[diagnosed].append(loop)
                walls[diagnosed].append(wall)
    bare, diag = statistics.median(loops[False]), statistics.median(loops[True])
    print(f"{rounds} rounds, {STEPS} steps each, interleaved; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':12}{'loop median s':>15}{'loop min s':>12}{'process median s':>18}")
    for label, key in (("bare", False), ("diagnosed", True)):
        print(f"{label:12}{statistics.median(loops[key]):15.3f}{min(loops[key]):12.3f}"
              f"{statistics.median(walls[key]):18.2f}")
    ratio, best = diag / bare, min(loops[True]) / min(loops[False])
    print(f"ratio of medians {ratio:.3f} (of minima {best:.3f}); target <= {TARGET}: "
          f"{'met' if ratio <= TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
