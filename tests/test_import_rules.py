"""The layering, read from the source: who may import whom.

Packages: common <- kernels <- runtime <- builder; models (training code) and bench sit above all.
``runtime`` never imports ``builder`` (a bundle runs without the builder installed); ``kernels``
never imports ``runtime`` or ``builder``; ``common`` imports none of them. Every project import goes
through the ``toolcall`` namespace (an installed project adds no top-level ``runtime``, ``kernels``...).

Inside ``runtime/`` the rooms have floors (``RUNTIME_FLOORS``): a room imports only rooms on lower
floors, so the engine, the batcher and the server never import a backend: they get one from the
registry in runtime/backends.py. The load/check/run path imports no web stack.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "kernels", "runtime", "builder", "schemas", "models")

FORBIDDEN = {  # package -> packages it must not import
    "common": {"kernels", "runtime", "builder", "models", "bench"},
    "kernels": {"runtime", "builder", "models", "bench"},
    "runtime": {"builder", "models", "bench"},
    "builder": {"models", "bench"},
}

# runtime's rooms (a folder, or a module at its top), lowest floor first; a room imports only rooms on
# floors below its own (cpu and cuda share a floor and never import each other)
RUNTIME_FLOORS = (
    {"jit", "console"},
    {"grammar"},
    {"bundle"},
    {"batching"},
    {"cpu", "cuda"},
    {"backends"},
    {"engine"},
    {"serve"},
    {"cli"},
)
# the backends' rooms: besides each other's own modules, only the registry (runtime/backends.py) imports them
BACKEND_ROOMS = {"cpu", "cuda"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name under the namespace) of every import in a file; relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = ("toolcall", *path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def project_part(module: str) -> tuple[str, ...]:
    """("runtime", "cpu", ...) for toolcall.runtime.cpu...; () for a module outside the project."""
    parts = module.split(".")
    return tuple(parts[1:]) if parts[0] == "toolcall" else ()


def source_files(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package):
    bad = [f"{f.relative_to(ROOT)}:{line} imports {module}"
           for f in source_files(package) for line, module in imported_modules(f)
           if project_part(module)[:1] and project_part(module)[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def floor_of(room: str) -> int:
    return next(i for i, rooms in enumerate(RUNTIME_FLOORS) if room in rooms)


def test_runtime_rooms_import_only_lower_floors():
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "runtime").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert rooms == set().union(*RUNTIME_FLOORS), "a runtime room without a floor (or a floor without its room)"
    bad = []
    for f in source_files("runtime"):
        parts = f.relative_to(ROOT / "runtime").with_suffix("").parts
        room = parts[0]
        for line, module in imported_modules(f):
            target = project_part(module)
            if len(target) < 2 or target[0] != "runtime" or target[1] == room:
                continue
            if floor_of(target[1]) >= floor_of(room):
                bad.append(f"runtime/{'/'.join(parts)}.py:{line} ({room}) imports {module} ({target[1]})")
            elif target[1] in BACKEND_ROOMS and room != "backends":
                bad.append(f"runtime/{'/'.join(parts)}.py:{line} ({room}) imports the backend {module}: ask "
                           "runtime/backends.py instead")
    assert not bad, "\n".join(bad)


def test_runtime_top_holds_at_most_five_modules():
    """runtime/'s top is its entry points and registry; everything else lives in a room (a folder)."""
    modules = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 5, f"runtime/ has {len(modules)} modules at its top: {modules}"


def test_every_project_import_goes_through_the_namespace():
    """No module imports a checkout folder by its bare name (installed, there is none to find)."""
    bad = [f"{f.relative_to(ROOT)}:{line} imports {module}"
           for package in (*PACKAGES, "tests", "bench") for f in sorted((ROOT / package).rglob("*.py"))
           for line, module in imported_modules(f) if module.split(".")[0] in PACKAGES]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_relative_imports(monkeypatch):
    """A relative import climbing out of runtime/ into builder/ is caught too."""
    fake = ROOT / "runtime" / "cuda" / "backend.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "from ...builder import x\nfrom ..grammar import G\n")
    assert [m for _, m in imported_modules(fake)] == ["toolcall.builder", "toolcall.runtime.grammar"]


def test_runtime_cli_loads_no_web_stack():
    """`runtime load/check/run` pull in no web framework: serving code loads only for `runtime serve`."""
    code = ("import sys, toolcall.runtime.cli, toolcall.runtime.engine; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fastapi', 'starlette', 'uvicorn', 'prometheus_client', 'aiohttp')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_installed_project_adds_no_top_level_module(tmp_path):
    """Run from outside the checkout, none of the folders' bare names resolves into this project."""
    code = ("import importlib.util, json; print(json.dumps({n: getattr(importlib.util.find_spec(n), 'origin', None) "
            f"for n in {list(PACKAGES)!r}}}))")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    import json
    found = {name: origin for name, origin in json.loads(out.stdout).items()
             if origin is not None and str(ROOT) in str(Path(origin).resolve())}
    assert not found, f"bare imports resolving into the checkout: {found}"
