"""docs/faults.md Q: what a pull request can make CI read. Every path a project file or a lock
names is confined (inside the project, or a declared wheelhouse, after resolving links; a
regular file, opened without following links, of bounded size); an error never quotes a file's
content beyond a short sanitised token; hostile sizes and nesting are exit 2, not exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from envbuild.__main__ import main as envbuild_main
from envbuild.commands.cli import main
from envbuild.confine import quoted, token
from envbuild.data import matrix as matrixmod
from envbuild.errors import UsageError
from envbuild.project.config import load_project
from envbuild.project.toml import line_of
from envbuild.pylock.files import read_pylock
from envbuild.pylock.install import local_wheels
from envbuild.redact import server_text
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

SECRET = "TOP-SECRET-CONTENT-4711"
SHA = "c" * 64
OTHER_PLATFORM = "win_amd64"


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def refused(root: Path, project: str = "envbuild.toml") -> str:
    """The one line of the UsageError (exit 2) that loading the project in ``root`` raises."""
    with pytest.raises(UsageError) as caught:
        load_project(root / project if project != "envbuild.toml" else None, root)
    assert caught.value.exit_code == 2
    line = caught.value.one_line()
    assert "\n" not in line and SECRET not in line
    return line


def load_in_child(root: Path, project: str | None = None) -> str:
    """load_project in a child process with 512 MiB of address space and 20 s: a FIFO that
    hangs the read or /dev/zero that fills memory shows as 'hung' or 'crashed'."""
    code = ("import sys; from pathlib import Path; from envbuild.errors import UsageError\n"
            "from envbuild.project.config import load_project\n"
            "p = None if sys.argv[2] == '-' else Path(sys.argv[2])\n"
            "try:\n    load_project(p, Path(sys.argv[1])); print('loaded')\n"
            "except UsageError as exc:\n    print(f'usage: {exc.message}')\n")

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    try:
        done = subprocess.run([sys.executable, "-c", code, str(root), project or "-"],
                              capture_output=True, text=True, timeout=20, preexec_fn=limit,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    except subprocess.TimeoutExpired:
        return "hung"
    return done.stdout.strip() or f"crashed: {done.stderr.strip()[-200:]}"


# --- Q1: a pylock's local files ------------------------------------------------------------


@pytest.fixture(scope="module")
def stack_lock() -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cpu", ubuntu="22.04"), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


def pylock_with(lock: lockmod.Lock, extra: str) -> str:
    """Every package of ``lock`` with a wheel on a mirror; torch with ``extra`` too (a wheel
    table's body), as if for another platform."""
    out = ['lock-version = "1.0"', 'created-by = "test"']
    for name, version in sorted(lock.packages.items()):
        wheel = f"{name}-{version}-py3-none-any.whl"
        wheels = [f'{{ url = "https://mirror.example/{wheel}", hashes = {{ sha256 = "{SHA}" }} }}']
        if name == "torch":
            wheels.append(f'{{ {extra}, hashes = {{ sha256 = "{SHA}" }} }}')
        out += ["", "[[packages]]", f'name = "{name}"', f'version = "{version}"',
                f"wheels = [{', '.join(wheels)}]"]
    return "\n".join(out) + "\n"


def write_closure(project: Path, lock: lockmod.Lock, extra: str) -> Path:
    text = pylock_with(lock, extra)
    ref = lockmod.PylockRef(file="pylock.toml", sha256=lockset.sha256_text(text),
                            torch_layer=tuple(sorted(lock.packages)),
                            platform="x86_64-manylinux_2_35", text=text)
    locks = {"default": replace(lock, pylock=ref, layers=())}
    for name, data in lockset.LockSet(targets=locks, project=None).files().items():
        (project / name).write_bytes(data)
    return project / "envbuild.lock"


def render_closure(tmp_path: Path, lock: lockmod.Lock, extra: str,
                   capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, str]:
    path = write_closure(tmp_path / "project", lock, extra)
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out"), *options], {})
    return code, capsys.readouterr().err


def wheel_name(lock: lockmod.Lock) -> str:
    """A torch wheel of the locked version for another platform."""
    return f"torch-{lock.packages['torch']}-cp311-cp311-{OTHER_PLATFORM}.whl"


@pytest.fixture
def layout(tmp_path: Path, stack_lock: lockmod.Lock) -> dict[str, str]:
    """The project directory, a secret outside it, and the names a hostile pylock uses."""
    write(tmp_path / "project", {"wheels/.keep": ""})
    outside = write(tmp_path / "outside", {"secret": SECRET, wheel_name(stack_lock): SECRET})
    (tmp_path / "project" / "wheels" / wheel_name(stack_lock)).symlink_to(
        outside / wheel_name(stack_lock))
    return {"outside": str(outside), "wheel": wheel_name(stack_lock)}


@pytest.mark.parametrize("entry", [
    'path = "{outside}/secret"',
    'url = "file://{outside}/secret"',
    'path = "../outside/secret"',
    'name = "{wheel}", path = "{outside}/secret"',  # named like a wheel, pointing elsewhere
    'path = "{outside}/{wheel}"',  # a wheel's name, outside the project
    'url = "file://{outside}/{wheel}"',
    'path = "wheels/{wheel}"',  # inside the project: a link to a file outside it
    'path = "/proc/self/environ"',
])
def test_render_never_copies_a_local_file_from_outside_the_project(
        tmp_path: Path, stack_lock: lockmod.Lock, layout: dict[str, str], entry: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md Q1: any pylock entry, even a wheel for another platform."""
    code, err = render_closure(tmp_path, stack_lock, entry.format(**layout), capsys)
    assert code == 2, err
    assert "pylock: packages[" in err and SECRET not in err
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_local_wheels_refuse_devices_fifos_and_files_not_named_like_wheels(
        tmp_path: Path, stack_lock: lockmod.Lock) -> None:
    """docs/faults.md Q1: /dev/zero, a FIFO, a non-wheel name are refused before any copy (by
    the PEP 751 reader when the entry's own file name is no wheel's, else by local_wheels)."""
    name = wheel_name(stack_lock)
    project = write(tmp_path / "project", {"notes.txt": SECRET})
    os.mkfifo(project / name)
    for extra, problem in [('path = "/dev/zero"', "Invalid wheel filename 'zero'"),
                           (f'name = "{name}", path = "/dev/zero"', "not named like a wheel"),
                           (f'name = "{name}", path = "notes.txt"', "not named like a wheel"),
                           (f'path = "{name}"', "is not a regular file")]:
        with pytest.raises(UsageError, match=problem) as caught:
            local_wheels(read_pylock(pylock_with(stack_lock, extra)), [project])
        assert SECRET not in caught.value.one_line()


def test_local_wheels_inside_the_project_or_a_named_wheelhouse_are_copied(
        tmp_path: Path, stack_lock: lockmod.Lock, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md Q1: what the confinement lets through: the project's own wheels, and a
    --wheelhouse DIR named on the command line (only the pylock's wheels are taken from it)."""
    name = wheel_name(stack_lock)
    write(tmp_path / "project", {f"wheels/{name}": "wheel"})
    code, err = render_closure(tmp_path, stack_lock, f'path = "wheels/{name}"', capsys)
    assert code == 0, err
    assert (tmp_path / "out" / "wheelhouse" / name).read_text() == "wheel"
    house = write(tmp_path / "house", {name: "house", "other-1.0-py3-none-any.whl": "x"})
    extra = f'url = "file://{house}/{name}"'
    code, err = render_closure(tmp_path, stack_lock, extra, capsys)
    assert code == 2 and "outside the project" in err
    code, err = render_closure(tmp_path, stack_lock, extra, capsys, "--wheelhouse", str(house), "--force")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out" / "wheelhouse").iterdir()) == [name]


def test_the_reference_pylock_reader_checks_but_stays_off_resolves_start_up() -> None:
    """docs/faults.md Q1: packaging.pylock (PEP 751's reader) refuses what ours lets through
    (a created-by missing, a wheel named for another package), and `resolve` never imports it."""
    text = ('lock-version = "1.0"\n[[packages]]\nname = "a"\nversion = "1"\nwheels = [{ url = '
            f'"https://x.invalid/b-1-py3-none-any.whl", hashes = {{ sha256 = "{SHA}" }} }}]\n')
    with pytest.raises(UsageError, match="pylock: created-by: Missing required value"):
        read_pylock(text)
    with pytest.raises(UsageError, match=r"pylock: packages\[0\]\.wheels\[0\]: Name in 'b-1-py3"):
        read_pylock('created-by = "x"\n' + text)
    code = ("import sys; from envbuild.__main__ import fast_resolve\n"
            "assert fast_resolve(['resolve', '--driver', '550', '--top', '1'], {}) == 0\n"
            "print(sorted(m for m in sys.modules if m.startswith('packaging')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    assert "packaging.pylock" not in done.stdout.splitlines()[-1]


def test_a_pylock_beside_the_lock_that_links_outside_is_refused(
        tmp_path: Path, stack_lock: lockmod.Lock) -> None:
    """docs/faults.md Q1: the pylock file the lock names is read confined too."""
    path = write_closure(write(tmp_path / "project", {}), stack_lock, 'path = "x.whl"')
    moved = write(tmp_path / "outside", {})
    (path.parent / "pylock.toml").rename(moved / "pylock.toml")
    (path.parent / "pylock.toml").symlink_to(moved / "pylock.toml")
    with pytest.raises(UsageError, match="outside the project"):
        lockset.read_lockset(path)


def test_a_find_links_directory_outside_the_project_is_refused(tmp_path: Path) -> None:
    """docs/faults.md Q5: a project file from a pull request cannot point uv (and so the image)
    at the machine's own wheel directories; the command line's --find-links still can."""
    root = tmp_path / "project"
    write(root, {"envbuild.toml": 'find-links = ["/etc"]\n'})
    assert "find-links[0]: directory '/etc' is outside the project" in refused(root)
    (tmp_path / "private-wheels").mkdir()
    write(root, {"envbuild.toml": 'find-links = ["../private-wheels"]\n'})
    assert "find-links[0]" in refused(root)
    (root / "wheels").symlink_to(tmp_path / "private-wheels")
    write(root, {"envbuild.toml": 'find-links = ["wheels"]\n'})
    line = refused(root)
    assert "is outside the project" in line and "lock --find-links DIR" in line
    (root / "wheels").unlink()
    (root / "wheels").mkdir()
    assert load_project(None, root).find_links == (str(root / "wheels"),)


# --- Q2: no error quotes file content ----------------------------------------------------------


def test_a_requirements_file_outside_the_project_is_refused_unread(tmp_path: Path) -> None:
    """docs/faults.md Q2: the environment of /proc/self/environ never reaches the error line."""
    root = write(tmp_path, {"envbuild.toml": 'requirements = ["/proc/self/environ"]\n'})
    assert "requirements file /proc/self/environ is outside the project" in refused(root)
    write(tmp_path, {"envbuild.toml": 'requirements = ["r.txt"]\n', "secret": SECRET})
    (tmp_path / "r.txt").symlink_to(tmp_path.parent / "elsewhere.txt")
    (tmp_path.parent / "elsewhere.txt").write_text(SECRET)
    assert "requirements file r.txt is outside the project" in refused(root)
    write(tmp_path, {"envbuild.toml": 'requirements = ["a.txt"]\n', "a.txt": "-r ../elsewhere.txt\n"})
    line = refused(root)
    assert "a.txt:1: requirements file " in line and "elsewhere.txt is outside the project" in line


def test_the_working_directory_is_a_root_only_when_it_holds_the_project(tmp_path: Path) -> None:
    """docs/faults.md Q2: `-o sub/project.toml` may name `../r.txt` from the checkout it was
    written in; run from `/` (a container's working directory) the same file is refused."""
    write(tmp_path, {"r.txt": "six\n", "sub/project.toml": 'requirements = ["../r.txt"]\n'})
    assert load_project(Path("sub/project.toml"), tmp_path).dependencies == ("six",)
    with pytest.raises(UsageError, match="outside the project"):
        load_project(tmp_path / "sub" / "project.toml", Path("/"))
    with pytest.raises(UsageError, match="outside the project"):
        load_project(tmp_path / "sub" / "project.toml", tmp_path / "sub")


def test_errors_quote_a_short_sanitised_token_only(tmp_path: Path) -> None:
    """docs/faults.md Q2: an in-project file may hold secrets: the error shows at most ~100
    characters of the bad line, control characters escaped, credentials masked."""
    root = write(tmp_path, {"envbuild.toml": 'requirements = ["r.txt"]\n'})
    (root / "r.txt").write_bytes(b"MY_TOKEN=" + b"a" * 120 + b"\x00OTHER=" + SECRET.encode() + b"\n")
    line = refused(root)
    assert f"r.txt:1: invalid requirement 'MY_TOKEN={'a' * 91}…'" in line and "OTHER" not in line
    (root / "r.txt").write_bytes(b"bad\x1b[31m\x00red\n")
    assert "invalid requirement 'bad\\x1b[31m\\x00red'" in refused(root)
    (root / "r.txt").write_text("x " * 3000 + SECRET + "\n")
    assert len(refused(root)) < 400
    (root / "r.txt").write_text(f"pkg @ https://user:{SECRET}@host/x.whl ; bad ! marker\n")
    assert refused(root).count("***") == 1
    write(root, {"envbuild.toml": f'dependencies = ["{"y" * 300}{SECRET} !"]\n'})
    assert "envbuild.toml:1: dependencies[0]: invalid requirement 'yyy" in refused(root)
    # the shared value checks (render/lock.py) quote the same way
    for key in ("index-url", "base-image", "user"):
        write(root, {"envbuild.toml": f'{key} = "{"z" * 3000}{SECRET}"\n'})
        assert len(refused(root)) < 400


def test_token_escapes_control_characters_and_cuts_at_100() -> None:
    assert token("abc\x1b[31mred\n\u2028\ud800") == "abc\\x1b[31mred\\n\\u2028\\ud800"
    assert token("a" * 150) == "a" * 100 + "…"
    assert quoted("2.3.1\n") == "'2.3.1\\n'" and quoted(["x"]) == "(a list)"
    assert token("https://u:pw@host/x") == "https://***@host/x"
    assert token("plain") == "plain"


@pytest.mark.parametrize("show", [token, quoted, server_text])
def test_a_cut_never_leaves_part_of_a_credential(show: Any) -> None:
    """docs/faults.md Q2: masking comes before the cut, and a URL whose `@` the cut drops
    shows its scheme only (a cut first would leave `https://user:hunt…` unmasked)."""
    for prefix in ("x" * 85, "x" * 90, "x" * 97):
        shown = show(f"{prefix} https://user:hunter2secret@host/simple")
        assert "user" not in shown and "hunt" not in shown, shown
        assert "…" in shown and ("https://***" in shown or prefix == "x" * 97), shown
    shown = show("y" * 90 + " Bearer abcdefgh12345678")
    assert "abcd" not in shown, shown


# --- Q3: FIFOs, devices, directories -----------------------------------------------------------


def test_fifos_devices_and_directories_as_project_inputs_are_exit_2(tmp_path: Path) -> None:
    """docs/faults.md Q3: never a hang or an unbounded read."""
    root = write(tmp_path, {"envbuild.toml": 'requirements = ["fifo.txt"]\n'})
    os.mkfifo(root / "fifo.txt")
    assert load_in_child(root).endswith("requirements file fifo.txt is not a regular file")
    os.mkfifo(root / "project.toml")
    assert load_in_child(root, "project.toml").startswith("usage: project file ")
    assert load_in_child(root, "/dev/zero") == "usage: project file /dev/zero is not a regular file"
    write(root, {"envbuild.toml": 'requirements = ["sub"]\n', "sub/x": ""})
    assert "requirements file sub is a directory" in refused(root)
    with pytest.raises(UsageError, match="is a directory"):
        render.parse_options(ca_bundle=str(tmp_path))


# --- Q4: bounded work ------------------------------------------------------------------------------


def test_toml_nested_1000_deep_is_exit_2(tmp_path: Path) -> None:
    """docs/faults.md Q4: the parser's recursion, not an internal error."""
    root = write(tmp_path, {"envbuild.toml": "x = " + "[" * 1000 + "]" * 1000 + "\n"})
    assert "nested too deep" in refused(root)
    with pytest.raises(UsageError, match="nested too deep"):
        read_pylock('lock-version = "1.0"\nx = ' + "{a = " * 1000 + "1" + "}" * 1000 + "\n")


def test_long_include_chains_are_exit_2(tmp_path: Path) -> None:
    """docs/faults.md Q4: a 3000-file -r chain and a 3000-group include chain."""
    files = {"envbuild.toml": 'requirements = ["r0.txt"]\n'}
    files.update({f"r{i}.txt": f"-r r{i + 1}.txt\n" for i in range(3000)})
    files["r3000.txt"] = "six\n"
    assert "too many requirements files" in refused(write(tmp_path / "a", files))
    groups = "".join(f'g{i} = [{{include-group = "g{i + 1}"}}]\n' for i in range(3000))
    text = ('[project]\nname = "d"\n[dependency-groups]\n' + groups + 'g3000 = ["six"]\n'
            '[tool.envbuild]\ngroups = ["g0"]\n')
    assert "include each other more than 64 deep" in refused(write(tmp_path / "b", {"pyproject.toml": text}))


@pytest.mark.parametrize(("key", "value"), [
    ("requirements", '["a\\u0000b.txt"]'), ("pyproject", '"py\\u0000project.toml"'),
    ("find-links", '["dir\\u0000"]'),
])
def test_a_nul_in_a_path_is_exit_2(tmp_path: Path, key: str, value: str) -> None:
    """docs/faults.md Q4."""
    line = refused(write(tmp_path, {"envbuild.toml": f"{key} = {value}\n"}))
    assert "\x00" not in line


def test_a_5000_digit_version_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md Q4: in the project file, and `resolve --torch` (the fast path too)."""
    digits = "1" * 5000
    assert "invalid torch version: longer than 100 characters" in refused(
        write(tmp_path, {"envbuild.toml": f'torch = "{digits}"\n'}))
    for option in ("--torch", "--python", "--cuda", "--driver", "--top"):
        assert envbuild_main(["resolve", option, digits, *(["--driver", "550"] * (option == "--top"))],
                             {}) == 2
        err = capsys.readouterr().err
        assert err.startswith("envbuild: error[usage]: ") and len(err) < 400, err[:200]


def test_line_of_is_linear_for_40000_dependencies(tmp_path: Path) -> None:
    """docs/faults.md Q4: the line of every one of 40,000 dependencies (the old search read the
    text again for each: about 27 minutes here; now well under a second)."""
    count = 40_000
    text = "dependencies = [\n" + "".join(f'  "dep{i}",\n' for i in range(count)) + "]\n" \
           "[[targets]]\nname = \"a\"\n"
    started = time.monotonic()
    assert line_of(text, ["targets", 0, "name"]) == count + 4
    for i in range(0, count, 7):
        assert line_of(text, ["dependencies", i]) == 1
        assert time.monotonic() - started < 30, f"{i} lookups took 30 s"
    root = write(tmp_path, {"envbuild.toml": text.replace('"dep', '"pkg-').split("[[targets]]")[0]})
    assert len(load_project(None, root).dependencies) == count
