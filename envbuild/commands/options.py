"""What several commands share: the parser class, the selector and image options, the
matrix they read, and the turning of a Namespace into the values the library takes.

Only the commands layer imports this module; nothing here renders or builds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar

from envbuild.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from envbuild.data.matrix import Matrix
    from envbuild.render.docker import Provenance, RenderOptions
    from envbuild.render.lock import Lock
    from envbuild.resolver.model import Request, Resolution

# A command's printer for its results (standard output; see cli._print).
Out = Callable[[str], None]
# What every command's ``run`` is: the parsed arguments, the environment, the printer.
Command = Callable[[argparse.Namespace, Mapping[str, str], Out], int]
WARNING = "envbuild: warning: "
# How much a command says on stderr besides its errors and warnings, set for one call by
# cli.main from -q/-v: -1 no progress lines, 0 the default, 1 more (a build's every log line).
VERBOSITY: ContextVar[int] = ContextVar("envbuild_verbosity", default=0)
# Set by a command whose process holds nothing left to close once it has answered (lock, its
# files written, its threads ended): the command (envbuild/__main__.py) then ends the process
# at once. An orderly interpreter shutdown frees every object one by one: ~15 ms of a lock.
_AT_ONCE: list[bool] = []


def exit_at_once() -> None:
    _AT_ONCE.append(True)


def exits_at_once() -> bool:
    return bool(_AT_ONCE)


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage already; make its message our one-line format."""

    def error(self, message: str) -> Any:
        raise UsageError(message, hint=f"see '{self.prog} --help'")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse's own asks shutil for the width, on every add_argument too: shutil (and the
        # bz2, lzma and zlib it loads) was a tenth of `envbuild COMMAND --help`.
        formatter: argparse.HelpFormatter = self.formatter_class(  # type: ignore[call-arg]
            prog=self.prog, width=_help_width())
        return formatter


def _help_width() -> int:
    """shutil.get_terminal_size().columns - 2, as argparse sizes its help: $COLUMNS, else the
    terminal standard output is, else 80."""
    import os

    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


def warn(message: str) -> None:
    """A warning on standard error, in the one format every command uses."""
    print(f"{WARNING}{message}", file=sys.stderr, flush=True)


def progress(text: str) -> None:
    """A progress line on standard error, unless -q asked for none."""
    if VERBOSITY.get() >= 0:
        print(text, file=sys.stderr, flush=True)


def warn_all(messages: Iterable[str]) -> None:
    for message in messages:
        warn(message)


def positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) < 1:
        from envbuild.confine import quoted  # a 5000-digit value is cut, never printed whole

        raise argparse.ArgumentTypeError(f"expected a positive integer, got {quoted(text)}")
    return int(text)


# --- option definitions ------------------------------------------------------------------


def add_selectors(p: argparse.ArgumentParser) -> None:
    """The stack selectors shared by resolve and every command that renders a stack."""
    host = p.add_argument_group("host")
    host.add_argument("--driver", help="host NVIDIA driver: 550, 550.54 or 550.54.15")
    host.add_argument("--host", action="store_true", help="take driver and GPUs from this host")
    host.add_argument("--gpu", action="append", default=[], metavar="NAME",
                      help="target GPU by name (repeatable), e.g. 'RTX 4090', A100")
    host.add_argument("--arch", action="append", default=[], metavar="sm_XY",
                      help="target GPU architecture (repeatable), e.g. sm_89")
    host.add_argument("--datacenter", action="store_true",
                      help="the GPUs are datacenter parts (allows forward compatibility)")
    host.add_argument("--platform", metavar="OS/ARCH",
                      help="the host's platform, as Docker spells it: linux/amd64 or linux/arm64 "
                           "(default: the host's with --host, linux/arm64 for a Grace or DGX Spark "
                           "GPU, else linux/amd64); --arch names the GPU's sm_XY, not this"),
    stack = p.add_argument_group("stack")
    for name, example in (("torch", "2.4.1, 2.4, >=2.3,<2.6"), ("python", "3.11"),
                          ("cuda", "12.4"), ("cudnn", "9")):
        stack.add_argument(f"--{name}", metavar="SPEC", help=f"constraint, e.g. {example}")
    stack.add_argument("--ubuntu", metavar="YY.MM", help="Ubuntu release, e.g. 22.04")
    stack.add_argument("--variant", metavar="NAME",
                       help="wheel variant: cu124, cpu, or 'default' (the package index's wheel)")
    stack.add_argument("--flavor", choices=("runtime", "devel"),
                       help="devel adds the CUDA toolkit (nvcc) for building extensions "
                            "(default: the project's, else runtime)")
    stack.add_argument("--index-url", metavar="URL",
                       help="index torch is installed from (default: the variant's own; for "
                            "--variant default $PIP_INDEX_URL, else pip's configured index)")


def add_render_options(p: argparse.ArgumentParser, *, host: bool = False) -> None:
    """The image options; ``host``: as render script / cloud-init take them (a host has no base
    image and its accounts are its own: --base-image and --user are refused there, exit 2)."""
    g = p.add_argument_group("install" if host else "image")
    g.add_argument("--base-image", metavar="REF",
                   help="images only: refused here (exit 2), a host has no base image" if host
                   else "FROM this image (mirror or private registry)")
    g.add_argument("--python-url", metavar="URL",
                   help="standalone CPython tarball, when the distro's python3 is not the stack's")
    g.add_argument("--python-sha256", metavar="HEX", help="sha256 of --python-url")
    g.add_argument("--apt-package", action="append", default=[], metavar="NAME",
                   help="a Debian package for the image (repeatable): name or name=version")
    g.add_argument("--pip-package", action="append", default=[], metavar="NAME[==VER]",
                   help="a Python package installed after torch (repeatable): name or name==version")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="exported in /etc/profile.d/envbuild-env.sh (login shells) and to the "
                        "smoke test (repeatable)" if host else "an ENV of the image (repeatable)")
    g.add_argument("--user", default=None if host else "envbuild",
                   help="images only: refused here (exit 2); the venv is root's, every account "
                        "runs it" if host else "the image's unprivileged user (default envbuild)")
    g.add_argument("--no-companions", dest="companions", action="store_false",
                   help="install torch alone, without torchvision and torchaudio")
    g.add_argument("--no-compile-toolchain", dest="compile_toolchain", action="store_false",
                   help="leave out the C/C++ compiler and Python headers torch.compile needs "
                        "(about 171 MB less on Debian bookworm; see docs/compile.md)")


def add_context_options(p: argparse.ArgumentParser) -> None:
    """Options that shape the build context but not the lock (render docker, build)."""
    p.add_argument("--lock", metavar="FILE", help="render from this lock instead of resolving")
    p.add_argument("--target", metavar="NAME", help="the lock's target (when it has several)")
    p.add_argument("--ca-bundle", metavar="FILE", help="PEM bundle trusted during the build")
    p.add_argument("--wheelhouse", metavar="DIR",
                   help="wheels copied into the context and preferred (air-gapped builds); with a "
                        "locked closure, the one directory besides the lock's own that its local "
                        "wheels may come from")
    p.add_argument("--revision", metavar="SHA",
                   help="source commit for the org.opencontainers.image.revision label "
                        "(default: $GITHUB_SHA)")
    p.add_argument("--source", metavar="URL",
                   help="source repository for the org.opencontainers.image.source label "
                        "(default: $GITHUB_SERVER_URL/$GITHUB_REPOSITORY)")


def add_output_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--json", action="store_true",
                   help="print what was written as JSON (docs/schemas/written.schema.json)")


def written_json(schema: str, directory: Path, **extra: Any) -> str:
    """What a writer command wrote into ``directory``, as its --json document: every file
    (sorted, relative), its size and sha256, read back from disk after the atomic rename."""
    import hashlib
    import json

    files = [{"path": path.relative_to(directory).as_posix(), "bytes": path.stat().st_size,
              "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
             for path in sorted(directory.rglob("*")) if path.is_file()]
    return json.dumps({"schema": schema, "output": str(directory), "files": files, **extra}, indent=2)


# --- from a Namespace to values ----------------------------------------------------------


def load_matrix(args: argparse.Namespace, env: Mapping[str, str]) -> Matrix:
    from pathlib import Path

    from envbuild.data import matrix

    directory = Path(args.matrices) if args.matrices else matrix.default_directory(env)
    return matrix.load(directory, cache_dir=matrix.cache_directory(env))


def render_options(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RenderOptions:
    """The image options, validated. The torch index comes from the stack; --index-url /
    $PIP_INDEX_URL only replace it for the 'default' variant, where the stack has none
    (it means pip's configured index). With ``env``, the image's provenance labels."""
    from envbuild.render.docker import parse_options

    return parse_options(
        provenance=None if env is None else provenance(args, env),
        base_image=args.base_image, index_url=args.index_url,
        python_url=args.python_url, python_sha256=args.python_sha256,
        ca_bundle=getattr(args, "ca_bundle", None), apt_packages=args.apt_package,
        pip_packages=args.pip_package, env=args.env, user=args.user,
        wheelhouse=getattr(args, "wheelhouse", None), companions=args.companions,
        compile_toolchain=args.compile_toolchain)


def provenance(args: argparse.Namespace, env: Mapping[str, str]) -> Provenance | None:
    """created from $SOURCE_DATE_EPOCH (never the clock); revision and source from --revision
    and --source, else from a GitHub Actions run's $GITHUB_SHA and
    $GITHUB_SERVER_URL/$GITHUB_REPOSITORY; each left out when unknown."""
    from envbuild.render.docker import parse_provenance

    revision = getattr(args, "revision", None)
    source = getattr(args, "source", None)
    revision_from, source_from = "--revision", "--source"
    if revision is None and env.get("GITHUB_SHA"):
        revision, revision_from = env["GITHUB_SHA"], "$GITHUB_SHA"
    if source is None and env.get("GITHUB_SERVER_URL") and env.get("GITHUB_REPOSITORY"):
        source = f"{env['GITHUB_SERVER_URL'].rstrip('/')}/{env['GITHUB_REPOSITORY']}"
        source_from = "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY"
    return parse_provenance(revision=revision, source=source,
                            source_date_epoch=env.get("SOURCE_DATE_EPOCH"),
                            revision_from=revision_from, source_from=source_from)


def reject_image_options(args: argparse.Namespace, *, kind: str) -> None:
    """A lock is the whole recipe: image options given with --lock would be silently
    dropped, which would surprise the user. ``kind`` names them as the command calls them."""
    if (args.base_image or args.python_url or args.apt_package or args.pip_package or args.env
            or args.user != "envbuild" or args.index_url or not args.companions
            or not args.compile_toolchain):
        raise UsageError(f"{kind} options cannot be combined with --lock",
                         hint="pass them to 'envbuild lock' instead")


def resolve_stacks(args: argparse.Namespace, env: Mapping[str, str],
                   matrix: Matrix) -> tuple[Request, Resolution]:
    """The request the selectors make and its resolution; no stack is NoCompatibleStack."""
    from envbuild.resolver.resolve import resolve
    from envbuild.resolver.selection import Selectors, build_request

    request = build_request(Selectors.of(args), matrix, env)
    resolution = resolve(request, matrix)
    if not resolution.stacks:
        from envbuild.resolver.explain import explain_failure  # only where nothing resolved

        raise explain_failure(request, matrix, resolution)
    return request, resolution


def resolve_lock(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, *,
                 gpu_archs: bool = False) -> Lock:
    """The lock of the best stack the selectors and image options allow; ``gpu_archs``: record
    the target GPUs' architectures, which the extensions stage compiles for (``lock``)."""
    from dataclasses import replace

    from envbuild.render.docker import lock_for, wheel_index

    options = render_options(args)
    request, resolution = resolve_stacks(args, env, matrix)
    stack = resolution.stacks[0]
    options = replace(options, index_url=wheel_index(stack, options.index_url,
                                                     request.package_index))
    lock = lock_for(stack, matrix, options)
    if not gpu_archs or stack.cuda is None:
        return lock
    archs = sorted({"sm_" + g.compute_capability.replace(".", "") for g in request.gpus})
    return replace(lock, gpu_archs=tuple(archs))
