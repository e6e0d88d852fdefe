"""``envbuild ci github``: a GitHub Actions workflow for the stacks under stacks/.

The workflow names no stack: a first job reads ``stacks/matrix.json`` when it runs, the
build job builds and pushes each context with layer caching, and the verify job runs the
baked smoke test on a self-hosted GPU runner. YAML is written by ``yaml.safe_dump``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envbuild.render.ci import CiOptions, CiStack, context_files

if TYPE_CHECKING:
    from envbuild.fs import FileData

WORKFLOW_PATH = ".github/workflows/envbuild.yml"
MATRIX_PATH = "stacks/matrix.json"
# Major tags from each action's README (checkout, setup-buildx, login, build-push).
CHECKOUT = "actions/checkout@v7"
SETUP_BUILDX = "docker/setup-buildx-action@v4"
LOGIN = "docker/login-action@v4"
BUILD_PUSH = "docker/build-push-action@v7"
HOSTED_RUNNER = "ubuntu-24.04"  # a pinned label: ubuntu-latest moves under the build
# The image's CMD (templates/Dockerfile.j2); a CPU-only stack reruns it with --cpu-ok.
SMOKE_COMMAND = "/opt/venv/bin/python /opt/envbuild/smoke.py --lock /opt/envbuild/envbuild.lock"
# As 'envbuild verify': shared memory for DataLoader workers, no network.
DOCKER_RUN = "docker run --rm --pull always --shm-size 2g --network none"


def matrix_json(stacks: Sequence[CiStack]) -> bytes:
    include = [{
        "id": s.id, "context": s.context, "gpu": s.gpu, "group": s.group,
        "torch": s.lock.stack.torch, "variant": s.lock.stack.variant,
        "cuda": s.lock.stack.cuda, "python": s.lock.stack.python,
        "ubuntu": s.lock.stack.ubuntu, "flavor": s.lock.flavor,
    } for s in stacks]
    return (json.dumps({"include": include}, indent=2, sort_keys=True) + "\n").encode("ascii")


def registry_host(registry: str) -> str | None:
    """The registry part of a repository, as Docker reads it; None is Docker Hub."""
    first, sep, _ = registry.partition("/")
    return first if sep and ("." in first or ":" in first or first == "localhost") else None


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
    return {**step, "uses": LOGIN, "with": creds}


def _permissions(options: CiOptions, packages: str, *, contents: bool) -> dict[str, str]:
    """GITHUB_TOKEN reaches packages only on ghcr.io; elsewhere it needs none."""
    granted = {"contents": "read"} if contents else {}
    if registry_host(options.registry) == "ghcr.io":
        granted["packages"] = packages
    return granted


def _lines(items: Sequence[str]) -> str:
    return "".join(f"{item}\n" for item in items)


def workflow(options: CiOptions) -> dict[str, Any]:
    """The workflow as data. It names no stack: the matrix is read from matrix.json when the
    workflow runs, so editing stacks/ needs no new workflow."""
    paths = ["stacks/**", WORKFLOW_PATH]
    matrix = "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    pushing = "github.event_name != 'pull_request'"
    image = "${{ env.IMAGE }}:${{ matrix.id }}"
    labels = [f"{k}={v}" for k, v in options.labels] + [
        "dev.envbuild.stack=${{ matrix.id }}",
        "org.opencontainers.image.revision=${{ github.sha }}",
        "org.opencontainers.image.source=${{ github.server_url }}/${{ github.repository }}"]
    run_env = {"REF": image + "-${{ github.sha }}"}  # exactly the image this run pushed
    read_matrix = _lines(["{", "  echo 'matrix<<ENVBUILD_MATRIX_EOF'", f"  cat {MATRIX_PATH}",
                          "  echo 'ENVBUILD_MATRIX_EOF'", '} >> "$GITHUB_OUTPUT"'])
    return {
        "name": "envbuild",
        "on": {
            "push": {"branches": [options.branch], "paths": paths},
            "pull_request": {"paths": paths},
            "workflow_dispatch": {"inputs": {"image": {
                "description": "image repository to push to (tags are the stack ids)",
                "type": "string", "required": False, "default": options.registry}}},
        },
        "permissions": {"contents": "read"},
        "env": {"IMAGE": f"${{{{ inputs.image || '{options.registry}' }}}}"},
        "jobs": {
            "matrix": {
                "name": "Read the stack matrix",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 5,
                "outputs": {"matrix": "${{ steps.read.outputs.matrix }}"},
                "steps": [{"uses": CHECKOUT},
                          {"id": "read", "name": f"Read {MATRIX_PATH}", "run": read_matrix}],
            },
            "build": {
                "name": "Build ${{ matrix.id }}",
                "needs": "matrix",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 120,
                "permissions": _permissions(options, "write", contents=True),
                "strategy": {"fail-fast": False, "matrix": matrix},
                "steps": [
                    {"uses": CHECKOUT},
                    {"uses": SETUP_BUILDX},  # a BuildKit builder: the gha cache needs one
                    _login(options, when=pushing),
                    {"name": "Build and push", "uses": BUILD_PUSH, "with": {
                        "context": "${{ matrix.context }}",
                        "push": f"${{{{ {pushing} }}}}",
                        "tags": _lines([image, image + "-${{ github.sha }}"]),
                        "labels": _lines(labels),
                        "cache-from": "type=gha,scope=${{ matrix.id }}",
                        "cache-to": "type=gha,mode=max,scope=${{ matrix.id }}",
                    }},
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
                    _login(options),
                    {"name": "Smoke test on the GPU", "if": "${{ matrix.gpu }}", "env": run_env,
                     "run": f'{DOCKER_RUN} --gpus all "$REF"\n'},
                    {"name": "Smoke test (CPU-only stack)", "if": "${{ !matrix.gpu }}",
                     "env": run_env, "run": f'{DOCKER_RUN} "$REF" {SMOKE_COMMAND} --cpu-ok\n'},
                ],
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
    header = ("# Generated by 'envbuild ci github': build, push and verify the stacks in stacks/.\n"
              "# The matrix is read from stacks/matrix.json when the workflow runs.\n")
    return (header + body).encode("ascii")


def render_github(stacks: Sequence[CiStack], options: CiOptions) -> dict[str, FileData]:
    files = {WORKFLOW_PATH: workflow_yaml(options), MATRIX_PATH: matrix_json(stacks)}
    return dict(sorted({**files, **context_files(stacks)}.items()))
