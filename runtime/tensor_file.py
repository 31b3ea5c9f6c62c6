"""safetensors files read by memory map and written by streaming, F8_E4M3 included.

Layout: u64 little-endian header length N, N bytes of JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8, then the tensors' bytes back to back.
``safetensors.numpy`` cannot read F8_E4M3 back, so both directions live here.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from common.errors import CheckpointError

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # byte offset into the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class SafetensorsFile:
    """Memory-mapped safetensors file; ``get`` returns zero-copy read-only views."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fh = open(self.path, "rb")
        except OSError as e:
            raise CheckpointError("checkpoint_invalid", f"{self.path}: cannot open tensor file ({e.strerror})",
                                  file=str(self.path)) from None
        size = os.fstat(self._fh.fileno()).st_size
        if size < 8:
            self.close()
            raise CheckpointError("checkpoint_invalid",
                                  f"{self.path}: truncated safetensors file: {size} bytes, expected at least 8",
                                  file=str(self.path), bytes=size)
        (n,) = struct.unpack("<Q", self._fh.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            self.close()
            raise CheckpointError("checkpoint_invalid",
                                  f"{self.path}: header length {n} exceeds file size {size}: truncated or not safetensors",
                                  file=str(self.path), header_bytes=n, bytes=size)
        try:
            header = json.loads(self._fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self.close()
            raise CheckpointError("checkpoint_invalid", f"{self.path}: header is not valid JSON ({e})",
                                  file=str(self.path)) from None
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_bytes = size - self._data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            dtype = entry.get("dtype")
            if dtype not in DTYPES:
                self.close()
                raise CheckpointError("tensor_invalid", f"{self.path}: tensor {name!r} has dtype {dtype!r}; "
                                      f"supported: {', '.join(DTYPES)}", file=str(self.path), tensor=name)
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
            expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
            if end - begin != expected or end > data_bytes or begin < 0:
                self.close()
                raise CheckpointError(
                    "tensor_invalid",
                    f"{self.path}: tensor {name!r} {dtype}{list(shape)} needs {expected} bytes at [{begin}, {end}) "
                    f"but the data section holds {data_bytes} bytes: the file is truncated or corrupt",
                    file=str(self.path), tensor=name, expected_bytes=expected, data_bytes=data_bytes)
            self.tensors[name] = TensorInfo(name, dtype, shape, begin, end)
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else None

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError("tensor_invalid", f"{self.path}: no tensor named {name!r}",
                                  file=str(self.path), tensor=name)
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=self._data_start + info.begin)
        return raw.view(DTYPES[info.dtype]).reshape(info.shape)

    def close(self) -> None:
        # Views handed out keep the mmap alive through their buffer; closing only drops our references.
        self._mm = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SafetensorsWriter:
    """Streams tensors into a safetensors file whose header is fixed up front.

    ``specs`` is ``[(name, dtype_name, shape), ...]`` in file order; ``write`` must then be
    called once per tensor in that same order, so the model is never held in memory twice.
    """

    def __init__(self, path: str | os.PathLike, specs: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        self.path = Path(path)
        header: dict = {}
        if metadata:
            header["__metadata__"] = dict(sorted(metadata.items()))
        offset = 0
        self._order: list[tuple[str, str, tuple[int, ...]]] = []
        for name, dtype, shape in specs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            self._order.append((name, dtype, tuple(shape)))
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._fh = open(self.path, "wb")
        self._fh.write(struct.pack("<Q", len(blob)))
        self._fh.write(blob)
        self._next = 0

    def write(self, name: str, array: np.ndarray) -> None:
        exp_name, exp_dtype, exp_shape = self._order[self._next]
        assert name == exp_name, f"tensor order: expected {exp_name}, got {name}"
        assert DTYPE_NAMES[array.dtype] == exp_dtype and tuple(array.shape) == exp_shape, \
            f"{name}: expected {exp_dtype}{list(exp_shape)}, got {array.dtype}{list(array.shape)}"
        self._fh.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)  # no bytes copy
        self._next += 1

    def close(self) -> None:
        assert self._next == len(self._order), f"wrote {self._next} of {len(self._order)} tensors"
        self._fh.close()

    def abort(self) -> None:
        """Closes and deletes the partial file (a failed build leaves nothing behind)."""
        self._fh.close()
        self.path.unlink(missing_ok=True)


def write_tensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Writes a whole dict of arrays (in the dict's order) as one safetensors file."""
    writer = SafetensorsWriter(path, [(k, DTYPE_NAMES[v.dtype], tuple(v.shape)) for k, v in tensors.items()], metadata)
    for k, v in tensors.items():
        writer.write(k, v)
    writer.close()
