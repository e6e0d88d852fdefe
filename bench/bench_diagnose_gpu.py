"""`envbuild diagnose` on real GPU training jobs: its verdicts, and what it costs them.

Three jobs of bench/gpu_job.py whose bottleneck is known, each run bare and under
`envbuild diagnose`, alternating (bare, diagnosed; diagnosed, bare; ...) ROUNDS times:

  loader-0   a slow DataLoader, no workers        expected: input-bound
  loader-8   the same DataLoader, 8 workers       expected: gpu-bound
  compute    batches made on the GPU              expected: gpu-bound

and once more `compute` diagnosed with NVML hidden (a `pynvml` that fails to import on the
job's and envbuild's path), so the samples come from the nvidia-smi stream instead.

Per run: the job's own steps per second (it times its loop, warm-up, imports and worker
start left out), and for a diagnosed run envbuild's own CPU (the sampler's process, read
from /proc/PID/stat before it is reaped, the job not counted; bench_diagnose.own_cpu).
Printed: per job the steps/s of each side, the ratio diagnosed/bare of each adjacent pair and
their median, the verdict against the expected one, the GPU utilisation diagnose measured,
and the sampler's CPU per second of job. Writes summary.json and every diagnose report to
--out. Needs a CUDA GPU; `--device cpu` runs the same plumbing on a CPU (meaningless figures,
the verdicts are then `not-on-gpu`), for trying the bench before a GPU is lent.

PYTHONPATH=. python bench/bench_diagnose_gpu.py [--rounds 2] [--seconds 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_diagnose import own_cpu

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "gpu_job.py"
CASES = (("loader-0", "loader", 0, "input-bound"), ("loader-8", "loader", 8, "gpu-bound"),
         ("compute", "compute", 0, "gpu-bound"))
HIDE_NVML = "raise ImportError('hidden by bench_diagnose_gpu: sample through nvidia-smi')\n"


def run(case: tuple[str, str, int, str], *, diagnosed: bool, seconds: float, out: Path,
        device: str, tag: str, hide_nvml: Path | None = None) -> dict[str, Any]:
    name, mode, workers, _ = case
    result = out / f"job-{name}-{tag}.json"
    command = [sys.executable, str(JOB), mode, str(workers), str(seconds), str(result),
               "--device", device]
    paths = [str(ROOT)] + ([str(hide_nvml)] if hide_nvml else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    report = out / f"diagnose-{name}-{tag}.json"
    if diagnosed:
        command = [sys.executable, "-m", "envbuild", "diagnose", "--seconds", str(seconds + 120),
                   "--report", str(report), "--", *command]
    with open(out / f"stderr-{name}-{tag}.txt", "wb") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - started
        own, _ = own_cpu(process.pid)
        code = process.wait()
    found: dict[str, Any] = {"case": name, "diagnosed": diagnosed, "exit": code, "wall_s": round(wall, 2)}
    if result.exists():
        found.update(json.loads(result.read_text()))
    if diagnosed:
        found["sampler_cpu_s"] = own
        if report.exists():
            r = json.loads(report.read_text())
            gpu = r.get("gpu") or {}
            found.update(verdict=r["verdict"], gpu_source=r.get("gpu_source"),
                         util_mean=gpu.get("util_mean"), util_p90=gpu.get("util_p90"),
                         job_on_gpu=gpu.get("job_on_gpu"),
                         data_wait_frac=(r.get("probe") or {}).get("data_wait_frac"),
                         diagnose_seconds=r.get("seconds"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="each job's timed loop")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", choices=[c[0] for c in CASES], action="append")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-diagnose-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    hidden = out / "hide-nvml"
    hidden.mkdir(exist_ok=True)
    (hidden / "pynvml.py").write_text(HIDE_NVML)
    print(f"load before: {os.getloadavg()}; reports in {out}", flush=True)
    runs: list[dict[str, Any]] = []
    for case in (c for c in CASES if not args.only or c[0] in args.only):
        for k in range(args.rounds):
            for diagnosed in ((False, True) if k % 2 == 0 else (True, False)):
                found = run(case, diagnosed=diagnosed, seconds=args.seconds, out=out,
                            device=args.device, tag=f"{k}-{'diag' if diagnosed else 'bare'}")
                runs.append(found)
                print(json.dumps(found), flush=True)
        if case[0] == "compute":
            found = run(case, diagnosed=True, seconds=args.seconds, out=out, device=args.device,
                        tag="smi-diag", hide_nvml=hidden)
            found["case"] = "compute (nvidia-smi)"
            runs.append(found)
            print(json.dumps(found), flush=True)
    print(f"load after: {os.getloadavg()}")
    summary = summarise(runs)
    (out / "summary.json").write_text(json.dumps({"runs": runs, "cases": summary}, indent=1) + "\n")
    print(table(summary))
    return 0 if all(s["verdict_ok"] for s in summary) else 1


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    expected = {c[0]: c[3] for c in CASES}
    expected["compute (nvidia-smi)"] = "gpu-bound"
    summary = []
    for name in dict.fromkeys(r["case"] for r in runs):
        mine = [r for r in runs if r["case"] == name]
        bare = [r.get("steps_per_s") for r in mine if not r["diagnosed"]]
        diag = [r for r in mine if r["diagnosed"]]
        # adjacent pairs: round k's bare and diagnosed runs (the nvidia-smi case has no bare one)
        ratios = [d["steps_per_s"] / b["steps_per_s"]
                  for b, d in zip([r for r in mine if not r["diagnosed"]], diag, strict=False)
                  if b.get("steps_per_s") and d.get("steps_per_s")]
        summary.append({
            "case": name, "expected": expected[name],
            "verdicts": [d.get("verdict") for d in diag],
            "verdict_ok": all(d.get("verdict") == expected[name] for d in diag),
            "gpu_source": sorted({str(d.get("gpu_source")) for d in diag}),
            "bare_steps_per_s": [b for b in bare if b is not None],
            "diag_steps_per_s": [d.get("steps_per_s") for d in diag],
            "ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "ratios": [round(x, 4) for x in ratios],
            "util_mean": [d.get("util_mean") for d in diag],
            "sampler_cpu_per_s": [round(d["sampler_cpu_s"] / d["wall_s"], 4) for d in diag
                                  if d.get("wall_s")],
        })
    return summary


def table(summary: list[dict[str, Any]]) -> str:
    lines = [f"{'job':22}{'expected':13}{'verdicts':28}{'bare steps/s':>16}{'diag steps/s':>16}"
             f"{'ratio':>8}{'GPU util %':>14}{'sampler CPU/s':>16}"]
    for s in summary:
        def fmt(xs: list[Any]) -> str:
            return ",".join("-" if x is None else f"{x:g}" for x in xs)
        ratio = "-" if s["ratio_median"] is None else f"{s['ratio_median']:.3f}"
        lines.append(f"{s['case']:22}{s['expected']:13}{','.join(map(str, s['verdicts'])):28}"
                     f"{fmt(s['bare_steps_per_s']):>16}{fmt(s['diag_steps_per_s']):>16}{ratio:>8}"
                     f"{fmt(s['util_mean']):>14}{fmt(s['sampler_cpu_per_s']):>16}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
