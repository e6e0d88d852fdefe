from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.data.versions import DriverVersion, cuda_tag, parse_requirement
from envbuild.errors import UsageError


@pytest.mark.parametrize(
    ("given", "minimum", "ok"),
    [
        ("550", "550.54.15", True),  # a branch means its newest release
        ("550.54", "550.54.15", True),
        ("550.54.14", "550.54.15", False),  # one patch short: the exact boundary
        ("550.54.15", "550.54.15", True),
        ("550.40", "550.54.15", False),
        ("545", "550.54.15", False),
        ("560.28.03", "550.54.15", True),
        ("470.82.01", "525.60.13", False),
        ("525.60.13", "525.60.13", True),
    ],
)
def test_driver_satisfies_compares_given_components(given: str, minimum: str, ok: bool) -> None:
    assert DriverVersion.parse(given).satisfies(DriverVersion.parse(minimum)) is ok


@pytest.mark.parametrize("text", ["abc", "55", "550.", "550.54.15.1", " 550", "550\n", "5500",
                                  "550.5x", "", "-550", "550 54"])
def test_driver_garbage_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as info:
        DriverVersion.parse(text)
    assert info.value.exit_code == 2
    assert "invalid driver version" in info.value.message


def test_driver_full_keeps_nvidia_two_digit_fields() -> None:
    assert DriverVersion.parse("450.36.06").full() == "450.36.06"
    assert str(DriverVersion.parse("450.36.6")) == "450.36.6"


@pytest.mark.parametrize("text", ["535.104.05", "550.144.03", "570.26", "550", "580.65.06"])
def test_driver_text_is_kept_and_compared_numerically(text: str) -> None:
    """docs/faults.md K2: the text as written; order and equality on the numbers."""
    driver = DriverVersion.parse(text)
    assert str(driver) == driver.full() == driver.text == text
    parts = tuple(int(p) for p in text.split("."))
    assert driver.parts == parts
    unpadded = DriverVersion.parse(".".join(map(str, parts)))
    assert unpadded == driver and hash(unpadded) == hash(driver)
    assert DriverVersion(*parts).text == text  # built from numbers: NVIDIA's two-digit fields


def test_driver_order_is_numeric_not_textual() -> None:
    assert DriverVersion.parse("535.104.05") > DriverVersion.parse("535.86.09")
    assert DriverVersion.parse("550.144.03") > DriverVersion.parse("550.54.15")
    assert not DriverVersion.parse("535.54.03").satisfies(DriverVersion.parse("535.104.05"))


def test_partial_driver_and_its_oldest_build() -> None:
    assert DriverVersion.parse("550").partial and DriverVersion.parse("550.54").partial
    assert not DriverVersion.parse("550.54.15").partial
    lowest = DriverVersion.parse("550").oldest()
    assert lowest.parts == (550, 0, 0)
    assert not lowest.satisfies(DriverVersion.parse("550.54.14"))
    assert lowest.satisfies(DriverVersion.parse("545.23.08"))


@pytest.mark.parametrize("text", ["\u0665\u0665\u0660", "550.\uff15\uff14"])
def test_driver_digits_are_ascii(text: str) -> None:
    with pytest.raises(UsageError):
        DriverVersion.parse(text)


@pytest.mark.parametrize(
    ("text", "inside", "outside", "local"),
    [
        ("2.3", "2.3.1", "2.4.0", None),  # a series, pinned by the resolver later
        ("2.3.1", "2.3.1", "2.3.0", None),
        (">=2.3,<2.5", "2.4.1", "2.5.0", None),
        ("2.3.*", "2.3.0", "2.4.0", None),
        ("2.3.1+cu121", "2.3.1", "2.3.0", "cu121"),
        ("3.11", "3.11", "3.12", None),
    ],
)
def test_requirements(text: str, inside: str, outside: str, local: str | None) -> None:
    req = parse_requirement("torch", text)
    assert req.admits(inside)
    assert not req.admits(outside)
    assert req.local == local


@pytest.mark.parametrize(
    "text",
    ["2.3.1; rm -rf /", "2.3.1\n", "2.3.1 ", "$(id)", "2.3.1\u2028", "2.3.1\x85", "2.3.1\r",
     "", ">=2.3.*", "latest", "2.3.1'", '2.3.1"', "2.3.1|sh", "=>2.3"],
)
def test_requirement_rejects_anything_but_a_version(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_requirement("torch", text)
    assert f"invalid torch version {text!r}" in info.value.one_line()
    assert "\n" not in info.value.one_line()


def test_cuda_tag() -> None:
    assert cuda_tag("12.4") == "cu124"
    assert cuda_tag("11.8.0") == "cu118"


# --- the common specifier forms, judged without packaging: exactly SpecifierSet -------------

SIMPLE = ["2.4", "3.11", "12.4", "2", "2.4.0", "2.4.1", "1.2.3.4", "02.4", "2.4.*", "2.0.*",
          "2.3.1+cu121", "==2.4.1", "==2.4", "==2.4.*", "==2.0.*", "==02.4", "!=2.5", "!=2.4.*",
          ">=2.3", ">2.4", "<2.6", "<=2.4", "<2.4.0", ">=2.3,<2.6", ">=2.3,<2.6,!=2.4.1",
          ">=2.3.0,<=2.5", ">=12.4", "<3.12"]
VERSIONS = ["0", "2", "2.0", "2.0.0", "2.3", "2.3.9", "2.4", "2.4.0", "2.4.0.0", "2.4.1",
            "2.4.10", "2.40", "2.5", "2.5.0", "2.6", "2.6.0", "3", "3.11", "3.11.2", "3.12",
            "12.4", "12.4.1", "12.6", "02.4", "2.04.1",
            # not plain releases: these take packaging's road, and must agree all the same
            "2.4rc1", "2.4.0rc1", "2.6.0rc1", "2.6.0a1", "2.4.post1", "2.4.1.post2", "2.4.dev0",
            "2.5.dev3", "2.4.1+cu121", "2.4+local", "1!2.4", "v2.4", "2.4.1-1", "2.4.1_post"]


def _packaging_admits(spec: str, version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return SpecifierSet(spec).contains(Version(version), prereleases=True)


def _bare_spec(text: str) -> tuple[str, str | None]:
    """The specifier a bare version names, as packaging derives it."""
    from packaging.version import Version

    version = Version(text.removesuffix(".*"))
    wildcard = ".*" if len(version.release) < 3 else ""
    return f"=={version.public}{wildcard}", version.local


@pytest.mark.parametrize("text", SIMPLE)
def test_simple_forms_match_as_specifierset_does(text: str) -> None:
    req = parse_requirement("torch", text)
    assert req._clauses is not None, "a simple form must not need packaging"
    if text[0].isdigit():
        assert (req.spec, req.local) == _bare_spec(text)
    for version in VERSIONS:
        expected = _packaging_admits(req.spec, version)
        assert req.admits(version) is expected, version
        from packaging.version import Version

        assert req.admits(Version(version)) is expected, version


@pytest.mark.parametrize("text", ["~=2.3.0", "===2.4", ">=2.3rc1", "==2.4.1+cu121", ">=1!2.0",
                                  ">=2.3,", "2.4.0rc1", "2.4.1.post2", "2.4.1+CU121", ">=2.3,~=2.4",
                                  "2.4rc1", "2.4.post1"])
def test_other_forms_go_to_packaging(text: str) -> None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    spec = _bare_spec(text)[0] if text[0].isdigit() else text
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        # An operator form packaging refuses is a usage error; a two-component
        # pre/post-release ("2.4rc1") makes a series packaging refuses, and that fails
        # in parse_requirement as it always has.
        with pytest.raises(InvalidSpecifier if text[0].isdigit() else UsageError):
            parse_requirement("torch", text)
        return
    req = parse_requirement("torch", text)
    assert req.spec == spec
    for version in VERSIONS:
        assert req.admits(version) is _packaging_admits(spec, version), version


_releases = st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=4).map(
    lambda parts: ".".join(map(str, parts)))
_clause = st.tuples(st.sampled_from(["==", "!=", "<=", ">=", "<", ">", "==*", "!=*"]), _releases)
_suffix = st.sampled_from(["", "", "", "rc1", "a2", ".post1", ".dev0", "+cu121", ".post1+x"])


@given(clauses=st.lists(_clause, min_size=1, max_size=3), version=_releases, suffix=_suffix)
@settings(max_examples=600, deadline=None)
def test_clauses_agree_with_specifierset(clauses: list[tuple[str, str]], version: str,
                                         suffix: str) -> None:
    spec = ",".join(f"{op[:2]}{release}{'.*' if op.endswith('*') else ''}"
                    for op, release in clauses)
    req = parse_requirement("torch", spec)
    assert req._clauses is not None
    assert req.admits(version + suffix) is _packaging_admits(spec, version + suffix)


@given(release=_releases, wildcard=st.booleans(), version=_releases, suffix=_suffix)
@settings(max_examples=300, deadline=None)
def test_bare_versions_agree_with_specifierset(release: str, wildcard: bool, version: str,
                                               suffix: str) -> None:
    text = release + (".*" if wildcard else "")
    req = parse_requirement("cuda", text)
    assert (req.spec, req.local) == _bare_spec(text)
    assert req.admits(version + suffix) is _packaging_admits(req.spec, version + suffix)


def test_simple_forms_never_import_packaging_specifiers() -> None:
    code = ("import sys\n"
            "from envbuild.data.versions import parse_requirement\n"
            "for text in ('2.4', '3.11', '12.4', '==2.4.1', '>=2.3', '>=2.3,<2.6', '2.4.*'):\n"
            "    parse_requirement('torch', text).admits('2.4.1')\n"
            "assert 'packaging.specifiers' not in sys.modules, 'specifiers imported'\n"
            "assert 'packaging.version' not in sys.modules, 'version imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
