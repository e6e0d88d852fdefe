"""torch.compile readiness (docs/faults.md W1-W6): the toolchain in every rendered image and host
script unless the lock opts out, and the smoke check that compiles for real (CPU Inductor here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke import compiling, runner, t0_environment, t1_correctness
from envbuild.smoke import report as results
from envbuild.smoke.rules import COMPILE_TOOLCHAIN_ENV

torch = pytest.importorskip("torch")


def no_compiler_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment with a PATH that holds no compiler and no CC/CXX."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env["PATH"] = str(empty)
    return env


# --------------------------------------------------------------------------- the smoke check


def test_missing_cxx_fails_naming_it_and_the_fix(tmp_path: Path) -> None:
    verdict = compiling.check_compile(torch, "cpu", no_compiler_env(tmp_path))
    assert verdict.status == "fail"
    assert verdict.message.startswith(
        "torch.compile cannot work on cpu: missing a C++ compiler (g++ not on PATH)")
    assert "apt-get install g++ python3-dev" in verdict.hint
    assert verdict.exit_code == results.EXIT_FAILED


def test_a_real_compile_without_a_compiler_is_named(tmp_path: Path) -> None:
    """Past the toolchain look-up: torch.compile itself runs and fails, and its error is read."""
    env = no_compiler_env(tmp_path)
    env["CXX"] = str(tmp_path / "bin" / "g++")  # not there: Inductor finds no working compiler
    result = compiling.run_probe("cpu", env, timeout=300)
    assert result["ok"] is False
    assert compiling.cause(result["exception"]) == "no working C++ compiler"
    verdict = compiling.judge_probe(result, "cpu", opted_out=False)
    assert verdict.status == "fail" and "no working C++ compiler" in verdict.message
    assert "g++" in verdict.hint


def test_opted_out_image_warns_and_never_passes(tmp_path: Path) -> None:
    env = no_compiler_env(tmp_path)
    env[COMPILE_TOOLCHAIN_ENV] = "0"
    verdict = compiling.check_compile(torch, "cpu", env)
    assert verdict.status == "warn"
    assert "opted out of the compile toolchain" in verdict.message
    assert "compile-toolchain = false" in verdict.hint
    failed = compiling.judge_probe({"ok": False, "exception": "InvalidCxxCompiler: No working C++ compiler"},
                                   "cpu", opted_out=True)
    assert failed.status == "warn"


def test_triton_needs_a_c_compiler_and_both_need_python_h(tmp_path: Path) -> None:
    env = no_compiler_env(tmp_path)
    found = compiling.find_toolchain("cuda:0", env, include_dir=str(tmp_path))
    assert found["cc"] is None and found["python_h"] is None and "cxx" not in found
    missing = compiling.missing_parts(found)
    assert missing[0] == "a C compiler (gcc or clang not on PATH)"
    assert missing[1].startswith("the Python headers (no Python.h under")
    (tmp_path / "bin" / "cc").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "cc").chmod(0o755)
    env["CC"] = "cc"
    assert compiling.find_toolchain("cuda:0", env)["cc"] == str(tmp_path / "bin" / "cc")


def test_judging_a_compile_result() -> None:
    on_cpu = {"ok": True, "device": "cpu", "is_cuda": False, "error": 0.0}
    assert compiling.judge_probe(on_cpu, "cpu", opted_out=False).status == "pass"
    moved = compiling.judge_probe(on_cpu, "cuda:0", opted_out=False)
    assert moved.status == "fail" and "not a CUDA device" in moved.message
    wrong = compiling.judge_probe(dict(on_cpu, error=0.5), "cpu", opted_out=False)
    assert wrong.status == "fail" and wrong.message.startswith("numerical check failed")
    headers = compiling.judge_probe(
        {"ok": False, "exception": "CppCompileError: /tmp/x.cpp:1:10: fatal error: Python.h: No such file"},
        "cpu", opted_out=False)
    assert headers.status == "fail" and "the Python headers are missing" in headers.message
    other = compiling.judge_probe({"ok": False, "exception": "BackendCompilerFailed: boom"}, "cpu", False)
    assert other.status == "fail" and "boom" in other.message
    assert compiling.parse_probe("", "Segmentation fault", -11)["exception"].endswith("Segmentation fault")


def test_compile_check_is_blocked_with_the_gpu_checks_and_waits_for_the_first_kernel() -> None:
    run = runner.Run(runner.Options(tier=1), {})
    run.torch = torch
    run.gpu_block = "torch is CPU-only"
    blocked = t1_correctness._check_compile(run)
    assert blocked.status == "skip" and "fix torch.cuda_build first" in blocked.hint
    run.gpu_block, run.devices = None, [0]
    run.check("gpu.kernel@cuda:0", 1, lambda: results.fail("arange result is on cpu"))
    waits = t1_correctness._check_compile(run)
    assert waits.status == "skip" and "gpu.kernel@cuda:0" in waits.message


def test_numpy_bridge_missing_warns_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoBridge:
        def zeros(self, n: int) -> Any:
            return self

        def numpy(self) -> Any:
            raise RuntimeError("Numpy is not available")

    verdict = t0_environment.check_numpy(NoBridge())
    assert verdict.status == "warn"
    assert verdict.message == "torch's numpy bridge is missing: Numpy is not available"
    assert "pip install numpy" in verdict.hint
    try:
        import numpy  # noqa: F401
    except ImportError:  # this machine's venv: the real torch's bridge is missing for real
        real = t0_environment.check_numpy(torch)
        assert real.status == "warn" and "Numpy is not available" in real.message
    else:
        assert t0_environment.check_numpy(torch).status == "pass"


# ------------------------------------------------- the compile child beside the other checks


class Recorder:
    """begin_compile's stand-in: notes how many checks had run when it was called, and
    answers with a Pending whose outcome says so."""

    def __init__(self, run: runner.Run) -> None:
        self.run = run
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, torch: Any, device: str, env: Any) -> compiling.Pending:
        self.calls.append((device, [c.name for c in self.run.checks]))
        return compiling.Pending(device, results.ok(f"begun early on {device}"))


def test_on_the_cpu_the_child_starts_before_the_other_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    run = runner.Run(runner.Options(tier=1, cpu_ok=True), {})
    run.torch, run.gpu_block = torch, "no GPU visible"
    begun = Recorder(run)
    monkeypatch.setattr(t1_correctness, "begin_compile", begun)
    monkeypatch.setattr(t1_correctness, "check_compile", lambda *a: pytest.fail("compiled a second time"))
    monkeypatch.setattr(t1_correctness, "_check_cpu_selfcheck", lambda run: results.ok("self-check"))
    t1_correctness.tier1(run)
    assert begun.calls == [("cpu", ["gpu.visible"])]  # before the device checks and the self-check
    compiled = next(c for c in run.checks if c.name == "torch.compile")
    assert (compiled.status, compiled.message) == ("pass", "begun early on cpu")
    assert run.checks[-1].name == "torch.compile"  # still reported last


def test_on_a_gpu_it_starts_once_the_first_kernel_passed_and_never_after_a_failed_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for kernel in ("pass", "fail"):
        run = runner.Run(runner.Options(tier=1), {})
        run.torch, run.devices = torch, [0]
        begun = Recorder(run)
        monkeypatch.setattr(t1_correctness, "begin_compile", begun)
        monkeypatch.setattr(t1_correctness, "_check_visible", lambda run: results.ok("1 GPU"))
        outcome = results.ok("kernel ran") if kernel == "pass" else results.fail("arange result is on cpu")
        checks = tuple((n, (lambda run, i, o=outcome: o) if n == "gpu.kernel" else
                        (lambda run, i, n=n: results.ok(n)), False)
                       for n, _, _ in t1_correctness.T1_DEVICE_CHECKS)
        monkeypatch.setattr(t1_correctness, "T1_DEVICE_CHECKS", checks)
        monkeypatch.setattr(t1_correctness, "_check_dev_nodes", lambda run: results.ok("nodes"))
        monkeypatch.setattr(t1_correctness, "judge_libcuda", lambda text: results.ok("libcuda"))
        monkeypatch.setattr(t1_correctness, "_check_cpu_selfcheck", lambda run: results.ok("self-check"))
        t1_correctness.tier1(run)
        compiled = next(c for c in run.checks if c.name == "torch.compile")
        if kernel == "pass":
            assert begun.calls == [("cuda:0", ["gpu.visible", "gpu.arch@cuda:0", "gpu.kernel@cuda:0"])]
            assert compiled.message == "begun early on cuda:0"
        else:
            assert begun.calls == [] and compiled.status == "skip" and "gpu.kernel@cuda:0" in compiled.message


def test_a_child_not_judged_is_killed_and_its_files_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in a check after the child started: the tier's clean-up kills it."""
    monkeypatch.setattr(compiling, "PROBE", "import time; time.sleep(60)")
    started: list[compiling.Pending] = []

    def begin(torch: Any, device: str, env: Any) -> compiling.Pending:
        started.append(compiling.Pending(device, child=compiling.Child(device, dict(os.environ))))
        return started[-1]

    def interrupted(run: runner.Run) -> results.Outcome:
        raise KeyboardInterrupt

    run = runner.Run(runner.Options(tier=1, cpu_ok=True), {})
    run.torch, run.gpu_block = torch, "no GPU visible"
    monkeypatch.setattr(t1_correctness, "begin_compile", begin)
    monkeypatch.setattr(t1_correctness, "_check_cpu_selfcheck", interrupted)
    with pytest.raises(KeyboardInterrupt):
        t1_correctness.tier1(run)
    child = started[0].child
    assert child is not None and child.process is not None
    assert child.process.poll() is not None and not os.path.exists(child.cache)


def test_the_timeout_counts_from_the_childs_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiling, "PROBE", "import time; time.sleep(60)")
    child = compiling.Child("cpu", dict(os.environ))
    found = child.result(timeout=0.5)
    assert found == {"ok": False, "exception": "compiling took longer than 0.5 s"}
    assert child.process is not None and child.process.poll() is not None
    assert not os.path.exists(child.cache)
    monkeypatch.setattr(compiling, "PROBE", 'print(\'{"ok": true, "is_cuda": false, "error": 0.0}\')')
    done = compiling.Child("cpu", dict(os.environ)).result(timeout=60)
    assert done["ok"] is True and done["seconds"] >= 0
