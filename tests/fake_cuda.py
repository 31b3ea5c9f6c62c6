"""Builds tests/fake_libcuda.c into a stand-in ``libcuda.so.1`` (system gcc, the CUDA headers of
the nvidia-cuda-runtime wheel) and gives the environment that puts it first on the loader path
of a subprocess, so the real cuda-bindings talk to it. See fake_libcuda.c for what it emulates
and the fault-injection variables (FAKE_CUDA_FAIL_LAUNCH, FAKE_CUDA_WHILE_FOREVER, FAKE_CUDA_LOG).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_libcuda.c")


def unavailable() -> str | None:
    """Why the stand-in cannot be built here (no gcc, no cuda.h), or None."""
    if shutil.which("gcc") is None:
        return "no gcc on this machine"
    try:
        from toolcall.kernels.nvrtc_build import include_dir
        if not (Path(include_dir()) / "cuda.h").is_file():
            return f"no cuda.h in {include_dir()}"
    except Exception as e:  # the headers wheel is missing
        return f"no CUDA headers ({type(e).__name__}: {e})"
    return None


def build(folder: Path) -> Path:
    """Compiles the stand-in into ``folder``/libcuda.so.1; returns the folder."""
    from toolcall.kernels.nvrtc_build import include_dir
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-unused-function",
                    f"-I{include_dir()}", "-o", str(folder / "libcuda.so.1"), str(SOURCE), "-ldl"],
                   check=True, capture_output=True, text=True)
    return folder


def env(folder: Path, log: Path | None = None, **faults) -> dict:
    """os.environ with the stand-in first on LD_LIBRARY_PATH, a call log and fault variables
    (``fail_launch=N``, ``while_forever=True``)."""
    out = dict(os.environ)
    out["LD_LIBRARY_PATH"] = os.pathsep.join([str(folder), out.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    for key in ("FAKE_CUDA_FAIL_LAUNCH", "FAKE_CUDA_WHILE_FOREVER", "FAKE_CUDA_LOG"):
        out.pop(key, None)
    if log is not None:
        out["FAKE_CUDA_LOG"] = str(log)
    if faults.get("fail_launch"):
        out["FAKE_CUDA_FAIL_LAUNCH"] = str(int(faults["fail_launch"]))
    if faults.get("while_forever"):
        out["FAKE_CUDA_WHILE_FOREVER"] = "1"
    return out
