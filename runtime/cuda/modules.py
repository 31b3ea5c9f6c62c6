"""The bundle's kernels on the device: the cubins a CudaModel needs (the step's and its kernel family's), read
from the bundle folder and loaded, with a typed refusal naming a missing file.

Every GPU bundle holds one cubin per kernels/*.cu (builder/kernel_build.py); a model loads only the files of the
kernels it launches, so a bundle built before a family existed still loads with the other family."""
from __future__ import annotations

from pathlib import Path

from toolcall.common.errors import CudaError, Refusal
from toolcall.common.formats import BF16, WEIGHT_FORMATS
from toolcall.kernels.declarations import declaration
from toolcall.kernels.geometry import DECODE_KERNELS, MATVEC_FORMATS, KernelFamily, matvec_kernel
from toolcall.runtime.bundle.checks import check_cubin
from toolcall.runtime.bundle.files import KERNELS_DIR

DENSE_HEAD = matvec_kernel(BF16)  # every row of the head (dense_logits), in every kernel family's model


def required_kernels(family: KernelFamily) -> tuple[str, ...]:
    """The kernels a CudaModel loads: the step's, with ``family``'s linear layers and prefill attention."""
    return ("embed_gather", "qk_norm_rope_kv", *DECODE_KERNELS, "rmsnorm", "grammar_candidates", "head_sparse",
            "grammar_advance", "sample_draw", DENSE_HEAD, *family.prefill_attention,
            *(matvec_kernel(f, family=family) for f in MATVEC_FORMATS))


def read_cubins(folder: Path) -> dict[str, bytes]:
    """kernels/<file>.cubin of a bundle folder, by file stem."""
    return {p.stem: p.read_bytes() for p in sorted((Path(folder) / KERNELS_DIR).glob("*.cubin"))}


def load_modules(gpu, cubins: dict[str, bytes], family: KernelFamily, strict: bool,
                 errors: dict[str, str]) -> dict[str, object]:
    """The modules of ``family``'s required kernels by file stem (``gpu.load`` of each cubin). A missing cubin is
    refused (bundle_invalid, naming a file of a format's old name where the bundle has one); a cubin that does not
    load raises with ``strict``, else its error goes to ``errors`` (its kernels then raise when looked up)."""
    modules = {}
    needed = required_kernels(family)
    for file in sorted({declaration(fn).file for fn in needed}):
        if file not in cubins:
            old = [f"{KERNELS_DIR}/{file.replace(f.name, alias)}.cubin" for f in WEIGHT_FORMATS
                   for alias in f.aliases if f.name in file and file.replace(f.name, alias) in cubins]
            why = f" (the bundle holds {old[0]}: it was built when {file}'s format had its old name)" if old else ""
            raise Refusal("bundle_invalid", f"{KERNELS_DIR}/{file}.cubin is missing{why}; rebuild the bundle for "
                          "a GPU target", file=f"{KERNELS_DIR}/{file}.cubin", old_spelling=old[0] if old else None)
        check_cubin(file, cubins[file], [fn for fn in needed if declaration(fn).file == file])
        try:
            modules[file] = gpu.load(cubins[file])
        except CudaError as e:
            if strict:
                raise CudaError("cuda_error", f"{KERNELS_DIR}/{file}.cubin does not load on this device: "
                                f"{e.message}", file=f"{KERNELS_DIR}/{file}.cubin", **e.details) from None
            errors[file] = e.message
    return modules
