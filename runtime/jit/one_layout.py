"""A numba kernel called from Python through one compiled specialization, whatever its views' layouts.

numba compiles a kernel once per argument type, and an array's type includes its layout: a view of one row
of a wider buffer (the q columns of q|k|v, the gate half of gate|up) is C-contiguous, the same view of more
rows is not. A kernel that reads such an argument by its strides compiles twice for the same work, and each
compile of a parallel kernel costs seconds (linear_panels and attention are most of a cold build's canary
stage: bench/RESULTS.md, "Build time"). ``AnyLayout`` types the arguments it is told about as any layout
('A'), compiles that one specialization per set of element types (or loads it from numba's cache), and
lets numba's dispatcher convert C-contiguous arguments to it; it compiles nothing else. numba still checks
every call's types against what was compiled (a call it cannot convert raises numba's TypeError).

The kernel's own dispatcher is left as it is: numba code that calls the kernel (runtime/cpu/fused_forward.py)
compiles its own specializations as before.
"""
from __future__ import annotations

import threading

import numba
import numpy as np
from numba import types


class AnyLayout:
    """``kernel`` (a numba dispatcher) called with the arguments at ``positions`` typed any-layout."""

    def __init__(self, kernel, positions: tuple[int, ...]):
        self.kernel, self.positions = kernel, frozenset(positions)
        # a second dispatcher of the same function: numba's cache keys entries by the function, so both read
        # and write the same cached code (every kernel here is compiled with cache=True)
        self.calls = numba.jit(cache=True, **kernel.targetoptions)(kernel.py_func)
        self.calls._can_compile = False  # numba's disable_compile(), which refuses before a first compile
        self.keys: set[tuple] = set()  # argument kinds already compiled (``key``)
        self.lock = threading.Lock()

    def key(self, args) -> tuple:
        """What numba's type of each argument depends on: an array's element type, dimensions and flags
        (layout, writeable, aligned), only the first two at ``positions``; a scalar's Python type."""
        return tuple((a.dtype, a.ndim) if i in self.positions else (a.dtype, a.ndim, a.flags.num)
                     if isinstance(a, np.ndarray) else type(a) for i, a in enumerate(args))

    def __call__(self, *args):
        key = self.key(args)
        if key not in self.keys:
            self._compile(args, key)
        return self.calls(*args)

    def signature(self, args) -> tuple:
        """numba's types of ``args``, the arrays at ``positions`` with layout 'A', defaults folded in as numba
        folds them for a call (an omitted argument is a compile-time constant)."""
        out = []
        for i, a in enumerate(args):
            t = numba.typeof(a)
            out.append(t.copy(layout="A") if i in self.positions and isinstance(t, types.Array) else t)
        return tuple(self.calls.fold_argument_types(tuple(out), {})[1])

    def _compile(self, args, key) -> None:
        with self.lock:
            if key in self.keys:
                return
            self.calls._can_compile = True  # compile() refuses otherwise
            try:
                self.calls.compile(self.signature(args))
            finally:
                self.calls._can_compile = False
            self.keys.add(key)
