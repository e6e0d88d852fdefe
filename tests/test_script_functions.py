"""The rendered install.sh's own functions, run by bash on this machine against servers on
127.0.0.1: real curl, real TLS (a trustme CA), no container. The script is sourced without its
last line (``main "$@"``), so each function runs exactly as the script defines it.

docs/faults.md D6 (downloads end), and the hardening of host downloads: https only, redirects
included; a deadline per download and for the whole install; Secure Boot seen without mokutil.
"""

from __future__ import annotations

import http.server
import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    KEYRINGS,
    NVIDIA_KEY_LINE,
    OTHER_KEY_FINGERPRINT,
    TEST_KEY_FINGERPRINT,
    keyring_deb,
    with_test_key,
)

from envbuild.render import docker as render
from envbuild.render import script

trustme = pytest.importorskip("trustme")
pytestmark = pytest.mark.skipif(shutil.which("curl") is None or shutil.which("timeout") is None,
                                reason="needs curl and timeout")


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """install.sh of a CPU stack, minus the line that runs main."""
    from envbuild.data import matrix as matrixmod
    from envbuild.resolver.resolve import resolve
    from envbuild.resolver.selection import Selectors, build_request

    data = matrixmod.load(matrixmod.default_directory({}))
    request = build_request(Selectors(variant="cpu", ubuntu="22.04"), data, {})
    lock = render.lock_for(resolve(request, data).stacks[0], data, render.RenderOptions())
    text = script.render_script(lock)["install.sh"].decode()
    assert text.rstrip().endswith('main "$@"')
    path = tmp_path_factory.mktemp("script") / "functions.sh"
    path.write_text(text.rstrip()[: -len('main "$@"')])
    return path


class Server:
    def __init__(self, httpd: http.server.ThreadingHTTPServer, scheme: str) -> None:
        self.httpd, self.scheme = httpd, scheme

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    redirect_to = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"{type(self).redirect_to}/file")
            self.end_headers()
        elif self.path == "/file":
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")
        elif self.path == "/trickle":  # one byte a second, of a promised megabyte, for 60 s at most
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            for _ in range(60):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(1)


def serve(context: ssl.SSLContext | None) -> Iterator[Server]:
    handler = type("H", (Handler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Server(httpd, "https" if context else "http")
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def https(ca: trustme.CA) -> Iterator[Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    yield from serve(context)


@pytest.fixture
def http_plain() -> Iterator[Server]:
    yield from serve(None)


def fetch(url: str) -> str:
    """A bash snippet: download ``url`` to ./got, then print both statuses (set -e is on)."""
    return f'rc=0; download "{url}" got || rc=$?; echo "rc=$rc DOWNLOAD_RC=$DOWNLOAD_RC"'


def run(functions: Path, body: str, ca: trustme.CA, tmp_path: Path,
        **env: str) -> subprocess.CompletedProcess[str]:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    script_text = (f'source "{functions}"\n'
                   # the script's option defaults were just assigned: the test's values go after
                   "DEADLINE=${TEST_DEADLINE:-3600}; DOWNLOAD_TIMEOUT=${TEST_DOWNLOAD_TIMEOUT:-600}\n"
                   "DEADLINE_AT=$((SECONDS + DEADLINE))\n" + body)
    full_env = {"PATH": os.environ["PATH"], "CURL_CA_BUNDLE": str(bundle), **env}
    return subprocess.run([shutil.which("bash") or "bash", "-c", script_text], capture_output=True,
                          text=True, env=full_env, cwd=tmp_path, timeout=120, check=False)


def test_https_download_lands_whole(functions: Path, https: Server, ca: trustme.CA,
                                    tmp_path: Path) -> None:
    done = run(functions, fetch(https.url + "/file"),
               ca, tmp_path)
    assert "rc=0 DOWNLOAD_RC=0" in done.stdout, done.stderr
    assert (tmp_path / "got").read_bytes() == b"hello"


def test_redirect_to_http_is_refused(functions: Path, https: Server, http_plain: Server,
                                     ca: trustme.CA, tmp_path: Path) -> None:
    Handler_of(https).redirect_to = http_plain.url  # https -> http://127.0.0.1/file
    done = run(functions, fetch(https.url + "/redirect"),
               ca, tmp_path)
    assert "rc=1 DOWNLOAD_RC=1" in done.stdout, (done.stdout, done.stderr)  # curl: protocol disabled
    assert not (tmp_path / "got").exists() and not (tmp_path / "got.part").exists()


def test_plain_http_url_is_refused(functions: Path, http_plain: Server, ca: trustme.CA,
                                   tmp_path: Path) -> None:
    done = run(functions, fetch(http_plain.url + "/file"),
               ca, tmp_path)
    assert "rc=1 DOWNLOAD_RC=1" in done.stdout, (done.stdout, done.stderr)
    assert not (tmp_path / "got").exists()


def test_trickling_server_is_cut_at_the_download_timeout(functions: Path, https: Server,
                                                         ca: trustme.CA, tmp_path: Path) -> None:
    started = time.monotonic()
    done = run(functions, fetch(https.url + "/trickle"),
               ca, tmp_path, TEST_DOWNLOAD_TIMEOUT="3")
    took = time.monotonic() - started
    assert "rc=1 DOWNLOAD_RC=28" in done.stdout, (done.stdout, done.stderr)
    # one budget of 3 s for the whole download, its retries and their pauses included
    assert took < 12, took
    assert not (tmp_path / "got").exists() and not (tmp_path / "got.part").exists()


def test_install_deadline_bounds_downloads_and_steps(functions: Path, https: Server, ca: trustme.CA,
                                                     tmp_path: Path) -> None:
    started = time.monotonic()
    done = run(functions, fetch(f"{https.url}/trickle") + '\nstep "the next step" echo ran', ca, tmp_path,
               TEST_DEADLINE="2")
    assert time.monotonic() - started < 12
    assert "rc=1 DOWNLOAD_RC=28" in done.stdout, (done.stdout, done.stderr)
    assert "ran" not in done.stdout.split("DOWNLOAD_RC=28", 1)[1]
    assert "ran past its deadline (--deadline 2) before: the next step" in done.stderr


@pytest.mark.parametrize(("value", "enabled"), [(b"\x06\x00\x00\x00\x01", True),
                                                 (b"\x06\x00\x00\x00\x00", False), (None, False)])
def test_secure_boot_read_from_efivars_without_mokutil(functions: Path, ca: trustme.CA, tmp_path: Path,
                                                       value: bytes | None, enabled: bool) -> None:
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    if value is not None:
        (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(value)
    bin_dir = tmp_path / "bin"  # a PATH with bash's helpers but no mokutil
    bin_dir.mkdir()
    for tool in ("od", "tr", "timeout", "curl"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    done = run(functions, "if secure_boot_enabled; then echo on; else echo off; fi", ca, tmp_path,
               ENVBUILD_EFIVARS=str(efivars), PATH=str(bin_dir))
    assert done.stdout.strip() == ("on" if enabled else "off"), done.stderr


def Handler_of(server: Server) -> type[Handler]:
    handler: type[Handler] = server.httpd.RequestHandlerClass  # type: ignore[assignment]
    return handler


# --- NVIDIA's keyring: installed only when every key in it is the one NVIDIA publishes ---------


def asks_trust(deb: Path, scratch: Path) -> str:
    return f'if keyring_is_nvidias "{deb}" "{scratch}"; then echo yes; else echo no; fi'


@pytest.fixture(scope="module")
def functions_test_key(functions: Path) -> Path:
    """The same functions, trusting the test key in place of NVIDIA's."""
    path = functions.with_name("functions-test-key.sh")
    path.write_bytes(with_test_key(functions.read_bytes()))
    return path


def test_rendered_script_trusts_nvidias_published_key(functions: Path) -> None:
    assert functions.read_text().count(NVIDIA_KEY_LINE) == 1


def test_keyring_fingerprints_agree_with_gpg(functions: Path, ca: trustme.CA, tmp_path: Path) -> None:
    deb = keyring_deb(tmp_path, {"cuda-archive-keyring.gpg": (KEYRINGS / "trusted.gpg").read_bytes(),
                                 "other.gpg": (KEYRINGS / "other.gpg").read_bytes()})
    done = run(functions, f'keyring_fingerprints "{deb}" "{tmp_path}"', ca, tmp_path)
    assert sorted(done.stdout.split()) == sorted([TEST_KEY_FINGERPRINT, OTHER_KEY_FINGERPRINT]), done.stderr


@pytest.mark.parametrize(("keyrings", "trusted"), [
    ({"cuda-archive-keyring.gpg": ["trusted"]}, True),
    ({"cuda-archive-keyring.gpg": ["other"]}, False),
    ({"cuda-archive-keyring.gpg": ["trusted", "other"]}, False),  # one more key in the same file
    ({"cuda-archive-keyring.gpg": ["trusted"], "extra.gpg": ["other"]}, False),  # or beside it
    ({"cuda-archive-keyring.gpg": []}, False),  # no key at all
    ({"cuda-archive-keyring.gpg": ["trusted"], "extra.asc": ["other"]}, False),  # apt trusts .asc too
], ids=["nvidias", "another", "nvidias-plus-one", "second-file", "empty", "armored-file"])
def test_keyring_is_installed_only_with_nvidias_key_alone(functions_test_key: Path, ca: trustme.CA,
                                                          tmp_path: Path, keyrings: dict[str, list[str]],
                                                          trusted: bool) -> None:
    deb = keyring_deb(tmp_path, {name: b"".join((KEYRINGS / f"{k}.gpg").read_bytes() for k in keys)
                                 for name, keys in keyrings.items()})
    done = run(functions_test_key, asks_trust(deb, tmp_path), ca, tmp_path)
    assert done.stdout.strip() == ("yes" if trusted else "no"), done.stderr


def test_a_download_that_is_no_package_is_refused(functions_test_key: Path, ca: trustme.CA,
                                                  tmp_path: Path) -> None:
    page = tmp_path / "cuda-keyring_1.1-1_all.deb"
    page.write_text("<html>a captive portal's page</html>")
    done = run(functions_test_key, asks_trust(page, tmp_path), ca, tmp_path)
    assert done.stdout.strip() == "no", done.stderr
