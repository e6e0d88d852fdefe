"""``apt-snapshot``: the project key, what the lock records, and the rendered step that points apt at
the distribution's snapshot archive (envbuild/render/aptsnapshot.py, templates/partials/
apt_snapshot.j2; docs/faults.md J22–J25). The snapshot services cannot be reached from the machines
that run these tests: the rendered step is run in the Debian test image with no network, on its own
sources and on Ubuntu-shaped ones written in, and the URL forms it writes are compared with the forms
the archives document (docs/apt-snapshot.md)."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from test_cutoff import Served, env, project, run, served  # noqa: F401 (fixtures)

from envbuild.errors import UsageError
from envbuild.render import aptsnapshot
from envbuild.render.templates import environment

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=timezone.utc)
SNAPSHOT = "20261101T000000Z"
IMAGE = "envbuild-test/bookworm:base"


@pytest.mark.parametrize("text", ["2026-11-01", "20261101", "20261101T000000", "20261301T000000Z",
                                  "20261101T250000Z", "latest", "AUTO", "20261101T000000Z; id", ""])
def test_a_bad_setting_is_a_usage_error(text: str) -> None:
    """docs/faults.md J22."""
    with pytest.raises(UsageError) as caught:
        aptsnapshot.parse_setting(text)
    assert "\n" not in caught.value.one_line() and "YYYYMMDDTHHMMSSZ" in caught.value.one_line()


def test_auto_is_the_cutoff_else_a_day_ago_and_fresh_times_are_refused() -> None:
    """docs/faults.md J23: a snapshot less than 24 hours old may still change (FACTS 2026-11-28 §4)."""
    cutoff = datetime(2026, 10, 1, 6, 30, tzinfo=timezone.utc)
    assert aptsnapshot.resolve("auto", now=NOW, cutoff=cutoff, ubuntu_image=True) == "20261001T063000Z"
    assert aptsnapshot.resolve("auto", now=NOW, cutoff=None, ubuntu_image=True) == "20261127T120000Z"
    assert aptsnapshot.resolve(SNAPSHOT, now=NOW, cutoff=None, ubuntu_image=True) == SNAPSHOT
    for fresh in ("20261127T120001Z", "20261201T000000Z"):
        with pytest.raises(UsageError, match="less than 24 hours old"):
            aptsnapshot.resolve(fresh, now=NOW, cutoff=None, ubuntu_image=True)
    # A cut-off fresher than a day: auto takes a day ago instead.
    assert aptsnapshot.resolve("auto", now=NOW, cutoff=NOW - timedelta(hours=2), ubuntu_image=True) \
        == "20261127T120000Z"
    with pytest.raises(UsageError, match="before Ubuntu's snapshot service begins"):
        aptsnapshot.resolve("20230228T235959Z", now=NOW, cutoff=None, ubuntu_image=True)
    old = "20200101T000000Z"  # before Ubuntu's service, for another base (Debian's archive reaches back)
    assert aptsnapshot.resolve(old, now=NOW, cutoff=None, ubuntu_image=False) == old


def test_nvidia_packages_must_be_pinned_and_are_held() -> None:
    """docs/faults.md J24: NVIDIA's repositories have no snapshot service."""
    with pytest.raises(UsageError, match="pin cuda-nvcc-12-4, libcudnn9-cuda-12 as NAME=VERSION"):
        aptsnapshot.check_nvidia_pins(SNAPSHOT, ["git", "cuda-nvcc-12-4", "libcudnn9-cuda-12"])
    aptsnapshot.check_nvidia_pins(None, ["cuda-nvcc-12-4"])  # no snapshot: the live archive anyway
    held = aptsnapshot.holds(SNAPSHOT, ["git", "cuda-nvcc-12-4=0.0-0test", "libgl1=1.7.0-1"])
    assert held == ["cuda-nvcc-12-4"]
    assert aptsnapshot.holds(None, ["cuda-nvcc-12-4=0.0-0test"]) == []


def test_the_project_key_is_recorded_kept_and_checked(
        tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811 (the fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J23: auto with a cut-off records the cut-off's time; the lock renders the
    snapshot step; a changed setting makes lock --check stale; a fresh timestamp is exit 2."""
    monkeypatch.chdir(project(tmp_path, served.url, extra='exclude-newer = "2026-07-01T00:00:00Z"\n'
                                                          'apt-snapshot = "auto"\n'))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["apt_snapshot"] == "20260701T000000Z"
    assert run(capsys, env, "lock", "--check")[0] == 0
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 0, err
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert "snapshot=20260701T000000Z;" in dockerfile and "set -eu;" in dockerfile
    project(tmp_path, served.url,
            extra='exclude-newer = "2026-07-01T00:00:00Z"\napt-snapshot = "20260601T000000Z"\n')
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "apt-snapshot now 20260601T000000Z, locked 20260701T000000Z" in err
    fresh = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y%m%dT%H%M%SZ")
    project(tmp_path, served.url, extra=f'apt-snapshot = "{fresh}"\n')
    before = (tmp_path / "envbuild.lock").read_bytes()
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and "less than 24 hours old" in err
    assert (tmp_path / "envbuild.lock").read_bytes() == before
    project(tmp_path, served.url, extra='apt-snapshot = "yesterday"\n')
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and "envbuild.toml:" in err and "apt-snapshot" in err


def test_a_hand_edited_snapshot_in_a_lock_is_refused(
        tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811 (the fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J22: the lock is hostile input too; the value reaches a RUN line."""
    monkeypatch.chdir(project(tmp_path, served.url, extra='apt-snapshot = "20261101T000000Z"\n'))
    assert run(capsys, env, "lock")[0] == 0
    lock = tmp_path / "envbuild.lock"
    lock.write_text(lock.read_text().replace('"20261101T000000Z"', '"20261101T000000Z; curl x|sh"'))
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 2 and "invalid apt_snapshot in the lock" in err and not (tmp_path / "ctx").exists()


# --- the rendered step, run in a networkless container ----------------------------------------------


def step() -> str:
    """The partial as the Dockerfile's RUN line carries it (backslash-newlines joined, as Docker
    joins them), preceded by ``set -eu``."""
    body = environment().get_template("partials/apt_snapshot.j2").render(apt_snapshot=SNAPSHOT).strip()
    return "set -eu; " + body.replace("\\\n", "")


def in_container(docker_api: Any, setup: str) -> subprocess.CompletedProcess[str]:
    script = f"{setup}\n{step()}\nset +e; echo '--- sources'; cat /etc/apt/sources.list 2>/dev/null; " \
             "cat /etc/apt/sources.list.d/*.sources 2>/dev/null; echo '--- conf'; " \
             "cat /etc/apt/apt.conf.d/50envbuild-snapshot* 2>/dev/null || true"
    return subprocess.run(["docker", "run", "--rm", "--network", "none", IMAGE, "bash", "-c", script],
                          capture_output=True, text=True, timeout=120, check=False)


JAMMY = ("printf 'ID=ubuntu\\nVERSION_CODENAME=jammy\\n' >/usr/lib/os-release; "
         "printf 'deb http://archive.ubuntu.com/ubuntu/ jammy main restricted\\n"
         "deb http://security.ubuntu.com/ubuntu/ jammy-security main restricted\\n' >/etc/apt/sources.list")
NOBLE = ("printf 'ID=ubuntu\\nVERSION_CODENAME=noble\\n' >/usr/lib/os-release; "
         "rm -f /etc/apt/sources.list; printf 'Types: deb\\nURIs: http://archive.ubuntu.com/ubuntu/\\n"
         "Suites: noble noble-updates\\nComponents: main\\n\\nTypes: deb\\n"
         "URIs: http://security.ubuntu.com/ubuntu/\\nSuites: noble-security\\nComponents: main\\n' "
         ">/etc/apt/sources.list.d/ubuntu.sources; rm -f /etc/ssl/certs/ca-certificates.crt")


@pytest.mark.docker
@pytest.mark.parametrize("case", ["debian", "debian-deb822", "jammy", "noble"])
def test_the_step_dates_each_archive_in_its_documented_form(docker_api: Any, case: str) -> None:
    """docs/faults.md J25: Debian's snapshot archive (http://snapshot.debian.org/archive/debian/<ts>/,
    check-valid-until=no, as sources.list and as deb822), Ubuntu 22.04's sources.list rewritten to
    http://snapshot.ubuntu.com/ubuntu/<ts>/, Ubuntu 24.04's deb822 with apt's own Snapshot: true and
    APT::Snapshot (and, without a CA bundle yet, the one host's https read unchecked)."""
    setup = {"debian": "", "jammy": JAMMY, "noble": NOBLE,
             "debian-deb822": "rm /etc/apt/sources.list; printf 'Types: deb\\nURIs: http://deb.debian.org/debian\\n"
                              "Suites: bookworm bookworm-updates\\nComponents: main\\n\\nTypes: deb\\n"
                              "URIs: http://deb.debian.org/debian-security\\nSuites: bookworm-security\\n"
                              "Components: main\\n' >/etc/apt/sources.list.d/debian.sources"}[case]
    done = in_container(docker_api, setup)
    assert done.returncode == 0, done.stderr[-2000:]
    sources, conf = done.stdout.split("--- sources", 1)[1].split("--- conf", 1)
    if case == "debian":
        debian = f"http://snapshot.debian.org/archive/debian/{SNAPSHOT}/"
        assert sources.strip() == f"deb [check-valid-until=no] {debian} bookworm main"
    elif case == "debian-deb822":
        assert f"URIs: http://snapshot.debian.org/archive/debian/{SNAPSHOT}/\n" in sources
        assert f"URIs: http://snapshot.debian.org/archive/debian-security/{SNAPSHOT}/\n" in sources
        assert sources.count("Check-Valid-Until: no") == 2
    elif case == "jammy":
        ubuntu = f"deb [check-valid-until=no] http://snapshot.ubuntu.com/ubuntu/{SNAPSHOT}/"
        assert sources.splitlines()[1:3] == [f"{ubuntu} jammy main restricted",
                                             f"{ubuntu} jammy-security main restricted"]
        assert conf.strip() == ""  # the image has a CA bundle: https is checked
    else:
        assert sources.count("Snapshot: true") == 2 and sources.count("Check-Valid-Until: no") == 2
        assert "URIs: http://archive.ubuntu.com/ubuntu/" in sources  # apt finds the snapshot from the Release
        assert f'APT::Snapshot "{SNAPSHOT}";' in conf
        assert 'Acquire::https::snapshot.ubuntu.com::Verify-Peer "false";' in conf


@pytest.mark.docker
@pytest.mark.parametrize("case, message", [
    ("arm64", "serves no arm64 (ubuntu-ports) archive"),
    ("mirror", ""),
    ("alpine", "no snapshot archive is known for alpine"),
])
def test_the_step_never_falls_back_to_the_live_archive(docker_api: Any, case: str, message: str) -> None:
    """docs/faults.md J25: an architecture the service does not serve, sources it cannot date (a
    mirror), an unknown distribution: the step fails, never the live archive in silence."""
    stub = "printf '#!/bin/sh\\necho arm64\\n' >/usr/local/bin/dpkg; chmod +x /usr/local/bin/dpkg"
    setup = {"arm64": f"{JAMMY}; {stub}",
             "mirror": "printf 'deb http://mirror.example/debian bookworm main\\n' >/etc/apt/sources.list",
             "alpine": "printf 'ID=alpine\\n' >/usr/lib/os-release"}[case]
    done = in_container(docker_api, setup)
    assert done.returncode != 0 and "--- sources" not in done.stdout
    assert message in done.stderr
