"""Render a lock into a Docker build context: pure, deterministic, validated first.

``render_docker(lock, options)`` returns the files as bytes (same lock and options,
same bytes); ``write_output`` puts them on disk through a temporary directory beside
the target, so an output directory is either complete or untouched. Every user value
is checked in ``envbuild.lock`` before anything is rendered.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.data.matrix import Matrix
from envbuild.errors import UsageError
from envbuild.fs import FileData, UnwritableDirectory, write_file, write_tree
from envbuild.render.lock import (
    Lock,
    Standalone,
    check_debian_package,
    check_env_pair,
    check_image_reference,
    check_pip_requirement,
    check_sha256,
    check_url,
    check_user_name,
    make_lock,
    read_lock,
)
from envbuild.resolver.resolve import Stack
from envbuild.smoke.bundle import payload as smoke_payload

if TYPE_CHECKING:
    import jinja2

CA_BUNDLE_NAME = "ca-bundle.crt"
PEAKS_NAME = "smoke_peaks.json"
WHEELHOUSE_DIR = "wheelhouse"
_MAX_CA_BYTES = 4 * 1024 * 1024
# A wheel file name (PEP 427) with nothing a shell or a Dockerfile could read as syntax.
_WHEEL_NAME_RE = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_]*)?"
                            r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl", re.ASCII)

# A rendered file's content: bytes, or a path to copy as is (large wheels are not read in).


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderOptions:
    """What the user adds to a stack. ``ca_bundle`` is a path; the rest land in the lock."""

    base_image: str | None = None
    index_url: str | None = None
    python_standalone: Standalone | None = None
    ca_bundle: Path | None = None
    apt_packages: tuple[str, ...] = ()
    pip_packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = "envbuild"
    wheelhouse: tuple[Path, ...] = ()  # the wheels of --wheelhouse DIR, sorted by name
    companions: bool = True


def parse_options(
    *,
    base_image: str | None = None,
    index_url: str | None = None,
    python_url: str | None = None,
    python_sha256: str | None = None,
    ca_bundle: str | None = None,
    apt_packages: Sequence[str] = (),
    pip_packages: Sequence[str] = (),
    env: Sequence[str] = (),
    user: str = "envbuild",
    wheelhouse: str | None = None,
    companions: bool = True,
) -> RenderOptions:
    """Validate raw user strings into RenderOptions; UsageError names the bad field."""
    if (python_url is None) != (python_sha256 is None):
        raise UsageError("--python-url and --python-sha256 go together")
    standalone = None
    if python_url is not None and python_sha256 is not None:
        standalone = Standalone(url=check_url(python_url, "--python-url"),
                                sha256=check_sha256(python_sha256, "--python-sha256"))
    return RenderOptions(
        base_image=None if base_image is None else check_image_reference(base_image, "--base-image"),
        index_url=None if index_url is None else check_url(index_url, "--index-url"),
        python_standalone=standalone,
        ca_bundle=None if ca_bundle is None else _ca_path(ca_bundle),
        apt_packages=tuple(check_debian_package(p, "--apt-package") for p in apt_packages),
        pip_packages=tuple(check_pip_requirement(p, "--pip-package") for p in pip_packages),
        env=tuple(check_env_pair(pair, "--env") for pair in env),
        user=check_user_name(user, "--user"),
        wheelhouse=() if wheelhouse is None else _wheels(wheelhouse),
        companions=companions,
    )


def _wheels(text: str) -> tuple[Path, ...]:
    """The ``*.whl`` files of a --wheelhouse directory; other files are not copied."""
    directory = Path(text)
    if not directory.is_dir():
        raise UsageError(f"--wheelhouse {text!r} is not a directory")
    wheels = sorted(p for p in directory.iterdir() if p.name.endswith(".whl") and p.is_file())
    if not wheels:
        raise UsageError(f"--wheelhouse {text!r} holds no .whl files")
    for wheel in wheels:
        if not _WHEEL_NAME_RE.fullmatch(wheel.name):
            raise UsageError(f"--wheelhouse: {wheel.name!r} is not a wheel file name")
    return tuple(wheels)


def wheelhouse_covers(wheels: Sequence[Path], packages: Mapping[str, str], python: str) -> bool:
    """True when every pin has a wheel in the wheelhouse for the stack's CPython."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    have: set[tuple[str, str]] = set()
    interpreter = "cp" + python.replace(".", "").rstrip("t")
    for wheel in wheels:
        try:
            name, version, _, tags = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            continue
        if any(t.interpreter in (interpreter, "py3") for t in tags):
            have.add((str(name), str(version)))
    return all((canonicalize_name(n), v) in have for n, v in packages.items())


def lock_for(stack: Stack, matrix: Matrix, options: RenderOptions) -> Lock:
    return make_lock(stack, matrix, base_image=options.base_image, index_url=options.index_url,
                     python_standalone=options.python_standalone,
                     apt_packages=options.apt_packages, pip_packages=options.pip_packages,
                     env=options.env, user=options.user, companions=options.companions)


def _ca_path(text: str) -> Path:
    path = Path(text)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --ca-bundle {text!r}: {exc.strerror}") from None
    except ValueError:  # a NUL in the path
        raise UsageError(f"--ca-bundle {text!r} is not a usable path") from None
    if len(data) > _MAX_CA_BYTES or b"-----BEGIN CERTIFICATE-----" not in data:
        raise UsageError(f"--ca-bundle {text!r} is not a PEM certificate bundle")
    return path


# --- rendering ---------------------------------------------------------------------------


def _templates_dir() -> Path:
    """The packaged copy (installed wheel), else the repository's top-level templates/."""
    packaged = Path(str(resources.files("envbuild"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


@cache  # one loader and template cache per process; templates are read-only files
def environment() -> jinja2.Environment:
    import jinja2  # only when rendering: the CLI's other commands never pay for it

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, never an empty string
        autoescape=False,  # a Dockerfile, not HTML: values are validated and quoted instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def quote(value: str) -> str:
    """One double-quoted Dockerfile word: backslash, quote and ``$`` escaped, so a value can
    neither end the word nor expand a variable. Line breaks were rejected earlier."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def required_cuda(stack: Stack) -> str | None:
    """The ``NVIDIA_REQUIRE_CUDA`` floor, or None to keep the base image's own value.

    With a CUDA base image the resolver chose a release the driver runs natively, so its
    major.minor is the honest floor (the wheel's newer CUDA may run by minor-version
    compatibility). On plain Ubuntu: the wheel's CUDA when native, else the major's .0.
    Forward compatibility relies on the base image's own brand/driver list, kept as is.
    """
    if stack.cuda is None or stack.compat == "forward":
        return None
    if stack.base_cuda is not None:
        return major_minor(stack.base_cuda)
    if stack.compat == "native":
        return major_minor(stack.cuda)
    return f"{stack.cuda.split('.')[0]}.0"


def labels(lock: Lock) -> list[tuple[str, str]]:
    s = lock.stack
    values = {
        "org.opencontainers.image.title": f"envbuild torch {s.torch} {s.variant}",
        "org.opencontainers.image.description":
            f"PyTorch {s.torch} ({s.variant}) on Python {s.python}, Ubuntu {s.ubuntu}",
        "org.opencontainers.image.base.name": lock.base_image,
        "dev.envbuild.schema": "1",
        "dev.envbuild.torch": s.torch,
        "dev.envbuild.torchvision": s.torchvision or "",
        "dev.envbuild.torchaudio": s.torchaudio or "",
        "dev.envbuild.variant": s.variant,
        "dev.envbuild.cuda": s.cuda or "",
        "dev.envbuild.cudnn": s.cudnn or "",
        "dev.envbuild.python": s.python,
        "dev.envbuild.ubuntu": s.ubuntu,
        "dev.envbuild.flavor": lock.flavor,
        "dev.envbuild.compat": s.compat or "",
        "dev.envbuild.min-driver": s.min_driver or "",
        "dev.envbuild.arch-list": " ".join(s.arch_list),
        "dev.envbuild.index-url": lock.index_url or "",
        "dev.envbuild.matrices-digest": lock.matrices_digest,
    }
    if lock.base_digest:
        values["org.opencontainers.image.base.digest"] = lock.base_digest
    return [(key, quote(values[key])) for key in sorted(values)]


def context(lock: Lock, *, ca_bundle: bool, wheelhouse: Sequence[Path] = (),
            peaks: bool = False) -> dict[str, Any]:
    s = lock.stack
    standalone = lock.python_standalone
    index_url = lock.index_url
    if wheelhouse and index_url == s.index_url and \
            wheelhouse_covers(wheelhouse, lock.packages, s.python):
        # Every pin is in the wheelhouse and no --index-url was given: the variant's index
        # would only be asked for the pins' pure-Python dependencies, which pip's configured
        # index serves as well (an air-gapped build points that at its mirror).
        index_url = None
    apt = {"ca-certificates"} | ({"curl"} if standalone else {"python3", "python3-venv"})
    return {
        "torch": s.torch, "variant": s.variant, "python": s.python, "ubuntu": s.ubuntu,
        "base_image": lock.base_image,
        "base_kind": ("custom" if lock.base_image != s.base_image
                      else "cuda" if s.base_cuda is not None else "ubuntu"),
        "stack_base": s.base_image,
        "flavor_image": "devel" if lock.flavor == "devel" else "base",
        "labels": labels(lock),
        "require_cuda": required_cuda(s),
        "ca_bundle": ca_bundle,
        "apt_packages": sorted(apt | set(lock.apt_packages)),
        "python_standalone": standalone,
        "pins": [f"{name}=={lock.packages[name]}" for name in sorted(lock.packages)],
        "index_url": index_url,
        "wheelhouse": bool(wheelhouse),
        "peaks": peaks,
        "python_provision": lock.python_provision,
        "pip_packages": sorted(lock.pip_packages),
        "env": [(key, quote(value)) for key, value in sorted(lock.env)],
        "user": lock.user,
    }


def render_docker(lock: Lock, options: RenderOptions, *,
                  peaks: bytes | None = None) -> dict[str, FileData]:
    """The build context: Dockerfile, envbuild.lock, smoke.py (and its GPU peak table),
    .dockerignore, plus the CA bundle and the wheelhouse's wheels when given. Wheels are
    returned as paths (copied, never read into memory)."""
    if not lock.companions and options.companions:
        options = replace(options, companions=False)
    files: dict[str, FileData] = {}
    if options.ca_bundle is not None:
        files[CA_BUNDLE_NAME] = _ca_path(str(options.ca_bundle)).read_bytes()
    text = environment().get_template("Dockerfile.j2").render(
        context(lock, ca_bundle=options.ca_bundle is not None, wheelhouse=options.wheelhouse,
                peaks=peaks is not None))
    files["Dockerfile"] = text.encode("utf-8")
    files["envbuild.lock"] = lock.to_json().encode("utf-8")
    files["smoke.py"] = smoke_payload()
    if peaks is not None:
        files[PEAKS_NAME] = peaks
    for wheel in options.wheelhouse:
        files[f"{WHEELHOUSE_DIR}/{wheel.name}"] = wheel
    # Only what the Dockerfile copies goes to the daemon.
    keep = sorted({n.split("/")[0] for n in files if n != "Dockerfile"})
    files[".dockerignore"] = ("*\n" + "".join(f"!{n}\n" for n in keep)).encode("utf-8")
    return dict(sorted(files.items()))


# --- output -----------------------------------------------------------------------------


def write_output(files: Mapping[str, FileData], out_dir: Path, *, force: bool) -> None:
    """Write ``files`` into ``out_dir`` atomically: a complete new directory or nothing.

    Refuses a non-empty ``out_dir`` unless ``force``; then the old directory is replaced
    as a whole (moved aside, the new one renamed in, the old one removed)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UsageError(f"output directory {out_dir} is not empty", hint="pass --force to replace it")
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None
    try:
        write_tree(files, out_dir.resolve())
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None


# --- command line (cli.py wires these in with one call) --------------------------------

Out = Callable[[str], None]


def add_commands(commands: Any, add_selectors: Callable[[argparse.ArgumentParser], None],
                 parser_class: type[argparse.ArgumentParser]) -> None:
    """``envbuild lock`` and ``envbuild render docker``."""
    p = commands.add_parser("lock", help="resolve a stack and write envbuild.lock")
    add_selectors(p)
    add_render_options(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="lock file to write")
    p.set_defaults(run=cmd_lock)
    r = commands.add_parser("render", help="render a Dockerfile (more targets to come)")
    sub = r.add_subparsers(dest="render_target", metavar="TARGET", required=True,
                           parser_class=parser_class)
    d = sub.add_parser("docker", help="a Docker build context: Dockerfile, lock, smoke test")
    add_selectors(d)
    add_render_options(d)
    add_context_options(d)
    d.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    d.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    d.set_defaults(run=cmd_render_docker)
    from envbuild.render import script  # render script / cloud-init: the same selectors and options

    script.add_targets(sub, add_selectors, add_render_options)


def add_render_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("image")
    g.add_argument("--base-image", metavar="REF", help="FROM this image (mirror or private registry)")
    g.add_argument("--python-url", metavar="URL",
                   help="standalone CPython tarball, when the distro's python3 is not the stack's")
    g.add_argument("--python-sha256", metavar="HEX", help="sha256 of --python-url")
    g.add_argument("--apt-package", action="append", default=[], metavar="NAME")
    g.add_argument("--pip-package", action="append", default=[], metavar="NAME[==VER]")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--user", default="envbuild", help="the image's unprivileged user")
    g.add_argument("--no-companions", dest="companions", action="store_false",
                   help="install torch alone, without torchvision and torchaudio")


def add_context_options(p: argparse.ArgumentParser) -> None:
    """Options that shape the build context but not the lock (render docker, build)."""
    p.add_argument("--lock", metavar="FILE", help="render from this lock instead of resolving")
    p.add_argument("--ca-bundle", metavar="FILE", help="PEM bundle trusted during the build")
    p.add_argument("--wheelhouse", metavar="DIR",
                   help="wheels copied into the context and preferred (air-gapped builds)")


def _options(args: argparse.Namespace, env: Mapping[str, str]) -> RenderOptions:
    # The torch index comes from the stack; --index-url / $PIP_INDEX_URL only replace it
    # for the 'default' variant, where the stack has none (it means pip's configured index).
    return parse_options(
        base_image=args.base_image, index_url=args.index_url,
        python_url=args.python_url, python_sha256=args.python_sha256,
        ca_bundle=getattr(args, "ca_bundle", None), apt_packages=args.apt_package,
        pip_packages=args.pip_package, env=args.env, user=args.user,
        wheelhouse=getattr(args, "wheelhouse", None), companions=args.companions)


def resolve_lock(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix) -> Lock:
    from envbuild.resolver.resolve import explain_failure, resolve
    from envbuild.resolver.selection import Selectors, build_request

    options = _options(args, env)
    request = build_request(Selectors.of(args), matrix, env)
    resolution = resolve(request, matrix)
    if not resolution.stacks:
        raise explain_failure(request, matrix, resolution)
    stack = resolution.stacks[0]
    index = options.index_url or stack.index_url or request.package_index
    if index is not None:
        options = replace(options, index_url=check_url(index, "--index-url"))
    return lock_for(stack, matrix, options)


def _warn_duplicate_cuda(lock: Lock) -> None:
    """The same CUDA libraries in the base image and the wheels: worth a line, not a failure."""
    import sys

    from envbuild.render.lock import duplicate_cuda

    for warning in duplicate_cuda(lock):
        print(f"warning: {warning}", file=sys.stderr)


def cmd_lock(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from envbuild.commands.cli import load_matrix

    lock = resolve_lock(args, env, load_matrix(args, env))
    _warn_duplicate_cuda(lock)
    path = Path(args.output)
    if not path.parent.resolve().is_dir():
        raise UsageError(f"directory of {path} does not exist")
    write_file(path, lock.to_json().encode("utf-8"))
    out(f"wrote {path}")
    return 0


def render_context(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Lock, dict[str, FileData]]:
    """The lock (read or resolved) and the build context's files, for render docker and build."""
    from envbuild.commands.cli import load_matrix
    from envbuild.data.peaks import peaks_json

    matrix = load_matrix(args, env)
    options = _options(args, env)
    if args.lock and (args.base_image or args.python_url or args.apt_package or args.pip_package
                      or args.env or args.user != "envbuild" or args.index_url
                      or not args.companions):
        # A lock is the whole recipe: options silently dropped would surprise the user.
        raise UsageError("image options cannot be combined with --lock",
                         hint="pass them to 'envbuild lock' instead")
    lock = read_lock(Path(args.lock)) if args.lock else resolve_lock(args, env, matrix)
    return lock, render_docker(lock, options, peaks=peaks_json(matrix))


def cmd_render_docker(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    lock, files = render_context(args, env)
    _warn_duplicate_cuda(lock)
    write_output(files, Path(args.output), force=args.force)
    out(f"wrote {args.output}/ ({', '.join(files)})")
    return 0
