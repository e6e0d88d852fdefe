"""What a closure is resolved from (envbuild/pylock/uv.py): a value of its own, read by the
resolving runs and by the reading of their failures (envbuild/pylock/uvfailure.py) alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PROJECT_NAME = "envbuild-closure"  # the generated project's name (envbuild/pylock/uv.py)


@dataclass(frozen=True)
class ClosureSpec:
    """What to lock. ``torch_pins``: {name: exact version} the stack fixes (torch and its
    companions), taken only from ``torch_index`` (None: the default index and find-links);
    ``dependencies``: the user's PEP 508 requirements; ``torch_constraints``: the user's own
    torch requirements (``torch<2``), passed to uv so that a clash is reported, not hidden;
    ``python``: "3.11"; ``glibc``: the image's, "2.35"; ``default_index``: None = pip's;
    ``previous``: the existing pylock text, whose pins uv keeps unless ``upgrade`` or the
    package is in ``upgrade_packages``; ``uv``: the uv binary (None: the ``uv`` package's)."""

    torch_pins: Mapping[str, str]
    python: str
    glibc: str
    torch_index: str | None = None
    dependencies: tuple[str, ...] = ()
    torch_constraints: tuple[str, ...] = ()
    default_index: str | None = None
    find_links: tuple[str, ...] = ()
    previous: str | None = None
    upgrade: bool = False
    upgrade_packages: tuple[str, ...] = ()
    offline: bool = False
    uv: str | None = None
    installer: str | None = None  # a uv version to pin as the build's installer; None: pip installs
    # Packages taken from their sdist (--no-binary NAME), to be built in the image's build stage.
    no_binary: tuple[str, ...] = ()
    # The project's -c constraints files' lines: uv's --constraints for the closure's run.
    constraints: tuple[str, ...] = ()
    arch: str = "x86_64"  # the target's CPU: aarch64 for a linux/arm64 target (its own pylock)
    # The cut-off (exclude-newer), an RFC 3339 UTC instant: no file uploaded after it
    # (envbuild/pylock/cutoff.py). None: none.
    exclude_newer: str | None = None
    # build-sdists = true: wheels where the chosen release has one for the platform, its sdist
    # where it has none (no --only-binary :all:); those packages are the closure's ``sdists``.
    all_sdists: bool = False
    timeout: float = 300.0
    env: Mapping[str, str] | None = field(default=None, compare=False)  # None: os.environ
