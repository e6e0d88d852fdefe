"""The installed set: every distribution the running interpreter's environment holds,
compared with a lock that pins the whole environment (one with a ``pylock``).

``smoke.py --installed-only --lock FILE`` runs this comparison alone (the image's build step
after installing); T0's ``lock`` check runs it too. Distributions are found the way
``importlib.metadata`` finds them: ``.dist-info`` (and ``.egg-info``) folders on ``sys.path``,
which in a virtual environment is its site-packages, never the system's. Names are compared
canonical (PEP 503), versions as PEP 440 spellings (``lockfile.canonical_version``).

The venv's own seed distributions are passed over when the lock does not pin them: see
``lockfile.BOOTSTRAP`` for the rule, ``bootstrap_distributions`` for how it is applied.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from .devicecode import device_code_problems
from .lockfile import BOOTSTRAP, canonical_name, diff_installed

DEBIAN_WHEELS = "/usr/share/python-wheels"  # Debian's python3-venv seeds venvs from here


def installed_distributions(paths: Optional[Iterable[str]] = None) -> Tuple[Dict[str, str], List[str]]:
    """({canonical name: version}, problems) of the distributions on ``paths`` (``sys.path``).

    The first found wins, as for imports. A name found more than once is a problem line (a
    leftover ``.dist-info`` beside the installed one, or a copy earlier on the path), and so is
    a metadata folder without a name or version."""
    from importlib import metadata

    search = list(sys.path if paths is None else paths)
    found: Dict[str, str] = {}
    seen: Dict[str, List[str]] = {}
    problems: List[str] = []
    for dist in metadata.distributions(path=search):
        name = dist.metadata["Name"]
        version = dist.version
        if not name or not version:
            problems.append("a distribution without a name or version: %s" % _where(dist))
            continue
        key = canonical_name(str(name))
        seen.setdefault(key, []).append(str(version))
        found.setdefault(key, str(version))
    for key in sorted(seen):
        if len(seen[key]) > 1:
            problems.append("%s: installed more than once (%s)" % (key, ", ".join(seen[key])))
    return found, problems


def _where(dist: Any) -> str:
    path = getattr(dist, "_path", None)  # the folder, where importlib says it (3.8+ does)
    return str(path) if path is not None else "(location unknown)"


def bundled_projects(directories: Optional[Iterable[str]] = None) -> Optional[Set[str]]:
    """Canonical names of the wheels this interpreter seeds venvs with, or None when it
    carries none that can be seen (ensurepip stripped, as distributions may do)."""
    if directories is None:
        directories = [d for d in (_ensurepip_bundled(), DEBIAN_WHEELS) if d]
    names: Set[str] = set()
    for directory in directories:
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        names.update(canonical_name(e.split("-")[0]) for e in entries if e.endswith(".whl"))
    return names or None


def _ensurepip_bundled() -> Optional[str]:
    try:
        from importlib.util import find_spec

        spec = find_spec("ensurepip")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.join(os.path.dirname(spec.origin), "_bundled")


def bootstrap_distributions(
    bundled: Optional[Set[str]] = None, version: Tuple[int, int] = sys.version_info[:2]
) -> Tuple[str, ...]:
    """The seed distributions to pass over (when unpinned): pip always; setuptools and wheel
    when the interpreter carries them for seeding (``bundled``); when it shows no seed
    wheels at all, setuptools on Python < 3.12 (whose ``venv`` still seeded it)."""
    chosen = {"pip"}
    if bundled is None:
        if version < (3, 12):
            chosen.add("setuptools")
    else:
        chosen.update(name for name in BOOTSTRAP if name in bundled)
    return tuple(sorted(chosen))


def compare_installed(
    lock: Mapping[str, Any],
    *,
    paths: Optional[Iterable[str]] = None,
    bootstrap: Optional[Iterable[str]] = None,
) -> List[str]:
    """Every difference between the installed set and the lock's ``packages``, one line each."""
    installed, problems = installed_distributions(paths)
    if bootstrap is None:
        bootstrap = bootstrap_distributions(bundled_projects())
    # The lock's extensions are built at image build time: their versions are not locked, but
    # each must be installed, and nothing else beside the closure.
    extensions = extension_names(lock)
    missing = ["%s: an extension of the lock, not installed" % name
               for name in sorted(extensions - set(installed))]
    rest = {name: version for name, version in installed.items() if name not in extensions}
    # A CUDA extension must hold device code for the stack's GPUs (built with FORCE_CUDA=1 and nvcc).
    device = device_code_problems(lock, paths)
    return problems + missing + device + diff_installed(lock.get("packages") or {}, rest, bootstrap=bootstrap)


def extension_names(lock: Mapping[str, Any]) -> Set[str]:
    """Canonical names of the lock's ``extensions`` (none when absent or malformed)."""
    entries = lock.get("extensions")
    if not isinstance(entries, list):
        return set()
    return {canonical_name(str(e["name"])) for e in entries if isinstance(e, dict) and "name" in e}


def pins_whole_environment(lock: Mapping[str, Any]) -> bool:
    """A lock with a ``pylock`` lists every distribution in ``packages``."""
    return isinstance(lock.get("pylock"), dict)
