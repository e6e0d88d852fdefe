from __future__ import annotations

import pytest

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
