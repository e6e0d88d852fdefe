"""A warm rebuild after a lock change that touches one small wheel: buildah (BuildKit syntax,
uv's download cache in a cache mount, buildah's layer cache) against Docker's classic builder,
side by side.

The sample project locks torch 2.13.0+cpu (the ``$PIP_FIND_LINKS`` wheelhouse) with a few small
dependencies, one of them ``filelock``, which torch itself requires and which therefore sits in the
torch layer. Every wheel is served from a mirror on 127.0.0.1 that counts what it sends and answers
wheel files with ``Cache-Control: max-age=31536000, immutable``, the way an index's file host serves
files that never change (the proxy of the machine this was written on strips those headers, and
without them no cache keeps anything: docs/reports/bench-rebuild-cache-2026-11-24.md).

Each builder builds the first lock, then the lock with filelock moved to its previous release
(``envbuild lock`` again), and builds that:

  seconds     the rebuild's wall time (``envbuild build``, buildah's copy into dockerd included)
  wheels      whole wheel files the mirror sent during the rebuild, and the bytes it sent
              (range reads included: uv reads a wheel's metadata by range first)
  ran         the Dockerfile steps that ran rather than coming from a layer cache

The mirror is filled once through the configured package index (``pip download``'s settings).
Needs dockerd, buildah, docker-registry, the base image (scripts/base-image.sh) and that index.
Usage: python bench/bench_rebuild_cache.py
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from envbuild.project.toml import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lock_build import envbuild, push_base, share_the_engine, start_registry, trusting_opener

ROOT = Path(__file__).resolve().parent.parent
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
SMALL = ["six", "idna", "attrs", "packaging", "tqdm"]
BUILDERS = ("classic", "buildah")


class Mirror(http.server.SimpleHTTPRequestHandler):
    """Static files; wheels marked immutable and readable by byte range, as an index's file host
    serves them (uv reads a wheel's metadata by range before it fetches the wheel); what is sent
    is counted per wheel: whole files, and range reads apart."""

    sent: ClassVar[Counter[str]] = Counter()  # wheel name → bytes sent
    times: ClassVar[Counter[str]] = Counter()  # wheel name → whole files sent
    ranges: ClassVar[Counter[str]] = Counter()  # wheel name → range reads answered
    lock = threading.Lock()

    def end_headers(self) -> None:
        if self.path.endswith(".whl"):
            self.send_header("Cache-Control", "max-age=31536000, immutable, public")
            self.send_header("Accept-Ranges", "bytes")
        else:
            self.send_header("Cache-Control", "max-age=600, public")
        super().end_headers()

    def do_GET(self) -> None:
        if not self.path.endswith(".whl"):
            super().do_GET()
            return
        name = self.path.rsplit("/", 1)[-1]
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        data = Path(self.translate_path(self.path)).read_bytes()
        if wanted and (wanted[1] or wanted[2]):
            first = int(wanted[1]) if wanted[1] else max(len(data) - int(wanted[2]), 0)
            last = int(wanted[2]) if wanted[1] and wanted[2] else len(data) - 1
            part = data[first:min(last, len(data) - 1) + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{first + len(part) - 1}/{len(data)}")
        else:
            part = data
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)
        with Mirror.lock:
            Mirror.sent[name] += len(part)
            (Mirror.ranges if part is not data else Mirror.times)[name] += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Mirror, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def index_pages(root: Path) -> None:
    """PEP 503 pages under root/simple (and root/torch/simple for torch alone) for root/files."""
    names: dict[str, list[Path]] = {}
    for wheel in sorted((root / "files").glob("*.whl")):
        names.setdefault(canonical(wheel.name.split("-", 1)[0]), []).append(wheel)
    for name, wheels in names.items():
        page = root / ("torch/simple" if name == "torch" else "simple") / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="/files/{w.name.replace("+", "%2B")}#sha256='
            f'{hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n' for w in wheels)
        page.write_text(f"<html><body>\n{links}</body></html>\n")


def write_project(directory: Path, base: str, torch_index: str, deps: list[str],
                  index: str | None) -> None:
    quoted = ", ".join(json.dumps(d) for d in deps)
    extra = f"index-url = {json.dumps(index)}\n" if index else ""
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0"\nrequires-python = ">=3.11"\n'
        f"dependencies = [{quoted}]\n\n[tool.envbuild]\ntorch = \"==2.13.0\"\nvariant = \"cpu\"\n"
        f'python = "3.11"\ncompanions = false\nbase-image = {json.dumps(base)}\n'
        f"torch-index-url = {json.dumps(torch_index)}\n{extra}")


def fill_mirror(root: Path, base: str, torch_index: str) -> tuple[str, str]:
    """Lock once against the configured index, then copy every locked wheel (and the uv wheel the
    lock pins, and filelock's previous release) into root/files; (filelock now, before)."""
    scratch = root / "discover"
    scratch.mkdir()
    write_project(scratch, base, torch_index, ["filelock", *SMALL], None)
    envbuild("lock", cwd=scratch)
    locked = json.loads((scratch / "envbuild.lock").read_text())["targets"]["default"]
    pylock = tomllib.loads((scratch / locked["pylock"]["file"]).read_text())
    urls = [w["url"] for p in pylock["packages"] for w in p.get("wheels", [])
            if not w["url"].startswith("http://127.0.0.1")]
    urls.append(locked["pylock"]["installer"]["url"])
    opener = trusting_opener()
    for url in urls:
        with opener.open(url, timeout=600) as answer:
            (root / "files" / urllib.parse.unquote(url.rsplit("/", 1)[-1])).write_bytes(answer.read())
    current = locked["packages"]["filelock"]
    listing = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "filelock"],
                             capture_output=True, text=True, check=True).stdout
    versions = re.search(r"Available versions: (.*)", listing)
    assert versions, listing
    older = [v.strip() for v in versions[1].split(",") if v.strip() != current]
    previous = older[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                    ":all:", "-d", str(root / "files"), f"filelock=={previous}"], check=True)
    return current, previous


def build(directory: Path, builder: str) -> dict[str, Any]:
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--builder", builder,
            "--tag", f"envbuild-bench/rebuild:{builder}", "--report", "report.json"]
    sent, times, ranges = Counter(Mirror.sent), Counter(Mirror.times), Counter(Mirror.ranges)
    seconds, _ = envbuild(*args, cwd=directory)
    report = json.loads((directory / "report.json").read_text())
    return {"seconds": seconds, "files": (Mirror.times - times).total(),
            "ranges": (Mirror.ranges - ranges).total(), "bytes": (Mirror.sent - sent).total(),
            "names": sorted(Mirror.times - times), "ran": report["ran"]}


def main() -> int:
    wheelhouse = Path(os.environ.get("PIP_FIND_LINKS", "/nonexistent"))
    if not (wheelhouse / TORCH_WHEEL).is_file():
        sys.exit(f"bench_rebuild_cache: no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    for program in ("buildah", "docker"):
        if shutil.which(program) is None:
            sys.exit(f"bench_rebuild_cache: no {program} on PATH")
    share_the_engine()
    first: dict[str, dict[str, Any]] = {}
    again: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-rebuild-") as scratch:
        root = Path(scratch)
        (root / "files").mkdir()
        shutil.copy(wheelhouse / TORCH_WHEEL, root / "files" / TORCH_WHEEL)
        index_pages(root)
        server, address = serve(root)
        registry, registry_address = start_registry(root)
        try:
            base = push_base(registry_address)
            torch_index = f"{address}/torch/simple"
            now, previous = fill_mirror(root, base, torch_index)
            index_pages(root)
            work = root / "project"
            work.mkdir()
            write_project(work, base, torch_index, [f"filelock=={now}", *SMALL], f"{address}/simple")
            envbuild("lock", cwd=work)
            locked = json.loads((work / "envbuild.lock").read_text())["targets"]["default"]
            text = (work / locked["pylock"]["file"]).read_text()
            assert "://127.0.0.1" in text and "https://" not in text, "the lock must point at the mirror"
            for builder in BUILDERS:
                first[builder] = build(work, builder)
            write_project(work, base, torch_index, [f"filelock=={previous}", *SMALL], f"{address}/simple")
            envbuild("lock", cwd=work)
            for builder in BUILDERS:
                again[builder] = build(work, builder)
        finally:
            # the base's tag for the registry, which is gone with it
            subprocess.run(["docker", "rmi", f"{registry_address}/envbuild/bookworm:base"],
                           capture_output=True, check=False)
            server.shutdown()
            registry.terminate()
            registry.wait(10)
            subprocess.run(["docker", "rmi", "-f", *(f"envbuild-bench/rebuild:{b}" for b in BUILDERS)],
                           capture_output=True, check=False)
            subprocess.run(["buildah", "rmi", "envbuild-bench/rebuild:buildah"], capture_output=True,
                           check=False)
    driver = subprocess.run(["buildah", "info", "--format", "{{.store.GraphDriverName}}"],
                            capture_output=True, text=True, check=False).stdout.strip()
    print(f"change          filelock {now} -> {previous} (torch's own dependency: the torch layer "
          f"changes), with {', '.join(SMALL)}")
    print(f"buildah         storage driver {driver}, uv's cache in a cache mount")
    print(f"{'':16}{'classic':>18}{'buildah':>18}")
    for label, runs in (("first build", first), ("rebuild", again)):
        print(f"{label:16}" + "".join(f"{runs[b]['seconds']:>16.1f} s" for b in BUILDERS))
        print(f"{'  wheels sent':16}" + "".join(
            f"{runs[b]['files']:>6} ({runs[b]['bytes'] / 1e6:6.1f} MB)" for b in BUILDERS))
        print(f"{'  range reads':16}" + "".join(f"{runs[b]['ranges']:>18}" for b in BUILDERS))
    for builder in BUILDERS:
        print(f"rebuild fetched ({builder}): {', '.join(again[builder]['names']) or 'nothing'}")
        print(f"rebuild ran ({builder}): " + "; ".join(s[:50] for s in again[builder]["ran"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
