"""The fleet's flow: render every target's files, submit them all, wait for all under one
deadline, collect every node's report. Targets run side by side (each engine schedules its
own jobs), so two node types take about the slowest one, not the sum.

An engine is a subprocess boundary (``SlurmEngine``, ``KubectlEngine``) with this protocol;
tests hand in stand-ins where no engine runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from envbuild.fleet import kubernetes, slurm
from envbuild.fleet.plan import Engine, FleetTarget, RunOptions
from envbuild.fleet.report import FleetReport, NodeResult, TargetResult

POLL_SECONDS = 1.0


class Submitted(Protocol):
    @property
    def target(self) -> FleetTarget: ...
    @property
    def job(self) -> str: ...
    @property
    def problem(self) -> str: ...


class FleetEngine(Protocol):
    name: str

    def submit(self, target: FleetTarget) -> Any: ...
    def finished(self, submission: Any) -> bool: ...
    def cancel(self, submission: Any) -> None: ...
    def final_state(self, submission: Any) -> str: ...
    def collect(self, submission: Any) -> tuple[NodeResult, ...]: ...


def render_fleet(engine: Engine, targets: Sequence[FleetTarget], options: RunOptions, *,
                 lock_bytes: bytes) -> dict[str, bytes]:
    """Every file the engine needs, by relative name. Slurm's also carry the smoke test and the
    lock (the host launcher runs them from the shared directory)."""
    files: dict[str, bytes] = {}
    for target in targets:
        module = slurm if engine == "slurm" else kubernetes
        files.update(module.render_target(target, options))
    if engine == "slurm":
        from envbuild.smoke.bundle import payload

        files["smoke.py"] = payload()
        files["envbuild.lock"] = lock_bytes
    return files


def run_fleet(engine: FleetEngine, targets: Sequence[FleetTarget], *, deadline: float,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> FleetReport:
    """Submit every target, wait for all until ``deadline`` seconds have passed (then cancel
    what still runs), and judge each target by the nodes that answered."""
    start = clock()
    submissions = [engine.submit(t) for t in targets]
    waiting = [s for s in submissions if s.job]
    late: set[str] = set()
    while waiting:
        waiting = [s for s in waiting if not engine.finished(s)]
        if waiting and clock() - start >= deadline:
            for submission in waiting:
                engine.cancel(submission)
                late.add(submission.target.name)
            break
        if waiting:
            sleep(POLL_SECONDS)
    results = [_judge(engine, s, late) for s in submissions]
    return FleetReport(engine=engine.name, targets=tuple(results), seconds=clock() - start)


def _judge(engine: FleetEngine, submission: Submitted, late: set[str]) -> TargetResult:
    target = submission.target
    if submission.problem:
        return TargetResult(target=target.name, expected=target.nodes, problem=submission.problem)
    nodes = engine.collect(submission)
    problem = ""
    if target.name in late:
        problem = (f"target {target.name}: deadline passed with {len(nodes)} of {target.nodes} nodes "
                   "answered (job cancelled)")
    elif len(nodes) < target.nodes:
        state = engine.final_state(submission)
        problem = (f"target {target.name}: {len(nodes)} of {target.nodes} nodes answered"
                   + (f" (job {submission.job} {state})" if state else ""))
    return TargetResult(target=target.name, expected=target.nodes, nodes=nodes, problem=problem)


def engine_for(name: Engine, env: Mapping[str, str], directory: Path,
               options: RunOptions | None = None) -> FleetEngine:
    if name == "slurm":
        return slurm.SlurmEngine(env, directory, options)
    return kubernetes.KubectlEngine(env, directory, options)
