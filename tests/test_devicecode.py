"""The smoke test's device-code check (envbuild/smoke/devicecode.py), on shared objects compiled
here by NVIDIA's real nvcc (no GPU needed): the CUDA toolkit's compiler wheels from the package
index (nvidia-cuda-nvcc 13.5 brings nvcc; nvvm, crt and the runtime headers come apart), fetched
once with ``pip download --no-deps`` into ``~/.cache/envbuild-test-nvcc`` and unpacked there.

The same source compiled by g++ alone is what a detectron2-style setup.py builds without
``FORCE_CUDA=1`` in an image build (no GPU): no ``.nv_fatbin`` section, and the check names the
extension."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envbuild.smoke import devicecode
from envbuild.smoke.installed import compare_installed

CACHE = Path.home() / ".cache" / "envbuild-test-nvcc"
# The compiler's wheels, one CUDA release (13.5.37, the newest nvcc wheel on the index on 2026-11-28).
WHEELS = ("nvidia-cuda-nvcc==13.5.37", "nvidia-nvvm==13.5.37", "nvidia-cuda-crt==13.5.37",
          "nvidia-cuda-runtime==13.5.37")
SOURCE = """\
#ifdef __CUDACC__
__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" void launch(float *x) { add_one<<<1, 32>>>(x); }
#else
extern "C" void launch(float *x) { for (int i = 0; i < 32; ++i) x[i] += 1.0f; }
#endif
"""


def _toolkit() -> Path | None:
    """nvidia/cu13 of the unpacked wheels (bin/nvcc in it), fetched once; None when the index
    cannot give them."""
    root = CACHE / "unpacked"
    nvcc = root / "nvidia" / "cu13" / "bin" / "nvcc"
    if nvcc.is_file():
        return nvcc.parent.parent
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "--dest", str(CACHE), *WHEELS], capture_output=True, text=True, timeout=900)
    wheels = sorted(CACHE.glob("nvidia_*-13.5.37-*.whl"))
    if done.returncode != 0 or len(wheels) != len(WHEELS):
        return None
    partial = CACHE / "unpacking"
    shutil.rmtree(partial, ignore_errors=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
    for tool in (partial / "nvidia" / "cu13").glob("*/bin/*"):
        tool.chmod(0o755)
    for tool in (partial / "nvidia" / "cu13" / "bin").iterdir():
        tool.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return nvcc.parent.parent


@pytest.fixture(scope="module")
def cuda_home() -> Path:
    found = _toolkit()
    if found is None or shutil.which("g++") is None:
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(f"nvcc's wheels ({', '.join(WHEELS)}) or g++ are not available")
        pytest.skip(f"nvcc's wheels ({', '.join(WHEELS)}) cannot be had from the package index, or no g++")
    return found


def nvcc(cuda_home: Path, source: Path, output: Path, *gencode: str) -> Path:
    env = {**os.environ, "CUDA_HOME": str(cuda_home), "PATH": f"{cuda_home / 'bin'}:{os.environ['PATH']}"}
    command = [str(cuda_home / "bin" / "nvcc"), "-shared", "-Xcompiler", "-fPIC", "-cudart", "none",
               *gencode, "-o", str(output), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return output


@pytest.fixture(scope="module")
def built(cuda_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The one source as nvcc builds it for sm_80, for sm_80 + PTX 9.0, and as g++ alone does."""
    root = tmp_path_factory.mktemp("devicecode")
    source = root / "kext.cu"
    source.write_text(SOURCE)
    plain = root / "kext_cpu.so"
    done = subprocess.run(["g++", "-shared", "-fPIC", "-x", "c++", "-o", str(plain), str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {"sm80": nvcc(cuda_home, source, root / "kext_sm80.so", "-gencode", "arch=compute_80,code=sm_80"),
            "ptx90": nvcc(cuda_home, source, root / "kext_ptx90.so", "-gencode", "arch=compute_80,code=sm_80",
                          "-gencode", "arch=compute_90,code=compute_90"),
            "cpu": plain}


def test_the_fatbin_reader_finds_the_cubin_nvcc_compiled_for_sm_80(built: dict[str, Path]) -> None:
    section = devicecode.elf_section(str(built["sm80"]))
    assert section
    assert devicecode.fatbin_archs(section) == ({80}, set())
    both = devicecode.elf_section(str(built["ptx90"]))
    assert both and devicecode.fatbin_archs(both) == ({80}, {90})
    assert devicecode.elf_section(str(built["cpu"])) is None  # g++ alone: no device code at all


def test_the_check_passes_on_sm_80_code_and_fails_naming_the_extension_without_it(
        built: dict[str, Path]) -> None:
    assert devicecode.missing_device_code("kext", [str(built["sm80"])], ["sm_80"]) == []
    assert devicecode.missing_device_code("kext", [str(built["sm80"])], ["sm_86"]) == []  # same major
    [problem] = devicecode.missing_device_code("kext", [str(built["sm80"])], ["sm_80", "sm_90"])
    assert problem == "kext: no device code for sm_90 (it holds sm_80): TORCH_CUDA_ARCH_LIST missed them"
    assert devicecode.missing_device_code("kext", [str(built["ptx90"])], ["sm_90", "sm_120"]) == []  # PTX JIT
    [problem] = devicecode.missing_device_code("kext", [str(built["cpu"])], ["sm_80"])
    assert problem.startswith("kext: a CUDA extension built without device code (no .nv_fatbin section in ")
    assert "FORCE_CUDA=1" in problem


def installed(site: Path, name: str, shared_object: Path) -> None:
    """``name`` 0.1 installed in ``site`` as pip leaves a built wheel: its package and RECORD."""
    (site / name).mkdir(parents=True)
    shutil.copy(shared_object, site / name / "_C.so")
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "RECORD").write_text(f"{name}/_C.so,,\n{name}-0.1.dist-info/METADATA,,\n"
                                 f"{name}-0.1.dist-info/RECORD,,\n")


def lock(cuda: bool) -> dict[str, object]:
    return {"schema": 1, "stack": {"torch": "2.13.0", "cuda": "13.0" if cuda else None,
                                   "arch_list": ["sm_80"]},
            "packages": {}, "pylock": {"file": "pylock.toml"},
            "extensions": [{"dir": "ext", "name": "kext", "sha256": "0" * 64, "cuda": True}]}


def test_the_installed_set_check_reads_each_cuda_extension_of_the_lock(built: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    installed(good, "kext", built["sm80"])
    installed(bad, "kext", built["cpu"])
    assert devicecode.device_code_problems(lock(True), [str(good)]) == []
    [problem] = devicecode.device_code_problems(lock(True), [str(bad)])
    assert problem.startswith("kext: a CUDA extension built without device code")
    assert problem in compare_installed(lock(True), paths=[str(bad)], bootstrap=())
    assert devicecode.device_code_problems(lock(False), [str(bad)]) == []  # a cpu stack wants none


def _container(*entries: tuple[int, int]) -> bytes:
    """A fat binary container as nvcc lays it out: (kind, SM) entries, each a 64-byte header
    followed by an 8-byte payload."""
    body = b"".join(struct.pack("<HHIQIIHHI", kind, 0x0101, 64, 8, 0, 0, 7, 1, arch).ljust(64, b"\0")
                    + b"\0" * 8 for kind, arch in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_the_fatbin_reader_walks_several_containers_and_skips_padding() -> None:
    section = _container((2, 75), (1, 75)) + b"\0" * 8 + _container((2, 120))
    assert devicecode.fatbin_archs(section) == ({75, 120}, {75})
    assert devicecode.fatbin_archs(b"") == (set(), set())
    assert devicecode.fatbin_archs(b"\x50\xed\x55\xba" + b"\xff" * 60) == (set(), set())  # cut short


def test_a_file_that_is_not_elf_is_a_problem_naming_the_extension(tmp_path: Path) -> None:
    fake = tmp_path / "_C.so"
    fake.write_bytes(b"not an ELF object")
    [problem] = devicecode.missing_device_code("kext", [str(fake)], ["sm_80"])
    assert problem.startswith("kext: cannot read") and "not a 64-bit little-endian ELF file" in problem
    assert devicecode.missing_device_code("kext", [], ["sm_80"]) == [
        "kext: a CUDA extension of the lock without a shared object"]
