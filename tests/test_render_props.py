"""docs/faults.md A and C3 as properties: per user field, valid random values keep the Dockerfile's
instruction sequence (keywords and count) of a baseline, and values carrying a line break,
quote or shell metacharacter are refused with UsageError (exit 2) before anything is written."""

from __future__ import annotations

import os
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import DriverVersion
from envbuild.errors import UsageError
from envbuild.redact import has_credentials
from envbuild.render import docker as render
from envbuild.render import values as valuesmod
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# Characters no field but an env value may hold, and line breaks no field may hold at all.
LINE_BREAKS = "\n\r\x85\u2028\u2029\x0b\x0c\x00"
# ('~' and '!' are not here: a Debian version may hold '~', a pip version '!' as its epoch.)
METACHARS = "\"'`$;|&<>()\\ \t*?{}[]#"
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


@pytest.fixture(scope="module")
def stack(matrix: matrixmod.Matrix) -> Stack:
    return resolve(Request(driver=DriverVersion.parse("550")), matrix).stacks[0]


def instructions(dockerfile: str) -> list[str]:
    """The keyword of each instruction, continuation lines joined, comments and blanks skipped."""
    logical = re.sub(r"\\\n", " ", dockerfile)
    return [line.split()[0] for line in logical.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def structure(m: matrixmod.Matrix, stack: Stack, raw: dict[str, Any]) -> list[str]:
    options = render.parse_options(**raw)
    text = render.render_docker(render.lock_for(stack, m, options), options)["Dockerfile"]
    assert isinstance(text, bytes)
    return instructions(text.decode("utf-8"))


# --- valid values, per field ----------------------------------------------------------------

_LOWER = string.ascii_lowercase + string.digits
_name = st.text(_LOWER, min_size=1, max_size=12)
_version = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}", fullmatch=True)
# Valid: no controls, surrogates, line separators or noncharacters (Cn holds those), no credentials.
_env_value = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cn")), max_size=40) \
    .filter(lambda v: not has_credentials(v))
_apt = st.builds(lambda n, v: f"{n}{'+-.'[len(n) % 3]}x" + (f"={v}" if v else ""),
                 _name, st.none() | _version)
_pip = st.builds(lambda n, v: f"pkg-{n}" + (f"=={v}" if v else ""), _name, st.none() | _version)
_base = st.builds(lambda host, path, tag: f"{host}{path}:{tag}",
                  st.sampled_from(["", "registry.example:5000/", "mirror.example/"]),
                  st.lists(_name, min_size=1, max_size=3).map("/".join),
                  st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
                  .filter(lambda t: t != "latest"))
_user = st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True).filter(
    lambda u: u not in valuesmod.RESERVED_USERS)
_url = st.builds(lambda host, path: f"https://{host}.example/{path}", _name,
                 st.text(_LOWER + "._~%+=,/-", max_size=20))
_ca_name = st.text(_LOWER + "._-", min_size=1, max_size=20).filter(lambda n: n not in (".", ".."))

# field -> (valid values, option dict for one value, baseline value)
FIELDS: dict[str, tuple[st.SearchStrategy[str], Callable[[str], dict[str, Any]], str]] = {
    "env": (_env_value, lambda v: {"env": [f"KEY={v}", "OTHER=1"]}, "x"),
    "apt": (_apt, lambda v: {"apt_packages": [v]}, "git"),
    "pip": (_pip, lambda v: {"pip_packages": [v]}, "numpy"),
    "base": (_base, lambda v: {"base_image": v}, "mirror.example/nvidia/cuda:12.4.1-base"),
    "user": (_user, lambda v: {"user": v}, "envbuild"),
    "index": (_url, lambda v: {"index_url": v}, "https://mirror.example/simple"),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_valid_values_keep_the_instruction_list(field: str, matrix: matrixmod.Matrix,
                                                stack: Stack) -> None:
    values, build, baseline_value = FIELDS[field]
    baseline = structure(matrix, stack, build(baseline_value))

    @SETTINGS
    @given(value=values)
    def check(value: str) -> None:
        assert structure(matrix, stack, build(value)) == baseline, value

    check()


@SETTINGS
@given(name=_ca_name)
def test_ca_bundle_paths_keep_the_instruction_list(name: str, matrix: matrixmod.Matrix,
                                                   stack: Stack, tmp_path: Path) -> None:
    baseline_path = tmp_path / "ca.pem"
    baseline_path.write_text(PEM)
    baseline = structure(matrix, stack, {"ca_bundle": str(baseline_path)})
    folder = tmp_path / "any"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(PEM)
    assert structure(matrix, stack, {"ca_bundle": str(folder / name)}) == baseline


# --- invalid values ---------------------------------------------------------------------------


def _spliced(valid: st.SearchStrategy[str], bad: str) -> st.SearchStrategy[str]:
    """A valid value with one bad character put anywhere in it."""
    return st.builds(lambda v, c, i: v[: i % (len(v) + 1)] + c + v[i % (len(v) + 1):],
                     valid, st.sampled_from(bad), st.integers(min_value=0))


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_bad_characters_are_usage_errors(field: str) -> None:
    values, build, _ = FIELDS[field]
    # Env values are quoted as one word, so quotes and metacharacters are valid there
    # (the structure property above covers them); line breaks never are.
    bad = LINE_BREAKS if field == "env" else LINE_BREAKS + METACHARS

    @SETTINGS
    @given(value=_spliced(values, bad))
    def check(value: str) -> None:
        with pytest.raises(UsageError) as info:
            render.parse_options(**build(value))
        assert info.value.exit_code == 2 and "\n" not in info.value.one_line()

    check()


@SETTINGS
@given(name=_spliced(_ca_name, LINE_BREAKS.replace("\x00", "") + METACHARS))
def test_unreadable_ca_bundle_is_usage_error(name: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        render.parse_options(ca_bundle=str(tmp_path / "missing" / name))
    not_pem = tmp_path / "plain.txt"
    not_pem.write_text("hello\n")
    with pytest.raises(UsageError):
        render.parse_options(ca_bundle=str(not_pem))


def test_ca_bundle_path_with_nul_is_usage_error() -> None:
    with pytest.raises(UsageError):
        render.parse_options(ca_bundle="ca\x00.pem")


CLI_FLAGS = {"apt": "--apt-package", "pip": "--pip-package", "base": "--base-image",
             "user": "--user", "env": "--env"}


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(CLI_FLAGS)), data=st.data())
def test_cli_writes_nothing_for_a_bad_value(field: str, data: st.DataObject, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    values, _, _ = FIELDS[field]
    bad = LINE_BREAKS if field == "env" else LINE_BREAKS + METACHARS
    value = data.draw(_spliced(values, bad))
    if field == "env":
        value = f"KEY={value}"
    env = {"ENVBUILD_NO_CACHE": "1"}
    if "ENVBUILD_MATRICES" in os.environ:
        env["ENVBUILD_MATRICES"] = os.environ["ENVBUILD_MATRICES"]
    out = tmp_path / "out"
    lock = tmp_path / "envbuild.lock"
    assert main(["render", "docker", "--driver", "550", CLI_FLAGS[field], value,
                 "-o", str(out)], env=env) == 2
    assert main(["lock", "--stack-only", "--driver", "550", CLI_FLAGS[field], value, "-o", str(lock)],
                env=env) == 2
    err = capsys.readouterr().err
    assert err.startswith("envbuild: error[") and not out.exists() and not lock.exists()
