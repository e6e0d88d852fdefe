"""One error hierarchy for envbuild.

Every error carries its exit code and a hint. Only ``cli.main`` turns them into
output (``envbuild: error[<name>]: <what> — <fix>``) and an exit status; library
code raises and never prints.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import ClassVar


class EnvbuildError(Exception):
    """Base class: ``name`` and ``exit_code`` are fixed per subclass."""

    name: ClassVar[str] = "internal"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, hint: str = "", details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: tuple[str, ...] = tuple(details)

    def with_details(self, details: Sequence[str]) -> EnvbuildError:
        """Attach the full list behind a summarised message (shown with --explain/--debug)."""
        self.details = tuple(details)
        return self

    def one_line(self) -> str:
        text = f"envbuild: error[{self.name}]: {self.message}"
        if self.hint:
            text += f" — {self.hint}"
        # One line, whatever the message carried in (user input may hold newlines), and
        # no credentials, whatever URL it names.
        from envbuild.redact import redact

        return redact(" ".join(text.split()))


class UsageError(EnvbuildError):
    """Invalid input or usage; nothing was written."""

    name = "usage"
    exit_code = 2


class NoCompatibleStack(EnvbuildError):
    """The constraints admit no stack. Carries data, the CLI tells the story."""

    name = "no-compatible-stack"
    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        conflicts: Sequence[str] = (),
        fixes: Sequence[str] = (),
        hint: str = "",
    ) -> None:
        super().__init__(message, hint=hint)
        self.conflicts = tuple(conflicts)
        self.fixes = tuple(fixes)


class DataError(EnvbuildError):
    """Compatibility data (local or upstream) is missing, corrupt or refused."""

    name = "data"
    exit_code = 4


class DockerUnavailable(EnvbuildError):
    name = "docker"
    exit_code = 5


class SchedulerUnavailable(EnvbuildError):
    """The fleet's engine (sbatch, squeue, kubectl) is missing or does not answer: exit 5, as
    an unreachable Docker daemon is."""

    name = "scheduler"
    exit_code = 5


class BuildFailed(EnvbuildError):
    name = "build"
    exit_code = 6


class SmokeFailed(EnvbuildError):
    name = "smoke"
    exit_code = 7


class GpuRuntimeMissing(EnvbuildError):
    name = "gpu-runtime"
    exit_code = 8


class PreflightFailed(EnvbuildError):
    name = "preflight"
    exit_code = 9


class RebootRequired(EnvbuildError):
    name = "reboot-required"
    exit_code = 10


EXIT_INTERRUPTED = 130


class StaleLock(EnvbuildError):
    """``lock --check``: the lock no longer matches the project file or the matrices."""

    name = "stale-lock"
    exit_code = 11


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, as Ctrl-C raises KeyboardInterrupt:
    every ``except KeyboardInterrupt`` / ``finally`` cleanup (temporary directories, build
    containers) runs for it too. Ends the command with the shell's code, 128 + signal."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name
        self.exit_code = 128 + signum
EXIT_OUTPUT = 1  # standard output or a file could not be written (disk full, read-only, closed terminal)
# What a write fails with when the fault is the place written to, not envbuild: reported as
# ``error[output]`` (exit 1) in one line rather than as an internal error.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.EFBIG, errno.EIO})
EXIT_PIPE_CLOSED = 141  # the reader closed the pipe: what a shell reports for SIGPIPE


def output_failed(exc: OSError) -> int:
    """Report a failure to write standard output; the exit code to end with.

    A reader that stops early (``envbuild resolve --json | head``) is not an error: exit
    quietly, as a tool killed by SIGPIPE would, with standard output pointed at /dev/null
    so that the interpreter's last flush has nowhere left to fail. Anything else (a full
    disk, a vanished terminal) is one line on stderr."""
    if isinstance(exc, BrokenPipeError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass  # stdout has no descriptor (a test's capture): nothing will flush it
        return EXIT_PIPE_CLOSED
    reason = exc.strerror or type(exc).__name__
    print(f"envbuild: error[output]: cannot write standard output: {reason} — "
          "redirect it to a writable file or free space", file=sys.stderr)
    return EXIT_OUTPUT
