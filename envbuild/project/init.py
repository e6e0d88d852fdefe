"""The text ``envbuild init`` writes: a commented project file, from values already checked.

Pure: values in, text out. ``render_project`` writes either a standalone envbuild.toml or,
with ``pyproject_block``, the ``[tool.envbuild]`` tables to paste into pyproject.toml; either
loads back through ``load_project`` to the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class InitValues:
    """What the user chose (flags or the probed host), each already validated."""

    target: str = "default"
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    datacenter: bool = False
    platform: str | None = None  # linux/amd64 | linux/arm64; None: inferred from the GPUs
    torch: str | None = None
    python: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    ubuntu: str | None = None
    variant: str | None = None
    flavor: str = "runtime"
    torch_index_url: str | None = None
    requirements: tuple[str, ...] = ()  # paths relative to the project file
    pyproject: str | None = None  # a pyproject.toml whose dependencies to read (envbuild.toml only)
    note: str | None = None  # said in a comment above the target (e.g. "no GPU on this host")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def toml_array(items: Sequence[str]) -> str:
    return "[" + ", ".join(toml_string(i) for i in items) + "]"


_STACK = (
    ("torch", "PyTorch: an exact version (2.4.1), a series (2.4) or a specifier (>=2.3,<2.6)", "2.4"),
    ("python", "Python minor version (3.13t for free-threaded)", "3.11"),
    ("cuda", "CUDA toolkit: a series or a specifier", "12.4"),
    ("cudnn", "cuDNN major or specifier", "9"),
    ("ubuntu", "Ubuntu release of the base image", "22.04"),
    ("variant", "wheel variant: cu124, cpu, or default (the package index's own wheel)", "cu124"),
)


def _key(lines: list[str], key: str, value: str | None, comment: str, example: str) -> None:
    lines.append(f"# {comment}")
    lines.append(f"{key} = {value}" if value is not None else f"# {key} = {example}")


def render_project(values: InitValues, *, pyproject_block: bool = False) -> str:
    """The commented project file (``pyproject_block``: the [tool.envbuild] tables)."""
    prefix = "tool.envbuild." if pyproject_block else ""
    lines = [
        "# envbuild project file: the environment `envbuild lock` resolves and pins.",
        "# Written by `envbuild init`; edit freely. Command-line flags override these values.",
        "# Every key is optional; a commented-out key shows its form.",
    ]
    if pyproject_block:
        lines += ["# Paste into pyproject.toml: its [project] dependencies are read as well.",
                  "[tool.envbuild]"]
    lines += ["", "# --- the stack: constraints, as `envbuild resolve` takes them ---"]
    given = vars(values)
    for key, comment, example in _STACK:
        value = given[key]
        _key(lines, key, toml_string(value) if value is not None else None, comment, toml_string(example))
    lines += ["# runtime, or devel (adds the CUDA toolkit with nvcc, to build extensions)",
              f"flavor = {toml_string(values.flavor)}",
              "# pin torchvision and torchaudio beside torch",
              "companions = true"]
    _key(lines, "torch-index-url",
         toml_string(values.torch_index_url) if values.torch_index_url else None,
         "index torch is installed from (default: the variant's own)",
         toml_string("https://mirror.example/whl/cu124"))
    lines += ["", "# --- your Python dependencies (torch, torchvision, torchaudio among them become",
              "# constraints on the stack) ---"]
    if not pyproject_block:
        _key(lines, "pyproject", toml_string(values.pyproject) if values.pyproject else None,
             "read [project.dependencies] (and the extras and groups below) from this pyproject.toml",
             toml_string("pyproject.toml"))
    _key(lines, "extras", None, "extras of [project.optional-dependencies] to install", '["gpu"]')
    _key(lines, "groups", None, "dependency groups ([dependency-groups], PEP 735) to install", '["dev"]')
    _key(lines, "requirements", toml_array(values.requirements) if values.requirements else None,
         "requirements files (relative to this file; -r includes are followed)",
         '["requirements.txt"]')
    _key(lines, "dependencies", None, "more requirements (PEP 508)", '["requests>=2.31"]')
    lines += ["", "# --- the image ---"]
    _key(lines, "apt-packages", None, "Debian packages installed in the image", '["git"]')
    _key(lines, "compile-toolchain", None, "false: no g++ and Python headers, which torch.compile "
         "needs (about 171 MB less)", "false")
    _key(lines, "user", None, "the image's unprivileged user", '"envbuild"')
    _key(lines, "base-image", None, "FROM this image instead (a mirror or private registry)",
         '"registry.example:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04"')
    _key(lines, "index-url", None, "index your dependencies come from (default: pip's configured one)",
         '"https://mirror.example/simple"')
    _key(lines, "find-links", None, "directories (relative to this file) or URLs of extra wheels",
         '["wheels"]')
    lines += ["# environment variables set in the image", f"# [{prefix}env]", '# HF_HOME = "/cache/hf"',
              "# registry mirrors for base images", f"# [{prefix}registry-mirrors]",
              '# "docker.io" = "https://mirror.example:5000"']
    lines += ["", "# --- targets: one per kind of machine (a cloud may have several node types) ---"]
    if values.note:
        lines.append("# " + " ".join(values.note.split()))
    lines.append(f"[[{prefix}targets]]")
    lines.append(f"name = {toml_string(values.target)}")
    _key(lines, "driver", toml_string(values.driver) if values.driver else None,
         "host NVIDIA driver: 550, 550.54 or 550.54.15", '"550"')
    _key(lines, "gpus", toml_array(values.gpus) if values.gpus else None,
         "GPUs by name, as `envbuild matrix show gpus` lists them", '["RTX 4090"]')
    _key(lines, "archs", toml_array(values.archs) if values.archs else None,
         "or GPU architectures", '["sm_89"]')
    _key(lines, "platform", toml_string(values.platform) if values.platform else None,
         "host platform, as Docker spells it (default: linux/arm64 for a Grace or DGX Spark GPU, "
         "else linux/amd64)", '"linux/arm64"')
    lines += ["# datacenter parts (allows CUDA forward compatibility)",
              f"datacenter = {'true' if values.datacenter else 'false'}", ""]
    return "\n".join(lines)
