"""One diagnosis: start the job with the probe on its PYTHONPATH (or watch a running pid),
sample the GPUs and /proc until it ends or the time is up, and hand back a ``Recording``.

The job runs in a session (and process group) of its own: a Ctrl-C or a SIGTERM reaching
envbuild is passed on to the whole group (SIGINT, then SIGKILL after ``GRACE_S``) before
it ends envbuild, so no DataLoader worker is left behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.diagnose import probe
from envbuild.diagnose.evidence import Recording, read_probe_lines
from envbuild.diagnose.gpu import GpuSample, Nvml, query_fields, read_smi
from envbuild.diagnose.procfs import CpuSnapshot, JobReader, alive
from envbuild.diagnose.smi import SmiStream, period_ms
from envbuild.errors import UsageError

GRACE_S = 5.0  # a stopped job's time to finish its atexit (the probe's last lines) before SIGKILL
INTERVAL_S = 0.5  # between samples of /proc and NVML
SMI_INTERVAL_S = 1.0  # nvidia-smi's loop period (its samples are collected at this pace too)
SMI_TIMEOUT_S = 10.0
PROBE_FILE = "probe.jsonl"

GpuReader = Callable[[float], list[GpuSample]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpus:
    """How this host's GPUs are sampled; ``read`` is None when no GPU answers."""

    read: GpuReader | None
    source: str | None
    close: Callable[[], None] = lambda: None
    mig_profiles: Callable[[int], list[tuple[str, float]]] = lambda index: []


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    recording: Recording
    exit_code: int | None  # the job's own (128 + N when a signal ended it); None for --pid
    stopped: bool  # diagnose ended the job when --seconds ran out


def load_nvml() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except Exception:  # a missing or broken binding is the same as none
        return None
    return pynvml


def smi_runner(env: Mapping[str, str]) -> Callable[[Sequence[str]], str | None]:
    def run(argv: Sequence[str]) -> str | None:
        exe = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if exe is None:
            return None
        try:
            done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, errors="replace",
                                  timeout=SMI_TIMEOUT_S, check=False, env={**env, "LC_ALL": "C"})
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None
    return run


def open_gpus(env: Mapping[str, str], nvml: Any = None) -> Gpus:
    """NVML when ``pynvml`` loads and initialises, else nvidia-smi, else no GPU."""
    if nvml is not None:
        try:
            reader = Nvml(nvml)
        except Exception:  # no driver, no libnvidia-ml: try nvidia-smi
            reader = None
        if reader is not None and reader.handles:
            return Gpus(read=reader.read, source="nvml", close=reader.close, mig_profiles=reader.mig_profiles)
        if reader is not None:
            reader.close()
    run = smi_runner(env)
    answered = query_fields(run)
    if answered is None:
        return Gpus(read=None, source=None)
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    try:
        stream = SmiStream(exe or "nvidia-smi", answered[0], period_ms(SMI_INTERVAL_S), run,
                           {**env, "LC_ALL": "C"})
    except OSError:  # no second process: a query per sample
        return Gpus(read=lambda t: read_smi(run, t) or [], source="nvidia-smi")
    return Gpus(read=stream.read, source="nvidia-smi", close=stream.close)


def probe_dir() -> Path:
    """A private directory holding the probe as ``sitecustomize.py``."""
    directory = Path(tempfile.mkdtemp(prefix="envbuild-diagnose-"))
    (directory / "sitecustomize.py").write_bytes(Path(probe.__file__).read_bytes())
    return directory


def job_environment(env: Mapping[str, str], directory: Path) -> dict[str, str]:
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": str(directory) + (os.pathsep + path if path else ""),
            probe.ENV_OUT: str(directory / PROBE_FILE)}


def start(argv: Sequence[str], env: Mapping[str, str], stdout: int | None = None) -> subprocess.Popen[bytes]:
    """The job in a session of its own; ``stdout`` a descriptor to send its output to."""
    try:
        return subprocess.Popen(list(argv), env=dict(env), start_new_session=True, stdout=stdout)
    except FileNotFoundError:
        raise UsageError(f"command not found: {argv[0]}",
                         hint="give the program's path, or put it on PATH") from None
    except PermissionError:
        raise UsageError(f"command not executable: {argv[0]}", hint="chmod +x it, or run it "
                         "through its interpreter (python train.py)") from None


def stop_group(job: subprocess.Popen[bytes], grace: float = GRACE_S) -> None:
    """SIGINT to the job's process group, as a Ctrl-C would; SIGKILL what is left after ``grace``."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, grace)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(wait)
            if sig == signal.SIGINT:  # the leader ended: whatever is left of its group goes too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(job.pid, signal.SIGKILL)
            return


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Sampler:
    """Samples taken at each tick: the job tree's threads, and the GPUs when it is time."""

    def __init__(self, gpus: Gpus, interval: float, clock: Callable[[], float] = time.time) -> None:
        self.gpus, self.interval, self.clock = gpus, interval, clock
        self.cpu: list[CpuSnapshot] = []
        self.gpu: list[GpuSample] = []
        self.pids: set[int] = set()
        self.gpu_every = SMI_INTERVAL_S if gpus.source == "nvidia-smi" else interval
        self.gpu_last = -1e9
        self.reader: JobReader | None = None

    def tick(self, root: int) -> None:
        now = self.clock()
        if self.reader is None or self.reader.root != root:
            if self.reader is not None:
                self.reader.close()
            self.reader = JobReader(root)
        snap = self.reader.snapshot(now)
        self.pids.update(t.pid for t in snap.threads)
        self.cpu.append(snap)
        if self.gpus.read is not None and now - self.gpu_last >= self.gpu_every:
            self.gpu_last = now
            self.gpu.extend(self.gpus.read(now))

    def close(self) -> None:
        """The samples nvidia-smi's loop printed since the last tick (a job shorter than its
        period has no other), and the /proc descriptors held between ticks."""
        if self.gpus.read is not None and self.gpus.source == "nvidia-smi":
            self.gpu.extend(self.gpus.read(self.clock()))
        if self.reader is not None:
            self.reader.close()

    def recording(self, seconds: float, probe_lines: Sequence[str] = (), mig: bool = False) -> Recording:
        mig_profiles: tuple[tuple[str, float], ...] = ()
        if mig and self.gpu:
            mig_profiles = tuple(self.gpus.mig_profiles(self.gpu[-1].index))
        return Recording(seconds=seconds, gpu=tuple(self.gpu), gpu_source=self.gpus.source,
                         cpu=tuple(self.cpu), probe=read_probe_lines(probe_lines),
                         job_pids=frozenset(self.pids), tick_hz=os.sysconf("SC_CLK_TCK"),
                         mig_profiles=mig_profiles)


def run_command(argv: Sequence[str], *, seconds: float, env: Mapping[str, str], gpus: Gpus,
                interval: float = INTERVAL_S, stdout: int | None = None) -> Outcome:
    """Run ``argv`` with the probe until it exits or ``seconds`` pass; its samples.
    ``stdout``: where the job's output goes (a descriptor; default: envbuild's own)."""
    directory = probe_dir()
    try:
        job = start(argv, job_environment(env, directory), stdout)
        sampler, began = Sampler(gpus, interval), time.time()
        try:
            stopped = _watch(job, sampler, began + seconds)
        except BaseException:  # Ctrl-C, SIGTERM: the job's whole group goes first
            stop_group(job)
            raise
        finally:
            sampler.close()
        lines = _probe_lines(directory / PROBE_FILE)
        return Outcome(recording=sampler.recording(time.time() - began, lines, _mig(sampler)),
                       exit_code=None if stopped else exit_code(job.returncode), stopped=stopped)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _watch(job: subprocess.Popen[bytes], sampler: Sampler, deadline: float) -> bool:
    exited = _exit_descriptor(job.pid)
    try:
        while True:
            sampler.tick(job.pid)
            if job.poll() is not None:
                return False
            if time.time() >= deadline:
                stop_group(job)
                return True
            _pause(job, exited, sampler.interval)
    finally:
        if exited is not None:
            os.close(exited)


def _exit_descriptor(pid: int) -> int | None:
    """A pidfd, readable once ``pid`` exits (Linux 5.3+); None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _pause(job: subprocess.Popen[bytes], exited: int | None, seconds: float) -> None:
    """Up to ``seconds``, or until the job exits: one wake-up on a pidfd, where Popen.wait
    with a timeout polls about 30 times a second (the sampler's largest cost for a small job)."""
    if exited is not None:
        select.select([exited], [], [], seconds)
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.wait(seconds)


def _probe_lines(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.read(64 * 2**20).splitlines()  # bounded: the job wrote it, not envbuild
    except OSError:
        return []


def _mig(sampler: Sampler) -> bool:
    return any(s.mig for s in sampler.gpu)


def watch_pid(pid: int, *, seconds: float, gpus: Gpus, interval: float = INTERVAL_S) -> Outcome:
    """Sample a running process (and its children) for ``seconds``; it is never touched."""
    if pid <= 0 or not alive(pid):
        raise UsageError(f"no such process: {pid}", hint="give the pid of a running job "
                         "(pgrep -f train.py)")
    sampler, began = Sampler(gpus, interval), time.time()
    try:
        while time.time() - began < seconds and alive(pid):
            sampler.tick(pid)
            time.sleep(interval)
    finally:
        sampler.close()
    return Outcome(recording=sampler.recording(time.time() - began, (), _mig(sampler)),
                   exit_code=None, stopped=False)

