"""``envbuild sbom --lock envbuild.lock``: a CycloneDX 1.6 JSON bill of materials per target
(envbuild/sbom/cyclonedx.py), from the lock, its pylock files and what ``build --lock`` recorded
beside them (the Debian packages, envbuild.debs.json; the built extension wheels,
envbuild.built.json). Written atomically as ``sbom.TARGET.cdx.json`` in ``-o DIR`` (default: the
lock's directory); ``--stdout`` prints the one target's document instead. ``--attach
REF@sha256:…`` also pushes the target's document to the image's registry as an OCI artifact
referring to that image (envbuild/registry/referrers.py), once the image is seen to be the
target's (envbuild/sbom/image.py)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from envbuild.commands.options import Out, warn
from envbuild.errors import UsageError

CYCLONEDX_JSON = "application/vnd.cyclonedx+json"  # the document's IANA media type, the artifact's type

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from envbuild.registry.client import RegistryClient
    from envbuild.registry.referrers import Descriptor


def add_commands(commands: Any) -> None:
    p = commands.add_parser("sbom", help="write a CycloneDX bill of materials per target of a lock")
    p.add_argument("--lock", required=True, metavar="FILE", help="envbuild.lock (its pylock files beside it)")
    p.add_argument("--target", metavar="NAME", help="only this target (default: every target)")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="where sbom.TARGET.cdx.json goes (default: the lock's directory)")
    p.add_argument("--stdout", action="store_true",
                   help="print the one target's document instead of writing it")
    p.add_argument("--attach", metavar="REF@sha256:DIGEST",
                   help="also push the document to the image's registry, attached to that image "
                        "(OCI referrers; the tag sha256-HEX where the registry has no referrers API)")
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
    if args.attach is not None and (args.stdout or len(names) != 1):
        raise UsageError("--attach pushes one target's document to its image: "
                         + ("it writes the file, not --stdout" if args.stdout else
                            f"the lock holds {len(names)} targets"),
                         hint="choose one with --target NAME" if not args.stdout else "drop --stdout")
    if args.stdout and len(names) != 1:
        raise UsageError(f"--stdout prints one document: the lock holds {len(names)} targets",
                         hint="choose one with --target NAME")
    directory = Path(args.output_dir) if args.output_dir else lock_path.absolute().parent
    if not args.stdout and not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    image = None
    if args.attach is not None:  # the document names the image it is attached to
        from envbuild.redact import redact
        from envbuild.registry.reference import parse_reference

        if parse_reference(args.attach).digest is None:
            raise UsageError(f"--attach needs the image by digest, not {redact(args.attach)!r}",
                             hint="write REF@sha256:<64 hex>, as build --push printed it")
        image = redact(args.attach)
    documents = {name: sbom_text(name, lockset.targets[name], lock_path.absolute().parent, env=env,
                                 image=image)
                 for name in names}
    # Asked of the registry once the lock is seen to list a closure, before anything is written.
    target = _attach_target(args.attach, lockset.targets[names[0]], env) if args.attach else None
    if args.stdout:
        out(documents[names[0]].rstrip("\n"))
        return 0
    from envbuild.fs import replace_files

    files = {directory / f"sbom.{name}.cdx.json": text.encode("utf-8") for name, text in documents.items()}
    replace_files(files)
    for path in sorted(files):
        out(f"wrote {path}")
    if target is not None:
        _attach(*target, names[0], documents[names[0]].encode("utf-8"), out)
    return 0


def _attach_target(ref: str, lock: Any, env: Mapping[str, str]) -> tuple[RegistryClient, Descriptor]:
    """The registry client for ``ref`` and its image's descriptor, once its digest is seen to
    name, in its registry, an image whose config agrees with ``lock`` (platform, envbuild's
    labels: envbuild/sbom/image.py); UsageError if not."""
    from envbuild.redact import redact, server_text
    from envbuild.registry.client import RegistryClient
    from envbuild.registry.digest import image_config
    from envbuild.registry.reference import parse_reference
    from envbuild.registry.referrers import IMAGE_MANIFESTS, read_manifest
    from envbuild.sbom.image import differences

    parsed = parse_reference(ref)
    digest = parsed.digest or ""  # checked by cmd_sbom
    client = RegistryClient(parsed.registry, parsed.name, env=env, timeout=60.0, subject=redact(ref))
    found = read_manifest(client, digest)
    if found is None:
        raise UsageError(f"{redact(ref)}: the registry has no manifest {digest} in {parsed.name}",
                         hint="attach to the digest build --push printed for this target")
    subject, manifest = found
    if subject.media_type not in IMAGE_MANIFESTS:
        raise UsageError(f"{redact(ref)} is no single image ({server_text(subject.media_type, 80)})",
                         hint="attach to the target's own image, as build --push printed it")
    problems = differences(image_config(client, redact(ref), manifest), lock)
    if problems:
        raise UsageError(f"{redact(ref)} is not the image this target describes: {'; '.join(problems)}",
                         hint="attach to the image build --lock pushed for this target")
    return client, subject


def _attach(client: RegistryClient, subject: Descriptor, name: str, document: bytes, out: Out) -> None:
    from envbuild.registry.referrers import attach

    done = attach(client, subject, document, artifact_type=CYCLONEDX_JSON,
                  annotations={"dev.envbuild.target": name}, title=f"sbom.{name}.cdx.json")
    where = ("the registry's referrers API lists it" if done.via == "api" else
             f"listed in the tag {done.tag} (the referrers tag schema: this registry has no referrers API)"
             + ("; it was listed already" if done.listed_before else ""))
    out(f"attached sbom.{name}.cdx.json to {client.subject} as {done.artifact.digest}: {where}")


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
