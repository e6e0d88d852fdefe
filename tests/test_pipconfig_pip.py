"""Where pip's default index is read from (envbuild/upstream/pipconfig.py), on the thread
``lock`` asks it from while its main thread imports.

``importlib.util.find_spec("pip")`` ran every meta-path finder under the global import lock;
setuptools' ``_distutils_hack`` imports ``traceback`` there (for the name "pip", on Python
3.11), and a main thread importing ``traceback`` at that moment waited for that lock while
holding ``traceback``'s: a ``lock`` that hung for good (seen once in ~200 runs of the bench).
The subprocess below plays that interleaving on purpose with a finder of its own.
"""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from envbuild.upstream import pipconfig

ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def pips_default() -> str:
    """pip's default index as pip itself gives it, from a second Python (pip is not imported
    here: an imported pip answers ``find_spec`` from ``sys.modules``, past every finder)."""
    done = subprocess.run([sys.executable, "-c", "from pip._internal.models.index import PyPI; "
                           "print(PyPI.simple_url)"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("no pip in this environment")
    return done.stdout.strip()


@pytest.fixture(autouse=True)
def pip_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "pip" or m.startswith("pip.")]:
        monkeypatch.delitem(sys.modules, name)


def test_pips_directory_is_found_without_any_meta_path_finder(monkeypatch: pytest.MonkeyPatch,
                                                              pips_default: str) -> None:
    asked: list[str] = []

    class Recording(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
            asked.append(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Recording(), *sys.meta_path])
    assert pipconfig._written_default_index_url() == pips_default
    assert asked == []


def test_a_pip_package_in_the_working_directory_does_not_name_the_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pips_default: str) -> None:
    """A pull request's own ``pip/`` (``python -m envbuild`` puts the working directory first
    on sys.path) is not where pip's default index is read from."""
    models = tmp_path / "pip" / "_internal" / "models"
    models.mkdir(parents=True)
    (tmp_path / "pip" / "__init__.py").write_text("")
    (models / "index.py").write_text('PyPI = PackageIndex("https://evil.example/", '
                                     'file_storage_domain="x")\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    assert pipconfig._written_default_index_url() == pips_default


def test_pips_default_written_otherwise_comes_from_a_second_python(monkeypatch: pytest.MonkeyPatch,
                                                                   pips_default: str) -> None:
    """Not imported here (the import system from this thread is what hung): asked of a second
    Python, whose answer is pip's own."""
    monkeypatch.setattr(pipconfig, "_pip_directory", lambda: None)
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path])
    before = set(sys.modules)
    assert pipconfig.pip_default_index_url() == pips_default
    assert not {m for m in set(sys.modules) - before if m.startswith("pip")}


REPRODUCTION = textwrap.dedent("""\
    import importlib.abc, sys, threading
    sys.path.insert(0, sys.argv[1])
    from envbuild.upstream import pipconfig

    main_inside, finder_entered, asked = threading.Event(), threading.Event(), threading.Event()

    class LikeDistutilsHack(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "pip":  # as _distutils_hack's spec_for_pip does: an import, under the lock
                finder_entered.set()
                import slow_module  # noqa
            return None

    sys.meta_path.insert(0, LikeDistutilsHack())
    with open(sys.argv[2] + "/slow_module.py", "w") as out:
        out.write("import sys\\n"
                  "m = sys.modules['__main__']\\n"
                  "m.main_inside.set()\\n"
                  "while not (m.finder_entered.is_set() or m.asked.is_set()):\\n"
                  "    m.finder_entered.wait(0.01)\\n"
                  "import json.tool\\n")  # a module not yet imported: the global import lock
    sys.path.insert(0, sys.argv[2])
    found = []

    def ask():
        main_inside.wait()
        found.append(pipconfig.pip_default_index_url())
        asked.set()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    import slow_module  # noqa
    thread.join()
    print(found[0])
""")


def test_asking_pips_default_beside_an_import_cannot_deadlock(tmp_path: Path, pips_default: str) -> None:
    script = tmp_path / "reproduce.py"
    script.write_text(REPRODUCTION)
    try:
        done = subprocess.run([sys.executable, str(script), str(ROOT), str(tmp_path)],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("asking pip's default index on a thread deadlocked against the main thread's import")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == pips_default
