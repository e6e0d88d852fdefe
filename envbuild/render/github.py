"""``envbuild ci github``: a GitHub Actions workflow for the stacks under stacks/.

The workflow names no stack: a first job reads ``stacks/matrix.json`` when it runs, the
build job builds each context and pushes it by digest (SBOM and provenance attached), the
verify job runs the baked smoke test of that digest on a self-hosted GPU runner, and the
promote job tags the digest (and signs it, with ``--sign``) only when every verify passed.
YAML is written by ``yaml.safe_dump``; the release of each pinned action is added as a comment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envbuild.errors import DataError
from envbuild.render.ci import CiOptions, CiStack, context_files
from envbuild.render.docker import base_os

if TYPE_CHECKING:
    from envbuild.fs import FileData

WORKFLOW_PATH = ".github/workflows/envbuild.yml"
MATRIX_PATH = "stacks/matrix.json"
# The actions the workflow uses; each is pinned by the commit SHA matrices/ci_actions.yaml records.
CHECKOUT = "actions/checkout"
UPLOAD = "actions/upload-artifact"
DOWNLOAD = "actions/download-artifact"
SETUP_BUILDX = "docker/setup-buildx-action"
LOGIN = "docker/login-action"
METADATA = "docker/metadata-action"
BUILD_PUSH = "docker/build-push-action"
COSIGN = "sigstore/cosign-installer"
HOSTED_RUNNER = "ubuntu-24.04"  # a pinned label: ubuntu-latest moves under the build
# GitHub's hosted arm64 runner (free for public repositories since 2025-01-16, GitHub's changelog as
# cited in isl-org/Open3D#7197, read 2026-11-28): an aarch64 target's image is built natively there
HOSTED_ARM_RUNNER = "ubuntu-24.04-arm"
# The label GitHub gives every self-hosted runner on an arm64 machine (with self-hosted, linux)
SELF_HOSTED_ARM = "ARM64"
# The image's CMD (templates/Dockerfile.j2); a CPU-only stack reruns it with --cpu-ok.
SMOKE_COMMAND = "/opt/venv/bin/python /opt/envbuild/smoke.py --lock /opt/envbuild/envbuild.lock"
# As 'envbuild verify': shared memory for DataLoader workers, no network.
DOCKER_RUN = "docker run --rm --pull always --shm-size 2g --network none"
_USES_RE = re.compile(r"^(?P<head>\s*(?:- )?uses: )(?P<action>[^@\s]+)@(?P<sha>[0-9a-f]{40})$",
                      re.MULTILINE)


def matrix_json(stacks: Sequence[CiStack], options: CiOptions | None = None) -> bytes:
    """One entry per stack; from a lock, each with its verify runner labels (``runs_on``)."""
    include = [{
        "id": s.id, "context": s.context, "gpu": s.gpu, "group": s.group,
        "torch": s.lock.stack.torch, "variant": s.lock.stack.variant,
        "cuda": s.lock.stack.cuda, "python": s.lock.stack.python,
        "ubuntu": s.lock.stack.ubuntu, "os": base_os(s.lock), "flavor": s.lock.flavor,
    } | (_lock_entry(s, options) if options is not None and options.lock is not None else {})
        for s in stacks]
    return (json.dumps({"include": include}, indent=2, sort_keys=True) + "\n").encode("ascii")


def _lock_entry(stack: CiStack, options: CiOptions) -> dict[str, Any]:
    """A lock target's runners: its image built on a hosted runner of its own platform (no
    emulation), verified on its runs-on labels, else the self-hosted GPU runners of its platform."""
    arm = stack.lock.stack.platform == "linux/arm64"
    default = ("self-hosted", SELF_HOSTED_ARM, *options.runner_labels) if arm else (
        "self-hosted", *options.runner_labels)
    return {"runs_on": list(stack.runs_on or default), "platform": stack.lock.stack.platform,
            "build_on": HOSTED_ARM_RUNNER if arm else HOSTED_RUNNER}


def registry_host(registry: str) -> str | None:
    """The registry part of a repository, as Docker reads it; None is Docker Hub."""
    first, sep, _ = registry.partition("/")
    return first if sep and ("." in first or ":" in first or first == "localhost") else None


def _uses(options: CiOptions, action: str) -> str:
    """``owner/name@<full commit SHA>``; the release tag is added as a comment on write."""
    for name, _, sha in options.actions:
        if name == action:
            return f"{action}@{sha}"
    raise DataError(f"ci_actions.yaml has no row for {action}",
                    hint="add the action's release tag and commit SHA (matrices/README.md)")


def _login(options: CiOptions, *, when: str | None = None) -> dict[str, Any]:
    host = registry_host(options.registry)
    if host == "ghcr.io":  # the job's own token, with the permissions granted per job
        creds = {"registry": host, "username": "${{ github.actor }}",
                 "password": "${{ secrets.GITHUB_TOKEN }}"}
    else:
        creds = {**({"registry": host} if host else {}),
                 "username": "${{ secrets.REGISTRY_USERNAME }}",
                 "password": "${{ secrets.REGISTRY_PASSWORD }}"}
    step: dict[str, Any] = {"name": f"Log in to {host or 'Docker Hub'}"}
    if when is not None:
        step["if"] = when
    return {**step, "uses": _uses(options, LOGIN), "with": creds}


def _permissions(options: CiOptions, packages: str, *, contents: bool,
                 id_token: bool = False) -> dict[str, str]:
    """GITHUB_TOKEN reaches packages only on ghcr.io; elsewhere it needs none."""
    granted = {"contents": "read"} if contents else {}
    if registry_host(options.registry) == "ghcr.io":
        granted["packages"] = packages
    if id_token:  # keyless signing: the job's OIDC token is the signing identity
        granted["id-token"] = "write"
    return granted


def _lines(items: Sequence[str]) -> str:
    return "".join(f"{item}\n" for item in items)


def _checkout(options: CiOptions) -> dict[str, Any]:
    # No token left in .git/config for later steps to read.
    return {"uses": _uses(options, CHECKOUT), "with": {"persist-credentials": False}}


def _metadata(options: CiOptions) -> dict[str, Any]:
    """Tags and labels from docker/metadata-action. The stack's own title, description and
    version (torch version + variant, as the Dockerfile's labels) replace the repository's."""
    labels = [f"{k}={v}" for k, v in options.labels] + [
        "org.opencontainers.image.title=envbuild torch ${{ matrix.torch }} ${{ matrix.variant }}",
        "org.opencontainers.image.description=PyTorch ${{ matrix.torch }} (${{ matrix.variant }})"
        " on Python ${{ matrix.python }}, ${{ matrix.os }}",
        "org.opencontainers.image.version=${{ matrix.torch }}+${{ matrix.variant }}",
        "dev.envbuild.stack=${{ matrix.id }}"]
    return {"id": "meta", "name": "Tags and labels", "uses": _uses(options, METADATA), "with": {
        "images": "${{ env.IMAGE }}",
        "tags": _lines(["type=raw,value=${{ matrix.id }}",
                        "type=raw,value=${{ matrix.id }}-${{ github.sha }}"]),
        "labels": _lines(labels)}}


def _cache(options: CiOptions, pushing: str) -> dict[str, str]:
    """A registry cache beside the image by default: CUDA layers are gigabytes, and GitHub's
    Actions cache holds 10 GB per repository. Exported only by runs that push."""
    if options.cache == "gha":
        return {"cache-from": "type=gha,scope=${{ matrix.id }}",
                "cache-to": "type=gha,mode=max,scope=${{ matrix.id }}"}
    ref = "${{ env.IMAGE }}:cache-${{ matrix.id }}"
    return {"cache-from": f"type=registry,ref={ref}",
            "cache-to": f"${{{{ {pushing} && format('type=registry,ref={{0}}:cache-{{1}},mode=max', "
                        "env.IMAGE, matrix.id) || '' }}"}


def _download_digest(options: CiOptions) -> dict[str, Any]:
    return {"name": "Download the digest", "uses": _uses(options, DOWNLOAD),
            "with": {"name": "digest-${{ matrix.id }}", "path": "digests"}}


# The digest this run pushed, read from the file the build job uploaded, checked for shape.
_READ_DIGEST = ['digest="$(cat "digests/$STACK_ID")"',
                'case "$digest" in sha256:*) ;; *) echo "bad digest: $digest" >&2; exit 1 ;; esac',
                'ref="$IMAGE@$digest"']


# Hosted runners have about 14 GB free; CUDA images need more. These trees are the runner
# image's preinstalled SDKs, none of which a Docker build uses.
FREE_DISK = _lines(["sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc "
                    "/opt/hostedtoolcache/CodeQL",
                    "sudo docker image prune --all --force", "df -h /"])


def _lock_check(options: CiOptions) -> dict[str, Any]:
    """From a lock: 'envbuild lock --check' before anything is built (offline: no resolver runs)."""
    from envbuild import __version__

    return {"name": "The lock matches the project", "runs-on": HOSTED_RUNNER, "timeout-minutes": 10,
            "permissions": {"contents": "read"},
            "steps": [_checkout(options),
                      {"name": "envbuild lock --check",
                       "env": {"ENVBUILD_VERSION": __version__, "LOCK": options.lock},
                       # the stacks/ this workflow builds are the lock's too; -P: the checkout's
                       # own envbuild/ (or yaml/, …) is not imported in its place (3.12 there)
                       "run": _lines(['python3 -m pip install --user "envbuild==$ENVBUILD_VERSION"',
                                      'python3 -P -m envbuild lock --check --output "$LOCK" '
                                      '--stacks stacks'])}]}


def _from_lock(options: CiOptions, body: dict[str, Any]) -> dict[str, Any]:
    """``ci github --lock``: the lock checked first, disk freed before each build, and each
    target verified on its own runner labels (the matrix entry's ``runs_on``)."""
    assert options.lock is not None
    jobs = body["jobs"]
    jobs["build"]["needs"] = ["matrix", "lock-check"]
    jobs["build"]["runs-on"] = "${{ matrix.build_on }}"  # an aarch64 target on an arm runner
    jobs["build"]["steps"].insert(0, {"name": "Free disk space", "run": FREE_DISK})
    build = next(step for step in jobs["build"]["steps"] if step.get("id") == "build")
    build["with"] = {**build["with"], "platforms": "${{ matrix.platform }}"}
    jobs["verify"]["runs-on"] = "${{ matrix.runs_on }}"
    jobs["verify"]["name"] = "Verify ${{ matrix.id }} on its runners"
    body["jobs"] = {"lock-check": _lock_check(options), **jobs}
    for trigger in ("push", "pull_request"):
        body["on"][trigger]["paths"] = [*body["on"][trigger]["paths"], options.lock, "pylock*.toml",
                                        "envbuild.toml", "pyproject.toml"]
    return body


def workflow(options: CiOptions) -> dict[str, Any]:
    body = _workflow(options)
    return body if options.lock is None else _from_lock(options, body)


def _workflow(options: CiOptions) -> dict[str, Any]:
    """The workflow as data. It names no stack: the matrix is read from matrix.json when the
    workflow runs, so editing stacks/ needs no new workflow.

    build pushes by digest only (no tag); verify runs that digest on the GPU runner; promote
    tags it (``docker buildx imagetools create``) only after every verify job passed."""
    paths = ["stacks/**", WORKFLOW_PATH]
    matrix = "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    pushing = "github.event_name != 'pull_request'"
    stack_env = {"STACK_ID": "${{ matrix.id }}"}
    read_matrix = _lines(["{", "  echo 'matrix<<ENVBUILD_MATRIX_EOF'", f"  cat {MATRIX_PATH}",
                          "  echo 'ENVBUILD_MATRIX_EOF'", '} >> "$GITHUB_OUTPUT"'])
    record_digest = _lines([
        'case "$DIGEST" in sha256:*) ;; *) echo "no digest: $DIGEST" >&2; exit 1 ;; esac',
        'mkdir -p digests', 'printf \'%s\\n\' "$DIGEST" > "digests/$STACK_ID"'])
    promote = _lines([*_READ_DIGEST, "args=()",
                      'while IFS= read -r tag; do [ -n "$tag" ] && args+=(--tag "$tag"); done <<< "$TAGS"',
                      'docker buildx imagetools create "${args[@]}" "$ref"'])
    promote_steps: list[dict[str, Any]] = [
        _download_digest(options),
        {"uses": _uses(options, SETUP_BUILDX)},
        _login(options),
        _metadata(options),
        {"name": "Tag the verified digest", "env": {**stack_env, "TAGS": "${{ steps.meta.outputs.tags }}"},
         "run": promote},
    ]
    if options.sign:
        promote_steps += [
            {"name": "Install cosign", "uses": _uses(options, COSIGN)},
            {"name": "Sign the digest (keyless)", "env": stack_env,
             "run": _lines([*_READ_DIGEST, 'cosign sign --yes "$ref"'])},
        ]
    return {
        "name": "envbuild",
        "on": {
            "push": {"branches": [options.branch], "paths": paths},
            "pull_request": {"paths": paths},
            "workflow_dispatch": {"inputs": {"image": {
                "description": "image repository to push to (tags are the stack ids)",
                "type": "string", "required": False, "default": options.registry}}},
        },
        "permissions": {},  # each job asks for what it needs
        "env": {"IMAGE": f"${{{{ inputs.image || '{options.registry}' }}}}"},
        "jobs": {
            "matrix": {
                "name": "Read the stack matrix",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 5,
                "permissions": {"contents": "read"},
                "outputs": {"matrix": "${{ steps.read.outputs.matrix }}"},
                "steps": [_checkout(options),
                          {"id": "read", "name": f"Read {MATRIX_PATH}", "run": read_matrix}],
            },
            "build": {
                "name": "Build ${{ matrix.id }}",
                "needs": "matrix",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 120,
                "permissions": _permissions(options, "write", contents=True),
                "strategy": {"fail-fast": False, "matrix": matrix},
                "steps": [
                    _checkout(options),
                    {"uses": _uses(options, SETUP_BUILDX)},  # BuildKit: caches, attestations
                    _login(options, when=pushing),
                    _metadata(options),
                    {"id": "build", "name": "Build and push by digest",
                     "uses": _uses(options, BUILD_PUSH), "with": {
                         "context": "${{ matrix.context }}",
                         "labels": "${{ steps.meta.outputs.labels }}",
                         # No tag yet: the image is published under a tag only once verified.
                         "outputs": "type=image,name=${{ env.IMAGE }},push-by-digest=true,"
                                    f"name-canonical=true,push=${{{{ {pushing} }}}}",
                         "sbom": True,
                         "provenance": "mode=max",
                         **_cache(options, pushing),
                     }},
                    {"name": "Record the digest", "if": pushing,
                     "env": {**stack_env, "DIGEST": "${{ steps.build.outputs.digest }}"},
                     "run": record_digest},
                    {"name": "Upload the digest", "if": pushing, "uses": _uses(options, UPLOAD),
                     "with": {"name": "digest-${{ matrix.id }}", "path": "digests/${{ matrix.id }}",
                              "if-no-files-found": "error", "retention-days": 1}},
                ],
            },
            "verify": {
                "name": "Verify ${{ matrix.id }} on a GPU",
                "needs": ["matrix", "build"],
                "if": pushing,  # pull requests push nothing to pull
                "runs-on": ["self-hosted", *options.runner_labels], "timeout-minutes": 30,
                "permissions": _permissions(options, "read", contents=False),
                "strategy": {"fail-fast": False, "matrix": matrix},
                "steps": [
                    _download_digest(options),
                    _login(options),
                    {"name": "Smoke test on the GPU", "if": "${{ matrix.gpu }}", "env": stack_env,
                     "run": _lines([*_READ_DIGEST, f'{DOCKER_RUN} --gpus all "$ref"'])},
                    {"name": "Smoke test (CPU-only stack)", "if": "${{ !matrix.gpu }}",
                     "env": stack_env,
                     "run": _lines([*_READ_DIGEST, f'{DOCKER_RUN} "$ref" {SMOKE_COMMAND} --cpu-ok'])},
                ],
            },
            "promote": {
                "name": "Tag ${{ matrix.id }}",
                # Every verify job must pass: one failing stack holds the whole fleet back.
                "needs": ["matrix", "verify"],
                "if": pushing,
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 15,
                "permissions": _permissions(options, "write", contents=False, id_token=options.sign),
                "strategy": {"fail-fast": False, "matrix": matrix},
                "steps": promote_steps,
            },
        },
    }


def workflow_yaml(options: CiOptions) -> bytes:
    import yaml

    class Dumper(yaml.SafeDumper):
        """safe_dump, with multi-line strings (run scripts, tag lists) as literal blocks."""

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                       style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]  # no &id001
    body = yaml.dump(workflow(options), Dumper=Dumper, sort_keys=False,
                     default_flow_style=False, width=4096, allow_unicode=False)
    versions = {name: version for name, version, _ in options.actions}
    body = _USES_RE.sub(lambda m: f"{m[0]} # {versions[m['action']]}", body)
    header = ("# Generated by 'envbuild ci github': build and push by digest, verify on a GPU\n"
              "# runner, then tag. The matrix is read from stacks/matrix.json when the workflow runs.\n"
              "# Actions are pinned by commit SHA (matrices/ci_actions.yaml), the release in a comment.\n")
    return (header + body).encode("ascii")


def render_github(stacks: Sequence[CiStack], options: CiOptions) -> dict[str, FileData]:
    files = {WORKFLOW_PATH: workflow_yaml(options), MATRIX_PATH: matrix_json(stacks, options)}
    return dict(sorted({**files, **context_files(stacks)}.items()))
