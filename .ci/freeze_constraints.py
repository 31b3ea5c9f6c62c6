"""Writes constraints-test.txt: the exact version installed here of every distribution that installing
``toolcall-engine[test]`` pulls in (its requirements' closure, extras followed, markers evaluated here).

    python3 .ci/freeze_constraints.py            # after a full test run passed in this environment

The README's test command and .ci/run install with ``-c constraints-test.txt``, so the test environment
changes only when this file is regenerated and committed, on purpose. pyproject.toml keeps the ranges the
code supports; this file, the versions last seen to pass together.
"""
from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "constraints-test.txt"
# installers, left to the environment as ``pip freeze`` leaves them (a venv's own setuptools is older than
# what torch asks for)
BOOTSTRAP = {"pip", "setuptools", "wheel"}
HEADER = ("# The test environment, pinned: what `python3 -m pip install -c constraints-test.txt -e \".[test]\"`\n"
          "# installs (README, .ci/run). Regenerate with `python3 .ci/freeze_constraints.py` after a passing run.\n")


def project_requirements(extras: set[str]) -> list[Requirement]:
    """The project's own requirements with ``extras``, its self-references (``toolcall-engine[gpu,serve]``)
    expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name, optional = canonicalize_name(project["name"]), project["optional-dependencies"]
    out, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == name:
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def closure(roots: list[Requirement]) -> dict[str, str]:
    """canonical name -> installed version of every distribution the requirements reach here."""
    found: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in roots]
    done: set[tuple[str, frozenset]] = set()
    while todo:
        req, extras = todo.pop()
        key = (canonicalize_name(req.name), extras)
        if key in done or key[0] in BOOTSTRAP:
            continue
        done.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{req.name} is required but not installed here: install the test extra first")
        found[key[0]] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            contexts = [{"extra": e} for e in extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(c) for c in contexts):
                todo.append((sub, frozenset(sub.extras)))
    return found


def main() -> None:
    pins = closure(project_requirements({"test"}))
    OUT.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    print(f"wrote {OUT.relative_to(ROOT)}: {len(pins)} distributions")


if __name__ == "__main__":
    main()
