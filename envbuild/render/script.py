"""Render a lock into a host install script (``install.sh``); ``cloudinit`` wraps it in user-data.

Pure and deterministic like ``render_docker``: the same lock renders the same bytes. The
script carries the lock's facts as ``readonly`` shell variables in one block at its top;
every command below that block reads them as quoted variables, so a user value (already
validated by ``envbuild.lock``) is one shell word and can never change the commands.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from envbuild.errors import UsageError
from envbuild.render.hostsetup import HostSetup, default_setup
from envbuild.render.lock import Lock
from envbuild.render.templates import environment, major_minor
from envbuild.smoke.rules import COMPILE_TOOLCHAIN_ENV as COMPILE_OPT_OUT_ENV

# Ubuntu release -> the directory of NVIDIA's network repository for it
# (https://developer.download.nvidia.com/compute/cuda/repos/<distro>/x86_64/).
NVIDIA_DISTROS = {"20.04": "ubuntu2004", "22.04": "ubuntu2204", "24.04": "ubuntu2404"}
# Ubuntu release -> its suite (codename): the apt-snapshot sources name it (docs/apt-snapshot.md).
SUITES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble"}

# Where the script puts things on the host; the venv partial is rendered with these paths.
PREFIX = "/opt/envbuild"
VENV = f"{PREFIX}/venv"
PYTHON_HOME = f"{PREFIX}/python"
TARBALL = f"{PREFIX}/python.tar.gz"


def check_scriptable(lock: Lock) -> None:
    """The host script's own limits, beyond what ``check_lock`` already validated."""
    s = lock.stack
    if s.ubuntu not in NVIDIA_DISTROS:
        raise UsageError(f"the stack is for Ubuntu {s.ubuntu}; host scripts support Ubuntu "
                         f"{', '.join(NVIDIA_DISTROS)}", hint="pass --ubuntu 22.04 (or 20.04, 24.04)")
    if lock.python_provision not in ("distro", "standalone"):
        raise UsageError(f"the lock takes Python {s.python} from its base image ({lock.base_image}); "
                         "a host has no base image",
                         hint="re-create the lock with --python-url and --python-sha256, or choose "
                              f"Ubuntu {s.ubuntu}'s --python")
    if lock.extensions or lock.sdists:  # a host script installs wheels; it builds nothing
        raise UsageError("the lock has extensions (or build-sdists), which are built in an image build only",
                         hint="render docker or build from this lock (docs/extensions.md)")


def compat_facts(lock: Lock) -> tuple[str, str]:
    """(package, library directory) of NVIDIA's forward-compatibility package for a ``forward``
    stack, else ("", ""). NVIDIA names it cuda-compat-<major>-<minor> in its network repository,
    after the CUDA release it brings, and installs it into the versioned toolkit directory,
    /usr/local/cuda-<major>.<minor>/compat; the loader must be pointed there (LD_LIBRARY_PATH or
    ld.so.conf), which the package does not do
    (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html, "Installing the
    CUDA Forward Compatibility Package", read 2026-11-21 and 2026-11-24; matrices/cuda_compat.yaml)."""
    s = lock.stack
    if s.compat != "forward" or not s.cuda:
        return "", ""
    release = major_minor(s.cuda)
    return f"cuda-compat-{release.replace('.', '-')}", f"/usr/local/cuda-{release}/compat"


def _word(value: str) -> str:
    """One shell word; validated lock values never hold a quote, but quote them anyway."""
    return shlex.quote(value)


def facts(lock: Lock, host: HostSetup) -> list[tuple[str, str]]:
    """The ``readonly NAME=value`` block: only lock facts the script uses (shellcheck flags the rest),
    then the host setup chosen at render time (envbuild.render.hostsetup)."""
    s = lock.stack
    min_driver = s.min_driver or ""
    values = [
        ("VARIANT", s.variant),
        ("PYTHON_VERSION", s.python),
        ("STACK_UBUNTU", s.ubuntu),
        ("PYTHON_PROVISION", lock.python_provision),
        ("CUDA_VERSION", s.cuda or ""),
        # The oldest driver that runs the wheel's CUDA (the resolver's floor for this stack) and
        # the branch that version belongs to: nvidia-driver-<branch> when the host's is older.
        ("MIN_DRIVER", min_driver),
        ("MIN_BRANCH", min_driver.split(".")[0]),
        # The branch installed when the host's driver is older (host.why says how it was chosen)
        # and its kernel module flavour: nvidia-driver-<branch>-open or nvidia-driver-<branch>.
        ("DRIVER_BRANCH", host.branch),
        ("DRIVER_MODULES", host.modules),
        # NVIDIA's per-release toolkit metapackage, cuda-toolkit-<major>-<minor>.
        ("TOOLKIT_PACKAGE", f"cuda-toolkit-{major_minor(s.cuda).replace('.', '-')}" if s.cuda else ""),
    ]
    # Forward compatibility (compat_facts): the package installed, and the directory put first
    # on LD_LIBRARY_PATH for the venv, login shells and the smoke test; both empty otherwise.
    package, directory = compat_facts(lock)
    values += [("COMPAT_PACKAGE", package), ("COMPAT_DIR", directory)]
    values += [("NVSWITCH_FORCED", "1" if host.nvswitch else "0"),
               ("DEFAULT_RUNTIME", host.runtime)]
    # The NVIDIA Container Toolkit pin (matrices/container_toolkit.yaml); empty: rendered without one.
    t = host.toolkit
    values += [("CTK_VERSION", t.version if t else ""), ("CTK_REPO", t.repository if t else ""),
               ("CTK_KEY_URL", t.key_url if t else ""),
               ("CTK_KEY_FINGERPRINT", t.key_fingerprint if t else ""),
               # The GPU container check's image, pinned by digest (never a moving tag).
               ("SMOKE_IMAGE_PINNED", t.smoke_image if t else "")]
    if lock.apt_snapshot is not None:  # the distribution's packages from the archive as of then
        values += [("APT_SNAPSHOT", lock.apt_snapshot), ("APT_SUITE", SUITES[s.ubuntu])]
    if lock.index_url is not None and lock.pylock is None:  # a closure names every file's URL
        values.append(("INDEX_URL", lock.index_url))
    if lock.python_standalone is not None:
        values += [("PYTHON_URL", lock.python_standalone.url),
                   ("PYTHON_SHA256", lock.python_standalone.sha256)]
    return [(name, _word(value)) for name, value in values]


def arrays(lock: Lock) -> list[tuple[str, list[str]]]:
    pins = [f"{name}=={lock.packages[name]}" for name in sorted(lock.packages)]
    return [("TORCH_PINS", [_word(p) for p in pins]),
            ("APT_EXTRA", [_word(p) for p in sorted(lock.apt_packages)]),
            ("PIP_EXTRA", [_word(p) for p in sorted(lock.pip_packages)]),
            # --env: exported in /etc/profile.d/envbuild-env.sh and to the smoke test; with the
            # compile toolchain left out, the variable an image records it with, for the same reader.
            ("ENV_PAIRS", [_word(f"{key}={value}") for key, value in lock.env]
             + ([] if lock.compile_toolchain else [_word(f"{COMPILE_OPT_OUT_ENV}=0")]))]


def context(lock: Lock, layers: Sequence[str] = (), host: HostSetup | None = None) -> dict[str, Any]:
    s = lock.stack
    host = host or default_setup(s.min_driver)
    standalone = None
    if lock.python_standalone is not None:
        standalone = {"url": '"$PYTHON_URL"', "sha256": "$PYTHON_SHA256"}
    return {
        "torch": s.torch, "variant": s.variant, "python": s.python, "ubuntu": s.ubuntu,
        "facts": facts(lock, host), "arrays": arrays(lock), "why": host.why,
        # The shared partials, pointed at the host's paths and the variables above.
        "python_standalone": standalone, "venv": VENV, "python_home": PYTHON_HOME,
        "tarball": TARBALL, "download": "download", "pins": ['"${TORCH_PINS[@]}"'],
        "index_url": '"$INDEX_URL"' if lock.index_url is not None else None,
        "closure": lock.pylock is not None, "layers": list(layers),
        "compile_toolchain": lock.compile_toolchain,  # partials/compile_toolchain.j2
        # linux/arm64 hosts (render/hostsetup.py): each adds only its own lines, so an x86_64
        # script is byte for byte what it was
        "sbsa": host.sbsa, "grace": host.grace, "nvlink5": host.nvlink5,
        # apt-snapshot: only a lock with one adds lines (docs/apt-snapshot.md, "The host script")
        "apt_snapshot": lock.apt_snapshot,
    }


def _smoke() -> bytes:
    from envbuild.smoke.bundle import payload

    return payload()


def render_script(lock: Lock, carried: str | None = None, host: HostSetup | None = None) -> dict[str, bytes]:
    """``install.sh`` with the lock and the smoke test it runs (read beside it); for a locked
    closure also each layer's hash-pinned requirements and the pylock file. ``carried``: the
    lock file text to ship (a closure's lock set of its own target), else the lock itself.
    ``host``: the driver branch, flavour and container runtime (``default_setup`` without it)."""
    check_scriptable(lock)
    files: dict[str, bytes] = {}
    if lock.pylock is not None:
        from envbuild.render.closure import install_files

        # A host fetches every file itself: a wheel the lock names by local path is refused here.
        for name, text in install_files(lock, local_dir=None)[0].items():
            files[f"requirements/{name}.txt"] = text.encode("utf-8")
        files[lock.pylock.file] = lock.pylock.text.encode("utf-8")
    layers = [n.split("/")[1].removesuffix(".txt") for n in sorted(files, key=_layer_order)
              if n.startswith("requirements/")]
    text = environment().get_template("install.sh.j2").render(context(lock, layers, host))
    files.update({"envbuild.lock": (carried or lock.to_json()).encode("utf-8"),
                  "install.sh": text.encode("utf-8"), "smoke.py": _smoke()})
    return dict(sorted(files.items()))


def _layer_order(name: str) -> tuple[bool, str]:
    return (not name.endswith("/torch.txt"), name)  # torch first, then the project
