"""envbuild/threads.py: work begun on threads, answered later (what lock starts beside uv)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from envbuild.threads import Answer, Threads, begin, read_soon, yield_cpu


def test_an_answer_is_its_value_or_raises_its_exception() -> None:
    given: Answer[int] = Answer()
    assert not given.done()
    with pytest.raises(TimeoutError):
        given.result(timeout=0.01)
    given.set_result(7)
    assert given.done() and given.result() == 7
    failed: Answer[int] = Answer()
    failed.set_exception(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # any BaseException travels, as concurrent.futures does
        failed.result()


def test_begun_work_runs_on_a_thread_of_its_own_and_hands_back_its_error() -> None:
    main = threading.get_ident()
    ran_on = begin(threading.get_ident, name="envbuild-test").result(timeout=10)
    assert ran_on != main

    def fails(word: str) -> str:
        raise ValueError(word)

    with pytest.raises(ValueError, match="broken"):
        begin(fails, "broken").result(timeout=10)


def test_leaving_a_block_of_threads_waits_for_every_one() -> None:
    release = threading.Event()
    ended: list[str] = []

    def slow(name: str, *, suffix: str) -> str:
        release.wait(10)
        ended.append(name + suffix)
        return name

    with Threads() as threads:
        answers = [threads.submit(slow, name, suffix="!") for name in ("a", "b", "c")]
        assert not any(a.done() for a in answers)  # all three begun at once, none finished
        release.set()
    assert sorted(ended) == ["a!", "b!", "c!"]  # the block ended only after all three
    assert [a.result(timeout=0) for a in answers] == ["a", "b", "c"]


def test_modules_read_soon_are_imported_on_a_thread_of_their_own(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envbuild_read_soon_probe.py").write_text(
        "import threading\nTHREAD = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "envbuild_read_soon_probe", raising=False)
    read_soon("envbuild_read_soon_probe")
    for thread in threading.enumerate():
        if thread.name == "envbuild-import":
            thread.join(10)
    assert sys.modules["envbuild_read_soon_probe"].THREAD == "envbuild-import"


@pytest.mark.skipif(sys.platform != "linux", reason="a nice value per thread is Linux's")
def test_yield_cpu_lowers_its_thread_and_what_it_starts_and_no_other_thread() -> None:
    import os
    import subprocess

    base = os.getpriority(os.PRIO_PROCESS, 0)

    def lowered() -> tuple[int, int]:
        yield_cpu()
        child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                               capture_output=True, text=True, check=True)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), int(child.stdout)

    assert begin(lowered).result(timeout=60) == (min(base + 10, 19),) * 2
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    assert begin(os.getpriority, os.PRIO_PROCESS, 0).result(timeout=10) == base  # a new thread: as before
