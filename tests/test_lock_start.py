"""What ``lock`` reads before uv's closure run starts (issue 40: lock within 1.25x of uv).

Everything imported before that run is on the lock's critical path; what serves only the
answer (the pylock reader, the hash check's records, the sdist and extension checkers, the
registry client) is read once uv runs, beside it. A module that creeps back onto that path
costs every lock a few milliseconds and fails here first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Stops the lock the moment uv's closure run (an online ``pip compile``) would start, and
# prints every module loaded by then.
PROBE = """
import os, subprocess, sys
real = subprocess.Popen.__init__
def started(self, args, *rest, **kwargs):
    if isinstance(args, list) and "compile" in args and "--offline" not in args:
        print(" ".join(sorted(sys.modules)), flush=True)
        os._exit(0)
    return real(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = started
from envbuild.__main__ import run
run()
"""

LATER = {
    "hashlib",  # and the OpenSSL it loads: nothing hashes before uv runs on a fresh lock
    "envbuild.pylock.files",  # the pylock reader: read beside uv's run (read_soon)
    "envbuild.pylock.sources",  # git and archive requirements: the project has none
    "envbuild.pylock.uvfailure",  # uv's failures: read where uv fails
    "envbuild.extensions.tree",  # extensions and local packages: the project has none
    "envbuild.extensions.classify",
    "envbuild.extensions.sdists",
    "envbuild.render.lockset",  # the lock's writer: read beside uv's run
    "envbuild.registry.digest",  # --no-registry; and pinned beside uv's run where asked
    "requests",
    "concurrent.futures",
}


def test_a_fresh_lock_starts_uv_before_reading_what_only_its_answer_needs(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0"\nrequires-python = ">=3.11"\n'
        'dependencies = ["requests>=2.31", "six", "pyyaml; python_version >= \'3.8\'"]\n\n'
        '[tool.envbuild]\ntorch = "==2.13.0"\nvariant = "default"\npython = "3.11"\n'
        'companions = false\nbase-image = "envbuild-test/bookworm:base"\n')
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "UV_CACHE_DIR": str(tmp_path / "uv"),
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PYTHONPATH": str(ROOT)}
    for _ in range(2):  # the first fills envbuild's cache (the matrices' rows and digests)
        done = subprocess.run([sys.executable, "-c", PROBE, "lock", "--no-registry"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "envbuild.pylock.uv" in loaded, done.stdout  # the probe stopped at the closure's run
    assert loaded & LATER == set()
