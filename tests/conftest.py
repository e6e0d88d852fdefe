from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_lock import sessions_lock

# A suite started in the background of a non-interactive shell (`bash scripts/test.sh &`, nohup)
# inherits SIGINT ignored, and so does every process it starts: an envbuild started by a test
# then never sees the Ctrl-C the test sends it (nor does this process the one a test raises in
# it), and the Ctrl-C tests fail for that alone (seen as "flaky" in earlier sessions' background
# runs). The tests run as if started from a terminal; envbuild itself keeps respecting an
# ignored SIGINT, as a background job should.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ from the current renderer instead of comparing")


KEYRINGS = Path(__file__).parent / "fixtures" / "keyring"
# What gpg printed for the two test keys when they were made (gpg --with-colons, fpr), so that
# the script's own fingerprint reader is checked against gpg's.
TEST_KEY_FINGERPRINT = "97FDD92058D1466C2FC61FB379AA14564AE80F21"
OTHER_KEY_FINGERPRINT = "00A8462B8DB6647CD39FA44C02BE1E6AA9D55265"
NVIDIA_KEY_LINE = "readonly NVIDIA_KEY_FINGERPRINT=EB693B3035CD5710E231E123A4B469963BF863CC"


def keyring_deb(directory: Path, keyrings: dict[str, bytes]) -> Path:
    """A cuda-keyring-like .deb holding ``keyrings`` (file name -> bytes) under
    /usr/share/keyrings, built by dpkg-deb as NVIDIA's is."""
    import shutil
    import subprocess

    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb")
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
        "Maintainer: envbuild tests <tests@envbuild.invalid>\nDescription: test keyring\n")
    (root / "usr" / "share" / "keyrings").mkdir(parents=True)
    for name, data in keyrings.items():
        (root / "usr" / "share" / "keyrings" / name).write_bytes(data)
    deb = directory / "cuda-keyring_1.1-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def with_test_key(script: bytes) -> bytes:
    """The rendered install.sh trusting the test key in place of NVIDIA's (nothing else changes)."""
    assert script.count(NVIDIA_KEY_LINE.encode()) == 1
    return script.replace(NVIDIA_KEY_LINE.encode(),
                          f"readonly NVIDIA_KEY_FINGERPRINT={TEST_KEY_FINGERPRINT}".encode())


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def served(handler: type[Any], tls: Any = None) -> Iterator[str]:
    """An ``http.server`` handler class served on a free 127.0.0.1 port from a daemon thread
    (``tls``: an ``ssl.SSLContext`` for the server side: https, each handshake in its handler's
    thread); yields "127.0.0.1:PORT", and shuts the server down on leaving."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def registry_binary() -> str:
    """Debian's ``docker-registry``; skip without it, unless ENVBUILD_REQUIRE_DOCKER (CI) is set."""
    import os
    import shutil

    binary = shutil.which("docker-registry")
    if binary is None:
        message = "no docker-registry binary (apt-get install docker-registry)"
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but there is {message}")
        pytest.skip(message)
    return binary


@contextlib.contextmanager
def run_registry(directory: Path, storage: Path, auth: str = "",
                 tls: tuple[Path, Path, Path] | None = None) -> Iterator[str]:
    """Debian's ``docker-registry`` (the distribution project's server) serving ``storage`` on a
    free 127.0.0.1 port over plain HTTP, its config and log in ``directory``; yields
    "127.0.0.1:PORT" once /v2/ answers. ``auth``: an ``auth:`` block of its config (YAML), else
    anonymous. ``tls``: (certificate, key, CA) files: it serves https instead."""
    import ssl
    import subprocess
    import time
    import urllib.error
    import urllib.request

    binary = registry_binary()
    directory.mkdir(parents=True, exist_ok=True)
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls[2]))
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    scheme = "https" if tls is not None else "http"
    served = "" if tls is None else f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
    log_path = directory / "registry.log"
    ready = False
    for _ in range(3):  # another process may take the port between the probe and the start
        port = free_port()
        config = directory / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {storage}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n" + served + auth,
            encoding="utf-8")
        with log_path.open("ab") as log:
            process = subprocess.Popen([binary, "serve", str(config)], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None and not ready:
            try:
                with opener.open(f"{scheme}://127.0.0.1:{port}/v2/", timeout=2):
                    ready = True
            except urllib.error.HTTPError as answer:
                ready = answer.code == 401 and bool(auth)  # up, and asking for a token
            except (urllib.error.URLError, OSError):
                pass
            if not ready:
                time.sleep(0.1)
        if ready:
            break
        process.terminate()
        process.wait(10)
    if not ready:
        pytest.fail("docker-registry did not start: "
                    + log_path.read_text(encoding="utf-8", errors="replace")[-2000:])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="session")
def registry_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where ``loopback_registry`` keeps what is pushed to it (another registry may serve it too)."""
    return tmp_path_factory.mktemp("registry-storage")


@pytest.fixture(scope="session")
def loopback_registry(tmp_path_factory: pytest.TempPathFactory, registry_storage: Path) -> Iterator[str]:
    """A real registry (Debian's ``docker-registry``) on 127.0.0.1, plain HTTP, anonymous, storing
    in ``registry_storage``; yields "127.0.0.1:PORT". Docker treats loopback registries as
    insecure ones, so ``docker push`` needs no TLS. Skipped without the binary, unless
    ENVBUILD_REQUIRE_DOCKER is set (CI): then it fails."""
    with run_registry(tmp_path_factory.mktemp("registry"), registry_storage) as host:
        yield host


def push_image(client: Any, image: str, repository: str, tag: str) -> str:
    """Tag ``image`` as ``repository:tag`` and push it with the docker SDK (``client``: an
    APIClient); the digest the push reported, checked against the image's RepoDigests. The tag
    stays: remove it with ``client.remove_image(f"{repository}:{tag}")``."""
    client.tag(image, repository, tag)
    reported = None
    for event in client.push(repository, tag, stream=True, decode=True):
        if "error" in event:
            pytest.fail(f"docker push of {repository}:{tag} failed: {event['error']}")
        reported = event.get("aux", {}).get("Digest", reported)
    if reported is None:
        pytest.fail(f"docker push of {repository}:{tag} reported no digest")
    assert f"{repository}@{reported}" in client.inspect_image(f"{repository}:{tag}")["RepoDigests"]
    return str(reported)


_ENGINE: list[Any] = []
# Every test session that uses the engine holds this file shared; a module's clean-up removes
# images only while it can hold it alone, so a second session (another checkout's tests) never
# loses an image in the middle of a build.
# The benches under bench/ that build hold it shared too (bench_lock_build.share_the_engine).
# One file per engine (tests/engine_lock.py).
_SESSIONS_LOCK = sessions_lock()


def _engine() -> tuple[Any, int] | None:
    """The engine's client and this session's shared hold on _SESSIONS_LOCK, if an engine
    answers; asked once per session."""
    if not _ENGINE:
        import os

        from envbuild.engine.daemon import connect

        try:
            client = connect(os.environ, timeout=600.0)
        except Exception:  # no engine: nothing to clean
            _ENGINE.append(None)
        else:
            fd = os.open(_SESSIONS_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_SH)
            _ENGINE.append((client, fd))
    return _ENGINE[0]  # type: ignore[no-any-return]


_BEFORE_MODULE: dict[str, set[str]] = {}

# This session's token, in the tag of every image the long engine tests build (``tagged``): two
# sessions on one engine (two checkouts, a developer's run beside another) never build over,
# verify or remove each other's images. ENVBUILD_TEST_SESSION names it (else a random one).
SESSION = os.environ.get("ENVBUILD_TEST_SESSION") or secrets.token_hex(4)


def tagged(name: str) -> str:
    """``name`` ("envbuild-test/cpu:2.13.0") with this session's token in its tag."""
    repository, _, tag = name.rpartition(":")
    return f"{repository}:{tag}-{SESSION}"


@pytest.fixture(scope="session", autouse=True)
def _session_tags_are_removed() -> Iterator[None]:
    """Every tag with this session's token is removed when the session ends, whoever else uses
    the engine: the tag is this session's alone (an image another build still needs as its
    parent only loses the tag)."""
    yield
    engine = _ENGINE[0] if _ENGINE else None  # None: no test of this session reached the engine
    if engine is None:
        return
    client = engine[0]
    for image in client.images():
        for tag in image.get("RepoTags") or ():
            if tag.endswith(f"-{SESSION}"):
                with contextlib.suppress(Exception):  # gone already
                    client.remove_image(tag)

# The fixtures that reach the Docker engine: a test using one must be marked ``docker``, so that
# the quick tier (scripts/test.sh --quick, -m "not docker ...") never needs an engine.
_ENGINE_FIXTURES = frozenset({"docker_api"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [item.nodeid for item in items
                if _ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("docker") is None]
    if unmarked:
        raise pytest.UsageError("tests that use the Docker engine without the docker marker "
                                "(scripts/test.sh --quick would run them): " + ", ".join(unmarked))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The engine's images before a module's first test sets up anything: a session-scoped
    fixture that the module alone uses (test_docker_e2e's cpu_image) is set up before the
    module's own fixtures, so a snapshot taken there would count its image as already there."""
    module = getattr(item, "module", None)
    name = getattr(module, "__name__", "")
    # Only tests marked ``docker`` build images. Any other module must leave the engine alone:
    # an image that appears meanwhile is someone else's (a benchmark's build was deleted under it
    # when every module cleaned up).
    if name and name not in _BEFORE_MODULE and item.get_closest_marker("docker") is not None:
        engine = _engine()
        _BEFORE_MODULE[name] = set() if engine is None else \
            {image["Id"] for image in engine[0].images(all=True)}


@pytest.fixture(scope="module", autouse=True)
def _images_made_here_are_removed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every image a test module built (tagged, or a build stage left dangling) is removed when
    the module ends. A torch image is over 1 GB and its build stage as much again; kept for the
    whole suite they filled a CI machine's disk (no space left on device) before the last
    module ran. Skipped while another test session uses the engine (its images are new too)."""
    yield
    before = _BEFORE_MODULE.get(request.module.__name__)
    if before is None:  # no test of the module that may build an image ran: the engine untouched
        return
    engine = _engine()  # asked already, by pytest_runtest_setup, which took the shared hold
    if engine is None:
        return
    client, fd = engine
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # alone: no other session is building
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return
    try:
        for image in client.images(all=True):
            if image["Id"] not in before:
                with contextlib.suppress(Exception):  # already gone, or removed with a child
                    client.remove_image(image["Id"], force=True)
    finally:
        fcntl.flock(fd, fcntl.LOCK_SH)


@pytest.fixture(scope="session")
def docker_api() -> Any:
    """The Docker engine's API client (envbuild's own connect). Skipped without an engine, unless
    ENVBUILD_REQUIRE_DOCKER is set (CI, .ci/run): then a missing engine fails the test."""
    import os

    from envbuild.engine.daemon import connect

    try:
        return connect(os.environ)
    except Exception as exc:  # any failure to reach a daemon means: not this machine
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but no Docker engine answers: {exc}")
        pytest.skip(f"no Docker engine: {exc}")
