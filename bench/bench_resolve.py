"""Start-up cost of every form of `envbuild resolve` against a bare interpreter.

All commands run interleaved in one loop, so machine noise hits each alike; the figure
that matters is the ratio of medians to `python -c pass` (target: <= 2.0 for every form).

Measured with this interpreter (run it with the Python of the environment envbuild is
installed in; a clean venv shows the honest figure, since every `.pth` file in
site-packages slows the bare start too), from a temporary directory outside the
checkout, with PYTHONPATH unset, so that the installed envbuild is what runs:

- the `envbuild` command installed next to this interpreter, which is what users type, for
  each resolve form (plain options, a GPU name, each version specifier, the `--opt=value`
  spelling). It is bin/envbuild, installed as the wheel's script: an entry point's launcher
  (pip's imports `re`, printed as a floor: `python -c "import re"`) would cost most of the
  budget before envbuild starts;
- `python -m envbuild`, whose floor, `runpy` finding and running a module, is printed too:
  `python -m` of an empty module.

The first run of each form warms the on-disk index cache (in a temporary cache
directory), as a user's second run would find it. envbuild's bytecode is compiled first, as
pip compiles it at install: with PYTHONDONTWRITEBYTECODE set, a checkout whose sources are
newer than their .pyc files recompiles every module on every start (2.6x instead of 2.0x,
measured 2026-11-24 after a branch switch).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = int(os.environ.get("BENCH_RUNS", "31"))
TARGET = 2.0
HELP_TARGET = 3.0  # `envbuild --help` and every `envbuild COMMAND --help`
FORMS = [
    ["resolve", "--driver", "550"],
    ["resolve", "--driver", "550", "--json"],
    ["resolve", "--gpu", "RTX 4090"],
    ["resolve", "--torch", "2.4"],
    ["resolve", "--python", "3.11"],
    ["resolve", "--cuda", "12.4"],
    ["resolve", "--driver=550"],
    ["resolve", "--gpu", "GH200"],  # linux/arm64: the aarch64 rows and the GPU catalogue
    ["resolve", "--platform", "linux/arm64", "--driver", "580"],
]
# Every command's help: argparse builds the command's parser, nothing is resolved.
HELP_FORMS = [["--help"]] + [[command, "--help"] for command in (
    "resolve", "detect", "smoke", "matrix", "lock", "render", "build", "verify", "clean", "promote",
    "ci", "init", "fleet", "diagnose", "config", "completion")]
FLOORS = 3  # the first three commands measured are the floors, not envbuild
EMPTY = "envbuild_bench_empty"  # the empty module `python -m` runs for its floor
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def label(argv: list[str]) -> str:
    return " ".join(f'"{a}"' if " " in a else a for a in argv)


def commands(here: str | None = None) -> list[tuple[str, list[str]]]:
    """The floors, then every form; ``here``: that checkout's bin/envbuild, not the installed one."""
    found = [("python -c pass", [sys.executable, "-c", "pass"]),
             ("python -c 'import re'", [sys.executable, "-c", "import re"]),
             ("python -m (an empty module)", [sys.executable, "-m", EMPTY])]
    script = os.path.join(os.path.dirname(sys.executable), "envbuild")
    launch = [script]
    if here:
        script = os.path.join(here, "bin", "envbuild")
        launch = [sys.executable, script]
    if os.access(script, os.R_OK):
        found += [(f"envbuild {label(argv)}", [*launch, *argv]) for argv in FORMS + HELP_FORMS]
    else:
        print(f"no envbuild command at {script}: install envbuild into this interpreter's "
              "environment to measure it", file=sys.stderr)
    found.append((f"python -m envbuild {label(FORMS[1])}", [sys.executable, "-m", "envbuild",
                                                           *FORMS[1]]))
    return found


def compile_package(package: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
    """Write the package's bytecode, as pip does at install: a checkout run with
    PYTHONDONTWRITEBYTECODE whose sources are newer than their .pyc files compiles every
    changed module on every start, which a user's installed envbuild never does."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                   capture_output=True, env=env)


def wall(cmd: list[str], cwd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=env)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # --here: measure this checkout (--here=DIR: that one), run with PYTHONPATH set to it,
    # rather than the envbuild installed beside this interpreter
    here = next((CHECKOUT if a == "--here" else os.path.abspath(a.partition("=")[2])
                 for a in args if a == "--here" or a.startswith("--here=")), None)
    measured = commands(here)
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as outside:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENVBUILD_NO_CACHE")}
        if here:
            env["PYTHONPATH"] = here
        env["XDG_CACHE_HOME"] = os.path.join(outside, "cache")
        with open(os.path.join(outside, f"{EMPTY}.py"), "w", encoding="utf-8"):
            pass  # `python -m` finds it in the working directory, as it would find envbuild
        where = subprocess.run([sys.executable, "-c", "import envbuild; print(envbuild.__file__)"],
                               check=True, capture_output=True, text=True, cwd=outside, env=env)
        print(f"envbuild measured: {where.stdout.strip()}")
        package = os.path.dirname(where.stdout.strip())
        compile_package(package, env)
        for _, cmd in measured[FLOORS:]:
            wall(cmd, outside, env)  # warm the index cache and the page cache
        times: list[list[float]] = [[] for _ in measured]
        for _ in range(RUNS):
            for slot, (_, cmd) in zip(times, measured, strict=True):
                slot.append(wall(cmd, outside, env))
    bare = statistics.median(times[0])
    print(f"{RUNS} interleaved runs each, median wall; ratio to python -c pass "
          f"(targets: resolve <= {TARGET:.2f}x, help <= {HELP_TARGET:.2f}x)")
    worst, worst_help = 0.0, 0.0
    for i, ((name, cmd), slot) in enumerate(zip(measured, times, strict=True)):
        median = statistics.median(slot)
        ratio = median / bare
        if i >= FLOORS and cmd[-1] in ("--help", "-h"):
            worst_help = max(worst_help, ratio)
        elif i >= FLOORS:
            worst = max(worst, ratio)
        print(f"  {median * 1000:7.1f} ms  {ratio:5.2f}x  {name}")
    verdict = "met" if worst <= TARGET else "MISSED"
    print(f"worst resolve form: {worst:.2f}x — target {TARGET:.2f}x {verdict}")
    verdict = "met" if worst_help <= HELP_TARGET else "MISSED"
    print(f"worst help form: {worst_help:.2f}x — target {HELP_TARGET:.2f}x {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
