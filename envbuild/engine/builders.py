"""Builders that run as programs: ``docker buildx build`` and ``buildah build``.

Both read BuildKit syntax (``RUN --mount=type=secret`` and ``type=cache``), so the Dockerfile
is rendered with ``RenderOptions.buildkit`` for them. Each takes the same context tar as the
SDK builder. Their output is read line by line: a ``step`` event per Dockerfile step, every
other line a ``log`` event, the last ``LOG_TAIL`` lines kept for a failure's details.

The program runs in its own session, so a Ctrl-C on the terminal reaches envbuild alone:
envbuild stops the program (SIGTERM, then SIGKILL), removes what it left (buildah's working
containers made during this build) and its temporary directory, and re-raises.

buildah keeps images in its own storage, with the driver buildah is configured for
(containers-storage.conf; ``STORAGE_DRIVER`` in the environment is passed as ``--storage-driver``)
and chroot isolation (``BUILDAH_ISOLATION`` overrides): root, no user namespaces needed. Its layer
cache (``--layers``) is on unless the driver is vfs, which would keep every cached step as a whole
copy of the root file system. A base image (a tag) the Docker engine holds is copied from it
first (``docker-daemon:`` transport) when buildah lacks it or holds another image ID under it,
and the built image is copied to the Docker engine afterwards when one answers, so that
``envbuild verify`` runs it (see DEVELOPERS.md), unless ``load`` is off (``build --no-load``:
the image pushed, then verified by its digest, saves a copy of the whole image).

``docker buildx`` is driven from its documented command line (``--progress plain``,
``--iidfile``, ``--secret id=ca,src=FILE``, ``--load``, a tar context on stdin); the buildx
plugin is not installed where envbuild's tests run, so its tests replay a recorded plain
progress stream through a stand-in ``docker`` program.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from envbuild.engine.build import BuildEvent, BuildResult, log_hint, short
from envbuild.engine.daemon import LOG_TAIL
from envbuild.errors import BuildFailed, DockerUnavailable, UsageError

# buildah: "[1/2] STEP 3/7: RUN ..." (the stage prefix only in multi-stage builds).
_BUILDAH_STEP_RE = re.compile(r"(?:\[([0-9]+)/([0-9]+)\] )?STEP ([0-9]+)/([0-9]+): (.*)")
_BUILDAH_ERROR_RE = re.compile(r"(?:Error|error): building at STEP \"(.*)\": (.*)")
# buildx --progress plain: "#7 [envbuild-build 3/6] RUN ...", "#7 CACHED", "#7 ERROR: ..."
_BUILDX_STEP_RE = re.compile(r"#([0-9]+) \[(?:([^\]]*) )?([0-9]+)/([0-9]+)\] (.*)")
_BUILDX_LINE_RE = re.compile(r"#([0-9]+) (?:[0-9]+\.[0-9]+ )?(.*)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FROM_RE = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", re.IGNORECASE | re.MULTILINE)
# How long a stopped builder gets to clean up after SIGTERM before SIGKILL.
STOP_GRACE = 20.0


@dataclass(slots=True)
class _Tail:
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL))

    def add(self, line: str) -> None:
        self.lines.append(line)


def _stream(argv: Sequence[str], *, stdin: IO[bytes] | None, env: Mapping[str, str],
            on_line: Callable[[str], None]) -> int:
    """Run ``argv``, stdout and stderr merged, calling ``on_line`` per line; its exit status.
    On KeyboardInterrupt the program is stopped (and waited for) before it propagates."""
    try:
        process = subprocess.Popen(list(argv), stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=dict(env), start_new_session=True)
    except OSError as exc:
        raise BuildFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    assert process.stdout is not None
    try:
        for raw in process.stdout:
            line = _ANSI_RE.sub("", raw.decode("utf-8", "replace")).rstrip()
            if line:
                on_line(line)
        return process.wait()
    except BaseException:
        stop(process)
        raise
    finally:
        process.stdout.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the program's process group, SIGKILL after ``STOP_GRACE``; waits for it."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="envbuild-build-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _file_backed(context: IO[bytes], directory: Path) -> Iterator[IO[bytes]]:
    """``context`` itself when it is a file (a child can read it), else a copy in ``directory``."""
    try:
        context.fileno()
    except (OSError, AttributeError, io.UnsupportedOperation):
        with (directory / "context.tar").open("w+b") as copy:
            shutil.copyfileobj(context, copy)
            copy.seek(0)
            yield copy
        return
    yield context


def _secret_args(secrets: Mapping[str, bytes], directory: Path) -> list[str]:
    """``--secret id=ID,src=FILE`` per secret, each file 0600 in ``directory`` (removed after)."""
    args = []
    for name, data in sorted(secrets.items()):
        path = directory / f"secret-{name}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        args += ["--secret", f"id={name},src={path}"]
    return args


def _failure(where: str | None, message: str, tail: Sequence[str]) -> BuildFailed:
    place = f"step {where}" if where else "the build"
    return BuildFailed(f"{place} failed: {message}", details=tuple(tail), hint=log_hint(tuple(tail)))


@dataclass(slots=True, kw_only=True)
class BuildahBuilder:
    """``buildah build`` into buildah's own storage, then (``docker``: a Docker API client, or
    None) a copy into the Docker engine under the same tag."""

    docker: object | None = None
    program: str = "buildah"
    # None: STORAGE_DRIVER from ``env`` when set, else the driver buildah is configured for.
    storage_driver: str | None = None
    # None: BUILDAH_ISOLATION from ``env`` when set, else chroot (no runtime, no namespaces).
    isolation: str | None = None
    # buildah's layer cache (--layers). None: on unless the driver is vfs, which stores every
    # cached step as a whole copy of the root file system (GBs for a torch image); there the
    # wheel cache mount is what spares a rebuild the downloads.
    layers: bool | None = None
    nocache: bool = False
    name: str = "buildah"
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # False (build --no-load): the image stays in buildah's storage even when a daemon answers.
    load: bool = True
    platform: str | None = None  # --platform (linux/arm64 for an aarch64 target); None: the host's

    @property
    def loads(self) -> bool:
        """Whether a built image is copied into the Docker engine (else buildah's storage only)."""
        return self.docker is not None and self.load

    def base(self) -> list[str]:
        driver = self.storage_driver or self.env.get("STORAGE_DRIVER", "")
        return [self.program, *(["--storage-driver", driver] if driver else [])]

    def isolation_mode(self) -> str:
        return self.isolation or self.env.get("BUILDAH_ISOLATION", "") or "chroot"

    def driver(self) -> str:
        """The storage driver buildah uses (``buildah info``); "" when it does not say."""
        done = subprocess.run([*self.base(), "info", "--format", "{{.store.GraphDriverName}}"],
                              capture_output=True, text=True, env=dict(self.env), check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def uses_layers(self) -> bool:
        if self.layers is not None:
            return self.layers
        return self.driver() not in ("vfs", "")

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None],
              secrets: Mapping[str, bytes] | None = None,
              timestamp: int | None = None) -> BuildResult:
        isolation = self.isolation_mode()
        if isolation == "chroot" and network not in (None, "host"):
            raise UsageError(f"--network {network} with buildah: its chroot isolation runs every "
                             "step in the host's network", hint="use --network host or default")
        started = time.monotonic()
        tail = _Tail()
        before = set(self.containers())
        with _workdir() as work:
            tree = work / "context"
            tree.mkdir()
            with tarfile.open(fileobj=context, mode="r:") as tar:
                tar.extractall(tree, filter="data")
            self._seed_bases((tree / "Dockerfile").read_text(encoding="utf-8"), progress)
            iidfile = work / "iid"
            argv = [*self.base(), "build", "--isolation", isolation,
                    # --force-rm: buildah takes it only with --layers or --no-cache.
                    *(["--layers", "--force-rm"] if self.uses_layers() else []),
                    "--iidfile", str(iidfile), "--tag", tag,
                    *(["--platform", self.platform] if self.platform else []),
                    *(["--no-cache"] if self.nocache else []),
                    *(["--network", network] if network else []),
                    *(["--timestamp", str(timestamp)] if timestamp is not None else []),
                    *[a for key, value in sorted(labels.items()) for a in ("--label", f"{key}={value}")],
                    *_secret_args(secrets or {}, work), str(tree)]
            state: dict[str, object] = {"step": None, "steps": 0, "ran": [], "count": 0}

            def on_line(line: str) -> None:
                match = _BUILDAH_STEP_RE.fullmatch(line)
                if match:
                    stage = f"[{match[1]}/{match[2]}] " if match[1] else ""
                    state["step"] = f"{stage}{match[3]}/{match[4]} ({short(match[5])})"
                    state["count"] = int(str(state["count"])) + 1
                    state["steps"] = int(match[4])
                    if not match[5].upper().startswith("FROM "):
                        ran = state["ran"]
                        assert isinstance(ran, list)
                        ran.append(match[5])
                    progress(BuildEvent(kind="step", text=stage + match[5], step=int(match[3]),
                                        steps=int(match[4])))
                    return
                if line.startswith("--> Using cache"):
                    ran = state["ran"]
                    assert isinstance(ran, list)
                    if ran:
                        ran.pop()
                tail.add(line)
                progress(BuildEvent(kind="download" if line.lstrip().startswith("Downloading ")
                                    else "log", text=line))

            try:
                code = _stream(argv, stdin=None, env=self.env, on_line=on_line)
            except KeyboardInterrupt:
                self._remove_new_containers(before)
                raise
            if code != 0:
                self._remove_new_containers(before)
                error = next((m for m in map(_BUILDAH_ERROR_RE.fullmatch, reversed(tail.lines)) if m),
                             None)
                message = error[2] if error else (tail.lines[-1] if tail.lines else f"exit {code}")
                step = state["step"]
                raise _failure(str(step) if step else None, message, tuple(tail.lines))
            image_id = iidfile.read_text(encoding="ascii").strip()
        if not image_id.startswith("sha256:"):
            image_id = f"sha256:{image_id}"
        size = 0
        if self.loads:
            self.to_docker(tag, progress)
            size = _docker_size(self.docker, tag)
        ran = state["ran"]
        assert isinstance(ran, list)
        return BuildResult(image_id=image_id, tag=tag, size=size, seconds=time.monotonic() - started,
                           steps=int(str(state["count"])), backend=self.name, ran=tuple(ran))

    def containers(self) -> list[str]:
        done = subprocess.run([*self.base(), "containers", "--all", "--quiet", "--notruncate"],
                              capture_output=True, text=True, env=dict(self.env), check=False)
        return done.stdout.split() if done.returncode == 0 else []

    def _remove_new_containers(self, before: set[str]) -> None:
        for cid in set(self.containers()) - before:
            subprocess.run([*self.base(), "rm", cid], capture_output=True, env=dict(self.env),
                           check=False)

    def has_image(self, ref: str) -> bool:
        return self.image_id(ref) is not None

    def image_id(self, ref: str) -> str | None:
        """The ID (``sha256:…``, its config's digest, as the Docker engine's) of the image ``ref``
        names in buildah's storage, resolved as a FROM line resolves it; None when none."""
        done = subprocess.run([*self.base(), "inspect", "--type", "image", "--format", "{{.FromImageID}}",
                               ref], capture_output=True, text=True, env=dict(self.env), check=False)
        found = done.stdout.strip()
        if done.returncode != 0 or not found:
            return None
        return found if found.startswith("sha256:") else f"sha256:{found}"

    def _seed_bases(self, dockerfile: str, progress: Callable[[BuildEvent], None]) -> None:
        """Give buildah each FROM image as the Docker engine holds it, when the engine holds it
        (the base of a registry-less machine lives there); the rest buildah pulls itself.

        A tag is compared by image ID, not by name: a base rebuilt in the engine under the same
        tag is copied again, where a check for the tag alone left buildah building on its older
        copy without a word (docs/faults.md U16). Where the engine holds the tag, its image is
        the one built on, also over an image buildah itself built under that tag.

        A base pinned by digest (a lock's) comes from its registry, never from the engine: the
        engine's copy would be a different manifest, and ``docker-daemon:`` takes no digest. A
        loopback registry speaks plain HTTP, which ``buildah build`` will not pull from, so
        that one is pulled here with ``--tls-verify=false`` (the digest is still checked)."""
        stages = {m.split()[-1].lower() for m in re.findall(r"^FROM\s.*\sAS\s+\S+", dockerfile,
                                                             re.IGNORECASE | re.MULTILINE)}
        for ref in dict.fromkeys(_FROM_RE.findall(dockerfile)):
            if ref.lower() in stages:
                continue
            if "@sha256:" in ref:
                if _loopback(ref) and not self.has_image(ref):
                    self._pull_loopback(ref, progress)
                continue
            if self.docker is None:
                continue
            try:
                engine_id = str(self.docker.inspect_image(ref)["Id"])  # type: ignore[attr-defined]
            except Exception:  # not there: buildah uses its own copy or pulls it from its registry
                continue
            held = self.image_id(ref)
            if held == engine_id:
                continue
            again = "" if held is None else f" again (there {engine_id[7:19]}, buildah's copy {held[7:19]})"
            progress(BuildEvent(kind="download", text=f"copying {ref} from the Docker engine{again}"))
            copied = subprocess.run([*self.base(), "pull", f"docker-daemon:{ref}"],
                                    capture_output=True, text=True, env=dict(self.env), check=False)
            if copied.returncode != 0:
                raise BuildFailed(f"cannot copy base image {ref} from the Docker engine to buildah",
                                  details=tuple(copied.stderr.splitlines()[-LOG_TAIL:]))
            image_id = copied.stdout.split()[-1] if copied.stdout.split() else ref
            subprocess.run([*self.base(), "tag", image_id, ref], capture_output=True,
                           env=dict(self.env), check=False)

    def _pull_loopback(self, ref: str, progress: Callable[[BuildEvent], None]) -> None:
        progress(BuildEvent(kind="download", text=f"pulling {ref} (loopback registry, plain HTTP)"))
        pulled = subprocess.run([*self.base(), "pull", "--tls-verify=false", ref], capture_output=True,
                                text=True, env=dict(self.env), check=False)
        if pulled.returncode != 0:
            raise BuildFailed(f"cannot pull base image {ref} from its loopback registry",
                              details=tuple(pulled.stderr.splitlines()[-LOG_TAIL:]),
                              hint="start that registry (the lock pinned the base there), or lock "
                                   "again against one that answers")

    def to_docker(self, tag: str, progress: Callable[[BuildEvent], None]) -> None:
        """``buildah push TAG docker-daemon:TAG``: the image in the Docker engine too."""
        progress(BuildEvent(kind="log", text=f"copying {tag} to the Docker engine"))
        done = subprocess.run([*self.base(), "push", tag, f"docker-daemon:{_qualified(tag)}"],
                              capture_output=True, text=True, env=dict(self.env), check=False)
        if done.returncode != 0:
            raise BuildFailed(f"built {tag} with buildah but could not copy it to the Docker engine",
                              details=tuple(done.stderr.splitlines()[-LOG_TAIL:]))

    def push(self, tag: str, ref: str) -> str:
        """``buildah push`` to a registry; the manifest digest. The credentials Docker's client
        configuration holds for the registry go in a private ``--authfile`` (never on argv), and
        a loopback registry may answer over plain http (``--tls-verify=false``: https first)."""
        from envbuild.engine.publish import push_failed
        from envbuild.registry.credentials import credentials_for
        from envbuild.registry.reference import parse_reference

        registry = parse_reference(ref).registry
        credentials = credentials_for(registry, self.env)
        with _workdir() as work:
            digest_file = work / "digest"
            auth: list[str] = []
            if credentials is not None:
                authfile = work / "auth.json"
                authfile.touch(mode=0o600)
                authfile.write_bytes(credentials.authfile(registry))
                auth = ["--authfile", str(authfile)]
            argv = [*self.base(), "push", "--digestfile", str(digest_file), *auth,
                    *(["--tls-verify=false"] if _loopback(ref) else []), tag, f"docker://{ref}"]
            done = subprocess.run(argv, capture_output=True, text=True, env=dict(self.env),
                                  check=False)
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                raise push_failed(ref, registry, lines[-1] if lines else "", via="buildah push") \
                    .with_details(lines[-LOG_TAIL:])
            return digest_file.read_text(encoding="ascii").strip()


def _docker_size(client: object | None, tag: str) -> int:
    if client is None:
        return 0
    try:
        return int(client.inspect_image(tag).get("Size") or 0)  # type: ignore[attr-defined]
    except Exception:  # the size is a courtesy; the build itself succeeded
        return 0


def _qualified(tag: str) -> str:
    name = tag.rsplit("@", 1)[0]
    return tag if ":" in name.rsplit("/", 1)[-1] else f"{tag}:latest"


def _loopback(ref: str) -> bool:
    host = ref.split("/", 1)[0] if "/" in ref else ""
    return host.split(":")[0] in ("127.0.0.1", "localhost") or host.startswith("[::1]")


@dataclass(slots=True, kw_only=True)
class BuildxBuilder:
    """``docker buildx build --load``: the image lands in the Docker engine, as the SDK's does.

    Untested against a real buildx here (the plugin is not installed): its tests run a stand-in
    ``docker`` that records argv and replays a plain progress stream."""

    docker: object | None = None  # a Docker API client, for the loaded image's size
    program: str = "docker"
    nocache: bool = False
    name: str = "buildx"
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    platform: str | None = None  # --platform (linux/arm64 for an aarch64 target); None: the host's

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None],
              secrets: Mapping[str, bytes] | None = None,
              timestamp: int | None = None) -> BuildResult:
        started = time.monotonic()
        tail = _Tail()
        steps: dict[str, tuple[int, int, str]] = {}
        cached: set[str] = set()
        failed: list[str] = []
        with _workdir() as work:
            iidfile = work / "iid"
            env = dict(self.env)
            if timestamp is not None:  # BuildKit >= 0.11 reads it as a build arg
                env["SOURCE_DATE_EPOCH"] = str(timestamp)
            argv = [self.program, "buildx", "build", "--progress", "plain", "--load",
                    "--iidfile", str(iidfile), "--tag", tag,
                    *(["--platform", self.platform] if self.platform else []),
                    *(["--no-cache"] if self.nocache else []),
                    *(["--network", network] if network else []),
                    *(["--build-arg", f"SOURCE_DATE_EPOCH={timestamp}"] if timestamp is not None else []),
                    *[a for key, value in sorted(labels.items()) for a in ("--label", f"{key}={value}")],
                    *_secret_args(secrets or {}, work), "-"]

            def on_line(line: str) -> None:
                match = _BUILDX_STEP_RE.fullmatch(line)
                if match:
                    vertex, number, total = match[1], int(match[3]), int(match[4])
                    if vertex not in steps:
                        steps[vertex] = (number, total, match[5])
                        stage = f"[{match[2]}] " if match[2] else ""
                        progress(BuildEvent(kind="step", text=stage + match[5], step=number,
                                            steps=total))
                    return
                plain = _BUILDX_LINE_RE.fullmatch(line)
                if plain and plain[2] == "CACHED":
                    cached.add(plain[1])
                    return
                if plain and plain[2].startswith("ERROR") and plain[1] in steps:
                    failed.append(plain[1])
                tail.add(line)
                progress(BuildEvent(kind="log", text=line))

            with _file_backed(context, work) as stdin:
                code = _stream(argv, stdin=stdin, env=env, on_line=on_line)
            if code != 0:
                where = None
                if failed:
                    number, total, text = steps[failed[0]]
                    where = f"{number}/{total} ({short(text)})"
                message = next((line.split("ERROR:", 1)[1].strip() for line in reversed(tail.lines)
                                if "ERROR:" in line), f"docker buildx build exited {code}")
                if "unknown command" in message or "is not a docker command" in " ".join(tail.lines):
                    raise DockerUnavailable("the docker buildx plugin is not installed",
                                            hint="install it, or use --builder buildah|classic")
                raise _failure(where, message, tuple(tail.lines))
            image_id = iidfile.read_text(encoding="ascii").strip()
        ran = tuple(text for vertex, (_, _, text) in steps.items()
                    if vertex not in cached and not text.upper().startswith("FROM "))
        return BuildResult(image_id=image_id, tag=tag, size=_docker_size(self.docker, tag),
                           seconds=time.monotonic() - started,
                           steps=len(steps), backend=self.name, ran=ran)


def buildx_available(env: Mapping[str, str]) -> bool:
    """``docker buildx version`` answers (the plugin is installed)."""
    if shutil.which("docker", path=env.get("PATH")) is None:
        return False
    try:
        done = subprocess.run(["docker", "buildx", "version"], capture_output=True, env=dict(env),
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def buildah_available(env: Mapping[str, str]) -> bool:
    return shutil.which("buildah", path=env.get("PATH")) is not None
