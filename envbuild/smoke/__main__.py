"""The smoke test's command line: ``python /opt/envbuild/smoke.py [--tier N] ...``.

The only module of the payload that parses arguments; ``envbuild smoke`` calls ``main``
in-process, the zipapp's entry calls it in an image or on a host.

The single file once dropped its own folder from ``sys.path`` before importing, because
a sibling named like a standard module (envbuild/selectors.py once was) shadowed it.
No guard is needed now: run as the zipapp, ``sys.path[0]`` is the archive, which holds
only ``__main__.py`` and the ``envbuild_smoke`` package, and every module of the package
is reached by its package name (relative imports), never as a top-level name.
"""

from __future__ import annotations

import argparse
import os
import sys

from .rules import MAX_TIER

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

    from .runner import Options

# The checks (.suite, and the ctypes, subprocess and threads they use), the report and json
# are imported once the arguments are read: `envbuild smoke --help` answers without them.


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename: complete or untouched."""
    import contextlib
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".smoke-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="envbuild smoke",
        description="Verify that torch really computes on the GPU, and report why GPUs idle.",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report only")
    parser.add_argument(
        "--tier",
        type=int,
        default=2,
        choices=range(MAX_TIER + 1),
        metavar="N",
        help="run tiers 0..N (0 env, 1 correctness, 2 speed, 3 multi-GPU, 4 health); default 2",
    )
    parser.add_argument("--lock", metavar="FILE", help="envbuild.lock to compare the installed stack with")
    parser.add_argument(
        "--target",
        metavar="NAME",
        help="the target of a lock with several (schema 2); an image's lock has one",
    )
    parser.add_argument(
        "--installed-only",
        action="store_true",
        help="with --lock: only compare every installed distribution with the lock's; "
        "one line per difference; exit 0 when equal, 1 when not, 2 when the lock is unusable",
    )
    parser.add_argument(
        "--cpu-ok",
        action="store_true",
        help="a CPU-only run is acceptable: GPU checks are reported as skip, never pass",
    )
    parser.add_argument(
        "--peaks",
        metavar="FILE",
        help="JSON GPU peak table (default: smoke_peaks.json beside this file)",
    )
    parser.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE (atomically)")
    parser.add_argument(
        "--expect-gpus",
        type=_positive,
        metavar="N",
        help="the node has N GPUs: fewer visible fails (a fleet target's gpus-per-node)",
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="limit for each heavy check")
    ns = parser.parse_args(argv)
    from .runner import Options

    return Options(
        json=ns.json,
        tier=ns.tier,
        lock=ns.lock,
        cpu_ok=ns.cpu_ok,
        peaks=ns.peaks,
        report=ns.report,
        timeout=ns.timeout,
        target=ns.target,
        installed_only=ns.installed_only,
        expect_gpus=ns.expect_gpus,
    )


def _positive(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 1024:
        raise argparse.ArgumentTypeError("expected a GPU count from 1 to 1024, got %r" % text)
    return int(text)


EXIT_DIFFERENT = 1  # --installed-only: the installed set differs from the lock
EXIT_UNUSABLE = 2  # --installed-only: no --lock, or a lock that cannot be read or compared


def installed_only(options: Options) -> int:
    """``--installed-only``: the installed set against a lock that pins the whole environment.

    Prints one line per extra, missing or different distribution (``name: lock X, installed
    Y``) and exits 1, or one line saying they match and exits 0; an unusable lock is one
    ``smoke: ...`` line on stderr and exit 2."""
    from .installed import compare_installed, pins_whole_environment
    from .lockfile import load_lock, validate_lock

    if not options.lock:
        sys.stderr.write("smoke: --installed-only needs --lock FILE\n")
        return EXIT_UNUSABLE
    try:
        lock = validate_lock(load_lock(options.lock), options.target)
    except (OSError, ValueError) as exc:
        sys.stderr.write("smoke: lock %s unreadable: %s\n" % (options.lock, exc))
        return EXIT_UNUSABLE
    if not pins_whole_environment(lock):
        sys.stderr.write("smoke: lock %s pins no whole environment (no 'pylock'): "
                         "nothing to compare the installed set with\n" % options.lock)
        return EXIT_UNUSABLE
    differences = compare_installed(lock)
    for line in differences:
        sys.stdout.write(line + "\n")
    if differences:
        sys.stderr.write("smoke: the installed set differs from %s in %d distribution(s)\n"
                         % (options.lock, len(differences)))
        return EXIT_DIFFERENT
    sys.stdout.write("installed set matches %s (%d distributions)\n"
                     % (options.lock, len(lock.get("packages") or {})))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, usage errors 2
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if options.installed_only:
        return installed_only(options)
    import json

    from .report import EXIT_INTERRUPTED, render_text
    from .suite import run_smoke

    try:
        report = run_smoke(options)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    text = json.dumps(report, indent=2, sort_keys=False, default=str)
    if options.report:
        write_atomic(options.report, text + "\n")
    if options.json:
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    sys.stdout.flush()
    return int(report["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
