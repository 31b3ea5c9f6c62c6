"""Uniform weight average of same-shaped Hugging Face folders (a model soup / SWA along one run).

    python3 -m toolcall.models.recipe.average OUT SNAPSHOT [SNAPSHOT ...]

Every SNAPSHOT is a folder as toolcall.models.recipe.train writes it (config.json, model.safetensors,
tokenizer and generation files). OUT gets the elementwise mean of their model.safetensors tensors,
computed in float32 and stored in the first folder's dtypes, and a copy of the first folder's other
files. The folders must hold the same tensor names with the same shapes and dtypes, and the same
config.json; anything else is refused with the first difference named.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

WEIGHTS = "model.safetensors"


class MismatchError(ValueError):
    """The folders cannot be averaged: their tensors or configs differ."""


def _check_same(first: Path, other: Path, tensors: dict, first_tensors: dict) -> None:
    """Raises MismatchError naming the first difference between two folders' tensors or configs."""
    missing, extra = sorted(set(first_tensors) - set(tensors)), sorted(set(tensors) - set(first_tensors))
    if missing or extra:
        raise MismatchError(f"{other} has different tensor names than {first}: "
                            f"missing {missing[:3]}, extra {extra[:3]}")
    for name, t in first_tensors.items():
        if tuple(tensors[name].shape) != tuple(t.shape) or tensors[name].dtype != t.dtype:
            raise MismatchError(f"{other}: {name} is {tuple(tensors[name].shape)} {tensors[name].dtype}, "
                                f"{first} has {tuple(t.shape)} {t.dtype}")
    if json.loads((other / "config.json").read_text()) != json.loads((first / "config.json").read_text()):
        raise MismatchError(f"{other}/config.json differs from {first}/config.json")


def average_tensors(folders: Sequence[Path]) -> dict:
    """name -> the mean over ``folders`` of that model.safetensors tensor, in the first folder's dtype."""
    import torch
    from safetensors.torch import load_file

    if not folders:
        raise MismatchError("nothing to average: no folder given")
    first = load_file(str(folders[0] / WEIGHTS))
    sums = {name: t.to(torch.float32) for name, t in first.items()}
    for folder in folders[1:]:
        tensors = load_file(str(folder / WEIGHTS))
        _check_same(folders[0], folder, tensors, first)
        for name, t in tensors.items():
            sums[name] += t.to(torch.float32)
    return {name: (s / len(folders)).to(first[name].dtype).contiguous() for name, s in sums.items()}


def write_average(out: Path, folders: Sequence[Path]) -> None:
    """Writes OUT: the first folder's files with model.safetensors replaced by the average."""
    from safetensors.torch import save_file

    folders = [Path(f) for f in folders]
    out = Path(out)
    if out.resolve() in {f.resolve() for f in folders}:
        raise MismatchError(f"{out} is one of the inputs")
    tensors = average_tensors(folders)
    tmp = out.parent / f".{out.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folders[0], tmp, ignore=shutil.ignore_patterns(WEIGHTS))
    save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: OUT SNAPSHOT [SNAPSHOT ...]."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("snapshots", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        write_average(args.out, args.snapshots)
    except MismatchError as e:
        sys.exit(f"average: {e}")
    print(f"wrote {args.out}: mean of {len(args.snapshots)} folders")


if __name__ == "__main__":
    main()
