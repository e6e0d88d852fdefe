"""The in-process probe of ``envbuild diagnose``: a payload, standard library + torch only.

``envbuild diagnose -- COMMAND`` writes this file, whole, as ``sitecustomize.py`` into a
temporary directory put first on the job's PYTHONPATH; every Python the job starts
imports it at start-up. It does nothing unless ``ENVBUILD_DIAGNOSE_OUT`` names the file
to append its records to (JSON lines), and never writes to the job's stdout or stderr.
It imports no envbuild module and runs on Python 3.8+ (like the smoke payload).

It never imports torch itself: a finder on ``sys.meta_path`` waits for the job's own
``import torch`` and then installs the hooks:

- DataLoader waits: the iterator's ``__next__`` timed (the main loop waiting for a batch);
- optimizer steps: torch's global optimizer step pre/post hooks (step time and the time
  between steps, the iteration period);
- on a CUDA build only: host→device copies (``Tensor.to`` / ``.cuda`` whose result is on
  the GPU and whose source was not) and synchronisations (``.item()`` / ``.cpu()`` of a
  GPU tensor), timed; and one short ``torch.profiler`` window after the warm-up steps
  that counts kernel launches per step. A CPU build has none of these, and they report
  none (zero overhead there).

Records are summed in memory and appended as one line about every ``FLUSH_S`` seconds
(checked when a batch or a step ends) and at exit, so the cost per batch is two clock
reads and a few additions.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ENV_OUT = "ENVBUILD_DIAGNOSE_OUT"
# Steps of the profiler window, and the optimizer steps before it starts (the first steps
# carry allocator warm-up and lazy initialisation, not the steady state).
ENV_PROFILE = "ENVBUILD_DIAGNOSE_PROFILE"  # "auto" (CUDA builds), "always", "never"
PROFILE_WARMUP_STEPS = 10
PROFILE_STEPS = 5
FLUSH_S = 0.5
SCHEMA = "envbuild.diagnose.probe/1"
# Profiler event names that are one kernel launch each (CUDA runtime and driver API).
LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


class Recorder:
    """Sums of what the hooks saw since the last flush; ``flush`` appends one line."""

    def __init__(self, path: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.path = path
        self.clock = clock
        self.pid = os.getpid()
        self.last_flush = clock()
        self.window_t0 = time.time()
        self.last_event = self.window_t0
        self.fresh = True  # no event in this window yet: it starts at its first event
        self.step_started: float | None = None
        self.last_step_end: float | None = None
        self.steps_total = 0
        self.param_device: str | None = None
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = dict.fromkeys(
            ("batches", "data_wait_s", "data_wait_max_s", "first_wait_s", "steps", "step_s", "periods",
             "period_s", "h2d", "h2d_bytes", "h2d_s", "syncs", "sync_s"), 0.0)

    def event(self, ago: float = 0.0) -> None:
        """Mark an event that began ``ago`` seconds back: the window spans its events only,
        never the job's start-up before the loop nor what it does after it."""
        now = time.time()
        if self.fresh:
            self.window_t0, self.fresh = now - ago, False
        self.last_event = now

    def data_wait(self, seconds: float, first: bool = False) -> None:
        """One batch waited for; ``first`` of its iterator (an epoch's start: workers
        starting, unless persistent), summed apart from the steady state."""
        self.event(seconds)
        sums = self.sums
        sums["batches"] += 1
        if first:
            sums["first_wait_s"] += seconds
            self.maybe_flush()
            return
        sums["data_wait_s"] += seconds
        if seconds > sums["data_wait_max_s"]:
            sums["data_wait_max_s"] = seconds
        self.maybe_flush()

    def step_begin(self) -> None:
        self.event()
        self.step_started = self.clock()

    def step_end(self, optimizer: Any) -> None:
        self.event()
        now = self.clock()
        sums = self.sums
        if self.step_started is not None:
            sums["steps"] += 1
            sums["step_s"] += now - self.step_started
        if self.last_step_end is not None:
            sums["periods"] += 1
            sums["period_s"] += now - self.last_step_end
        self.last_step_end = now
        self.steps_total += 1
        if self.param_device is None or sums["steps"] == 1:
            self.param_device = param_device(optimizer)
        self.maybe_flush()

    def add(self, key: str, seconds: float, count_key: str, count: float = 1.0) -> None:
        self.sums[key] += seconds
        self.sums[count_key] += count

    def maybe_flush(self) -> None:
        if self.clock() - self.last_flush >= FLUSH_S:
            self.flush(go_on=True)

    def flush(self, go_on: bool = False) -> None:
        """Write the window; with ``go_on`` (mid-loop) the next one starts where it ends."""
        if not self.fresh:
            record = {"kind": "window", "pid": self.pid, "t0": self.window_t0, "t1": self.last_event,
                      "param_device": self.param_device}
            record.update(self.sums)
            self.write(record)
        self.fresh = not go_on
        self.window_t0 = self.last_event
        self.last_flush = self.clock()
        self.reset()

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        try:  # one write of an O_APPEND file: lines of several processes never interleave
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:
            pass  # the diagnosis loses a line; the job must never fail for it


def param_device(optimizer: Any) -> str | None:
    """The device type of the optimizer's first parameter ("cuda", "cpu"), or None."""
    try:
        for group in optimizer.param_groups:
            for param in group["params"]:
                return str(param.device.type)
    except Exception:
        return None
    return None


def wrap_next(original: Callable[[Any], Any], recorder: Recorder) -> Callable[[Any], Any]:
    """A DataLoader iterator's ``__next__`` that times the wait for each batch."""
    clock = recorder.clock

    def __next__(self: Any) -> Any:
        started = clock()
        batch = original(self)  # StopIteration passes through, uncounted
        first = "_envbuild_seen" not in self.__dict__
        if first:
            self._envbuild_seen = True
        recorder.data_wait(clock() - started, first)
        return batch

    return __next__


def wrap_copy(original: Callable[..., Any], recorder: Recorder) -> Callable[..., Any]:
    """``Tensor.to`` / ``Tensor.cuda`` that time and count host→device copies."""
    clock = recorder.clock

    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.is_cuda:
            return original(self, *args, **kwargs)
        started = clock()
        result = original(self, *args, **kwargs)
        if getattr(result, "is_cuda", False):
            recorder.add("h2d_s", clock() - started, "h2d")
            recorder.sums["h2d_bytes"] += result.numel() * result.element_size()
        return result

    return copy


def wrap_sync(original: Callable[..., Any], recorder: Recorder) -> Callable[..., Any]:
    """``Tensor.item`` / ``Tensor.cpu`` that time the ones that wait for the GPU."""
    clock = recorder.clock

    def sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.is_cuda:
            return original(self, *args, **kwargs)
        started = clock()
        result = original(self, *args, **kwargs)
        recorder.add("sync_s", clock() - started, "syncs")
        return result

    return sync


def count_launches(events: list[Any]) -> int:
    """Kernel launches among profiler events (objects with a ``name``)."""
    return sum(1 for event in events if getattr(event, "name", "") in LAUNCH_EVENTS)


class ProfileWindow:
    """One ``torch.profiler`` window of ``PROFILE_STEPS`` steps after the warm-up."""

    def __init__(self, torch: Any, recorder: Recorder) -> None:
        self.torch = torch
        self.recorder = recorder
        self.profiler: Any = None
        self.done = False
        self.first_step = 0

    def after_step(self) -> None:
        steps = self.recorder.steps_total
        if self.done or steps < PROFILE_WARMUP_STEPS:
            return
        if self.profiler is None:
            self.start(steps)
        elif steps - self.first_step >= PROFILE_STEPS:
            self.stop(steps)

    def start(self, steps: int) -> None:
        profiler = self.torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        if self.torch.version.cuda:
            activities.append(profiler.ProfilerActivity.CUDA)
        try:
            self.profiler = profiler.profile(activities=activities)
            self.profiler.__enter__()
        except Exception as exc:
            self.done = True
            self.recorder.write({"kind": "error", "pid": self.recorder.pid, "what": "profiler",
                                 "error": type(exc).__name__})
            return
        self.first_step = steps

    def stop(self, steps: int) -> None:
        self.done = True
        try:
            self.profiler.__exit__(None, None, None)
            events = list(self.profiler.events())
        except Exception as exc:
            self.recorder.write({"kind": "error", "pid": self.recorder.pid, "what": "profiler",
                                 "error": type(exc).__name__})
            return
        n = steps - self.first_step
        launches = count_launches(events)
        self.recorder.write({"kind": "profile", "pid": self.recorder.pid, "steps": n,
                             "kernel_launches": launches, "launches_per_step": launches / n,
                             "cpu_ops_per_step": len(events) / n, "t": time.time()})


def install(torch: Any, path: str, mode: str = "auto") -> Recorder:
    """Install every hook on an imported torch; the recorder they feed."""
    import torch.optim.optimizer as optimizer_module
    import torch.utils.data.dataloader as dataloader

    recorder = Recorder(path)
    cuda_build = bool(torch.version.cuda)
    recorder.write({"kind": "hello", "schema": SCHEMA, "pid": recorder.pid, "ppid": os.getppid(),
                    "t": time.time(), "torch": str(torch.__version__),
                    "torch_cuda": torch.version.cuda, "argv0": (sys.argv or [""])[0][-200:]})
    base: Any = dataloader._BaseDataLoaderIter
    base.__next__ = wrap_next(base.__next__, recorder)
    window = ProfileWindow(torch, recorder)
    profile = mode == "always" or (mode == "auto" and cuda_build)

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        recorder.step_end(optimizer)
        if profile:
            window.after_step()

    optimizer_module.register_optimizer_step_pre_hook(lambda o, a, k: recorder.step_begin())
    optimizer_module.register_optimizer_step_post_hook(post)
    if cuda_build:
        tensor = torch.Tensor
        tensor.to = wrap_copy(tensor.to, recorder)
        tensor.cuda = wrap_copy(tensor.cuda, recorder)
        tensor.item = wrap_sync(tensor.item, recorder)
        tensor.cpu = wrap_sync(tensor.cpu, recorder)
    atexit.register(lambda: finish(torch, recorder))
    return recorder


def finish(torch: Any, recorder: Recorder) -> None:
    """At exit: the last window, and whether CUDA was ever initialised in this process."""
    recorder.flush()
    try:
        initialised = bool(torch.cuda.is_initialized())
    except Exception:
        initialised = False
    recorder.write({"kind": "bye", "pid": recorder.pid, "t": time.time(),
                    "cuda_initialized": initialised, "steps_total": recorder.steps_total})


class AfterImport:
    """A ``sys.meta_path`` finder that runs ``then(module)`` once ``name`` is imported."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            run_module(module)
            then(module)

        loader.exec_module = exec_module
        return spec


def boot(environ: Any = os.environ) -> None:
    """Start the probe when ``ENVBUILD_DIAGNOSE_OUT`` is set (sitecustomize's entry)."""
    path = environ.get(ENV_OUT)
    if not path:
        return
    mode = environ.get(ENV_PROFILE, "auto")

    def on_torch(torch: Any) -> None:
        try:
            install(torch, path, mode)
        except Exception as exc:  # an unknown torch: the job runs on, undiagnosed in-process
            Recorder(path).write({"kind": "error", "pid": os.getpid(), "what": "install",
                                  "error": f"{type(exc).__name__}: {exc}"})

    if "torch" in sys.modules:
        on_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, AfterImport("torch", on_torch))


def chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this file shadows (a distribution's, a venv's), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    with contextlib.suppress(Exception):  # as site.py: a broken one never stops the interpreter
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    boot()
    chain_next_sitecustomize()
