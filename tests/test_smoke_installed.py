"""The smoke test's full installed-set check: a schema 2 lock (one target, a ``pylock``)
against every distribution of the environment, in T0 and as ``smoke.py --installed-only``.

Fake environments are site folders of ``.dist-info`` directories built in tmp; one run
compares the real test venv with a lock written from it. Fault ids: docs/faults.md H31–H36.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke import __main__ as cli
from envbuild.smoke import installed, lockfile
from envbuild.smoke.bundle import payload

PYLOCK = {"file": "pylock.gpu.toml", "sha256": "0" * 64}
STACK = {"torch": "2.13.0", "variant": "cpu", "cuda": None, "python": "3.11"}


def site(tmp_path: Path, dists: dict[str, str], name: str = "site-packages") -> Path:
    """A site folder holding one ``.dist-info`` per {project name: version}."""
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    for project, version in dists.items():
        info = folder / f"{project.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n\n")
    return folder


def target(packages: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"stack": STACK, "packages": packages, "pylock": PYLOCK, **extra}


def schema2(**targets: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 2, "project": {"file": "pyproject.toml", "inputs_sha256": "1" * 64},
            "targets": targets}


# --- reading the lock ------------------------------------------------------------------------


def test_schema_1_reads_as_before() -> None:
    lock = {"schema": 1, "stack": STACK, "packages": {"torch": "2.13.0+cpu"}}
    assert lockfile.validate_lock(lock) is lock


def test_schema_2_with_one_target_gives_that_target() -> None:
    gpu = target({"torch": "2.13.0+cpu"})
    assert lockfile.validate_lock(schema2(gpu=gpu)) is gpu
    assert lockfile.validate_lock(schema2(gpu=gpu), "gpu") is gpu


def test_schema_2_with_several_targets_names_them_or_takes_the_one_asked() -> None:
    """docs/faults.md H31: several targets and no --target."""
    lock = schema2(h100=target({"torch": "2.13.0"}), a10=target({"torch": "2.12.0"}))
    several = r"the lock has 2 targets \(a10, h100\): name one with --target"
    with pytest.raises(lockfile.LockError, match=several):
        lockfile.validate_lock(lock)
    assert lockfile.validate_lock(lock, "a10")["packages"] == {"torch": "2.12.0"}
    with pytest.raises(lockfile.LockError, match=r"no target 'l4' \(it has: a10, h100\)"):
        lockfile.validate_lock(lock, "l4")


@pytest.mark.parametrize("bad, message", [
    ({"schema": 2}, "without targets"),
    ({"schema": 2, "targets": {}}, "without targets"),
    ({"schema": 2, "targets": {"gpu": []}}, "not an object"),
    ({"schema": 2, "targets": {"gpu": {"packages": [], "stack": {}}}}, "must be objects"),
    ({"schema": 2, "targets": {"gpu": {"packages": {}, "pylock": "x"}}}, "'pylock' must be an object"),
    ({"schema": 3, "targets": {}}, "unknown lock schema 3"),
    ({"schema": True}, "unknown lock schema True"),
])
def test_bad_schema_2_locks_are_refused(bad: dict[str, Any], message: str) -> None:
    """docs/faults.md H32."""
    with pytest.raises(lockfile.LockError, match=message):
        lockfile.validate_lock(bad)


def test_target_on_a_schema_1_lock_is_refused() -> None:
    with pytest.raises(lockfile.LockError, match="schema 1 lock has no targets"):
        lockfile.validate_lock({"schema": 1, "packages": {}, "stack": {}}, "gpu")


# --- the comparison --------------------------------------------------------------------------


def test_diff_installed_names_every_extra_missing_and_different() -> None:
    """docs/faults.md H33."""
    lock = {"torch": "2.13.0+cpu", "Jinja2": "3.1.4", "sympy": "1.13.1", "filelock": "3.16"}
    have = {"torch": "2.13.0+cpu", "jinja2": "3.1.5", "filelock": "3.16.0", "requests": "2.32.3",
            "pip": "24.2"}
    assert lockfile.diff_installed(lock, have) == [
        "jinja2: lock 3.1.4, installed 3.1.5",
        "requests: installed 2.32.3, not in the lock",
        "sympy: lock 1.13.1, not installed",
    ]


def test_bootstrap_distributions_are_compared_when_the_lock_pins_them() -> None:
    """docs/faults.md H34: pip/setuptools are passed over only while the lock leaves them out."""
    have = {"torch": "2.13.0", "pip": "24.2", "setuptools": "75.1.0"}
    assert lockfile.diff_installed({"torch": "2.13.0"}, have, bootstrap=("pip",)) == [
        "setuptools: installed 75.1.0, not in the lock"]
    assert lockfile.diff_installed({"torch": "2.13.0"}, have, bootstrap=("pip", "setuptools")) == []
    assert lockfile.diff_installed({"torch": "2.13.0", "pip": "25.0"}, have,
                                   bootstrap=("pip", "setuptools")) == ["pip: lock 25.0, installed 24.2"]


def test_bootstrap_follows_what_the_interpreter_seeds() -> None:
    assert installed.bootstrap_distributions({"pip"}, (3, 12)) == ("pip",)
    assert installed.bootstrap_distributions({"pip", "setuptools"}, (3, 11)) == ("pip", "setuptools")
    assert installed.bootstrap_distributions({"pip", "setuptools", "wheel", "six"}, (3, 9)) == (
        "pip", "setuptools", "wheel")
    assert installed.bootstrap_distributions(None, (3, 11)) == ("pip", "setuptools")
    assert installed.bootstrap_distributions(None, (3, 12)) == ("pip",)


def test_bundled_projects_reads_seed_wheel_names(tmp_path: Path) -> None:
    (tmp_path / "pip-24.2-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "setuptools-75.1.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "README").write_text("")
    assert installed.bundled_projects([str(tmp_path), str(tmp_path / "absent")]) == {"pip", "setuptools"}
    assert installed.bundled_projects([str(tmp_path / "absent")]) is None


def test_installed_distributions_of_a_fake_site(tmp_path: Path) -> None:
    folder = site(tmp_path, {"Jinja2": "3.1.4", "typing-extensions": "4.12.2"})
    found, problems = installed.installed_distributions([str(folder)])
    assert found == {"jinja2": "3.1.4", "typing-extensions": "4.12.2"}
    assert problems == []


def test_a_distribution_installed_twice_is_a_difference(tmp_path: Path) -> None:
    """docs/faults.md H35: a leftover .dist-info, or a copy earlier on the path; the first wins."""
    first = site(tmp_path, {"numpy": "2.1.0"}, "first")
    second = site(tmp_path, {"numpy": "1.26.4"}, "second")
    found, problems = installed.installed_distributions([str(first), str(second)])
    assert found == {"numpy": "2.1.0"}
    assert problems == ["numpy: installed more than once (2.1.0, 1.26.4)"]
    lock = target({"numpy": "2.1.0"})
    assert installed.compare_installed(lock, paths=[str(first), str(second)], bootstrap=()) == problems


def test_compare_installed_against_a_fake_site(tmp_path: Path) -> None:
    folder = site(tmp_path, {"torch": "2.13.0+cpu", "filelock": "3.16.1", "pip": "24.2", "extra-thing": "1"})
    lock = target({"torch": "2.13.0+cpu", "filelock": "3.16.1", "sympy": "1.13.1"})
    assert installed.compare_installed(lock, paths=[str(folder)], bootstrap=("pip",)) == [
        "extra-thing: installed 1, not in the lock",
        "sympy: lock 1.13.1, not installed",
    ]


# --- smoke.py --installed-only ---------------------------------------------------------------


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("payload") / "smoke.py"
    path.write_bytes(payload())
    return path


def installed_only(zipapp: Path, lock: Path, *extra: str, site_dir: Path | None = None,
                   python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """Run the zipapp as the Dockerfile's step does. With ``site_dir``: ``-S`` and PYTHONPATH,
    so the fake site folder is the whole environment."""
    env = {"PATH": os.environ["PATH"]}
    argv = [python, str(zipapp), "--installed-only", "--lock", str(lock), *extra]
    if site_dir is not None:
        env["PYTHONPATH"] = str(site_dir)
        argv.insert(1, "-S")
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(lock.parent),
                          check=False, timeout=120)


def write(path: Path, lock: dict[str, Any]) -> Path:
    path.write_text(json.dumps(lock))
    return path


def test_installed_only_equal_fake_site_exits_0(zipapp: Path, tmp_path: Path) -> None:
    folder = site(tmp_path, {"torch": "2.13.0+cpu", "filelock": "3.16.1"})
    packages = {"torch": "2.13.0+cpu", "filelock": "3.16.1"}
    lock = write(tmp_path / "envbuild.lock", schema2(cpu=target(packages)))
    done = installed_only(zipapp, lock, site_dir=folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"installed set matches {lock} (2 distributions)\n"


def test_installed_only_prints_one_line_per_difference_exit_1(zipapp: Path, tmp_path: Path) -> None:
    """docs/faults.md H33: the build step fails naming every extra, missing, different one."""
    folder = site(tmp_path, {"torch": "2.13.0+cpu", "filelock": "3.15.0", "rich": "13.9.2"})
    packages = {"torch": "2.13.0+cpu", "filelock": "3.16.1", "sympy": "1.13.1"}
    lock = write(tmp_path / "envbuild.lock", schema2(cpu=target(packages)))
    done = installed_only(zipapp, lock, site_dir=folder)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "filelock: lock 3.16.1, installed 3.15.0",
        "rich: installed 13.9.2, not in the lock",
        "sympy: lock 1.13.1, not installed",
    ]
    assert "differs from" in done.stderr and "3 distribution(s)" in done.stderr


@pytest.mark.parametrize("lock, message", [
    (schema2(a=target({}), b=target({})), "the lock has 2 targets (a, b)"),
    ({"schema": 1, "stack": STACK, "packages": {"torch": "2.13.0"}}, "no 'pylock'"),
    ("not json", "unreadable"),
])
def test_installed_only_unusable_lock_exits_2(zipapp: Path, tmp_path: Path, lock: Any, message: str) -> None:
    """docs/faults.md H36: several targets, a lock without a full closure, a broken file."""
    path = tmp_path / "envbuild.lock"
    path.write_text(lock if isinstance(lock, str) else json.dumps(lock))
    done = installed_only(zipapp, path, site_dir=site(tmp_path, {}))
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.startswith("smoke: ") and done.stdout == ""


def test_installed_only_target_picks_one(zipapp: Path, tmp_path: Path) -> None:
    folder = site(tmp_path, {"torch": "2.12.0"})
    lock = write(tmp_path / "envbuild.lock",
                 schema2(a=target({"torch": "2.13.0"}), b=target({"torch": "2.12.0"})))
    assert installed_only(zipapp, lock, "--target", "b", site_dir=folder).returncode == 0
    assert installed_only(zipapp, lock, "--target", "a", site_dir=folder).returncode == 1


def test_installed_only_without_lock_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--installed-only"]) == 2
    assert "--installed-only needs --lock FILE" in capsys.readouterr().err


def test_installed_only_against_the_real_test_venv(zipapp: Path, tmp_path: Path) -> None:
    """The running interpreter's whole environment, as the image's build step sees its venv:
    a lock written from it matches; one version changed, one dropped, one added are named."""
    packages: dict[str, str] = {}
    for dist in metadata.distributions():
        name = lockfile.canonical_name(dist.metadata["Name"])
        packages.setdefault(name, dist.version)
    assert "pytest" in packages and len(packages) > 10
    lock = write(tmp_path / "envbuild.lock", schema2(host=target(dict(packages))))
    done = installed_only(zipapp, lock)
    assert done.returncode == 0, done.stdout + done.stderr

    changed = dict(packages, pytest="0.0.1", **{"not-installed-here": "1.0"})
    del changed["packaging"]
    done = installed_only(zipapp, write(lock, schema2(host=target(changed))))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "not-installed-here: lock 1.0, not installed",
        f"packaging: installed {packages['packaging']}, not in the lock",
        f"pytest: lock 0.0.1, installed {packages['pytest']}",
    ]


# --- T0 ---------------------------------------------------------------------------------------


def test_t0_lock_check_compares_the_full_set_when_the_lock_has_a_pylock(zipapp: Path, tmp_path: Path) -> None:
    """T0's lock check with a full closure names the extras too (the whole test venv here is
    extra but torch): the same comparison as --installed-only."""
    torch = pytest.importorskip("torch")
    lock = write(tmp_path / "envbuild.lock",
                 schema2(cpu=target({"torch": torch.__version__},
                                    stack=dict(STACK, cuda=torch.version.cuda,
                                               python="{}.{}".format(*sys.version_info[:2])))))
    done = subprocess.run([sys.executable, str(zipapp), "--cpu-ok", "--json", "--tier", "0",
                           "--lock", str(lock)], capture_output=True, text=True, check=False,
                          cwd=str(tmp_path), timeout=300)
    check = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["lock"]
    assert check["status"] == "fail"
    assert check["message"].startswith("installed set differs from lock: ")
    assert f"pytest: installed {metadata.version('pytest')}, not in the lock" in check["message"]
    assert not [d for d in check["value"]["differences"] if d.startswith("torch:")]


def python38() -> str | None:
    for candidate in [*sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python"))]:
        probe = [str(candidate), "-c", "import sys; assert sys.version_info[:2] == (3, 8)"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return str(candidate)
    return None


def test_installed_only_runs_on_python_38(zipapp: Path, tmp_path: Path) -> None:
    """The image's Python may be 3.8: the comparison, schema 2 reading and the CLI run there."""
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter here")
    folder = site(tmp_path, {"torch": "2.4.0+cpu", "numpy": "1.24.4"})
    lock = write(tmp_path / "envbuild.lock", schema2(cpu=target({"torch": "2.4.0+cpu", "numpy": "1.24.3"})))
    done = installed_only(zipapp, lock, site_dir=folder, python=python)
    assert (done.returncode, done.stdout) == (1, "numpy: lock 1.24.3, installed 1.24.4\n"), done.stderr
