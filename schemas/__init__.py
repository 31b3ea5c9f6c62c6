"""JSON Schemas shipped as package data: ``load_schema("contract")``."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """The parsed ``schemas/<name>.schema.json``."""
    return json.loads(resources.files(__name__).joinpath(f"{name}.schema.json").read_text())


def schema_path(name: str) -> str:
    return str(resources.files(__name__).joinpath(f"{name}.schema.json"))
