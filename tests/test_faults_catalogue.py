"""docs/faults.md stays true: every test it names exists, and every case id that the tests and
code cite is in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = (ROOT / "docs" / "faults.md").read_text(encoding="utf-8")


def test_every_named_test_exists() -> None:
    named = set(re.findall(r"`(tests/test_\w+\.py)::(\w+)", CATALOGUE))
    assert len(named) > 50
    missing = [f"{path}::{name}" for path, name in sorted(named)
               if not (ROOT / path).is_file()
               or not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]
    assert missing == []


def test_every_cited_case_is_catalogued() -> None:
    ids = set(re.findall(r"^\| ([A-Z]\d+) \|", CATALOGUE, re.M))
    cited: set[str] = set()
    for folder in ("envbuild", "tests", "templates", "bench"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".j2") and path.is_file():
                text = path.read_text(encoding="utf-8")
                for match in re.finditer(r"docs/faults\.md(?: section)? ([A-Z]\d*)", text):
                    cited.add(match[1])
    assert cited, "nothing cites the catalogue"
    sections = {i[0] for i in ids}
    assert {c for c in cited if c not in ids and c not in sections} == set()
