"""The uv processes of one lock (envbuild/pylock/uv.py): every run registered while it runs, so
that a lock failing in any thread, or interrupted (Ctrl-C, SIGTERM), kills them all at once and
starts none after; and one run that another thread may stop alone."""

from __future__ import annotations

import subprocess
import threading
from types import TracebackType


class Cancelled(Exception):
    """A uv run ended because another run or the lock itself failed (never shown: that
    failure is what the lock reports)."""


class Live:
    """The uv processes of one lock that are running now, from every thread: where the lock
    fails or is interrupted (Ctrl-C, SIGTERM, an error in any thread), leaving the ``with``
    block kills them all, and a run not started yet never starts."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._processes: set[subprocess.Popen[str]] = set()
        self.closure_started = threading.Event()  # the closure's uv run is running
        self.closure_ended = threading.Event()  # it has ended, or the lock has failed
        self.cancelled = False

    def add(self, process: subprocess.Popen[str]) -> None:
        with self._guard:
            if not self.cancelled:
                self._processes.add(process)
                return
        process.kill()
        raise Cancelled

    def discard(self, process: subprocess.Popen[str]) -> None:
        with self._guard:
            self._processes.discard(process)

    def after_closure_started(self, delay: float) -> None:
        """Wait until the closure's run has run ``delay`` seconds or ended; Cancelled where
        the lock fails or is interrupted meanwhile."""
        while not self.closure_started.wait(0.05):
            if self.cancelled:
                raise Cancelled
        self.closure_ended.wait(delay)
        if self.cancelled:
            raise Cancelled

    def cancel(self) -> None:
        with self._guard:
            self.cancelled = True
            self.closure_ended.set()
            for process in self._processes:
                process.kill()

    def __enter__(self) -> Live:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is not None:
            self.cancel()


class Stop:
    """One run that another thread may stop: before it starts (then it never does) or while it
    runs (killed; its own thread then sees a failed run, which nobody reads)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self.stopped = False

    def running(self, process: subprocess.Popen[str]) -> None:
        with self._guard:
            if self.stopped:
                process.kill()
            else:
                self._process = process

    def stop(self) -> None:
        with self._guard:
            self.stopped = True
            if self._process is not None:
                self._process.kill()
