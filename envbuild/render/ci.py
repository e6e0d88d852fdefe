"""``envbuild ci github|bake``: CI for a fleet of resolved stacks.

The resolver's top N stacks each become one lock and one build context, rendered by
``envbuild.render`` exactly as ``render docker`` would, under ``stacks/<id>/``. Around
them: a GitHub Actions workflow (a matrix read from ``stacks/matrix.json``, build and
push with layer caching, then the baked smoke test on a self-hosted GPU runner) or a
``docker-bake.hcl`` (one target per stack, a group per CUDA major).

Every user string is validated before anything is rendered; YAML is written by
``yaml.safe_dump`` and HCL strings by ``hcl_string``, so no value can end a quoted string
or open an expression. Output goes through ``render.write_output``: complete or untouched.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.errors import UsageError
from envbuild.render.lock import Lock, check_image_reference, check_url, distro_python

if TYPE_CHECKING:
    from envbuild.data.matrix import Matrix
    from envbuild.fs import FileData
    from envbuild.render.docker import Out
    from envbuild.resolver.model import Stack

WORKFLOW_PATH = ".github/workflows/envbuild.yml"
MATRIX_PATH = "stacks/matrix.json"
BAKE_PATH = "docker-bake.hcl"
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

_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_RUNNER_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
_BRANCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", re.ASCII)
_LABEL_KEY_RE = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*", re.ASCII)
# No quotes, '$', '{', '#', ',' or backslash: a value stays one item in every list it joins.
_LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9._:/+@%~()=-]+(?: [A-Za-z0-9._:/+@%~()=-]+)*)?",
                             re.ASCII)
_RESERVED_LABELS = ("com.docker.", "io.docker.", "org.dockerproject.", "dev.envbuild.")


@dataclass(frozen=True, slots=True, kw_only=True)
class CiOptions:
    registry: str  # image repository, no tag: tags are the stack ids
    runner_labels: tuple[str, ...] = ("gpu",)  # besides self-hosted
    labels: tuple[tuple[str, str], ...] = ()
    branch: str = "main"


@dataclass(frozen=True, slots=True, kw_only=True)
class CiStack:
    id: str
    lock: Lock
    files: Mapping[str, FileData]  # the build context, as render docker writes it

    @property
    def gpu(self) -> bool:
        return self.lock.stack.variant != "cpu"

    @property
    def group(self) -> str:
        cuda = self.lock.stack.cuda
        if not self.gpu:
            return "cpu"
        return f"cuda{cuda.split('.')[0]}" if cuda else "gpu"  # a CUDA wheel with no recorded CUDA

    @property
    def context(self) -> str:
        return f"stacks/{self.id}"


# --- validation -------------------------------------------------------------------------


def parse_ci_options(*, registry: str, runner_labels: Sequence[str] = (),
                     labels: Sequence[str] = (), branch: str = "main") -> CiOptions:
    return CiOptions(
        registry=check_registry(registry),
        runner_labels=tuple(dict.fromkeys(
            check_runner_label(v) for v in (runner_labels or ["gpu"]) if v != "self-hosted")),
        labels=tuple(sorted(dict(check_label(v) for v in labels).items())),
        branch=check_branch(branch),
    )


def check_registry(value: str) -> str:
    """An image repository without tag or digest: ``<value>:<stack id>`` must be a reference."""
    try:
        check_image_reference(f"{value}:tag", "--registry")
    except UsageError:
        raise UsageError(f"invalid --registry {value!r}",
                         hint="an image repository without tag or digest, lowercase, "
                              "e.g. ghcr.io/acme/envbuild") from None
    return value


def check_runner_label(value: str) -> str:
    if not _RUNNER_LABEL_RE.fullmatch(value):
        raise UsageError(f"invalid --gpu-runner-label {value!r}",
                         hint="letters, digits, '.', '_' and '-', at most 64 characters")
    return value


def check_branch(value: str) -> str:
    if not _BRANCH_RE.fullmatch(value) or ".." in value or "//" in value or value.endswith("/"):
        raise UsageError(f"invalid --branch {value!r}",
                         hint="a branch name: letters, digits, '.', '_', '-' and '/'")
    return value


def check_label(value: str) -> tuple[str, str]:
    key, sep, text = value.partition("=")
    if not sep or len(key) > 128 or not _LABEL_KEY_RE.fullmatch(key):
        raise UsageError(f"invalid --label {value!r}",
                         hint="KEY=VALUE with a lowercase dotted KEY, e.g. org.example.team=ml")
    if key.startswith(_RESERVED_LABELS):
        raise UsageError(f"--label key {key!r} is reserved",
                         hint=f"keys under {', '.join(_RESERVED_LABELS)} belong to Docker or envbuild")
    if len(text) > 256 or not _LABEL_VALUE_RE.fullmatch(text):
        raise UsageError(f"invalid --label value {text!r}",
                         hint="at most 256 of letters, digits, single spaces and . _ : / + @ % ~ ( ) = -")
    return key, text


# --- stacks -----------------------------------------------------------------------------


def stack_id(stack: Stack) -> str:
    """Stable and a valid image tag: torch2.4.1-cu121-py3.11-ubuntu22.04[-devel]."""
    text = f"torch{stack.torch}-{stack.variant}-py{stack.python}-ubuntu{stack.ubuntu}"
    text += "-devel" if stack.flavor == "devel" else ""
    if not _TAG_RE.fullmatch(text):  # the lock validated each part; this guards the shape
        raise UsageError(f"stack id {text!r} is not a valid image tag")
    return text


def target_name(sid: str) -> str:
    """Bake target names allow only [a-zA-Z0-9_-]; dots become underscores, as buildx does."""
    return sid.replace(".", "_")


def select_stacks(stacks: Sequence[Stack], matrix: Matrix, *, top: int, index_url: str | None = None,
                  package_index: str | None = None) -> tuple[list[CiStack], list[str]]:
    """The first ``top`` stacks that render with their Ubuntu's python3, and the ids skipped.

    A stack whose Python is not the distro's needs a standalone build pinned by URL and
    sha256, one per Python: that is a single-stack choice ('envbuild render docker').
    The wheel index, as for render docker: ``index_url`` (--index-url), else the stack's
    own, else ``package_index`` ($PIP_INDEX_URL, for the 'default' variant)."""
    from envbuild.data.peaks import peaks_json
    from envbuild.render.docker import RenderOptions, lock_for, render_docker

    peaks = peaks_json(matrix)
    chosen: list[CiStack] = []
    skipped: list[str] = []
    for stack in stacks:
        if len(chosen) == top:
            break
        sid = stack_id(stack)
        if any(c.id == sid for c in chosen):
            continue
        if distro_python(matrix, stack.ubuntu) != stack.python:
            skipped.append(sid)
            continue
        index = index_url or stack.index_url or package_index
        options = RenderOptions(index_url=None if index is None else check_url(index, "--index-url"))
        lock = lock_for(stack, matrix, options)
        chosen.append(CiStack(id=sid, lock=lock, files=render_docker(lock, options, peaks=peaks)))
    if not chosen:
        raise UsageError(f"none of the compatible stacks uses its Ubuntu release's python3 "
                         f"(skipped {', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})",
                         hint="choose --python to match --ubuntu, or render one stack with "
                              "'envbuild render docker --python-url ... --python-sha256 ...'")
    return chosen, skipped


def context_files(stacks: Sequence[CiStack]) -> dict[str, FileData]:
    return {f"{s.context}/{name}": data for s in stacks for name, data in s.files.items()}


# --- GitHub Actions ---------------------------------------------------------------------


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


# --- docker buildx bake -----------------------------------------------------------------


def hcl_escape(value: str) -> str:
    """The body of an HCL quoted string: backslash escapes for quotes, backslashes and
    anything not printable ASCII, and the template openers doubled ("${" is "$${", "%{" is
    "%%{"), so no value can end the string or start an interpolation."""
    out = []
    for char in value:
        code = ord(char)
        if char in _HCL_ESCAPES:
            out.append(_HCL_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        else:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(out).replace("${", "$${").replace("%{", "%%{")


_HCL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def hcl_string(value: str) -> str:
    return f'"{hcl_escape(value)}"'


def _hcl_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(items) + "]"


def _registry_ref(tag: str, *, cache: str | None = None) -> str:
    """``"${REGISTRY}:<tag>"``, the one interpolation (the file's own variable); with
    ``cache``, a registry cache reference with those extra parameters. Escaped as one
    piece: two escaped halves could join into a "${"."""
    if cache is None:
        return f'"${{REGISTRY}}:{hcl_escape(tag)}"'
    return f'"type=registry,ref=${{REGISTRY}}:{hcl_escape(tag + cache)}"'


def _group_order(name: str) -> tuple[int, int, str]:
    """cuda11 before cuda12 before cuda13 (numerically), then the others by name."""
    if name.startswith("cuda") and name[4:].isdigit():
        return (0, int(name[4:]), name)
    return (1, 0, name)


def bake_hcl(stacks: Sequence[CiStack], options: CiOptions) -> bytes:
    groups: dict[str, list[str]] = {}
    for s in stacks:
        groups.setdefault(s.group, []).append(target_name(s.id))
    order = sorted(groups, key=_group_order)
    lines = [
        "# Generated by 'envbuild ci bake': one target per resolved stack, run from this folder.",
        "#   docker buildx bake            all stacks (group default)",
        *(f"#   docker buildx bake {g:<10} the {g} stacks" for g in order),
        "# The registry cache needs a BuildKit builder ('docker buildx create --use') and push",
        "# rights; --set '*.cache-to=' builds without exporting it.",
        "",
        'variable "REGISTRY" {',
        f"  default = {hcl_string(options.registry)}",
        "}",
        "",
        'group "default" {',
        f"  targets = {_hcl_list([hcl_string(target_name(s.id)) for s in stacks])}",
        "}",
    ]
    for group in order:
        lines += ["", f"group {hcl_string(group)} {{",
                  f"  targets = {_hcl_list([hcl_string(t) for t in groups[group]])}", "}"]
    for s in stacks:
        labels = sorted([*options.labels, ("dev.envbuild.stack", s.id)])
        lines += [
            "", f"target {hcl_string(target_name(s.id))} {{",
            f"  context = {hcl_string(s.context)}",
            f"  dockerfile = {hcl_string('Dockerfile')}",
            f"  tags = {_hcl_list([_registry_ref(s.id)])}",
            "  labels = {",
            *(f"    {hcl_string(k)} = {hcl_string(v)}" for k, v in labels),
            "  }",
            f"  cache-from = {_hcl_list([_registry_ref('cache-' + s.id, cache='')])}",
            f"  cache-to = {_hcl_list([_registry_ref('cache-' + s.id, cache=',mode=max')])}",
            "}",
        ]
    return ("\n".join(lines) + "\n").encode("ascii")


def render_bake(stacks: Sequence[CiStack], options: CiOptions) -> dict[str, FileData]:
    return dict(sorted({BAKE_PATH: bake_hcl(stacks, options), **context_files(stacks)}.items()))


# --- command line (cli.py registers these lazily) ---------------------------------------


def add_commands(commands: Any, add_selectors: Callable[[argparse.ArgumentParser], None],
                 parser_class: type[argparse.ArgumentParser]) -> None:
    """``envbuild ci github`` and ``envbuild ci bake``."""
    p = commands.add_parser("ci", help="CI for the top stacks: GitHub Actions or docker-bake.hcl")
    sub = p.add_subparsers(dest="ci_target", metavar="TARGET", required=True,
                           parser_class=parser_class)
    g = sub.add_parser("github", help="a workflow: matrix build, push, verify on a GPU runner")
    _add_common(g, add_selectors)
    g.add_argument("--gpu-runner-label", action="append", default=[], metavar="LABEL",
                   help="label of the self-hosted GPU runner (repeatable; default: gpu)")
    g.add_argument("--branch", default="main", help="push images from this branch (default main)")
    g.set_defaults(run=cmd_ci_github)
    b = sub.add_parser("bake", help="a docker-bake.hcl: a target per stack, groups per CUDA major")
    _add_common(b, add_selectors)
    b.set_defaults(run=cmd_ci_bake)


def _add_common(p: argparse.ArgumentParser,
                add_selectors: Callable[[argparse.ArgumentParser], None]) -> None:
    add_selectors(p)
    g = p.add_argument_group("ci")
    g.add_argument("--top", type=_top, default=4, metavar="N", help="the N best stacks (default 4)")
    g.add_argument("--registry", required=True, metavar="REF",
                   help="image repository, no tag (e.g. ghcr.io/acme/envbuild)")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="image label added to every stack (repeatable)")
    g.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    g.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def _top(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _plan(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[list[CiStack], list[str]]:
    from envbuild.commands.cli import load_matrix
    from envbuild.resolver.explain import explain_failure
    from envbuild.resolver.resolve import resolve
    from envbuild.resolver.selection import Selectors, build_request

    matrix = load_matrix(args, env)
    request = build_request(Selectors.of(args), matrix, env)
    resolution = resolve(request, matrix)
    if not resolution.stacks:
        raise explain_failure(request, matrix, resolution)
    return select_stacks(resolution.stacks, matrix, top=args.top, index_url=args.index_url,
                         package_index=request.package_index)


def _run(args: argparse.Namespace, env: Mapping[str, str], out: Out,
         render: Callable[[Sequence[CiStack], CiOptions], dict[str, FileData]]) -> int:
    from envbuild.render.docker import write_output

    options = parse_ci_options(registry=args.registry,
                               runner_labels=getattr(args, "gpu_runner_label", ()),
                               labels=args.label, branch=getattr(args, "branch", "main"))
    stacks, skipped = _plan(args, env)
    write_output(render(stacks, options), Path(args.output), force=args.force)
    count = f"{len(stacks)} stack{'s' if len(stacks) != 1 else ''}"
    out(f"wrote {args.output}/ with {count}: {', '.join(s.id for s in stacks)}")
    if skipped:
        out(f"note: skipped {len(skipped)} stacks whose Python is not their Ubuntu's python3 "
            f"({', '.join(skipped)})")
    return 0


def cmd_ci_github(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    return _run(args, env, out, render_github)


def cmd_ci_bake(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    return _run(args, env, out, render_bake)

