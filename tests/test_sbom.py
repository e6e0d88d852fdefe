"""``envbuild sbom``: a CycloneDX 1.6 bill of materials per target, validated by a real JSON Schema
validator (check-jsonschema) against the specification's own schema (tests/fixtures/cyclonedx,
SOURCE.md says where it came from); and the Debian package record it reads
(envbuild/sbom/debs.py) that build --lock writes. docs/faults.md J18–J21."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_cutoff import Served, env, project, run, served  # noqa: F401 (fixtures)

from envbuild.commands.built import record_debs
from envbuild.errors import BuildFailed, UsageError
from envbuild.render.lock import Lock
from envbuild.render.lockset import read_target
from envbuild.sbom.debs import STATUS as STATUS_PATH
from envbuild.sbom.debs import Debs, differences, os_id, parse_record, parse_status, record_text
from envbuild.sbom.debs import read_record as read_debs

FIXTURES = Path(__file__).parent / "fixtures" / "cyclonedx"
STATUS = """Package: libc6
Status: install ok installed
Priority: optional
Architecture: amd64
Multi-Arch: same
Version: 2.36-9+deb12u9
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system. Status: install ok installed

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1

Package: g++
Status: install ok installed
Architecture: amd64
Version: 4:12.2.0-3

Package: evil;rm
Status: install ok installed
Architecture: amd64
Version: 1.0

Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6+deb12u5
"""


def validate(document: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema against the CycloneDX 1.6 schema; its $refs (spdx, jsf) resolve in the
    fixture directory, nothing is fetched."""
    pytest.importorskip("check_jsonschema")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile",
                           str(FIXTURES / "bom-1.6.schema.json"), "--base-uri", FIXTURES.as_uri() + "/",
                           str(document)], capture_output=True, text=True, timeout=120, check=False)


def test_the_status_file_gives_installed_packages_only() -> None:
    assert parse_status(STATUS) == {"g++:amd64": "4:12.2.0-3", "libc6:amd64": "2.36-9+deb12u9",
                                    "python3.11:amd64": "3.11.2-6+deb12u5"}
    assert os_id('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n') == "debian"
    assert os_id("ID=\"ubuntu\"\n") == "ubuntu" and os_id("ID=alpine\n") is None


def test_differences_name_every_package() -> None:
    old = {"libc6:amd64": "2.36-9+deb12u9", "g++:amd64": "4:12.2.0-3", "gone:amd64": "1"}
    new = {"libc6:amd64": "2.36-9+deb12u10", "g++:amd64": "4:12.2.0-3", "fresh:all": "2"}
    assert differences(old, new) == ["fresh:all 2 added", "gone:amd64 1 removed",
                                     "libc6:amd64 2.36-9+deb12u9 → 2.36-9+deb12u10"]
    assert differences(old, old) == []


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"schema": "envbuild.debs/2", "targets": {}}',
    '{"schema": "envbuild.debs/1", "targets": {"BAD NAME": {}}}',
    '{"schema": "envbuild.debs/1", "targets": {"a": {"lock_sha256": "x", "os": null, "packages": {}}}}',
    '{"schema": "envbuild.debs/1", "targets": {"a": {"lock_sha256": "' + "a" * 64
    + '", "os": "windows", "packages": {}}}}',
    '{"schema": "envbuild.debs/1", "targets": {"a": {"lock_sha256": "' + "a" * 64
    + '", "os": null, "packages": {"x;id:amd64": "1"}}}}',
    '{"schema": "envbuild.debs/1", "targets": {"a": {"lock_sha256": "' + "a" * 64
    + '", "os": null, "packages": {"x:amd64": "1\\nRUN id"}}}}',
])
def test_a_hostile_record_is_refused_without_quoting_it(text: str) -> None:
    """docs/faults.md J18."""
    with pytest.raises(UsageError) as caught:
        parse_record(text)
    line = caught.value.one_line()
    assert "envbuild.debs.json" in line and "RUN id" not in line and "x;id" not in line


def test_a_record_reads_back() -> None:
    record = {"gpu": Debs(packages={"libc6:amd64": "2.36-9"}, os="debian", lock_sha256="b" * 64)}
    assert parse_record(record_text(record)) == record


def test_the_sbom_of_a_lock_is_valid_cyclonedx_with_every_distribution(
        tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811 (the fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J19: every Python distribution with the sha256 and URL of the file the image
    installs, the base image by digest, the recorded Debian packages; valid against CycloneDX 1.6;
    the same bytes twice."""
    monkeypatch.chdir(project(tmp_path, served.url, extra='exclude-newer = "2026-07-01T00:00:00Z"\n'))
    assert run(capsys, env, "lock")[0] == 0
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock")
    assert code == 0 and "wrote" in out and "no Debian packages recorded" in err
    first = (tmp_path / "sbom.default.cdx.json").read_bytes()
    done = validate(tmp_path / "sbom.default.cdx.json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(first)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    python = {c["name"]: c for c in doc["components"] if c["purl"].startswith("pkg:pypi/")}
    pylock = (tmp_path / "pylock.toml").read_text()
    assert sorted(python) == ["filelock", "six", "torch"]
    for component in python.values():
        (sha,) = [h["content"] for h in component["hashes"]]
        (ref,) = component["externalReferences"]
        assert ref["type"] == "distribution" and ref["url"] in pylock and sha in pylock
    assert python["six"]["purl"] == "pkg:pypi/six@1.17.0"
    assert {"name": "envbuild:upload-time", "value": "2026-06-01T00:00:00Z"} in python["six"]["properties"]
    (base,) = [c for c in doc["components"] if c["type"] == "container"]
    assert base["version"] == "sha256:" + "a" * 64
    assert base["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert base["purl"] == ("pkg:oci/debian@sha256%3A" + "a" * 64
                            + "?repository_url=mirror.example/library/debian&tag=bookworm")
    # What a build recorded is listed: the Debian packages, with the OS as the purl's namespace.
    lock_sha = "c" * 64
    (tmp_path / "envbuild.debs.json").write_text(record_text(
        {"default": Debs(packages=parse_status(STATUS), os="debian", lock_sha256=lock_sha)}))
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--stdout")
    assert code == 0 and err == "", err
    doc = json.loads(out)
    debs = {c["purl"] for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    assert debs == {"pkg:deb/debian/g++@4%3A12.2.0-3?arch=amd64",
                    "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64",
                    "pkg:deb/debian/python3.11@3.11.2-6%2Bdeb12u5?arch=amd64"}
    (tmp_path / "with-debs.json").write_text(out)
    done = validate(tmp_path / "with-debs.json")
    assert done.returncode == 0, done.stdout + done.stderr
    # Deterministic: the same lock and record, the same bytes; the record's removal, the first ones.
    (tmp_path / "envbuild.debs.json").unlink()
    assert run(capsys, env, "sbom", "--lock", "envbuild.lock")[0] == 0
    assert (tmp_path / "sbom.default.cdx.json").read_bytes() == first


def test_the_validator_has_teeth(tmp_path: Path) -> None:
    """The schema check fails a document CycloneDX 1.6 refuses (a hash of the wrong length, an
    unknown component type): the validation above is no formality."""
    bad = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
           "components": [{"type": "wheel", "name": "six", "bom-ref": "x",
                           "hashes": [{"alg": "SHA-256", "content": "abc"}]}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    done = validate(tmp_path / "bad.json")
    assert done.returncode != 0 and "bad.json" in done.stdout + done.stderr


def test_sbom_refuses_a_stack_only_lock_and_bad_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J20."""
    monkeypatch.chdir(tmp_path)
    environment = {"PATH": "/usr/bin:/bin"}
    code, _, err = run(capsys, environment, "lock", "--stack-only", "--no-project", "--driver", "550",
                       "--torch", "2.4.1", "--variant", "cu121", "--python", "3.11",
                       "--base-image", "nvidia/cuda@sha256:" + "b" * 64)
    assert code == 0, err
    code, _, err = run(capsys, environment, "sbom", "--lock", "envbuild.lock")
    assert code == 2 and "stack-only lock" in err and err.count("\n") == 1
    code, _, err = run(capsys, environment, "sbom", "--lock", "envbuild.lock", "--target", "Nope")
    assert code == 2 and "invalid target name" in err
    code, _, err = run(capsys, environment, "build", "--lock", "envbuild.lock", "--sbom",
                       "--builder", "buildah")
    assert code == 2 and "--sbom: target default is a stack-only lock" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.lock"]


# --- build --lock records the image's Debian packages ------------------------------------------


class ImageFiles:
    """A stand-in Docker API client whose one image holds ``files`` (path -> bytes): what
    envbuild/engine/imagefile.py asks of it (create, get_archive, remove)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.removed: list[str] = []

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        assert kwargs["network_disabled"] is True  # nothing of the image runs, and it reaches nothing
        return {"Id": f"c{len(self.removed)}"}

    def get_archive(self, cid: str, path: str) -> tuple[Iterator[bytes], dict[str, int]]:
        import docker.errors

        if path not in self.files:
            raise docker.errors.NotFound(f"no {path}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            member.size = len(self.files[path])
            tar.addfile(member, io.BytesIO(self.files[path]))
        return iter([buffer.getvalue()]), {"size": len(self.files[path])}

    def remove_container(self, cid: str, force: bool = False) -> None:
        self.removed.append(cid)


@pytest.fixture()
def stack_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Lock:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, {"PATH": "/usr/bin:/bin"}, "lock", "--stack-only", "--no-project",
                       "--driver", "550", "--torch", "2.4.1", "--variant", "cu121", "--python", "3.11",
                       "--base-image", "nvidia/cuda@sha256:" + "b" * 64)
    assert code == 0, err
    return read_target(tmp_path / "envbuild.lock", None)[1]


def test_build_records_the_debian_packages_then_names_every_difference(
        tmp_path: Path, stack_lock: Lock, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md J21: the first build records; the same packages again say so; a rebuild with
    other packages warns naming each and keeps the record; --strict is exit 6; --accept-rebuilt
    records the new set; a record made for another lock is replaced, saying so."""
    said: list[str] = []
    release = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
    first = ImageFiles({STATUS_PATH: STATUS.encode(), "/usr/lib/os-release": release})
    record_debs(first, "img", stack_lock, "default", tmp_path, said.append)
    assert said == ["Debian packages: 3 recorded in envbuild.debs.json for target default"]
    recorded = read_debs(tmp_path)["default"]
    assert recorded.os == "debian" and recorded.packages["libc6:amd64"] == "2.36-9+deb12u9"
    assert first.removed  # every container it created removed
    record_debs(first, "img", stack_lock, "default", tmp_path, said.append)
    assert said[-1] == "Debian packages: 3, as envbuild.debs.json records for target default"
    moved = STATUS.replace("2.36-9+deb12u9", "2.36-9+deb12u10").replace("Package: g++", "Package: gcc")
    later = ImageFiles({STATUS_PATH: moved.encode()})
    before = (tmp_path / "envbuild.debs.json").read_bytes()
    capsys.readouterr()
    record_debs(later, "img", stack_lock, "default", tmp_path, said.append)
    err = capsys.readouterr().err
    assert "differ from those envbuild.debs.json records for target default (3" in err
    for name in ("g++:amd64 4:12.2.0-3 removed", "gcc:amd64 4:12.2.0-3 added",
                 "libc6:amd64 2.36-9+deb12u9 → 2.36-9+deb12u10"):
        assert name in err
    assert (tmp_path / "envbuild.debs.json").read_bytes() == before
    with pytest.raises(BuildFailed) as caught:
        record_debs(later, "img", stack_lock, "default", tmp_path, said.append, strict=True)
    assert caught.value.exit_code == 6
    assert "libc6:amd64 2.36-9+deb12u9 → 2.36-9+deb12u10" in caught.value.message
    assert (tmp_path / "envbuild.debs.json").read_bytes() == before
    record_debs(later, "img", stack_lock, "default", tmp_path, said.append, accept=True)
    assert read_debs(tmp_path)["default"].packages["libc6:amd64"] == "2.36-9+deb12u10"
    other = replace(stack_lock, apt_packages=("curl",))
    record_debs(first, "img", other, "default", tmp_path, said.append)
    assert said[-1].endswith("(the record of another lock of this target replaced)")
    capsys.readouterr()
    record_debs(None, "img", stack_lock, "default", tmp_path, said.append)
    assert "not recorded" in capsys.readouterr().err


@pytest.mark.docker
def test_the_base_images_dpkg_database_is_read_without_running_it(docker_api: Any) -> None:
    """The real engine: the debootstrapped bookworm's status file, through a created (never
    started) container."""
    from envbuild.engine.imagefile import read_image_file

    data = read_image_file(docker_api, "envbuild-test/bookworm:base", STATUS_PATH, limit=64 * 1024 * 1024)
    assert data is not None
    packages = parse_status(data.decode("utf-8", "replace"))
    assert "libc6:amd64" in packages and "python3.11:amd64" in packages and len(packages) > 50
    release = read_image_file(docker_api, "envbuild-test/bookworm:base", "/usr/lib/os-release")
    assert release is not None and os_id(release.decode()) == "debian"


def test_build_sbom_writes_the_document_naming_the_image(
        tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811 (the fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J20: build --lock --sbom (buildah a stand-in, no Docker engine: the Debian
    packages cannot be read, which the build says and the document records); --sbom without
    --lock, or on a stack-only lock, is exit 2 before any build."""
    from test_build_targets import stand_in_buildah

    monkeypatch.chdir(project(tmp_path, served.url))
    assert run(capsys, env, "lock")[0] == 0
    tools = tmp_path / "tools"
    tools.mkdir()
    stand_in_buildah(tools)
    built = {**env, "PATH": f"{tools}:{env['PATH']}", "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock",
             "DOCKER_CONFIG": str(tmp_path / "no-config")}
    monkeypatch.setenv("PATH", built["PATH"])
    monkeypatch.setenv("DOCKER_HOST", built["DOCKER_HOST"])
    monkeypatch.setenv("DOCKER_CONFIG", built["DOCKER_CONFIG"])
    code, out, err = run(capsys, built, "build", "--lock", "envbuild.lock", "--builder", "buildah",
                         "--tag", "ml/torch:sbom", "--sbom")
    assert code == 0, err
    assert "Debian packages were not recorded" in err and "sbom.default.cdx.json" in out
    doc = json.loads((tmp_path / "sbom.default.cdx.json").read_text())
    assert doc["metadata"]["component"]["name"] == "ml/torch:sbom"
    assert {"name": "envbuild:debian-packages",
            "value": "not recorded: no build --lock of this target has read its image yet"} \
        in doc["metadata"]["component"]["properties"]
    done = validate(tmp_path / "sbom.default.cdx.json")
    assert done.returncode == 0, done.stdout + done.stderr
    code, _, err = run(capsys, built, "build", "--sbom", "--builder", "buildah")
    assert code == 2 and "--sbom lists what a lock pins: it needs --lock FILE" in err


@pytest.mark.docker
def test_record_debs_reads_a_real_image(docker_api: Any, tmp_path: Path, stack_lock: Lock) -> None:
    """The real engine end to end for the record: the test base image's packages and its OS."""
    said: list[str] = []
    record_debs(docker_api, "envbuild-test/bookworm:base", stack_lock, "default", tmp_path, said.append)
    recorded = read_debs(tmp_path)["default"]
    assert recorded.os == "debian" and "libc6:amd64" in recorded.packages
    count = len(recorded.packages)
    assert said == [f"Debian packages: {count} recorded in envbuild.debs.json for target default"]
    record_debs(docker_api, "envbuild-test/bookworm:base", stack_lock, "default", tmp_path, said.append)
    assert said[-1].endswith("as envbuild.debs.json records for target default")
