from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.data import gpus
from envbuild.data.gpus import coverage, find_gpu, target_from_arch
from envbuild.errors import UsageError

ROWS = [
    {"name": "NVIDIA GeForce RTX 4090", "aliases": ["RTX 4090", "4090"],
     "compute_capability": "8.9", "architecture": "Ada Lovelace", "datacenter": False,
     "source": "https://example.invalid/a"},
    {"name": "NVIDIA H100 80GB HBM3", "aliases": ["H100", "H100 SXM"], "compute_capability": "9.0",
     "architecture": "Hopper", "datacenter": True, "source": "https://example.invalid/b"},
]


@pytest.mark.parametrize(
    ("cc", "arch_list", "expected"),
    [
        ("8.9", ["sm_80", "sm_86", "sm_89"], "sass"),
        ("8.9", ["sm_80", "sm_86"], "sass-compatible"),  # same major, lower minor: binary compatible
        ("8.6", ["sm_80"], "sass-compatible"),
        ("9.0", ["sm_80", "sm_86"], None),  # another major: no kernel image
        ("9.0", ["sm_80", "sm_86+PTX"], "ptx"),  # PTX of a lower capability JITs
        ("9.0", ["sm_90a"], "sass"),  # arch-specific SASS runs on exactly 9.0
        ("9.2", ["sm_90a"], None),  # ... and nowhere else
        ("12.0", ["sm_90", "sm_100"], None),
        ("12.0", ["sm_90", "compute_90"], "ptx"),
        ("8.0", ["sm_86+PTX"], None),  # PTX for a higher capability cannot run
        ("6.1", ["sm_75", "sm_80"], None),  # too old for the wheel
        ("3.7", ["sm_37", "sm_50"], "sass"),
        ("10.0", ["sm_100", "sm_120"], "sass"),
        # The smoke test's rule, now the resolver's too:
        ("8.7", ["sm_80"], None),  # an integrated GPU (Orin) runs no discrete GPU's SASS
        ("11.0", ["sm_101"], "sass"),  # sm_101 was renamed 11.0 (Thor)
        ("10.3", ["sm_100f"], "sass-compatible"),  # family-specific SASS runs across the family
        ("10.3", ["sm_100a"], None),  # arch-specific SASS does not
        ("10.3", ["compute_100f"], "ptx"),
        ("9.0", ["sm_90a+PTX"], "sass"),
    ],
)
def test_coverage(cc: str, arch_list: list[str], expected: str | None) -> None:
    assert coverage(cc, arch_list) == expected


@pytest.mark.parametrize("name", ["RTX 4090", "rtx4090", "NVIDIA GeForce RTX 4090", "geforce rtx-4090",
                                  "4090"])
def test_find_gpu_forgives_spelling(name: str) -> None:
    assert find_gpu(ROWS, name).compute_capability == "8.9"


def test_unknown_gpu_suggests_the_close_one() -> None:
    with pytest.raises(UsageError) as info:
        find_gpu(ROWS, "RTX 4909")
    assert "unknown GPU 'RTX 4909'" in info.value.message
    assert info.value.hint.startswith("Perhaps you meant NVIDIA GeForce RTX 4090")


@pytest.mark.parametrize(("arch", "cc"), [("sm_89", "8.9"), ("sm_90", "9.0"), ("sm_100", "10.0"),
                                          ("sm_120", "12.0"), ("sm_37", "3.7")])
def test_target_from_arch(arch: str, cc: str) -> None:
    assert target_from_arch(arch, datacenter=None).compute_capability == cc


@pytest.mark.parametrize("arch", ["89", "sm89", "sm_8", "compute_90", "sm_90\n"])
def test_bad_arch(arch: str) -> None:
    with pytest.raises(UsageError):
        target_from_arch(arch, datacenter=None)


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from(["nvidia", "NVIDIA", "GeForce", "tesla", "Quadro", "rtx", "4090", "nvidia_x", "xnvidia"]),
    st.text(alphabet=string.ascii_letters + string.digits + " ._()/-\t\u00e9\u2028", max_size=3)),
    max_size=8).map("".join))
def test_name_rules_equal_the_regexes_they_replaced(name: str) -> None:
    # GPU names are checked and folded by hand (``re`` is a seventh of resolve --gpu's start-up);
    # these are the regexes the hand-written rules must match exactly.
    import re

    assert gpus._valid_name(name) == (re.fullmatch(r"[A-Za-z0-9 ._()/\-]{1,80}", name) is not None)
    assert gpus._fold(name) == re.sub(r"\b(nvidia|geforce|tesla|quadro)\b|[\s_\-]+", "", name.casefold())
