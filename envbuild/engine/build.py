"""Build a rendered stack's image on a Docker engine.

``build_image`` packs the build context into a deterministic tar (``engine.context``) and
hands it to a ``Builder``: the Docker SDK's classic builder here, ``docker buildx`` and
``buildah`` in ``engine.builders`` (BuildKit syntax: secrets and cache mounts). Progress goes
to a callback: only the commands layer prints.
"""

from __future__ import annotations

import collections
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

from envbuild.engine.context import context_tar
from envbuild.engine.daemon import LOG_TAIL, api_message
from envbuild.errors import BuildFailed, UsageError

if TYPE_CHECKING:
    from envbuild.fs import FileData
    from envbuild.render.lock import Lock

_TAG_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
                     r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?", re.ASCII)
_STEP_RE = re.compile(r"Step ([0-9]+)/([0-9]+) : (.*)", re.DOTALL)
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The classic builder's own bookkeeping lines: not what a failed step's reader needs.
_NOISE_RE = re.compile(r"\s*(---> |Removing intermediate container |Successfully tagged )")


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
    """What ``envbuild build`` needs from a backend; each takes the same context tar.
    ``secrets`` (id → bytes) and ``timestamp`` (SOURCE_DATE_EPOCH) only for BuildKit-syntax
    builders; the classic one refuses secrets."""

    name: str

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None],
              secrets: Mapping[str, bytes] | None = None,
              timestamp: int | None = None) -> BuildResult:
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
    nocache: bool = False  # build every step again (a reproducibility check, a poisoned cache)
    platform: str | None = None  # the daemon's --platform (linux/arm64 for an aarch64 target)

    def build(self, context: IO[bytes], *, tag: str, network: str | None,
              labels: Mapping[str, str], progress: Callable[[BuildEvent], None],
              secrets: Mapping[str, bytes] | None = None,
              timestamp: int | None = None) -> BuildResult:
        import docker.errors

        if secrets:
            raise UsageError("the classic builder takes no build secrets",
                             hint="use --builder buildx or buildah")
        del timestamp  # the classic builder has no reproducible-timestamp option

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
                nocache=self.nocache,
                timeout=self.read_timeout, **({"platform": self.platform} if self.platform else {}))
            for chunk in stream:
                step, image_id = self._event(chunk, step, image_id, progress)
        except docker.errors.APIError as exc:
            raise BuildFailed(api_message(exc), details=tuple(self.log)) from None
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
    where = f"step {step[0]}/{step[1]} ({short(step[2])})" if step else "the build"
    return BuildFailed(f"{where} failed: {message}", details=log, hint=log_hint(log))


# What a step's log says when TLS verification failed: Python's ssl (pip, uv's Python builds),
# OpenSSL's own words (curl, apt over https), rustls (uv).
_TLS_FAILURES = ("certificate_verify_failed", "certificate verify failed", "self-signed certificate in "
                 "certificate chain", "self signed certificate in certificate chain",
                 "unable to get local issuer certificate", "invalid peer certificate: unknownissuer")


def tls_failure(error: BuildFailed) -> bool:
    """Whether a failed build's message or log tail shows a failed TLS verification."""
    return any(marker in line.lower() for line in (error.message, *error.details) for marker in _TLS_FAILURES)


def log_hint(log: tuple[str, ...]) -> str:
    """The hint of a failed step: it promises log lines only when some follow."""
    if log:
        return "the last log lines follow; rerun with --verbose for all of them"
    return "the step printed nothing; rerun with --verbose to see the whole build"


def short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def default_tag(lock: Lock) -> str:
    s = lock.stack
    tag = f"envbuild/torch:{s.torch}-{s.variant}-py{s.python}-{lock.flavor}"
    return tag.replace("+", "-")


def check_tag(text: str) -> str:
    if not _TAG_RE.fullmatch(text) or len(text) > 255:
        raise UsageError(f"--tag {text!r} is not a valid image name[:tag]",
                         hint="lowercase name parts, e.g. myorg/torch:2.4-cu121")
    return text


def build_image(builder: Builder, files: Mapping[str, FileData], *, tag: str,
                network: str | None, progress: Callable[[BuildEvent], None],
                on_interrupt: Callable[[], None] = lambda: None, buildkit: bool = False,
                timestamp: int | None = None) -> BuildResult:
    """Build ``files`` (a rendered context) as ``tag``. ``on_interrupt`` runs on Ctrl-C
    before it propagates: closing the client makes the daemon cancel the build.
    ``buildkit``: the context was rendered with BuildKit syntax, so its CA bundle goes to the
    builder as the secret ``ca`` and not into the context tar."""
    from envbuild.render.docker import CA_BUNDLE_NAME

    secrets: dict[str, bytes] = {}
    if buildkit and CA_BUNDLE_NAME in files:
        bundle = files[CA_BUNDLE_NAME]
        secrets["ca"] = bundle if isinstance(bundle, bytes) else bundle.read_bytes()
        files = {name: data for name, data in files.items() if name != CA_BUNDLE_NAME}
    with tempfile.TemporaryFile(prefix="envbuild-context-") as context:
        context_tar(files, context)
        try:
            return builder.build(context, tag=tag, network=network,
                                 labels={"dev.envbuild.built-by": "envbuild build"},
                                 progress=progress, secrets=secrets or None,
                                 timestamp=timestamp)
        except KeyboardInterrupt:
            on_interrupt()
            raise
