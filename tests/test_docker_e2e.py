"""resolve → render → build → verify on a real Docker engine, plus the section-F
faults a real engine can show (docs/faults.md F). Needs dockerd (see DEVELOPERS.md); skipped without one.

The base image is made locally with debootstrap (scripts/base-image.sh): no registry is
reachable in CI. Its distribution python3 is 3.11, like a user's private mirror base.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemas
from conftest import tagged

from envbuild.engine import build
from envbuild.engine.context import context_tar
from envbuild.engine.daemon import LABEL, connect
from envbuild.engine.verify import VerifyOptions, verify
from envbuild.errors import BuildFailed, SmokeFailed

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
CPU_TAG = tagged("envbuild-test/cpu:2.13.0")
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def envbuild(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envbuild", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="session")
def client() -> Any:
    try:
        return connect(os.environ)
    except Exception as exc:  # any failure to reach a daemon means: not this machine
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):  # CI (.ci/run) must not skip these
            pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but no Docker engine answers: {exc}")
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="session")
def base_image(client: Any) -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh")], capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"scripts/base-image.sh failed: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def ours(client: Any) -> list[dict[str, Any]]:
    return list(client.containers(all=True, filters={"label": LABEL}))


def all_containers(client: Any) -> set[str]:
    return {c["Id"] for c in client.containers(all=True)}


@pytest.fixture(scope="session")
def cpu_image(client: Any, base_image: str) -> str:
    wheelhouse = os.environ.get("PIP_FIND_LINKS", "")
    if not (Path(wheelhouse) / TORCH_WHEEL).is_file():
        pytest.skip(f"no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    before = all_containers(client)
    args = ["build", "--torch", "==2.13.0", "--variant", "cpu", "--python", "3.11",
            # No CPU build of torchvision/torchaudio is reachable from CI: torch alone.
            "--no-companions",
            # W6: this image opts out of the compile toolchain (the locked image of test_lock_e2e
            # carries it and compiles); its smoke test must say torch.compile cannot work here.
            "--no-compile-toolchain",
            "--base-image", base_image, "--wheelhouse", wheelhouse, "--network", "host",
            "--tag", CPU_TAG]
    cert = os.environ.get("PIP_CERT")
    if cert:  # TLS here goes through an inspecting proxy whose CA the image must trust
        args += ["--ca-bundle", cert]
    done = envbuild(*args)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"built {CPU_TAG}" in done.stdout
    assert "[1/" in done.stderr  # live step progress
    assert all_containers(client) == before  # no intermediate container left
    return CPU_TAG


def test_cpu_image_labels_record_the_stack(client: Any, cpu_image: str) -> None:
    labels = client.inspect_image(cpu_image)["Config"]["Labels"]
    assert labels["dev.envbuild.torch"] == "2.13.0"
    assert labels["dev.envbuild.variant"] == "cpu"
    assert labels["dev.envbuild.python"] == "3.11"
    assert labels["dev.envbuild.compile-toolchain"] == "false"
    config = client.inspect_image(cpu_image)["Config"]
    assert config["User"] == "envbuild"
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]
    assert "ENVBUILD_COMPILE_TOOLCHAIN=0" in config["Env"]


def test_verify_cpu_ok_runs_the_cpu_checks_for_real(client: Any, cpu_image: str,
                                                    tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    done = envbuild("verify", cpu_image, "--cpu-ok", "--json", "--report", str(report_file))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    saved = json.loads(report_file.read_text())
    # The saved report is the smoke test's, plus what verify ran (image, digest, exit code).
    # platform: the image's, which it ran as; emulated: None, the engine's own platform (T15)
    assert saved.pop("envbuild.verify") == {"cpu_ok": True, "digest": None, "exit_code": 0,
                                            "image": cpu_image, "tier": None, "platform": "linux/amd64",
                                            "emulated": None}
    assert report == saved
    status = {c["name"]: c for c in report["checks"]}
    assert status["torch.import"]["status"] == "pass" and "2.13.0+cpu" in status["torch.import"]["message"]
    assert status["cpu.selfcheck"]["status"] == "pass"  # matmul, conv and an SGD step, on the CPU
    assert status["lock"]["status"] == "pass"  # the image's torch is the lock's
    assert status["torch.cuda_build"]["status"] == "skip"  # accepted, never passed
    # W6: built with --no-compile-toolchain, no compiler: torch.compile is reported, not passed
    compiled = status["torch.compile"]
    assert compiled["status"] == "warn", compiled
    assert "missing a C++ compiler" in compiled["message"] and "opted out" in compiled["message"]
    assert not [c for c in report["checks"] if c["status"] == "fail"]
    assert ours(client) == []


def test_plain_verify_fails_naming_the_missing_gpu(client: Any, cpu_image: str) -> None:
    done = envbuild("verify", cpu_image)
    assert done.returncode in (7, 8), done.stderr
    assert "GPU" in done.stderr
    assert ours(client) == []


def test_verify_without_gpus_names_the_cpu_only_wheel(client: Any, cpu_image: str) -> None:
    done = envbuild("verify", cpu_image, "--gpus", "none")
    assert done.returncode in (7, 8), done.stderr
    assert "CPU-only" in done.stderr + done.stdout
    assert ours(client) == []


# --- section F on a real engine ----------------------------------------------------------------


def tiny_build(client: Any, dockerfile: str, tag: str, **files: bytes) -> build.BuildResult:
    context = io.BytesIO()
    context_tar({"Dockerfile": dockerfile.encode(), **files}, context)
    return build.SdkBuilder(client=client).build(context, tag=tag, network="none", labels={},
                                                 progress=lambda event: None)


def test_failing_step_exit_6_leaves_no_container(client: Any, base_image: str) -> None:
    before = all_containers(client)
    with pytest.raises(BuildFailed) as info:
        tiny_build(client, f"FROM {base_image}\nRUN echo about to fail && exit 3\n",
                   "envbuild-test/fail:1")
    assert info.value.exit_code == 6
    assert "step 2/2" in info.value.message and "non-zero code: 3" in info.value.message
    assert "about to fail" in info.value.details
    assert all_containers(client) == before


def test_silent_step_longer_than_the_clients_timeout_does_not_time_out(client: Any, base_image: str) -> None:
    # connect() leaves the SDK's 60 s default on the client; the build must not inherit it (F5).
    # Whatever the client's time-out, the build sets its own: a client of 5 s and a step silent
    # for 8 s prove it as a 65 s step against the default did, in an eighth of the time.
    short = connect(os.environ, timeout=5.0)
    assert short.timeout == 5.0
    result = tiny_build(short, f"FROM {base_image}\nRUN sleep 8 && touch /done\n",
                        "envbuild-test/slow-step:1")
    assert result.image_id.startswith("sha256:")
    short.remove_image("envbuild-test/slow-step:1", force=True)


@pytest.fixture(scope="session")
def fake_smoke_images(client: Any, base_image: str) -> dict[str, str]:
    """Images shaped like envbuild's whose 'smoke test' hangs or eats memory."""
    images = {}
    for name, body in (("hang", "exec sleep 600"),
                       ("oom", "exec python3 -c 'x = bytearray(1 << 30); print(len(x))'")):
        script = f"#!/bin/sh\n{body}\n".encode()
        tag = f"envbuild-test/smoke-{name}:1"
        tiny_build(client, f"FROM {base_image}\nLABEL dev.envbuild.torch=0\n"
                           "COPY python /opt/venv/bin/python\nRUN chmod 755 /opt/venv/bin/python\n",
                   tag, python=script)
        images[name] = tag
    return images


def test_hanging_smoke_test_is_killed_at_the_deadline(client: Any,
                                                      fake_smoke_images: dict[str, str]) -> None:
    started = time.monotonic()
    with pytest.raises(SmokeFailed, match="timed out after 3 s") as info:
        verify(client, fake_smoke_images["hang"],
                     VerifyOptions(gpus="none", timeout=3), print)
    assert info.value.exit_code == 7 and time.monotonic() - started < 30
    assert ours(client) == []


def test_oom_smoke_test_is_exit_7(client: Any, fake_smoke_images: dict[str, str]) -> None:
    done = envbuild("verify", fake_smoke_images["oom"], "--gpus", "none", "--memory", "64m")
    assert done.returncode == 7
    assert "smoke test OOM-killed (limit 64m)" in done.stderr
    assert ours(client) == []


def test_sigint_during_build_exits_130_and_leaves_nothing(client: Any, base_image: str,
                                                          tmp_path: Path) -> None:
    # A base whose apt-get takes a minute: the first RUN step of the rendered recipe.
    tiny_build(client, f"FROM {base_image}\nCOPY apt-get /usr/local/bin/apt-get\n"
                       "RUN chmod 755 /usr/local/bin/apt-get\n", "envbuild-test/slow-apt:1",
               **{"apt-get": b"#!/bin/sh\nsleep 60\n"})
    before = all_containers(client)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envbuild", "build", "--variant", "cpu", "--torch", "==2.13.0",
         "--python", "3.11", "--no-companions", "--base-image", "envbuild-test/slow-apt:1",
         "--network", "none", "--tag", "envbuild-test/interrupted:1", "--no-cache"],  # the slow step runs
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = ""
    while "apt-get update" not in seen:  # the step is running
        line = proc.stderr.readline()
        assert line, f"build ended early: {seen}"
        seen += line
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    # communicate, not wait: both pipes drained, so no cleanup line can block on a full pipe
    try:
        _, rest = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # a build left running would finish its step into the layer cache
        raise
    assert proc.returncode == 130, seen + rest
    deadline = time.monotonic() + 30
    while all_containers(client) != before and time.monotonic() < deadline:
        time.sleep(1)
    assert all_containers(client) == before
    assert not client.images(name="envbuild-test/interrupted")


def test_clean_removes_leftovers_and_runs_warn_about_them(client: Any, cpu_image: str) -> None:
    client.create_container(cpu_image, command=["true"], labels={LABEL: "verify"})
    done = envbuild("verify", cpu_image, "--cpu-ok", "--tier", "0")
    assert done.returncode == 0, done.stderr
    assert "left by an earlier envbuild run" in done.stderr
    done = envbuild("clean")
    assert done.returncode == 0 and "removed 1 container(s)" in done.stdout
    assert ours(client) == []
    left = client.create_container(cpu_image, command=["true"], labels={LABEL: "verify"})
    done = envbuild("clean", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    schemas.check("clean.schema.json", document)
    assert [c[:12] for c in document["removed"]] == [left["Id"][:12]] and ours(client) == []


@pytest.fixture(autouse=True)
def _no_leftovers(client: Any) -> Iterator[None]:
    yield
    for container in ours(client):  # a failed test must not poison the next one
        client.remove_container(container["Id"], force=True)
