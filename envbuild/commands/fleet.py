"""``envbuild fleet render|verify --engine slurm|kubernetes``: the smoke test on every node of
every node type, through the engine the fleet already runs."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from envbuild.commands.options import Out, Parser, positive_int
from envbuild.errors import SmokeFailed

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

    from envbuild.fleet.plan import FleetTarget, RunOptions

Targets = tuple["FleetTarget", ...]

DEFAULT_DEADLINE = 1800
DEFAULT_DIR = "envbuild-fleet"


def add_commands(commands: Any) -> None:
    p = commands.add_parser("fleet", help="verify every node of every node type (Slurm, Kubernetes)")
    sub = p.add_subparsers(dest="fleet_action", metavar="ACTION", required=True, parser_class=Parser)
    r = sub.add_parser("render", help="per target an sbatch script or a Kubernetes Indexed Job")
    _add_common(r)
    r.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    r.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    r.add_argument("--json", action="store_true",
                   help="print what was written as JSON (envbuild.fleet-render/1)")
    r.set_defaults(run=cmd_render)
    v = sub.add_parser("verify", help="submit, wait, collect every node's report; exit 0 only when all pass")
    _add_common(v)
    v.add_argument("--dir", default=DEFAULT_DIR, metavar="DIR",
                   help="shared directory every node sees (Slurm): scripts and reports "
                        f"(default ./{DEFAULT_DIR}, replaced when envbuild wrote it)")
    v.add_argument("--json", action="store_true", help="print the fleet report as JSON (envbuild.fleet/1)")
    v.set_defaults(run=cmd_verify)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, choices=("slurm", "kubernetes"), help="the fleet's scheduler")
    p.add_argument("--lock", default="envbuild.lock", metavar="FILE", help="the lock (default envbuild.lock)")
    p.add_argument("--image", action="append", default=[], metavar="TARGET=REF@DIGEST",
                   help="a target's image by digest (repeatable)")
    p.add_argument("--images", metavar="FILE", help="the images of a build report (build --push --json)")
    p.add_argument("--cpu-ok", action="store_true",
                   help="hand --cpu-ok to each node's smoke test; the GPU count is then not checked")
    p.add_argument("--tier", type=int, choices=range(5), metavar="N",
                   help="the smoke test's tiers 0..N on each node (default: its own, 2)")
    p.add_argument("--deadline", type=positive_int, default=DEFAULT_DEADLINE, metavar="S",
                   help=f"seconds for the whole run (default {DEFAULT_DEADLINE})")


def _plan(args: argparse.Namespace) -> tuple[Targets, bytes]:
    from pathlib import Path

    from envbuild.confine import read_regular
    from envbuild.fleet.plan import parse_image_flags, plan_targets, read_build_report
    from envbuild.render.lockset import read_lockset

    path = Path(args.lock)
    lockset = read_lockset(path)
    images = read_build_report(Path(args.images)) if args.images else {}
    images.update(parse_image_flags(args.image))
    placements = {name: lock.fleet for name, lock in lockset.targets.items()}
    platforms = {name: lock.stack.platform for name, lock in lockset.targets.items()}
    targets = plan_targets(placements, args.engine, images, cpu_ok=args.cpu_ok, platforms=platforms)
    return targets, read_regular(path, f"lock {path}")  # as read_lockset read it: never a FIFO


def _files(args: argparse.Namespace) -> tuple[Targets, dict[str, bytes], RunOptions]:
    from envbuild.fleet.plan import RunOptions
    from envbuild.fleet.verify import render_fleet

    targets, lock_bytes = _plan(args)
    options = RunOptions(cpu_ok=args.cpu_ok, tier=args.tier, deadline=args.deadline)
    return targets, render_fleet(args.engine, targets, options, lock_bytes=lock_bytes), options


def cmd_render(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from pathlib import Path

    from envbuild.render.output import write_output

    targets, files, _ = _files(args)
    write_output(files, Path(args.output), force=args.force)
    if args.json:
        from envbuild.commands.options import written_json

        out(written_json("envbuild.fleet-render/1", Path(args.output), engine=args.engine,
                         targets=[{"name": t.name, "nodes": t.nodes} for t in targets]))
        return 0
    out(f"wrote {args.output}/ for {len(targets)} target{'s' if len(targets) != 1 else ''}: "
        + ", ".join(f"{t.name} ({t.nodes} nodes)" for t in targets))
    return 0


def cmd_verify(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json
    from pathlib import Path

    from envbuild.fleet.report import render_html, render_table
    from envbuild.fleet.verify import engine_for, run_fleet
    from envbuild.fs import write_file
    from envbuild.render.output import write_output

    targets, files, options = _files(args)
    directory = Path(args.dir).absolute()
    write_output(files, directory, force=True)
    report = run_fleet(engine_for(args.engine, env, directory, options), targets, deadline=args.deadline)
    data = report.to_json()
    write_file(directory / "fleet-report.json", (json.dumps(data, indent=2) + "\n").encode())
    write_file(directory / "fleet-report.html", render_html(report).encode())
    out(json.dumps(data, indent=2) if args.json else render_table(report))
    if not report.passed:
        why = "; ".join(t.why() for t in report.targets if t.status == "fail")
        raise SmokeFailed(f"fleet verify failed: {why}",
                          hint=f"see the table, and {directory}/fleet-report.html")
    return 0
