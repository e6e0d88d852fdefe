"""What ``build``, ``render`` and ``lock --check`` say about the built extension wheels recorded
beside the lock (envbuild/extensions/record.py): after a build, the record is written (atomically)
with each newly built wheel's sha256; render and ``lock --check`` say, per build key, what is
recorded. After a ``build --lock`` the image's Debian packages are recorded and compared the same
way (envbuild/sbom/debs.py, ``record_debs``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from envbuild.commands.options import warn
from envbuild.render.lock import Lock

WHEELS_FILE = "/opt/envbuild/extension-wheels.sha256"  # templates/partials/extensions_install.j2


def describe(lock: Lock, lock_dir: Path, target: str | None = None) -> list[str]:
    """One line per build key of ``lock``: the wheel recorded for it, or none yet."""
    from envbuild.extensions.record import read_record
    from envbuild.render.closure import build_keys

    keys = build_keys(lock)
    if not keys:
        return []
    record = read_record(lock_dir)
    prefix = f"target {target}: " if target else ""
    lines = []
    for key in keys:
        built = record.get(key)
        lines.append(f"{prefix}extension {key.shown()}: " + (
            f"built wheel recorded, {built.wheel} sha256 {built.sha256}" if built is not None
            else "no built wheel recorded yet (the next build records it)"))
    return lines


def record_build(client: Any, image: str, lock: Lock, lock_dir: Path, say: Callable[[str], None], *,
                 accept: bool = False) -> None:
    """Read the built wheels' sha256 from ``image`` and record them for the lock's build keys:
    new keys added, recorded ones compared (a difference is BuildFailed, exit 6, unless
    ``accept``: then the new sha256 replaces the old, each replacement warned)."""
    from envbuild.extensions.record import FILE, merge, parse_sums, read_record, record_path, record_text
    from envbuild.fs import write_file
    from envbuild.render.closure import build_keys

    keys = build_keys(lock)
    if not keys:
        return
    if client is None:
        warn(f"the built extension wheels were not recorded in {FILE}: no Docker daemon answers to read "
             "them from the image (buildah alone)")
        return
    from envbuild.engine.imagefile import read_image_file

    data = read_image_file(client, image, WHEELS_FILE)
    if data is None:
        warn(f"the image holds no readable {WHEELS_FILE}: its extension wheels were not recorded in {FILE}")
        return
    record = read_record(lock_dir)
    sums = parse_sums(data.decode("ascii", "replace"))
    kept = {k: v for k, v in record.items() if not accept or k not in keys}
    updated = merge(kept, keys, sums)
    for key in keys:
        old, now = record.get(key), updated[key]
        if old is not None and old.sha256 != now.sha256:
            warn(f"--accept-rebuilt: {key.shown()}: {FILE} now records {now.wheel} sha256 {now.sha256} "
                 f"(was {old.sha256})")
    if updated != record:
        write_file(record_path(lock_dir), record_text(updated).encode("utf-8"))
    new = [k for k in keys if k not in record]
    same = [k for k in keys if k in record and record[k] == updated[k]]
    say(f"extension wheels: {len(new)} recorded in {FILE}, {len(same)} matched its record"
        + (f", {len(keys) - len(new) - len(same)} replaced (--accept-rebuilt)" if accept else ""))


def record_debs(client: Any, image: str, lock: Lock, target: str, lock_dir: Path, say: Callable[[str], None],
                *, strict: bool = False, accept: bool = False) -> None:
    """Read ``image``'s installed Debian packages and record them for ``target`` beside the lock;
    a target recorded for the same lock is compared instead: every differing package named in
    one warning (the first record kept), BuildFailed (exit 6) with ``strict``, or recorded anew
    with ``accept``."""
    import hashlib

    from envbuild.errors import BuildFailed
    from envbuild.fs import write_file
    from envbuild.sbom.debs import (
        FILE,
        OS_RELEASE,
        STATUS,
        STATUS_LIMIT,
        Debs,
        differences,
        os_id,
        parse_status,
        read_record,
        record_path,
        record_text,
    )

    if client is None:
        warn(f"the image's Debian packages were not recorded in {FILE}: no Docker daemon holds the image "
             "to read them from")
        return
    from envbuild.engine.imagefile import read_image_file

    status = read_image_file(client, image, STATUS, limit=STATUS_LIMIT)
    if status is None:
        warn(f"the image holds no readable {STATUS}: its Debian packages were not recorded in {FILE}")
        return
    # /etc/os-release is a link to /usr/lib/os-release on Debian and Ubuntu: the file is read where it is.
    release = (read_image_file(client, image, OS_RELEASE)
               or read_image_file(client, image, "/usr/lib/os-release"))
    now = Debs(packages=parse_status(status.decode("utf-8", "replace")),
               os=None if release is None else os_id(release.decode("utf-8", "replace")),
               lock_sha256=hashlib.sha256(lock.to_json().encode("utf-8")).hexdigest())
    record = read_record(lock_dir)
    old = record.get(target)
    if old is not None and old.lock_sha256 == now.lock_sha256:
        changed = differences(old.packages, now.packages)
        if not changed:
            say(f"Debian packages: {len(now.packages)}, as {FILE} records for target {target}")
            return
        listed = "; ".join(changed)
        if strict and not accept:
            raise BuildFailed(f"the image's Debian packages differ from those {FILE} records for target "
                              f"{target} ({len(changed)}): {listed}",
                              hint="the archive moved since the first build: pin apt-snapshot, or record "
                                   "the new set with --accept-rebuilt")
        if not accept:
            warn(f"the image's Debian packages differ from those {FILE} records for target {target} "
                 f"({len(changed)}; the record is kept, --strict fails the build): {listed}")
            return
        warn(f"--accept-rebuilt: {FILE} now records target {target}'s Debian packages as built now: {listed}")
    write_file(record_path(lock_dir), record_text({**record, target: now}).encode("utf-8"))
    again = " (the record of another lock of this target replaced)" if old is not None and not accept else ""
    say(f"Debian packages: {len(now.packages)} recorded in {FILE} for target {target}{again}")
