"""What `envbuild diagnose` costs the job it watches, three ways (target: <= 3% slower):

1. in one process, the same CPU-torch training loop with the probe's hooks on and off in
   turn (its DataLoader wrapper and optimizer step hooks, as `probe.install` sets them on a
   CPU build), many rounds: the hooks' cost with the least noise a shared machine allows;
2. the hooks' own time per step, by a tight loop over a wrapped DataLoader step and an
   optimizer step with and without them, divided by the job's step time;
3. end to end: the loop bare and under `envbuild diagnose -- …` (the probe as its
   sitecustomize, the sampler reading /proc every 0.5 s beside it), interleaved run by run.

The job times its own loop (a fixed number of optimizer steps over a DataLoader, so every
probe hook runs once per batch) and writes it to a file, so the interpreter's start and
`import torch` (seconds, and the noisiest part on a shared machine) stay out of the figures:

- the loop's CPU time (the process's, one torch thread): what the probe's hooks add to the
  job's own work, the figure least moved by other tenants of the machine;
- the loop's wall time: that, plus the sampler's competition for the cores (on a loaded
  machine, mostly noise; the minima are printed beside the medians);
- the sampler's own CPU (envbuild's process, the children's rusage less the job's own CPU)
  per second sampled.

Target: ratio of medians (diagnosed / bare) <= 1.03. Run from the checkout:
`PYTHONPATH=. python bench/bench_diagnose.py [ROUNDS]`.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.03
STEPS = 600
JOB = """
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, started, cpu = 0, time.perf_counter(), time.process_time()
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
    json.dump({"loop_s": time.perf_counter() - started, "loop_cpu_s": time.process_time() - cpu,
               "job_cpu_s": sum(os.times()[:2])}, out)
""".replace("STEPS", str(STEPS))


def run(job: Path, result: Path, diagnosed: bool) -> dict[str, float]:
    command = [sys.executable, str(job), str(result)]
    if diagnosed:
        command = [sys.executable, "-m", "envbuild", "diagnose", "--seconds", "600", "--", *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if diagnosed else dict(os.environ)
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = {k: float(v) for k, v in json.loads(result.read_text()).items()}
    children = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**found, "wall_s": wall, "sampler_cpu_per_s": max(0.0, children - found["job_cpu_s"]) / wall}


def in_process(rounds: int) -> None:
    """1 and 2: the hooks on and off in one interpreter (imports torch here)."""
    import torch
    import torch.optim.optimizer as optimizers
    import torch.utils.data.dataloader as loaders
    from torch.utils.data import DataLoader, TensorDataset

    from envbuild.diagnose import probe

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    base: Any = loaders._BaseDataLoaderIter
    original = base.__next__

    def loop(steps: int) -> float:
        started, done = time.process_time(), 0
        while done < steps:
            for x, y in DataLoader(data, batch_size=32, shuffle=True):
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                done += 1
                if done == steps:
                    break
        return (time.process_time() - started) / steps

    with tempfile.TemporaryDirectory() as tmp:
        recorder = probe.Recorder(str(Path(tmp) / "probe.jsonl"))

        def hooks_on() -> list[Any]:
            base.__next__ = probe.wrap_next(original, recorder)
            return [optimizers.register_optimizer_step_pre_hook(lambda o, a, k: recorder.step_begin()),
                    optimizers.register_optimizer_step_post_hook(lambda o, a, k: recorder.step_end(o))]

        def hooks_off(handles: list[Any]) -> None:
            base.__next__ = original
            for handle in handles:
                handle.remove()

        loop(100)  # warm-up
        per_step: dict[bool, list[float]] = {False: [], True: []}
        for i in range(rounds):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                handles = hooks_on() if on else []
                per_step[on].append(loop(200))
                hooks_off(handles)
        step = statistics.median(per_step[False])
        ratio = statistics.median(per_step[True]) / step
        print(f"1. in one process, {rounds} rounds x 200 steps, hooks on/off in turn: CPU per step "
              f"{1e3 * step:.3f} ms bare, {1e3 * statistics.median(per_step[True]):.3f} ms with the "
              f"hooks; ratio of medians {ratio:.3f}, of minima "
              f"{min(per_step[True]) / min(per_step[False]):.3f}: {_judge(ratio, per_step[False])}")
        handles = hooks_on()
        hooked = _hook_cost(recorder)
        hooks_off(handles)
        print(f"2. the hooks' own time: {1e6 * hooked:.2f} us per step (a batch wait and a step "
              f"timed) = {100 * hooked / step:.2f}% of this job's {1e3 * step:.3f} ms step")


def _hook_cost(recorder: Any) -> float:
    """Seconds the probe adds to one step: its data-wait and step calls, in a tight loop."""
    from envbuild.diagnose import probe

    def bare(self: Any) -> None:
        return None

    iterator = type("It", (), {})()
    wrapped = probe.wrap_next(bare, recorder)
    optimizer = type("Opt", (), {"param_groups": []})()
    n = 100_000
    started = time.perf_counter()
    for _ in range(n):
        bare(iterator)
    empty = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(n):
        wrapped(iterator)
        recorder.step_begin()
        recorder.step_end(optimizer)
    return max(0.0, time.perf_counter() - started - empty) / n


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    in_process(4 * rounds)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-diagnose-") as tmp:
        job, result = Path(tmp) / "job.py", Path(tmp) / "result.json"
        job.write_text(JOB)
        for i in range(rounds):
            for diagnosed in ((False, True) if i % 2 == 0 else (True, False)):
                runs[diagnosed].append(run(job, result, diagnosed))
    print(f"3. end to end, {rounds} rounds, {STEPS} steps each, interleaved; load average "
          f"{os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'':11}{'loop CPU s':>12}{'(min)':>8}{'loop wall s':>13}{'(min)':>8}{'process s':>11}")
    for label, key in (("bare", False), ("diagnosed", True)):
        print(f"{label:11}{_median(runs[key], 'loop_cpu_s'):12.3f}{_min(runs[key], 'loop_cpu_s'):8.3f}"
              f"{_median(runs[key], 'loop_s'):13.3f}{_min(runs[key], 'loop_s'):8.3f}"
              f"{_median(runs[key], 'wall_s'):11.2f}")
    for field, what in (("loop_cpu_s", "loop CPU"), ("loop_s", "loop wall")):
        ratio = _median(runs[True], field) / _median(runs[False], field)
        print(f"   {what}: ratio of medians {ratio:.3f} (of minima "
              f"{_min(runs[True], field) / _min(runs[False], field):.3f}); target <= {TARGET}: "
              f"{_judge(ratio, [r[field] for r in runs[False]])}")
    print(f"   sampler: {100 * _median(runs[True], 'sampler_cpu_per_s'):.1f}% of one core while sampling")
    return 0


def _judge(ratio: float, bare: list[float]) -> str:
    """'met' / 'NOT met', or 'inconclusive' where the bare runs alone spread wider than the
    3% the target allows: then the machine's noise, not envbuild, decides the ratio."""
    spread = (max(bare) - min(bare)) / statistics.median(bare)
    if spread > TARGET - 1:
        return f"inconclusive (the bare runs alone spread {100 * spread:.0f}%)"
    return "met" if ratio <= TARGET else "NOT met"


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _min(runs: list[dict[str, float]], key: str) -> float:
    return min(r[key] for r in runs)


if __name__ == "__main__":
    sys.exit(main())
