"""envbuild build / verify / clean without a Docker engine: the context tar, the daemon's
event stream, and how every failure maps to an exit code (docs/faults.md section F, the parts a
fake client can show; tests/test_docker_e2e.py runs the rest on a real engine)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests.exceptions

from envbuild.commands.cli import main
from envbuild.engine import build
from envbuild.engine.context import context_tar
from envbuild.engine.daemon import LABEL, LOG_TAIL, connect
from envbuild.engine.verify import VerifyOptions, VerifyResult, check_options, failures, parse_size, verify
from envbuild.errors import BuildFailed, DockerUnavailable, GpuRuntimeMissing, SmokeFailed, UsageError

# --- the context tar ----------------------------------------------------------------------


def test_context_tar_is_deterministic_and_normalised(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel bytes")
    files: dict[str, bytes | Path] = {"Dockerfile": b"FROM x\n", "wheelhouse/" + wheel.name: wheel,
                                      "a.txt": b"a"}
    first, second = io.BytesIO(), io.BytesIO()
    context_tar(files, first)
    wheel.touch()  # a newer mtime on disk must not reach the tar
    context_tar(dict(reversed(list(files.items()))), second)
    assert first.getvalue() == second.getvalue()
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["wheelhouse", "Dockerfile", "a.txt",
                                             "wheelhouse/" + wheel.name]
        assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 0)}
        assert members[0].isdir() and members[0].mode == 0o755
        assert {m.mode for m in members[1:]} == {0o644}
        extracted = tar.extractfile("wheelhouse/" + wheel.name)
        assert extracted is not None and extracted.read() == b"wheel bytes"


# --- connecting (F1, F2) --------------------------------------------------------------------


def test_no_daemon_is_exit_5_naming_the_socket(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nonexistent.sock"
    with pytest.raises(DockerUnavailable) as info:
        connect({"DOCKER_HOST": url})
    assert info.value.exit_code == 5
    assert url in info.value.message


def test_cli_no_daemon_one_line_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["clean"], env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    err = capsys.readouterr().err
    assert code == 5
    assert err.count("\n") == 1 and "cannot connect to Docker daemon at unix://" in err
    assert "Traceback" not in err


def test_permission_denied_hints_docker_group(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**kwargs: Any) -> Any:
        raise docker.errors.DockerException(
            "Error while fetching server API version: ('Connection aborted.', "
            "PermissionError(13, 'Permission denied'))")

    monkeypatch.setattr(docker, "APIClient", refuse)
    with pytest.raises(DockerUnavailable) as info:
        connect({})
    assert "permission denied" in info.value.message
    assert "docker' group" in info.value.hint and "rootless" in info.value.hint


# --- building (F3, F4, F5, F6) ---------------------------------------------------------------


class FakeBuildClient:
    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = chunks
        self.kwargs: dict[str, Any] = {}

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.kwargs = kwargs
        return iter(self.chunks)

    def inspect_image(self, image: str) -> dict[str, Any]:
        return {"Id": image, "Size": 1234}


def run_build(chunks: list[dict[str, Any]]) -> tuple[build.BuildResult, list[build.BuildEvent],
                                                      FakeBuildClient]:
    client = FakeBuildClient(chunks)
    events: list[build.BuildEvent] = []
    result = build.SdkBuilder(client=client).build(
        io.BytesIO(b""), tag="t:1", network="host", labels={"k": "v"}, progress=events.append)
    return result, events, client


def test_build_events_steps_downloads_and_image() -> None:
    result, events, client = run_build([
        {"stream": "Step 1/3 : FROM base\n"},
        {"stream": " ---> 1234abcd\n"},
        {"stream": "Step 2/3 : RUN apt-get update\n"},
        {"stream": " ---> Using cache\n"},
        {"stream": " ---> 5678abcd\n"},
        {"stream": "Step 3/3 : RUN pip install torch\n"},
        {"stream": " ---> Running in 0123456789ab\n"},
        {"stream": "  Downloading torch-2.4.1-cp311.whl (797 MB)\n"},
        {"stream": "\x1b[91mWARNING: something\n\x1b[0m"},
        {"aux": {"ID": "sha256:" + "ab" * 32}},
        {"stream": "Successfully built abababababab\n"},
    ])
    assert result.image_id == "sha256:" + "ab" * 32 and result.size == 1234 and result.steps == 3
    assert [e.step for e in events if e.kind == "step"] == [1, 2, 3]
    assert result.ran == ("RUN pip install torch",)  # step 2 came from the cache, FROM never runs
    assert result.to_json()["ran"] == ["RUN pip install torch"]
    assert any(e.kind == "download" and "torch-2.4.1" in e.text for e in events)
    assert any(e.text == "WARNING: something" for e in events)  # colour codes stripped
    # Classic builder only, intermediate containers always removed, and a read timeout far
    # beyond the SDK's 60 s default: a silent multi-minute pip download must not end the build (F5).
    assert client.kwargs["forcerm"] is True and client.kwargs["rm"] is True
    assert client.kwargs["timeout"] >= 3600 and client.kwargs["network_mode"] == "host"
    assert client.kwargs["custom_context"] is True and client.kwargs["pull"] is False


def test_failing_step_is_exit_6_with_step_and_last_lines() -> None:
    lines = [{"stream": f"log line {i}\n"} for i in range(40)]
    with pytest.raises(BuildFailed) as info:
        run_build([{"stream": "Step 1/3 : FROM base\n"}, {"stream": "Step 2/3 : RUN exit 3\n"},
                   *lines,
                   {"error": "The command '/bin/sh -c exit 3' returned a non-zero code: 3",
                    "errorDetail": {"code": 3,
                                    "message": "The command '/bin/sh -c exit 3' returned a non-zero "
                                               "code: 3"}}])
    err = info.value
    assert err.exit_code == 6
    assert "step 2/3 (RUN exit 3) failed" in err.message and "non-zero code: 3" in err.message
    assert err.details == tuple(f"log line {i}" for i in range(40 - LOG_TAIL, 40))


@pytest.mark.parametrize("message", ["manifest for nvidia/cuda:99.0-base-ubuntu22.04 not found: "
                                     "manifest unknown", "toomanyrequests: You have reached your "
                                     "pull rate limit"])
def test_base_image_pull_failure_names_the_image(message: str) -> None:
    with pytest.raises(BuildFailed) as info:
        run_build([{"stream": "Step 1/5 : FROM nvidia/cuda:99.0-base-ubuntu22.04\n"},
                   {"error": message, "errorDetail": {"message": message}}])
    assert info.value.exit_code == 6
    assert "cannot get base image nvidia/cuda:99.0-base-ubuntu22.04" in info.value.message
    assert "--base-image" in info.value.hint


def test_buildkit_syntax_is_explained() -> None:
    message = "Dockerfile parse error line 3: Unknown flag: mount"
    with pytest.raises(BuildFailed, match="needs BuildKit"):
        run_build([{"error": message, "errorDetail": {"message": message}}])


def test_build_without_image_is_a_failure() -> None:
    with pytest.raises(BuildFailed, match="without an image"):
        run_build([{"stream": "Step 1/1 : FROM base\n"}])


def test_rendered_dockerfiles_use_no_buildkit_syntax() -> None:
    """F4 as a policy over every golden Dockerfile (rendered by tests/test_render.py)."""
    goldens = sorted(Path(__file__).parent.glob("golden/*/Dockerfile"))
    assert len(goldens) >= 8
    for path in goldens:
        text = path.read_text()
        assert "# syntax=" not in text and "--mount" not in text and "<<" not in text, path
        assert "COPY --link" not in text and "--chmod" not in text, path


# --- verifying (F7, F8, F9, F10) ---------------------------------------------------------------


class FakeRunClient:
    """Enough of docker.APIClient for verify(); records what was asked."""

    def __init__(self, *, start_error: str | None = None, hang: bool = False, oom: bool = False,
                 code: int = 0, stdout: str = '{"checks": [], "exit_code": 0}',
                 labels: Mapping[str, str] | None = None, arch: str | None = None,
                 engine_arch: str = "amd64") -> None:
        self.start_error, self.hang, self.oom, self.code, self.stdout = (
            start_error, hang, oom, code, stdout)
        self.arch, self.engine_arch = arch, engine_arch
        self.labels = {"dev.envbuild.torch": "2.4.1"} if labels is None else labels
        self.created: list[dict[str, Any]] = []
        self.removed: list[str] = []
        self.killed: list[str] = []

    def inspect_image(self, image: str) -> dict[str, Any]:
        if image == "missing":
            raise docker.errors.ImageNotFound("no such image")
        platform = {"Os": "linux", "Architecture": self.arch} if self.arch else {}
        return {"Config": {"Labels": dict(self.labels)}, **platform}

    def version(self) -> dict[str, str]:
        return {"Os": "linux", "Arch": self.engine_arch}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self.created.append(kwargs)
        return {"Id": f"c{len(self.created)}"}

    def start(self, cid: str) -> None:
        requested = self.created[-1]["host_config"]["device_requests"]
        if self.start_error and (requested or "cuda>=" in self.start_error):
            raise docker.errors.APIError("500", explanation=self.start_error)

    def wait(self, cid: str, timeout: float) -> dict[str, int]:
        if self.hang:
            raise requests.exceptions.ReadTimeout("read timed out")
        return {"StatusCode": 137 if self.oom else self.code}

    def kill(self, cid: str) -> None:
        self.killed.append(cid)

    def logs(self, cid: str, stdout: bool, stderr: bool) -> bytes:
        return (self.stdout if stdout else "some stderr\n").encode()

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return {"State": {"OOMKilled": self.oom}}

    def remove_container(self, cid: str, force: bool) -> None:
        self.removed.append(cid)


NO_RUNTIME = 'could not select device driver "" with capabilities: [[gpu]]'


def run_verify(client: FakeRunClient, **options: Any) -> VerifyResult:
    warnings: list[str] = []
    result = verify(client, "img", VerifyOptions(**options), warnings.append)
    return result


def test_verify_runs_isolated_and_removes_the_container() -> None:
    client = FakeRunClient()
    result = run_verify(client, timeout=30, memory="512m", shm_size="1g")
    assert result.exit_code == 0 and result.report == {"checks": [], "exit_code": 0}
    created = client.created[0]
    host = created["host_config"]
    assert host["network_mode"] == "none" and created["network_disabled"] is True
    assert host["mem_limit"] == host["memswap_limit"] == 512 << 20
    assert host["shm_size"] == 1 << 30
    assert host["device_requests"][0].count == -1
    assert created["labels"] == {LABEL: "verify"}
    assert created["command"][:2] == ["/opt/venv/bin/python", "/opt/envbuild/smoke.py"]
    assert "--json" in created["command"] and "--cpu-ok" not in created["command"]
    assert client.removed == ["c1"]


def test_an_image_of_another_platform_runs_as_that_platform_under_emulation_unjudged() -> None:
    """T15: an arm64 image on an amd64 engine: a WARN line, the report says so, the payload is told
    (it then skips host balance), and the run names the image's platform (never the index's other
    manifest); the engine's own platform runs as before, its platform given, nothing emulated."""
    report = '{"host": {"python": "3.11"}, "checks": [], "exit_code": 0}'
    client = FakeRunClient(arch="arm64", stdout=report)
    warnings: list[str] = []
    result = verify(client, "img", VerifyOptions(), warnings.append)
    assert result.platform == "linux/arm64" and result.emulated == "linux/arm64 on a linux/amd64 host"
    assert result.report is not None and result.report["host"]["emulated"] == result.emulated
    (warning,) = warnings
    assert "under emulation" in warning and "host balance are not judged" in warning
    created = client.created[0]
    assert created["platform"] == "linux/arm64"
    assert created["environment"] == {"ENVBUILD_SMOKE_EMULATED": "linux/arm64 on a linux/amd64 host"}
    native = FakeRunClient(arch="arm64", engine_arch="arm64", stdout=report)
    warnings.clear()
    result = verify(native, "img", VerifyOptions(), warnings.append)
    assert (result.platform, result.emulated, warnings) == ("linux/arm64", None, [])
    assert native.created[0]["environment"] is None and native.created[0]["platform"] == "linux/arm64"
    assert result.report is not None and "emulated" not in result.report["host"]


def test_verify_platform_pulls_that_platforms_image_and_refuses_another() -> None:
    """T15: verify --platform: a multi-arch digest is pulled for that platform (not the engine's
    own), an image of another platform is refused before any container, a bad platform is 2."""
    from envbuild.engine.publish import pull_by_digest

    class Puller:
        def __init__(self) -> None:
            self.pulled: list[dict[str, Any]] = []

        def inspect_image(self, image: str) -> dict[str, Any]:
            raise docker.errors.ImageNotFound("not here")

        def pull(self, repository: str, **kwargs: Any) -> list[dict[str, str]]:
            self.pulled.append({"repository": repository, **kwargs})
            return [{"status": "Pulled", "id": "x"}]

    puller = Puller()
    digest = "sha256:" + "ab" * 32
    pull_by_digest(puller, f"127.0.0.1:5000/ml/torch@{digest}", print, platform="linux/arm64")
    assert puller.pulled[0]["platform"] == "linux/arm64" and puller.pulled[0]["tag"] == digest
    client = FakeRunClient(arch="amd64")
    with pytest.raises(UsageError, match="image 'img' is linux/amd64, not linux/arm64"):
        verify(client, "img", VerifyOptions(platform="linux/arm64"), print)
    assert client.created == []
    assert verify(client, "img", VerifyOptions(platform="linux/amd64"), print).platform == "linux/amd64"
    with pytest.raises(UsageError, match="unknown platform 'arm64'"):
        check_options(VerifyOptions(platform="arm64"))


def test_missing_gpu_runtime_is_exit_8_with_install_hint() -> None:
    client = FakeRunClient(start_error=NO_RUNTIME)
    with pytest.raises(GpuRuntimeMissing) as info:
        run_verify(client)
    assert info.value.exit_code == 8 and "nvidia-ctk" in info.value.hint
    assert client.removed == ["c1"]


def test_cpu_ok_runs_again_without_gpus() -> None:
    client = FakeRunClient(start_error=NO_RUNTIME)
    result = run_verify(client, cpu_ok=True)
    assert result.exit_code == 0 and result.gpus_requested is False
    assert [c["host_config"]["device_requests"] for c in client.created][1] == []
    assert "--cpu-ok" in client.created[1]["command"]
    assert client.removed == ["c1", "c2"]


def test_old_driver_is_exit_8_naming_the_cuda() -> None:
    client = FakeRunClient(start_error="nvidia-container-cli: requirement error: unsatisfied "
                                       "condition: cuda>=12.4, please update your driver")
    with pytest.raises(GpuRuntimeMissing, match=r"host driver too old for image CUDA 12\.4"):
        run_verify(client, cpu_ok=True)  # --cpu-ok must not hide a too-old driver
    assert client.removed == ["c1"]


def test_timeout_is_exit_7_container_killed_and_removed() -> None:
    client = FakeRunClient(hang=True)
    with pytest.raises(SmokeFailed, match="timed out after 5 s") as info:
        run_verify(client, timeout=5)
    assert info.value.exit_code == 7
    assert client.killed == ["c1"] and client.removed == ["c1"]


def test_oom_is_exit_7_naming_the_limit() -> None:
    client = FakeRunClient(oom=True)
    with pytest.raises(SmokeFailed, match=r"OOM-killed \(limit 64m\)"):
        run_verify(client, memory="64m")
    assert client.removed == ["c1"]


def test_no_report_is_a_failure_with_the_logs() -> None:
    client = FakeRunClient(code=1, stdout="Traceback: boom\n")
    with pytest.raises(SmokeFailed, match="exited 1 without a report"):
        run_verify(client)


def test_foreign_or_missing_image_is_usage_error() -> None:
    with pytest.raises(UsageError, match="not built by envbuild"):
        run_verify(FakeRunClient(labels={}))
    with pytest.raises(UsageError, match="no image 'missing'") as info:
        verify(FakeRunClient(), "missing", VerifyOptions(), print)
    assert info.value.hint is not None and "--no-load" in info.value.hint  # buildah's image elsewhere


def test_failures_lists_failing_checks() -> None:
    report = {"checks": [{"name": "torch.cuda_build", "status": "fail", "message": "CPU-only"},
                         {"name": "python", "status": "pass", "message": "3.11"}]}
    assert failures(report) == ["torch.cuda_build: CPU-only"]
    assert json.loads(json.dumps(report)) == report


@pytest.mark.parametrize(("text", "value"), [("512m", 512 << 20), ("2g", 2 << 30), ("1024", 1024),
                                             ("8K", 8 << 10)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text, "--memory") == value


@pytest.mark.parametrize("argv", [["verify", "img", "--gpus", "some"], ["verify", "img", "--timeout", "0"],
                                  ["verify", "img", "--memory", "lots"],
                                  ["build", "--variant", "cpu", "--tag", "Bad Tag;rm"]])
def test_bad_verify_and_build_flags_exit_2_before_docker(argv: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # DOCKER_HOST points nowhere: reaching the daemon would be exit 5, so 2 proves the order.
    assert main(argv, env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}) == 2
    assert "error[usage]" in capsys.readouterr().err


def test_check_tag() -> None:
    assert build.check_tag("myorg/torch:2.4.1-cu121") == "myorg/torch:2.4.1-cu121"
    for bad in ("UPPER/x", "a b", "x:\n", "x;rm -rf /", ""):
        with pytest.raises(UsageError):
            build.check_tag(bad)
