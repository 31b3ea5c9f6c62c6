"""A checkout's code importable as ``toolcall`` without installing it.

The device machine runs the bench from a copy of the tree with nothing installed, and an A/B run
imports another checkout's code: both need ``toolcall`` to mean a given checkout. ``use(root)`` puts a
folder first on sys.path whose one entry, ``toolcall``, links to ``root`` (the checkout's folders are
then ``toolcall.runtime``, ``toolcall.kernels``, ...), and returns that folder for a child's PYTHONPATH.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def import_folder(root: Path = REPO) -> Path:
    """A folder (made once per checkout, under the temp dir) holding ``toolcall`` -> ``root``."""
    root = Path(root).resolve()
    folder = Path(tempfile.gettempdir()) / f"toolcall-import-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    folder.mkdir(exist_ok=True)
    link = folder / "toolcall"
    try:
        link.symlink_to(root, target_is_directory=True)
    except FileExistsError:  # made by an earlier run (or a sibling process just now)
        assert link.resolve() == root, f"{link} points to {link.resolve()}, not {root}"
    return folder


def use(root: Path = REPO) -> Path:
    """Makes ``toolcall`` import from ``root`` in this process; the folder to put on a child's PYTHONPATH."""
    folder = import_folder(root)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return folder
