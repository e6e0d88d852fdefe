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


# --- the bundled catalogue (matrices/gpus.yaml) ---------------------------------------

from pathlib import Path  # noqa: E402

from envbuild.data import matrix  # noqa: E402

BUNDLED = Path(__file__).resolve().parent.parent / "matrices"
NVIDIA_PAGES = ("https://developer.nvidia.com/cuda-gpus", "https://developer.nvidia.com/cuda-legacy-gpus")
DRIVER_TABLE = "https://github.com/NVIDIA/open-gpu-kernel-modules/blob/"


@pytest.fixture(scope="module")
def catalogue() -> list[dict[str, object]]:
    return [dict(r) for r in matrix.load(BUNDLED).rows("gpus")]


def test_catalogue_has_150_gpus_of_every_family(catalogue: list[dict[str, object]]) -> None:
    assert len(catalogue) >= 150
    families = {r["family"] for r in catalogue}
    assert {"GeForce", "Workstation", "Data Center"} <= families
    archs = {r["architecture"] for r in catalogue}
    assert {"Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"} <= archs


def test_every_row_is_sourced(catalogue: list[dict[str, object]]) -> None:
    for row in catalogue:
        assert str(row["source"]).startswith("https://"), row["name"]
        assert str(row["retrieved"]) >= "2026-11-21", row["name"]
        note = str(row.get("note", ""))
        # CC read anywhere but NVIDIA's own pages says so, and where
        if row["source"] not in NVIDIA_PAGES or "copy" in note:
            assert "GAPS-gpus.md" in note or row["name"] in OLD_REVIEWED_ROWS, row["name"]
        # the nvidia-smi name: read from the driver's product-name table, or said not to be
        if "name_source" in row:
            assert str(row["name_source"]).startswith(DRIVER_TABLE), row["name"]
        else:
            # or the board names nvidia-smi prints are the aliases (Tesla P100/V100)
            assert ("not verified" in note or "what nvidia-smi prints" in note
                    or row["family"] == "Jetson"), row["name"]
        # a driver-branch fact cites where it came from
        if "min_driver_branch" in row or "last_driver_branch" in row:
            assert str(row.get("driver_source", "")).startswith("https://"), row["name"]


# The 30 rows reviewed before the catalogue grew; their notes predate the GAPS cross-reference.
OLD_REVIEWED_ROWS = {"NVIDIA A10G", "NVIDIA A100-SXM4-40GB", "NVIDIA A30", "Tesla T4", "Tesla K80",
                     "NVIDIA GeForce RTX 3060 Ti"}


@pytest.mark.parametrize(("typed", "name", "cc", "family"), [
    ("RTX 3080", "NVIDIA GeForce RTX 3080", "8.6", "GeForce"),
    ("RTX 2080 Ti", "NVIDIA GeForce RTX 2080 Ti", "7.5", "GeForce"),
    ("rtx 2080ti", "NVIDIA GeForce RTX 2080 Ti", "7.5", "GeForce"),
    ("RTX 4070", "NVIDIA GeForce RTX 4070", "8.9", "GeForce"),
    ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", "8.9", "Workstation"),
    ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation", "8.9", "Workstation"),
    ("H800", "NVIDIA H800", "9.0", "Data Center"),
    ("Tesla P4", "Tesla P4", "6.1", "Data Center"),
    ("GTX 980", "NVIDIA GeForce GTX 980", "5.2", "GeForce"),
    ("NVIDIA GeForce GTX 980", "NVIDIA GeForce GTX 980", "5.2", "GeForce"),
    ("Quadro RTX 8000", "Quadro RTX 8000", "7.5", "Workstation"),
    ("TITAN V", "NVIDIA TITAN V", "7.0", "GeForce"),
    ("RTX 5080", "NVIDIA GeForce RTX 5080", "12.0", "GeForce"),
    ("Quadro P4000", "Quadro P4000", "6.1", "Workstation"),
    # issue 23: the cards it found unknown, each as nvidia-smi prints it
    ("GTX 1650", "NVIDIA GeForce GTX 1650", "7.5", "GeForce"),
    ("GTX 1660 SUPER", "NVIDIA GeForce GTX 1660 SUPER", "7.5", "GeForce"),
    ("GTX 1660 Ti", "NVIDIA GeForce GTX 1660 Ti", "7.5", "GeForce"),
    ("NVIDIA GeForce GTX 1660", "NVIDIA GeForce GTX 1660", "7.5", "GeForce"),
    ("RTX 4070 Ti SUPER", "NVIDIA GeForce RTX 4070 Ti SUPER", "8.9", "GeForce"),
    ("NVIDIA GeForce RTX 3060 Laptop GPU", "NVIDIA GeForce RTX 3060 Laptop GPU", "8.6", "GeForce"),
    ("RTX 3060 Laptop", "NVIDIA GeForce RTX 3060 Laptop GPU", "8.6", "GeForce"),
    ("NVIDIA GeForce RTX 2070 with Max-Q Design", "NVIDIA GeForce RTX 2070 with Max-Q Design", "7.5",
     "GeForce"),
    ("NVIDIA A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", "8.0", "Data Center"),
    ("NVIDIA A800 40GB Active", "NVIDIA A800 40GB Active", "8.0", "Data Center"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", "8.0", "Data Center"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "8.0", "Data Center"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", "9.0", "Data Center"),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", "9.0", "Data Center"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "9.0", "Data Center"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
     "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "12.0", "Workstation"),
])
def test_the_issues_misses_resolve(catalogue: list[dict[str, object]], typed: str, name: str, cc: str,
                                   family: str) -> None:
    target = find_gpu(catalogue, typed)
    assert (target.label, target.compute_capability) == (name, cc)
    row = next(r for r in catalogue if r["name"] == name)
    assert row["family"] == family


def test_retired_architectures_end_at_branch_580(catalogue: list[dict[str, object]]) -> None:
    for row in catalogue:
        if row["architecture"] in ("Maxwell", "Pascal", "Volta") and row["family"] != "Jetson":
            assert row.get("last_driver_branch") == 580, row["name"]
        if row["architecture"] in ("Ampere", "Ada Lovelace", "Hopper", "Blackwell"):
            assert "last_driver_branch" not in row, row["name"]


def test_no_two_rows_share_a_folded_name(catalogue: list[dict[str, object]]) -> None:
    seen: dict[str, object] = {}
    for row in catalogue:
        for alias in (row["name"], *row.get("aliases", ())):  # type: ignore[misc]
            assert seen.setdefault(gpus.fold_name(alias), row["name"]) == row["name"], alias


@pytest.mark.parametrize(("typed", "first", "before", "after"), [
    # a variant of a known card: that card, then its own generation, before the next generation's
    ("RTX 3080 Foo", "NVIDIA GeForce RTX 3080", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4080"),
    ("RTX 3080 Super", "NVIDIA GeForce RTX 3080", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4080"),
    ("GeForce RTX 4075", "NVIDIA GeForce RTX 4070", "NVIDIA GeForce RTX 4070 Ti",
     "NVIDIA RTX 4000 Ada Generation"),  # the GeForce 40 series before the Ada workstation card
    ("Quadro P7000", "Quadro P6000", "Quadro P5000", None),
    ("RTX A7000", "NVIDIA RTX A5000", "NVIDIA RTX A6000", "Quadro RTX 8000"),  # Ampere before Turing
    ("GTX 1090", "NVIDIA GeForce GTX 1080", "NVIDIA GeForce GTX 1070", None),
])
def test_suggestions_prefer_the_same_model_generation_and_family(
        catalogue: list[dict[str, object]], typed: str, first: str, before: str, after: str | None) -> None:
    names = gpus.suggest(catalogue, typed, limit=len(catalogue))
    assert names[0] == first
    # top 6: since issue 23 the card's own variants (RTX 3080 Ti, 3080 Laptop GPU, ...) come first
    assert before in names[:6]
    if after is not None:
        assert names.index(before) < names.index(after)
    with pytest.raises(UsageError) as info:
        find_gpu(catalogue, typed)
    assert info.value.hint.startswith(f"Perhaps you meant {first} or ")


def test_a_nonsense_name_gets_no_suggestion(catalogue: list[dict[str, object]]) -> None:
    with pytest.raises(UsageError) as info:
        find_gpu(catalogue, "zzqx")
    assert "--arch" in info.value.hint


def test_validate_catches_two_rows_folding_to_one_name(tmp_path: Path) -> None:
    import shutil

    from envbuild.errors import DataError

    target = tmp_path / "matrices"
    shutil.copytree(BUNDLED, target)
    path = target / "gpus.yaml"
    text = path.read_text()
    # "GeForce RTX-3090" folds to "rtx3090", which the RTX 3090 row already names
    path.write_text(text.replace("  - GeForce RTX 4090\n", "  - GeForce RTX-3090\n", 1))
    assert path.read_text() != text
    with pytest.raises(DataError) as info:
        matrix.load(target)
    assert "alias 'GeForce RTX-3090' names both" in str(info.value.message)


def test_validate_rejects_an_unknown_family_and_a_row_without_one(tmp_path: Path) -> None:
    import shutil

    from envbuild.errors import DataError

    target = tmp_path / "matrices"
    shutil.copytree(BUNDLED, target)
    path = target / "gpus.yaml"
    text = path.read_text()
    first = text.index("  family: ")
    second = text.index("  family: ", first + 1)
    line_end = text.index("\n", second)
    path.write_text(text[:first] + "  family: Gaming" + text[text.index("\n", first):second]
                    + text[line_end + 1:])
    with pytest.raises(DataError) as info:
        matrix.load(target)
    message = info.value.message
    assert ("gpus.yaml row 1: family must be one of GeForce, Workstation, Data Center, Jetson, "
            "got 'Gaming'") in message
    assert "gpus.yaml row 2: missing 'family'" in message


def test_an_unrecorded_arch_list_is_refused_not_guessed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md B3: a variant without an arch list is refused for a GPU (exit 3), never
    assumed to cover it. The bundled data has no such variant left (issue 23), so the
    2.6.0 cu126 row loses its list in a copy."""
    import json
    import shutil

    import yaml

    from envbuild.commands.cli import main

    target = tmp_path / "matrices"
    shutil.copytree(BUNDLED, target)
    path = target / "torch_variants.yaml"
    document = yaml.safe_load(path.read_text())
    [row] = [r for r in document["rows"] if (r["torch"], r["variant"]) == ("2.6.0", "cu126")]
    del row["arch_list"]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    code = main(["resolve", "--json", "--driver", "550", "--gpu", "H100", "--torch", "2.6",
                 "--variant", "cu126"], env={"ENVBUILD_NO_CACHE": "1", "ENVBUILD_MATRICES": str(target)})
    assert code == 3
    assert "arch list is not recorded" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.parametrize(("typed", "row"), [
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"),
    ("H100", "NVIDIA H100 80GB HBM3"),
    ("A100", "NVIDIA A100-SXM4-40GB"),
    ("A800", "NVIDIA A800-SXM4-80GB"),
])
def test_a_name_of_several_editions_says_which_it_assumed(
        catalogue: list[dict[str, object]], typed: str, row: str) -> None:
    """Issue 23: "RTX PRO 6000" is a workstation and a (datacenter) server edition; the
    lookup takes one only with a note in the label that every output repeats."""
    target = find_gpu(catalogue, typed)
    assert target.label == (f"{row} (assumed for {typed!r}; give the name nvidia-smi prints for "
                            "another edition)")
    assert find_gpu(catalogue, row).label == row  # the full name: no assumption


def test_unknown_siblings_get_suggestions_of_their_generation(
        catalogue: list[dict[str, object]]) -> None:
    """Issue 23: "GTX 1660 SUPER" was offered a Pascal card; an unknown GTX 16 name gets Turing."""
    for typed in ("GTX 1660 Ultra", "GTX 1670"):
        names = gpus.suggest(catalogue, typed)
        assert names, typed
        archs = {next(r["architecture"] for r in catalogue if r["name"] == n) for n in names}
        assert archs == {"Turing"}, (typed, names)
