"""The survey's uv run (sdists allowed) runs beside the closure's, and the lock's uv runs end
together (envbuild/pylock/uv.py's ``_Live``): a run that fails, or Ctrl-C, leaves no uv running
and reports at once, never after the other run's own end."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from test_sdist_builds import empty_index  # noqa: F401 (fixture)
from test_sdist_survey import links, spec, uv_env  # noqa: F401 (fixtures)

from envbuild.errors import DataError
from envbuild.pylock.uv import SURVEY_DELAY, ClosureSpec, compile_closure, find_uv


def fake_uv(tmp_path: Path, closure: str, survey: str) -> str:
    """A uv whose closure's run (``--only-binary``) runs the shell text ``closure`` and whose
    survey's run runs ``survey``; each writes its pid to closure.pid / survey.pid first."""
    path = tmp_path / "uv"
    path.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        f'  *" --only-binary "*) echo $$ > {tmp_path}/closure.pid; {closure} ;;\n'
        f'  *) echo $$ > {tmp_path}/survey.pid; {survey} ;;\n'
        "esac\n")
    path.chmod(0o755)
    return str(path)


def after(path: Path) -> str:
    """Shell text that waits for ``path`` (the other run has started): no race with the threads' start."""
    return f"while [ ! -e {path} ]; do sleep 0.02; done; "


def closure_spec(uv: str) -> ClosureSpec:
    # offline: no index page is read, the runs alone are under test
    return ClosureSpec(torch_pins={}, python="3.11", glibc="2.35", dependencies=("six",),
                       default_index="http://127.0.0.1:9/simple", offline=True, uv=uv, timeout=120,
                       env={"PATH": "/usr/bin:/bin"})


def gone(pid_file: Path) -> bool:
    """The process named in ``pid_file`` has ended (and was reaped)."""
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_the_survey_runs_beside_the_closures_run(tmp_path: Path, empty_index: str,  # noqa: F811
                                                 links: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """Each run of a logging uv holds for 0.5 s before uv itself: run one after the other they
    never overlap; the lock's two runs that read the index do, and the result is the survey's as before."""
    log, real = tmp_path / "runs.log", find_uv(None)
    wrapper = tmp_path / "uv"
    wrapper.write_text(f'#!/bin/sh\nstart=$(date +%s.%N)\nsleep 0.5\n"{real}" "$@"\nrc=$?\n'
                       f'echo "$start $(date +%s.%N) $*" >> {log}\nexit $rc\n')
    wrapper.chmod(0o755)
    got = compile_closure(spec(empty_index, links, uv_env, "keep", "held", uv=str(wrapper)))
    assert got.packages == {"held": "0.1", "keep": "2.0"}
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]
    runs = [line.split(" ", 2) for line in log.read_text().splitlines()]
    [closure] = [(float(a), float(b)) for a, b, args in runs
                 if "--only-binary" in args and "--offline" not in args]
    [survey] = [(float(a), float(b)) for a, b, args in runs
                if "--only-binary" not in args and "--generate-hashes" in args]
    assert survey[0] < closure[1] and closure[0] < survey[1], runs  # they overlap
    # the survey's starts a moment later: two runs' connections opened at once stalled one
    assert survey[0] - closure[0] >= SURVEY_DELAY * 0.6, runs  # the shells' own start: jitter


def test_a_closure_run_that_fails_ends_the_survey_and_reports_at_once(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, closure=after(tmp_path / "survey.pid")
                 + "echo 'error: the index said no' >&2; exit 2",
                 survey="exec sleep 60")
    start = time.monotonic()
    with pytest.raises(DataError, match="uv could not lock the closure: the index said no"):
        compile_closure(closure_spec(uv))
    assert time.monotonic() - start < 30  # not the survey's 60 s
    assert gone(tmp_path / "survey.pid")


def test_a_survey_that_fails_leaves_the_closures_run_to_finish(tmp_path: Path) -> None:
    """The survey's failure is a note (test_sdist_survey): it never ends the closure's run,
    whose own failure, when it comes, is what the lock reports."""
    uv = fake_uv(tmp_path, closure=after(tmp_path / "survey.pid")
                 + "sleep 1; echo 'error: the closure failed late' >&2; exit 2",
                 survey="echo 'error: no sdist here' >&2; exit 2")
    with pytest.raises(DataError, match="the closure failed late"):
        compile_closure(closure_spec(uv))
    assert gone(tmp_path / "closure.pid") and gone(tmp_path / "survey.pid")


def test_ctrl_c_kills_both_runs(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, closure="exec sleep 60", survey="exec sleep 60")
    main = threading.main_thread().ident or 0

    def interrupt() -> None:  # Ctrl-C reaches the command's main thread once both runs are up
        deadline = time.monotonic() + 20
        while not all((tmp_path / n).exists() for n in ("closure.pid", "survey.pid")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            compile_closure(closure_spec(uv))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30
    assert gone(tmp_path / "closure.pid") and gone(tmp_path / "survey.pid")

