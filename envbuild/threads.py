"""Work begun on a thread of its own and answered later: what ``lock`` starts beside uv's runs
(pip's index, uv's version, the registry, the survey, the torch layer, the installer's lock).

``concurrent.futures`` would serve, but it imports ``logging`` and its own machinery: ~6 ms that
``lock`` spent before uv's closure run could start. This is the part of it envbuild uses: an
answer set once and waited for (``Answer``), work begun at once on a thread (:func:`begin`) and
a set of such threads all waited for at the end of a block (:class:`Threads`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Answer", "Threads", "begin", "read_soon", "yield_cpu"]

T = TypeVar("T")


class Answer(Generic[T]):
    """One answer, set once (a value or an exception) by whoever computes it; ``result``
    waits for it and returns the value or raises the exception."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set_result(self, value: T) -> None:
        self._value = value
        self._set.set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._set.set()

    def done(self) -> bool:
        return self._set.is_set()

    def result(self, timeout: float | None = None) -> T:
        if not self._set.wait(timeout):
            raise TimeoutError(f"no answer within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by set_result


def begin(work: Callable[..., T], *args: object, name: str = "envbuild") -> Answer[T]:
    """``work(*args)`` begun now on a thread of its own; its answer (or its exception, any
    BaseException) is had from the ``Answer``. The thread is not a daemon: the interpreter
    waits for it before it exits, as it waits for concurrent.futures' workers."""
    answer, _ = _started(work, args, name, {})
    return answer


def _started(work: Callable[..., T], args: tuple[object, ...], name: str,
             kwargs: dict[str, object]) -> tuple[Answer[T], threading.Thread]:
    answer: Answer[T] = Answer()

    def body() -> None:
        try:
            value = work(*args, **kwargs)
        except BaseException as exc:  # handed to whoever reads the answer
            answer.set_exception(exc)
        else:
            answer.set_result(value)

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return answer, thread


def read_soon(*modules: str) -> None:
    """``modules`` imported on a thread of its own, begun now: what follows a wait (uv's run)
    is imported during it, while the main thread only waits."""
    import importlib

    def read() -> None:
        for module in modules:
            importlib.import_module(module)

    begin(read, name="envbuild-import")


def yield_cpu(nice: int = 10) -> None:
    """The calling thread, and every process it starts from now on (a child inherits it),
    ``nice`` steps lower in the CPU's priority: work beside uv's closure run that is only
    wanted if it wins no race against that run must not slow it on a contended core. Linux
    keeps a nice value per thread, so the other threads keep theirs; elsewhere, or where the
    kernel refuses, nothing changes."""
    import contextlib
    import os
    import sys

    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nice)


class Threads:
    """Work begun on threads of their own, each at once (``submit``); leaving the block waits
    for every one of them to end, whatever its answer."""

    def __init__(self, name: str = "envbuild") -> None:
        self._name = name
        self._threads: list[threading.Thread] = []

    def submit(self, work: Callable[..., T], *args: object, **kwargs: object) -> Answer[T]:
        answer, thread = _started(work, args, self._name, kwargs)
        self._threads.append(thread)
        return answer

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *_: object) -> None:
        for thread in self._threads:
            thread.join()
