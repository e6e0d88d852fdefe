"""GPU samples from one long-running ``nvidia-smi --query-gpu=… -lms N`` instead of a new
nvidia-smi per sample: each start of nvidia-smi initialises NVML (tens of milliseconds of CPU
on a busy host), which the diagnosis would take from the job it watches.

The compute processes (``--query-compute-apps``) are a query of their own that a loop cannot
delimit (it prints nothing when none runs), so they are asked once per ``APPS_EVERY_S`` and
attached to the samples in between. When the stream ends without a line (an nvidia-smi that
refuses ``-lms``) or breaks off, a separate query is made each ``FALLBACK_S``, as before.
"""

from __future__ import annotations

import collections
import contextlib
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from envbuild.diagnose.gpu import SMI_APPS, GpuSample, Runner, parse_smi_csv, read_smi

APPS_EVERY_S = 2.0  # a job on the GPU for 2 s is listed at least once
LINES_KEPT = 100_000  # samples waiting to be collected (a sampler that stalls loses the oldest)
STOP_S = 2.0
FALLBACK_S = 1.0  # between separate queries once the stream has ended


def query(fields: Sequence[str]) -> list[str]:
    return [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


class SmiStream:
    """``exe`` looping over ``fields`` every ``period_ms``, read by a thread of its own."""

    def __init__(self, exe: str, fields: Sequence[str], period_ms: int, run: Runner,
                 env: Mapping[str, str]) -> None:
        self.exe, self.run = exe, run
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=LINES_KEPT)
        self.apps, self.apps_t, self.fallback_t = "", -1e9, -1e9
        self.process = subprocess.Popen([exe, *query(fields), "-lms", str(period_ms)], env=dict(env),
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        errors="replace")
        self.pump = threading.Thread(target=self.collect, daemon=True)
        self.pump.start()

    def collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.time(), line))

    def read(self, t: float) -> list[GpuSample]:
        """Every sample that arrived since the last call, stamped with its arrival time."""
        if t - self.apps_t >= APPS_EVERY_S:
            self.apps_t = t
            self.apps = self.run(["nvidia-smi", f"--query-compute-apps={','.join(SMI_APPS)}",
                                  "--format=csv,noheader,nounits"]) or ""
        found: list[GpuSample] = []
        while self.lines:
            arrived, line = self.lines.popleft()
            found.extend(parse_smi_csv(line, arrived, self.apps))
        if not found and self.process.poll() is not None and t - self.fallback_t >= FALLBACK_S:
            self.fallback_t = t  # the stream ended (or never ran): one query per sample
            return read_smi(self.run, t) or []
        return found

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(Exception):
            self.pump.join(STOP_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


def period_ms(interval: float) -> int:
    return max(100, round(1000 * interval))

