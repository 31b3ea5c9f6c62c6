"""pyproject.toml against the tree: every package folder is listed under the ``toolcall`` namespace, the
command-line entry points resolve, and a wheel holds the data files the code reads."""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
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


# ---- every third-party import is declared ----

SCANNED = ("common", "kernels", "runtime", "builder", "schemas", "models", "tests")
LOCAL_FOLDERS = ("tests", "bench")  # folders whose modules import each other by bare name (tests put bench on sys.path)


def imported_tops(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def third_party_imports() -> dict[str, list[str]]:
    """module -> the files importing it, over the project's code and tests and the bench modules the tests
    import (followed transitively); the standard library, ``toolcall`` and local modules left out."""
    local = {p.stem: p for folder in LOCAL_FOLDERS for p in (ROOT / folder).glob("*.py")}
    files = [p for folder in SCANNED for p in sorted((ROOT / folder).rglob("*.py"))]
    seen, found = set(), {}
    while files:
        path = files.pop()
        if path in seen:
            continue
        seen.add(path)
        for top in imported_tops(path):
            if top in local:
                files.append(local[top])
            elif top not in sys.stdlib_module_names and top not in ("toolcall", "__future__"):
                found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def declared_distributions() -> set[str]:
    """Canonical names of every distribution pyproject declares, in the dependencies or any extra."""
    texts = PROJECT["project"]["dependencies"] + [r for extra in PROJECT["project"]["optional-dependencies"].values()
                                                  for r in extra]
    return {canonical(re.split(r"[\s\[<>=!~;]", text, maxsplit=1)[0]) for text in texts}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_a_declared_dependency():
    """Each module the code and tests import comes from a distribution pyproject declares: a fresh
    environment with the test extra has it (an undeclared import passes only where it happens to be installed)."""
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    bad = []
    for module, files in sorted(third_party_imports().items()):
        dists = {canonical(d) for d in providers.get(module, [])}
        if not dists & declared:
            why = f"from {', '.join(sorted(dists))}" if dists else "installed by no distribution here"
            bad.append(f"{module} ({why}; imported by {', '.join(sorted(files)[:3])}) is declared in no extra")
    assert not bad, "\n".join(bad)


def test_the_scan_sees_an_undeclared_import(monkeypatch):
    """A module imported in a function, here ``wordfreq``, is found, and nothing declares it."""
    fake = ROOT / "models" / "recipe" / "fake.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "def f():\n    import wordfreq.tokens\n")
    assert imported_tops(fake) == {"wordfreq"} and "wordfreq" not in declared_distributions()


def test_the_test_environment_is_pinned():
    """constraints-test.txt pins every distribution of the test extra's closure to one version, and the
    README's test command and CI install with it."""
    pins = [line for line in (ROOT / "constraints-test.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^\s=]+", line) for line in pins), pins
    names = {canonical(line.split("==")[0]) for line in pins}
    assert declared_distributions() - {canonical(PROJECT["project"]["name"])} <= names
    assert '-c constraints-test.txt -e ".[test]"' in (ROOT / "README.md").read_text()
    assert "-c constraints-test.txt" in (ROOT / ".ci" / "run").read_text()
