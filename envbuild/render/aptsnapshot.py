"""``apt-snapshot``: the distribution's apt archive as it was at one time (docs/apt-snapshot.md).

A project names ``apt-snapshot = "20261128T000000Z"`` (the snapshot services' own form, UTC) or
``"auto"``: the lock's date, which is the cut-off (``exclude-newer``) when the project has one, else
the moment of locking less 24 hours, to the second. The lock records the timestamp (``apt_snapshot``)
and the rendered apt steps read Ubuntu's snapshot service or Debian's snapshot archive at that time
(templates/partials/apt_snapshot.j2).

Refused (exit 2): another form; a time less than 24 hours old or in the future (the services serve a
snapshot of a time not yet past, and it changes until that time has passed: a lock must not record
one); for the stack's own Ubuntu image, a time before 1 March 2023, where Ubuntu's service begins.
NVIDIA's apt repositories have no snapshot service: with a snapshot, an apt package of theirs
(``cuda-*``, ``libcudnn*``, ``libnccl*``, ``nvidia-*``, …) must be pinned ``name=version``, and the
step holds it (``apt-mark hold``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

from envbuild.confine import quoted
from envbuild.errors import UsageError

AUTO = "auto"
_FORM = re.compile(r"(?P<d>[0-9]{8})T(?P<t>[0-9]{6})Z", re.ASCII)
UBUNTU_FIRST = "20230301T000000Z"  # Ubuntu's snapshot service covers any time after 1 March 2023
FRESH = timedelta(hours=24)
# The package names NVIDIA's CUDA and machine-learning apt repositories publish under.
_NVIDIA_APT = re.compile(r"(?:cuda|libcudnn|libnccl|libcublas|libcufft|libcurand|libcusolver|libcusparse|"
                         r"libnvjitlink|libnpp|nsight|nvidia|libnvidia|tensorrt|libnvinfer)[a-z0-9+.-]*",
                         re.ASCII)
_HINT = 'write it as "YYYYMMDDTHHMMSSZ" (UTC), e.g. "20261101T000000Z", or "auto"'


def parse_setting(text: str, what: str = "apt-snapshot") -> str:
    """The project's value: "auto" or a well-formed timestamp (its age is checked when locking)."""
    if text == AUTO:
        return text
    instant(text, what)
    return text


def instant(text: str, what: str = "apt-snapshot") -> datetime:
    """``YYYYMMDDTHHMMSSZ`` as an aware UTC datetime; UsageError for another form or no such time."""
    match = _FORM.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise UsageError(f"invalid {what} {quoted(str(text))}", hint=_HINT)
    try:
        return datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise UsageError(f"invalid {what} {quoted(text)} (no such date or time)", hint=_HINT) from None


def stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def resolve(setting: str, *, now: datetime, cutoff: datetime | None, ubuntu_image: bool) -> str:
    """The timestamp a lock records for ``setting``; UsageError when it is too fresh, or before
    Ubuntu's service began for the stack's Ubuntu image."""
    if setting == AUTO:
        chosen = cutoff if cutoff is not None and cutoff <= now - FRESH else now - FRESH
        value = stamp(chosen.replace(microsecond=0))
    else:
        value = setting
    moment = instant(value)
    if moment > now - FRESH:
        raise UsageError(f"apt-snapshot {value} is less than 24 hours old" + (
            " (the cut-off exclude-newer is that recent)" if setting == AUTO else ""),
            hint="a snapshot of a time not yet 24 hours past may still change; choose an earlier time")
    if ubuntu_image and value < UBUNTU_FIRST:
        raise UsageError(f"apt-snapshot {value} is before Ubuntu's snapshot service begins ({UBUNTU_FIRST})",
                         hint="choose a later time")
    return value


def check_nvidia_pins(snapshot: str | None, apt_packages: Iterable[str]) -> None:
    """With a snapshot, every apt package of NVIDIA's repositories pinned ``name=version``."""
    if snapshot is None:
        return
    loose = sorted(p for p in apt_packages if "=" not in p and _NVIDIA_APT.fullmatch(p))
    if loose:
        raise UsageError(f"apt-snapshot dates the distribution's archive, not NVIDIA's repositories, "
                         f"which have no snapshot service: pin {', '.join(loose)} as NAME=VERSION",
                         hint="the version as 'apt-cache policy NAME' names it; the step holds the "
                              "package (apt-mark hold)")


def holds(snapshot: str | None, apt_packages: Iterable[str]) -> list[str]:
    """The names the rendered step holds: NVIDIA's pinned packages, under a snapshot."""
    if snapshot is None:
        return []
    names = (p.split("=", 1)[0] for p in apt_packages if "=" in p)
    return sorted(n for n in names if _NVIDIA_APT.fullmatch(n))


def check_recorded(value: str | None) -> None:
    """A lock's recorded ``apt_snapshot``: None or the timestamp form."""
    if value is not None:
        instant(value, "apt_snapshot in the lock")
