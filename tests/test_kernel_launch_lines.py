"""Each kernel's grid is written twice: in its .cu header's "Launch:" line (for the reader of the source)
and in kernels/declarations.py GRIDS (what the launchers use). This reads both and checks they agree on
every size in SIZES.

A header's grid is ``grid (x[, y[, z]])`` over the kernel's int parameters, its file's #defines and
integers, with ``ceil(a / b)`` and ``16 RG`` for 16 * RG; ``name grid (...)`` applies to the entry point
``name`` alone, a plain ``grid (...)`` to every entry point of the file. Two headers bind a letter in
prose, read here as written: ``R = 16 rows for A, 8 for B and C`` (matvec) and ``RG = 4 row groups when
T >= 64, else 1`` (tensor-core linear).
"""
from __future__ import annotations

import itertools
import math
import re

import pytest

from toolcall.kernels.cuda_source import defines, entry_points, kernel_sources
from toolcall.kernels.declarations import GRIDS, declarations

SIZES = (1, 7, 8, 9, 16, 17, 63, 64, 65, 200, 1000)  # each grid size takes each of these (all combinations)


def launch_text(source: str) -> str:
    """The header comment's text from "Launch:" to the end of that comment block, on one line."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if "Launch:" in line)
    block = []
    for line in lines[start:]:
        if not line.startswith("//"):
            break
        block.append(line[2:].strip())
    text = " ".join(block)
    return text[text.index("Launch:") + len("Launch:"):]


def balanced(text: str, open_at: int) -> str:
    """The text inside the parenthesis opening at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    raise ValueError(f"unbalanced parentheses in {text!r}")


def header_grids(text: str, entries: list[str]) -> dict[str, str]:
    """entry point -> its grid's expression as the Launch text writes it."""
    found = {}
    for m in re.finditer(r"(?:(\w+)\s+)?grid\s*\(", text):
        expr = balanced(text, m.end() - 1)
        named = m.group(1) if m.group(1) in entries else None
        for name in [named] if named else entries:
            found.setdefault(name, expr)
    return found


def prose_bindings(text: str, entry: str, sizes: dict[str, int]) -> dict[str, int]:
    """The letters a header binds in prose (module docstring), for ``entry`` at ``sizes``."""
    out = {}
    m = re.search(r"\bR = (\d+) rows for (\w+), (\d+) for (\w+) and (\w+)", text)
    if m:
        out["R"] = int(m.group(1)) if entry == m.group(2) else int(m.group(3)) if entry in m.group(4, 5) else None
    m = re.search(r"\bRG = (\d+) row groups when T >= (\d+), else (\d+)", text)
    if m:
        out["RG"] = int(m.group(1)) if sizes["T"] >= int(m.group(2)) else int(m.group(3))
    return out


def evaluate(expr: str, names: dict[str, int]) -> tuple[int, ...]:
    python = re.sub(r"\b(\d+)\s+([A-Za-z_]\w*)", r"\1 * \2", expr)  # "16 RG" -> "16 * RG"
    value = eval(python, {"__builtins__": {}, "ceil": math.ceil}, dict(names))  # noqa: S307 (our own header text)
    return tuple(int(v) for v in (value if isinstance(value, tuple) else (value,)))


def per_file() -> list[tuple[str, str, list[str]]]:
    entries = entry_points()
    return [(path.stem, path.read_text(), sorted(n for n, e in entries.items() if e.file == path.stem))
            for path in kernel_sources()]


@pytest.mark.parametrize("stem,source,entries", per_file(), ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_the_header_grid_is_the_declared_grid(stem, source, entries):
    assert entries, f"kernels/{stem}.cu has no entry point"
    text = launch_text(source)
    grids = header_grids(text, entries)
    assert set(grids) == set(entries), f"kernels/{stem}.cu: no Launch grid for {sorted(set(entries) - set(grids))}"
    decls, consts = declarations(), {k: v for k, v in defines().items() if isinstance(v, int)}
    for name in entries:
        decl = decls[name]
        for values in itertools.product(SIZES, repeat=len(decl.sizes)):
            sizes = dict(zip(decl.sizes, values))
            names = {**consts, **sizes, **prose_bindings(text, name, sizes)}
            header = evaluate(grids[name], names)
            declared = tuple(GRIDS[name](**sizes))
            assert header == declared, (f"{name} at {sizes}: kernels/{stem}.cu's Launch line gives {header}, "
                                        f"kernels/declarations.py GRIDS {declared}")


def test_the_checker_sees_a_disagreement():
    """A header grid off by its tile size fails the comparison (the check can fail)."""
    text = "grid (ceil(vocab / 8), ceil(T / 8)), block 256."
    expr = header_grids(text, ["head_dense"])["head_dense"]
    assert evaluate(expr, {"vocab": 100, "T": 9}) != tuple(GRIDS["head_dense"](vocab=100, T=9))
