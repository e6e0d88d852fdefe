"""``envbuild init``: write a commented project file from flags or from this host."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from envbuild.commands.options import Out, add_selectors, load_matrix, warn
from envbuild.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "init", help="write a commented envbuild.toml project file",
        description="Write a commented project file (envbuild.toml) for `envbuild lock`, from "
                    "the stack selectors or from this host (--host).")
    add_selectors(p)
    g = p.add_argument_group("project")
    g.add_argument("--target", default="default", metavar="NAME",
                   help="name of the target the selectors describe (default: default)")
    g.add_argument("--requirements", action="append", default=[], metavar="FILE",
                   help="a requirements file of the project (repeatable)")
    g.add_argument("-o", "--output", default="envbuild.toml", metavar="FILE",
                   help="file to write (default: ./envbuild.toml)")
    g.add_argument("--force", action="store_true", help="replace an existing file")
    g.add_argument("--print", action="store_true", dest="print_block",
                   help="print a [tool.envbuild] block for pyproject.toml instead of writing")
    g.add_argument("--json", action="store_true",
                   help="print what was written (or the --print block) as JSON (envbuild.init/1)")
    p.set_defaults(run=cmd_init)


def _checked(flag: str, key: str, value: str) -> str:
    from envbuild.project.config import check_value

    try:
        return check_value(key, value)
    except UsageError as exc:
        raise UsageError(f"{flag}: {exc.message}", hint=exc.hint) from None


def _gpu_names(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[list[str], list[str],
                                                                         str | None, str | None,
                                                                         str | None]:
    """(GPU names, archs, driver, a note, platform) from the flags (as the user wrote them) and
    from --host (as the data spells them; a GPU the data does not know, by its architecture;
    the platform when the host is linux/arm64, which its GPUs may not imply)."""
    from envbuild.data.gpus import find_gpu

    gpus = [_checked("--gpu", "gpus", name) for name in args.gpu]
    archs = [_checked("--arch", "archs", arch) for arch in args.arch]
    driver = _checked("--driver", "driver", args.driver) if args.driver is not None else None
    platform = _checked("--platform", "platform", args.platform) if args.platform is not None else None
    note = None
    if gpus or args.host:
        rows = load_matrix(args, env).rows("gpus")
        for name in gpus:  # a typo fails now, with the names it may have meant
            find_gpu(rows, name)
    if args.host:
        from envbuild.host import probe

        facts = probe.probe_host(env)
        if driver is None and facts.driver_version:
            driver = facts.driver_version
        if platform is None and facts.platform == "linux/arm64":
            platform = facts.platform
        for gpu in facts.gpus:
            try:
                gpus.append(find_gpu(rows, gpu.name).label)
            except UsageError:
                if gpu.compute_capability is None:
                    raise UsageError(f"GPU {gpu.name!r} is not in gpus.yaml and its compute "
                                     "capability is unknown", hint="pass --arch sm_XY") from None
                archs.append("sm_" + gpu.compute_capability.replace(".", ""))
        if not facts.gpus:
            note = "No NVIDIA GPU was found on the host that ran `envbuild init`: a CPU-only target."
    return list(dict.fromkeys(gpus)), list(dict.fromkeys(archs)), driver, note, platform


def cmd_init(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json
    from pathlib import Path

    from envbuild.confine import read_confined
    from envbuild.project.config import PYPROJECT, project_from_text, shown_path
    from envbuild.project.init import InitValues, render_project
    from envbuild.project.toml import parse

    cwd = Path(os.getcwd())
    output = Path(os.path.abspath(cwd / PYPROJECT if args.print_block else args.output))
    if not args.print_block and os.path.lexists(output) and not args.force:
        raise UsageError(f"{args.output} already exists", hint="pass --force to replace it")
    if not args.print_block and not output.parent.is_dir():
        raise UsageError(f"cannot write {args.output}: {output.parent} is not a directory",
                         hint="create it first, or name another -o/--output")
    _checked("--target", "name", args.target)
    gpus, archs, driver, note, platform = _gpu_names(args, env)
    variant = args.variant
    if note is not None and variant is None:
        variant = "cpu"
    stack = {key: _checked(f"--{key}", key, getattr(args, key)) if getattr(args, key) else None
             for key in ("torch", "python", "cuda", "cudnn", "ubuntu")}
    requirements = []
    for name in args.requirements:
        path = cwd / name
        if not path.is_file():
            raise UsageError(f"--requirements {name}: no such file", hint="check the path")
        requirements.append(os.path.relpath(path, output.parent).replace(os.sep, "/"))
    pyproject = None
    beside = output.parent / PYPROJECT
    if not args.print_block and beside.is_file():
        data = read_confined(beside, [output.parent], f"{PYPROJECT} beside the output")
        document = parse(data.decode("utf-8", "replace"), shown_path(beside, cwd))
        pyproject = PYPROJECT if isinstance(document.get("project"), dict) else None
    values = InitValues(
        target=args.target, driver=driver, gpus=tuple(gpus), archs=tuple(archs),
        datacenter=args.datacenter, platform=platform,
        variant=_checked("--variant", "variant", variant) if variant else None,
        flavor=args.flavor or "runtime",
        torch_index_url=(_checked("--index-url", "torch-index-url", args.index_url)
                         if args.index_url else None),
        requirements=tuple(requirements), pyproject=pyproject, note=note, **stack)
    text = render_project(values, pyproject_block=args.print_block)
    # What is written must load: every requirements file is read and checked now.
    project_from_text(text, output, shown=shown_path(output, cwd), cwd=cwd)
    if note is not None:
        warn(f"no NVIDIA GPU on this host: the target is CPU-only (variant {variant})")
    if args.print_block:
        out(json.dumps({"schema": "envbuild.init/1", "output": None, "target": args.target,
                        "text": text}, indent=2) if args.json else text.rstrip("\n"))
        return 0
    from envbuild.fs import UnwritableDirectory, write_file

    try:
        write_file(output, text.encode("utf-8"))
    except UnwritableDirectory as exc:  # a bad output path, as lock and render report it
        raise UsageError(f"cannot write to {exc.filename}: {exc.strerror}",
                         hint="name another -o/--output") from None
    if args.json:
        out(json.dumps({"schema": "envbuild.init/1", "output": args.output, "target": args.target,
                        "text": text}, indent=2))
        return 0
    what = ", ".join(p for p in (f"driver {driver}" if driver else "",
                                 "GPUs " + ", ".join(gpus) if gpus else "",
                                 "archs " + ", ".join(archs) if archs else "") if p)
    out(f"wrote {args.output}: target {args.target}" + (f" ({what})" if what else ""))
    return 0
