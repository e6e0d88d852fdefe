"""What a one-dependency change costs a push, and whether two builds of one lock are one image:
Docker's classic builder (with a CA bundle: the two-stage recipe) against buildah, side by side.

The sample project locks torch 2.13.0+cpu (the ``$PIP_FIND_LINKS`` wheelhouse) with a few small
dependencies, every wheel served from a mirror on 127.0.0.1 (bench_rebuild_cache's), then adds
one more small dependency and locks again. Per builder:

  torch layer     the size of the image's largest layer (torch's)
  push moves      the bytes of the rebuilt image's layers the first image lacks: what a push
                  (and every pull) of the rebuild moves. Target: the project layer only, a
                  small fraction of the image
  same digest     two ``--no-cache`` builds of the first lock (SOURCE_DATE_EPOCH=0): whether the
                  image IDs agree; when they do not, the files that differ (``docker export`` of
                  each, compared by content and mtime), with the count

Needs dockerd, buildah, docker-registry, the base image (scripts/base-image.sh) and the configured
package index (to fill the mirror once). Usage: python bench/bench_layers.py [--skip-repro]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lock_build import envbuild, push_base, share_the_engine, start_registry
from bench_rebuild_cache import (
    SMALL,
    TORCH_WHEEL,
    fill_mirror,
    index_pages,
    serve,
    write_project,
)

BUILDERS = ("classic", "buildah")


def layers(image: str) -> list[tuple[str, int]]:
    """(overlay2 directory, bytes) of each layer, oldest first. A layer two images share (the
    same layer on the same layers below) is one directory: the rebuilt image's directories the
    first image lacks are what a push of it moves. Needs the engine's overlay2 storage, as root."""
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                                        text=True, check=True).stdout)[0]
    driver = inspect["GraphDriver"]
    if driver["Name"] != "overlay2" or not os.access(driver["Data"]["UpperDir"], os.R_OK):
        sys.exit("bench_layers: needs Docker's overlay2 storage, readable (run as root)")
    lower = driver["Data"].get("LowerDir")
    dirs = [*reversed(lower.split(":") if lower else []), driver["Data"]["UpperDir"]]
    if len(dirs) != len(inspect["RootFS"]["Layers"]):
        sys.exit(f"bench_layers: {image}: {len(dirs)} overlay2 directories, "
                 f"{len(inspect['RootFS']['Layers'])} layers")
    sizes = subprocess.run(["du", "-sb", "--apparent-size", *dirs], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return [(d, int(line.split()[0])) for d, line in zip(dirs, sizes, strict=True)]


def build(directory: Path, builder: str, tag: str, *extra: str) -> None:
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--builder", builder, "--tag", tag,
            *extra]
    if builder == "classic" and os.environ.get("PIP_CERT"):
        args += ["--ca-bundle", os.environ["PIP_CERT"]]  # the two-stage recipe the issue measured
    envbuild(*args, cwd=directory)


def files_of(image: str, scratch: Path) -> dict[str, tuple[str, int]]:
    """path → (sha256, mtime) of every regular file in the image's file system."""
    container = subprocess.run(["docker", "create", image], capture_output=True, text=True,
                               check=True).stdout.strip()
    out = scratch / f"{container}.tar"
    try:
        subprocess.run(["docker", "export", "-o", str(out), container], check=True)
    finally:
        subprocess.run(["docker", "rm", container], capture_output=True, check=False)
    found: dict[str, tuple[str, int]] = {}
    with tarfile.open(out) as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member)
                digest = hashlib.sha256(data.read() if data else b"").hexdigest()
                found[member.name] = (digest, int(member.mtime))
    out.unlink()
    return found


def reproducible(work: Path, builder: str, scratch: Path) -> tuple[bool, list[str], int]:
    """Two --no-cache builds of the lock; (same image ID, some differing files, how many)."""
    tags = [f"envbuild-bench/layers:{builder}-repro-{n}" for n in (1, 2)]
    os.environ["SOURCE_DATE_EPOCH"] = "0"
    try:
        for tag in tags:
            build(work, builder, tag, "--no-cache")
    finally:
        del os.environ["SOURCE_DATE_EPOCH"]
    ids = [json.loads(subprocess.run(["docker", "image", "inspect", t], capture_output=True, text=True,
                                     check=True).stdout)[0]["Id"] for t in tags]
    if ids[0] == ids[1]:
        return True, [], 0
    a, b = files_of(tags[0], scratch), files_of(tags[1], scratch)
    differing = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    content = [p for p in differing if (a.get(p) or ("", 0))[0] != (b.get(p) or ("", 0))[0]]
    # The files whose content differs first: those are what a builder's settings could still fix.
    shown = [f"{p} (content)" for p in content[:15]] + [f"{p} (mtime)" for p in differing
                                                        if p not in content][:max(0, 15 - len(content))]
    shown.append(f"({len(content)} of them by content, {len(differing) - len(content)} by mtime only)")
    return False, shown, len(differing)


def run(root: Path, skip_repro: bool, builders: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    server, address = serve(root)
    registry, registry_address = start_registry(root)
    results: dict[str, dict[str, Any]] = {}
    try:
        base = push_base(registry_address)
        torch_index = f"{address}/torch/simple"
        fill_mirror(root, base, torch_index)
        index_pages(root)
        work = root / "project"
        work.mkdir()
        first, added = list(SMALL[:-1]), list(SMALL)
        for builder in builders:
            write_project(work, base, torch_index, first, f"{address}/simple")
            envbuild("lock", cwd=work)
            before, after = f"envbuild-bench/layers:{builder}-1", f"envbuild-bench/layers:{builder}-2"
            build(work, builder, before)
            old = layers(before)
            write_project(work, base, torch_index, added, f"{address}/simple")
            envbuild("lock", cwd=work)
            build(work, builder, after)
            new = layers(after)
            known = {i for i, _ in old}
            results[builder] = {"torch": max(s for _, s in new), "total": sum(s for _, s in new),
                                "moves": sum(s for i, s in new if i not in known),
                                "new_layers": sum(1 for i, _ in new if i not in known)}
            if not skip_repro:
                write_project(work, base, torch_index, first, f"{address}/simple")
                envbuild("lock", cwd=work)
                results[builder]["repro"] = reproducible(work, builder, root)
    finally:
        subprocess.run(["docker", "rmi", f"{registry_address}/envbuild/bookworm:base"], capture_output=True,
                       check=False)
        server.shutdown()
        registry.terminate()
        registry.wait(10)
        images = subprocess.run(["docker", "images", "-q", "envbuild-bench/layers"], capture_output=True,
                                text=True, check=False).stdout.split()
        subprocess.run(["docker", "rmi", "-f", *images], capture_output=True, check=False)
        named = subprocess.run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"], capture_output=True,
                               text=True, check=False).stdout.split()
        ours = [n for n in named if "envbuild-bench/layers:" in n]  # this bench's tags only
        if ours:
            subprocess.run(["buildah", "rmi", *ours], capture_output=True, check=False)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-repro", action="store_true", help="leave out the two --no-cache builds")
    parser.add_argument("--builders", default=",".join(BUILDERS), help="comma-separated: classic,buildah")
    args = parser.parse_args()
    builders = tuple(b for b in args.builders.split(",") if b)
    if not builders or any(b not in BUILDERS for b in builders):
        sys.exit(f"bench_layers: --builders takes {', '.join(BUILDERS)}")
    wheelhouse = Path(os.environ.get("PIP_FIND_LINKS", "/nonexistent"))
    if not (wheelhouse / TORCH_WHEEL).is_file():
        sys.exit(f"bench_layers: no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    for program in ("buildah", "docker"):
        if shutil.which(program) is None:
            sys.exit(f"bench_layers: no {program} on PATH")
    share_the_engine()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-layers-") as scratch:
        root = Path(scratch)
        (root / "files").mkdir()
        shutil.copy(wheelhouse / TORCH_WHEEL, root / "files" / TORCH_WHEEL)
        index_pages(root)
        results = run(root, args.skip_repro, builders)
    print(f"change          one dependency added ({SMALL[-1]}) to {', '.join(SMALL[:-1])}")
    print(f"{'':16}" + "".join(f"{b:>22}" for b in builders))
    rows = (("image", "total"), ("torch layer", "torch"), ("push moves", "moves"))
    for label, key in rows:
        print(f"{label:16}" + "".join(f"{results[b][key] / 1e6:>19.1f} MB" for b in builders))
    ratios = [results[b]["moves"] / results[b]["total"] for b in builders]
    print(f"{'  ratio':16}" + "".join(f"{r:>22.4f}" for r in ratios))
    print(f"{'  new layers':16}" + "".join(f"{results[b]['new_layers']:>22}" for b in builders))
    for builder in builders:
        if "repro" in results[builder]:
            same, shown, count = results[builder]["repro"]
            print(f"same digest ({builder}): {'yes' if same else f'no, {count} files differ'}")
            for line in shown:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
