"""Build a rendered stack on a Docker engine, and verify an image with its baked smoke test.

``envbuild build`` renders the same context ``render docker`` writes, packs it into a
deterministic tar (sorted, owners and times zeroed: the same files give the same bytes, so
the daemon's cache holds) and hands it to a ``Builder``. The only builder today drives the
Docker SDK's classic builder; the ``Builder`` protocol is what a ``docker buildx`` backend
would implement, without callers changing.

``envbuild verify`` runs the image's smoke test in a throwaway container: GPUs requested,
shared memory for DataLoader workers, a memory limit, no network, a deadline. The container
carries ``LABEL`` so that whatever a crash leaves behind, ``envbuild clean`` finds it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from envbuild.errors import (
    BuildFailed,
    DockerUnavailable,
    GpuRuntimeMissing,
    SmokeFailed,
    UsageError,
)

if TYPE_CHECKING:
    from envbuild.fs import FileData
    from envbuild.render.docker import Out
    from envbuild.render.lock import Lock

# On every container envbuild creates; its value says which command made it.
LABEL = "dev.envbuild.managed"
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SMOKE_COMMAND = ("/opt/venv/bin/python", "/opt/envbuild/smoke.py",
                 "--lock", "/opt/envbuild/envbuild.lock", "--json")
GPU_RUNTIME_HINT = ("install the NVIDIA Container Toolkit, run 'nvidia-ctk runtime configure "
                    "--runtime=docker' and restart Docker")
_TAG_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
                     r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?", re.ASCII)
_SIZE_RE = re.compile(r"([0-9]+)([kmg]?)", re.ASCII | re.IGNORECASE)
_STEP_RE = re.compile(r"Step ([0-9]+)/([0-9]+) : (.*)", re.DOTALL)
LOG_TAIL = 25
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The classic builder's own bookkeeping lines: not what a failed step's reader needs.
_NOISE_RE = re.compile(r"\s*(---> |Removing intermediate container |Successfully tagged )")


# --- connecting -------------------------------------------------------------------------


def connect(env: Mapping[str, str], *, timeout: float = 60.0) -> Any:
    """A docker.APIClient for $DOCKER_HOST (else the default socket), already answering.

    No daemon, a refused socket or a permission problem is DockerUnavailable (exit 5)
    naming the address tried, with the hint that fits the cause."""
    import docker
    import docker.errors

    url = env.get("DOCKER_HOST") or DEFAULT_SOCKET
    try:
        kwargs = docker.utils.kwargs_from_env(environment=dict(env))
        client = docker.APIClient(timeout=timeout, version="auto", **kwargs)
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        raise _unavailable(url, exc) from None
    except Exception as exc:  # requests' connection errors carry no common base here
        raise _unavailable(url, exc) from None
    return client


def _unavailable(url: str, exc: BaseException) -> DockerUnavailable:
    text = str(exc)
    if "Permission denied" in text or isinstance(exc, PermissionError):
        return DockerUnavailable(
            f"permission denied on the Docker socket {url}",
            hint="add your user to the 'docker' group and log in again, or use rootless "
                 "Docker (DOCKER_HOST=unix://$XDG_RUNTIME_DIR/docker.sock)")
    return DockerUnavailable(f"cannot connect to Docker daemon at {url}",
                             hint="is dockerd running? set DOCKER_HOST to reach another one")


# --- the build context ------------------------------------------------------------------


def context_tar(files: Mapping[str, FileData], out: IO[bytes]) -> None:
    """Write ``files`` as a tar the same bytes every time: sorted, directories listed,
    owner 0:0 without names, mtime 0, modes 0644/0755. Paths are streamed, not read in."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(n).parent) for n in files if "/" in n})
        for name in dirs:
            info = _info(name, tarfile.DIRTYPE, 0o755, 0)
            tar.addfile(info)
        for name in sorted(files):
            data = files[name]
            if isinstance(data, Path):
                info = _info(name, tarfile.REGTYPE, 0o644, data.stat().st_size)
                with data.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                import io

                tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    out.flush()
    out.seek(0)


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# --- building ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildEvent:
    """One thing worth showing while building: a new step, a download, a log line."""

    kind: str  # "step" | "download" | "log"
    text: str
    step: int | None = None
    steps: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildResult:
    image_id: str
    tag: str
    size: int  # bytes, as the daemon reports the image
    seconds: float
    steps: int
    backend: str
    ran: tuple[str, ...] = ()  # the steps that executed rather than coming from the layer cache

    def to_json(self) -> dict[str, Any]:
        return {"image_id": self.image_id, "tag": self.tag, "size": self.size,
                "seconds": round(self.seconds, 1), "steps": self.steps, "backend": self.backend,
                "ran": list(self.ran)}


class Builder(Protocol):
    """What ``envbuild build`` needs from a backend. A ``docker buildx`` backend would
    implement this and take the same context tar."""

    name: str

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None]) -> BuildResult:
        ...


@dataclass(slots=True, kw_only=True)
class SdkBuilder:
    """The Docker SDK's classic builder (``POST /build``): no BuildKit-only syntax."""

    client: Any
    name: str = "docker-sdk"
    # Between two chunks of build output; a silent 3-minute pip download must not time out.
    read_timeout: float = 3600.0
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL))
    seen: list[tuple[int, str]] = field(default_factory=list)
    cached: set[int] = field(default_factory=set)

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None]) -> BuildResult:
        import docker.errors

        started = time.monotonic()
        step: tuple[int, int, str] | None = None
        image_id: str | None = None
        self.seen.clear()
        self.cached.clear()
        self.log.clear()
        try:
            stream = self.client.build(
                fileobj=context, custom_context=True, encoding=None, tag=tag, rm=True,
                forcerm=True,  # intermediate containers go even when a step fails
                network_mode=network, labels=dict(labels), decode=True, pull=False,
                timeout=self.read_timeout)
            for chunk in stream:
                step, image_id = self._event(chunk, step, image_id, progress)
        except docker.errors.APIError as exc:
            raise BuildFailed(_api_message(exc), details=tuple(self.log)) from None
        except BuildFailed:
            raise
        except (docker.errors.DockerException, OSError) as exc:
            raise BuildFailed(f"lost the Docker daemon during the build: {exc}") from None
        if image_id is None:
            raise BuildFailed("the daemon ended the build without an image",
                              details=tuple(self.log))
        size = int(self.client.inspect_image(image_id).get("Size") or 0)
        ran = tuple(text for number, text in self.seen
                    if number not in self.cached and not text.upper().startswith("FROM "))
        return BuildResult(image_id=image_id, tag=tag, size=size,
                           seconds=time.monotonic() - started,
                           steps=step[1] if step else 0, backend=self.name, ran=ran)

    def _event(self, chunk: Mapping[str, Any], step: tuple[int, int, str] | None,
               image_id: str | None, progress: Callable[[BuildEvent], None]
               ) -> tuple[tuple[int, int, str] | None, str | None]:
        if "error" in chunk:
            detail = chunk.get("errorDetail") or {}
            message = str(detail.get("message") or chunk["error"]).strip()
            raise _step_failure(message, step, tuple(self.log))
        if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            return step, str(chunk["aux"]["ID"])
        if "stream" in chunk:
            for raw in str(chunk["stream"]).splitlines():
                line = _ANSI_RE.sub("", raw).rstrip()
                if step is not None and line.strip() == "---> Using cache":
                    self.cached.add(step[0])
                if not line or _NOISE_RE.match(line):
                    continue
                match = _STEP_RE.fullmatch(line)
                if match:
                    step = (int(match[1]), int(match[2]), match[3])
                    self.seen.append((step[0], step[2]))
                    progress(BuildEvent(kind="step", text=match[3], step=step[0], steps=step[1]))
                    continue
                built = re.fullmatch(r"Successfully built ([0-9a-f]{12,64})", line)
                if built and image_id is None:
                    image_id = built[1]
                self.log.append(line)
                kind = "download" if line.lstrip().startswith("Downloading ") else "log"
                progress(BuildEvent(kind=kind, text=line))
        elif "status" in chunk:  # pulling the base image
            text = " ".join(str(chunk[k]) for k in ("id", "status", "progress") if chunk.get(k))
            progress(BuildEvent(kind="download", text=text))
        return step, image_id


def _step_failure(message: str, step: tuple[int, int, str] | None,
                  log: tuple[str, ...]) -> BuildFailed:
    lowered = message.lower()
    if any(s in lowered for s in ("manifest unknown", "not found", "toomanyrequests",
                                  "pull access denied", "unauthorized")) and \
            (step is None or step[2].upper().startswith("FROM")):
        image = step[2].split()[1] if step and len(step[2].split()) > 1 else "the base image"
        return BuildFailed(f"cannot get base image {image}: {message}", details=log,
                           hint="check the tag, or pass --base-image for a mirror you can reach")
    if "buildkit" in lowered or "unknown flag: mount" in lowered:
        return BuildFailed(f"the Dockerfile needs BuildKit, which the SDK's classic builder "
                           f"lacks: {message}", details=log)
    where = f"step {step[0]}/{step[1]} ({_short(step[2])})" if step else "the build"
    return BuildFailed(f"{where} failed: {message}", details=log,
                       hint="the last log lines follow; rerun with --verbose for all of them")


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _api_message(exc: Any) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def default_tag(lock: Lock) -> str:
    s = lock.stack
    tag = f"envbuild/torch:{s.torch}-{s.variant}-py{s.python}-{lock.flavor}"
    return tag.replace("+", "-")


def check_tag(text: str) -> str:
    if not _TAG_RE.fullmatch(text) or len(text) > 255:
        raise UsageError(f"--tag {text!r} is not a valid image name[:tag]",
                         hint="lowercase name parts, e.g. myorg/torch:2.4-cu121")
    return text


# --- leftovers --------------------------------------------------------------------------


def leftovers(client: Any) -> list[dict[str, Any]]:
    """Containers envbuild created that are no longer running."""
    found = client.containers(all=True, filters={"label": LABEL})
    return [c for c in found if c.get("State") != "running"]


def warn_leftovers(client: Any, warn: Callable[[str], None]) -> None:
    stale = leftovers(client)
    if stale:
        warn(f"{len(stale)} container(s) left by an earlier envbuild run; "
             "'envbuild clean' removes them")


def clean(client: Any) -> list[str]:
    """Remove every container labelled by envbuild (running ones too); their short ids."""
    removed = []
    for c in client.containers(all=True, filters={"label": LABEL}):
        client.remove_container(c["Id"], force=True)
        removed.append(str(c["Id"])[:12])
    return removed


# --- verifying --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyOptions:
    gpus: str = "all"  # "all" | a count | "none"
    cpu_ok: bool = False
    timeout: float = 600.0
    memory: str = "16g"
    shm_size: str = "2g"
    tier: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyResult:
    exit_code: int
    report: dict[str, Any] | None
    gpus_requested: bool
    stderr: str


def parse_size(text: str, flag: str) -> int:
    match = _SIZE_RE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"{flag} {text!r} is not a size", hint="e.g. 512m, 2g")
    return int(match[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2].lower()]


def _device_requests(gpus: str) -> list[Any]:
    import docker.types

    if gpus == "none":
        return []
    count = -1 if gpus == "all" else int(gpus)
    return [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]


def verify(client: Any, image: str, options: VerifyOptions,
           warn: Callable[[str], None]) -> VerifyResult:
    """Run the smoke test baked into ``image``; raise for what is not the test's verdict.

    GPU runtime missing → GpuRuntimeMissing (exit 8), unless ``cpu_ok``, which runs again
    without GPUs; timeout or OOM → SmokeFailed (exit 7) saying which. The container is
    removed in every case, after its logs were read."""
    import docker.errors

    try:
        config = client.inspect_image(image)
    except docker.errors.ImageNotFound:
        raise UsageError(f"no image {image!r} on this Docker engine",
                         hint="build it with 'envbuild build'") from None
    labels = (config.get("Config") or {}).get("Labels") or {}
    if "dev.envbuild.torch" not in labels:
        raise UsageError(f"image {image!r} was not built by envbuild (no dev.envbuild labels)")
    command = [*SMOKE_COMMAND, *(["--cpu-ok"] if options.cpu_ok else []),
               *(["--tier", str(options.tier)] if options.tier is not None else [])]
    gpus = options.gpus
    try:
        return _run(client, image, command, gpus, options)
    except GpuRuntimeMissing as exc:
        if not options.cpu_ok or gpus == "none" or "driver too old" in exc.message:
            raise
        warn(f"{exc.message}; --cpu-ok: running without GPUs")
        return _run(client, image, command, "none", options)


def _run(client: Any, image: str, command: list[str], gpus: str,
         options: VerifyOptions) -> VerifyResult:
    import docker.errors
    import requests.exceptions

    memory = parse_size(options.memory, "--memory")
    host = client.create_host_config(
        device_requests=_device_requests(gpus), network_mode="none", mem_limit=memory,
        memswap_limit=memory,  # no swap: an overrun is an OOM kill, not a crawl
        shm_size=parse_size(options.shm_size, "--shm-size"))
    container = client.create_container(image, command=command, host_config=host,
                                        labels={LABEL: "verify"}, network_disabled=True)
    cid = container["Id"]
    try:
        try:
            client.start(cid)
        except docker.errors.APIError as exc:
            raise _start_failure(_api_message(exc)) from None
        try:
            status = client.wait(cid, timeout=options.timeout)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            client.kill(cid)
            raise SmokeFailed(f"smoke test timed out after {options.timeout:g} s",
                              hint="raise --timeout, or lower --tier") from None
        code = int(status.get("StatusCode", 1))
        stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = client.logs(cid, stdout=False, stderr=True).decode("utf-8", "replace")
        state = client.inspect_container(cid).get("State") or {}
        if state.get("OOMKilled"):
            raise SmokeFailed(f"smoke test OOM-killed (limit {options.memory})",
                              hint="raise --memory", details=tuple(stderr.splitlines()[-5:]))
        report = _report(stdout)
        if report is None:
            raise SmokeFailed(f"smoke test exited {code} without a report",
                              details=tuple((stderr or stdout).splitlines()[-LOG_TAIL:]))
        return VerifyResult(exit_code=code, report=report, gpus_requested=gpus != "none",
                            stderr=stderr)
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.remove_container(cid, force=True)


def _start_failure(message: str) -> Exception:
    if "could not select device driver" in message:
        return GpuRuntimeMissing(f"no GPU runtime in Docker: {message}", hint=GPU_RUNTIME_HINT)
    match = re.search(r"unsatisfied condition: cuda>=([0-9.]+)", message)
    if match:
        return GpuRuntimeMissing(f"host driver too old for image CUDA {match[1]}",
                                 hint="upgrade the host driver, or render for this driver "
                                      "with 'envbuild build --driver <version>'")
    return SmokeFailed(f"smoke container did not start: {message}")


def _report(stdout: str) -> dict[str, Any] | None:
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(stdout[start:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def failures(report: Mapping[str, Any]) -> list[str]:
    """The failing checks' messages, in report order."""
    out = []
    for check in report.get("checks") or []:
        if isinstance(check, dict) and check.get("status") == "fail":
            out.append(f"{check.get('name', '?')}: {check.get('message', '')}".strip())
    return out


# --- command line -----------------------------------------------------------------------



def add_commands(commands: Any, add_selectors: Callable[[argparse.ArgumentParser], None],
                 parser_class: type[argparse.ArgumentParser]) -> None:
    from envbuild.render.docker import add_context_options, add_render_options

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
    from envbuild.render.docker import render_context

    tag = check_tag(args.tag) if args.tag else None
    lock, files = render_context(args, env)
    tag = tag or default_tag(lock)
    client = connect(env)
    warn_leftovers(client, lambda m: _err(f"envbuild: warning: {m}"))
    builder: Builder = SdkBuilder(client=client)
    network = None if args.network == "default" else args.network

    def progress(event: BuildEvent) -> None:
        if event.kind == "step":
            _err(f"[{event.step}/{event.steps}] {_short(event.text, 100)}")
        elif event.kind == "download" or args.verbose:
            _err(f"    {event.text}")

    with tempfile.TemporaryFile(prefix="envbuild-context-") as context:
        context_tar(files, context)
        try:
            result = builder.build(context, tag=tag, network=network,
                                   labels={"dev.envbuild.built-by": "envbuild build"},
                                   progress=progress)
        except KeyboardInterrupt:
            client.close()  # dropping the connection makes the daemon cancel the build
            raise
    if args.report:
        from envbuild.fs import write_file

        write_file(Path(args.report),
                     (json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n").encode())
    out(f"built {result.tag} ({result.image_id[:19]}, {result.size / 1e9:.2f} GB, "
        f"{result.seconds:.0f} s, {result.steps} steps)")
    return 0


def cmd_verify(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    if args.gpus not in ("all", "none") and not (args.gpus.isdigit() and int(args.gpus) > 0):
        raise UsageError(f"--gpus {args.gpus!r}: use all, none or a count")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    options = VerifyOptions(gpus=args.gpus, cpu_ok=args.cpu_ok, timeout=args.timeout,
                            memory=args.memory, shm_size=args.shm_size, tier=args.tier)
    parse_size(options.memory, "--memory")
    parse_size(options.shm_size, "--shm-size")
    client = connect(env, timeout=max(60.0, args.timeout + 30))
    warn_leftovers(client, lambda m: _err(f"envbuild: warning: {m}"))
    result = verify(client, args.image, options, lambda m: _err(f"envbuild: warning: {m}"))
    report = result.report or {}
    if args.report:
        from envbuild.fs import write_file

        write_file(Path(args.report), (json.dumps(report, indent=2) + "\n").encode())
    if args.json:
        out(json.dumps(report, indent=2))
    else:
        from envbuild.smoke import render_text

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
    removed = clean(connect(env))
    out(f"removed {len(removed)} container(s)" + (f": {' '.join(removed)}" if removed else ""))
    return 0
