"""``exclude-newer``: the cut-off date of a closure (a cooldown for new uploads).

A project (``exclude-newer = "30 days"``) or ``envbuild lock --exclude-newer`` names either an
RFC 3339 timestamp (``2026-11-01T00:00:00Z``, ``2026-11-01T01:00:00+01:00``) or a span of days
(``30 days``, ``1 day``, ISO 8601's ``P30D`` or ``P4W``). uv 0.13 accepts all of these itself,
but envbuild turns a span into one timestamp when it locks (now, less the span, to the second,
in UTC), hands uv only that (``--exclude-newer``) and records it in the lock, so the lock says
which day it stands for and a second lock with the same setting reuses it (``lock --upgrade``
moves it). Months and years are refused, as uv refuses them: their length varies.

The stack's own pins (torch and its companions, exact versions from the matrices) are taken
past the cut-off's filter (uv's ``--exclude-newer-package NAME=false``): PyTorch's indexes give
no upload time for many files (pytorch/pytorch#186905), and uv drops a file without one when a
cut-off is set. Where their index does give one, envbuild holds it to the cut-off after uv ran
(:func:`late_files`), as ``lock --check`` holds every file the pylock records with an
``upload-time``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from envbuild.confine import quoted
from envbuild.errors import UsageError

_TIMESTAMP = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?P<fraction>\.[0-9]{1,9})?(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})", re.ASCII)
_DAYS = re.compile(r"(?P<n>[0-9]{1,5}) ?(?P<unit>days?|weeks?)", re.ASCII)
_ISO_SPAN = re.compile(r"P(?P<n>[0-9]{1,5})(?P<unit>[DW])", re.ASCII)
_MONTHS = re.compile(r"[0-9]+ ?(?:months?|years?|y|mo)|P[0-9]+[MY]", re.ASCII | re.IGNORECASE)
_HINT = ('an RFC 3339 timestamp ("2026-11-01T00:00:00Z") or a span of days ("30 days", "P30D", '
         '"P4W")')
MAX_DAYS = 36500


@dataclass(frozen=True, slots=True, kw_only=True)
class Cutoff:
    """The setting as given (``given``), its span in days when it is one (else None), and,
    for a timestamp, the instant it names."""

    given: str
    days: int | None = None
    instant: datetime | None = None

    def at(self, now: datetime) -> datetime:
        """The instant this setting stands for when locking at ``now`` (UTC, whole seconds)."""
        if self.instant is not None:
            return self.instant
        assert self.days is not None
        return (now.astimezone(timezone.utc) - timedelta(days=self.days)).replace(microsecond=0)


def parse_cutoff(text: str, what: str = "exclude-newer") -> Cutoff:
    """``text`` as a :class:`Cutoff`; a UsageError (exit 2) naming ``what`` when it is none."""
    if not isinstance(text, str) or len(text) > 64:
        raise UsageError(f"invalid {what} {quoted(str(text))}", hint=_HINT)
    stripped = text.strip()
    span = _DAYS.fullmatch(stripped) or _ISO_SPAN.fullmatch(stripped)
    if span is not None:
        days = int(span["n"]) * (7 if span["unit"][0] in "wW" else 1)
        if not 0 < days <= MAX_DAYS:
            raise UsageError(f"invalid {what} {quoted(text)} (from 1 to {MAX_DAYS} days)", hint=_HINT)
        return Cutoff(given=stripped, days=days)
    if _MONTHS.fullmatch(stripped):
        raise UsageError(f"invalid {what} {quoted(text)}: months and years vary in length",
                         hint='count days instead, e.g. "365 days"')
    return Cutoff(given=stripped, instant=parse_timestamp(stripped, what))


def parse_timestamp(text: str, what: str) -> datetime:
    """An RFC 3339 timestamp with its offset, as an aware UTC datetime (whole seconds)."""
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise UsageError(f"invalid {what} {quoted(text)}", hint=_HINT)
    offset = "+00:00" if match["offset"] in "Zz" else match["offset"]
    try:
        parsed = datetime.fromisoformat(f"{match['date']}T{match['time']}{offset}")
    except ValueError:
        raise UsageError(f"invalid {what} {quoted(text)} (no such date or time)", hint=_HINT) from None
    if parsed.year < 1970:
        raise UsageError(f"invalid {what} {quoted(text)} (before 1970)", hint=_HINT)
    return parsed.astimezone(timezone.utc)


def format_instant(instant: datetime) -> str:
    """``2026-11-01T00:00:00Z``: the form the lock records and uv is given."""
    return instant.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def late_files(uploads: dict[str, list[tuple[str, datetime]]], cutoff: datetime) -> list[str]:
    """``name version (file, upload time)`` for every file uploaded after ``cutoff``;
    ``uploads``: {"name version": [(file name, upload time)]}."""
    late = []
    for package, files in sorted(uploads.items()):
        for filename, uploaded in files:
            if uploaded > cutoff:
                late.append(f"{package} ({filename}, uploaded {format_instant(uploaded)})")
    return late
