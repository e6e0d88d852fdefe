"""Run an image's baked smoke test in a throwaway container and read its verdict.

GPUs requested, shared memory for DataLoader workers, a memory limit, no network, a
deadline; the container carries ``LABEL`` and is removed in every case.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envbuild.engine.daemon import LABEL, LOG_TAIL, api_message
from envbuild.errors import GpuRuntimeMissing, SmokeFailed, UsageError
from envbuild.resolver.model import PLATFORMS
from envbuild.smoke.t2_speed import EMULATED_ENV  # the payload then judges no speed

SMOKE_COMMAND = ("/opt/venv/bin/python", "/opt/envbuild/smoke.py",
                 "--lock", "/opt/envbuild/envbuild.lock", "--json")
GPU_RUNTIME_HINT = ("install the NVIDIA Container Toolkit, run 'nvidia-ctk runtime configure "
                    "--runtime=docker' and restart Docker")
_SIZE_RE = re.compile(r"([0-9]+)([kmg]?)", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyOptions:
    gpus: str = "all"  # "all" | a count | "none"
    cpu_ok: bool = False
    timeout: float = 600.0
    memory: str = "16g"
    shm_size: str = "2g"
    tier: int | None = None
    platform: str | None = None  # linux/amd64 | linux/arm64: the image must be of it


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyResult:
    exit_code: int
    report: dict[str, Any] | None
    gpus_requested: bool
    stderr: str
    platform: str | None = None  # the image's, linux/arm64: run as exactly this architecture
    emulated: str | None = None  # "linux/arm64 on a linux/amd64 host" when the engine emulates it


def check_options(options: VerifyOptions) -> None:
    """Reject what no run could honour, before a daemon is asked for anything."""
    gpus = options.gpus
    if gpus not in ("all", "none") and not (gpus.isdigit() and int(gpus) > 0):
        raise UsageError(f"--gpus {gpus!r}: use all, none or a count")
    if options.timeout <= 0:
        raise UsageError("--timeout must be positive")
    parse_size(options.memory, "--memory")
    parse_size(options.shm_size, "--shm-size")
    if options.platform is not None and options.platform not in PLATFORMS:
        raise UsageError(f"unknown platform {options.platform!r}", hint=f"use {' or '.join(PLATFORMS)}")


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
                         hint="build it with 'envbuild build'; one built with --no-load is in "
                              "buildah's storage: verify the REF@sha256:… its --push printed") from None
    labels = (config.get("Config") or {}).get("Labels") or {}
    if "dev.envbuild.torch" not in labels:
        raise UsageError(f"image {image!r} was not built by envbuild (no dev.envbuild labels)")
    platform = image_platform(config)
    if options.platform is not None and platform != options.platform:
        found = platform or "of no recorded platform"
        raise UsageError(f"image {image!r} is {found}, not {options.platform}",
                         hint="verify the image built for that platform (a multi-arch REF@sha256:… "
                              "not yet pulled is pulled for it)")
    host = engine_platform(client)
    emulated = f"{platform} on a {host} host" if platform and host and platform != host else None
    if emulated:
        warn(f"image {image} is {platform}, this Docker engine {host}: the smoke test runs under "
             "emulation (qemu); its speed and host balance are not judged")
    command = [*SMOKE_COMMAND, *(["--cpu-ok"] if options.cpu_ok else []),
               *(["--tier", str(options.tier)] if options.tier is not None else [])]
    gpus = options.gpus
    try:
        return _run(client, image, command, gpus, options, platform, emulated)
    except GpuRuntimeMissing as exc:
        if not options.cpu_ok or gpus == "none" or "driver too old" in exc.message:
            raise
        warn(f"{exc.message}; --cpu-ok: running without GPUs")
        return _run(client, image, command, "none", options, platform, emulated)


def image_platform(config: Mapping[str, Any]) -> str | None:
    """``os/architecture`` of an inspected image's config (linux/arm64), None when it names none."""
    os_name, arch = config.get("Os"), config.get("Architecture")
    if not (isinstance(os_name, str) and isinstance(arch, str) and os_name and arch):
        return None
    return f"{os_name}/{arch}"


def engine_platform(client: Any) -> str | None:
    """The Docker engine's own ``os/architecture`` (its version's Os and Arch: linux/amd64)."""
    import docker.errors

    try:
        version = client.version()
    except docker.errors.APIError:
        return None
    os_name, arch = version.get("Os"), version.get("Arch")
    return f"{os_name}/{arch}" if isinstance(os_name, str) and isinstance(arch, str) else None


def _run(client: Any, image: str, command: list[str], gpus: str, options: VerifyOptions,
         platform: str | None, emulated: str | None) -> VerifyResult:
    import docker.errors
    import requests.exceptions

    memory = parse_size(options.memory, "--memory")
    host = client.create_host_config(
        device_requests=_device_requests(gpus), network_mode="none", mem_limit=memory,
        memswap_limit=memory,  # no swap: an overrun is an OOM kill, not a crawl
        shm_size=parse_size(options.shm_size, "--shm-size"))
    # The image's platform, given: a multi-arch name never runs another architecture's manifest.
    container = client.create_container(image, command=command, host_config=host,
                                        labels={LABEL: "verify"}, network_disabled=True,
                                        platform=platform,
                                        environment={EMULATED_ENV: emulated} if emulated else None)
    cid = container["Id"]
    try:
        try:
            client.start(cid)
        except docker.errors.APIError as exc:
            raise _start_failure(api_message(exc)) from None
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
        if emulated and isinstance(report.get("host"), dict):  # an older payload's report too
            report["host"]["emulated"] = emulated
        return VerifyResult(exit_code=code, report=report, gpus_requested=gpus != "none",
                            stderr=stderr, platform=platform, emulated=emulated)
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
