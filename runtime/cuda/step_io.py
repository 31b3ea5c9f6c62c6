"""The device serving step's plan and record: one packed buffer each way (runtime/cuda/device_step.py).

Per step the host fills the plan fields of a host buffer, copies the whole buffer to the device in one copy,
the device runs the step, and one copy brings it back with the record fields filled. R = the sampled rows a
step holds (min(max_tokens_per_step, max_sequences)), M = candidate columns, W = grammar state words
(1 + bitset words). Rows are packed grammar group by grammar group (each group's rows contiguous).

plan   out_row int32 [R]     the forward row whose hidden state the row samples (-1: a padding row)
       seq int32 [R]         the row's index in its group's state rows (-1: padding; the grammar kernels skip it)
       token, pos int32 [R]  the row's token and position (grammar_advance's token_in / pos_in)
       answer int32 [R]      the answer token the pick is (its index: the draw's counter)
       max_tools int32 [R], allow_empty uint8 [R]: the row's answer rules
       inv_temperature, top_p float32 [R], seed uint64 [R]: its sampling (inv_temperature 0: greedy)
       state uint64 [R * W]  each row's grammar state, stride its group's own W
       status, out_len int32 [R]: zero (grammar_advance's bookkeeping: one token a step)
record pick int32 [R]        the drawn column (-1: greedy, grammar_advance chose)
       token_out, pos_out int32 [R]; status int32 [R] (3: a dead end); state (advanced in place)
       cand int32 [R, M], valid uint8 [R, M], logits float32 [R, M]: each row's candidates and their logits
       (margins and kept logits); out_tokens int32 [R]: grammar_advance's scratch
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.launch import DeviceArray

ALIGN = 16


def bucket(rows: int, room: int) -> int:
    """The rows a group of ``rows`` sampled rows is launched with: the next power of two, within ``room`` (the
    buffer rows left), so the sample launches of a step come from a few shapes (one packed program each)."""
    assert 0 < rows <= room, (rows, room)
    return min(1 << (rows - 1).bit_length(), room)


def fields(rows: int, columns: int, words: int) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of every field, in buffer order (module docstring)."""
    i32, u8, f32, u64 = np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.uint64)
    r, m = rows, columns
    return [("seed", u64, (r,)), ("state", u64, (r * words,)),
            *((name, i32, (r,)) for name in ("out_row", "seq", "token", "pos", "answer", "max_tools", "status",
                                             "out_len", "pick", "token_out", "pos_out", "out_tokens")),
            ("inv_temperature", f32, (r,)), ("top_p", f32, (r,)), ("logits", f32, (r, m)), ("cand", i32, (r, m)),
            ("allow_empty", u8, (r,)), ("valid", u8, (r, m))]


def step_io_bytes(rows: int, columns: int, words: int) -> int:
    return StepLayout(rows, columns, words).nbytes


class StepLayout:
    """Byte offsets of the fields in one buffer (each ALIGN-aligned)."""

    def __init__(self, rows: int, columns: int, words: int):
        self.rows, self.columns, self.words = rows, columns, words
        self.offsets, self.specs, end = {}, {}, 0
        for name, dtype, shape in fields(rows, columns, words):
            self.offsets[name], self.specs[name] = end, (dtype, shape)
            end += -(-int(np.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN
        self.nbytes = end


class StepIO:
    """The host buffer (numpy views by field name) and its device twin ``base`` (the workspace's "step_io":
    ``device(name, row)`` is a view starting at a row, for one group's launches)."""

    def __init__(self, gpu, base: DeviceArray, rows: int, columns: int, words: int):
        self.layout = StepLayout(rows, columns, words)
        assert base.nbytes >= self.layout.nbytes, (base.nbytes, self.layout.nbytes)
        self.host = np.zeros(self.layout.nbytes, np.uint8)
        self.gpu, self.base = gpu, DeviceArray(base.ptr, self.layout.nbytes)
        self.views = {name: self.host[off:].view(dtype)[:int(np.prod(shape))].reshape(shape)
                      for name, off in self.layout.offsets.items() for dtype, shape in [self.layout.specs[name]]}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.views[name]

    def device(self, name: str, row: int = 0, row_bytes: int | None = None) -> DeviceArray:
        """The device view of field ``name`` from row ``row`` (``row_bytes`` a row; default the field's own)."""
        dtype, shape = self.layout.specs[name]
        step = row_bytes if row_bytes is not None else dtype.itemsize * int(np.prod(shape[1:]))
        start = self.layout.offsets[name] + row * step
        return DeviceArray(self.base.ptr + start, int(np.prod(shape)) * dtype.itemsize - row * step)

    def clear(self) -> None:
        self.host.fill(0)

    def upload(self) -> None:
        self.gpu.copy_in(self.base, self.host)

    def download(self) -> None:
        self.host[:] = self.gpu.download(self.base, (self.layout.nbytes,), np.uint8)
