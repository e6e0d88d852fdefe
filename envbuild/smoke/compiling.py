"""torch.compile readiness: what Inductor (CPU) and Triton (GPU) need at run time, proved by
compiling a tiny function in a child process and comparing it with eager.

Most training code calls ``torch.compile``; an image without a C/C++ compiler or the Python
headers imports torch, passes every eager check, and fails at the first compiled step
(``InvalidCxxCompiler: No working C++ compiler found``). Where each tool is looked for, as
torch 2.13.0 and Triton look (read in their sources, 2026-11-25):
  Inductor, CPU   the C++ compiler ``$CXX``, else ``g++`` (torch/_inductor/config.py, cpp.cxx)
  Triton, GPU     the C compiler ``$CC``, else ``gcc``, else ``clang`` (triton/runtime/build.py)
  both            ``Python.h`` under ``sysconfig.get_paths()["include"]``
The compile runs in a child with fresh Inductor and Triton cache directories: a kernel cached
by an earlier run (when a compiler was there) would otherwise hide a compiler missing now.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any, Mapping, Optional

from .report import Outcome, fail, ok, skip, warn
from .rules import COMPILE_TOOLCHAIN_ENV

# max |compiled - eager| / max |eager| for a float32 pointwise+reduction kernel: Inductor may
# reorder a sum or fuse differently (errors near 1e-7 here), a wrong kernel is off by order 1.
COMPILE_TOLERANCE = 1e-4
KILL_WAIT_S = 5.0  # a killed child that has not ended by then is left to end on its own
COMPILE_TIMEOUT_S = 600.0  # a cold compile took 73 s on a loaded 2-core VM (2026-11-25)

INSTALL_HINT = (
    "install a C/C++ compiler and this Python's headers: on Debian/Ubuntu "
    "'apt-get install g++ python3-dev' (python3.X-dev for another python3.X); an envbuild image "
    "carries them unless rendered with --no-compile-toolchain (compile-toolchain = false)"
)
OPTED_OUT_HINT = (
    "this image or host was built without the compile toolchain (compile-toolchain = false, "
    "%s=0): training code that calls torch.compile fails here; re-render without the opt-out, "
    "or apt-get install g++ python3-dev" % COMPILE_TOOLCHAIN_ENV
)

# The child: stdlib + torch, prints one JSON line. argv[1] is the device.
PROBE = r"""
import json, sys
try:
    import torch
    device = sys.argv[1]
    def f(x, y):
        return torch.sin(x) * 2.0 + torch.cos(y).sum(dim=1, keepdim=True) * 0.01
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 32, generator=gen).to(device)
    y = torch.randn(64, 32, generator=gen).to(device)
    eager = f(x, y)
    got = torch.compile(f, fullgraph=True)(x, y)
    scale = float(eager.abs().max().item()) or 1.0
    err = float((got.float() - eager.float()).abs().max().item()) / scale
    out = {"ok": True, "device": str(got.device), "is_cuda": bool(got.is_cuda), "error": err}
except BaseException as exc:
    out = {"ok": False, "exception": "%s: %s" % (type(exc).__name__, exc)}
sys.stdout.write("\n" + json.dumps(out) + "\n")
"""


def find_toolchain(device: str, env: Mapping[str, str], include_dir: Optional[str] = None) -> dict[str, Any]:
    """What compiling on ``device`` needs and where each was found (None: missing), searched on
    ``env``'s PATH as the compiling child will search it."""

    def find(name: str) -> Optional[str]:
        if os.sep in name:
            return name if os.access(name, os.X_OK) else None
        return shutil.which(name, path=env.get("PATH", os.defpath))

    include = include_dir if include_dir is not None else sysconfig.get_paths().get("include", "")
    header = os.path.join(include, "Python.h")
    found: dict[str, Any] = {"python_h": header if os.path.isfile(header) else None}
    if device.startswith("cuda"):
        names = [env["CC"]] if env.get("CC") else ["gcc", "clang"]
        found["cc"] = next((p for p in map(find, names) if p), None)
        found["cc_searched"] = names
    else:
        name = env.get("CXX") or "g++"
        found["cxx"] = find(name)
        found["cxx_searched"] = [name]
    return found


def missing_parts(found: Mapping[str, Any]) -> list[str]:
    parts = []
    for key, what in (("cxx", "a C++ compiler"), ("cc", "a C compiler")):
        if key in found and found[key] is None:
            parts.append("%s (%s not on PATH)" % (what, " or ".join(found[key + "_searched"])))
    if found.get("python_h") is None:
        parts.append("the Python headers (no Python.h under %s)" % sysconfig.get_paths().get("include"))
    return parts


class Child:
    """The compile child, started now and judged later: tier 1 starts it as early as it may (at
    its start on the CPU, once the first GPU's first kernel passed there), so that it imports
    torch and compiles beside the other checks (on an H200 host the compile took 15-18 s of a
    22 s tier 1, the other checks 6 s, one after the other). Its output goes to files, not
    pipes, so a chatty child never waits for the parent to read."""

    def __init__(self, device: str, env: Mapping[str, str]) -> None:
        self.cache = tempfile.mkdtemp(prefix="envbuild-compile-")
        child_env = dict(env)
        child_env.update({
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(self.cache, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(self.cache, "triton"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",  # no worker pool to start for one kernel
        })
        self.started = time.monotonic()
        self.process = None  # type: Optional[subprocess.Popen[bytes]]
        try:
            with open(os.path.join(self.cache, "out"), "wb") as out, \
                    open(os.path.join(self.cache, "err"), "wb") as err:
                self.process = subprocess.Popen([sys.executable, "-c", PROBE, device], env=child_env,
                                                stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError:
            shutil.rmtree(self.cache, ignore_errors=True)
            raise

    def result(self, timeout: float) -> dict[str, Any]:
        """Its JSON, or what went wrong; ``timeout`` counts from its start. Ends it either way."""
        assert self.process is not None
        try:
            self.process.wait(timeout=max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.cancel()
            return {"ok": False, "exception": "compiling took longer than %g s" % timeout}
        try:
            with open(os.path.join(self.cache, "out"), encoding="utf-8", errors="replace") as out, \
                    open(os.path.join(self.cache, "err"), encoding="utf-8", errors="replace") as err:
                found = parse_probe(out.read(), err.read(), self.process.returncode)
        finally:
            self.cancel()
        found["seconds"] = round(time.monotonic() - self.started, 3)
        return found

    def cancel(self) -> None:
        """Kill it where it still runs (a check that will not be judged, Ctrl-C) and remove its
        files; a second call does nothing."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            # stuck in the driver, it ends once it leaves it; the smoke run goes on meanwhile
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(KILL_WAIT_S)
        shutil.rmtree(self.cache, ignore_errors=True)


def run_probe(device: str, env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """Compile PROBE's function in a child on ``device``; its JSON, or what went wrong."""
    child = Child(device, env)
    try:
        return child.result(timeout)
    finally:
        child.cancel()


def parse_probe(stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1])
        if isinstance(result, dict):
            return result
    except (IndexError, ValueError):
        pass
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "exception": "the compile child exited %d: %s" % (returncode, tail)}


def cause(exception: str) -> str:
    """The missing piece a compile error names, as a short phrase; "" when none is recognised."""
    text = exception
    if "InvalidCxxCompiler" in text or "No working C++ compiler" in text:
        return "no working C++ compiler"
    if "Python.h" in text:
        return "the Python headers are missing (Python.h)"
    if "Failed to find C compiler" in text:
        return "no C compiler for Triton"
    return ""


def first_error_line(text: str) -> str:
    """The line of a compiler's output that says what failed, else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line or "Error:" in line:
            return line[:300]
    return (lines[0] if lines else text)[:300]


def judge_probe(result: Mapping[str, Any], device: str, opted_out: bool) -> Outcome:
    backend = "Triton" if device.startswith("cuda") else "Inductor C++"
    if not result.get("ok"):
        text = str(result.get("exception", ""))
        why = cause(text)
        message = "torch.compile failed on %s (%s): %s" % (device, backend, why or first_error_line(text))
        value = {"device": device, "error": first_error_line(text), "opted_out": opted_out}
        if opted_out:
            return warn(message + "; the image opted out of the compile toolchain", value, OPTED_OUT_HINT)
        return fail(message, value, INSTALL_HINT if why else
                    "see the error; rerun the child by hand: TORCH_LOGS=output_code python -c "
                    "'import torch; torch.compile(lambda x: x.sin())(torch.ones(4))'")
    value = dict(result)
    value["device"] = device
    if device.startswith("cuda") and not result.get("is_cuda"):
        where = result.get("device")
        return fail("torch.compile result on %s is on %s, not a CUDA device" % (device, where), value,
                    "torch reports CUDA but the compiled kernel ran elsewhere: reinstall the CUDA wheel")
    error = float(result.get("error", 1.0))
    if not error <= COMPILE_TOLERANCE:
        return fail("numerical check failed: torch.compile on %s differs from eager by %.2e "
                    "(tolerance %.0e)" % (device, error, COMPILE_TOLERANCE), value,
                    "a miscompiled kernel: report it with the torch version; use eager mode meanwhile")
    return ok("torch.compile (%s) on %s matches eager (max relative error %.1e)" % (backend, device, error),
              value)


class Pending:
    """A torch.compile check begun ahead of its turn (``begin_compile``): either its verdict,
    known at once (no torch, a missing compiler), or its child, running."""

    def __init__(self, device: str, outcome: Optional[Outcome] = None, child: Optional[Child] = None,
                 opted_out: bool = False) -> None:
        self.device, self.outcome, self.child, self.opted_out = device, outcome, child, opted_out

    def finish(self, timeout: Optional[float] = None) -> Outcome:
        if self.outcome is not None:
            return self.outcome
        assert self.child is not None
        return judge_probe(self.child.result(timeout or COMPILE_TIMEOUT_S), self.device, self.opted_out)

    def cancel(self) -> None:
        if self.child is not None:
            self.child.cancel()


def begin_compile(torch: Any, device: str, env: Mapping[str, str]) -> Pending:
    """Toolchain first (a quick, named answer), else the compile child started."""
    if torch is None:
        return Pending(device, skip("torch is not importable", hint="fix torch.import first"))
    opted_out = env.get(COMPILE_TOOLCHAIN_ENV) == "0"
    found = find_toolchain(device, env)
    missing = missing_parts(found)
    if missing:
        message = "torch.compile cannot work on %s: missing %s" % (device, "; ".join(missing))
        value = {"device": device, "toolchain": found, "opted_out": opted_out}
        if opted_out:
            return Pending(device, warn(message + "; the image opted out of the compile toolchain", value,
                                        OPTED_OUT_HINT))
        return Pending(device, fail(message, value, INSTALL_HINT))
    return Pending(device, child=Child(device, env), opted_out=opted_out)


def check_compile(torch: Any, device: str, env: Mapping[str, str],
                  timeout: Optional[float] = None) -> Outcome:
    """Toolchain first, then a real compile compared with eager, waited for now."""
    pending = begin_compile(torch, device, env)
    try:
        return pending.finish(timeout)
    finally:
        pending.cancel()
