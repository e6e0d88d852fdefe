"""Builders behind ``--builder`` without a real engine (docs/faults.md J): the BuildKit-syntax
Dockerfile, ``docker buildx build`` driven through a stand-in ``docker`` that records its argv
and replays a plain progress stream (the buildx plugin is not installed here), the CA bundle
kept out of the context, and promote's refusal of reports that prove nothing."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import stat
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.engine import build as buildmod
from envbuild.engine.builders import BuildahBuilder, BuildxBuilder
from envbuild.engine.context import context_tar
from envbuild.errors import BuildFailed, DockerUnavailable, UsageError
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render.templates import environment
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

DIGEST = "sha256:" + "ab" * 32
PEM = b"-----BEGIN CERTIFICATE-----\nTUlJQ2FrZQ==\n-----END CERTIFICATE-----\n"

# What `docker buildx build --progress plain` prints (BuildKit's plain progress format), for a
# two-stage build whose second RUN fails.
BUILDX_PLAIN = """\
#0 building with "default" instance using docker driver
#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#4 [envbuild-build 1/3] FROM docker.io/library/debian:bookworm
#4 CACHED
#5 [envbuild-build 2/3] RUN apt-get update
#5 0.312 Get:1 bookworm InRelease
#5 DONE 2.1s
#6 [envbuild-build 3/3] RUN pip install x
#6 0.501 Collecting torch==2.13.0
#6 0.902 about to fail
#6 ERROR: process "/bin/sh -c pip install x" did not complete successfully: exit code: 3
------
 > [envbuild-build 3/3] RUN pip install x:
------
ERROR: failed to solve: process "/bin/sh -c pip install x" did not complete successfully: exit code: 3
"""
BUILDX_OK = """\
#4 [1/2] FROM docker.io/library/debian:bookworm
#4 CACHED
#5 [2/2] RUN echo hi
#5 0.2 hi
#5 DONE 0.3s
#6 exporting to image
#6 DONE 0.1s
"""


@pytest.fixture(scope="module")
def cpu_lock() -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cpu", ubuntu="22.04"), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


def runs(dockerfile: str) -> list[tuple[str, str]]:
    """(stage, RUN line) for each RUN, the stage named by its FROM's AS (or 'final')."""
    stage, out = "", []
    for line in dockerfile.splitlines():
        if line.startswith("FROM "):
            stage = line.split(" AS ")[1] if " AS " in line else "final"
        elif line.startswith("RUN "):
            out.append((stage, line))
    return out


def test_buildkit_dockerfile_mounts_the_ca_as_a_secret_never_a_file(cpu_lock: lockmod.Lock,
                                                                    tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(PEM)
    options = render.parse_options(ca_bundle=str(bundle), pip_packages=["six"], companions=False)
    classic = render.render_docker(cpu_lock, options)
    files = render.render_docker(cpu_lock, render.RenderOptions(**{
        **{f: getattr(options, f) for f in options.__dataclass_fields__}, "buildkit": True}))
    text = files["Dockerfile"]
    assert isinstance(text, bytes) and isinstance(classic["Dockerfile"], bytes)
    dockerfile = text.decode()
    assert "COPY ca-bundle.crt" not in dockerfile and "COPY ca-bundle.crt" in classic["Dockerfile"].decode()
    # One stage: the bundle is a secret, so no throw-away stage and no second copy of the venv
    # (the classic builder still needs both). Every RUN that reaches the network mounts it.
    assert {stage for stage, _ in runs(dockerfile)} == {"final"}
    assert "COPY --from=" not in dockerfile and "COPY --from=envbuild-build" in classic["Dockerfile"].decode()
    network = [line for _, line in runs(dockerfile) if "apt-get update" in line or "pip install" in line]
    assert len(network) == 2  # apt-get, torch's pip
    assert all(line.startswith(f"RUN --mount=type=secret,id=ca,target={render.CA_SECRET_PATH} ")
               for line in network)
    assert f"ARG PIP_CERT={render.CA_SECRET_PATH}" in dockerfile
    # pip's downloads are kept in a cache mount, so pip must not be told to drop them.
    pip_runs = [line for _, line in runs(dockerfile) if "/bin/pip install" in line]
    assert pip_runs and all("--mount=type=cache,target=/root/.cache/pip" in line for line in pip_runs)
    assert "--no-cache-dir" not in dockerfile and "--no-cache-dir" in classic["Dockerfile"].decode()
    # The bundle stays in the rendered files (for a hand build's --secret) but not in the context.
    assert files[render.CA_BUNDLE_NAME] == PEM
    assert "!ca-bundle.crt" not in files[".dockerignore"].decode()  # type: ignore[union-attr]
    assert "!ca-bundle.crt" in classic[".dockerignore"].decode()  # type: ignore[union-attr]


def test_buildkit_closure_layers_use_the_cache_and_the_secret(cpu_lock: lockmod.Lock) -> None:
    ctx = render.context(cpu_lock, ca_bundle=True, buildkit=True, project_requirements=True)
    ctx.update(closure=True, pylock_file="pylock.toml")
    dockerfile = environment().get_template("Dockerfile.j2").render(ctx)
    locked = [line for _, line in runs(dockerfile) if "--require-hashes" in line]
    assert len(locked) == 2  # requirements/torch.txt and requirements/project.txt
    for line in locked:
        assert "--mount=type=cache,target=/root/.cache/pip" in line
        assert "--mount=type=secret,id=ca" in line
        assert "--no-deps --no-index --require-hashes" in line and "--no-cache-dir" not in line


@pytest.mark.parametrize("buildkit", [True, False])
def test_closure_layers_installed_by_uv_keep_no_uv_and_cache_only_in_a_mount(cpu_lock: lockmod.Lock,
                                                                            buildkit: bool) -> None:
    ctx = render.context(cpu_lock, ca_bundle=True, buildkit=buildkit, project_requirements=True)
    ctx.update(closure=True, pylock_file="pylock.toml", installer="uv")
    dockerfile = environment().get_template("Dockerfile.j2").render(ctx)
    locked = [line for _, line in runs(dockerfile) if "--require-hashes" in line]
    assert len(locked) == 2
    # Each RUN step up to its last line (a line not ending in a backslash).
    steps = [re.match(r"(?:[^\n]*\\\n)*[^\n]*", part).group(0)  # type: ignore[union-attr]
             for part in dockerfile.split("\nRUN ")[1:]]
    uv_steps = [step for step in steps if "/tmp/envbuild/uv/bin/uv pip install" in step]
    assert len(uv_steps) == 2
    for step in uv_steps:
        # uv comes from the lock's hash-pinned wheel and leaves with the step that used it.
        assert "--only-binary :all: \\\n    --target /tmp/envbuild/uv -r /tmp/envbuild/installer.txt" in step
        assert step.endswith("&& rm -rf /tmp/envbuild")
        assert "--no-deps --no-index --require-hashes --only-binary :all: --compile-bytecode" in step
        # uv's 60 s for a compiling Python to start is too short under QEMU on a busy builder.
        assert "&& UV_COMPILE_BYTECODE_TIMEOUT=600 /tmp/envbuild/uv/bin/uv pip install" in step
        if buildkit:  # uv's cache lives in a cache mount, never in the layer
            assert step.startswith("--mount=type=secret,id=ca")
            assert "--mount=type=cache,target=/root/.cache/uv" in step
            assert "UV_LINK_MODE=copy" in step and "uv pip install --no-config --python" in step
        else:
            assert "--mount" not in step and "uv pip install --no-config --no-cache --python" in step
    assert "COPY requirements/installer.txt requirements/torch.txt /tmp/envbuild/" in dockerfile


def test_build_image_passes_the_bundle_as_a_secret_and_not_in_the_context() -> None:
    seen: dict[str, object] = {}

    class Recorder:
        name = "recorder"

        def build(self, context, *, tag, network, labels, progress, secrets=None,  # type: ignore[no-untyped-def]
                  timestamp=None):
            with tarfile.open(fileobj=context) as tar:
                seen["names"] = tar.getnames()
            seen["secrets"], seen["timestamp"] = secrets, timestamp
            return buildmod.BuildResult(image_id=DIGEST, tag=tag, size=0, seconds=0, steps=0,
                                        backend=self.name)

    files = {"Dockerfile": b"FROM x\n", render.CA_BUNDLE_NAME: PEM}
    buildmod.build_image(Recorder(), files, tag="t:1", network=None, progress=lambda e: None,
                         buildkit=True, timestamp=0)
    assert seen == {"names": ["Dockerfile"], "secrets": {"ca": PEM}, "timestamp": 0}
    buildmod.build_image(Recorder(), files, tag="t:1", network=None, progress=lambda e: None)
    assert render.CA_BUNDLE_NAME in seen["names"] and seen["secrets"] is None  # type: ignore[operator]


def test_the_classic_builder_refuses_secrets() -> None:
    with pytest.raises(Exception, match="no build secrets"):
        buildmod.SdkBuilder(client=object()).build(io.BytesIO(), tag="t:1", network=None, labels={},
                                                   progress=lambda e: None, secrets={"ca": PEM})


def stub(directory: Path, name: str, replay: str, code: int) -> Path:
    """A stand-in program that records its argv and stdin, prints ``replay`` and exits ``code``
    (writing the --iidfile it was given when it succeeds)."""
    (directory / "replay.txt").write_text(replay)
    script = directory / name
    script.write_text(f"""#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
data = sys.stdin.buffer.read() if "-" in args else b""
with open({str(directory / 'argv.jsonl')!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "stdin": len(data), "tar": data[257:262].decode("latin-1")}}) + "\\n")
if "build" in args:
    sys.stdout.write(open({str(directory / 'replay.txt')!r}).read())
elif "info" in args:  # buildah info --format {{{{.store.GraphDriverName}}}}
    print(os.environ.get("STORAGE_DRIVER") or "overlay")
    sys.exit(0)
else:
    sys.exit(1)  # containers, inspect: nothing there
if {code} == 0 and "--iidfile" in args:
    open(args[args.index("--iidfile") + 1], "w").write({DIGEST!r})
sys.exit({code})
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def calls(directory: Path) -> list[dict[str, Any]]:
    lines = (directory / "argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def context_of(dockerfile: str) -> io.BytesIO:
    out = io.BytesIO()
    context_tar({"Dockerfile": dockerfile.encode()}, out)
    return out


def test_buildx_argv_and_progress_from_its_plain_stream(tmp_path: Path) -> None:
    program = stub(tmp_path, "docker", BUILDX_OK, 0)
    events: list[buildmod.BuildEvent] = []
    result = BuildxBuilder(program=str(program), env=dict(os.environ)).build(
        context_of("FROM x\n"), tag="envbuild-test/x:1", network="host",
        labels={"dev.envbuild.built-by": "envbuild build"}, progress=events.append,
        secrets={"ca": PEM}, timestamp=0)
    recorded = calls(tmp_path)[-1]
    argv = recorded["argv"]
    assert argv[:6] == ["buildx", "build", "--progress", "plain", "--load", "--iidfile"]
    assert argv[-1] == "-" and recorded["stdin"] > 0 and recorded["tar"] == "ustar"  # the context tar
    assert argv[argv.index("--tag") + 1] == "envbuild-test/x:1"
    assert argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--build-arg") + 1] == "SOURCE_DATE_EPOCH=0"
    assert argv[argv.index("--label") + 1] == "dev.envbuild.built-by=envbuild build"
    secret = argv[argv.index("--secret") + 1]
    assert re.fullmatch(r"id=ca,src=.*/secret-ca", secret)
    assert not Path(secret.split("src=")[1]).exists()  # its temporary directory is gone
    assert result.image_id == DIGEST and result.backend == "buildx" and result.steps == 2
    assert result.ran == ("RUN echo hi",)  # FROM was cached
    assert [(e.step, e.steps, e.text) for e in events if e.kind == "step"] == [
        (1, 2, "FROM docker.io/library/debian:bookworm"), (2, 2, "RUN echo hi")]


def test_buildx_failing_step_is_exit_6_naming_the_step_with_the_log_tail(tmp_path: Path) -> None:
    program = stub(tmp_path, "docker", BUILDX_PLAIN, 1)
    with pytest.raises(BuildFailed) as info:
        BuildxBuilder(program=str(program), env=dict(os.environ)).build(
            context_of("FROM x\n"), tag="t:1", network=None, labels={}, progress=lambda e: None)
    assert info.value.exit_code == 6
    assert info.value.message.startswith("step 3/3 (RUN pip install x) failed")
    assert "exit code: 3" in info.value.message
    assert any("about to fail" in line for line in info.value.details)


def test_buildx_missing_plugin_is_exit_5(tmp_path: Path) -> None:
    program = stub(tmp_path, "docker", "docker: 'buildx' is not a docker command.\n", 1)
    with pytest.raises(DockerUnavailable) as info:
        BuildxBuilder(program=str(program), env=dict(os.environ)).build(
            context_of("FROM x\n"), tag="t:1", network=None, labels={}, progress=lambda e: None)
    assert info.value.exit_code == 5 and "buildx" in info.value.message


def test_buildx_ctrl_c_stops_its_process_group_and_removes_the_secret(tmp_path: Path) -> None:
    """docs/faults.md J5: Ctrl-C while buildx runs: the program (its own session) gets SIGTERM
    and is waited for, the secret's temporary directory goes, and the interrupt propagates
    (the command then exits 130, as for every builder)."""
    marker = tmp_path / "terminated"
    seen = tmp_path / "secret-path"
    program = tmp_path / "docker"
    program.write_text(f"""#!/usr/bin/env python3
import os, signal, sys, time
args = sys.argv[1:]
sys.stdin.buffer.read()
open({str(seen)!r}, "w").write(args[args.index("--secret") + 1].split("src=", 1)[1])
def stop(signum, frame):
    open({str(marker)!r}, "w").write(str(os.getpgrp() == os.getpid()))
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("#4 [1/2] FROM docker.io/library/debian:bookworm", flush=True)
time.sleep(60)
""")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)

    def interrupt(event: buildmod.BuildEvent) -> None:
        if event.kind == "step":  # the program is running: Ctrl-C reaches envbuild alone
            # to the main thread, as a Ctrl-C reaches the command's only thread: os.kill of the
            # process may be taken by another thread (pytest-xdist's I/O thread), and the main
            # thread then sleeps in its read of the program's output until the program ends
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        BuildxBuilder(program=str(program), env=dict(os.environ)).build(
            context_of("FROM x\n"), tag="t:1", network=None, labels={}, progress=interrupt,
            secrets={"ca": PEM})
    assert time.monotonic() - started < 30  # stopped, not waited out
    assert marker.read_text() == "True"  # SIGTERM reached the program, leader of its own group
    assert not Path(seen.read_text()).exists()  # the CA bundle's temporary copy is gone


def test_buildah_failing_step_is_exit_6_from_its_output(tmp_path: Path) -> None:
    replay = ("[2/2] STEP 1/2: FROM base\n[2/2] STEP 2/2: RUN echo about to fail && exit 3\n"
              "about to fail\nsubprocess exited with status 3\n"
              'Error: building at STEP "RUN echo about to fail && exit 3": exit status 3\n')
    program = stub(tmp_path, "buildah", replay, 1)
    builder = BuildahBuilder(program=str(program), env=dict(os.environ))
    with pytest.raises(BuildFailed) as info:
        builder.build(context_of("FROM base\n"), tag="t:1", network=None, labels={},
                      progress=lambda e: None, secrets={"ca": PEM}, timestamp=0)
    assert info.value.exit_code == 6
    assert info.value.message == ("step [2/2] 2/2 (RUN echo about to fail && exit 3) failed: "
                                  "exit status 3")
    assert "about to fail" in info.value.details


@pytest.mark.parametrize("env, head, layers, isolation", [
    # buildah's configured driver (the stand-in says overlay): its layer cache is on
    ({}, ["build"], True, "chroot"),
    # STORAGE_DRIVER is passed on; vfs would keep a whole root file system per cached step
    ({"STORAGE_DRIVER": "vfs"}, ["--storage-driver", "vfs", "build"], False, "chroot"),
    ({"STORAGE_DRIVER": "overlay", "BUILDAH_ISOLATION": "oci"},
     ["--storage-driver", "overlay", "build"], True, "oci"),
])
def test_buildah_build_argv(tmp_path: Path, env: dict[str, str], head: list[str], layers: bool,
                            isolation: str) -> None:
    program = stub(tmp_path, "buildah", "STEP 1/1: FROM base\n", 0)
    environ = {k: v for k, v in os.environ.items() if k not in ("STORAGE_DRIVER", "BUILDAH_ISOLATION")}
    builder = BuildahBuilder(program=str(program), env={**environ, **env})
    result = builder.build(context_of("FROM base\n"), tag="t:1", network="host",
                           labels={"k": "v"}, progress=lambda e: None, secrets={"ca": PEM},
                           timestamp=0)
    argv = next(c["argv"] for c in calls(tmp_path) if "build" in c["argv"])
    assert argv[:len(head)] == head
    assert ("--layers" in argv) is layers and ("--force-rm" in argv) is layers
    for option in (["--isolation", isolation], ["--timestamp", "0"],
                   ["--network", "host"], ["--label", "k=v"], ["--tag", "t:1"]):
        assert any(argv[i:i + len(option)] == option for i in range(len(argv))), option
    assert result.image_id == DIGEST


@pytest.mark.parametrize("report, code, text", [
    ({"envbuild.verify": {"digest": "sha256:" + "cd" * 32, "exit_code": 0}}, 2, "not sha256:abab"),
    ({"envbuild.verify": {"digest": DIGEST, "exit_code": 7}}, 7, "did not pass"),
    ({"checks": []}, 2, "not a report of 'envbuild verify --report'"),
])
def test_promote_refuses_a_report_that_does_not_prove_this_digest_passed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], report: dict[str, object], code: int,
        text: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert main(["promote", f"127.0.0.1:1/x@{DIGEST}", "stable", "--verified-report", str(path)]) == code
    assert text in capsys.readouterr().err


GPU_RUN = {"torch": {"devices": [{"index": 0, "name": "NVIDIA A10"}]},
           "checks": [{"name": "matmul_fp32", "gpu": True, "status": "pass"}]}
CPU_RUN = {"torch": {}, "checks": [{"name": "torch_import", "gpu": False, "status": "pass"}]}


@pytest.mark.parametrize("report, cpu_ok, allow, code", [
    (CPU_RUN, True, False, 2),   # verify --cpu-ok: refused
    (CPU_RUN, False, False, 2),  # no GPU seen, no GPU check passed: refused
    ({**GPU_RUN, "checks": [{"gpu": True, "status": "skip"}]}, False, False, 2),
    (CPU_RUN, True, True, 4),    # --allow-cpu-report: on to the registry (none at 127.0.0.1:1)
    (GPU_RUN, False, False, 4),  # a GPU run: on to the registry
])
def test_promote_takes_only_a_report_of_a_gpu_run_unless_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], report: dict[str, object], cpu_ok: bool,
        allow: bool, code: int) -> None:
    """docs/faults.md U7: a report of verify --cpu-ok (a CUDA image never run on a GPU) cannot
    be promoted unless --allow-cpu-report says so."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**report, "envbuild.verify": {"digest": DIGEST, "exit_code": 0,
                                                              "cpu_ok": cpu_ok}}))
    argv = ["promote", f"127.0.0.1:1/x@{DIGEST}", "stable", "--verified-report", str(path)]
    assert main(argv + (["--allow-cpu-report"] if allow else [])) == code
    err = capsys.readouterr().err
    assert ("--allow-cpu-report" in err) is (code == 2)
    assert main(["promote", f"127.0.0.1:1/x@{DIGEST}", "stable", "--cpu-ok"]) == 2
    assert "--allow-cpu-report" in capsys.readouterr().err


def test_promote_wants_a_digest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promote", "127.0.0.1:1/x:candidate", "stable"]) == 2
    assert "promote needs an image by digest" in capsys.readouterr().err


def test_push_to_a_digest_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--variant", "cpu", "--push", f"127.0.0.1:1/x@{DIGEST}"]) == 2
    assert "push to a tag, not a digest" in capsys.readouterr().err


def test_source_date_epoch_that_is_not_seconds_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    assert main(["build", "--variant", "cpu"]) == 2
    assert "SOURCE_DATE_EPOCH='yesterday' is not a count of seconds" in capsys.readouterr().err


def test_buildah_chroot_with_network_none_is_a_usage_error(tmp_path: Path) -> None:
    program = stub(tmp_path, "buildah", "", 0)
    with pytest.raises(UsageError, match="chroot isolation runs every step in the host's network"):
        BuildahBuilder(program=str(program), env=dict(os.environ)).build(
            context_of("FROM base\n"), tag="t:1", network="none", labels={}, progress=lambda e: None)
    assert not (tmp_path / "argv.jsonl").exists()  # buildah was not run


class _Engine:
    """A Docker API client that holds no image (so no base is copied from it)."""

    def inspect_image(self, ref: str) -> dict[str, Any]:
        raise LookupError(ref)


@pytest.mark.parametrize("load", [True, False])
def test_buildah_copies_into_the_docker_engine_unless_no_load(tmp_path: Path, load: bool) -> None:
    """build --no-load: the image stays in buildah's storage (no ``buildah push
    docker-daemon:``); loading runs that copy, which the stand-in refuses here."""
    program = stub(tmp_path, "buildah", "STEP 1/1: FROM base\n", 0)
    builder = BuildahBuilder(program=str(program), env=dict(os.environ), docker=_Engine(), load=load)

    def built() -> buildmod.BuildResult:
        return builder.build(context_of("FROM base\n"), tag="t:1", network=None, labels={},
                             progress=lambda e: None)

    if load:
        with pytest.raises(BuildFailed, match="could not copy it to the Docker engine"):
            built()
    else:
        assert built().size == 0
    copies = [c["argv"] for c in calls(tmp_path) if "docker-daemon:t:1" in c["argv"]]
    assert copies == ([["push", "t:1", "docker-daemon:t:1"]] if load else [])


class _EngineHolding:
    """A Docker API client that holds one image under ``base``."""

    def __init__(self, image_id: str) -> None:
        self.image_id = image_id

    def inspect_image(self, ref: str) -> dict[str, Any]:
        if ref != "base":
            raise LookupError(ref)
        return {"Id": self.image_id}


@pytest.mark.parametrize("held, copied", [("", True), ("cd" * 32, True), ("ef" * 32, False)],
                         ids=["none", "older", "the-engines"])
def test_buildah_copies_a_base_tag_again_when_the_engines_image_id_differs(
        tmp_path: Path, held: str, copied: bool) -> None:
    """docs/faults.md U16: buildah's copy of ``base`` (its ``inspect`` answer: none, an older
    image, the engine's own) against the engine's image ID: copied when they differ, tagged as
    the engine's; left alone when they agree (the old check asked for the tag alone)."""
    script = tmp_path / "buildah"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
with open({str(tmp_path / 'argv.jsonl')!r}, "a") as f:
    f.write(json.dumps({{"argv": args}}) + "\\n")
if args[0] == "inspect" and {held!r}:
    print({held!r})
elif args[0] == "pull":
    print("Getting image source signatures\\n" + {"sha256:" + "ef" * 32!r})
elif args[0] == "build":
    open(args[args.index("--iidfile") + 1], "w").write({DIGEST!r})
elif args[0] not in ("tag", "info"):
    sys.exit(1)
""")
    script.chmod(0o755)
    events: list[str] = []
    BuildahBuilder(program=str(script), env=dict(os.environ), docker=_EngineHolding("sha256:" + "ef" * 32),
                   load=False, layers=False).build(context_of("FROM base\nRUN true\n"), tag="t:1",
                                                   network=None, labels={},
                                                   progress=lambda e: events.append(e.text))
    argvs = [c["argv"] for c in calls(tmp_path)]
    assert ["inspect", "--type", "image", "--format", "{{.FromImageID}}", "base"] in argvs
    pulls = [a for a in argvs if a[0] in ("pull", "tag")]
    engine = "sha256:" + "ef" * 32
    assert pulls == ([["pull", "docker-daemon:base"], ["tag", engine, "base"]] if copied else [])
    if copied:
        again = " again (there efefefefefef, buildah's copy cdcdcdcdcdcd)" if held else ""
        assert events[0] == f"copying base from the Docker engine{again}"


def test_no_load_is_for_buildah_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--variant", "cpu", "--no-load"]) == 2
    err = capsys.readouterr().err
    assert "--no-load keeps the image in buildah's storage: it needs --builder buildah" in err
    assert "drop --no-load" in err


def test_no_load_refuses_a_lock_whose_build_makes_wheels(cpu_lock: lockmod.Lock) -> None:
    from dataclasses import replace

    from envbuild.commands.build import _check_no_load
    from envbuild.extensions.tree import Extension

    _check_no_load([cpu_lock])  # nothing built from source: allowed
    with_wheels = replace(cpu_lock, extensions=(Extension(dir="ext/fused", name="fused-ops",
                                                          sha256="0" * 64),), sdists=("pyyaml",))
    with pytest.raises(UsageError, match=r"--no-load: the lock builds wheels \(fused-ops, pyyaml\)"):
        _check_no_load([cpu_lock, with_wheels])
