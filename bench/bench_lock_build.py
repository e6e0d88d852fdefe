"""A locked CUDA environment: cold build against installing the same lock alone, per builder, and
the rebuild after adding one dependency.

One run, side by side, on a sample project (torch's package-index wheel, its CUDA libraries as
nvidia-* wheels, plus a few small dependencies), locked with ``envbuild lock``:

  lock            seconds for ``envbuild lock`` (uv, the registry digest), cold uv cache
  download alone  seconds to fetch every wheel the build installs, with nothing else: the
                  same URLs one after another (as pip fetches), and 8 at a time (as uv does)
  cold build      seconds for ``envbuild build --no-cache`` of that lock, per builder
                  (--builders) and installer (--installers), with each step's seconds
  install alone   seconds for uv to fetch and install the same files into a directory on this
                  machine (cold cache, bytecode): no container, no layer, the floor of any build;
                  run before each cold build and after the last (interleaved), the median taken
  ratio           cold build / install alone                                    target <= 1.3
  rebuild         seconds to re-lock and rebuild after adding one dependency (after one plain
                  build of the first lock), and whether the torch layer came from the cache

``--mirror`` fetches the lock's wheels once through the configured index, serves them from
127.0.0.1 over plain HTTP and locks against that: both sides then read the same bytes at loopback
speed, with no proxy and no CA bundle (so the classic builder builds one stage; ``classic+ca``
adds ``--ca-bundle`` to measure its two-stage recipe on the same source).

The base image is the local Debian one (scripts/base-image.sh), pushed to a docker-registry
started on 127.0.0.1 so that ``lock`` pins it by digest as it would any base. Needs dockerd,
docker-registry, the configured package index, buildah for ``--builders buildah``, and about
20 GB of disk with buildah (its storage, its copy into dockerd). Usage:
  python bench/bench_lock_build.py [--mirror] [--cold N]
      [--builders classic,classic+ca,buildah,buildah+no-load]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEPENDENCIES = ["six>=1.16", "idna>=3.7", "attrs>=23.1", "packaging>=24"]
ADDED = "tqdm>=4.66"
TARGET_RATIO = 1.3


def envbuild(*args: str, cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "envbuild", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=7200)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_lock_build: envbuild {' '.join(args)} failed ({done.returncode}):\n"
                 f"{done.stderr[-3000:]}")
    return took, done


def share_the_engine() -> None:
    """Hold tests/conftest.py's engine lock shared for this process's life: a Docker test module
    that ends meanwhile then leaves every image alone instead of removing the ones made while it
    ran (this bench's layer cache among them)."""
    import fcntl

    sys.path.insert(0, str(ROOT / "tests"))
    from engine_lock import sessions_lock  # type: ignore[import-not-found]  # tests/conftest.py's file

    fd = os.open(sessions_lock(), os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_SH)  # released when the process exits


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_registry(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        sys.exit("bench_lock_build: no docker-registry (apt-get install docker-registry)")
    port = free_port()
    config = root / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(100):
        try:
            with opener.open(f"http://127.0.0.1:{port}/v2/", timeout=2):
                return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    process.terminate()
    sys.exit("bench_lock_build: docker-registry did not start")


def push_base(registry: str) -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh")], capture_output=True,
                          text=True, timeout=1800, check=True)
    local = done.stdout.strip().splitlines()[-1]
    target = f"{registry}/envbuild/bookworm:base"
    subprocess.run(["docker", "tag", local, target], check=True)
    subprocess.run(["docker", "push", "-q", target], check=True, capture_output=True)
    return target


def project(directory: Path, base: str, torch: str, variant: str, deps: list[str],
            mirror: str | None = None) -> None:
    """The sample project; with ``mirror`` (http://127.0.0.1:PORT), every wheel from its pages."""
    quoted = ", ".join(json.dumps(d) for d in deps)
    # torch too from the default index, as the "default" variant has it (a torch index is for
    # the variants whose wheels carry a local version, +cu130)
    indexes = f"index-url = {json.dumps(mirror + '/simple')}\n" if mirror else ""
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0"\nrequires-python = ">=3.11"\n'
        f"dependencies = [{quoted}]\n\n[tool.envbuild]\ntorch = {json.dumps(torch)}\n"
        f'variant = {json.dumps(variant)}\npython = "3.11"\ncompanions = false\n'
        f"base-image = {json.dumps(base)}\n{indexes}")


def fill_mirror(work: Path, root: Path) -> None:
    """Every wheel the lock in ``work`` installs (and its uv wheel) into root/files, fetched once
    through the configured index, with PEP 503 pages for them (bench_rebuild_cache's)."""
    import urllib.parse

    from bench_rebuild_cache import index_pages

    locked = json.loads((work / "envbuild.lock").read_text())["targets"]["default"]
    urls = [*locked_urls(work / "ctx"), locked["pylock"]["installer"]["url"]]
    opener = trusting_opener()
    (root / "files").mkdir(parents=True)
    for url in urls:
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
        with opener.open(url, timeout=600) as answer, open(root / "files" / name, "wb") as out:
            shutil.copyfileobj(answer, out, 1 << 20)
    index_pages(root)
    shutil.copytree(root / "torch" / "simple" / "torch", root / "simple" / "torch")  # one index for all


def serve_mirror(root: Path) -> tuple[Any, str]:
    """root's files over plain HTTP on 127.0.0.1, streamed (the wheels are GBs): no proxy and no
    CA bundle on either side, so both read the same bytes at loopback speed."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def locked_urls(context: Path) -> list[str]:
    """The URL of every file the build's requirements files (a rendered context's) install."""
    return [line.split(" @ ", 1)[1].split(" ", 1)[0]
            for name in ("torch.txt", "project.txt") if (context / "requirements" / name).is_file()
            for line in (context / "requirements" / name).read_text().splitlines() if " @ " in line]


def trusting_opener() -> urllib.request.OpenerDirector:
    """urllib trusting $PIP_CERT where set (this machine's proxy), else the system's CAs."""
    import ssl

    cert = os.environ.get("PIP_CERT")
    tls = ssl.create_default_context(cafile=cert) if cert else ssl.create_default_context()
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls))


def download_alone(context: Path, workers: int = 1) -> tuple[float, int, int]:
    """Fetch every URL of the build's requirements files, ``workers`` at a time, into a temp dir."""
    urls = locked_urls(context)
    opener = trusting_opener()
    from concurrent.futures import ThreadPoolExecutor

    def fetch(index: int, url: str, scratch: str) -> int:
        size = 0
        with opener.open(url, timeout=600) as answer, open(Path(scratch) / str(index), "wb") as out:
            while chunk := answer.read(1 << 20):
                size += len(chunk)
                out.write(chunk)
        return size

    with tempfile.TemporaryDirectory(prefix="envbuild-bench-dl-") as scratch, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        start = time.perf_counter()
        total = sum(pool.map(lambda item: fetch(item[0], item[1], scratch), enumerate(urls)))
        return time.perf_counter() - start, len(urls), total


def install_alone(context: Path, python: str, platform: str) -> float:
    """Seconds for uv to fetch and install the build's requirements files into a directory on
    this machine, cold cache, bytecode compiled as the image's step does: no container, no
    layer. What any builder adds comes on top of this, so its ratio is the floor of the build's."""
    from envbuild.pylock.uv import find_uv

    files = [context / "requirements" / name for name in ("torch.txt", "project.txt")
             if (context / "requirements" / name).is_file()]
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-install-") as scratch:
        start = time.perf_counter()
        subprocess.run([find_uv(None), "pip", "install", "--quiet", "--no-config", "--no-deps",
                        "--require-hashes", "--only-binary", ":all:", "--link-mode", "copy",
                        "--compile-bytecode", "--python-version", python, "--python-platform",
                        platform, "--target", f"{scratch}/site",
                        "--cache-dir", f"{scratch}/cache", *[a for f in files for a in ("-r", str(f))]],
                       check=True)
        return time.perf_counter() - start


STEP = re.compile(r"^\[([0-9]+)/([0-9]+)\] (.*)$")


def build(directory: Path, tag: str, *extra: str,
          ca_bundle: bool = True) -> tuple[float, dict[str, Any], list[tuple[str, float]]]:
    """Seconds, the build's report and its steps, each with the seconds from its start to the
    next step's (the classic builder commits a step's layer before it starts the next one, so
    a RUN step's figure includes its layer's commit; the last step's, whatever the build does
    after it: buildah's copy of the image into dockerd), from envbuild's progress lines."""
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--tag", tag, "--report", "report.json",
            *extra]
    if ca_bundle and os.environ.get("PIP_CERT"):
        args += ["--ca-bundle", os.environ["PIP_CERT"]]
    starts: list[tuple[str, float]] = []
    tail: list[str] = []
    start = time.perf_counter()
    with subprocess.Popen([sys.executable, "-m", "envbuild", *args], cwd=directory,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            match = STEP.match(line.strip())
            if match:
                starts.append((match[3], time.perf_counter()))
            tail = [*tail[-40:], line]
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_lock_build: envbuild {' '.join(args)} failed ({proc.returncode}):\n{''.join(tail)}")
    ends = [t for _, t in starts[1:]] + [start + took]
    steps = [(text, end - begun) for (text, begun), end in zip(starts, ends, strict=True)]
    return took, dict(json.loads((directory / "report.json").read_text())), steps


# What each step of a lock's image is. A step's line is cut at 100 characters, so a RUN step
# is known by the requirements file the COPY before it brought in.
SYSTEM = "system packages (apt-get: python3, python3-venv, g++, python3-dev)"
VENV = "the venv (python3 -m venv)"
TORCH = "torch layer: uv fetches, checks, unpacks, compiles; the layer's commit"
PROJECT = "project layer (with a CA bundle: its stage, the list of added files, their copy)"
COPY = "second copy of the venv (classic builder + CA bundle: COPY --from the build stage)"
REST = "the rest: FROM, SHELL, ARG, ENV, the user, the lock files, the installed-set check, labels"
# What install alone does nothing like: the system packages and the image's scaffolding.
NOT_INSTALLING = (SYSTEM, VENV, REST)


def kinds(steps: list[tuple[str, float]]) -> dict[str, float]:
    found = {name: 0.0 for name in (SYSTEM, VENV, TORCH, PROJECT, COPY, REST)}
    layer = None
    for text, seconds in steps:
        if "COPY requirements/" in text:
            layer = TORCH if "torch.txt" in text else PROJECT if "project.txt" in text else None
        if "apt-get" in text:
            kind = SYSTEM
        elif "python3 -m venv" in text or "sys.version_info" in text:
            kind = VENV
        elif "COPY --from=envbuild-build /opt/venv" in text:
            kind = COPY
        elif "envbuild-project" in text or "/tmp/envbuild-before" in text:
            kind = PROJECT
        elif layer is not None and ("RUN " in text or "COPY requirements/" in text):
            kind = layer
        else:
            kind = REST
        found[kind] += seconds
    return found


BUILDERS = ("auto", "classic", "classic+ca", "buildah", "buildah+no-load", "buildx")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="==2.13.0")
    parser.add_argument("--variant", default="default")
    parser.add_argument("--installers", default="uv", help="comma-separated, built in this order")
    parser.add_argument("--cold", type=int, default=2,
                        help="cold builds per installer and builder (default 2)")
    parser.add_argument("--no-rebuild", action="store_true", help="skip the rebuild after one dependency")
    parser.add_argument("--builders", default="auto",
                        help=f"comma-separated, of {', '.join(BUILDERS)} (auto: buildx, else the classic "
                             "builder; classic+ca: the classic builder given --ca-bundle $PIP_CERT, its "
                             "two-stage recipe, which every build here gets without --mirror; "
                             "buildah+no-load: buildah with --no-load, its image not copied into dockerd)")
    parser.add_argument("--mirror", action="store_true",
                        help="serve the locked wheels from 127.0.0.1 over plain HTTP and lock against that: "
                             "no proxy and no CA bundle on either side (classic: one stage)")
    args = parser.parse_args()
    builders = args.builders.split(",")
    if unknown := sorted(set(builders) - set(BUILDERS)):
        parser.error(f"unknown builder {', '.join(unknown)}")
    share_the_engine()
    installers = args.installers.split(",")
    names = [f"{b}-{i}-{n}" for b in builders for i in installers for n in range(1, args.cold + 1)]
    tags = [f"envbuild-bench/locked:{t.replace('+', '-')}" for t in (*names, "primed", "added")]
    cold: dict[str, tuple[float, dict[str, Any], list[tuple[str, float]]]] = {}
    installs: list[float] = []
    loads = [os.getloadavg()[0]]
    mirror = None
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-lockbuild-") as scratch:
        root = Path(scratch)
        registry, address = start_registry(root)
        try:
            base = push_base(address)
            work = root / "project"
            work.mkdir()
            project(work, base, args.torch, args.variant, DEPENDENCIES)
            cache = root / "uv-cache"
            os.environ["UV_CACHE_DIR"] = str(cache)
            lock_s, _ = envbuild("lock", cwd=work)
            envbuild("render", "docker", "--lock", "envbuild.lock", "-o", "ctx", cwd=work)
            if args.mirror:
                fill_mirror(work, root / "mirror")
                _server, mirror = serve_mirror(root / "mirror")  # a daemon thread: ends with the bench
                project(work, base, args.torch, args.variant, DEPENDENCIES, mirror)
                envbuild("lock", cwd=work)
                shutil.rmtree(work / "ctx")
                envbuild("render", "docker", "--lock", "envbuild.lock", "-o", "ctx", cwd=work)
                text = (work / "ctx" / "requirements" / "torch.txt").read_text()
                assert mirror in text and "https://" not in text, "the lock must point at the mirror"
            locked = json.loads((work / "envbuild.lock").read_text())["targets"]["default"]
            serial_s, files, size = download_alone(work / "ctx")
            parallel_s, _, _ = download_alone(work / "ctx", workers=8)
            python, platform = locked["stack"]["python"], locked["pylock"]["platform"]
            # Interleaved: install alone before each cold build and once after the last, so that
            # the load of other work falls on both sides alike.
            for name in names:
                builder, installer, _ = name.rsplit("-", 2)
                installs.append(install_alone(work / "ctx", python, platform))
                loads.append(os.getloadavg()[0])
                envbuild("lock", "--installer", installer, cwd=work)
                tag = f"envbuild-bench/locked:{name.replace('+', '-')}"
                with_ca = not args.mirror or builder == "classic+ca"
                cold[name] = build(work, tag, "--no-cache", "--builder", builder.split("+")[0],
                                   *(["--no-load"] if builder.endswith("+no-load") else []),
                                   ca_bundle=with_ca)
                # Each image is several GB and only its figures are needed: removed at once.
                subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
                if builder.startswith("buildah"):
                    subprocess.run(["buildah", "rmi", "-f", tag], capture_output=True, check=False)
                loads.append(os.getloadavg()[0])
            installs.append(install_alone(work / "ctx", python, platform))
            loads.append(os.getloadavg()[0])
            rebuild = None if args.no_rebuild else rebuilt(args, work, base, installers[0], builders[0],
                                                           mirror)
        finally:
            # the base's tag for the registry, which is gone with it
            subprocess.run(["docker", "rmi", f"{address}/envbuild/bookworm:base"], capture_output=True,
                           check=False)
            registry.terminate()
            registry.wait(10)
            # Each image is several GB: leave none of them behind.
            subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True, check=False)
            if any(b.startswith("buildah") for b in builders):
                subprocess.run(["buildah", "rmi", "-f", *tags], capture_output=True, check=False)
    install_s = statistics.median(installs)
    print(f"stack           torch {locked['stack']['torch']} ({locked['stack']['variant']}), Python "
          f"{locked['stack']['python']}: {len(locked['packages'])} distributions, "
          f"{len(locked['pylock']['torch_layer'])} in the torch layer")
    source = ("a mirror on 127.0.0.1 (plain HTTP; no CA bundle unless classic+ca)" if mirror else
              "the configured index"
              + (" (every build with --ca-bundle)" if os.environ.get("PIP_CERT") else ""))
    print(f"wheels from     {source}")
    print(f"load average    {min(loads):.2f} to {max(loads):.2f} (1 min) during the builds, "
          f"{os.cpu_count()} cores")
    print(f"lock            {lock_s:7.1f} s (cold uv cache, registry digest included)")
    print(f"download alone  {serial_s:7.1f} s one after another, {parallel_s:.1f} s 8 at a time "
          f"({files} wheels, {size / 1e9:.2f} GB)")
    print(f"install alone   {install_s:7.1f} s median [{', '.join(f'{t:.1f}' for t in installs)}] (uv into a "
          f"directory here: no container, cold cache, bytecode)")
    for name, (seconds, report, steps) in cold.items():
        ratio = seconds / install_s
        split = kinds(steps)
        own = seconds - sum(split[k] for k in NOT_INSTALLING)
        verdict = "ok" if ratio <= TARGET_RATIO else "OVER TARGET"
        shown = f"{report['size'] / 1e9:.2f} GB" if report["size"] else "not in dockerd"
        print(f"cold build {name:<22} {seconds:7.1f} s ({report.get('backend', '?')}, --no-cache; image "
              f"{shown})  ratio {ratio:.2f}x to install alone (target <= "
              f"{TARGET_RATIO}): {verdict}")
        for kind, spent in split.items():
            print(f"    {spent:7.1f} s  {kind}")
        print(f"    without the system packages and the scaffolding: {own:.1f} s, {own / install_s:.2f}x; "
              f"the torch and project layers alone: {split[TORCH] + split[PROJECT]:.1f} s, "
              f"{(split[TORCH] + split[PROJECT]) / install_s:.2f}x")
        for text, spent in steps:
            print(f"        {spent:6.1f} s  {text[:90]}")
    if rebuild is not None:
        relock_s, rebuild_s, reused = rebuild
        print(f"rebuild         {relock_s + rebuild_s:7.1f} s after adding {ADDED} (lock {relock_s:.1f} s "
              f"+ build {rebuild_s:.1f} s, {installers[0]}, {builders[0]}); torch layer from cache: "
              f"{'yes' if reused else 'NO'}")
    print("build stages    left dangling by the classic builder: remove with 'docker image prune' "
          "when no other build runs")
    return 0 if rebuild is None or rebuild[2] else 1


def rebuilt(args: argparse.Namespace, work: Path, base: str, installer: str, builder: str,
            mirror: str | None) -> tuple[float, float, bool]:
    """(lock seconds, build seconds, whether the torch layer came from the cache) of the
    rebuild after adding one dependency."""
    envbuild("lock", "--installer", installer, cwd=work)
    with_ca = mirror is None or builder == "classic+ca"
    builder = builder.split("+")[0]
    # The classic builder keeps one cache chain per build; after a --no-cache build it may
    # probe an older chain and miss. One plain build of the same lock makes this one the
    # chain the rebuild finds (untimed: it is what a team's previous build would be).
    build(work, "envbuild-bench/locked:primed", "--builder", builder, ca_bundle=with_ca)
    project(work, base, args.torch, args.variant, [*DEPENDENCIES, ADDED], mirror)
    relock_s, _ = envbuild("lock", "--installer", installer, cwd=work)
    rebuild_s, again, _ = build(work, "envbuild-bench/locked:added", "--builder", builder, ca_bundle=with_ca)
    ran = " ".join(again["ran"])
    return relock_s, rebuild_s, "torch.txt" not in ran and "project.txt" in ran


if __name__ == "__main__":
    sys.exit(main())
