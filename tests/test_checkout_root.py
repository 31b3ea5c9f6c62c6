"""The checkout hides no installed distribution: Python puts the current folder first on sys.path, so a
top-level folder that were a regular package (``kernels/__init__.py``) would be imported instead of, say,
Hugging Face's ``kernels``, which transformers imports. The top-level folders hold no ``__init__.py``:
imported by their bare names they are namespace portions, which lose to a regular package anywhere on
sys.path; installed (setuptools' package-dir) they are ``toolcall.runtime``, ``toolcall.kernels``, ...
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "runtime", "common", "builder", "models", "schemas")


def run_at_root(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_no_top_level_folder_is_a_regular_package():
    assert [f for f in FOLDERS if (ROOT / f / "__init__.py").exists()] == []


def test_installed_distributions_win_over_the_checkouts_folders(tmp_path):
    """A distribution installed under each folder's name (a fake one, in a site folder on PYTHONPATH) is
    what ``import NAME`` gives from the checkout's root."""
    for name in FOLDERS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'installed {name}'\n")
    code = "import importlib; print([importlib.import_module(n).WHO for n in %r])" % (FOLDERS,)
    out = run_at_root(code, PYTHONPATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([f"installed {n}" for n in FOLDERS])


def test_the_real_kernels_distribution_wins_where_installed():
    """Hugging Face's ``kernels`` (transformers imports it) resolves to its installed copy from the root."""
    pytest.importorskip("kernels", reason="Hugging Face's kernels is not installed")
    out = run_at_root("import kernels, transformers; print(kernels.__file__)")
    assert out.returncode == 0, out.stderr
    assert str(ROOT) not in out.stdout and "site-packages" in out.stdout, out.stdout


@pytest.mark.slow
def test_transformers_loads_a_checkpoint_from_the_root(tiny_checkpoint):
    pytest.importorskip("transformers")
    code = ("import transformers; m = transformers.AutoModelForCausalLM.from_pretrained(%r); "
            "print(type(m).__name__)" % str(tiny_checkpoint))
    out = run_at_root(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ForCausalLM")


def test_no_module_edits_sys_path():
    """The project's modules leave sys.path alone (no ``sys.path.insert``, ``append``, assignment)."""
    bad = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                        and node.value.id == "sys"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, bad
