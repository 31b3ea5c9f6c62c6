"""pyproject.toml against the tree: every package folder is listed under the ``toolcall`` namespace, the
command-line entry points resolve, and a wheel holds the data files the code reads."""
from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    """The mapped top-level folders (no __init__.py: tests/test_checkout_root.py) and every folder below them
    holding an __init__.py."""
    mapping = SETUPTOOLS["package-dir"]
    folders = {"toolcall." + ".".join(p.relative_to(ROOT).parent.parts) for p in ROOT.glob("*/*/**/__init__.py")
               if p.relative_to(ROOT).parts[0] in set(mapping.values())}
    folders |= {f"toolcall.{folder}" for folder in mapping.values()}
    assert set(SETUPTOOLS["packages"]) == folders
    assert all(name == f"toolcall.{folder}" for name, folder in mapping.items())


def test_entry_points_resolve():
    for name, target in PROJECT["project"]["scripts"].items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name


def test_package_data_covers_what_the_code_reads():
    data = SETUPTOOLS["package-data"]
    for package, patterns in data.items():
        folder = ROOT / SETUPTOOLS["package-dir"].get(package, package.removeprefix("toolcall.").replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{package}: nothing matches {pattern}"
    assert {"toolcall.schemas", "toolcall.builder", "toolcall.kernels"} <= set(data)
