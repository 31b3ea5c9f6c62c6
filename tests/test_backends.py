"""What a backend must provide (runtime/backends.py ``Backend``), checked for every implementation, and the
registry that loads one by the contract's target kind."""
from __future__ import annotations

import inspect

import pytest

from toolcall.runtime.backends import BACKENDS, Backend, target_kind
from toolcall.runtime.cpu.fast_model import FastCpuModel
from toolcall.runtime.cpu.model import CpuModel
from toolcall.runtime.cuda.backend import CudaModel

# the interface, spelled out: a new backend provides each of these (methods with these parameters)
METHODS = {
    "new_kv_pool": ["limits", "kv_format", "scales"],
    "forward": ["tokens", "slots", "positions", "kv", "trace", "outputs"],
    "step": ["plan", "kv", "picker"],
    "step_call": ["plan", "kv"],
    "step_record": ["plan", "computed", "picker"],
    "split": ["lanes", "rows"],
    "memory": [],
    "bind_thread": [],
    "close": [],
}
ATTRIBUTES = ("cfg", "threads", "max_threads", "lanes_supported")
IMPLEMENTATIONS = (CpuModel, FastCpuModel, CudaModel)


def test_the_list_is_the_protocol():
    members = {n for n, v in vars(Backend).items() if not n.startswith("_") and callable(v)}
    assert members == set(METHODS)
    assert set(Backend.__annotations__) == set(ATTRIBUTES)
    for name, params in METHODS.items():
        assert list(inspect.signature(getattr(Backend, name)).parameters)[1:] == params, name


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_backend_provides_the_interface(impl):
    for name, params in METHODS.items():
        method = getattr(impl, name, None)
        assert callable(method), f"{impl.__name__} lacks {name}"
        assert list(inspect.signature(method).parameters)[1:] == params, (impl.__name__, name)
    for name in ATTRIBUTES[1:]:
        assert hasattr(impl, name), f"{impl.__name__} lacks {name}"
    assert "cfg" in inspect.getsource(impl.__init__), f"{impl.__name__} sets no cfg"


def test_the_registry_is_keyed_by_the_target_kind(tiny_bundle):
    from toolcall.runtime.bundle.files import read_contract
    contract = read_contract(tiny_bundle)
    assert target_kind(contract) is BACKENDS["cpu"] and BACKENDS["cpu"].decode_graph is None
    assert BACKENDS["cuda"].decode_graph is not None and set(BACKENDS) == {"cpu", "cuda"}


def test_a_first_use_that_compiles_the_cpu_kernels_says_so(monkeypatch, tmp_path):
    """A fresh install's first load or build compiles the CPU kernels (most of its first minute): the progress
    line says so, once; with the kernels in numba's cache it says nothing more."""
    import numba
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    note = BACKENDS["cpu"].first_use_note()
    assert note and "compiling CPU kernels" in note and "once" in note
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "panel_kernels.linear_panels-163.py311.nbi").write_bytes(b"")
    assert BACKENDS["cpu"].first_use_note() is None and BACKENDS["cuda"].first_use_note() is None
