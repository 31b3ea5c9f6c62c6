"""The layering, read from the source: who may import whom.

common <- kernels <- runtime <- builder; models (training code) and bench sit above all.
``runtime`` never imports ``builder`` (a bundle runs without the builder installed);
``kernels`` never imports ``runtime`` or ``builder``; ``common`` imports none of them.
The runtime's load/check/run path imports no web stack (serving code loads only for serve).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {  # package -> top-level packages it must not import
    "common": {"kernels", "runtime", "builder", "models", "bench"},
    "kernels": {"runtime", "builder", "models", "bench"},
    "runtime": {"builder", "models", "bench"},
    "builder": {"models", "bench"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file; relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
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


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    bad = [f"{f.relative_to(ROOT)}:{line} imports {module}"
           for f in files for line, module in imported_modules(f)
           if module.split(".")[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_relative_imports(tmp_path, monkeypatch):
    """A relative import climbing out of runtime/ into builder/ is caught too."""
    fake = ROOT / "runtime" / "cuda" / "backend.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "from ...builder import x\nfrom ..grammar import G\n")
    assert [m for _, m in imported_modules(fake)] == ["builder", "runtime.grammar"]


def test_runtime_cli_loads_no_web_stack():
    """`runtime load/check/run` pull in no web framework: serving code loads only for `runtime serve`."""
    import subprocess
    import sys
    code = ("import sys, runtime.cli, runtime.engine; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fastapi', 'starlette', 'uvicorn', 'prometheus_client', 'aiohttp')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
