"""``envbuild build``, ``envbuild verify`` and ``envbuild clean``: the Docker engine commands.

The engine modules return results and report progress and warnings through callbacks;
here they are printed, the reports written (through ``envbuild.fs``) and verdicts turned
into exit codes.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from envbuild.commands.options import (
    Out,
    add_context_options,
    add_render_options,
    add_selectors,
    progress,
    warn,
)
from envbuild.errors import BuildFailed, GpuRuntimeMissing, SmokeFailed, UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from envbuild.engine.baseos import BaseOs
    from envbuild.engine.build import BuildEvent
    from envbuild.render.lock import Lock


def add_commands(commands: Any) -> None:
    b = commands.add_parser("build", help="render a stack and build its image (a lock: every target's)")
    add_selectors(b)
    add_render_options(b)
    add_context_options(b)
    g = b.add_argument_group("build")
    g.add_argument("--tag", "-t", metavar="NAME[:TAG]",
                   help="image name (default envbuild/torch:<torch>-<variant>-py<python>-<flavor>)")
    g.add_argument("--network", choices=("host", "none", "default"), default="default",
                   help="network of the build's RUN steps")
    g.add_argument("--report", metavar="FILE", help="write the build report (JSON) to FILE")
    g.add_argument("--no-cache", action="store_true", help="build every step again, using no cached layer")
    g.add_argument("--verbose", "-v", action="store_true", help="show every build log line")
    g.add_argument("--accept-rebuilt", action="store_true",
                   help="record the extension wheels built now in envbuild.built.json, replacing the "
                        "sha256 it records for the same build key (default: a differing rebuild fails)")
    g.add_argument("--strict", action="store_true",
                   help="a lock's image whose Debian packages differ from those envbuild.debs.json records "
                        "is exit 6 (default: a warning naming each)")
    g.add_argument("--sbom", action="store_true",
                   help="with --lock: write each target's CycloneDX bill of materials "
                        "(sbom.TARGET.cdx.json beside the lock) after its build, naming the image")
    g.add_argument("--builder", choices=("auto", "buildx", "buildah", "classic"), default="auto",
                   help="docker buildx, buildah or Docker's classic builder (auto: buildx if "
                        "installed, else classic when a daemon answers, else buildah)")
    g.add_argument("--push", metavar="REF",
                   help="push the image to REF (registry/name:tag); prints and records its digest "
                        "(a lock's several targets: REF's tag gets -TARGET)")
    g.add_argument("--no-load", action="store_true",
                   help="buildah: leave the image in buildah's storage, not copied into the Docker "
                        "engine (with --push, verify the pushed digest: the copy of a CUDA image "
                        "takes minutes)")
    g.add_argument("--json", action="store_true",
                   help="print each target's image and registry digest as JSON (schema "
                        "envbuild.build/1, docs/build.md); progress stays on stderr")
    b.set_defaults(run=cmd_build)

    v = commands.add_parser("verify", help="run an image's smoke test in a container")
    v.add_argument("image", help="image built by envbuild (NAME[:TAG], or REF@sha256:… pulled "
                                 "when not local)")
    v.add_argument("--gpus", default="all", metavar="all|N|none", help="GPUs to request")
    v.add_argument("--cpu-ok", action="store_true",
                   help="a CPU-only run passes (GPU checks skipped); runs without GPUs when "
                        "Docker has no GPU runtime")
    v.add_argument("--json", action="store_true", help="print the smoke test's JSON report")
    v.add_argument("--report", metavar="FILE", help="write the JSON report to FILE")
    v.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="deadline for the whole test (default 600)")
    v.add_argument("--memory", default="16g", help="container memory limit (default 16g)")
    v.add_argument("--shm-size", default="2g", help="/dev/shm for DataLoader workers (default 2g)")
    v.add_argument("--tier", type=int, choices=range(5), metavar="N", help="smoke test tiers 0..N")
    v.add_argument("--platform", metavar="linux/amd64|linux/arm64",
                   help="the platform to run: a multi-arch REF@sha256:… pulls that platform's image "
                        "(else the engine's own); an image of another platform is refused")
    v.set_defaults(run=cmd_verify)

    p = commands.add_parser("promote", help="tag a verified image digest in its registry")
    p.add_argument("image", metavar="REF@sha256:DIGEST", help="the pushed image, by digest")
    p.add_argument("tag", metavar="TAG", help="the tag to give that digest in the same repository")
    p.add_argument("--verified-report", metavar="FILE", action="append",
                   help="a passing 'verify --report' of this very digest (with --multiarch: one "
                        "for each image, any order); without it promote runs the smoke test itself first")
    p.add_argument("--multiarch", metavar="REF@sha256:DIGEST", action="append", default=[],
                   help="another platform's image of the same repository (build --lock --push "
                        "prints one per target): TAG then names an OCI image index listing every "
                        "image by digest with its platform")
    p.add_argument("--cpu-ok", action="store_true",
                   help="as verify --cpu-ok (needs --allow-cpu-report: a CPU run proves no GPU works)")
    p.add_argument("--allow-cpu-report", action="store_true",
                   help="accept a smoke test that ran without a GPU (verify --cpu-ok); by default "
                        "promote takes only a run that used a GPU")
    p.add_argument("--gpus", default="all", metavar="all|N|none", help="as verify --gpus")
    p.add_argument("--json", action="store_true", help="print what was tagged as JSON (envbuild.promote/1)")
    p.set_defaults(run=cmd_promote)

    c = commands.add_parser("clean", help="remove containers envbuild left behind")
    c.add_argument("--json", action="store_true", help="print what was removed as JSON (envbuild.clean/1)")
    c.set_defaults(run=cmd_clean)


def _err(text: str) -> None:
    """Build, push and pull progress (none with -q)."""
    progress(text)


def cmd_build(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    """Build one image, or one per target of a lock with several (``build_targets``)."""
    import json

    from envbuild.commands import build_targets as bt
    from envbuild.commands.render import render_context
    from envbuild.engine.build import check_tag, default_tag

    if args.tag:
        check_tag(args.tag)
    if args.push:
        from envbuild.registry.reference import parse_reference

        if parse_reference(args.push).digest is not None:
            raise UsageError(f"--push {args.push!r}: push to a tag, not a digest",
                             hint="registry/name:tag; the digest is printed after the push")
    if args.sbom and not args.lock:
        raise UsageError("--sbom lists what a lock pins: it needs --lock FILE",
                         hint="lock first ('envbuild lock'), then build --lock envbuild.lock --sbom")
    if args.no_load and args.builder != "buildah":
        raise UsageError("--no-load keeps the image in buildah's storage: it needs --builder buildah",
                         hint="the other builders build into the Docker engine; drop --no-load")
    _check_report(args.report)
    timestamp = _source_date_epoch(env)
    names, several = bt.target_names(args)
    # Every target's inputs are checked before a builder is sought.
    rendered = {name: render_context(bt.for_target(args, name), env) for name in names}
    if args.no_load and args.lock:
        _check_no_load([lock for lock, _ in rendered.values()])
    stack_only = sorted(str(name) for name, (lock, _) in rendered.items() if lock.pylock is None)
    if args.sbom and stack_only:  # before any build: the bill of materials needs the closure
        raise UsageError(f"--sbom: target {', '.join(stack_only)} is a stack-only lock: it records no "
                         "closure to list", hint="lock the whole environment with 'envbuild lock'")
    builder, client = _builder(args.builder, env, nocache=args.no_cache, load=not args.no_load)
    say = _err if args.json else out  # --json: stdout holds the document alone
    entries, reports = [], []
    for number, name in enumerate(names, 1):
        lock, files = rendered[name]
        tag = args.tag or default_tag(lock)
        push = args.push
        if several and name is not None:
            tag, push = bt.with_target(tag, name), push and bt.with_target(push, name)
            _err(f"== target {name} ({number}/{len(names)})")
        report = _build_one(bt.for_target(args, name), env, for_platform(builder, lock.stack.platform),
                            client, lock, files, tag=tag, push=push, timestamp=timestamp, say=say)
        reports.append(report)
        entries.append(bt.entry(name, report["tag"], report["image_id"], builder.name, report.get("pushed")))
    if args.report:
        if len(names) == 1 and not several:
            _write_report(args.report, reports[0], sort_keys=True)
        else:
            docs = [{**e, "build": r} for e, r in zip(entries, reports, strict=True)]
            _write_report(args.report, bt.document(docs), sort_keys=True)
    if args.json:
        out(json.dumps(bt.document(entries), indent=2))
    return 0


# The CA bundles envbuild itself trusts, in the order it reads them: pip's (upstream/pipconfig.py),
# then the one uv gets (pylock/uv.py).
CA_VARIABLES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


def _tls_hinted(error: BuildFailed, ca_bundle: str | None, env: Mapping[str, str]) -> BuildFailed:
    """A build step that failed TLS verification (a TLS-inspecting proxy between the build and
    the index): the hint names --ca-bundle and the variable envbuild read its own bundle from."""
    from envbuild.engine.build import tls_failure

    if not tls_failure(error):
        return error
    if ca_bundle:
        hint = (f"the build trusted --ca-bundle {ca_bundle}, yet a step's TLS verification failed "
                "(CERTIFICATE_VERIFY_FAILED): that bundle lacks the proxy's or the server's CA")
    else:
        found = next((name for name in CA_VARIABLES if env.get(name)), None)
        hint = (f"a step's TLS verification failed (CERTIFICATE_VERIFY_FAILED), as behind a TLS-inspecting "
                f"proxy: build with --ca-bundle \"${found}\" (envbuild read {found}={env[found]} for its own "
                "downloads; the image does not keep it)" if found else
                "a step's TLS verification failed (CERTIFICATE_VERIFY_FAILED), as behind a TLS-inspecting "
                f"proxy: build with --ca-bundle FILE holding its CA ({', '.join(CA_VARIABLES)}: none is set)")
    return BuildFailed(error.message, hint=f"{hint}; {error.hint}" if error.hint else hint,
                       details=error.details)


def _build_one(args: argparse.Namespace, env: Mapping[str, str], builder: Any, client: Any,
               lock: Lock, files: Mapping[str, Any], *, tag: str, push: str | None, timestamp: int | None,
               say: Out) -> dict[str, Any]:
    """One image: built from ``files`` (rendered again in BuildKit syntax for buildx and
    buildah: the CA bundle a secret, a pip cache mount), pushed; its report."""
    from pathlib import Path

    from envbuild.commands.render import render_context
    from envbuild.engine.build import build_image, short

    buildkit = builder.name != "docker-sdk"
    found = _base_os(lock, client)
    if buildkit or found is not None:  # BuildKit syntax: the CA bundle a secret, a pip cache mount
        lock, files = render_context(args, env, buildkit=buildkit,
                                     base_os=None if found is None else found.name,
                                     offline_steps=builder.name == "buildx")

    def progress(event: BuildEvent) -> None:
        if event.kind == "step":
            _err(f"[{event.step}/{event.steps}] {short(event.text, 100)}")
        elif event.kind == "download" or args.verbose:
            _err(f"    {event.text}")

    try:
        result = build_image(builder, files, tag=tag,
                             network=None if args.network == "default" else args.network,
                             progress=progress,
                             on_interrupt=client.close if client is not None else lambda: None,
                             buildkit=buildkit, timestamp=timestamp if buildkit else None)
    except BuildFailed as exc:
        raise _tls_hinted(exc, getattr(args, "ca_bundle", None), env) from None
    report = result.to_json()
    size = f"{result.size / 1e9:.2f} GB, " if result.size else ""  # none: not in the Docker engine
    where = "; in buildah's storage only" if builder.name == "buildah" and not builder.loads else ""
    say(f"built {result.tag} with {builder.name} ({result.image_id[:19]}, {size}"
        f"{result.seconds:.0f} s, {result.steps} steps{where})")
    if args.lock and (lock.extensions or lock.sdists):  # their wheels' sha256, beside the lock
        from envbuild.commands.built import record_build

        record_build(client, result.tag, lock, Path(args.lock).absolute().parent, say,
                     accept=args.accept_rebuilt)
    if args.lock:  # the Debian packages the image holds, beside the lock (docs/sbom.md)
        from envbuild.commands.built import record_debs
        from envbuild.render.lockset import DEFAULT_TARGET

        in_engine = client if builder.name != "buildah" or builder.loads else None  # --no-load: not there
        record_debs(in_engine, result.tag, lock, args.target or DEFAULT_TARGET,
                    Path(args.lock).absolute().parent, say, strict=args.strict, accept=args.accept_rebuilt)
        if args.sbom:
            _write_sbom(args, env, result.tag, say)
    if push:
        digest = _push(builder, client, result.tag, push, env)
        repository = push.rpartition(":")[0] if _has_tag(push) else push
        report["pushed"] = {"ref": push, "digest": digest, "pinned": f"{repository}@{digest}"}
        say(f"pushed {report['pushed']['pinned']}")
    return report


def _write_sbom(args: argparse.Namespace, env: Mapping[str, str], image: str, say: Out) -> None:
    """The target's bill of materials beside the lock, naming the image just built (docs/sbom.md)."""
    from pathlib import Path

    from envbuild.commands.sbom import sbom_text
    from envbuild.fs import write_file
    from envbuild.render.lockset import read_lockset

    lock_path = Path(args.lock)
    name, lock = read_lockset(lock_path).select(args.target)
    path = lock_path.absolute().parent / f"sbom.{name}.cdx.json"
    write_file(path, sbom_text(name, lock, path.parent, env=env, image=image).encode("utf-8"))
    say(f"wrote {path}")


def _check_no_load(locks: Sequence[Lock]) -> None:
    """A lock whose build makes wheels (extensions, sdists) records their sha256 read from the
    image in the Docker engine: --no-load would leave nothing there to read."""
    building = sorted({name for lock in locks for name in (*(e.name for e in lock.extensions),
                                                           *lock.sdists)})
    if building:
        raise UsageError(f"--no-load: the lock builds wheels ({', '.join(building)}) whose sha256 envbuild "
                         "records from the image in the Docker engine (envbuild.built.json)",
                         hint="drop --no-load for this lock")


def _base_os(lock: Lock, client: Any) -> BaseOs | None:
    """A --base-image's own OS and glibc, when the engine holds the image; a closure locked for
    a newer glibc than the base's stops here (its wheels would not install)."""
    from envbuild.engine.baseos import read_base_os
    from envbuild.render.docker import custom_base

    if client is None or not custom_base(lock):
        return None
    found = read_base_os(client, lock.base_image)
    if found is None:
        return None
    name = lock.base_image.split("@", 1)[0]
    progress(f"base image {name}: {found.name}, glibc {found.glibc or 'none found'}")
    if lock.pylock is None or found.glibc is None:
        return found
    from envbuild.pylock.files import read_pylock
    from envbuild.pylock.install import unfit_wheels

    unfit = unfit_wheels(read_pylock(lock.pylock.text), python=lock.stack.python,
                         glibc=lock.pylock.glibc, runs_on=found.glibc, arch=lock.pylock.arch)
    if unfit:
        raise BuildFailed(f"base image {name} has glibc {found.glibc}; the lock's closure, resolved for "
                          f"glibc {lock.pylock.glibc}, installs wheels "
                          f"that need a newer one: {', '.join(unfit[:3])}"
                          + (f" and {len(unfit) - 3} more" if len(unfit) > 3 else ""),
                          hint=f'set base-glibc = "{found.glibc}" in the project (or lock --base-glibc '
                               f"{found.glibc}) and lock again: the closure is then resolved for this "
                               "base; or use a base image with a newer glibc")
    return found


def _has_tag(ref: str) -> bool:
    return ":" in ref.rsplit("/", 1)[-1]


def _source_date_epoch(env: Mapping[str, str]) -> int | None:
    text = env.get("SOURCE_DATE_EPOCH")
    if text is None or text == "":
        return None
    if not text.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH={text!r} is not a count of seconds")
    return int(text)


def for_platform(builder: Any, platform: str) -> Any:
    """The builder for one target: an aarch64 target's image is built for linux/arm64 (natively on
    an arm64 host, else under the engine's emulation); an amd64 one as before, by the host."""
    from dataclasses import replace

    return replace(builder, platform=platform) if platform != "linux/amd64" else builder


def _builder(kind: str, env: Mapping[str, str], *, nocache: bool, load: bool = True) -> tuple[Any, Any]:
    """The builder ``--builder`` names (auto: buildx, else classic with a daemon, else
    buildah) and a Docker API client, or None when buildah runs without a daemon. ``load``
    False: buildah leaves its image out of the Docker engine."""
    from envbuild.engine.build import SdkBuilder
    from envbuild.engine.builders import (
        BuildahBuilder,
        BuildxBuilder,
        buildah_available,
        buildx_available,
    )
    from envbuild.engine.clean import warn_leftovers
    from envbuild.engine.daemon import connect
    from envbuild.errors import DockerUnavailable

    if kind == "auto":
        if buildx_available(env):
            kind = "buildx"
        else:
            try:
                client = connect(env)
            except DockerUnavailable:
                if not buildah_available(env):
                    raise
                kind = "buildah"
            else:
                warn_leftovers(client, warn)
                return SdkBuilder(client=client, nocache=nocache), client
    if kind == "buildah":
        if not buildah_available(env):
            raise DockerUnavailable("no buildah program on PATH",
                                    hint="apt-get install buildah, or use --builder classic")
        try:
            client = connect(env)
        except DockerUnavailable:
            client = None  # the image stays in buildah's storage
        return BuildahBuilder(docker=client, nocache=nocache, env=dict(env), load=load), client
    client = connect(env)
    warn_leftovers(client, warn)
    if kind == "buildx":
        if not buildx_available(env):
            raise DockerUnavailable("the docker buildx plugin is not installed",
                                    hint="install it, or use --builder buildah|classic")
        return BuildxBuilder(docker=client, nocache=nocache, env=dict(env)), client
    return SdkBuilder(client=client, nocache=nocache), client


def _push(builder: Any, client: Any, tag: str, ref: str, env: Mapping[str, str]) -> str:
    from envbuild.engine.builders import BuildahBuilder
    from envbuild.engine.publish import push_docker

    if isinstance(builder, BuildahBuilder):
        return builder.push(tag, ref)
    return push_docker(client, tag, ref, lambda text: _err(f"    {text}"), env)


def _check_report(path: str | None) -> None:
    """--report FILE that could never be written is exit 2 before Docker is contacted."""
    from pathlib import Path

    from envbuild.fs import check_file_target

    if path:
        check_file_target(Path(path))


def _write_report(path: str, report: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    import json
    from pathlib import Path

    from envbuild.fs import UnwritableDirectory, write_file

    try:
        write_file(Path(path), (json.dumps(report, indent=2, sort_keys=sort_keys) + "\n").encode())
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {exc.filename}: {exc.strerror}") from None


def cmd_verify(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json

    from envbuild.engine.clean import warn_leftovers
    from envbuild.engine.daemon import connect
    from envbuild.engine.verify import (
        GPU_RUNTIME_HINT,
        VerifyOptions,
        check_options,
        failures,
        verify,
    )

    options = VerifyOptions(gpus=args.gpus, cpu_ok=args.cpu_ok, timeout=args.timeout,
                            memory=args.memory, shm_size=args.shm_size, tier=args.tier,
                            platform=getattr(args, "platform", None))
    check_options(options)
    _check_report(args.report)
    client = connect(env, timeout=max(60.0, args.timeout + 30))
    warn_leftovers(client, warn)
    if "@sha256:" in args.image:
        from envbuild.engine.publish import pull_by_digest
        from envbuild.registry.reference import parse_reference

        parse_reference(args.image)
        pull_by_digest(client, args.image, lambda text: _err(f"    {text}"), platform=options.platform)
    result = verify(client, args.image, options, warn)
    report = result.report or {}
    if args.report:
        # What promote --verified-report checks: which image, by digest, and the verdict.
        _write_report(args.report, {**report, "envbuild.verify": {
            "image": args.image, "digest": _digest_of(client, args.image),
            "exit_code": result.exit_code, "cpu_ok": args.cpu_ok, "tier": args.tier,
            "platform": result.platform, "emulated": result.emulated}})
    if args.json:
        out(json.dumps(report, indent=2))
    else:
        from envbuild.smoke.report import render_text

        out(render_text(report))
    if result.exit_code == 0:
        return 0
    problems = failures(report) or [f"smoke test exited {result.exit_code}"]
    error: SmokeFailed | GpuRuntimeMissing
    if result.exit_code == 8:
        error = GpuRuntimeMissing(f"smoke test: {problems[0]}", details=tuple(problems),
                                  hint="" if result.gpus_requested else GPU_RUNTIME_HINT)
    else:
        error = SmokeFailed(f"smoke test failed: {problems[0]}", details=tuple(problems))
    raise error


def _digest_of(client: Any, image: str) -> str | None:
    """The registry digest of ``image`` when it was pulled or pushed by one, else None."""
    if "@sha256:" in image:
        return image.rpartition("@")[2]
    digests = client.inspect_image(image).get("RepoDigests") or []
    found = {str(d).rpartition("@")[2] for d in digests}
    return found.pop() if len(found) == 1 else None


def cmd_promote(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    """Tag REF@sha256:… as TAG in its registry, after a passing smoke test of that digest:
    the report named by --verified-report, else verify run here and now."""
    import json
    from pathlib import Path

    from envbuild.engine.publish import tag_digest
    from envbuild.registry.reference import parse_reference

    images = [args.image, *args.multiarch]
    digests = []
    for image in images:
        ref = parse_reference(image)
        if ref.digest is None:
            raise UsageError(f"promote needs an image by digest, not {image!r}",
                             hint="REF@sha256:<64 hex>, as 'build --push' prints")
        digests.append(ref.digest)
    if args.cpu_ok and not args.allow_cpu_report:
        raise UsageError("promote --cpu-ok would tag an image no GPU has run",
                         hint="verify it on a GPU, or pass --allow-cpu-report as well")
    reports = [Path(r) for r in args.verified_report or ()]
    if reports:
        _check_verified(reports, digests, allow_cpu=args.allow_cpu_report)
    else:
        for image in images:  # raises on any failure: nothing is tagged
            verify_args = argparse.Namespace(
                image=image, gpus=args.gpus, cpu_ok=args.cpu_ok, timeout=600.0, memory="16g",
                shm_size="2g", tier=None, report=None, json=False)
            # with --json its summary goes to stderr
            cmd_verify(verify_args, env, _err if args.json else out)
    repository = args.image.partition("@")[0]
    repository = repository.rpartition(":")[0] if _has_tag(repository) else repository
    verified_by = ", ".join(args.verified_report or ()) or "verify run here"
    if args.multiarch:
        from envbuild.engine.publish import tag_index

        digest, entries = tag_index(images, args.tag, env)
        if args.json:
            out(json.dumps({"schema": "envbuild.promote/1", "repository": repository, "digest": digest,
                            "tag": args.tag, "verified_by": verified_by,
                            "manifests": [{"digest": e["digest"], "platform": e["platform"]}
                                          for e in entries]}, indent=2))
            return 0
        listed = ", ".join(f"{e['platform']} {e['digest']}" for e in entries)
        out(f"promoted {repository}:{args.tag} as the image index {digest} of {listed}")
        return 0
    digest = tag_digest(args.image, args.tag, env)
    if args.json:
        out(json.dumps({"schema": "envbuild.promote/1", "repository": repository, "digest": digest,
                        "tag": args.tag, "verified_by": verified_by}, indent=2))
        return 0
    out(f"promoted {repository}@{digest} to {repository}:{args.tag}")
    return 0


def _check_verified(paths: list[Path], digests: list[str], *, allow_cpu: bool) -> None:
    """Each digest has a passing report on a GPU among ``paths`` (one per digest, any order)."""
    from envbuild.errors import SmokeFailed

    reports = {str(record.get("digest")): (path, data, record)
               for path, data, record in map(_read_verified, paths)}
    for digest in digests:
        if digest not in reports:
            named = ", ".join(str(p) for p in paths)
            raise UsageError(f"--verified-report {named} verified {', '.join(reports)}, not {digest}",
                             hint="verify the digest you promote")
        path, data, record = reports[digest]
        if record.get("exit_code") != 0:
            raise SmokeFailed(f"--verified-report {path}: the smoke test of {digest} did not pass",
                              hint="nothing was tagged")
        if not allow_cpu and not _ran_on_a_gpu(data, record):
            raise UsageError(f"--verified-report {path} is of a run without a GPU (verify --cpu-ok, or no "
                             "GPU check passed): it proves nothing about the GPU",
                             hint="verify the digest on a GPU machine, or pass --allow-cpu-report")


def _read_verified(path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    import json

    from envbuild.confine import read_confined

    raw = read_confined(path, None, f"--verified-report {path}")  # never blocks on a FIFO
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--verified-report {path}: cannot read it as JSON ({exc})") from None
    record = data.get("envbuild.verify") if isinstance(data, dict) else None
    if not isinstance(record, dict):
        raise UsageError(f"--verified-report {path} is not a report of 'envbuild verify --report'")
    return path, data, record


def _ran_on_a_gpu(report: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Not --cpu-ok, a GPU seen by torch, and at least one GPU check passed."""
    torch = report.get("torch")
    devices = torch.get("devices") if isinstance(torch, dict) else None
    checks = report.get("checks")
    passed = isinstance(checks, list) and any(
        isinstance(c, dict) and c.get("gpu") is True and c.get("status") == "pass" for c in checks)
    return record.get("cpu_ok") is not True and isinstance(devices, list) and bool(devices) and passed


def cmd_clean(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json

    from envbuild.engine.clean import clean
    from envbuild.engine.daemon import connect

    removed = clean(connect(env))
    if args.json:
        out(json.dumps({"schema": "envbuild.clean/1", "removed": list(removed)}, indent=2))
        return 0
    out(f"removed {len(removed)} container(s)" + (f": {' '.join(removed)}" if removed else ""))
    return 0
