"""A small CUDA driver-API launcher for the kernels: device, memory, modules, launches.

Every cuda-python call goes through ``_check``, which raises ``CudaError("cuda_error")``
naming the call and the driver's error name. Arguments come by parameter name and are packed by the
kernel's declaration (toolcall.kernels.declarations): device arrays (or None for a null pointer) for
``ptr``, numbers for ``int32`` / ``float32`` / ``uint64``; a missing, unknown or mistyped argument fails here,
naming the kernel and the parameter.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from toolcall.common.errors import CudaError
from toolcall.kernels.declarations import KernelDecl, declaration


def _driver():
    from cuda.bindings import driver
    return driver


def _check(result, call: str):
    """Unpacks a driver result tuple; ``CudaError`` naming ``call`` unless CUDA_SUCCESS."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)
        label = name[1].decode() if name[0] == driver.CUresult.CUDA_SUCCESS else repr(err)
        raise CudaError("cuda_error", f"{call} failed: {label}", call=call, result=int(err),
                        error=label)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


check = _check  # public name for callers that drive other cuda-python calls (graphs)


def probe_gpu() -> tuple[bool, str]:
    """(True, "name, sm_XY") if a CUDA device is usable, else (False, why); never raises."""
    try:
        driver = _driver()
        _check(driver.cuInit(0), "cuInit")
        if _check(driver.cuDeviceGetCount(), "cuDeviceGetCount") < 1:
            return False, "the CUDA driver reports no device"
        dev = _check(driver.cuDeviceGet(0), "cuDeviceGet")
        name = _check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
        return True, name.split(b"\0")[0].decode()
    except Exception as e:  # DynamicLibNotFoundError without a driver, CudaError, ImportError
        return False, f"no usable CUDA device ({type(e).__name__}: {e})"


@dataclass
class DeviceArray:
    """A device allocation: ``ptr`` (int), ``nbytes``; freed by ``Gpu.free`` or ``Gpu.close``."""

    ptr: int
    nbytes: int


class Kernel:
    """A loaded kernel function with its declaration."""

    def __init__(self, function, decl: KernelDecl):
        self.function = function
        self.decl = decl

    @property
    def name(self) -> str:
        return self.decl.name

    def pack(self, args: Mapping[str, object]) -> tuple[np.ndarray, list[np.ndarray]]:
        """kernelParams from arguments by parameter name: a uint64 array of the addresses of one numpy
        scalar per parameter, in the declaration's order (and those scalars, to keep alive)."""
        self.decl.check(args)
        holders = []
        for p in self.decl.params:
            value, what = args[p.name], f"{self.name}: parameter {p.name!r}"
            if p.kind == "ptr":
                if value is None:
                    value = 0
                elif isinstance(value, DeviceArray):
                    value = value.ptr
                elif not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                    raise TypeError(f"{what} is a device pointer; got {type(value).__name__}")
                holders.append(np.array([value], np.uint64))
            else:
                if isinstance(value, DeviceArray) or value is None:
                    raise TypeError(f"{what} is a {p.kind} scalar; got {type(value).__name__}")
                if p.kind != "float32" and not isinstance(value, (int, np.integer)):
                    raise TypeError(f"{what} is an integer ({p.kind}); got {type(value).__name__}")
                if p.kind == "int32" and not -2**31 <= int(value) < 2**31:
                    raise TypeError(f"{self.name}: {p.name} = {value} does not fit in int32")
                holders.append(np.array([value], p.kind))
        params = np.array([h.ctypes.data for h in holders], np.uint64)
        return params, holders


class DeviceMemory:
    """What every device's copies share (Gpu here, the executor's SimGpu): ``upload`` as alloc + copy_in, and the
    size checks of copies (ValueError naming both sizes)."""

    def upload(self, host: np.ndarray) -> DeviceArray:
        host = np.ascontiguousarray(host)
        arr = self.alloc(host.nbytes)
        self.copy_in(arr, host)
        return arr

    @staticmethod
    def check_copy_in(arr: DeviceArray, nbytes: int) -> None:
        if nbytes > arr.nbytes:
            raise ValueError(f"copy of {nbytes} bytes into a {arr.nbytes}-byte allocation")

    @staticmethod
    def check_download(arr: DeviceArray, nbytes: int) -> None:
        if nbytes > arr.nbytes:
            raise ValueError(f"download of {nbytes} bytes from a {arr.nbytes}-byte allocation")

    @staticmethod
    def check_copy_device(dst: DeviceArray, src: DeviceArray, nbytes: int) -> None:
        if nbytes > min(dst.nbytes, src.nbytes):
            raise ValueError(f"copy of {nbytes} bytes between allocations of {src.nbytes} and {dst.nbytes} bytes")


class Gpu(DeviceMemory):
    """One device's primary context, made current on this thread; ``close`` releases all."""

    def __init__(self, ordinal: int = 0):
        driver = _driver()
        try:
            _check(driver.cuInit(0), "cuInit")
        except CudaError:
            raise
        except Exception as e:  # cuda.pathfinder's DynamicLibNotFoundError without a driver
            raise CudaError("cuda_error", f"cuInit failed: no CUDA driver ({type(e).__name__}: {e})",
                            call="cuInit") from None
        self.device = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        _check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        raw = _check(driver.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = raw.split(b"\0")[0].decode()
        attr = driver.CUdevice_attribute
        self.compute_capability = tuple(
            _check(driver.cuDeviceGetAttribute(a, self.device), "cuDeviceGetAttribute")
            for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                      attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.driver_version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        self._allocs: dict[int, DeviceArray] = {}
        self._modules: list = []
        # the stream the copies are queued on, in order with its kernels (a CudaModel sets its own); 0: the
        # legacy default stream, which orders with every blocking stream only by that stream's implicit syncs
        self.stream = 0

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    # ---- memory ----
    def alloc(self, nbytes: int) -> DeviceArray:
        ptr = _check(_driver().cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc")
        arr = DeviceArray(int(ptr), int(nbytes))
        self._allocs[arr.ptr] = arr
        return arr

    def zeros(self, nbytes: int) -> DeviceArray:
        arr = self.alloc(nbytes)
        _check(_driver().cuMemsetD8(arr.ptr, 0, max(arr.nbytes, 1)), "cuMemsetD8")
        return arr

    # Copies are queued on ``stream`` after the kernels already there. From pageable host memory the async call
    # returns once the bytes are staged (the array may be reused at once); to it, once the copy is done (the sync
    # after it only makes that explicit).
    def copy_in(self, arr: DeviceArray, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self.check_copy_in(arr, host.nbytes)
        if host.nbytes:
            _check(_driver().cuMemcpyHtoDAsync(arr.ptr, host, host.nbytes, self.stream), "cuMemcpyHtoDAsync")

    def download(self, arr: DeviceArray, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.check_download(arr, out.nbytes)
        if out.nbytes:
            driver = _driver()
            _check(driver.cuMemcpyDtoHAsync(out, arr.ptr, out.nbytes, self.stream), "cuMemcpyDtoHAsync")
            _check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        return out

    def copy_device(self, dst: DeviceArray, src: DeviceArray, nbytes: int) -> None:
        """``nbytes`` from ``src`` to ``dst``, device to device (ordered after the work already queued)."""
        self.check_copy_device(dst, src, nbytes)
        if nbytes:
            _check(_driver().cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, self.stream), "cuMemcpyDtoDAsync")

    def free(self, arr: DeviceArray) -> None:
        if self._allocs.pop(arr.ptr, None) is not None:
            _check(_driver().cuMemFree(arr.ptr), "cuMemFree")

    # ---- modules and launches ----
    def load(self, cubin: bytes) -> "Module":
        module = _check(_driver().cuModuleLoadData(cubin), "cuModuleLoadData")
        self._modules.append(module)
        return Module(module)

    def load_kernel_file(self, file: str) -> "Module":
        """kernels/``file``.cu compiled for this device's arch (cached per process) and loaded."""
        from toolcall.kernels.nvrtc_build import compile_kernel
        return self.load(compile_kernel(file, self.arch).cubin)

    def launch(self, kernel: Kernel, grid, block, args: Mapping[str, object], shared_bytes: int = 0,
               stream=0) -> None:
        params, holders = kernel.pack(args)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        _check(_driver().cuLaunchKernel(kernel.function, gx, gy, gz, bx, by, bz, shared_bytes,
                                        stream, params.ctypes.data, 0),
               f"cuLaunchKernel({kernel.name})")
        del holders  # the driver copied the parameter values during the call

    def synchronize(self) -> None:
        _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        """Frees every allocation and module, then releases the primary context. Best effort:
        every step is tried even after one fails (a sticky error fails them all), and the
        first error is raised at the end."""
        driver = _driver()
        steps = [lambda p=ptr: _check(driver.cuMemFree(p), "cuMemFree") for ptr in list(self._allocs)]
        steps += [lambda m=module: _check(driver.cuModuleUnload(m), "cuModuleUnload") for module in self._modules]
        steps.append(lambda: _check(driver.cuDevicePrimaryCtxRelease(self.device), "cuDevicePrimaryCtxRelease"))
        self._allocs, self._modules = {}, []
        first_error(steps)


def first_error(steps) -> None:
    """Runs every callable of ``steps``; then raises the first exception one of them raised."""
    first = None
    for step in steps:
        try:
            step()
        except Exception as e:  # keep going: later steps may still free what they hold
            first = first or e
    if first is not None:
        raise first


class Module:
    """A loaded cubin; ``kernel(name)`` looks a function up with its declaration."""

    def __init__(self, module):
        self.module = module

    def kernel(self, name: str) -> Kernel:
        decl = declaration(name)
        fn = _check(_driver().cuModuleGetFunction(self.module, name.encode()),
                    f"cuModuleGetFunction({name})")
        return Kernel(fn, decl)
