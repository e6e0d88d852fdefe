"""The candidates: one *family* per (torch release, wheel variant) the data knows.

Every row of ``torch_variants.yaml`` is a family; so is the package index's default wheel
of a release without variant rows. ``--variant default`` keeps only the index's default
wheels, rejecting the other rows here, before any check runs.
"""

from __future__ import annotations

from envbuild.resolver.model import PIN_FIELDS, PYTORCH_INDEX, Rejection

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

    from envbuild.data.matrix import Row
    from envbuild.resolver.index import Index
    from envbuild.resolver.model import Request


class Family:
    """One (torch release, wheel variant) candidate."""

    __slots__ = ("index_url", "pins", "python", "row", "variant")

    def __init__(self, *, row: Row, variant: str, index_url: str | None, python: tuple[str, ...],
                 pins: dict[str, str]) -> None:
        self.row, self.variant, self.index_url, self.python, self.pins = row, variant, index_url, python, pins

    @property
    def label(self) -> str:
        return f"torch {self.row['torch']}+{self.row['variant']}"


def families(ask: Request, ix: Index) -> Iterator[Family | Rejection]:
    """One family per variant row, plus the package index's default wheel of any release
    without variant rows; ``--variant default`` keeps only the index's default wheels.
    On linux/arm64 the rows are the aarch64 ones (``Index.variant_rows``)."""
    if ask.platform == "linux/arm64":
        yield from _arm64_families(ask, ix)
        return
    with_rows = set()
    for row in ix.rows("torch_variants"):
        with_rows.add(row["torch"])
        pins: dict[str, str] = {k: row[k] for k in PIN_FIELDS if k in row}
        family = Family(row=row, variant=row["variant"],
                        index_url=f"{PYTORCH_INDEX}/{row['variant']}",
                        python=tuple(row["python"]), pins=pins)
        if ask.variant != "default":
            yield family
            continue
        pypi = ix.pypi.get(row["torch"])
        if pypi is None or pypi["default_variant"] != row["variant"]:
            reason = (f"not the default wheel of torch {row['torch']} on the package index"
                      if pypi else f"no package-index record for torch {row['torch']}")
            yield Rejection(family=family.label, constraint="variant", reason=reason,
                            source=pypi["source"] if pypi else None)
            continue
        yield _from_index(family, pypi, ask)
    for pypi in ix.rows("torch_pypi"):
        if pypi["torch"] not in with_rows:
            yield _index_only_family(pypi, ask)


def _arm64_families(ask: Request, ix: Index) -> Iterator[Family | Rejection]:
    """The aarch64 wheels: from PyTorch's per-variant index where it carries them, else (the
    package index's default CPU wheel before 2.11) from the configured package index. Pins
    come from the variant row (one cuDNN per CUDA per release); the package index's own pins
    only where its x86_64 default is the same variant."""
    for row in ix.variant_rows("linux/arm64"):
        pins: dict[str, str] = {k: row[k] for k in PIN_FIELDS if k in row}
        on_pytorch = row["pytorch_index"] and ask.variant != "default"
        family = Family(row=row, variant=row["variant"],
                        index_url=f"{PYTORCH_INDEX}/{row['variant']}" if on_pytorch else ask.package_index,
                        python=tuple(row["python"]), pins=pins)
        if ask.variant == "default" and not row["pypi_default"]:
            yield Rejection(family=family.label, constraint="variant", source=row["source"],
                            reason=f"not the default aarch64 wheel of torch {row['torch']} on the "
                                   "package index")
            continue
        pypi = ix.pypi.get(row["torch"])
        if not on_pytorch and pypi is not None and pypi["default_variant"] == row["variant"]:
            family.pins.update({k: pypi[k] for k in PIN_FIELDS if k in pypi})
        yield family


def _from_index(family: Family, pypi: Row, ask: Request) -> Family:
    pins: dict[str, str] = {k: pypi[k] for k in PIN_FIELDS if k in pypi}
    return Family(row=family.row, variant=family.variant, index_url=ask.package_index,
                  python=tuple(pypi["python"]), pins={**family.pins, **pins})


def _index_only_family(pypi: Row, ask: Request) -> Family:
    """A release whose variant set is unsourced: only its package-index wheel is known.

    Its CUDA comes from the wheel's runtime pin; its arch list is unknown, so any GPU
    check refuses it instead of guessing."""
    variant = pypi["default_variant"]
    cuda = None if variant == "cpu" else f"{variant[2:-1]}.{variant[-1]}"
    row = {"torch": pypi["torch"], "variant": variant, "cuda": cuda, "python": pypi["python"],
           "source": pypi["source"]}
    return _from_index(Family(row=row, variant=variant, index_url=None,
                              python=tuple(pypi["python"]), pins={}), pypi, ask)
