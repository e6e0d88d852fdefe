"""``envbuild ci github|bake``: the resolver's top stacks as CI files in one directory."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from envbuild.commands.options import (
    Command,
    Out,
    Parser,
    add_selectors,
    load_matrix,
    positive_int,
    resolve_stacks,
    written_json,
)

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

    from envbuild.data.matrix import Matrix
    from envbuild.fs import FileData
    from envbuild.render.ci import CiOptions, CiStack

Render = Callable[[Sequence["CiStack"], "CiOptions"], dict[str, "FileData"]]


def add_commands(commands: Any) -> None:
    """``envbuild ci github`` and ``envbuild ci bake``; each renderer is imported when its
    command runs (``ci --help`` never pays for the Dockerfile renderer it reaches)."""
    p = commands.add_parser("ci", help="CI for the top stacks: GitHub Actions or docker-bake.json")
    sub = p.add_subparsers(dest="ci_target", metavar="TARGET", required=True,
                           parser_class=Parser)
    g = sub.add_parser("github", help="a workflow: matrix build, push, verify on a GPU runner")
    _add_common(g)
    g.add_argument("--gpu-runner-label", action="append", default=[], metavar="LABEL",
                   help="label of the self-hosted GPU runner (repeatable; default: gpu)")
    g.add_argument("--branch", default="main", help="push images from this branch (default main)")
    g.add_argument("--cache", choices=("registry", "gha"), default="registry",
                   help="build cache: beside the image in the registry (default) or GitHub's "
                        "Actions cache (10 GB per repository)")
    g.add_argument("--sign", action="store_true",
                   help="sign each promoted digest with cosign, keyless (OIDC id-token)")
    g.set_defaults(run=_command("github"))
    b = sub.add_parser("bake", help="a docker-bake.json: a target per stack, groups per CUDA major")
    _add_common(b)
    b.set_defaults(run=_command("bake"))


def _add_common(p: argparse.ArgumentParser) -> None:
    add_selectors(p)
    g = p.add_argument_group("ci")
    g.add_argument("--top", type=positive_int, default=4, metavar="N",
                   help="the N best stacks (default 4)")
    g.add_argument("--registry", required=True, metavar="REF",
                   help="image repository, no tag (e.g. ghcr.io/acme/envbuild)")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="image label added to every stack (repeatable)")
    g.add_argument("--lock", metavar="FILE",
                   help="one image per target of this lock (its pylock on its base digest), verified on "
                        "the target's runs-on labels, after a 'lock --check' job; no selectors then")
    g.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    g.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    g.add_argument("--json", action="store_true",
                   help="print what was written and which stacks as JSON (envbuild.ci/1)")


def _plan(args: argparse.Namespace, env: Mapping[str, str],
          matrix: Matrix) -> tuple[list[CiStack], list[str]]:
    from envbuild.render.ci import select_stacks

    request, resolution = resolve_stacks(args, env, matrix)
    return select_stacks(resolution.stacks, matrix, top=args.top, index_url=args.index_url,
                         package_index=request.package_index)


def _from_lock(args: argparse.Namespace, matrix: Matrix) -> list[CiStack]:
    from pathlib import Path

    from envbuild.errors import UsageError
    from envbuild.render.ci import lock_stacks
    from envbuild.render.lockset import read_lockset

    if args.driver or args.host or args.gpu or args.arch or args.torch or args.cuda or args.python \
            or args.index_url:
        raise UsageError("stack selectors cannot be combined with --lock",
                         hint="the lock already pins each target's stack")
    return lock_stacks(read_lockset(Path(args.lock)), matrix)


def _renderer(target: str) -> Render:
    if target == "github":
        from envbuild.render.github import render_github

        return render_github
    from envbuild.render.bake import render_bake

    return render_bake


def _command(target: str) -> Command:
    def run(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
        from dataclasses import replace
        from pathlib import Path

        from envbuild.render.ci import parse_ci_options, pinned_actions
        from envbuild.render.output import write_output

        render = _renderer(target)

        options = parse_ci_options(registry=args.registry,
                                   runner_labels=getattr(args, "gpu_runner_label", ()),
                                   labels=args.label, branch=getattr(args, "branch", "main"),
                                   cache=getattr(args, "cache", "registry"),
                                   sign=getattr(args, "sign", False))
        matrix = load_matrix(args, env)
        options = replace(options, actions=pinned_actions(matrix))
        skipped: list[str] = []
        if args.lock:
            stacks = _from_lock(args, matrix)
            options = replace(options, lock=Path(args.lock).name)
        else:
            stacks, skipped = _plan(args, env, matrix)
        write_output(render(stacks, options), Path(args.output), force=args.force)
        if args.json:
            out(written_json("envbuild.ci/1", Path(args.output), stacks=[s.id for s in stacks],
                             skipped=list(skipped)))
            return 0
        count = f"{len(stacks)} stack{'s' if len(stacks) != 1 else ''}"
        out(f"wrote {args.output}/ with {count}: {', '.join(s.id for s in stacks)}")
        if skipped:
            out(f"note: skipped {len(skipped)} stacks whose Python is not their Ubuntu's python3 "
                f"({', '.join(skipped)})")
        return 0
    return run
