"""A launch list bound to a CudaModel's loaded kernels, its arguments packed once (CudaModel.program caches them)."""
from __future__ import annotations

from toolcall.kernels.launch import check

PROGRAM_CACHE = 64  # packed launch lists kept (each ~ layers x 5-7 launches of packed arguments)


class Program:
    """A launch list bound to loaded kernels, argument-packed once, launched in order."""

    def __init__(self, model, launches):  # model: a CudaModel
        self.model, self.launches, self.items = model, launches, []
        for ln in launches:
            kernel = model.kernel(ln.fn)
            params, holders = kernel.pack(ln.args)
            self.items.append((kernel, *ln.shape, params, holders))

    def run(self) -> None:
        m = self.model
        if m.dry:
            for (kernel, grid, block, _, _), ln in zip(self.items, self.launches):
                m.gpu.launch(kernel, grid, block, ln.args)
            return
        from cuda.bindings import driver
        for kernel, (gx, gy, gz), (bx, by, bz), params, _ in self.items:
            check(driver.cuLaunchKernel(kernel.function, gx, gy, gz, bx, by, bz, 0, m.stream, params.ctypes.data, 0),
                  f"cuLaunchKernel({kernel.name})")
