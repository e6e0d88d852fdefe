"""Size and rebuild cost of a rendered CUDA torch image.

Builds the runtime image of a CUDA torch stack (torch's CUDA wheels and their nvidia-*
dependencies come from the configured Python package index) on a local base image, then
prints, measured in this one run:

  size ratio        image size / (base image size + bytes installed in /opt/venv)  target <= 1.05
  duplicate CUDA    bytes of CUDA shared libraries present more than once        target 0
  warm rebuild      seconds to rebuild after changing only a user value (--env),
                    and whether any step up to torch ran instead of coming from cache

Needs a Docker engine and the network (several GB of wheels on the first run). Usage:
  python bench/bench_build.py [--base-image envbuild-test/bookworm:base] [--torch ==2.13.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuild.engine import daemon  # noqa: E402

# Run inside the image: every CUDA shared library, grouped by file name.
SCAN = r"""
import json, os, re
names = "cu|nv|cudnn|nccl|cublas|cufft|curand|cusolver|cusparse|nvrtc|nvjitlink"
pattern = re.compile(r"lib(" + names + r")[^/]*\.so[.0-9]*$")
seen = {}
for top in ("/usr", "/opt", "/lib"):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if pattern.match(name) and os.path.isfile(path) and not os.path.islink(path):
                seen.setdefault(name, []).append((path, os.path.getsize(path)))
print(json.dumps(seen))
"""


def run_in(client: Any, image: str, command: list[str]) -> str:
    container = client.create_container(image, command=command, user="root",
                                        host_config=client.create_host_config(network_mode="none"),
                                        labels={daemon.LABEL: "bench"})
    try:
        client.start(container["Id"])
        client.wait(container["Id"], timeout=600)
        return str(client.logs(container["Id"], stdout=True, stderr=False).decode())
    finally:
        client.remove_container(container["Id"], force=True)


def envbuild_build(args: list[str], report: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "envbuild", "build", *args, "--verbose",
                           "--report", str(report)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"build failed ({done.returncode}): {done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="envbuild-test/bookworm:base")
    parser.add_argument("--torch", default="==2.13.0")
    parser.add_argument("--python", default="3.11")
    parser.add_argument("--variant", default="default",
                        help="'default' = the package index's CUDA wheel")
    ns = parser.parse_args()
    client = daemon.connect(os.environ)
    stack = ["--torch", ns.torch, "--variant", ns.variant, "--python", ns.python,
             "--base-image", ns.base_image, "--network", "host", "--tag", "envbuild-bench/cuda:1"]
    if os.environ.get("PIP_CERT"):
        stack += ["--ca-bundle", os.environ["PIP_CERT"]]
    with tempfile.TemporaryDirectory() as tmp:
        cold, _ = envbuild_build(stack, Path(tmp) / "cold.json")
        result = json.loads((Path(tmp) / "cold.json").read_text())
        image_size = int(result["size"])
        base_size = int(client.inspect_image(ns.base_image)["Size"])
        venv = int(run_in(client, result["image_id"], ["du", "-sb", "/opt/venv"]).split()[0])
        scan = json.loads(run_in(client, result["image_id"], ["/opt/venv/bin/python", "-c", SCAN]))
        duplicated = {name: copies for name, copies in scan.items() if len(copies) > 1}
        dup_bytes = sum(size for copies in duplicated.values() for _, size in copies[1:])
        cuda_bytes = sum(size for copies in scan.values() for _, size in copies)
        # What the recipe controls: a library both under the base/system paths and in the venv
        # (a cuDNN base image under wheels that carry cuDNN, say). Copies inside the venv come
        # from the wheels themselves (triton bundles its own CUPTI, for one).
        recipe = {name for name, copies in duplicated.items()
                  if {p.startswith("/opt/venv/") for p, _ in copies} == {True, False}}
        recipe_bytes = sum(size for name in recipe for _, size in duplicated[name][1:])

        warm, _ = envbuild_build([*stack, "--env", f"BENCH_RUN={time.time_ns()}"],
                                 Path(tmp) / "warm.json")
        ran = json.loads((Path(tmp) / "warm.json").read_text())["ran"]
    torch_rebuilt = any("pip install" in step and "torch" in step for step in ran)

    print(f"stack: torch {ns.torch} variant {ns.variant} python {ns.python} on {ns.base_image}")
    print(f"cold build: {cold:.0f} s, image {image_size / 1e9:.3f} GB")
    print(f"base image: {base_size / 1e9:.3f} GB; installed in /opt/venv: {venv / 1e9:.3f} GB")
    print(f"size ratio: {image_size / (base_size + venv):.3f} (target <= 1.05)")
    print(f"CUDA shared libraries: {cuda_bytes / 1e9:.3f} GB in {len(scan)} names")
    print(f"present twice, base/system and wheels: {recipe_bytes} bytes (target 0)"
          + (f" {sorted(recipe)}" if recipe else ""))
    inner = {name: [p for p, _ in duplicated[name]] for name in sorted(set(duplicated) - recipe)}
    print(f"present twice inside the wheels themselves: {dup_bytes - recipe_bytes} bytes"
          + (f" {inner}" if inner else ""))
    print(f"warm rebuild after a changed --env: {warm:.1f} s; steps run: {len(ran)}"
          f" ({'; '.join(s[:50] for s in ran)}); torch layer rebuilt: {torch_rebuilt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
