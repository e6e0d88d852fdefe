"""``envbuild diagnose [--seconds N] [--json] [--report FILE] [--html FILE] -- COMMAND …``
or ``--pid PID``: why a job leaves its GPU idle (docs/diagnose.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from envbuild.commands.options import Out
from envbuild.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "diagnose", help="run (or watch) a training job and say why its GPU idles",
        description="Run COMMAND (or sample --pid PID) with GPU, /proc and in-process samples, "
                    "then give the verdict: input-bound, overhead-bound, transfer-bound, "
                    "sync-bound, gpu-bound or not-on-gpu, with the numbers and the fixes.",
        epilog="The job's exit code is passed through (128+N when a signal ended it); 0 when "
               "diagnose stopped it after --seconds. See docs/diagnose.md.")
    p.add_argument("--seconds", type=_seconds, default=60.0, metavar="N",
                   help="sample at most N seconds, then stop the job (default 60)")
    p.add_argument("--pid", type=int, metavar="PID", help="sample a running process instead")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument("--html", metavar="FILE", help="also write the HTML timeline to FILE")
    p.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND …")
    p.set_defaults(run=cmd_diagnose)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r} (0 < N <= 86400)")
    return value


def cmd_diagnose(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from envbuild.diagnose import report as reports
    from envbuild.diagnose import session

    job = list(args.job[1:] if args.job[:1] == ["--"] else args.job)
    if bool(job) == (args.pid is not None):
        raise UsageError("give a command after '--' or --pid PID (one of them)",
                         hint="envbuild diagnose -- python train.py")
    for flag, path in (("--report", args.report), ("--html", args.html)):
        check_output_file(path, flag)  # before the job runs, not after it ran for an hour
    gpus = session.open_gpus(env, session.load_nvml())
    try:
        if args.pid is not None:
            outcome = session.watch_pid(args.pid, seconds=args.seconds, gpus=gpus)
        else:
            # with --json, standard output carries the report alone: the job's goes to stderr
            outcome = session.run_command(job, seconds=args.seconds, env=env, gpus=gpus,
                                          stdout=sys.stderr.fileno() if args.json else None)
    finally:
        gpus.close()
    found = reports.diagnose(outcome.recording, command=job or None, pid=args.pid,
                             exit_code=outcome.exit_code, stopped=outcome.stopped)
    document = reports.json_text(found)  # strict JSON: never NaN or Infinity
    _write(args.report, document)
    _write(args.html, reports.page(found))
    out(document.rstrip("\n") if args.json else reports.text(found))
    return outcome.exit_code or 0


def check_output_file(path: str | None, flag: str) -> None:
    """An output file a command writes after its work: its directory must exist and it must not
    be a directory, checked before the work starts."""
    from pathlib import Path

    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a directory", hint="name a file to write")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist",
                         hint="create it first, or name a file in a directory that exists")


def _write(path: str | None, text: str) -> None:
    from pathlib import Path
    if path:
        from envbuild.fs import write_file

        write_file(Path(path), text.encode("utf-8"))
