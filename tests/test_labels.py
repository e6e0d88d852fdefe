"""The image's labels (render docker, build): the OCI set, provenance only when known, no empty
value; bad provenance input is exit 2 with nothing written (docs/faults.md I6, I7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.fs import MARKER

ENV = {"ENVBUILD_NO_CACHE": "1"}
CPU = ["--variant", "cpu", "--torch", "2.4.1", "--ubuntu", "22.04"]
CUDA = ["--driver", "550", "--torch", "2.4.1", "--variant", "cu121", "--ubuntu", "22.04"]
SHA = "0123456789abcdef0123456789abcdef01234567"


def render(tmp_path: Path, *argv: str, env: dict[str, str] | None = None,
           name: str = "out") -> dict[str, str]:
    """The Dockerfile's labels, key -> value (unquoted)."""
    out = tmp_path / name
    assert main(["render", "docker", *argv, "-o", str(out)], env={**ENV, **(env or {})}) == 0
    text = (out / "Dockerfile").read_text()
    block = text[text.index("LABEL \\"):text.index("\nUSER ")]
    return dict(re.findall(r'^    ([a-z0-9.-]+)="((?:[^"\\]|\\.)*)"', block, re.MULTILINE))


def test_no_empty_label_and_the_oci_version(tmp_path: Path) -> None:
    """docs/faults.md I6: a CPU image carries no dev.envbuild.cuda="" (nor any empty value);
    version is torch's version and wheel variant; nothing about its provenance is invented."""
    cpu = render(tmp_path, *CPU, name="cpu")
    assert cpu and all(cpu.values()), {k: v for k, v in cpu.items() if not v}
    for absent in ("dev.envbuild.cuda", "dev.envbuild.cudnn", "dev.envbuild.min-driver",
                   "dev.envbuild.arch-list", "org.opencontainers.image.created",
                   "org.opencontainers.image.revision", "org.opencontainers.image.source",
                   "org.opencontainers.image.licenses"):
        assert absent not in cpu
    assert cpu["org.opencontainers.image.version"] == "2.4.1+cpu"
    cuda = render(tmp_path, *CUDA, name="cuda")
    assert all(cuda.values())
    assert cuda["dev.envbuild.cuda"] == "12.1" and cuda["org.opencontainers.image.version"] == "2.4.1+cu121"


def test_provenance_from_flags_and_environment(tmp_path: Path) -> None:
    """created only from SOURCE_DATE_EPOCH (the same on every render), revision and source from
    the flags, else from a GitHub Actions run's variables; the flags win."""
    github = {"GITHUB_SHA": SHA, "GITHUB_SERVER_URL": "https://github.com",
              "GITHUB_REPOSITORY": "acme/models", "SOURCE_DATE_EPOCH": "1700000000"}
    from_env = render(tmp_path, *CPU, env=github, name="env")
    assert from_env["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    assert from_env["org.opencontainers.image.revision"] == SHA
    assert from_env["org.opencontainers.image.source"] == "https://github.com/acme/models"
    again = render(tmp_path, *CPU, env=github, name="again")
    assert again == from_env
    flags = render(tmp_path, *CPU, "--revision", "abcdef1", "--source", "https://git.example/ml/x",
                   env=github, name="flags")
    assert flags["org.opencontainers.image.revision"] == "abcdef1"
    assert flags["org.opencontainers.image.source"] == "https://git.example/ml/x"
    partial = render(tmp_path, *CPU, env={"GITHUB_REPOSITORY": "acme/models"}, name="partial")
    assert "org.opencontainers.image.source" not in partial  # no server URL: unknown, left out


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--revision", "main"], {}, "invalid --revision"),
    (["--revision", 'abcdef1"'], {}, "invalid --revision"),
    (["--source", "https://user:pw@git.example/x"], {}, "credentials"),
    (["--source", "https://git.example/x\nLABEL a=b"], {}, "--source"),
    ([], {"SOURCE_DATE_EPOCH": "yesterday"}, "SOURCE_DATE_EPOCH"),
    ([], {"SOURCE_DATE_EPOCH": "-1"}, "SOURCE_DATE_EPOCH"),
    ([], {"SOURCE_DATE_EPOCH": "99999999999999"}, "SOURCE_DATE_EPOCH"),
    ([], {"GITHUB_SHA": "$(id)"}, "$GITHUB_SHA"),
    ([], {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": 'a/b" x'},
     "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY"),
])
def test_bad_provenance_exits_2_and_writes_nothing(argv: list[str], env: dict[str, str], message: str,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md I7."""
    out = tmp_path / "out"
    code = main(["render", "docker", *CPU, *argv, "-o", str(out)], env={**ENV, **env})
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("envbuild: error[usage]: ") and len(err.strip().splitlines()) == 1
    assert message in err
    assert not out.exists() and not any(p.name == MARKER for p in tmp_path.rglob("*"))


def test_a_lock_without_companions_labels_none() -> None:
    """The stack knows a torchvision for torch 2.13.0; an image built without companions must
    not claim it in its labels."""
    from envbuild.data import matrix as matrixmod
    from envbuild.render import docker as render
    from envbuild.resolver.model import Request
    from envbuild.resolver.resolve import resolve

    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cpu", ubuntu="22.04"), m).stacks[0]
    assert stack.torchvision is not None
    alone = dict(render.labels(render.lock_for(stack, m, render.parse_options(companions=False))))
    both = dict(render.labels(render.lock_for(stack, m, render.parse_options())))
    assert "dev.envbuild.torchvision" not in alone and "dev.envbuild.torchvision" in both
