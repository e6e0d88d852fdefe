"""One smoke run: its options, its state, and how each check is run and recorded."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from typing import Any, Callable, Iterator, Mapping

from .diagnose import classify_cuda_error
from .report import SCHEMA, Check, Outcome, exit_code_for, fail, first_line, skip, summarize


class CheckTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Best effort: SIGALRM interrupts Python code (not a blocked CUDA call)."""
    usable = (
        seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout("timed out after %g s" % float(seconds or 0))

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds or 0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass
class Options:
    json: bool = False
    tier: int = 2
    lock: str | None = None
    cpu_ok: bool = False
    peaks: str | None = None
    report: str | None = None
    timeout: float | None = None
    target: str | None = None  # which target of a schema 2 lock (needed when it has several)
    installed_only: bool = False  # compare the installed set with the lock, nothing else
    expect_gpus: int | None = None  # the GPUs the node type has (a fleet target's gpus-per-node)


# Which check explains each reason the GPU checks stop.
BLOCK_SOURCES = {
    "torch is not importable": "torch.import",
    "torch is CPU-only": "torch.cuda_build",
    "no GPU visible": "gpu.visible",
}


class Run:
    """Mutable state of one smoke run: facts gathered so far and why GPU checks stop."""

    def __init__(self, options: Options, env: Mapping[str, str]) -> None:
        self.options = options
        self.env = env
        self.checks: list[Check] = []
        self.host: dict[str, Any] = {}
        self.torch_facts: dict[str, Any] = {}
        self.torch: Any = None
        self.driver: dict[str, Any] = {}
        self.gpu_block: str | None = None  # why GPU checks cannot run
        self.devices: list[int] = []
        self.device_block: dict[int, str] = {}
        self.variant = ""

    # -- running one check -------------------------------------------------------

    def check(
        self,
        name: str,
        tier: int,
        fn: Callable[[], Outcome],
        *,
        gpu: bool = False,
        device: int | None = None,
        heavy: bool = False,
        standalone: bool = False,
    ) -> Check:
        """Run one check. ``gpu``: skipped (never passed) when no GPU is usable, unless
        ``standalone`` (it reads the driver, not torch, so a pass there is real)."""
        blocked = None if standalone else self._blocked(gpu, device)
        start = time.perf_counter()
        outcome = self._call(fn, heavy) if blocked is None else skip(*blocked)
        if (
            gpu
            and not standalone
            and self.options.cpu_ok
            and self.gpu_block is not None
            and outcome.status == "pass"
        ):
            outcome = skip(outcome.message)  # never let a GPU check pass without a GPU
        if outcome.status != "pass" and not outcome.hint:
            # Every non-pass carries a hint; a check that forgot one must not ship empty.
            outcome = dataclasses.replace(outcome, hint="see the message; rerun with --json for values")
        result = Check(
            name=name,
            tier=tier,
            status=outcome.status,
            message=outcome.message,
            value=outcome.value,
            hint=outcome.hint,
            seconds=time.perf_counter() - start,
            exit_code=outcome.exit_code if outcome.status == "fail" else 0,
            gpu=gpu,
        )
        self.checks.append(result)
        return result

    def _blocked(self, gpu: bool, device: int | None) -> tuple[str, Any, str] | None:
        """(message, value, hint) of the skip when a check cannot run, else None."""
        if not gpu or self.gpu_block is None:
            if device is not None and device in self.device_block:
                return (
                    "blocked: %s" % self.device_block[device],
                    None,
                    "fix gpu.arch@cuda:%d first" % device,
                )
            return None
        source = BLOCK_SOURCES.get(self.gpu_block, "the first failure above")
        if self.options.cpu_ok:
            return (
                "no GPU (--cpu-ok): %s" % self.gpu_block,
                None,
                "a GPU check: it runs on a GPU host (see %s)" % source,
            )
        return ("blocked: %s" % self.gpu_block, None, "fix %s first" % source)

    def _call(self, fn: Callable[[], Outcome], heavy: bool) -> Outcome:
        try:
            with deadline(self.options.timeout if heavy else None):
                return fn()
        except CheckTimeout as exc:
            return fail(
                str(exc),
                hint="the check hung: a stuck GPU, a deadlocked worker, or a "
                "very slow host; rerun with a larger --timeout to tell them apart",
            )
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            return self.outcome_from_error(exc)

    def outcome_from_error(self, exc: BaseException) -> Outcome:
        text = "%s: %s" % (type(exc).__name__, exc)
        known = classify_cuda_error(
            str(exc),
            torch_cuda=self.torch_facts.get("cuda"),
            driver_version=self.driver.get("version"),
            driver_cuda=self.driver.get("cuda_version"),
        )
        if known is not None:
            return fail(known.message, {"error": first_line(text)}, known.hint, known.exit_code)
        return fail(
            "unexpected error: %s" % first_line(text),
            hint="see the error text; rerun with CUDA_LAUNCH_BLOCKING=1 for CUDA errors",
        )

    # -- the report --------------------------------------------------------------

    def report(self, tier_seconds: Mapping[int, float]) -> dict[str, Any]:
        code = exit_code_for(self.checks)
        return {
            "schema": SCHEMA,
            "tiers": list(range(self.options.tier + 1)),
            "cpu_ok": self.options.cpu_ok,
            "host": self.host,
            "torch": self.torch_facts,
            "checks": [c.to_json() for c in self.checks],
            "summary": summarize(self.checks),
            "exit_code": code,
            "tier_seconds": {str(t): round(s, 3) for t, s in tier_seconds.items()},
        }


def indices(run: Run) -> list[int | None]:
    """Each visible device, or one None so the GPU checks still appear (as skips)."""
    return list(run.devices) or [None]


def bind(fn: Callable[[Run, int], Outcome], run: Run, index: int | None) -> Callable[[], Outcome]:
    def call() -> Outcome:
        if index is None:  # only reached when no GPU is visible; the runner skips it first
            return skip("no GPU", hint="needs a visible GPU")
        return fn(run, index)

    return call
