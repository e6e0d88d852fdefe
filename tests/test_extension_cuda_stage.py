"""Extensions that really have their kernels (issue 37 item 3): the distribution name a setup.py
alone gives, CUDA sources recorded in the lock, the stage's FORCE_CUDA/CUDA_HOME and the
project's build-env (that stage only), its compiling steps with no network under buildx, and a
runtime base refused for a CUDA extension."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_extensions import closure, stages, write

from envbuild.commands.build import _tls_hinted
from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.errors import BuildFailed, UsageError
from envbuild.extensions import tree
from envbuild.project.config import project_from_text
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

KERNEL = "__global__ void k(float *x) { x[0] = 1; }\n"


def stack_lock(flavor: str) -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cu121", ubuntu="22.04", flavor=flavor), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


@pytest.mark.parametrize(("files", "name"), [
    ({"setup.py": 'from setuptools import setup\nsetup(name="barsext", version="0.1")\n'}, "barsext"),
    ({"setup.py": 'import setuptools\nsetuptools.setup(\n    name="Bars_Ext",\n)\n'}, "bars-ext"),
    ({"setup.py": "from setuptools import setup\nsetup()\n", "setup.cfg": "[metadata]\nname = cfgext\n"},
     "cfgext"),
    ({"setup.py": 'setup(name="fromsetup")\n', "pyproject.toml": '[project]\nname = "frompyproject"\n'},
     "frompyproject"),
    # not a literal, two calls that disagree, not Python: the directory's own name
    ({"setup.py": 'NAME = "x"\nsetup(name=NAME)\n'}, "ext"),
    ({"setup.py": 'setup(name="a")\nsetup(name="b")\n'}, "ext"),
    ({"setup.py": "setup(name=\n"}, "ext"),
    ({"setup.py": 'setup(name="../../etc")\n'}, "ext"),
])
def test_a_setup_py_only_extension_is_recorded_by_the_name_its_build_installs(
        tmp_path: Path, files: dict[str, str], name: str) -> None:
    write(tmp_path, {f"ext/{k}": v for k, v in files.items()})
    assert tree.extension(tmp_path, "ext", "extension 'ext'").name == name


def test_cuda_sources_are_recorded_and_read_back(tmp_path: Path) -> None:
    write(tmp_path, {"ext/setup.py": 'setup(name="barsext")\n', "ext/k.cu": KERNEL})
    ext = tree.extension(tmp_path, "ext", "extension 'ext'")
    assert ext.cuda and ext.to_json()["cuda"] is True
    write(tmp_path, {"cpp/setup.py": 'setup(name="cppext")\n', "cpp/a.cpp": "int a;\n"})
    plain = tree.extension(tmp_path, "cpp", "extension 'cpp'")
    assert not plain.cuda and "cuda" not in plain.to_json()  # old locks read the same
    lock = replace(closure(stack_lock("devel")), extensions=(ext,), build_env=(("MAX_JOBS", "4"),))
    assert lockmod.from_json(lock.to_json()) == lock
    data = json.loads(lock.to_json())
    data["extensions"][0]["cuda"] = "yes"
    with pytest.raises(UsageError, match="cuda: true optional"):
        lockmod.from_json(json.dumps(data))


def cuda_lock(root: Path, flavor: str = "devel", build_env: tuple[tuple[str, str], ...] = ()) -> Path:
    write(root, {"ext/setup.py": 'setup(name="barsext")\n', "ext/k.cu": KERNEL})
    ext = tree.extension(root, "ext", "extension 'ext'")
    lock = replace(closure(stack_lock(flavor)), extensions=(ext,), build_env=build_env,
                   compile_toolchain=False)
    lockmod.check_lock(lock)
    for name, data in lockset.LockSet(targets={"default": lock}, project=None).files().items():
        (root / name).write_bytes(data)
    return root / "envbuild.lock"


def test_the_stage_compiles_cuda_with_force_cuda_and_the_build_env_stays_in_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = cuda_lock(tmp_path, build_env=(("FLASH_ATTENTION_FORCE_BUILD", "TRUE"), ("MAX_JOBS", "4 2")))
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    assert code == 0, capsys.readouterr().err
    _, build, final = stages((tmp_path / "out" / "Dockerfile").read_text())
    assert "ENV FORCE_CUDA=1 CUDA_HOME=/usr/local/cuda\n" in build
    assert "ENV FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS='4 2'\n" in build
    assert "TORCH_CUDA_ARCH_LIST" in build
    for word in ("FORCE_CUDA", "MAX_JOBS", "FLASH_ATTENTION"):
        assert word not in final  # build stages only
    assert "--network=none" not in build  # the classic builder: the build's network throughout


def test_the_stage_compiles_for_the_target_gpus_when_the_lock_names_them(tmp_path: Path) -> None:
    """The lock records the target GPUs' architectures (lock with GPUs named): the stage compiles
    for those alone (an A100 and an H100: 8.0;9.0), not for every GPU the torch wheel covers, and
    the smoke test wants device code for exactly those."""
    from envbuild.smoke.devicecode import wanted_archs

    path = cuda_lock(tmp_path)
    lock = replace(lockset.read_lockset(path).targets["default"], gpu_archs=("sm_80", "sm_90"))
    assert lockmod.from_json(lock.to_json()) == lock
    options = render.RenderOptions(extension_root=tmp_path)
    dockerfile = render.render_docker(lock, options)["Dockerfile"]
    assert isinstance(dockerfile, bytes)
    assert 'ENV TORCH_CUDA_ARCH_LIST="8.0;9.0"\n' in dockerfile.decode()
    assert wanted_archs(json.loads(lock.to_json())) == ["sm_80", "sm_90"]
    data = json.loads(lock.to_json())
    for bad in ("compute_80", "sm_80+PTX", "8.0", "sm_80;rm"):
        data["gpu_archs"] = [bad]
        with pytest.raises(UsageError, match="invalid gpu_archs"):
            lockmod.from_json(json.dumps(data))


def test_under_buildx_the_compiling_steps_have_no_network(tmp_path: Path) -> None:
    path = cuda_lock(tmp_path)
    lock = lockset.read_lockset(path).targets["default"]
    lock = replace(lock, sdists=())
    options = render.RenderOptions(buildkit=True, offline_steps=True, extension_root=tmp_path)
    dockerfile = render.render_docker(lock, options)["Dockerfile"]
    assert isinstance(dockerfile, bytes)
    _, build, _ = stages(dockerfile.decode())
    assert "RUN --network=none mkdir -p /wheels" in build
    assert build.count("--network=none") == 1  # the torch layer's installs keep theirs


def test_a_runtime_base_is_refused_for_a_cuda_extension(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = cuda_lock(tmp_path, flavor="runtime")
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    err = capsys.readouterr().err
    assert code == 2
    assert "extension barsext has CUDA sources (.cu), but the image's flavor is runtime" in err
    assert 'flavor = "devel"' in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("table", "message"), [
    ('[build-env]\nHF_TOKEN = "x"\n', "build-env.HF_TOKEN"),
    ('[build-env]\n"A=B" = "x"\n', "build-env"),
    ('build-env = "MAX_JOBS=4"\n', "build-env"),
])
def test_build_env_is_checked_as_env_is(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "envbuild.toml"
    path.write_text(table)
    with pytest.raises(UsageError, match=message) as caught:
        project_from_text(table, path, shown="envbuild.toml")
    assert "envbuild.toml:" in caught.value.message
    good = '[build-env]\nMAX_JOBS = "4"\nFLASH_ATTENTION_FORCE_BUILD = "TRUE"\n'
    path.write_text(good)
    assert project_from_text(good, path, shown="envbuild.toml").build_env == (
        ("FLASH_ATTENTION_FORCE_BUILD", "TRUE"), ("MAX_JOBS", "4"))


# --- behind a TLS-inspecting proxy (issue 37 item 6) ------------------------------------------


def test_with_a_ca_bundle_the_extensions_stage_starts_from_the_build_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The classic builder with --ca-bundle installs torch in a build stage: the extensions stage
    starts from it (torch downloaded and installed once per build, 146 s against 1160 s measured
    in the issue), trusting the same bundle, and the image gets only its wheels."""
    path = cuda_lock(tmp_path)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    code = main(["render", "docker", "--lock", str(path), "--ca-bundle", str(ca),
                 "-o", str(tmp_path / "out")], {})
    assert code == 0, capsys.readouterr().err
    dockerfile = (tmp_path / "out" / "Dockerfile").read_text()
    names = [part.split("\n", 1)[0] for part in stages(dockerfile)]
    assert [n.split(" AS ")[-1] if " AS " in n else "image" for n in names] == [
        "envbuild-system", "envbuild-build", "envbuild-extensions", "image"]
    assert "FROM envbuild-build AS envbuild-extensions" in names
    assert dockerfile.count("-r /tmp/envbuild/torch.txt") == 1  # torch installed once
    extensions = stages(dockerfile)[2]
    assert "ARG PIP_CERT=/etc/envbuild/ca-bundle.crt" in extensions
    assert "pip wheel" in extensions and "torch.txt" not in extensions


def failed(*log: str) -> BuildFailed:
    return BuildFailed("step 11/24 (RUN /opt/venv/bin/pip install …) failed: exit 1", details=log,
                       hint="the last log lines follow; rerun with --verbose for all of them")


def test_a_tls_failure_in_a_build_step_names_ca_bundle_and_the_variable_read() -> None:
    log = ("WARNING: Retrying … SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] "
           "certificate verify failed: self-signed certificate in certificate chain (_ssl.c:1006)'))",)
    hinted = _tls_hinted(failed(*log), None, {"PIP_CERT": "/etc/ssl/proxy.pem", "SSL_CERT_FILE": "/x"})
    assert hinted.exit_code == 6 and hinted.details == log
    assert '--ca-bundle "$PIP_CERT"' in hinted.hint and "PIP_CERT=/etc/ssl/proxy.pem" in hinted.hint
    assert "the last log lines follow" in hinted.hint
    curl = "curl: (60) SSL certificate problem: unable to get local issuer certificate"
    only_ssl = _tls_hinted(failed(curl), None, {"SSL_CERT_FILE": "/etc/ssl/certs/ca.pem"})
    assert '--ca-bundle "$SSL_CERT_FILE"' in only_ssl.hint
    none = _tls_hinted(failed(*log), None, {})
    assert "--ca-bundle FILE" in none.hint
    assert "PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE: none is set" in none.hint
    given = _tls_hinted(failed(*log), "/etc/ssl/old.pem", {"PIP_CERT": "/etc/ssl/proxy.pem"})
    assert "trusted --ca-bundle /etc/ssl/old.pem" in given.hint and "lacks" in given.hint
    other = failed("error: g++ failed")
    assert _tls_hinted(other, None, {"PIP_CERT": "/p"}) is other  # not a TLS failure: untouched


def test_lock_records_the_target_gpus_architectures_render_does_not() -> None:
    from envbuild.commands.cli import build_parser
    from envbuild.commands.options import load_matrix, resolve_lock

    args = build_parser().parse_args(["render", "docker", "--driver", "570", "--gpu", "A100",
                                      "--gpu", "H100", "-o", "out"])
    matrix = load_matrix(args, {})
    assert resolve_lock(args, {}, matrix, gpu_archs=True).gpu_archs == ("sm_80", "sm_90")
    assert resolve_lock(args, {}, matrix).gpu_archs == ()  # render's lock: as before
    cpu = build_parser().parse_args(["render", "docker", "--variant", "cpu", "--gpu", "A100", "-o", "out"])
    assert resolve_lock(cpu, {}, matrix, gpu_archs=True).gpu_archs == ()  # nothing compiled for a GPU
