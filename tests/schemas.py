"""The JSON contracts' schemas (docs/schemas/*.schema.json), for tests that hold a real document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def check(schema_name: str, document: Any) -> None:
    """Raise jsonschema.ValidationError unless ``document`` fits ``docs/schemas/<schema_name>``."""
    import jsonschema

    schema = json.loads((SCHEMAS / schema_name).read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(schema)(schema).validate(document)
