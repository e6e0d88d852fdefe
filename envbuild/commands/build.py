"""``envbuild build``, ``envbuild verify`` and ``envbuild clean``: the Docker engine commands.

The engine modules return results and report progress and warnings through callbacks;
here they are printed, the reports written (through ``envbuild.fs``) and verdicts turned
into exit codes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.commands.options import (
    Out,
    add_context_options,
    add_render_options,
    add_selectors,
    warn,
)
from envbuild.errors import GpuRuntimeMissing, SmokeFailed, UsageError

if TYPE_CHECKING:
    from envbuild.engine.build import BuildEvent


def add_commands(commands: Any) -> None:
    b = commands.add_parser("build", help="render a stack and build its image")
    add_selectors(b)
    add_render_options(b)
    add_context_options(b)
    g = b.add_argument_group("build")
    g.add_argument("--tag", "-t", metavar="NAME[:TAG]",
                   help="image name (default envbuild/torch:<torch>-<variant>-py<python>-<flavor>)")
    g.add_argument("--network", choices=("host", "none", "default"), default="default",
                   help="network of the build's RUN steps")
    g.add_argument("--report", metavar="FILE", help="write the build report (JSON) to FILE")
    g.add_argument("--no-cache", action="store_true", help="build every step again, using no cached layer")
    g.add_argument("--verbose", "-v", action="store_true", help="show every build log line")
    b.set_defaults(run=cmd_build)

    v = commands.add_parser("verify", help="run an image's smoke test in a container")
    v.add_argument("image", help="image built by envbuild")
    v.add_argument("--gpus", default="all", metavar="all|N|none", help="GPUs to request")
    v.add_argument("--cpu-ok", action="store_true",
                   help="a CPU-only run passes (GPU checks skipped); runs without GPUs when "
                        "Docker has no GPU runtime")
    v.add_argument("--json", action="store_true", help="print the smoke test's JSON report")
    v.add_argument("--report", metavar="FILE", help="write the JSON report to FILE")
    v.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="deadline for the whole test (default 600)")
    v.add_argument("--memory", default="16g", help="container memory limit (default 16g)")
    v.add_argument("--shm-size", default="2g", help="/dev/shm for DataLoader workers (default 2g)")
    v.add_argument("--tier", type=int, choices=range(5), metavar="N", help="smoke test tiers 0..N")
    v.set_defaults(run=cmd_verify)

    c = commands.add_parser("clean", help="remove containers envbuild left behind")
    c.set_defaults(run=cmd_clean)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_build(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from envbuild.commands.render import render_context
    from envbuild.engine.build import SdkBuilder, build_image, check_tag, default_tag, short
    from envbuild.engine.clean import warn_leftovers
    from envbuild.engine.daemon import connect

    tag = check_tag(args.tag) if args.tag else None
    _check_report(args.report)
    lock, files = render_context(args, env)
    tag = tag or default_tag(lock)
    client = connect(env)
    warn_leftovers(client, warn)

    def progress(event: BuildEvent) -> None:
        if event.kind == "step":
            _err(f"[{event.step}/{event.steps}] {short(event.text, 100)}")
        elif event.kind == "download" or args.verbose:
            _err(f"    {event.text}")

    result = build_image(SdkBuilder(client=client, nocache=args.no_cache), files, tag=tag,
                         network=None if args.network == "default" else args.network,
                         progress=progress, on_interrupt=client.close)
    if args.report:
        _write_report(args.report, result.to_json(), sort_keys=True)
    out(f"built {result.tag} ({result.image_id[:19]}, {result.size / 1e9:.2f} GB, "
        f"{result.seconds:.0f} s, {result.steps} steps)")
    return 0


def _check_report(path: str | None) -> None:
    """--report FILE that could never be written is exit 2 before Docker is contacted."""
    from envbuild.fs import check_file_target

    if path:
        check_file_target(Path(path))


def _write_report(path: str, report: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    from envbuild.fs import UnwritableDirectory, write_file

    try:
        write_file(Path(path), (json.dumps(report, indent=2, sort_keys=sort_keys) + "\n").encode())
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {exc.filename}: {exc.strerror}") from None


def cmd_verify(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from envbuild.engine.clean import warn_leftovers
    from envbuild.engine.daemon import connect
    from envbuild.engine.verify import (
        GPU_RUNTIME_HINT,
        VerifyOptions,
        check_options,
        failures,
        verify,
    )

    options = VerifyOptions(gpus=args.gpus, cpu_ok=args.cpu_ok, timeout=args.timeout,
                            memory=args.memory, shm_size=args.shm_size, tier=args.tier)
    check_options(options)
    _check_report(args.report)
    client = connect(env, timeout=max(60.0, args.timeout + 30))
    warn_leftovers(client, warn)
    result = verify(client, args.image, options, warn)
    report = result.report or {}
    if args.report:
        _write_report(args.report, report)
    if args.json:
        out(json.dumps(report, indent=2))
    else:
        from envbuild.smoke.report import render_text

        out(render_text(report))
    if result.exit_code == 0:
        return 0
    problems = failures(report) or [f"smoke test exited {result.exit_code}"]
    error: SmokeFailed | GpuRuntimeMissing
    if result.exit_code == 8:
        error = GpuRuntimeMissing(f"smoke test: {problems[0]}", details=tuple(problems),
                                  hint="" if result.gpus_requested else GPU_RUNTIME_HINT)
    else:
        error = SmokeFailed(f"smoke test failed: {problems[0]}", details=tuple(problems))
    raise error


def cmd_clean(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from envbuild.engine.clean import clean
    from envbuild.engine.daemon import connect

    removed = clean(connect(env))
    out(f"removed {len(removed)} container(s)" + (f": {' '.join(removed)}" if removed else ""))
    return 0
