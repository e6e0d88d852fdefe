"""What `envbuild diagnose` costs the job it watches, four ways (target: <= 3% slower):

1. in one process, the same CPU-torch training loop with the probe's hooks on and off in
   turn (its DataLoader wrapper and optimizer step hooks, as `probe.install` sets them on a
   CPU build), many rounds: the hooks' cost with the least noise a shared machine allows;
2. the hooks' own time per step, by a tight loop over a wrapped DataLoader step and an
   optimizer step with and without them, divided by the job's step time;
3. end to end: the loop bare and under `envbuild diagnose -- …` (the probe as its
   sitecustomize, the sampler reading /proc every 0.5 s beside it), interleaved run by run
   (bare, diagnosed; diagnosed, bare; …), every run with one torch thread and
   OMP_NUM_THREADS=1 so the job's own runtime does not depend on a free second core;
4. the sampler alone: its CPU per tick against a job of 5 processes and 29 threads (a
   training process with four DataLoader workers), and what that is per second at the
   default interval; and `session.run_command`'s CPU per second of sampling a `sleep`
   (the ticks and the waits between them). It runs against any checkout that has `session.Sampler`, so a
   before/after pair is `PYTHONPATH=<old checkout> python bench/bench_diagnose.py --only sampler`.

The job times its own loop (a fixed number of optimizer steps over a DataLoader, so every
probe hook runs once per batch) and writes it to a file, so the interpreter's start and
`import torch` (seconds, and the noisiest part on a shared machine) stay out of the loop
figures. Per run, end to end:

- the loop's wall time (what the user waits for) and CPU time (the process's, one thread);
- envbuild's own CPU (the sampler's process, start-up and report included, its children
  not): read from /proc/PID/stat after it exits and before it is reaped (``waitid`` with
  ``WNOWAIT``), so the job's own exit (torch's teardown) is not counted as the sampler's.

Printed: medians, minima, maxima and the spread ((max - min) / median) of each side, the
ratio of the medians and the median of the per-round ratios (each diagnosed run against the
bare run beside it), and the load average before and after. Target: ratio of medians
(diagnosed / bare) of the loop's wall time <= 1.03. Run from the checkout:
`PYTHONPATH=. python bench/bench_diagnose.py [ROUNDS] [--steps N] [--only inproc|e2e|sampler]
[--baseline OTHER_CHECKOUT]` (the last adds a third arm diagnosed by that checkout's envbuild:
before/after in one interleaved sequence).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_resolve import compile_package

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.03
STEPS = 3000  # about 3-5 s of loop on a development machine: ten ticks of the sampler at least
JOB = """
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
STEPS = int(sys.argv[2])
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
"""
FAKE_JOB = """
import multiprocessing, threading, time
def idle(threads):
    for _ in range(threads):
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    time.sleep(600)
if __name__ == "__main__":
    for _ in range(4):
        multiprocessing.Process(target=idle, args=(3,), daemon=True).start()
    for _ in range(12):
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(600)
"""
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def own_cpu(pid: int) -> tuple[float, float]:
    """(its own CPU s, its waited-for children's) of an ended, not yet reaped process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / hz, (int(fields[13]) + int(fields[14])) / hz


def run(job: Path, result: Path, steps: int, checkout: Path | None) -> dict[str, float]:
    """One run of the job: bare (``checkout`` None) or under that checkout's envbuild diagnose."""
    command = [sys.executable, str(job), str(result), str(steps)]
    env = {**os.environ, **SINGLE_THREAD}
    if checkout is not None:
        command = [sys.executable, "-m", "envbuild", "diagnose", "--seconds", "600", "--", *command]
        env["PYTHONPATH"] = str(checkout)
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - started
    own, children = own_cpu(process.pid)
    if process.wait() != 0:
        raise SystemExit(f"the job failed ({checkout or 'bare'})")
    found = {k: float(v) for k, v in json.loads(result.read_text()).items()}
    return {**found, "wall_s": wall, "sampler_cpu_s": own if checkout else 0.0,
            "job_total_cpu_s": children if checkout else own}


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
        paired = [on / off for on, off in zip(per_step[True], per_step[False], strict=True)]
        print(f"   paired (each round's hooked half / its bare half): {_judge_paired(paired)}")
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


def end_to_end(rounds: int, steps: int, baseline: Path | None) -> None:
    """3: bare and diagnosed runs in turn, the order rotating each round; with ``baseline``,
    a third arm diagnosed by another checkout's envbuild (before/after in one sequence)."""
    arms: list[tuple[str, Path | None]] = [("bare", None), ("diagnosed", ROOT)]
    arms += [(f"diagnosed by {baseline.name}", baseline)] if baseline else []
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in arms}
    for _, checkout in arms:
        if checkout is not None:
            compile_package(checkout / "envbuild")  # as installed: no module compiled per run
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-diagnose-") as tmp:
        job, result = Path(tmp) / "job.py", Path(tmp) / "result.json"
        job.write_text(JOB)
        for i in range(rounds):
            for label, checkout in arms[i % len(arms):] + arms[:i % len(arms)]:
                runs[label].append(run(job, result, steps, checkout))
    print(f"3. end to end, {rounds} rounds ({', '.join(label for label, _ in arms)} in turn, the order "
          f"rotating), {steps} steps each, one torch thread; {os.cpu_count()} CPUs, load average "
          f"(1 min) {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"   {'':24}{'median':>9}{'min':>8}{'max':>8}{'spread':>8}{'/bare: medians':>16}{'paired':>8}")
    for field, what in (("loop_s", "loop wall s"), ("loop_cpu_s", "loop CPU s"),
                        ("wall_s", "process wall s"), ("job_total_cpu_s", "job CPU s, exit incl.")):
        bare = [r[field] for r in runs["bare"]]
        for label, _ in arms:
            values = [r[field] for r in runs[label]]
            paired = statistics.median(v / b for v, b in zip(values, bare, strict=True))
            ratios = f"{statistics.median(values) / statistics.median(bare):16.3f}{paired:8.3f}"
            print(f"   {what if label == 'bare' else '':24}{_stats(values)}"
                  f"{ratios if label != 'bare' else ''}   {label}")
    ratio = _median(runs["diagnosed"], "loop_s") / _median(runs["bare"], "loop_s")
    looped = [d["loop_s"] / b["loop_s"] for d, b in zip(runs["diagnosed"], runs["bare"], strict=True)]
    print(f"   loop wall, ratio of medians {ratio:.3f}; target <= {TARGET}: "
          f"{_judge(ratio, [r['loop_s'] for r in runs['bare']])}")
    print(f"   loop wall, paired (each diagnosed run / the bare run beside it): {_judge_paired(looped)}")
    whole = [d["wall_s"] / b["wall_s"] for d, b in zip(runs["diagnosed"], runs["bare"], strict=True)]
    print(f"   process wall, paired (the command: envbuild's start-up and report too, the interpreter's "
          f"start and `import torch` in both): {_judge_paired(whole)}")
    for label, _ in arms[1:]:
        cpu = [r["sampler_cpu_s"] for r in runs[label]]
        per_s = statistics.median(r["sampler_cpu_s"] / r["wall_s"] for r in runs[label])
        print(f"   {label}: envbuild's own process (start-up, sampling, report) {statistics.median(cpu):.3f} "
              f"CPU s per run (min {min(cpu):.3f}, max {max(cpu):.3f}), {100 * per_s:.1f}% of one core")


def sampler_alone(seconds: float = 5.0) -> None:
    """4: the sampler's CPU per tick against a 5-process, 29-thread job that sleeps."""
    from envbuild.diagnose import session

    with tempfile.TemporaryDirectory(prefix="envbuild-bench-diagnose-") as tmp:
        (Path(tmp) / "fake.py").write_text(FAKE_JOB)
        job = subprocess.Popen([sys.executable, str(Path(tmp) / "fake.py")], stdout=subprocess.PIPE,
                               start_new_session=True)
        try:
            assert job.stdout is not None and job.stdout.readline()
            time.sleep(0.5)
            sampler = session.Sampler(session.Gpus(read=None, source=None), session.INTERVAL_S)
            ticks, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
            while time.perf_counter() - wall0 < seconds:
                sampler.tick(job.pid)
                ticks += 1
            cpu = time.process_time() - cpu0
            getattr(sampler, "close", lambda: None)()
        finally:
            os.killpg(job.pid, 9)
            job.wait()
    threads = len(sampler.cpu[-1].threads)
    print(f"4. the sampler alone, {ticks} ticks back to back against a job of "
          f"{len(sampler.cpu[-1].blkio)} processes / {threads} threads: {1e3 * cpu / ticks:.3f} ms CPU "
          f"per tick = {100 * cpu / ticks / session.INTERVAL_S:.2f}% of one core at one tick per "
          f"{session.INTERVAL_S} s (load average {os.getloadavg()[0]:.2f})")
    spent = {}
    for length in (1, 6):  # the difference: ticks and the waits between them, start-up cancelled out
        started = time.process_time()
        session.run_command(["sleep", str(length)], seconds=60, env=dict(os.environ),
                            gpus=session.Gpus(read=None, source=None))
        spent[length] = time.process_time() - started
    per_s = (spent[6] - spent[1]) / 5
    print(f"   run_command against `sleep` (one thread), ticks and waits: {1e3 * per_s:.2f} ms CPU per "
          f"second of sampling = {100 * per_s:.2f}% of one core")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int, nargs="?", default=7)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--only", choices=("inproc", "e2e", "sampler"))
    parser.add_argument("--baseline", type=Path, help="another envbuild checkout, diagnosing a third arm")
    args = parser.parse_args()
    if args.only in (None, "sampler"):
        sampler_alone()
    if args.only in (None, "inproc"):
        in_process(4 * args.rounds)
    if args.only in (None, "e2e"):
        end_to_end(args.rounds, args.steps, args.baseline)
    return 0


def _stats(values: list[float]) -> str:
    middle = statistics.median(values)
    return (f"{middle:9.3f}{min(values):8.3f}{max(values):8.3f}"
            f"{100 * (max(values) - min(values)) / middle:7.1f}%")


def _judge(ratio: float, bare: list[float]) -> str:
    """'met' / 'NOT met', or 'inconclusive' where the bare runs alone spread wider than the
    3% the target allows: then the machine's noise, not envbuild, decides the ratio."""
    spread = (max(bare) - min(bare)) / statistics.median(bare)
    if spread > TARGET - 1:
        return f"inconclusive (the bare runs alone spread {100 * spread:.0f}%)"
    return "met" if ratio <= TARGET else "NOT met"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median: the order statistics x(k) and x(n+1-k) with
    the largest k for which the binomial(n, 1/2) chance of fewer than k values below the median
    is at most (1 - confidence) / 2. None when n is too small for any such k (n < 6 at 95%)."""
    n, ordered = len(values), sorted(values)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n  # P(fewer than k + 1 values below the median)
        if below > tail:
            break
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k >= 1 else None


def _judge_paired(ratios: list[float]) -> str:
    """The verdict from the ratios of adjacent runs: met when the 95% interval of their median
    lies at or under the target, NOT met when it lies above, inconclusive when it straddles it.
    Pairing cancels what drifts slowly (the host's speed), which the spread of one side cannot."""
    middle, interval = statistics.median(ratios), median_interval(ratios)
    if interval is None:
        return f"median {middle:.3f} of {len(ratios)} rounds: too few rounds for an interval (6 at least)"
    low, high = interval
    verdict = ("met" if high <= TARGET else "NOT met" if low > TARGET
               else "inconclusive (the interval straddles the target: more rounds)")
    return (f"median {middle:.3f}, 95% interval {low:.3f}-{high:.3f} over {len(ratios)} rounds "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f}); target <= {TARGET}: {verdict}")


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


if __name__ == "__main__":
    sys.exit(main())
