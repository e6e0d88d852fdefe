"""The uv processes of one lock (envbuild/pylock/uv.py): every run registered while it runs, so
that a lock failing in any thread, or interrupted (Ctrl-C, SIGTERM), kills them all at once and
starts none after; one run that another thread may stop alone; and one run itself, within the
lock's deadline, its log read as uv writes it where someone watches it."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from types import TracebackType

from envbuild.errors import DataError, UsageError

TYPE_CHECKING = False  # for the type checker only
if TYPE_CHECKING:
    from pathlib import Path

    from envbuild.pylock.spec import ClosureSpec


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


def run_uv(command: list[str], cwd: Path, env: dict[str, str], deadline: float, spec: ClosureSpec,
           started: Callable[[], None] | None = None, live: Live | None = None, stop: Stop | None = None,
           watch: Callable[[str], None] | None = None) -> str:
    """One uv run within the deadline, its stderr; ``started`` is called once uv is running.
    ``live``: the lock's runs, which kill this one where the lock fails elsewhere (then Cancelled);
    ``stop``: where another thread may stop this run alone (then Cancelled); ``watch``: called
    with each line of uv's stderr as uv writes it (on a thread of its own), so that work that
    follows from the log starts while uv still runs."""
    left = deadline - time.monotonic()
    if (live is not None and live.cancelled) or (stop is not None and stop.stopped):
        raise Cancelled
    if left <= 0:
        raise too_slow(spec)
    try:  # nothing reads uv's stdout: its answer is the file it writes, its log is stderr
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise UsageError(f"cannot run uv ({command[0]}): {exc.strerror or exc}",
                         hint="pip install uv") from exc
    lines: list[str] = []
    with process:
        reader = None
        try:
            if live is not None:
                live.add(process)
            if stop is not None:
                stop.running(process)
            if started is not None:
                started()
            if watch is None:
                _, stderr = process.communicate(timeout=left)
            else:
                # The log ends where uv does: its reader's end is waited for (Popen.wait with
                # a timeout polls, up to 50 ms late), then uv's exit, which follows at once.
                reader = _reading(process, lines, watch)
                reader.join(left)
                if reader.is_alive():
                    raise subprocess.TimeoutExpired(command, left)
                process.wait(timeout=max(deadline - time.monotonic(), 0.001))
                stderr = "".join(lines)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            if reader is None:
                process.communicate()
            raise too_slow(spec) from exc
        except BaseException:  # Ctrl-C, SIGTERM: uv goes too, as subprocess.run would see to
            process.kill()
            raise
        finally:
            if live is not None:
                live.discard(process)
    if (live is not None and live.cancelled) or (stop is not None and stop.stopped):
        raise Cancelled
    if process.returncode != 0:
        from envbuild.pylock.uvfailure import uv_failure

        raise uv_failure(stderr, spec)
    return stderr


def _reading(process: subprocess.Popen[str], lines: list[str],
             watch: Callable[[str], None]) -> threading.Thread:
    """A thread that reads uv's stderr into ``lines`` to its end, handing each line to ``watch``.
    The pipe is read to its end whatever ``watch`` does: a watcher that fails is not called
    again (it only gets ahead of work that follows the run, which is then done after it) and
    uv never blocks on a full pipe."""
    def read() -> None:
        watching = True
        try:
            for line in process.stderr or ():
                lines.append(line)
                if watching:
                    try:
                        watch(line)
                    except Exception:  # (see above: the run goes on, unwatched)
                        watching = False
        except (OSError, ValueError):  # the pipe closed under it: the run was killed
            pass

    thread = threading.Thread(target=read, name="envbuild-uv-log", daemon=True)
    thread.start()
    return thread


class TooSlow(DataError):
    """uv ran past the lock's deadline."""


def too_slow(spec: ClosureSpec) -> DataError:
    return TooSlow(f"uv did not finish resolving the closure within {spec.timeout:g} s",
                   hint="the index may be slow or unreachable; retry, or raise the timeout")
