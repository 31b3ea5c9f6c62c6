"""kernels/launch.py Gpu's copies without a GPU: each is queued on the Gpu's stream (a CudaModel sets its own), in
order with the kernels there, never ordered only by the legacy default stream's implicit syncs. The driver calls are
recorded by a stand-in for cuda.bindings.driver (on a card: bench/gpu_check.py)."""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.kernels.launch import DeviceArray, Gpu

drv_real = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is a project dependency")
OK = drv_real.CUresult.CUDA_SUCCESS
MODEL_STREAM = 0x5EA


class RecordingDriver:
    CUresult = drv_real.CUresult

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            return (OK,)
        return call


def gpu_on_stream(stream: int) -> Gpu:
    gpu = object.__new__(Gpu)  # no context: the driver is the stand-in
    gpu._allocs, gpu._modules, gpu.stream = {}, [], stream
    return gpu


def test_every_copy_is_queued_on_the_model_stream(monkeypatch):
    driver = RecordingDriver()
    monkeypatch.setattr("toolcall.kernels.launch._driver", lambda: driver)
    gpu = gpu_on_stream(MODEL_STREAM)
    a, b = DeviceArray(0x1000, 64), DeviceArray(0x2000, 64)
    gpu.copy_in(a, np.arange(16, dtype=np.int32))
    gpu.download(a, (16,), np.int32)
    gpu.copy_device(b, a, 64)
    names = [name for name, _ in driver.calls]
    assert names == ["cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuStreamSynchronize", "cuMemcpyDtoDAsync"]
    assert all(args[-1] == MODEL_STREAM for _, args in driver.calls), driver.calls


def test_empty_copies_make_no_call(monkeypatch):
    driver = RecordingDriver()
    monkeypatch.setattr("toolcall.kernels.launch._driver", lambda: driver)
    gpu = gpu_on_stream(MODEL_STREAM)
    gpu.copy_in(DeviceArray(0x1000, 0), np.zeros(0, np.int32))
    assert gpu.download(DeviceArray(0x1000, 0), (0,), np.int32).shape == (0,)
    assert driver.calls == []
