"""torchvision/torchaudio for every torch release, or the reason there is none.

The pairing rule of ``torch_facts.loose_pairs`` (a companion that only requires ``torch>=X.Y.0``
pairs with the newest X.Y patches), the reasons the refresh writes for a torch without a
companion, the refresh itself against a package index on 127.0.0.1, the validator's demand
that a null companion says why, and the note ``resolve`` and the lock carry.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import io
import json
import os
import re
import shutil
import ssl
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild.commands import cli
from envbuild.data import matrix as matrices
from envbuild.errors import DataError
from envbuild.resolver.checks import companions_missing
from envbuild.resolver.resolve import resolve
from envbuild.resolver.selection import Selectors, build_request
from envbuild.upstream import companion_builds, refresh, torch_facts
from envbuild.upstream.http_client import HttpPolicy
from envbuild.upstream.sources import pypi_source
from envbuild.upstream.torch_facts import CompanionFact, PypiFacts

REPO = Path(__file__).resolve().parents[1]
FAST = HttpPolicy(connect_timeout_s=1.0, read_timeout_s=1.0, total_timeout_s=5.0, attempts=2,
                  backoff_s=0.01, max_retry_after_s=1.0)


def fact(project: str, version: str, requirement: str | None) -> CompanionFact:
    pinned = requirement[2:] if requirement and requirement.startswith("==") else None
    return CompanionFact(project=project, version=version, torch=pinned, torch_requirement=requirement,
                         filename=f"{project}-{version}-cp311-cp311-manylinux_2_28_x86_64.whl",
                         metadata_bytes=0)


VISION = (fact("torchvision", "0.28.0", "==2.13.0"), fact("torchvision", "0.29.0", "==2.14.0"),
          fact("torchvision", "0.29.1", ">=2.14.0"), fact("torchvision", "0.29.2", ">=2.14.0"))
AUDIO = (fact("torchaudio", "2.11.0", None),)
TORCH = ("2.13.0", "2.14.0", "2.14.1", "2.15.0")


def paired(table: tuple[torch_facts.CompanionRow, ...]) -> list[tuple[str, str | None, str | None]]:
    return [(r.torch, r.torchvision and r.torchvision.version, r.torchaudio and r.torchaudio.version)
            for r in table]


# --- the rule --------------------------------------------------------------------------------


def test_a_lower_bound_companion_pairs_with_the_newest_patches_of_its_minor() -> None:
    table = torch_facts.companions_table(TORCH, VISION, AUDIO)
    assert paired(table) == [
        ("2.13.0", "0.28.0", None),
        ("2.14.0", "0.29.0", None),  # an exact pin wins over the newer loose release
        ("2.14.1", "0.29.2", None),  # the newest of the two loose 0.29 releases
        ("2.15.0", None, None),  # 0.29.x declares torch>=2.14.0: nothing is built for 2.15
    ]


def test_a_patch_older_than_a_pinned_one_stays_unpaired() -> None:
    """The loose release was built after 2.14.1's exact pin, for the newest torch: 2.14.0 gets
    nothing, 2.14.2 gets 0.29.2."""
    vision = (fact("torchvision", "0.29.1", "==2.14.1"), fact("torchvision", "0.29.2", ">=2.14.0"))
    table = torch_facts.companions_table(("2.14.0", "2.14.1", "2.14.2"), vision, ())
    assert paired(table) == [("2.14.0", None, None), ("2.14.1", "0.29.1", None),
                             ("2.14.2", "0.29.2", None)]


def test_without_any_exact_pin_every_patch_of_the_minor_pairs() -> None:
    vision = (fact("torchvision", "0.29.1", ">=2.14"), fact("torchvision", "0.29.2", ">=2.14.0"))
    table = torch_facts.companions_table(("2.14.0", "2.14.1"), vision, ())
    assert paired(table) == [("2.14.0", "0.29.2", None), ("2.14.1", "0.29.2", None)]


@pytest.mark.parametrize("requirement, minor", [
    (">=2.14.0", (2, 14)),
    (">=2.14", (2, 14)),
    (">=2.14.1", None),  # a bound inside the minor: not the "built for X.Y" shape
    (">=2.14.0,<2.15", None),  # an upper bound: not the shape the rule reads
    ("<3,>=2.14.0", None),
    (">2.14.0", None),
    (None, None),
])
def test_loose_minor_reads_only_a_bare_lower_bound(requirement: str | None,
                                                   minor: tuple[int, int] | None) -> None:
    assert torch_facts.loose_minor(fact("torchvision", "0.29.2", requirement)) == minor


def test_an_exact_pin_is_never_loose() -> None:
    assert torch_facts.loose_minor(fact("torchvision", "0.29.0", "==2.14.0")) is None


# --- the rows --------------------------------------------------------------------------------


def torch_fact(version: str) -> torch_facts.TorchWheelFact:
    return torch_facts.TorchWheelFact(
        torch=version, default_variant="cu130", python=("3.11",), free_threaded=(),
        requires_python=">=3.10", platform_tag="manylinux_2_28_x86_64", other_platform_tags=(),
        cuda_runtime="13.0.3", cuda_runtime_via="nvidia-cuda-runtime==13.0.3", cudnn=None, nccl=None,
        filename=f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl", metadata_bytes=0)


def documents() -> dict[str, dict[str, Any]]:
    facts = PypiFacts(torch=tuple(torch_fact(v) for v in TORCH), torchvision=VISION, torchaudio=AUDIO,
                      companions=torch_facts.companions_table(TORCH, VISION, AUDIO))
    return pypi_source.build_documents(facts, "2026-11-24")


def test_rows_say_how_each_companion_was_paired_or_why_there_is_none() -> None:
    rows = {r["torch"]: r for r in documents()["torch_companions"]["rows"]}
    assert rows["2.14.1"]["torchvision"] == "0.29.2"
    assert rows["2.14.1"]["note"].startswith(
        "torchvision 0.29.2 requires torch>=2.14.0 without an exact pin: paired with the newest "
        f"torch 2.14 patch releases (one torchvision minor per torch minor, {pypi_source.PAIRING_SOURCE})")
    none = rows["2.15.0"]
    assert (none["torchvision"], none["torchaudio"]) == (None, None)
    assert none["note"].split("; ") == [
        "no torchvision release on the index as of 2026-11-24 pins torch 2.15.0 or requires "
        "torch>=2.15.0: the newest, 0.29.2, declares torch>=2.14.0",
        "no torchaudio release on the index as of 2026-11-24 pins torch 2.15.0 or requires "
        "torch>=2.15.0: the newest, 2.11.0, declares no torch requirement",
    ]
    # The evidence read is the source: the newest torchvision wheel.
    assert none["source"] == ("pip-index:///simple/torchvision/"
                              "#torchvision-0.29.2-cp311-cp311-manylinux_2_28_x86_64.whl")
    description = documents()["torch_companions"]["description"]
    assert "https://github.com/pytorch/vision/blob/main/README.md" in description


def test_torch_pypi_rows_carry_the_same_pairing() -> None:
    rows = {r["torch"]: r for r in documents()["torch_pypi"]["rows"]}
    assert (rows["2.14.1"]["torchvision"], rows["2.15.0"]["torchvision"]) == ("0.29.2", None)
    assert "no torchvision release on the index as of 2026-11-24 pins torch 2.15.0" in rows["2.15.0"]["note"]


def test_no_row_when_no_companion_release_was_read() -> None:
    facts = PypiFacts(torch=(torch_fact("2.15.0"),), torchvision=(), torchaudio=(),
                      companions=torch_facts.companions_table(["2.15.0"], (), ()))
    assert pypi_source.build_documents(facts, "2026-11-24")["torch_companions"]["rows"] == []


# --- the build rule (companion_builds) ---------------------------------------------------------


def built(project: str, version: str, requirement: str | None, build: str | None,
          uploaded: str | None) -> CompanionFact:
    return replace(fact(project, version, requirement), build=build, upload_time=uploaded)


def released(version: str, variant: str, uploaded: str | None) -> torch_facts.TorchWheelFact:
    return replace(torch_fact(version), default_variant=variant, upload_time=uploaded)


RELEASED = (released("2.11.0", "cu130", "2026-03-23T18:10:03.569566Z"),
            released("2.14.0", "cu130", "2026-09-02T13:44:10Z"),
            released("2.14.1", "cu130", "2026-09-30T17:49:10.777596Z"),
            released("2.15.0", "cu132", "2026-10-28T15:17:10Z"))
BUILT = (fact("torchvision", "0.29.0", "==2.14.0"),
         built("torchvision", "0.29.1", ">=2.14.0", "0.29.1+cu130", "2026-09-30T17:57:14.126831Z"),
         built("torchvision", "0.29.2", ">=2.14.0", "0.29.2+cu132", "2026-10-28T15:21:34Z"))


def test_a_companions_build_and_upload_time_tie_it_to_one_torch() -> None:
    """docs/faults.md S12: the CUDA of the build (version.py) and the upload time next to torch's
    pair 0.29.1 with 2.14.1 and 0.29.2 with 2.15.0, where the lower-bound rule could not tell."""
    vision = companion_builds.place(BUILT, RELEASED)
    audio = companion_builds.place(
        (built("torchaudio", "2.11.0", None, "2.11.0+cu130", "2026-03-23T18:13:37.963527Z"),), RELEASED)
    assert [f.built_for for f in vision] == [None, "2.14.1", "2.15.0"]
    table = torch_facts.companions_table([r.torch for r in RELEASED], vision, audio)
    assert paired(table) == [("2.11.0", None, "2.11.0"), ("2.14.0", "0.29.0", None),
                             ("2.14.1", "0.29.1", None), ("2.15.0", "0.29.2", None)]
    assert vision[2].evidence == (
        "its wheel's version.py reads 0.29.2+cu132, the build of torch 2.15.0's default wheel (cu132), "
        "and was uploaded 2026-10-28 15:21 UTC, 4 minutes after torch 2.15.0's")


@pytest.mark.parametrize("changed", [
    built("torchvision", "0.29.2", ">=2.14.0", "0.29.2+cu130", "2026-10-28T15:21:34Z"),  # 2.15.0 is cu132
    built("torchvision", "0.29.2", ">=2.14.0", "0.29.2+cu132", "2026-10-30T15:21:34Z"),  # two days later
    built("torchvision", "0.29.2", ">=2.16.0", "0.29.2+cu132", "2026-10-28T15:21:34Z"),  # 2.15.0 not admitted
    built("torchvision", "0.29.2", ">=2.14.0", "0.29.2+cu132", None),  # no upload time on the index
    built("torchvision", "0.29.2", ">=2.14.0", None, "2026-10-28T15:21:34Z"),  # no build in version.py
])
def test_without_matching_evidence_a_companion_is_left_to_the_lower_bound_rule(
        changed: CompanionFact) -> None:
    assert companion_builds.place((changed,), RELEASED)[0].built_for is None


def test_two_torch_releases_matching_tie_to_neither() -> None:
    twin = released("2.14.2", "cu130", "2026-09-30T20:00:00Z")
    assert companion_builds.place(BUILT, (*RELEASED, twin))[1].built_for is None


@pytest.mark.parametrize(("text", "build"), [
    (b"__version__ = '0.29.2+cu132'\ngit_version = 'f1'\n", "0.29.2+cu132"),
    (b'__version__ = "0.29.1+cpu"\n', "0.29.1+cpu"),
    (b"__version__ = '0.29.2'\n", None),  # no build tag: says nothing of the CUDA
    (b"__version__ = '0.30.0+cu132'\n", None),  # another release than the wheel's
    (b"__version__ = '0.29.2+rocm7.0'\n", None),  # not a build the torch rows name
    (b"__version__ = '0.29.2+cu132' + suffix\n", None),  # code, not a literal
    (b"\xff\xfe" * 10, None),
])
def test_build_version_reads_only_a_literal_of_the_wheels_own_release(text: bytes, build: str | None) -> None:
    assert companion_builds.build_version(text, "0.29.2" if "0.29.1" not in str(text) else "0.29.1") == build


# --- the refresh against a package index on 127.0.0.1 -----------------------------------------


def _metadata(name: str, version: str, requires: list[str]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Requires-Python: >=3.10"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n\n").encode()


# project → {version: Requires-Dist lines}
PUBLISHED: dict[str, dict[str, list[str]]] = {
    "torch": {"2.11.0": ["nvidia-cuda-runtime==13.0.96"], "2.14.0": ["nvidia-cuda-runtime==13.0.96"],
              "2.14.1": ["nvidia-cuda-runtime==13.0.96"], "2.15.0": ["nvidia-cuda-runtime==13.2.51"]},
    "torchvision": {"0.26.0": ["torch==2.11.0"], "0.29.0": ["torch==2.14.0"], "0.29.1": ["torch>=2.14.0"],
                    "0.29.2": ["torch>=2.14.0"]},
    "torchaudio": {"2.11.0": [], "2.14.0": ["torch<2.15,>=2.14.0"]},
}
# What the index's wheels say of themselves (FACTS-2026-11-25 F, read 2026-11-25): version.py's
# __version__ of the releases that pin no torch, and the PEP 700 upload times.
BUILDS: dict[tuple[str, str], str] = {
    ("torchvision", "0.29.1"): "0.29.1+cu130", ("torchvision", "0.29.2"): "0.29.2+cu132",
    ("torchaudio", "2.11.0"): "2.11.0+cu130"}
UPLOADED: dict[tuple[str, str], str] = {
    ("torch", "2.11.0"): "2026-03-23T18:10:03.569566Z",
    ("torchaudio", "2.11.0"): "2026-03-23T18:13:37.963527Z",
    ("torch", "2.14.0"): "2026-09-02T13:44:10.199237Z",
    ("torchvision", "0.29.0"): "2026-09-02T13:47:01.281021Z",
    ("torch", "2.14.1"): "2026-09-30T17:49:10.777596Z",
    ("torchvision", "0.29.1"): "2026-09-30T17:57:14.126831Z",
    ("torch", "2.15.0"): "2026-10-28T15:17:10Z",
    ("torchvision", "0.29.2"): "2026-10-28T15:21:34Z"}


def _wheel(project: str, version: str, builds: dict[tuple[str, str], str]) -> bytes:
    """A zip wheel; with the release's version.py when ``builds`` names one."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{project}/__init__.py", "")
        if (project, version) in builds:
            archive.writestr(f"{project}/version.py",
                             f"__version__ = '{builds[project, version]}'\ngit_version = 'abc'\n")
    return buffer.getvalue()


def _routes(published: dict[str, dict[str, list[str]]] | None = None,
            builds: dict[tuple[str, str], str] | None = None) -> dict[str, bytes]:
    routes: dict[str, bytes] = {}
    for project, releases in (PUBLISHED if published is None else published).items():
        files = []
        for version, requires in releases.items():
            filename = f"{project}-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
            files.append({"filename": filename, "url": f"/files/{filename}", "hashes": {},
                          "size": 1000, "core-metadata": True,
                          "upload-time": UPLOADED.get((project, version))})
            routes[f"/files/{filename}.metadata"] = _metadata(project, version, requires)
            routes[f"/files/{filename}"] = _wheel(project, version, BUILDS if builds is None else builds)
        routes[f"/simple/{project}/"] = json.dumps(
            {"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()
    return routes


def _span(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of ``bytes=-n`` / ``bytes=a-b``, as a wheel host answers a range request."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header or "")
    if match is None:
        return None
    if not match[1]:
        return max(0, size - int(match[2])), size
    return int(match[1]), min(int(match[2]) + 1, size)


@contextlib.contextmanager
def index_server(context: ssl.SSLContext, routes: dict[str, bytes] | None = None) -> Iterator[str]:
    routes = _routes() if routes is None else routes  # a caller's dict may change while served

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = routes.get(self.path)
            span = _span(self.headers.get("Range"), len(body)) if body is not None else None
            self.send_response(404 if body is None else 206 if span else 200)
            if body is not None and span is not None:
                self.send_header("Content-Range", f"bytes {span[0]}-{span[1] - 1}/{len(body)}")
                body = body[span[0]:span[1]]
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def index_and_env(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    with serving_index(tmp_path, _routes()) as served:
        yield served


@contextlib.contextmanager
def serving_index(tmp_path: Path, routes: dict[str, bytes]) -> Iterator[tuple[str, dict[str, str]]]:
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path), "PATH": os.environ["PATH"],
           "PIP_CERT": str(ca)}
    with index_server(context, routes) as url:
        yield url, env


def trimmed_data(tmp_path: Path) -> Path:
    """The data with torch_wheels cut to the releases the local index publishes, so that
    dropping the other index rows (--allow-shrink) leaves a valid data set."""
    data = tmp_path / "matrices"
    shutil.copytree(REPO / "matrices", data)
    wheels = yaml.safe_load((data / "torch_wheels.yaml").read_text())
    wheels["rows"] = [r for r in wheels["rows"] if r["torch"] in PUBLISHED["torch"]]
    (data / "torch_wheels.yaml").write_text(yaml.safe_dump(wheels, sort_keys=False))
    return data


def _recorded(relation: str, data: Path = REPO / "matrices") -> dict[str, dict[str, Any]]:
    return {r["torch"]: r for r in yaml.safe_load((data / f"{relation}.yaml").read_text())["rows"]}


def test_refresh_derives_the_sourced_pairs_from_each_wheels_build_and_upload_time(
        tmp_path: Path, index_and_env: tuple[str, dict[str, str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md S11: the lower-bound rule paired 2.14.1 with 0.29.2 and left 2.15.0 without
    torchvision (FACTS-2026-11-25 F). version.py's build and the upload times tie 0.29.1 to 2.14.1,
    0.29.2 to 2.15.0 and torchaudio 2.11.0 (no torch requirement) to 2.11.0, as the data records."""
    url, env = index_and_env
    data = trimmed_data(tmp_path)
    code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "pypi", "--index-url", url,
                     "--allow-shrink"], env)
    assert code == 0
    read = datetime.datetime.now(datetime.timezone.utc).date().isoformat()  # the refresh's "read" date
    assert "(torch_companions +0 ~3 -26 =1 hand-sourced kept," in capsys.readouterr().out
    rows, pypi = _recorded("torch_companions", data), _recorded("torch_pypi", data)
    recorded = _recorded("torch_companions")  # the bundled data: the sourced facts
    pairs = {t: (r["torchvision"], r["torchaudio"]) for t, r in rows.items()}
    assert pairs == {"2.11.0": ("0.26.0", "2.11.0"), "2.14.0": ("0.29.0", None),
                     "2.14.1": ("0.29.1", None), "2.15.0": ("0.29.2", None)}
    assert pairs == {t: (recorded[t]["torchvision"], recorded[t]["torchaudio"]) for t in pairs}
    assert {t: (r["torchvision"], r["torchaudio"]) for t, r in pypi.items()} == pairs
    # 2.11.0's row cites the previous-versions page: hand-sourced, kept as it is.
    assert rows["2.11.0"] == _recorded("torch_companions")["2.11.0"]
    assert pypi["2.11.0"]["note"].endswith(
        "torchaudio 2.11.0 declares no torch requirement: paired with torch 2.11.0 by its build: its "
        "wheel's version.py reads 2.11.0+cu130, the build of torch 2.11.0's default wheel (cu130), and "
        "was uploaded 2026-03-23 18:13 UTC, 4 minutes after torch 2.11.0's")
    assert rows["2.15.0"]["note"].startswith(
        "torchvision 0.29.2 requires torch>=2.14.0 without an exact pin: paired with torch 2.15.0 by its "
        "build: its wheel's version.py reads 0.29.2+cu132, the build of torch 2.15.0's default wheel (cu132)")
    # The CPython versions of each companion's Linux wheels come from the file lists, with their source.
    assert (rows["2.14.1"]["torchvision_python"], "torchaudio_python" in rows["2.14.1"]) == (["3.11"], False)
    assert rows["2.14.1"]["note"].endswith(
        "torchvision_python/torchaudio_python: the CPython versions (cpXY-cpXY tags) of the Linux x86_64 "
        "wheels of torchvision 0.29.1 in the index's file lists (pip-index:///simple/torchvision/, "
        f"pip-index:///simple/torchaudio/), read {read}")
    assert "reads 0.29.1+cu130" in rows["2.14.1"]["note"]
    assert "8 minutes after torch 2.14.1's" in rows["2.14.1"]["note"]
    # torchaudio 2.14.0 bounds torch above as well: the rule does not read it, the note names it.
    assert (f"no torchaudio release on the index as of {read} pins torch 2.14.1 or requires "
            "torch>=2.14.0: the newest, 2.14.0, declares torch<2.15,>=2.14.0") in rows["2.14.1"]["note"]
    assert rows["2.15.0"]["source"].startswith(
        "pip-index:///simple/torchvision/#torchvision-0.29.2-cp311-cp311-manylinux_2_28_x86_64.whl&sha256=")
    text = (data / "torch_companions.yaml").read_text() + (data / "torch_pypi.yaml").read_text()
    assert "127.0.0.1" not in text


def test_without_a_build_in_the_wheel_the_lower_bound_rule_still_pairs(tmp_path: Path) -> None:
    """A wheel without version.py (or a build without +cuNNN) gives no evidence: the lower-bound
    rule pairs as before, and its note says so."""
    data = trimmed_data(tmp_path)
    with serving_index(tmp_path, _routes(builds={})) as (url, env):
        options = refresh.RefreshOptions(matrices=data, sources=("pypi",), index_url=url, policy=FAST,
                                         allow_shrink=True, retrieved="2026-11-24")
        refresh.refresh(options, env, lambda message: None)
    rows = _recorded("torch_companions", data)
    assert {t: r["torchvision"] for t, r in rows.items()} == {
        "2.11.0": "0.26.0", "2.14.0": "0.29.0", "2.14.1": "0.29.2", "2.15.0": None}
    assert "paired with the newest torch 2.14 patch releases" in rows["2.14.1"]["note"]
    assert _recorded("torch_pypi", data)["2.11.0"]["torchaudio"] is None


def _companion_columns(data: Path) -> dict[str, tuple[str | None, str | None, str, str]]:
    found = yaml.safe_load((data / "torch_companions.yaml").read_text())["rows"]
    return {r["torch"]: (r["torchvision"], r["torchaudio"], r["source"], r.get("note", "")) for r in found}


@pytest.mark.parametrize("read", ["torchvision", "torchaudio"])
def test_only_one_companion_keeps_the_others_recorded_facts(tmp_path: Path, read: str) -> None:
    """docs/faults.md T1: `--only torchvision` once set every torchaudio to null with no reason
    (exit 4). The project not read keeps its recorded versions, cited wheels and notes."""
    published = {**PUBLISHED, "torchaudio": {**PUBLISHED["torchaudio"], "2.14.1": ["torch==2.14.1"]}}
    routes = _routes(published)
    data = trimmed_data(tmp_path)
    with serving_index(tmp_path, routes) as (url, env):
        options = refresh.RefreshOptions(matrices=data, sources=("pypi",), index_url=url, policy=FAST,
                                         allow_shrink=True, retrieved="2026-11-24")
        refresh.refresh(options, env, lambda message: None)
        full = _companion_columns(data)
        assert refresh.refresh(replace(options, only=frozenset({read}), allow_shrink=False),
                               env, lambda message: None).up_to_date
        # The index changes: the project read sees it, the other (not read) does not move.
        other = "torchaudio" if read == "torchvision" else "torchvision"
        newer = {"torchvision": {"0.30.0": ["torch==2.15.0"]}, "torchaudio": {"2.15.0": ["torch==2.15.0"]}}
        routes.clear()
        routes.update(_routes({"torch": PUBLISHED["torch"], read: {**published[read], **newer[read]},
                               other: {}}))
        code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "pypi", "--only", read,
                         "--index-url", url], env)
    assert code == 0
    after = _companion_columns(data)
    column = 0 if other == "torchvision" else 1
    assert {t: r[column] for t, r in after.items()} == {t: r[column] for t, r in full.items()}
    assert after["2.14.1"][1] == "2.14.1" and full["2.14.1"][1] == "2.14.1"
    assert after["2.15.0"][1 - column] == newer[read].popitem()[0]
    for torch in ("2.14.0", "2.14.1"):  # the notes about the project not read are kept, word for word
        kept = [p for p in full[torch][3].split("; ") if p.startswith((f"no {other} ", f"{other} "))]
        assert all(p in after[torch][3] for p in kept)
    assert after["2.14.0"][:3] == full["2.14.0"][:3]


# --- validation ------------------------------------------------------------------------------


def test_a_null_companion_without_a_reason_is_refused(tmp_path: Path) -> None:
    """docs/faults.md H30: resolve and the lock repeat the reason, so the data must hold one."""
    data = tmp_path / "matrices"
    shutil.copytree(REPO / "matrices", data)
    text = (data / "torch_companions.yaml").read_text()
    document = yaml.safe_load(text)
    for row in document["rows"]:
        if row["torch"] == "2.12.0":  # torchaudio null: its note says why, until emptied here
            row["note"] = "read by hand"
    (data / "torch_companions.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(DataError) as caught:
        matrices.load(data)
    assert "torchaudio is null and the note does not say why" in str(caught.value)


# --- what resolve and the lock say -----------------------------------------------------------


def test_companions_missing_names_both_with_the_datas_reasons() -> None:
    row = {"torch": "2.15.0", "torchvision": None, "torchaudio": None,
           "note": "no torchvision release X; no torchaudio release Y"}
    assert companions_missing("2.15.0", row) == (
        "no torchvision/torchaudio for torch 2.15.0: no torchvision release X; no torchaudio release Y")
    one = {"torch": "2.14.1", "torchvision": "0.29.2", "torchaudio": None, "note": "a; no torchaudio Z"}
    assert companions_missing("2.14.1", one) == "no torchaudio for torch 2.14.1: no torchaudio Z"
    assert companions_missing("2.4.1", {"torchvision": "0.19.1", "torchaudio": "2.4.1"}) is None
    assert companions_missing("9.9.9", None) == (
        "no torchvision/torchaudio for torch 9.9.9: torch_companions.yaml has no row for this torch")
    assert companions_missing("2.14.1", {"torchvision": "0.29.2", "torchaudio": None}) == (
        "no torchaudio for torch 2.14.1: torch_companions.yaml records no torchaudio and no reason")


def test_resolve_pairs_torch_2_15_0_with_torchvision_0_29_2_and_says_why_no_torchaudio() -> None:
    """torchvision 0.29.2 is the cu132 build uploaded with torch 2.15.0 (FACTS-2026-11-25 F);
    torchaudio stopped at 2.11.0, and the note says so."""
    matrix = matrices.load(REPO / "matrices")
    request = build_request(Selectors(torch="==2.15.0"), matrix, {})
    stack = resolve(request, matrix).stacks[0]
    assert (stack.torch, stack.torchvision, stack.torchaudio) == ("2.15.0", "0.29.2", None)
    [note] = [n for n in stack.notes if n.startswith("no torchaudio for torch 2.15.0: ")]
    assert "the newest, 2.11.0, declares no torch requirement" in note
    assert note in stack.to_json()["notes"]


def test_resolve_pairs_torch_2_14_1_with_torchvision_0_29_1() -> None:
    """0.29.1 was uploaded with 2.14.1 (a cu130 build, as 2.14.x); 0.29.2 belongs to 2.15.0."""
    matrix = matrices.load(REPO / "matrices")
    stack = resolve(build_request(Selectors(torch="==2.14.1"), matrix, {}), matrix).stacks[0]
    assert (stack.torchvision, stack.torchaudio) == ("0.29.1", None)
    assert [n for n in stack.notes if n.startswith("no torchaudio for torch 2.14.1: ")]
    assert not [n for n in stack.notes if "torchvision" in n.split(":")[0]]


def test_resolve_pairs_torch_2_11_0_with_torchaudio_2_11_0() -> None:
    matrix = matrices.load(REPO / "matrices")
    stack = resolve(build_request(Selectors(torch="==2.11.0"), matrix, {}), matrix).stacks[0]
    assert (stack.torchvision, stack.torchaudio) == ("0.26.0", "2.11.0")
    assert not [n for n in stack.notes if n.startswith("no ")]


def test_companions_without_a_wheel_for_the_python_are_left_out() -> None:
    """torchvision 0.20.1 and torchaudio 2.5.1 have no cp313 wheels: torch 2.5.1 on Python 3.13
    gets neither (and a note naming the Pythons they have); without --python the stack takes
    a Python they have wheels for."""
    matrix = matrices.load(REPO / "matrices")
    on_313 = resolve(build_request(Selectors(torch="==2.5.1", python="3.13"), matrix, {}), matrix)
    stack = on_313.stacks[0]
    assert (stack.python, stack.torchvision, stack.torchaudio) == ("3.13", None, None)
    [note] = [n for n in stack.notes if n.startswith("no companion wheel for Python 3.13: ")]
    assert "torchvision 0.20.1 has wheels for Python 3.9, 3.10, 3.11, 3.12" in note
    assert "torchaudio 2.5.1 has wheels for Python 3.9, 3.10, 3.11, 3.12" in note
    free = resolve(build_request(Selectors(torch="==2.5.1"), matrix, {}), matrix).stacks
    assert all(s.python != "3.13" and s.torchvision == "0.20.1" for s in free)
    cp313 = resolve(build_request(Selectors(torch="==2.6.0", python="3.13"), matrix, {}), matrix)
    assert cp313.stacks[0].torchvision == "0.21.0"  # 0.21.0 has cp313: kept
