"""Slurm: per target an sbatch script (one task per node of its partition) and its node step,
rendered from templates/fleet/; and the engine that submits them with ``sbatch``, waits with
``squeue`` (``sacct`` for the final state where accounting runs) and reads each node's report
from the shared directory. Slurm schedules; envbuild only asks it, as a user's shell would
(``SLURM_CONF`` and the rest of the environment are passed on as they are).
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import SchedulerUnavailable
from envbuild.fleet.plan import FleetTarget, RunOptions
from envbuild.fleet.report import NODE_NAME_RE, NodeResult, Required, parse_node_report, sorted_nodes

IMAGE_PYTHON = "/opt/venv/bin/python"  # the rendered image's venv (templates/Dockerfile.j2)
IMAGE_SMOKE = "/opt/envbuild/smoke.py --lock /opt/envbuild/envbuild.lock"
SHM_SIZE = "16g"
MAX_NODE_REPORT = 4 << 20
LOG_TAIL = 4096  # of a node's log, only its end is read: its last line is what the table shows
_FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                       "PREEMPTED", "BOOT_FAIL", "DEADLINE"})


def gres(target: FleetTarget) -> str:
    slurm = target.placement.slurm
    assert slurm is not None
    return f"{slurm.gres}:{target.gpus_per_node}" if target.gpus_per_node else ""


def render_target(target: FleetTarget, options: RunOptions) -> dict[str, bytes]:
    """``NAME.sbatch`` and ``NAME.node.sh`` for one target."""
    from envbuild.render.templates import environment

    slurm = target.placement.slurm
    assert slurm is not None
    args = " ".join(options.smoke_args(target.gpus_per_node))
    context = {
        "name": target.name, "partition": slurm.partition, "nodes": target.nodes, "gres": gres(target),
        "minutes": max(1, math.ceil(options.deadline / 60)), "launcher": slurm.launcher,
        "image": target.image or "", "image_python": IMAGE_PYTHON, "shm_size": SHM_SIZE,
        "smoke_in_image": f"{IMAGE_SMOKE} {args}".strip(), "smoke_args": args,
        "host_python": shlex.quote(slurm.host_python), "platform": target.platform,
    }
    env = environment()
    files = {f"{target.name}.sbatch": env.get_template("fleet/sbatch.sh.j2").render(context).encode()}
    if slurm.launcher != "pyxis":
        files[f"{target.name}.node.sh"] = env.get_template("fleet/node.sh.j2").render(context).encode()
    return files


# --- the engine: sbatch, squeue, sacct --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    target: FleetTarget
    job: str = ""
    problem: str = ""  # sbatch refused it: the target fails with this


class SlurmEngine:
    """Slurm's own commands as subprocesses; ``env`` is the caller's environment (SLURM_CONF)."""

    name = "slurm"

    def __init__(self, env: Mapping[str, str], directory: Path, options: RunOptions | None = None) -> None:
        self.env, self.directory, self.options = dict(env), directory, options or RunOptions()

    def _run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                                  cwd=self.directory, timeout=timeout, check=False)
        except FileNotFoundError:
            raise SchedulerUnavailable(f"{argv[0]} not found", hint="run on a Slurm login node "
                                       "(sbatch, sinfo, squeue on PATH)") from None
        except subprocess.TimeoutExpired:
            raise SchedulerUnavailable(f"{argv[0]} did not answer in {timeout:g} s",
                                       hint="is slurmctld up? (scontrol ping)") from None

    def submit(self, target: FleetTarget) -> Submission:
        slurm = target.placement.slurm
        assert slurm is not None
        have = self.partition_nodes(slurm.partition)
        if have is not None and have < target.nodes:
            nodes = f"{have} node{'s' if have != 1 else ''}"
            return Submission(target=target, problem=f"target {target.name}: partition {slurm.partition} "
                              f"has {nodes}, the target declares {target.nodes}")
        done = self._run(["sbatch", "--parsable", f"{target.name}.sbatch"])
        job = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job.isdigit():
            why = _first_line(done.stderr) or f"sbatch exited {done.returncode}"
            return Submission(target=target, problem=f"target {target.name}: sbatch refused the job: {why}")
        return Submission(target=target, job=job)

    def partition_nodes(self, partition: str) -> int | None:
        """How many nodes the partition holds (sinfo), None when sinfo cannot say."""
        done = self._run(["sinfo", "--noheader", "--partition", partition, "--format", "%D"])
        counts = done.stdout.split()
        if done.returncode != 0 or not all(c.isdigit() for c in counts):
            return None
        return sum(int(c) for c in counts)

    def finished(self, submission: Submission) -> bool:
        if not submission.job:
            return True
        done = self._run(["squeue", "--noheader", "--jobs", submission.job, "--format", "%T"])
        state = done.stdout.strip()
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SchedulerUnavailable(f"squeue failed: {_first_line(done.stderr)}", hint="scontrol ping")
        return not state or state in _FINISHED

    def cancel(self, submission: Submission) -> None:
        if submission.job:
            self._run(["scancel", submission.job])

    def final_state(self, submission: Submission) -> str:
        """The job's end: sacct's state, else (no accounting kept) scontrol's state and reason."""
        done = self._run(["sacct", "--noheader", "--allocations", "--jobs", submission.job,
                          "--format", "State,ExitCode", "--parsable2"])
        if done.returncode == 0 and done.stdout.strip():
            return " ".join(done.stdout.strip().splitlines()[0].split("|"))
        shown = self._run(["scontrol", "show", "job", submission.job, "--oneliner"])
        fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
        state = " ".join(v for v in (fields.get("JobState"), fields.get("Reason"), fields.get("ExitCode"))
                         if v and v != "None")
        return state[:200]

    def collect(self, submission: Submission) -> tuple[NodeResult, ...]:
        required = self.options.required(submission.target.gpus_per_node)
        return read_reports(self.directory / "reports" / submission.target.name, required)


def read_reports(directory: Path, required: Required | None = None) -> tuple[NodeResult, ...]:
    """Every NODE.json in ``directory`` (a node's name in the file name, checked), each a verdict
    (passing only with what ``required`` asks for); of each NODE.log only its tail is read."""
    results = []
    if not directory.is_dir():
        return ()
    for path in sorted(directory.glob("*.json")):
        node = path.name[: -len(".json")]
        if not NODE_NAME_RE.fullmatch(node) or not path.is_file() or path.is_symlink():
            continue
        data = _read_end(path, MAX_NODE_REPORT, tail=False)
        tail = _last_line(_read_end(directory / f"{node}.log", LOG_TAIL).decode("utf-8", "replace"))
        results.append(parse_node_report(node, data, tail, required))
    return sorted_nodes(results)


def _read_end(path: Path, size: int, *, tail: bool = True) -> bytes:
    """At most ``size`` bytes of a node's regular file: its last ones (``tail``), else its first;
    b'' for a link, a FIFO or anything else a node left there (never a hang, never the whole)."""
    from envbuild.confine import open_regular
    from envbuild.errors import UsageError

    try:
        fd = open_regular(path, path.name, limit=1 << 62)
    except UsageError:
        return b""
    try:
        if tail:
            os.lseek(fd, max(0, os.fstat(fd).st_size - size), os.SEEK_SET)
        chunks, left = [], size
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text[-LOG_TAIL:].splitlines() if line.strip()]
    return lines[-1] if lines else ""


def clear_reports(directory: Path, names: Sequence[str]) -> None:
    """Reports of an earlier run are not this run's answer: remove them before submitting."""
    for name in names:
        folder = directory / "reports" / name
        if folder.is_dir():
            for path in folder.iterdir():
                if path.is_file() and not path.is_symlink():
                    os.unlink(path)
