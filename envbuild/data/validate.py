"""Validate compatibility data: field types, sources, cross-file references.

Imported only when the JSON cache misses, so the regexes and YAML parser below cost
nothing on a warm ``envbuild resolve``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from envbuild.data.relations import RELATIONS, Row
from envbuild.errors import DataError
from envbuild.smoke.rules import is_arch, is_python_version, is_wheel_variant

_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_VERSION_RE = re.compile(r"\d+(\.\d+)*")
_DRIVER_RE = re.compile(r"\d{3}(\.\d{1,3}){0,2}")
_CC_RE = re.compile(r"\d{1,2}\.\d")
_ACTION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_TAG_RE = re.compile(r"v\d+(\.\d+){0,2}")
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_BUILD_RE = re.compile(r"\d{8}")
# What render's URL check accepts (the URL lands in a shell command line), ending in .tar.gz:
# the recipes unpack it with tar -xz.
_ARCHIVE_RE = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?/[A-Za-z0-9._~%+=,/-]*\.tar\.gz", re.ASCII)
_MONTH_RE = re.compile(r"\d{4}-\d{2}")
_DEB_VERSION_RE = re.compile(r"\d+(\.\d+){1,3}-\d+")
_FPR_RE = re.compile(r"[0-9A-F]{40}")
# An image by tag and digest, as `docker run` takes it: [registry/]name[:tag]@sha256:<64 hex>.
_PINNED_IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_.-]{1,128})?@sha256:[0-9a-f]{64}", re.ASCII)
_SOURCE_SCHEMES = ("https://", "pip-index:///")



# --- field checks: each returns an error text, or None when the value is fine ----------


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() == v and v else "must be a non-empty string"


def _pattern(rx: re.Pattern[str] | Callable[[str], bool], what: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = isinstance(v, str) and (rx(v) if callable(rx) else rx.fullmatch(v) is not None)
        return None if ok else f"must be {what} as a quoted string, got {v!r}"

    return check


def _list_of(item: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, list):
            return f"must be a list, got {v!r}"
        errors = [e for e in map(item, v) if e]
        return errors[0] if errors else None

    return check


def _int(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) else f"must be an integer, got {v!r}"


def _number(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    return None if ok else f"must be a positive number, got {v!r}"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _name_map(value: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """A mapping from non-empty names to values that pass ``value``."""

    def check(v: Any) -> str | None:
        if not isinstance(v, dict) or not all(isinstance(k, str) and k for k in v):
            return f"must be a mapping from names, got {v!r}"
        errors = [f"{k}: {e}" for k, x in v.items() if (e := value(x))]
        return errors[0] if errors else None

    return check


def _size(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
    return None if ok else f"must be a positive integer (bytes), got {v!r}"


def _str_map(v: Any) -> str | None:
    ok = isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
    return None if ok else f"must map strings to strings, got {v!r}"


def _source(v: Any) -> str | None:
    ok = isinstance(v, str) and v.startswith(_SOURCE_SCHEMES) and " " not in v
    return None if ok else f"must be an https:// (or pip-index:///) URL, got {v!r}"


def _date(v: Any) -> str | None:
    # YAML turns an unquoted 2026-11-21 into a date; accept both spellings.
    return None if _DATE_RE.fullmatch(str(v)) else f"must be a YYYY-MM-DD date, got {v!r}"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"

    return check


def _nullable(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda v: None if v is None else check(v)


GPU_FAMILIES = ("GeForce", "Workstation", "Data Center", "Jetson")
VERSION = _pattern(_VERSION_RE, "a version like 12.4.1")
DRIVER = _pattern(_DRIVER_RE, "a driver version like 550.54.15")
CC = _pattern(_CC_RE, "a compute capability like 8.9")
PYTHON = _pattern(is_python_version, "a Python version like 3.11")
VARIANT = _pattern(is_wheel_variant, "a wheel variant like cu124 or cpu")

# relation -> {field: (check, required)}
SCHEMA: dict[str, dict[str, tuple[Callable[[Any], str | None], bool]]] = {
    "cuda_toolkits": {"cuda": (VERSION, True), "min_driver": (DRIVER, True)},
    "cuda_compat": {
        "cuda_major": (_int, True),
        "mode": (_one_of("minor-version", "forward"), True),
        "min_driver": (DRIVER, False),
        "caveats": (_list_of(_text), False),
        "gpus": (_one_of("datacenter", "all"), False),
        "driver_branches": (_list_of(_int), False),
    },
    "cuda_archs": {"cuda": (VERSION, True), "compute_capabilities": (_list_of(CC), True)},
    "cuda_ubuntu": {"cuda": (VERSION, True), "ubuntu": (_list_of(VERSION), True)},
    "cudnn": {
        "cudnn": (VERSION, True),
        "cuda_majors": (_list_of(_int), True),
        "pip_packages": (_str_map, False),
    },
    "gpus": {
        "name": (_text, True),
        "aliases": (_list_of(_text), False),
        "compute_capability": (CC, True),
        "architecture": (_text, True),
        "family": (_one_of(*GPU_FAMILIES), True),  # the product line; suggestions prefer the same one
        "datacenter": (_bool, True),
        "name_source": (_source, False),  # where ``name`` was read as the driver (nvidia-smi) reports it
        "min_driver_branch": (_int, False),
        "last_driver_branch": (_int, False),
        "driver_source": (_source, False),  # where the driver-branch facts come from
        # aliases that name no one edition or form (H100, RTX PRO 6000): a lookup through one
        # says which row it assumed
        "assumed_for": (_list_of(_text), False),
        # the CPU architecture of the system the GPU is built into (Grace superchips, DGX Spark):
        # absent for a card that plugs into either
        "host_arch": (_one_of("aarch64"), False),
        "host_source": (_source, False),
        # the lowest CUDA whose wheels run on it where the arch list alone would admit older ones
        # (GB10: cu128's runtime compiler rejects sm_121)
        "min_cuda": (VERSION, False),
        "cuda_source": (_source, False),
    },
    "gpu_peaks": {
        "name": (_text, True),
        "fp32_tflops": (_number, False),
        "fp16_tflops": (_number, False),
        "bf16_tflops": (_number, False),
        "memory_bandwidth_gbs": (_number, False),
    },
    "torch_variants": {
        "torch": (VERSION, True),
        "variant": (VARIANT, True),
        "cuda": (_nullable(VERSION), True),
        "python": (_list_of(PYTHON), True),
        "arch_list": (_list_of(_pattern(is_arch, "an arch like sm_90 or sm_90+PTX")), False),
        "cuda_runtime": (VERSION, False),
        "cudnn": (VERSION, False),
        "nccl": (VERSION, False),
    },
    "torch_aarch64": {
        "torch": (VERSION, True),
        "variant": (VARIANT, True),
        "arch_list": (_list_of(_pattern(is_arch, "an arch like sm_90 or sm_90+PTX")), False),
        "pytorch_index": (_bool, True),
        "pypi_default": (_bool, True),
    },
    "torch_pypi": {
        "torch": (VERSION, True),
        "default_variant": (VARIANT, True),
        "python": (_list_of(PYTHON), True),
        "requires_python": (_nullable(_text), False),
        "platform_tag": (_text, False),
        "torchvision": (_nullable(VERSION), False),
        "torchaudio": (_nullable(VERSION), False),
        "cuda_runtime": (VERSION, False),
        "cudnn": (VERSION, False),
        "nccl": (VERSION, False),
    },
    "torch_wheels": {
        "torch": (VERSION, True),
        "python": (PYTHON, True),
        "platform_tag": (_text, True),
        "bytes": (_size, True),
        "nvidia": (_name_map(VERSION), True),
        "nvidia_bytes": (_name_map(_size), True),
        "cuda_toolkit": (VERSION, False),
        "cuda_toolkit_extras": (_list_of(_text), False),
        "torchvision": (VERSION, False),
        "torchvision_bytes": (_size, False),
        "torchaudio": (VERSION, False),
        "torchaudio_bytes": (_size, False),
        "files": (_name_map(_source), True),
    },
    "torch_companions": {
        "torch": (VERSION, True),
        "torchvision": (_nullable(VERSION), True),
        "torchaudio": (_nullable(VERSION), True),
        # the CPython versions the companion has Linux x86_64 wheels for; absent: any
        # (a py3-none wheel) or not read
        "torchvision_python": (_list_of(PYTHON), False),
        "torchaudio_python": (_list_of(PYTHON), False),
    },
    "cuda_images": {
        "cuda": (VERSION, True),
        "ubuntu": (VERSION, True),
        "flavors": (_list_of(_one_of("base", "runtime", "devel")), True),
        "cudnn_tag": (_nullable(_text), False),
        "cudnn_flavors": (_list_of(_one_of("runtime", "devel")), False),
    },
    "ubuntu_python": {
        "ubuntu": (VERSION, True),
        "codename": (_text, False),
        "python": (PYTHON, True),
        "glibc": (VERSION, False),
    },
    "python_standalone": {
        "python": (PYTHON, True),
        "version": (VERSION, True),
        "arch": (_one_of("x86_64", "aarch64"), True),
        "build": (_pattern(_BUILD_RE, "a build date like 20260814"), False),
        "url": (_pattern(_ARCHIVE_RE, "an https URL of a .tar.gz archive, no quotes or spaces"), True),
        "sha256": (_pattern(_SHA256_RE, "64 lowercase hex digits"), True),
    },
    "ci_actions": {
        "action": (_pattern(_ACTION_RE, "an action like owner/name"), True),
        "version": (_pattern(_TAG_RE, "a release tag like v4.1.0"), True),
        "sha": (_pattern(_SHA_RE, "a full 40-hex commit SHA"), True),
    },
    "driver_branches": {
        "branch": (_int, True),
        "designation": (_one_of("production", "lts", "new-feature"), True),
        "end_of_life": (_pattern(_MONTH_RE, "a month like 2028-06"), False),
    },
    "container_toolkit": {
        "version": (_pattern(_DEB_VERSION_RE, "a Debian version like 1.20.0-1"), True),
        "repository": (_source, True),
        "key_url": (_source, True),
        "key_fingerprint": (_pattern(_FPR_RE, "40 upper-case hex digits"), True),
        # The image the host script's GPU container check runs `nvidia-smi -L` in, by digest.
        "smoke_image": (_pattern(_PINNED_IMAGE_RE, "an image by digest, name[:tag]@sha256:<64 hex>"), False),
        "smoke_image_source": (_source, False),
    },
}
COMMON_FIELDS = {"source": (_source, True), "retrieved": (_date, True), "note": (_text, False)}


def parse_all(files: Mapping[str, bytes]) -> dict[str, tuple[Row, ...]]:
    import yaml  # only on a cache miss: yaml costs more to import than the rest of resolve

    from envbuild.data.yamlload import YamlProblem, load

    problems: list[str] = []
    relations: dict[str, tuple[Row, ...]] = {}
    for name in RELATIONS:
        if name not in files:
            problems.append(f"{name}.yaml: missing")
            continue
        try:
            document = load(files[name])
        except YamlProblem as exc:
            problems.append(f"{name}.yaml {exc}")
            continue
        except yaml.YAMLError as exc:
            problems.append(f"{name}.yaml: not valid YAML ({' '.join(str(exc).split())})")
            continue
        relations[name] = tuple(_validate_document(name, document, problems))
    problems.extend(_cross_references(relations))
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError(
            f"{len(problems)} problem(s) in compatibility data: {shown}{more}",
            hint="fix the rows named, or run 'envbuild matrix validate' for the full list",
        ).with_details(problems)
    return relations


def _validate_document(name: str, document: Any, problems: list[str]) -> Iterator[Row]:
    if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
        problems.append(f"{name}.yaml: expected a mapping with a 'rows' list")
        return
    if document.get("relation") != name:
        problems.append(f"{name}.yaml: 'relation' must be {name!r}")
    fields = SCHEMA[name] | COMMON_FIELDS
    for index, row in enumerate(document["rows"], start=1):
        where = f"{name}.yaml row {index}"
        if not isinstance(row, dict):
            problems.append(f"{where}: not a mapping")
            continue
        row_problems = [f"{where}: unknown field {key!r}" for key in row if key not in fields]
        for key, (check, required) in fields.items():
            if key not in row:
                if required:
                    row_problems.append(f"{where}: missing {key!r}")
                continue
            error = check(row[key])
            if error:
                row_problems.append(f"{where}: {key} {error}")
        problems.extend(row_problems)
        if not row_problems:
            yield {**row, "retrieved": str(row["retrieved"])}


def _cross_references(relations: Mapping[str, tuple[Row, ...]]) -> list[str]:
    from envbuild.data.gpus import fold_name as fold

    problems: list[str] = []
    minors = {".".join(r["cuda"].split(".")[:2]) for r in relations.get("cuda_toolkits", ())}
    gpu_names = {r["name"] for r in relations.get("gpus", ())}
    variants = {(r["torch"], r["variant"]) for r in relations.get("torch_variants", ())}

    def check(relation: str, test: Callable[[Row], str | None]) -> None:
        for index, row in enumerate(relations.get(relation, ()), start=1):
            error = test(row)
            if error:
                problems.append(f"{relation}.yaml row {index}: {error}")

    # An image may name a release whose toolkit driver is not recorded (a data gap, not
    # an error): the resolver walks cuda_toolkits, so such an image is never chosen.
    check("cuda_images", lambda r: None if ".".join(r["cuda"].split(".")[:2]) in minors else
          f"CUDA {r['cuda']} belongs to no CUDA family in cuda_toolkits.yaml")
    check("torch_variants", lambda r: None if r["cuda"] is None or r["cuda"] in minors else
          f"CUDA {r['cuda']} has no release in cuda_toolkits.yaml")
    check("gpu_peaks", lambda r: None if r["name"] in gpu_names else
          f"GPU {r['name']!r} is not in gpus.yaml")
    # A release without variant rows is served from the package index alone; one with
    # rows must list the variant its index wheel was built as.
    released = {torch for torch, _ in variants}
    check("torch_pypi", lambda r: None if r["torch"] not in released or r["default_variant"]
          == "cpu" or (r["torch"], r["default_variant"]) in variants else
          f"default variant {r['default_variant']} of torch {r['torch']} is not in "
          "torch_variants.yaml")
    check("torch_variants", lambda r: _beyond_nvcc(r, relations))
    # An aarch64 wheel takes its CUDA and Pythons from the x86_64 variant of its release; the
    # package index's default aarch64 CPU wheels of releases before 2.11 have no variant row.
    check("torch_aarch64", lambda r: None if (r["torch"], r["variant"]) in variants
          or (r["variant"] == "cpu" and not r["pytorch_index"]) else
          f"torch {r['torch']} {r['variant']} is not in torch_variants.yaml")
    cudas = {(r["torch"], r["variant"]): r["cuda"] for r in relations.get("torch_variants", ())}
    check("torch_aarch64", lambda r: _beyond_nvcc(
        {**r, "cuda": cudas.get((r["torch"], r["variant"]))}, relations))
    check("torch_aarch64", lambda r: None if r["pytorch_index"] or r["pypi_default"] else
          "neither pytorch_index nor pypi_default: where is the wheel?")
    defaults = [(r["torch"]) for r in relations.get("torch_aarch64", ()) if r["pypi_default"]]
    problems.extend(f"torch_aarch64.yaml: torch {t} has more than one pypi_default row"
                    for t in sorted({t for t in defaults if defaults.count(t) > 1}))
    check("gpus", lambda r: None if ("host_arch" in r) == ("host_source" in r) else
          "host_arch and host_source go together")
    check("gpus", lambda r: None if ("min_cuda" in r) == ("cuda_source" in r) else
          "min_cuda and cuda_source go together")
    check("torch_companions", _companion_unexplained)
    check("cuda_images", lambda r: _unsupported_ubuntu(r, relations))
    on_index = {r["torch"] for r in relations.get("torch_pypi", ())}
    check("torch_wheels", lambda r: None if r["torch"] in on_index else
          f"torch {r['torch']} is not in torch_pypi.yaml")
    check("torch_wheels", lambda r: None if set(r["nvidia_bytes"]) <= set(r["nvidia"]) else
          "nvidia_bytes names a package that nvidia does not pin")
    # An action's row cites the tag it was read from: a row edited in one field only shows.
    check("ci_actions", lambda r: None if r["source"] ==
          f"https://github.com/{r['action']}/tree/{r['version']}" else
          f"source must be https://github.com/{r['action']}/tree/{r['version']}, the tag read")
    check("gpus", lambda r: None if {fold(a) for a in r.get("assumed_for", ())} <= {
        fold(a) for a in (r["name"], *r.get("aliases", ()))} else
        "assumed_for names a name that is not one of the row's aliases")
    # A build recorded for "3.12" is a 3.12.x (a "3.13t" row a 3.13.x).
    check("python_standalone", lambda r: None if r["version"].startswith(
        r["python"].rstrip("t") + ".") else f"version {r['version']} is not a {r['python']} release")
    problems.extend(_duplicate_keys(relations))
    return problems


def _companion_unexplained(row: Row) -> str | None:
    """A null companion says why in the note (a part "no torchvision ..."): ``resolve`` and
    the lock repeat that reason, so a row without it would leave them silent."""
    parts = str(row.get("note") or "").split("; ")
    for name in ("torchvision", "torchaudio"):
        if row[name] is None and not any(part.startswith(f"no {name} ") for part in parts):
            return f"{name} is null and the note does not say why (a part 'no {name} ...')"
    return None


def _beyond_nvcc(row: Row, relations: Mapping[str, tuple[Row, ...]]) -> str | None:
    """An arch-list entry that the variant's own nvcc cannot compile is a misread arch
    list (or a misread toolkit table): cuda_archs.yaml is what nvcc of each CUDA minor
    accepts. Rows whose CUDA minor has no cuda_archs row are not judged."""
    from envbuild.data.gpus import parse_arch_list

    targets = {r["cuda"]: r["compute_capabilities"] for r in relations.get("cuda_archs", ())}
    accepted = targets.get(row["cuda"]) if row["cuda"] else None
    if accepted is None or not row.get("arch_list"):
        return None
    beyond = [f"sm_{major}{minor}" for _, (major, minor), _, _ in parse_arch_list(row["arch_list"])
              if f"{major}.{minor}" not in accepted]
    if not beyond:
        return None
    return (f"arch list names {', '.join(beyond)}, which nvcc {row['cuda']} cannot target "
            "(cuda_archs.yaml)")


def _unsupported_ubuntu(row: Row, relations: Mapping[str, tuple[Row, ...]]) -> str | None:
    """An nvidia/cuda image for an Ubuntu that NVIDIA does not ship that CUDA minor for
    (cuda_ubuntu.yaml) is a misread tag. Minors without a cuda_ubuntu row are not judged."""
    supported = {r["cuda"]: r["ubuntu"] for r in relations.get("cuda_ubuntu", ())}
    minor = ".".join(row["cuda"].split(".")[:2])
    listed = supported.get(minor)
    if listed is None or row["ubuntu"] in listed:
        return None
    return f"CUDA {minor} is not supported on Ubuntu {row['ubuntu']} (cuda_ubuntu.yaml: {', '.join(listed)})"


_KEYS = {
    "cuda_toolkits": ("cuda",),
    "cuda_archs": ("cuda",),
    "cuda_ubuntu": ("cuda",),
    "cudnn": ("cudnn",),
    "gpus": ("name",),
    "gpu_peaks": ("name",),
    "torch_variants": ("torch", "variant"),
    "torch_aarch64": ("torch", "variant"),
    "torch_pypi": ("torch",),
    "torch_wheels": ("torch", "python"),
    "torch_companions": ("torch",),
    "cuda_images": ("cuda", "ubuntu"),
    "ubuntu_python": ("ubuntu",),
    "python_standalone": ("python", "arch"),
    "ci_actions": ("action",),
    "driver_branches": ("branch",),
    "container_toolkit": ("version",),
}


def _duplicate_keys(relations: Mapping[str, tuple[Row, ...]]) -> Iterator[str]:
    for relation, key in _KEYS.items():
        seen: set[tuple[Any, ...]] = set()
        for index, row in enumerate(relations.get(relation, ()), start=1):
            value = tuple(row[k] for k in key)
            if value in seen:
                yield f"{relation}.yaml row {index}: duplicate {'/'.join(map(str, value))}"
            seen.add(value)
    from envbuild.data.gpus import fold_name

    aliases: dict[str, str] = {}
    for row in relations.get("gpus", ()):
        for alias in (row["name"], *row.get("aliases", ())):
            folded = fold_name(alias)  # as the lookup folds it: "GeForce RTX-3080" and "RTX 3080" are one
            if aliases.setdefault(folded, row["name"]) != row["name"]:
                yield f"gpus.yaml: alias {alias!r} names both {aliases[folded]!r} and {row['name']!r}"


