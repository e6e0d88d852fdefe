"""The CLI's conveniences (#29): completion scripts from the parser, `config show` with origins,
JSON Schema files for the documented --json contracts, validated against real output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from envbuild.commands.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "docs" / "schemas"
jsonschema = pytest.importorskip("jsonschema")


def run(capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    code = main(argv, env=env)
    out = capsys.readouterr()
    return code, out.out, out.err


def valid(schema_name: str, document: Any) -> None:
    schema = json.loads((SCHEMAS / schema_name).read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(schema)(schema).validate(document)


def base_env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "ENVBUILD_NO_CACHE": "1", "PATH": os.environ.get("PATH", "")}


# --- completion -----------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_know_every_command(shell: str, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    code, out, _ = run(capsys, ["completion", shell], base_env(tmp_path))
    assert code == 0
    for command in ("resolve", "lock", "render", "build", "verify", "matrix", "config", "completion"):
        assert command in out, f"{shell} completion lacks {command}"
    assert "--driver" in out and "--flavor" in out  # options come from the parser, not a list
    if shell == "bash" and shutil.which("bash"):
        script = tmp_path / "envbuild.bash"
        script.write_text(out, encoding="utf-8")
        checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr


def test_completion_for_an_unknown_shell_is_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, ["completion", "powershell5"], base_env(tmp_path))
    assert code == 2 and out == ""
    assert err.startswith("envbuild: error[usage]:")


def test_bash_completion_completes_a_subcommand(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Load the script into a real bash and ask it what `envbuild re<TAB>` offers."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    code, out, _ = run(capsys, ["completion", "bash"], base_env(tmp_path))
    assert code == 0
    script = tmp_path / "envbuild.bash"
    script.write_text(out, encoding="utf-8")
    probe = (f"source {script}; COMP_WORDS=(envbuild re); COMP_CWORD=1; COMP_LINE='envbuild re'; "
             "COMP_POINT=${#COMP_LINE}; _shtab_envbuild envbuild re envbuild; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=False, timeout=30)
    offered = set(done.stdout.split())
    assert {"resolve", "render"} <= offered, (done.stdout, done.stderr)
    assert "lock" not in offered


# --- config show ----------------------------------------------------------------------------


def settings_of(out: str) -> dict[str, dict[str, Any]]:
    document = json.loads(out)
    valid("config.schema.json", document)
    return {s["name"]: s for s in document["settings"]}


def test_config_show_names_each_origin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envbuild.toml").write_text(
        'torch = "2.13.0"\nindex-url = "https://mirror.example/simple"\n'
        '[[targets]]\nname = "a10"\ngpus = ["A10"]\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    env = {**base_env(tmp_path), "ENVBUILD_MATRICES": str(ROOT / "matrices"),
           "PIP_INDEX_URL": "https://other.example/simple", "DOCKER_HOST": "tcp://127.0.0.1:2375"}
    code, out, _ = run(capsys, ["config", "show", "--json"], env)
    assert code == 0
    found = settings_of(out)
    assert found["index-url"]["value"] == "https://mirror.example/simple"
    assert found["index-url"]["origin"] == "project file envbuild.toml"  # the project beats the environment
    assert found["torch"] == {"name": "torch", "value": "2.13.0", "origin": "project file envbuild.toml"}
    assert found["cuda"]["value"] is None and found["cuda"]["origin"].startswith("default")
    assert found["matrices"]["origin"] == "environment ENVBUILD_MATRICES"
    assert found["docker-host"] == {"name": "docker-host", "value": "tcp://127.0.0.1:2375",
                                    "origin": "environment DOCKER_HOST"}
    assert found["targets"]["value"] == "a10"
    assert found["project-file"]["origin"] == "found in the current directory"
    # a flag beats the project file
    flag = ["--index-url", "https://flag.example/simple"]
    code, out, _ = run(capsys, ["config", "show", "--json", *flag], env)
    assert settings_of(out)["index-url"]["origin"] == "flag --index-url"
    # without a project: the environment's index
    code, out, _ = run(capsys, ["config", "show", "--json", "--no-project"], env)
    after = settings_of(out)
    assert after["index-url"] == {"name": "index-url", "value": "https://other.example/simple",
                                  "origin": "environment PIP_INDEX_URL"}
    assert after["project-file"]["value"] is None


def test_config_show_never_prints_a_password(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {**base_env(tmp_path), "PIP_INDEX_URL": "https://alice:s3cret-token@idx.example/simple"}
    code, out, err = run(capsys, ["config", "show"], env)
    assert code == 0
    assert "s3cret-token" not in out + err
    assert "idx.example/simple" in out and "environment PIP_INDEX_URL" in out
    assert out.splitlines()[0].split() == ["SETTING", "VALUE", "ORIGIN"]


def test_config_show_with_a_broken_project_is_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envbuild.toml").write_text("torch = [\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, ["config", "show"], base_env(tmp_path))
    assert code == 2 and out == ""
    assert err.startswith("envbuild: error[usage]: envbuild.toml:")


# --- the JSON contracts ---------------------------------------------------------------------


def test_resolve_json_matches_its_schema_for_stacks_and_for_a_conflict(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, ["resolve", "--driver", "550", "--gpu", "RTX 4090", "--json", "--top", "3"],
                       base_env(tmp_path))
    assert code == 0
    document = json.loads(out)
    valid("resolve.schema.json", document)
    assert document["stacks"]
    code, out, _ = run(capsys, ["resolve", "--driver", "470", "--cuda", "13", "--json"], base_env(tmp_path))
    assert code == 3
    valid("resolve.schema.json", json.loads(out))


def test_a_schema_rejects_what_the_contract_forbids() -> None:
    """The schemas are not vacuous: a stack without its torch, or a bad status, is refused."""
    with pytest.raises(jsonschema.ValidationError):
        valid("resolve.schema.json", {"schema": "envbuild.resolve/1", "driver": None, "total_stacks": 1,
                                      "rejected": [], "stacks": [{"variant": "cu126"}]})
    with pytest.raises(jsonschema.ValidationError):
        valid("smoke.schema.json", {"schema": "envbuild.smoke/1", "tiers": [0], "cpu_ok": True, "host": {},
                                    "torch": None, "exit_code": 0,
                                    "summary": {"pass": 1, "warn": 0, "fail": 0, "skip": 0},
                                    "checks": [{"name": "x", "tier": 0, "status": "fine", "message": "",
                                                "hint": "", "exit_code": 0}]})


def test_detect_json_matches_its_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, ["detect", "--json"], base_env(tmp_path))
    assert code == 0
    valid("detect.schema.json", json.loads(out))


def test_smoke_json_matches_its_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code, out, _ = run(capsys, ["smoke", "--cpu-ok", "--tier", "0", "--json"], base_env(tmp_path))
    assert code == 0
    valid("smoke.schema.json", json.loads(out))


# --- help texts -----------------------------------------------------------------------------


def test_help_texts_say_what_the_commands_do(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--help"], env=base_env(tmp_path))
    top = capsys.readouterr().out
    assert "more targets to come" not in top
    assert "validate, show or refresh" in top
    with pytest.raises(SystemExit):
        main(["render", "docker", "--help"], env=base_env(tmp_path))
    render = capsys.readouterr().out
    lines = render.splitlines()
    for option in ("--apt-package", "--pip-package"):
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(option))
        assert "repeatable" in " ".join(lines[at:at + 2]), f"{option} has no help"


# --- --json on the writers ------------------------------------------------------------------


@pytest.mark.parametrize("target", ["docker", "script", "cloud-init"])
def test_render_json_lists_every_file_written_with_its_hash(target: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    out_dir = tmp_path / "out"
    code, out, err = run(capsys, ["render", target, "--driver", "550", "-o", str(out_dir), "--json"],
                         base_env(tmp_path))
    assert code == 0, err
    document = json.loads(out)
    valid("written.schema.json", document)
    assert document["target"] == target
    on_disk = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    assert [f["path"] for f in document["files"]] == on_disk
    for entry in document["files"]:
        assert entry["sha256"] == hashlib.sha256((out_dir / entry["path"]).read_bytes()).hexdigest()


def test_ci_json_names_the_stacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, ["ci", "bake", "--driver", "550", "--top", "2", "--registry",
                                  "registry.example/ml/torch", "-o", str(tmp_path / "ci"), "--json"],
                         base_env(tmp_path))
    assert code == 0, err
    document = json.loads(out)
    valid("written.schema.json", document)
    assert document["schema"] == "envbuild.ci/1" and len(document["stacks"]) == 2


def test_init_and_matrix_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, ["init", "--driver", "550", "--gpu", "A10", "--json"], base_env(tmp_path))
    assert code == 0, err
    document = json.loads(out)
    valid("init.schema.json", document)
    assert (tmp_path / "envbuild.toml").read_text(encoding="utf-8") == document["text"]
    code, out, err = run(capsys, ["matrix", "validate", "--json"], base_env(tmp_path))
    assert code == 0, err
    document = json.loads(out)
    valid("matrix-validate.schema.json", document)
    assert document["relations"]["gpus"] > 100 and document["manifest"] is None


# --- a failed build shows its log ---------------------------------------------------------


def test_a_failed_step_shows_its_last_log_line_and_promises_none_when_empty(
        capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild.commands.cli import _print_story
    from envbuild.engine.build import _step_failure

    failed = _step_failure("returned a non-zero code: 3", (5, 9, "RUN exit 3"), ("boom: disk on fire",))
    assert "follow" in failed.hint
    _print_story(failed)
    assert "  - boom: disk on fire" in capsys.readouterr().err  # one line of log is still shown
    silent = _step_failure("returned a non-zero code: 3", (5, 9, "RUN exit 3"), ())
    assert "follow" not in silent.hint and "--verbose" in silent.hint


# --- -q / -v anywhere on the line -----------------------------------------------------------


def test_quiet_and_verbose_are_read_anywhere_before_the_commands_own_arguments() -> None:
    from envbuild.commands.cli import verbosity

    assert verbosity(["-q", "resolve", "--driver", "550"]) == (["resolve", "--driver", "550"], -1)
    assert verbosity(["lock", "--check", "--quiet"]) == (["lock", "--check"], -1)
    assert verbosity(["build", "-v", "--lock", "x"]) == (["build", "--lock", "x"], 1)
    # the smoke test and a diagnosed command own what follows them
    assert verbosity(["-q", "smoke", "-v"]) == (["smoke", "-v"], -1)
    assert verbosity(["diagnose", "--", "python", "-q"]) == (["diagnose", "--", "python", "-q"], 0)


def test_quiet_drops_progress_lines_but_not_the_error(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "m"
    shutil.copytree(ROOT / "matrices", data)
    env = {**base_env(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("ENVBUILD_NO_CACHE")
    argv = ["--matrices", str(data), "matrix", "refresh", "--offline"]
    code, _, err = run(capsys, argv, env)  # offline with an empty cache: exit 4 after a progress line
    assert code == 4 and "refreshing from" in err
    code, _, err = run(capsys, [*argv, "-q"], env)
    assert code == 4 and "refreshing from" not in err
    assert err.startswith("envbuild: error[data]:")


def test_a_refresh_progress_line_says_how_the_metadata_was_had() -> None:
    """#29: each release printed a cryptic '0 bytes (range)'."""
    from typing import cast

    from envbuild.upstream.simple_api import MetadataRead, WheelFile
    from envbuild.upstream.torch_facts import how_read

    wheel = cast(WheelFile, None)  # how_read looks at the way it was read, not at the wheel
    cached = MetadataRead(wheel=wheel, text="", method="range", bytes_transferred=0)
    assert how_read(cached) == "from the refresh cache"
    ranged = MetadataRead(wheel=wheel, text="", method="range", bytes_transferred=65536)
    assert how_read(ranged) == "65536 bytes read, byte ranges of the wheel"
    pep658 = MetadataRead(wheel=wheel, text="", method="pep658", bytes_transferred=900)
    assert how_read(pep658) == "900 bytes read, its .metadata file (PEP 658)"


@pytest.mark.parametrize("relation", ["gpus", "torch_variants", "cuda_toolkits", "driver_branches"])
def test_matrix_show_json_is_every_row_with_its_source(relation: str, capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    code, out, _ = run(capsys, ["matrix", "show", relation, "--json"], base_env(tmp_path))
    assert code == 0
    valid("matrix-show.schema.json", json.loads(out))
