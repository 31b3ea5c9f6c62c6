"""Per-lane fragment layout of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, two sources.

ops_mma's A_MAP[lane, j] = (row, col) of A (16x16, M x K), B_MAP[lane, j] = (k, n) of B (16x8),
C_MAP[lane, j] = (m, n) of C/D (16x8). For A and B, j = 2*register + half (half 0 = low 16 bits);
for C, j = register (c0..c3 / d0..d3). Each map is checked (1) to be a bijection onto its tile,
(2) against the PTX ISA formulas, (3) against CuTe's (thread, value) layouts, evaluated here.
"""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.kernels.sim.ops_mma import A_MAP, B_MAP, C_MAP


# --- Source 1: PTX ISA 9.0, section 9.7.14.5.8 (the number moves between versions; the anchor
# does not) "Matrix Fragments for mma.m16n8k16 with floating point type", docs.nvidia.com/cuda/
# parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float (.f16/.bf16 A and B; C/D).
# Elements are listed "low to high": a0, a1 share the first .f16x2 register (a0 in the low half),
# a2, a3 the second, ...; so its i is our j. Formulas:
#   groupID = %laneid >> 2;  threadID_in_group = %laneid % 4
#   A: row = groupID for ai with 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise
#      col = threadID_in_group*2 + (i & 1), + 8 for ai with i >= 4
#   B: row = threadID_in_group*2 + (i & 1), + 8 for bi with i >= 2;  col = groupID
#   C: row = groupID for ci with i < 2, groupID + 8 for i >= 2;  col = threadID_in_group*2 + (i & 1)
def ptx_maps() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, c = (np.zeros((32, n, 2), np.int64) for n in (8, 4, 4))
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            a[lane, i] = (group if (i < 2 or 4 <= i < 6) else group + 8,
                          tig * 2 + (i & 1) + (8 if i >= 4 else 0))
        for i in range(4):
            b[lane, i] = (tig * 2 + (i & 1) + (8 if i >= 2 else 0), group)
            c[lane, i] = (group if i < 2 else group + 8, tig * 2 + (i & 1))
    return a, b, c


# --- Source 2: CuTe. Copied literally from NVIDIA/cutlass, include/cute/atom/mma_traits_sm80.hpp,
# commit 7107b05535f8977f5ecb9d01ee203205b1fd9bc4: MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>
# inherits MMA_Traits<SM80_16x8x16_F16F16F16F16_TN>, whose
#   ALayout = Layout<Shape <Shape < _4,_8>,Shape < _2,_2,  _2>>,
#                    Stride<Stride<_32,_1>,Stride<_16,_8,_128>>>;
#   BLayout = Layout<Shape <Shape < _4,_8>,Shape <_2, _2>>,
#                    Stride<Stride<_16,_1>,Stride<_8,_64>>>;
#   CLayout = SM80_16x8_Row = Layout<Shape <Shape < _4,_8>,Shape < _2,_2>>,
#                                    Stride<Stride<_32,_1>,Stride<_16,_8>>>;
# Each maps (thread, value) to a flat column-major index into the (M,K) / (N,K) / (M,N) tile
# (include/cute/atom/mma_traits.hpp). mma_unpack there recasts the 8 (A) / 4 (B) 16-bit values to
# uint32 registers in order (value 2r in the low half of register r: little endian), and
# SM80_16x8x16_F32BF16BF16F32_TN::fma (include/cute/arch/mma_sm80.hpp) passes a0..a3, b0..b1,
# c0..c3 to the asm operands in order. So CuTe's value index v is our j.
CUTE_A = (((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))
CUTE_B = (((4, 8), (2, 2)), ((16, 1), (8, 64)))
CUTE_C = (((4, 8), (2, 2)), ((32, 1), (16, 8)))


def cute_size(shape) -> int:
    return shape if isinstance(shape, int) else int(np.prod([cute_size(s) for s in shape]))


def cute_index(shape, stride, coord: int) -> int:
    """CuTe layout: split a 1-D coordinate colexicographically over a nested shape, dot strides."""
    if isinstance(shape, int):
        return coord * stride
    total = 0
    for sub_shape, sub_stride in zip(shape, stride):
        total += cute_index(sub_shape, sub_stride, coord % cute_size(sub_shape))
        coord //= cute_size(sub_shape)
    return total


def cute_map(layout, rows: int, values: int) -> np.ndarray:
    """(thread, value) -> (first, second) coordinate of a column-major tile with `rows` rows."""
    (thr_shape, val_shape), (thr_stride, val_stride) = layout
    out = np.zeros((32, values, 2), np.int64)
    for t in range(32):
        for v in range(values):
            idx = cute_index(thr_shape, thr_stride, t) + cute_index(val_shape, val_stride, v)
            out[t, v] = (idx % rows, idx // rows)
    return out


def cute_maps() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = cute_map(CUTE_A, 16, 8)               # (m, k) over a 16x16 (M,K) tile
    b = cute_map(CUTE_B, 8, 4)[..., ::-1]     # CuTe's B is (n, k) over an 8x16 (N,K) tile -> (k, n)
    c = cute_map(CUTE_C, 16, 4)               # (m, n) over a 16x8 (M,N) tile
    return a, b, c


# --- checks (plain functions, so they can be run against any candidate arrays)
def check_bijection(m: np.ndarray, rows: int, cols: int) -> None:
    assert m.shape[0] == 32 and m.shape[2] == 2 and m.shape[0] * m.shape[1] == rows * cols
    assert (m >= 0).all() and (m[..., 0] < rows).all() and (m[..., 1] < cols).all()
    flat = (m[..., 0] * cols + m[..., 1]).ravel()
    assert np.array_equal(np.sort(flat), np.arange(rows * cols)), "cells held twice or never"


def check_against(a: np.ndarray, b: np.ndarray, c: np.ndarray, ref) -> None:
    ra, rb, rc = ref
    for name, got, want in (("A", a, ra), ("B", b, rb), ("C", c, rc)):
        got = np.asarray(got)
        assert got.shape == want.shape, f"{name}_MAP shape {got.shape} != {want.shape}"
        bad = np.argwhere((got != want).any(axis=-1))
        assert bad.size == 0, f"{name}_MAP differs at (lane, j) {bad[:4].tolist()}"


def test_the_two_sources_agree():
    """The PTX ISA text and CuTe's layouts give the same fragments (else one of them is misread)."""
    check_against(*ptx_maps(), cute_maps())


@pytest.mark.parametrize("name,rows,cols", [("A", 16, 16), ("B", 16, 8), ("C", 16, 8)])
def test_map_is_a_bijection_onto_its_tile(name, rows, cols):
    check_bijection(np.asarray({"A": A_MAP, "B": B_MAP, "C": C_MAP}[name]), rows, cols)


def test_maps_match_ptx_isa():
    check_against(A_MAP, B_MAP, C_MAP, ptx_maps())


def test_maps_match_cute():
    check_against(A_MAP, B_MAP, C_MAP, cute_maps())
