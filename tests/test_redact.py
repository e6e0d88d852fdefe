"""Credentials in index URLs never reach stdout, error lines, retry lines or labels (docs/faults.md E15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.errors import DataError
from envbuild.redact import has_credentials, redact, strip_credentials

SECRET_URL = "https://alice:s3cr3t@idx.example/simple/?token=abc123&x=1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://alice:s3cr3t@h/simple/", "https://***@h/simple/"),
        ("see https://tok@h/x and http://u:p@g/y", "see https://***@h/x and http://***@g/y"),
        ("https://h/simple/?token=abc&page=2", "https://h/simple/?token=***&page=2"),
        ("https://h/s/?x=1&access_token=q#f", "https://h/s/?x=1&access_token=***#f"),
        ("https://h/s/?api_key=q", "https://h/s/?api_key=***"),
        ("https://download.pytorch.org/whl/cu126", "https://download.pytorch.org/whl/cu126"),
        ("torch==2.4.0 user@example", "torch==2.4.0 user@example"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_strip_credentials() -> None:
    assert strip_credentials(SECRET_URL) == "https://idx.example/simple/?token=***&x=1"
    assert has_credentials(SECRET_URL)
    assert not has_credentials("https://idx.example/simple/")


def test_error_line_is_redacted() -> None:
    line = DataError(f"HTTP 404 Not Found for {SECRET_URL}", hint=f"check {SECRET_URL}").one_line()
    assert "s3cr3t" not in line and "abc123" not in line and "alice" not in line
    assert "https://***@idx.example/simple/?token=***&x=1" in line


@pytest.mark.parametrize("as_json", [True, False])
def test_resolve_prints_no_credentials(capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    argv = ["resolve", "--index-url", SECRET_URL, "--variant", "default", "--top", "3"]
    code = main([*argv, "--json"] if as_json else argv, env={"ENVBUILD_NO_CACHE": "1"})
    out, err = capsys.readouterr()
    assert code == 0
    assert "s3cr3t" not in out + err and "abc123" not in out + err
    if as_json:
        stack = json.loads(out)["stacks"][0]
        assert stack["index_url"] == "https://***@idx.example/simple/?token=***&x=1"


def test_resolve_reads_the_index_from_the_environment_without_echoing_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["resolve", "--json", "--variant", "default", "--top", "1"],
                env={"ENVBUILD_NO_CACHE": "1", "PIP_INDEX_URL": SECRET_URL})
    out = capsys.readouterr().out
    assert code == 0 and "s3cr3t" not in out
    assert "idx.example" in out


def test_lock_refuses_a_credentialed_index_without_echoing_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock (and so a Dockerfile, an install script, an image label) never records
    credentials: render refuses them, and its one line does not repeat them."""
    code = main(["lock", "--stack-only", "--driver", "550", "--index-url", SECRET_URL,
                 "-o", str(tmp_path / "l")],
                env={"ENVBUILD_NO_CACHE": "1"})
    err = capsys.readouterr().err
    assert code == 2
    assert "credentials would be baked into the image" in err
    assert "s3cr3t" not in err and "abc123" not in err and "alice" not in err
    assert not (tmp_path / "l").exists()
