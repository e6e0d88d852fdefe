"""``envbuild lock`` and ``envbuild render docker|script|cloud-init``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from envbuild.commands.options import (
    Command,
    Out,
    Parser,
    add_context_options,
    add_output_dir,
    add_render_options,
    add_selectors,
    load_matrix,
    progress,
    reject_image_options,
    render_options,
    resolve_lock,
    warn,
    warn_all,
    written_json,
)
from envbuild.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

    from envbuild.fs import FileData
    from envbuild.render.hostsetup import HostSetup
    from envbuild.render.lock import Lock

# A host renderer (render script, render cloud-init): the arguments, a lock, the lock text it
# ships and the host setup in, files out.
Renderer = Callable[[argparse.Namespace, "Lock", "str | None", "HostSetup"], dict[str, bytes]]


def add_commands(commands: Any) -> None:
    """``envbuild lock`` and ``envbuild render docker|script|cloud-init``."""

    r = commands.add_parser("render", help="write a Dockerfile, host script or cloud-init user-data "
                                           "(with its lock and smoke test)")
    sub = r.add_subparsers(dest="render_target", metavar="TARGET", required=True,
                           parser_class=Parser)
    d = sub.add_parser("docker", help="a Docker build context: Dockerfile, lock, smoke test")
    add_selectors(d)
    add_render_options(d)
    add_context_options(d)
    add_output_dir(d)
    d.set_defaults(run=cmd_render_docker)
    for name, text, renderer in (
            ("script", "a host install script: install.sh, lock, smoke test", render_script),
            ("cloud-init", "cloud-init user-data running the host install script (at most 16 KB "
                           "for any stack: EC2's limit)", render_user_data)):
        h = sub.add_parser(name, help=text)
        add_selectors(h)
        add_render_options(h, host=True)
        h.add_argument("--lock", metavar="FILE", help="render from this lock instead of resolving")
        h.add_argument("--target", metavar="NAME", help="the lock's target to render (when it has several)")
        h.add_argument("--nvswitch", action="store_true",
                       help="an NVSwitch (HGX) system: install the fabric manager even if not detected")
        h.add_argument("--container-runtime", choices=("docker", "containerd", "podman", "none"),
                       default="docker", help="configure the NVIDIA Container Toolkit for this runtime "
                                              "(default docker; none: no toolkit)")
        if name == "cloud-init":
            g = h.add_argument_group("first boot")
            g.add_argument("--smoke-url", metavar="URL",
                           help="https URL of the full smoke test, run after install.sh instead of "
                                "the compact check (publish the smoke.py 'render script' writes)")
            g.add_argument("--smoke-sha256", metavar="HEX",
                           help="sha256 the file at --smoke-url must have, checked before it runs "
                                "(default: this envbuild's smoke.py)")
        add_output_dir(h)
        h.set_defaults(run=render_host(renderer))


def warn_duplicate_cuda(lock: Lock) -> None:
    """The same CUDA libraries in the base image and the wheels: worth a line, not a failure."""
    from envbuild.render.lock import duplicate_cuda

    warn_all(duplicate_cuda(lock))


def render_context(args: argparse.Namespace, env: Mapping[str, str], *,
                   buildkit: bool = False, base_os: str | None = None,
                   offline_steps: bool = False) -> tuple[Lock, dict[str, FileData]]:
    """The lock (read or resolved) and the build context's files, for render docker and build;
    ``buildkit``: in BuildKit syntax (build --builder buildx|buildah); ``base_os``: what the
    build read from a --base-image (its labels name it)."""
    from dataclasses import replace
    from pathlib import Path

    from envbuild.data.peaks import peaks_json
    from envbuild.render.docker import render_docker
    from envbuild.render.lockset import read_lockset

    matrix = load_matrix(args, env)
    options = replace(render_options(args, env), buildkit=buildkit, base_os=base_os,
                      offline_steps=offline_steps)
    if not args.lock:
        if args.target:
            raise UsageError("--target selects a target of --lock FILE")
        lock = resolve_lock(args, env, matrix)
        return lock, render_docker(lock, options, peaks=peaks_json(matrix))
    reject_image_options(args, kind="image")
    lockset = read_lockset(Path(args.lock))
    name, lock = lockset.select(args.target)
    if lock.base_offline and not buildkit:  # said once: build renders twice for BuildKit builders
        warn(unpinned_base(name, lock.base_image))
    # A closure's image carries a lock set of its own target; a stack-only lock stays as it was.
    carried = lockset.only(name).to_json() if lock.pylock is not None else None
    # Its local wheels come only from the lock's directory (the project's) or --wheelhouse.
    # Its extensions' sources too: their directories are relative to the lock (the project's).
    options = replace(options, wheel_roots=(Path(args.lock).absolute().parent,),
                      extension_root=Path(args.lock).absolute().parent,
                      check_recorded=not getattr(args, "accept_rebuilt", False))
    if not buildkit:  # said once: build renders twice for BuildKit builders
        from envbuild.commands.built import describe

        for line in describe(lock, Path(args.lock).absolute().parent):
            progress(line)
    return lock, render_docker(lock, options, peaks=peaks_json(matrix), lockset_json=carried)


def unpinned_base(target: str, image: str) -> str:
    """The warning for a lock whose base image is a tag (``lock --no-registry`` or ``--offline``)."""
    return (f"target {target}: the base image {image} is unpinned (a tag, locked without asking a "
            "registry): a registry may move it; run 'envbuild lock' where the registry answers")


def cmd_render_docker(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    lock, files = render_context(args, env)
    warn_duplicate_cuda(lock)
    return write_files(args, files, out)


def write_files(args: argparse.Namespace, files: Mapping[str, FileData], out: Out) -> int:
    """-o DIR (--force) gets ``files``, all of them or none."""
    from pathlib import Path

    from envbuild.render.output import write_output

    write_output(files, Path(args.output), force=args.force)
    if getattr(args, "json", False):
        out(written_json("envbuild.render/1", Path(args.output), target=args.render_target))
    else:
        out(f"wrote {args.output}/ ({', '.join(files)})")
    return 0


def render_script(args: argparse.Namespace, lock: Lock, carried: str | None,
                  host: HostSetup) -> dict[str, bytes]:
    from envbuild.render.script import render_script as render

    return render(lock, carried, host)


def render_user_data(args: argparse.Namespace, lock: Lock, carried: str | None,
                     host: HostSetup) -> dict[str, bytes]:
    """The user-data; over EC2's limit (a closure's requirements) it is still written, with a
    warning naming its size: other clouds take more."""
    from envbuild.render.cloudinit import USER_DATA_LIMIT, render_cloud_init, smoke_source

    files = render_cloud_init(lock, carried, smoke_source(args.smoke_url, args.smoke_sha256), host)
    size = len(files["user-data"])
    if size > USER_DATA_LIMIT:
        warn(f"user-data is {size} bytes, over the {USER_DATA_LIMIT} bytes EC2 accepts; "
             "clouds with a larger limit take it as it is")
    return files


def render_host(renderer: Renderer) -> Command:
    """The command for one host renderer: the lock read (or resolved), rendered, written."""
    def run(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
        lock, carried = read_or_resolve_lock(args, env)
        return write_files(args, renderer(args, lock, carried, host_setup(args, env, lock)), out)
    return run


def host_setup(args: argparse.Namespace, env: Mapping[str, str], lock: Lock) -> HostSetup:
    """The driver branch and flavour for the GPUs and driver the selectors name (--driver,
    --gpu, --arch, --host), and the container runtime (envbuild.render.hostsetup)."""
    from envbuild.render.hostsetup import host_setup as choose
    from envbuild.resolver.selection import Selectors, build_request

    matrix = load_matrix(args, env)
    request = build_request(Selectors.of(args), matrix, env)
    return choose(lock.stack.min_driver, matrix.rows("driver_branches"), matrix.rows("container_toolkit"),
                  request.gpus, request.driver.branch if request.driver else None,
                  nvswitch=args.nvswitch, runtime=args.container_runtime,
                  forward=lock.stack.compat == "forward", platform=lock.stack.platform)


def reject_host_options(args: argparse.Namespace) -> None:
    """--base-image and --user shape an image; a host install cannot honour them (README
    "Host install"), so they are refused rather than ignored. Then --user takes the lock's
    default, which no host install reads."""
    for option, given in (("--base-image", args.base_image is not None), ("--user", args.user is not None)):
        if given:
            raise UsageError(f"{option} applies to images; render {args.render_target} installs on a "
                             "host, which has no base image and keeps its own accounts",
                             hint="leave it out (the venv in /opt/envbuild is root's and every account "
                                  "can run it), or use render docker / build")
    args.user = "envbuild"


def warn_image_only(lock: Lock) -> None:
    """A lock made for an image may name a base image or user of its own: the host ignores both."""
    if lock.base_image.split("@", 1)[0] != lock.stack.base_image:  # the stack's own, pinned: no news
        warn(f"the lock's base image {lock.base_image} applies to images only; the host install ignores it")
    if lock.user != "envbuild":
        warn(f"the lock's user {lock.user} applies to images only; the host install creates no account")


def read_or_resolve_lock(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Lock, str | None]:
    """The lock, and the lock file text a locked closure ships (its own target's lock set).
    Unlike render docker, the --lock rule is checked before any option is validated (after the
    options a host install refuses outright)."""
    from pathlib import Path

    from envbuild.render.lockset import read_lockset

    reject_host_options(args)
    if args.lock:
        reject_image_options(args, kind="install")
        lockset = read_lockset(Path(args.lock))
        name, lock = lockset.select(args.target)
        warn_image_only(lock)
        return lock, lockset.only(name).to_json() if lock.pylock is not None else None
    if args.target:
        raise UsageError("--target selects a target of --lock FILE")
    return resolve_lock(args, env, load_matrix(args, env)), None
