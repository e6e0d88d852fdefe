"""Render a lock into a Docker build context: pure, deterministic, validated first.

``render_docker(lock, options)`` returns the files as bytes (same lock and options,
same bytes); ``render.output.write_output`` puts them on disk through a temporary
directory beside the target, so an output directory is either complete or untouched.
Every user value is checked in ``render.lock`` before anything is rendered.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbuild.confine import WHEEL_NAME, confined, quoted, read_regular
from envbuild.data.matrix import Matrix
from envbuild.errors import UsageError
from envbuild.fs import FileData
from envbuild.render.aptsnapshot import holds
from envbuild.render.lock import Lock, Standalone, make_lock
from envbuild.render.templates import major_minor
from envbuild.render.values import (
    check_debian_package,
    check_env_pair,
    check_image_reference,
    check_pip_requirement,
    check_sha256,
    check_url,
    check_user_name,
)
from envbuild.resolver.model import Stack

CA_BUNDLE_NAME = "ca-bundle.crt"
# Where a BuildKit-syntax build mounts the CA bundle secret while a RUN step runs.
CA_SECRET_PATH = "/run/secrets/envbuild-ca"
PEAKS_NAME = "smoke_peaks.json"
WHEELHOUSE_DIR = "wheelhouse"
_MAX_CA_BYTES = 1024 * 1024
_PEM_BEGIN_RE = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,64})-----")

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
    # Where a locked closure's local wheels may lie, the pylock's own directory first (the
    # --wheelhouse directory is one too): see pylock.install.local_wheels.
    wheel_roots: tuple[Path, ...] = ()
    companions: bool = True
    # A C/C++ compiler and the Python headers in the image: torch.compile needs them at run time.
    compile_toolchain: bool = True
    provenance: Provenance | None = None  # OCI created/revision/source labels, when known
    # BuildKit syntax (docker buildx, buildah): the CA bundle a build secret, pip's downloads a
    # cache mount. The classic builder reads neither.
    buildkit: bool = False
    # A --base-image's OS as the build read it from the image (engine/baseos.py), for the labels.
    base_os: str | None = None
    # Where a lock's extension directories lie (the lock's own directory): see envbuild/extensions.
    extension_root: Path | None = None
    # The stage checks its wheels against envbuild.built.json's record (build --accept-rebuilt: not).
    check_recorded: bool = True
    # The extensions' compiling steps run with no network (RUN --network=none): docker buildx
    # only, as buildah 1.28 takes no RUN flag but --mount and the classic builder none at all.
    offline_steps: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Where and when an image comes from, for its OCI labels; each part only when known.
    Never the wall clock: ``created`` is SOURCE_DATE_EPOCH's instant, so renders stay
    deterministic."""

    created: str | None = None  # RFC 3339, UTC
    revision: str | None = None  # the source's commit
    source: str | None = None  # the source repository's URL


_REVISION_RE = re.compile(r"[0-9a-f]{7,64}", re.ASCII)
_MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z


def parse_provenance(*, revision: str | None = None, source: str | None = None,
                     source_date_epoch: str | None = None, revision_from: str = "--revision",
                     source_from: str = "--source") -> Provenance | None:
    """Validated labels' values; None when none is known. ``*_from`` name where a value
    came from, for the error."""
    created = None
    if source_date_epoch is not None and source_date_epoch != "":
        if not source_date_epoch.isdigit() or not source_date_epoch.isascii() or \
                int(source_date_epoch) > _MAX_EPOCH:
            raise UsageError(f"invalid SOURCE_DATE_EPOCH {source_date_epoch!r}",
                             hint="seconds since 1970-01-01 UTC, a non-negative integer")
        import datetime

        instant = datetime.datetime.fromtimestamp(int(source_date_epoch), tz=datetime.timezone.utc)
        created = instant.strftime("%Y-%m-%dT%H:%M:%SZ")
    if revision is not None and not _REVISION_RE.fullmatch(revision):
        raise UsageError(f"invalid {revision_from} {revision!r}",
                         hint="a commit id: 7 to 64 lowercase hex digits")
    if source is not None:
        source = check_url(source, source_from)
    if created is None and revision is None and source is None:
        return None
    return Provenance(created=created, revision=revision, source=source)


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
    provenance: Provenance | None = None,
    compile_toolchain: bool = True,
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
        provenance=provenance,
        compile_toolchain=compile_toolchain,
    )


def _wheels(text: str) -> tuple[Path, ...]:
    """The ``*.whl`` files of a --wheelhouse directory; other files are not copied."""
    directory = Path(text)
    if not directory.is_dir():
        raise UsageError(f"--wheelhouse {text!r} is not a directory")
    import stat

    wheels = []
    for path in sorted(directory.iterdir()):
        if not path.name.endswith(".whl"):
            continue
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):  # refused, not followed: it could pull any file into the context
            raise UsageError(f"--wheelhouse: {path.name!r} is a symbolic link",
                             hint="copy the wheel itself into the wheelhouse")
        if stat.S_ISREG(mode):
            wheels.append(path)
    if not wheels:
        raise UsageError(f"--wheelhouse {text!r} holds no .whl files")
    for wheel in wheels:
        if not WHEEL_NAME.fullmatch(wheel.name):
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
                     env=options.env, user=options.user, companions=options.companions,
                     compile_toolchain=options.compile_toolchain)


def wheel_index(stack: Stack, index_url: str | None, package_index: str | None) -> str | None:
    """The index torch is installed from: --index-url, else the stack's own, else
    ``package_index`` ($PIP_INDEX_URL or pip's configured index, for the 'default' variant,
    whose stack names none)."""
    index = index_url or stack.index_url or package_index
    return None if index is None else check_url(index, "--index-url")


def _ca_path(text: str) -> Path:
    _ca_bytes(text)
    return Path(text)


def _ca_bytes(text: str) -> bytes:
    """The bundle's bytes: a regular file (a FIFO would hang the read, a device never end it,
    a directory is none) of at most 1 MiB, with a certificate and no private key (which would
    reach the build context and the daemon)."""
    what = f"--ca-bundle {quoted(text)}"
    data = read_regular(confined(Path(text), None, what), what, limit=_MAX_CA_BYTES)
    labels = {m.group(1) for m in _PEM_BEGIN_RE.finditer(data)}
    if any(b"PRIVATE KEY" in label for label in labels):
        raise UsageError(f"{what} holds a private key",
                         hint="pass only the CA certificates; a key must never reach a build context")
    if not labels & {b"CERTIFICATE", b"TRUSTED CERTIFICATE"}:
        raise UsageError(f"{what} is not a PEM certificate bundle",
                         hint="it needs at least one -----BEGIN CERTIFICATE----- block")
    return data


# --- rendering ---------------------------------------------------------------------------


def quote(value: str) -> str:
    """One double-quoted Dockerfile word: backslash, quote and ``$`` escaped, so a value can
    neither end the word nor expand a variable. Line breaks were rejected earlier."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


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


def custom_base(lock: Lock) -> bool:
    """Whether the image is built on a --base-image (a mirror or another OS), not the stack's
    own base: names compared without a digest, so the stack's base pinned by ``lock`` is its own."""
    return lock.base_image.split("@", 1)[0] != lock.stack.base_image.split("@", 1)[0]


def base_os(lock: Lock, found: str | None = None) -> str:
    """The image's OS as labels and comments name it: the stack's Ubuntu under the stack's own
    base; under a --base-image, what the build read from that image (``found``, its
    os-release), else only the image's name, never an Ubuntu it may not be."""
    if not custom_base(lock):
        return f"Ubuntu {lock.stack.ubuntu}"
    return found or f"base image {lock.base_image.split('@', 1)[0]}"


def labels(lock: Lock, provenance: Provenance | None = None,
           found_os: str | None = None) -> list[tuple[str, str]]:
    """The image's labels, quoted: the OCI set and envbuild's own. A value that is not known
    is left out, never written empty."""
    values = label_values(lock, provenance, found_os)
    return [(key, quote(values[key])) for key in sorted(values) if values[key]]


def label_values(lock: Lock, provenance: Provenance | None = None,
                 found_os: str | None = None) -> dict[str, str]:
    """Every label the image of ``lock`` gets, unquoted; "" for one it does not get (a value
    not known). ``version`` is the packaged software's: torch's version and wheel variant (as
    PyTorch's own local versions, 2.4.1+cu121). ``sbom --attach`` compares an image's with these."""
    s = lock.stack
    p = provenance or Provenance()
    values = {
        "org.opencontainers.image.title": f"envbuild torch {s.torch} {s.variant}",
        "org.opencontainers.image.version": f"{s.torch}+{s.variant}",
        "org.opencontainers.image.created": p.created or "",
        "org.opencontainers.image.revision": p.revision or "",
        "org.opencontainers.image.source": p.source or "",
        "org.opencontainers.image.description":
            f"PyTorch {s.torch} ({s.variant}) on Python {s.python}, {base_os(lock, found_os)}",
        "org.opencontainers.image.base.name": lock.base_image,
        "dev.envbuild.schema": "1" if lock.pylock is None else "2",  # the lock file the image carries
        "dev.envbuild.torch": s.torch,
        # Only what the image installs: a lock without companions names none.
        "dev.envbuild.torchvision": (s.torchvision or "") if lock.companions else "",
        "dev.envbuild.torchaudio": (s.torchaudio or "") if lock.companions else "",
        "dev.envbuild.variant": s.variant,
        "dev.envbuild.cuda": s.cuda or "",
        "dev.envbuild.cudnn": s.cudnn or "",
        "dev.envbuild.python": s.python,
        "dev.envbuild.ubuntu": "" if custom_base(lock) else s.ubuntu,  # a --base-image's is unknown
        "dev.envbuild.flavor": lock.flavor,
        "dev.envbuild.compat": s.compat or "",
        "dev.envbuild.min-driver": s.min_driver or "",
        "dev.envbuild.arch-list": " ".join(s.arch_list),
        "dev.envbuild.index-url": lock.index_url or "",
        "dev.envbuild.matrices-digest": lock.matrices_digest,
        # Only an opt-out is recorded: the smoke test reads ENVBUILD_COMPILE_TOOLCHAIN, people this.
        "dev.envbuild.compile-toolchain": "" if lock.compile_toolchain else "false",
    }
    values["org.opencontainers.image.base.digest"] = lock.base_digest or ""
    return values


def context(lock: Lock, *, ca_bundle: bool, wheelhouse: Sequence[Path] = (),
            peaks: bool = False, project_requirements: bool = False,
            provenance: Provenance | None = None, buildkit: bool = False,
            found_os: str | None = None, recorded: bool = False,
            offline_steps: bool = False, sdists: bool | None = None,
            git: Sequence[tuple[str, str, str]] = (), pure: Sequence[str] = ()) -> dict[str, Any]:
    """The Dockerfile's values. ``pure``: the requirements files of the envbuild-sdists stage
    (the pure sdists, the torch layer's packages they build with, the recorded wheels' sums)."""
    # Rendering's modules, read here: lock imports this module on its way to uv, which needs none.
    from envbuild.extensions.stage import check_toolchain, stage_context

    s = lock.stack
    check_toolchain(lock.extensions, cuda=s.cuda, flavor=lock.flavor)
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
        # linux/arm64: the base named with its platform, so that no builder takes another
        # architecture's image from a multi-arch reference (or runs it under emulation); an
        # amd64 Dockerfile stays what it was
        "from_platform": "--platform=linux/arm64 " if s.platform == "linux/arm64" else "",
        "os": base_os(lock, found_os),
        "base_kind": ("custom" if lock.base_image != s.base_image
                      else "cuda" if s.base_cuda is not None else "ubuntu"),
        "stack_base": s.base_image,
        "flavor_image": "devel" if lock.flavor == "devel" else "base",
        "labels": labels(lock, provenance, found_os),
        "require_cuda": required_cuda(s),
        "ca_bundle": ca_bundle,
        # Shell-quoted: a version's '~' (or anything else) is never expanded by the RUN's shell.
        "apt_packages": [shlex.quote(p) for p in sorted(apt | set(lock.apt_packages))],
        "python_standalone": standalone,
        "pins": [f"{name}=={lock.packages[name]}" for name in sorted(lock.packages)],
        "index_url": index_url,
        "wheelhouse": bool(wheelhouse),
        # A throwaway first stage: the wheels or the CA bundle stay in it, out of the image.
        # With BuildKit the bundle is a secret, a file of no layer: one stage, no copy of the venv.
        "build_stage": ("envbuild-build" if ca_bundle and not buildkit else
                        "envbuild-wheelhouse" if wheelhouse else None),
        # A closure's project distributions above torch's, in a stage of their own when the CA
        # bundle keeps the installs out of the image's stage (only their files are copied on).
        "project_stage": "envbuild-project" if ca_bundle and not buildkit and project_requirements else None,
        "peaks": peaks,
        "python_provision": lock.python_provision,
        "pip_packages": sorted(lock.pip_packages),
        "env": [(key, quote(value)) for key, value in sorted(lock.env)],
        "user": lock.user,
        "closure": lock.pylock is not None,
        "pylock_file": None if lock.pylock is None else lock.pylock.file,
        "project_requirements": project_requirements,
        "buildkit": buildkit,
        "compile_toolchain": lock.compile_toolchain,  # partials/compile_toolchain.j2
        "apt_snapshot": lock.apt_snapshot,  # partials/apt_snapshot.j2
        "apt_holds": holds(lock.apt_snapshot, lock.apt_packages),
        "pip_cache": buildkit,  # partials/torch_install.j2: keep pip's cache (a cache mount)
        "ca_secret": CA_SECRET_PATH,
        "installer": None if lock.pylock is None or lock.pylock.installer is None
        else lock.pylock.installer.name,
        "installer_file": INSTALLER_FILE,
        **stage_context(lock.extensions, cuda=s.cuda, arch_list=lock.gpu_archs or s.arch_list,
                        standalone=standalone is not None,
                        sdists=bool(lock.sdists) if sdists is None else sdists, recorded=recorded,
                        build_env=lock.build_env, offline_steps=offline_steps, git=git, pure=pure),
    }


INSTALLER_FILE = "installer.txt"  # under requirements/: the hash-pinned uv wheel
RECORDED_SUMS = "built.sha256"  # under requirements/: the recorded extension wheels' sha256


def render_docker(lock: Lock, options: RenderOptions, *,
                  peaks: bytes | None = None, lockset_json: str | None = None) -> dict[str, FileData]:
    """The build context: Dockerfile, envbuild.lock, smoke.py (and its GPU peak table),
    .dockerignore, plus the CA bundle and the wheelhouse's wheels when given. Wheels are
    returned as paths (copied, never read into memory)."""
    from envbuild.extensions.stage import PURE_FILES, PURE_SUMS, context_files
    from envbuild.render.templates import environment
    from envbuild.smoke.bundle import payload as smoke_payload

    if not lock.companions and options.companions:
        options = replace(options, companions=False)
    files: dict[str, FileData] = {}
    if options.ca_bundle is not None:
        files[CA_BUNDLE_NAME] = _ca_bytes(str(options.ca_bundle))
    wheelhouse = options.wheelhouse
    requirements: dict[str, str] = {}
    git: list[tuple[str, str, str]] = []
    if lock.pylock is not None:
        from envbuild.render import closure  # reads pylock files: only for a locked closure

        # The pylock's local wheels, and only those, come from its own directory or the
        # --wheelhouse named here: never from anywhere else on this machine.
        roots = (*options.wheel_roots, *sorted({w.parent for w in wheelhouse}))
        requirements, wheels = closure.install_files(lock, local_dir=f"/tmp/{WHEELHOUSE_DIR}",
                                                     roots=roots)
        wheelhouse = tuple(wheels)
        for name, text in requirements.items():
            files[f"requirements/{name}.txt"] = text.encode("utf-8")
        if lock.pylock.installer is not None:  # uv, for the steps that install the layers
            files[f"requirements/{INSTALLER_FILE}"] = lock.pylock.installer.requirement().encode("utf-8")
        files[lock.pylock.file] = lock.pylock.text.encode("utf-8")
        files.update(context_files(lock.extensions, options.extension_root))
        git = closure.git_builds(lock)
        checked = ((RECORDED_SUMS, False), (PURE_SUMS, True)) if options.check_recorded else ()
        for name, pure in checked:
            sums = closure.recorded_sums(lock, options.extension_root, pure=pure)
            if sums:  # the wheels built before for these build keys: the stage checks its own against them
                files[f"requirements/{name}"] = sums.encode("utf-8")
    text = environment().get_template("Dockerfile.j2").render(
        context(lock, ca_bundle=options.ca_bundle is not None, wheelhouse=wheelhouse,
                peaks=peaks is not None, project_requirements="project" in requirements,
                provenance=options.provenance, buildkit=options.buildkit, found_os=options.base_os,
                recorded=f"requirements/{RECORDED_SUMS}" in files, offline_steps=options.offline_steps,
                sdists="sdists" in requirements, git=git,
                pure=[n for n in PURE_FILES if n in requirements or f"requirements/{n}" in files]))
    files["Dockerfile"] = text.encode("utf-8")
    files["envbuild.lock"] = (lockset_json if lockset_json is not None else lock.to_json()).encode("utf-8")
    files["smoke.py"] = smoke_payload()
    if peaks is not None:
        files[PEAKS_NAME] = peaks
    for wheel in wheelhouse:
        files[f"{WHEELHOUSE_DIR}/{wheel.name}"] = wheel
    # Only what the Dockerfile copies goes to the daemon.
    # With BuildKit syntax the CA bundle is a build secret (id "ca"), never part of the context.
    skip = {"Dockerfile", *([CA_BUNDLE_NAME] if options.buildkit else [])}
    keep = sorted({n.split("/")[0] for n in files if n not in skip})
    files[".dockerignore"] = ("*\n" + "".join(f"!{n}\n" for n in keep)).encode("utf-8")
    return dict(sorted(files.items()))
