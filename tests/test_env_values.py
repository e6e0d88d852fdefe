"""Values a pull request can set that must not reach an output: credentials in `env` (docs/faults.md
R2), a pylock URL with userinfo (R3), a registry's raw reply (R4), characters YAML/TOML cannot
carry (R5), env keys outside the grammar (R6) and ports above 65535 (R7)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.errors import DataError, UsageError
from envbuild.pylock.files import Pylock, PylockFile, PylockPackage
from envbuild.pylock.install import install_requirements
from envbuild.redact import server_text
from envbuild.render.values import check_env, check_url, is_secret_name
from envbuild.upstream import http_client

ENV = {"ENVBUILD_NO_CACHE": "1"}
SECRET_URL = "https://u:pw-s3cret@index.example/simple"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv), env=ENV)
    return code, capsys.readouterr().err


def project(directory: Path, env_table: str, extra: str = "") -> Path:
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\n{extra}[env]\n{env_table}\n',
        encoding="utf-8")
    return directory


# --- R2: credentials in env never reach the lock or a Dockerfile ENV ---------------------


@pytest.mark.parametrize("pair", [f"PIP_INDEX_URL={SECRET_URL}", "EXTRA=https://x.example/s?token=pw-s3cret",
                                  "HF_TOKEN=pw-s3cret", "WANDB_API_KEY=pw-s3cret"])
@pytest.mark.parametrize("command", ["docker", "cloud-init"])
def test_an_env_flag_with_credentials_is_exit_2(pair: str, command: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "render", command, "--driver", "550", "--env", pair, "-o", str(tmp_path / "out"))
    assert code == 2, err
    assert "pw-s3cret" not in err and err.startswith("envbuild: error[usage]: --env ")
    assert "never from the lock" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("table", [f'PIP_INDEX_URL = "{SECRET_URL}"', 'GITHUB_TOKEN = "pw-s3cret"'])
def test_a_project_env_with_credentials_is_exit_2_and_no_lock(table: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, table))
    code, err = run(capsys, "lock", "--offline")
    assert code == 2, err
    assert err.startswith("envbuild: error[usage]: envbuild.toml:5: env.") and "pw-s3cret" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_a_lock_carrying_a_secret_env_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock from a pull request is checked as the flags are: its env cannot smuggle one in."""
    import json

    assert run(capsys, "lock", "--stack-only", "--driver", "550", "--env", "A=1",
               "-o", str(tmp_path / "envbuild.lock"))[0] == 0
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    data["env"] = [["PIP_INDEX_URL", SECRET_URL]]  # a stack-only lock: schema 1
    (tmp_path / "envbuild.lock").write_text(json.dumps(data))
    code, err = run(capsys, "render", "docker", "--lock", str(tmp_path / "envbuild.lock"),
                    "-o", str(tmp_path / "out"))
    assert code == 2 and "credentials" in err and "pw-s3cret" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "secret"), [
    ("HF_TOKEN", True), ("GITHUB_TOKEN", True), ("NGROK_AUTHTOKEN", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("OPENAI_API_KEY", True), ("PIP_PASSWORD", True), ("db_pass", True), ("AZURE_CLIENT_SECRET", True),
    ("TOKENIZERS_PARALLELISM", False), ("PIP_INDEX_URL", False), ("NCCL_P2P_DISABLE", False),
    ("PYTORCH_CUDA_ALLOC_CONF", False), ("KEYBOARD", False), ("PASSTHROUGH_MODE", False),
])
def test_the_secret_name_rule(key: str, secret: bool) -> None:
    assert is_secret_name(key) is secret


def test_plain_values_still_pass() -> None:
    assert check_env("PIP_INDEX_URL", "https://index.example/simple", "env") == (
        "PIP_INDEX_URL", "https://index.example/simple")
    assert check_env("GREETING", "héllo wörld", "env") == ("GREETING", "héllo wörld")


# --- R3: a pylock URL with userinfo never reaches requirements/*.txt ------------------------


def test_a_pylock_url_with_userinfo_is_refused() -> None:
    wheel = PylockFile(filename="six-1.17.0-py3-none-any.whl", sha256="a" * 64, path=None,
                       url="https://u:pw-s3cret@files.example/six-1.17.0-py3-none-any.whl")
    pylock = Pylock(lock_version="1.0", requires_python=None,
                    packages=(PylockPackage(name="six", version="1.17.0", wheels=(wheel,), sdist=None),))
    with pytest.raises(UsageError, match="carries credentials") as caught:
        install_requirements(pylock, ["six"], python="3.11", glibc="2.35")
    assert "pw-s3cret" not in caught.value.one_line()
    clean = PylockFile(filename=wheel.filename, sha256=wheel.sha256, path=None,
                       url="https://files.example/six-1.17.0-py3-none-any.whl")
    pylock = Pylock(lock_version="1.0", requires_python=None,
                    packages=(PylockPackage(name="six", version="1.17.0", wheels=(clean,), sdist=None),))
    assert install_requirements(pylock, ["six"], python="3.11", glibc="2.35").startswith(
        "six @ https://files.example/")


# --- R4: what a server says is sanitised before it is printed -------------------------------


@contextlib.contextmanager
def answering(status_line: bytes) -> Iterator[str]:
    """A server on 127.0.0.1 answering every request with ``status_line`` and no body."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with connection, contextlib.suppress(OSError):
                connection.recv(65536)
                connection.sendall(status_line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v2/x/manifests/1"
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_hostile_reason_phrase_is_sanitised() -> None:
    reason = (b"\x1b[2J\x1b]0;owned\x07Bad \x1b[31mthing\x1b[0m Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig-s3cret "
              b"https://u:pw-s3cret@h.example/ " + b"A" * 20000)
    with answering(b"HTTP/1.1 418 " + reason) as url:
        client = http_client.HttpClient(env={}, policy=http_client.HttpPolicy(attempts=1))
        with pytest.raises(DataError) as caught:
            client.get(url)
    line = caught.value.one_line()
    assert "HTTP 418 Bad thing Bearer ***" in line
    assert "\x1b" not in line and "s3cret" not in line and "owned" not in line
    assert len(line) < 100 + len(url) + 80


def test_server_text_cuts_after_masking() -> None:
    text = server_text("x" * 95 + " Bearer abcdefgh12345678")
    assert text.endswith("…") and "abcdefgh" not in text and len(text) <= 101


# --- R5: characters the rendered formats cannot carry ----------------------------------------


@pytest.mark.parametrize("char", ["\u009b", "\u0085", "\uffff", "\ufffe", "\ufdd0", "\U0010ffff",
                                  "\U0001fffe"])
@pytest.mark.parametrize("command", ["cloud-init", "docker", "script"])
def test_a_value_yaml_cannot_carry_is_exit_2(char: str, command: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "render", command, "--driver", "550", "--env", f"FOO=a{char}b",
                    "-o", str(tmp_path / "out"))
    assert code == 2 and "noncharacters are not allowed" in err, err
    assert not (tmp_path / "out").exists()


def test_a_project_value_with_a_c1_control_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, 'FOO = "a\\u009bb"'))
    code, err = run(capsys, "lock", "--offline")
    assert code == 2 and "envbuild.toml:5: env.FOO" in err, err
    assert not (tmp_path / "envbuild.lock").exists()


def test_ordinary_unicode_still_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "render", "cloud-init", "--driver", "550", "--env", "GREETING=héllo\u00a0wörld ✓",
                    "-o", str(tmp_path / "out"))
    assert code == 0, err


# --- R6, R7: env keys by the strict grammar, ports up to 65535 -----------------------------------


def test_an_env_key_with_equals_is_refused_not_split(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, '"A=x y" = "v"'))
    code, err = run(capsys, "lock", "--offline")
    assert code == 2 and "invalid environment pair (env): the name 'A=x y' is not" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


@pytest.mark.parametrize(("url", "ok"), [
    ("https://index.example:65535/simple", True), ("https://index.example:65536/simple", False),
    ("https://index.example:99999/simple", False), ("https://index.example:0/simple", False),
    ("https://index.example/simple", True),
])
def test_url_ports_end_at_65535(url: str, ok: bool) -> None:
    if ok:
        assert check_url(url, "--index-url") == url
    else:
        with pytest.raises(UsageError, match="a port from 1 to 65535"):
            check_url(url, "--index-url")


@pytest.mark.parametrize("argv", [
    ("--index-url", "https://index.example:70000/simple"),
    ("--base-image", "registry.example:70000/team/base:1"),
])
def test_a_port_above_65535_on_the_command_line_is_exit_2(argv: tuple[str, str], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "render", "docker", "--driver", "550", *argv, "-o", str(tmp_path / "out"))
    assert code == 2, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mirror", ['"docker.io" = "https://mirror.example:99999/"',
                                    '"docker.io:70000" = "https://mirror.example/"'])
def test_a_mirror_port_above_65535_is_exit_2(mirror: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, "", extra=f"[registry-mirrors]\n{mirror}\n"))
    code, err = run(capsys, "lock", "--offline")
    assert code == 2 and "envbuild.toml:5: registry-mirrors." in err and "65535" in err, err
    assert not (tmp_path / "envbuild.lock").exists()
