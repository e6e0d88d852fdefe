"""``envbuild sbom --lock envbuild.lock``: a CycloneDX 1.6 JSON bill of materials per target
(envbuild/sbom/cyclonedx.py), from the lock, its pylock files and what ``build --lock`` recorded
beside them (the Debian packages, envbuild.debs.json; the built extension wheels,
envbuild.built.json). Written atomically as ``sbom.TARGET.cdx.json`` in ``-o DIR`` (default: the
lock's directory); ``--stdout`` prints the one target's document instead."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from envbuild.commands.options import Out, warn
from envbuild.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def add_commands(commands: Any) -> None:
    p = commands.add_parser("sbom", help="write a CycloneDX bill of materials per target of a lock")
    p.add_argument("--lock", required=True, metavar="FILE", help="envbuild.lock (its pylock files beside it)")
    p.add_argument("--target", metavar="NAME", help="only this target (default: every target)")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="where sbom.TARGET.cdx.json goes (default: the lock's directory)")
    p.add_argument("--stdout", action="store_true",
                   help="print the one target's document instead of writing it")
    p.set_defaults(run=cmd_sbom)


def cmd_sbom(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from pathlib import Path

    from envbuild.render.lockset import check_target_name, read_lockset

    lock_path = Path(args.lock)
    lockset = read_lockset(lock_path)
    if args.target is not None:
        check_target_name(args.target)
        names = [lockset.select(args.target)[0]]
    else:
        names = sorted(lockset.targets)
    if args.stdout and len(names) != 1:
        raise UsageError(f"--stdout prints one document: the lock holds {len(names)} targets",
                         hint="choose one with --target NAME")
    directory = Path(args.output_dir) if args.output_dir else lock_path.absolute().parent
    if not args.stdout and not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    documents = {name: sbom_text(name, lockset.targets[name], lock_path.absolute().parent, env=env)
                 for name in names}
    if args.stdout:
        out(documents[names[0]].rstrip("\n"))
        return 0
    from envbuild.fs import replace_files

    files = {directory / f"sbom.{name}.cdx.json": text.encode("utf-8") for name, text in documents.items()}
    replace_files(files)
    for path in sorted(files):
        out(f"wrote {path}")
    return 0


def sbom_text(name: str, lock: Any, lock_dir: Path, *, env: Mapping[str, str],
              image: str | None = None) -> str:
    """The CycloneDX document of target ``name`` as text, with what the records beside the lock
    hold for it."""
    from envbuild.extensions.record import read_record
    from envbuild.pylock.files import read_pylock
    from envbuild.render.closure import build_keys
    from envbuild.sbom import cyclonedx
    from envbuild.sbom.debs import read_record as read_debs

    if lock.pylock is None:
        raise UsageError(f"target {name!r} is a stack-only lock: it records no closure to list",
                         hint="lock the whole environment with 'envbuild lock'")
    record = read_record(lock_dir)
    built = [record[k] for k in build_keys(lock) if k in record]
    debs = read_debs(lock_dir).get(name)
    if debs is None:
        warn(f"target {name}: no Debian packages recorded (envbuild.debs.json): 'build --lock' records them; "
             "the bill of materials lists the Python layer and the base image only")
    doc = cyclonedx.document(name, lock, read_pylock(lock.pylock.text), debs=debs, built=built, image=image,
                             env=env)
    return cyclonedx.text(doc)
