"""``envbuild build --lock`` of a lock with several targets: one image per target with the
target in its tag, pushed by digest per target, and the ``envbuild.build/1`` JSON document
(docs/faults.md U10). buildah is a stand-in program here: it records argv, replays a step,
writes the --iidfile and, for a push, a --digestfile of its own per reference."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import schemas

from envbuild.commands import build_targets as bt
from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.render import docker as render
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

IMAGE_ID = "sha256:" + "ab" * 32


def stand_in_buildah(directory: Path) -> Path:
    script = directory / "buildah"
    script.write_text(f"""#!/usr/bin/env python3
import hashlib, json, sys
args = sys.argv[1:]
with open({str(directory / 'argv.jsonl')!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "info" in args:
    print("overlay"); sys.exit(0)
if "build" in args:
    print("STEP 1/1: FROM base")
    open(args[args.index("--iidfile") + 1], "w").write({IMAGE_ID!r})
    sys.exit(0)
if "push" in args:
    digest = "sha256:" + hashlib.sha256(args[-1].encode()).hexdigest()
    open(args[args.index("--digestfile") + 1], "w").write(digest)
    sys.exit(0)
sys.exit(1)
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture(scope="module")
def two_targets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cpu", ubuntu="22.04"), m).stacks[0]
    lock = render.lock_for(stack, m, render.parse_options(companions=False))
    lock = replace(lock, base_image="mirror.example/ubuntu:22.04@sha256:" + "c" * 64,
                   base_digest="sha256:" + "c" * 64)
    directory = tmp_path_factory.mktemp("lock")
    locks = lockset.LockSet(targets={"a10": lock, "h100": lock}, project=None)
    for name, data in locks.files().items():
        (directory / name).write_bytes(data)
    return directory / "envbuild.lock"


def test_every_target_is_built_tagged_and_pushed_and_named_in_the_json(
        two_targets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stand_in_buildah(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-config"))
    report = tmp_path / "build.json"
    code = main(["build", "--lock", str(two_targets), "--builder", "buildah", "--tag", "ml/torch:2.14",
                 "--push", "127.0.0.1:5000/ml/torch:candidate", "--json", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)  # stdout holds the document alone
    schemas.check("build.schema.json", document)
    assert document["schema"] == bt.BUILD_SCHEMA == "envbuild.build/1"
    expected = []
    for name in ("a10", "h100"):
        ref = f"127.0.0.1:5000/ml/torch:candidate-{name}"
        digest = "sha256:" + hashlib.sha256(f"docker://{ref}".encode()).hexdigest()
        expected.append({"target": name, "image": f"ml/torch:2.14-{name}", "image_id": IMAGE_ID,
                         "builder": "buildah", "digest": digest, "ref": f"127.0.0.1:5000/ml/torch@{digest}"})
    assert document["targets"] == expected
    assert "== target a10 (1/2)" in err and "== target h100 (2/2)" in err and "built ml/torch:2.14-a10" in err
    written = json.loads(report.read_text())
    assert [t["target"] for t in written["targets"]] == ["a10", "h100"] and "build" in written["targets"][0]
    argv = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert sum("build" in a for a in argv) == 2 and sum("push" in a for a in argv) == 2
    # --target NAME: that target alone, its name still in the tag.
    (tmp_path / "argv.jsonl").unlink()
    argv = ["build", "--lock", str(two_targets), "--builder", "buildah", "--target", "h100", "--json"]
    assert main(argv) == 0
    only = json.loads(capsys.readouterr().out)["targets"]
    assert [(t["target"], t["digest"], t["ref"]) for t in only] == [("h100", None, None)]
    assert only[0]["image"].endswith("-h100")


def test_the_target_goes_into_the_tag_after_any_registry_port() -> None:
    assert bt.with_target("127.0.0.1:5000/ml/torch", "a10") == "127.0.0.1:5000/ml/torch:a10"
    assert bt.with_target("127.0.0.1:5000/ml/torch:rc1", "a10") == "127.0.0.1:5000/ml/torch:rc1-a10"
    assert bt.with_target("torch", "h100") == "torch:h100"
