"""The JSON Schemas shipped beside this module (package data): ``load_schema("contract")``."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """The parsed ``schemas/<name>.schema.json``."""
    return json.loads((FOLDER / f"{name}.schema.json").read_text(encoding="utf-8"))
