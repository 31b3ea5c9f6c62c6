"""The project's own models: each folder a checkpoint, each package the code that made it.

The training and evaluation code imports transformers, which imports Hugging Face's `kernels`. Run as
``python -m toolcall.models...`` from the checkout's root, Python puts that root first on sys.path, where
the checkout's own kernels/ folder would shadow it: importing this package takes the root off sys.path
(the project itself is imported as ``toolcall.*``, never by its folders' bare names).
"""
from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parents[1]


def drop_checkout_root_from_path() -> None:
    """Removes the checkout's root (and "" or "." standing for it) from sys.path."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != CHECKOUT_ROOT]


drop_checkout_root_from_path()
