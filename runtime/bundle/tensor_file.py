"""safetensors files read by memory map and written by streaming, F8_E4M3 included.

Layout: u64 little-endian header length N, N bytes of JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8, then the tensors' bytes back to back.
``safetensors.numpy`` cannot read F8_E4M3 back, so both directions live here.
"""
from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from toolcall.common.errors import CheckpointError, Refusal
from toolcall.runtime.bundle.file_kind import require_file

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


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    """json object_pairs_hook: a key named twice is an error (json would keep the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _is_count(x) -> bool:
    """A JSON integer >= 0 (not a bool, not 2.0)."""
    return type(x) is int and x >= 0


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
    """Memory-mapped safetensors file; ``get`` returns zero-copy read-only views.

    The header is checked whole before any tensor is handed out: a JSON object of entries
    ``{"dtype", "shape", "data_offsets"}`` with integer shapes and offsets, each tensor's bytes
    equal to its shape times its dtype's size, and the tensors tiling the data section exactly
    (sorted by offset: no overlap, no hole, nothing after the last). Only the header is read
    (at most the file's size); tensor data stays on disk until ``get``.

    ``error_code``: None for a checkpoint file (CheckpointError checkpoint_invalid/tensor_invalid);
    a code such as "bundle_invalid" for a bundle's file (a Refusal with that code).
    """

    def __init__(self, path: str | os.PathLike, error_code: str | None = None):
        self.path = Path(path)
        self._fh = None
        self._mm = None
        self._error_code = error_code
        require_file(self.path, lambda msg, **d: self._error("checkpoint_invalid", msg, **d), "a safetensors file")
        try:
            self._fh = open(self.path, "rb")
            size = os.fstat(self._fh.fileno()).st_size
            self._parse(size)
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            self.close()
            raise self._error("checkpoint_invalid", f"{self.path}: cannot read tensor file ({e.strerror})",
                              file=str(self.path)) from None
        except BaseException:
            self.close()
            raise

    def _error(self, code: str, message: str, **details):
        if self._error_code is None:
            return CheckpointError(code, message, **details)
        return Refusal(self._error_code, message + " (a bundle file: rebuild or copy the bundle again)", **details)

    def _bad(self, what: str, code: str = "checkpoint_invalid", **details):
        return self._error(code, f"{self.path}: {what}; expected a safetensors file", file=str(self.path), **details)

    def _parse(self, size: int) -> None:
        if size < 8:
            raise self._bad(f"truncated: {size} bytes, a safetensors file has at least 8", bytes=size)
        (n,) = struct.unpack("<Q", self._fh.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise self._bad(f"header length {n} exceeds the file's {size} bytes (or {MAX_HEADER_BYTES}): truncated",
                            header_bytes=n, bytes=size)
        raw = self._fh.read(n)
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._bad(f"header is not valid JSON ({e})") from None
        except RecursionError:
            raise self._bad("header JSON is nested too deeply") from None
        except _DuplicateKey as e:
            raise self._bad(f"header names {e.args[0]!r} twice", tensor=e.args[0]) from None
        if not isinstance(header, dict):
            raise self._bad(f"header is a JSON {type(header).__name__}, expected an object of tensors")
        metadata = header.pop("__metadata__", None)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._bad("__metadata__ must be an object of strings")
        self.metadata: dict[str, str] = metadata
        self._data_start = 8 + n
        self.data_bytes = size - self._data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            self.tensors[name] = self._entry(name, entry)
        # The tensors must tile the data section: sorted by offset, each begins where the last ended.
        cursor = 0
        for info in sorted(self.tensors.values(), key=lambda i: (i.begin, i.end)):
            if info.begin != cursor:
                what = "overlaps the tensor before it" if info.begin < cursor else "leaves a hole before it"
                raise self._bad(f"tensor {info.name!r} at [{info.begin}, {info.end}) {what} (previous end "
                                f"{cursor}): offsets must tile the data section", "tensor_invalid",
                                tensor=info.name, expected=cursor, found=info.begin)
            cursor = info.end
        if cursor != self.data_bytes:
            raise self._bad(f"tensors end at byte {cursor} of a {self.data_bytes}-byte data section: "
                            f"{'truncated' if cursor > self.data_bytes else 'unindexed bytes at the end'}",
                            "tensor_invalid", expected=cursor, found=self.data_bytes)

    def _entry(self, name: str, entry) -> TensorInfo:
        def bad(what: str, **details):
            return self._bad(f"tensor {name!r}: {what}", "tensor_invalid", tensor=name, **details)
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise bad(f"entry must be an object with exactly dtype, shape, data_offsets; found {found}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad(f"dtype {dtype!r}; supported: {', '.join(DTYPES)}", found=repr(dtype)[:40])
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise bad(f"shape {shape!r:.80} must be a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(x) for x in offsets)
                or offsets[0] > offsets[1]):
            raise bad(f"data_offsets {offsets!r:.80} must be [begin, end] integers, 0 <= begin <= end")
        expected = math.prod(shape) * DTYPES[dtype].itemsize  # Python ints: no overflow
        begin, end = offsets
        if end - begin != expected or end > self.data_bytes:
            raise bad(f"{dtype}{shape} needs {expected} bytes at [{begin}, {end}) but the data section holds "
                      f"{self.data_bytes} bytes: the file is truncated or corrupt", expected_bytes=expected,
                      data_bytes=self.data_bytes)
        return TensorInfo(name, dtype, tuple(shape), begin, end)

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise self._error("tensor_invalid", f"{self.path}: no tensor named {name!r}", file=str(self.path),
                              tensor=name)
        if info.nbytes == 0:
            return np.zeros(info.shape, DTYPES[info.dtype])
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=self._data_start + info.begin)
        return raw.view(DTYPES[info.dtype]).reshape(info.shape)

    def release(self, name: str) -> None:
        """Drop this process's resident pages inside tensor ``name``'s bytes (after copying it: RSS stops
        counting them). Views stay valid: a later read faults the pages in again from the file."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-(self._data_start + info.begin) // page) * page  # whole pages only: neighbours keep theirs
        end = (self._data_start + info.end) // page * page
        if self._mm is not None and end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

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
    Bytes go straight to the file descriptor (no Python buffer), every short write is
    continued, and ``close`` reads the header and the file size back (through the OS: what the
    file now holds, not what reached the disk): a header or size that differs from what was
    written raises OSError (EIO) instead of becoming a bundle. Tensor bytes are not read back.
    (On an H200 machine's Python 3.12 the buffered writer left zeros in the header's 4 padding
    bytes of one NVFP4 build, 2026-12-04; cause not established.)
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
        self._head = struct.pack("<Q", len(blob)) + blob
        self._size = len(self._head) + offset
        self._fh = open(self.path, "wb", buffering=0)
        try:
            self._put(self._head)
        except BaseException:
            self.abort()
            raise
        self._next = 0

    def _put(self, data) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = self._fh.write(view)
            if not n:
                raise OSError(errno.EIO, f"{self.path}: the file system accepted no bytes of a write", str(self.path))
            view = view[n:]

    def write(self, name: str, array: np.ndarray) -> None:
        exp_name, exp_dtype, exp_shape = self._order[self._next]
        assert name == exp_name, f"tensor order: expected {exp_name}, got {name}"
        assert DTYPE_NAMES[array.dtype] == exp_dtype and tuple(array.shape) == exp_shape, \
            f"{name}: expected {exp_dtype}{list(exp_shape)}, got {array.dtype}{list(array.shape)}"
        self._put(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)  # no bytes copy
        self._next += 1

    def close(self) -> None:
        assert self._next == len(self._order), f"wrote {self._next} of {len(self._order)} tensors"
        self._fh.close()
        with open(self.path, "rb") as fh:
            head, size = fh.read(len(self._head)), os.fstat(fh.fileno()).st_size
        if head != self._head or size != self._size:
            where = f"size {size} bytes, expected {self._size}"
            if head != self._head:
                first = next((i for i, (a, b) in enumerate(zip(head, self._head)) if a != b), len(head))
                where += f"; header byte {first} of {len(self._head)} differs"
            raise OSError(errno.EIO, f"{self.path} reads back differently from what was written ({where}): "
                          "the file did not keep the bytes written to it; write it again", str(self.path))

    def abort(self) -> None:
        """Closes and deletes the partial file (a failed build leaves nothing behind)."""
        self._fh.close()
        self.path.unlink(missing_ok=True)


def write_tensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Writes a whole dict of arrays (in the dict's order) as one safetensors file."""
    writer = SafetensorsWriter(path, [(k, DTYPE_NAMES[v.dtype], tuple(v.shape)) for k, v in tensors.items()], metadata)
    try:
        for k, v in tensors.items():
            writer.write(k, v)
        writer.close()
    except BaseException:
        writer.abort()  # no file that failed its check stays at its name
        raise
