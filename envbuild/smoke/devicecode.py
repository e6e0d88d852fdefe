"""Device code in a CUDA extension's shared objects, read from their ELF ``.nv_fatbin`` section.

A CUDAExtension whose ``setup.py`` compiles its CUDA sources only when it sees a GPU or
``FORCE_CUDA=1`` builds its C++ part alone in an image build (no GPU there): the module imports,
``torch`` says CUDA, and every kernel call falls back or fails on the GPU host. The image's smoke
test reads each such extension's shared objects instead, with no GPU: nvcc puts the device code
in the ``.nv_fatbin`` section, a sequence of fat binary containers (a 16-byte header: magic
0xBA55ED50, or 0x466243B1 for relocatable code, a version, the header's size and the size of the
entries that follow), each entry with its own header (kind: 1 PTX, 2 cubin; its header's size and
its payload's size; the SM number at byte 28). The layout is NVIDIA's unpublished format as
public reverse-engineering describes it (github.com/GrigoryEvko/nvopen-tools,
fatbin/FORMAT_SPECIFICATION.md, read 2026-11-28), checked against nvcc 13.5's output by
tests/test_devicecode.py.

Standard library only, Python 3.8+: part of the smoke payload.
"""

from __future__ import annotations

import struct
from typing import Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .lockfile import canonical_name
from .rules import NO_COVERAGE, arch_runs_on, parse_arch_list

SECTION = ".nv_fatbin"
MAGICS = (0xBA55ED50, 0x466243B1)
KIND_PTX = 1
KIND_CUBIN = 2
MAX_SECTIONS = 65536
MAX_FATBIN = 4 * 1024 ** 3  # flash-attn's one shared object holds ~0.5 GB of cubins


class NotElf(ValueError):
    """The file is not a 64-bit little-endian ELF object envbuild can read."""


def elf_section(path: str, wanted: str = SECTION) -> Optional[bytes]:
    """The bytes of section ``wanted`` of the ELF file at ``path``; None when it has none."""
    with open(path, "rb") as file:
        header = file.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise NotElf("%s is not a 64-bit little-endian ELF file" % path)
        shoff = struct.unpack_from("<Q", header, 0x28)[0]
        entsize, count, names_index = struct.unpack_from("<HHH", header, 0x3A)
        if count == 0 or count > MAX_SECTIONS or entsize < 64 or names_index >= count:
            raise NotElf("%s: no readable section table" % path)
        file.seek(shoff)
        table = file.read(entsize * count)
        if len(table) < entsize * count:
            raise NotElf("%s: its section table is cut short" % path)
        sections = [struct.unpack_from("<IIQQQQ", table, i * entsize) for i in range(count)]
        names = _read(file, sections[names_index][4], sections[names_index][5], path)
        for name_at, kind, _flags, _address, offset, size in sections:
            end = names.find(b"\0", name_at)
            if end < 0 or names[name_at:end] != wanted.encode("ascii"):
                continue
            if kind == 8:  # SHT_NOBITS: no bytes in the file
                return b""
            if size > MAX_FATBIN:
                raise NotElf("%s: its %s section is larger than %d bytes" % (path, wanted, MAX_FATBIN))
            return _read(file, offset, size, path)
    return None


def _read(file: object, offset: int, size: int, path: str) -> bytes:
    file.seek(offset)  # type: ignore[attr-defined]
    data: bytes = file.read(size)  # type: ignore[attr-defined]
    if len(data) < size:
        raise NotElf("%s: a section runs past the end of the file" % path)
    return data


def fatbin_archs(section: bytes) -> Tuple[Set[int], Set[int]]:
    """(SM numbers with a cubin, SM numbers with PTX) in a ``.nv_fatbin`` section: 80 is sm_80."""
    cubins: Set[int] = set()
    ptx: Set[int] = set()
    position = 0
    while position + 16 <= len(section):
        magic, _version, header_size, size = struct.unpack_from("<IHHQ", section, position)
        if magic not in MAGICS or header_size < 16:
            position += 8  # the containers are 8-byte aligned; padding between them
            continue
        entry = position + header_size
        end = min(entry + size, len(section))
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            arch = struct.unpack_from("<I", section, entry + 28)[0]
            if kind == KIND_CUBIN:
                cubins.add(arch)
            elif kind == KIND_PTX:
                ptx.add(arch)
            if entry_header < 32:
                break
            entry += entry_header + payload
        position = max(end, position + 8)
    return cubins, ptx


def arch_entries(cubins: Iterable[int], ptx: Iterable[int]) -> List[str]:
    """The device code as arch-list entries: sm_80 for a cubin, compute_80 for PTX."""
    return sorted(["sm_%d" % n for n in cubins] + ["compute_%d" % n for n in ptx])


def _capability(arch: str) -> Optional[Tuple[int, int]]:
    parsed = parse_arch_list([arch])
    return parsed[0][1] if parsed else None


def missing_device_code(name: str, shared_objects: Sequence[str], wanted: Sequence[str]) -> List[str]:
    """Problem lines for a CUDA extension ``name``: no shared object, none with device code, or
    an architecture of ``wanted`` (``sm_80``: the GPUs it was built for) that its device code
    does not run on. Empty when it holds code for every one."""
    if not shared_objects:
        return ["%s: a CUDA extension of the lock without a shared object" % name]
    found: List[str] = []
    for path in shared_objects:
        try:
            section = elf_section(path)
        except (OSError, NotElf) as exc:
            return ["%s: cannot read %s (%s)" % (name, path, exc)]
        if section:
            cubins, ptx = fatbin_archs(section)
            found += arch_entries(cubins, ptx)
    if not found:
        return ["%s: a CUDA extension built without device code (no %s section in %s): its build saw "
                "no CUDA; build with FORCE_CUDA=1 and nvcc (a devel base)"
                % (name, SECTION, ", ".join(shared_objects))]
    entries = parse_arch_list(found)
    absent = [arch for arch in wanted if _capability(arch) is not None
              and arch_runs_on(entries, _capability(arch) or (0, 0))[0] == NO_COVERAGE]
    if absent:
        return ["%s: no device code for %s (it holds %s): TORCH_CUDA_ARCH_LIST missed them"
                % (name, ", ".join(absent), ", ".join(sorted(set(found))))]
    return []


def cuda_extensions(lock: Mapping[str, object]) -> List[str]:
    """Canonical names of the lock's extensions built from CUDA sources, on a CUDA stack."""
    stack = lock.get("stack")
    entries = lock.get("extensions")
    if not isinstance(stack, dict) or not stack.get("cuda") or not isinstance(entries, list):
        return []
    return sorted(str(e["name"]) for e in entries
                  if isinstance(e, dict) and e.get("cuda") is True and isinstance(e.get("name"), str))


def wanted_archs(lock: Mapping[str, object]) -> List[str]:
    """What the extensions stage built for: the target GPUs' architectures the lock records
    (``gpu_archs``), else the sm entries of its stack's arch list."""
    stack = lock.get("stack")
    archs = lock.get("gpu_archs") or (stack.get("arch_list") if isinstance(stack, dict) else None)
    return [a for a in archs if isinstance(a, str) and a.startswith("sm_")] if isinstance(archs, list) else []


def device_code_problems(lock: Mapping[str, object], paths: Optional[Iterable[str]] = None) -> List[str]:
    """For each CUDA extension of ``lock`` installed on ``paths`` (``sys.path``): its shared
    objects must hold device code for the stack's architectures (``missing_device_code``). An
    extension not installed is the installed-set check's to report."""
    import sys
    from importlib import metadata

    names = cuda_extensions(lock)
    if not names:
        return []
    found = {}
    for dist in metadata.distributions(path=list(sys.path if paths is None else paths)):
        key = canonical_name(str(dist.metadata["Name"] or ""))
        if key in names and key not in found:
            found[key] = dist
    problems: List[str] = []
    for name in names:
        installed = found.get(name)
        if installed is None:
            continue
        objects = sorted(str(installed.locate_file(f)) for f in (installed.files or [])
                         if f.name.endswith(".so") or ".so." in f.name)
        problems += missing_device_code(name, objects, wanted_archs(lock))
    return problems
