"""Property tests (hypothesis, bounded in examples and time) for the three readers of untrusted
bytes: the safetensors header reader, the grammar reader and the contract loader. Any input gives
a typed error or a valid object, and no input makes a reader allocate more than a small multiple
of the bytes it was given plus a constant (declared sizes, shapes and offsets never allocate)."""
from __future__ import annotations

import json
import struct
import tempfile
import tracemalloc
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolcall.common.errors import EngineError
from toolcall.runtime.bundle.contract import CONTRACT_FILE, Contract
from toolcall.runtime.bundle.files import GRAMMAR_FILE, read_contract
from toolcall.runtime.bundle.tensor_file import DTYPES, SafetensorsFile
from toolcall.runtime.grammar.trie import Grammar

# Each test stays well under 10 s on the CI's 2 cores: examples are capped, and so is each one.
BOUNDED = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                   derandomize=True)
STRUCTURED = settings(BOUNDED, max_examples=40,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# Python's JSON and msgpack parsers build objects worth up to ~60 bytes per input byte (a list
# pointer and a small object per 2-byte "0,"); what must never happen is an allocation sized by
# a declared number (a shape, an offset, a length) rather than by the input.
BYTES_FACTOR = 64
CONSTANT_BYTES = 1 << 20

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=20)


def typed_or_valid(fn, size: int, valid_type):
    """Runs ``fn()`` once under tracemalloc: a typed error or a ``valid_type``, within the memory bound
    (mmaps are not traced: they are not allocations)."""
    tracemalloc.start()
    try:
        obj = fn()
    except EngineError as e:
        assert e.code in ("checkpoint_invalid", "tensor_invalid", "bundle_invalid", "schema_invalid",
                          "format_unsupported", "missing_contract", "file_missing"), e
        obj = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert obj is None or isinstance(obj, valid_type)
    assert peak <= BYTES_FACTOR * size + CONSTANT_BYTES, f"{peak} bytes allocated for {size} input bytes"
    return obj


# -- safetensors headers -------------------------------------------------------------------------------

tensor_entries = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(sorted(DTYPES)), json_scalars),
    "shape": st.one_of(st.lists(st.integers(min_value=-2, max_value=2**40), max_size=3), json_values),
    "data_offsets": st.one_of(st.lists(st.integers(min_value=-2, max_value=2**40), min_size=2, max_size=2),
                              json_values),
})
headers = st.one_of(st.dictionaries(st.text(max_size=6), st.one_of(tensor_entries, json_values), max_size=4),
                    json_values)


def read_safetensors(data: bytes):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.safetensors"
        path.write_bytes(data)

        def read():
            with SafetensorsFile(path) as f:
                for name in f.names():
                    f.get(name)
                return f

        return typed_or_valid(read, len(data), SafetensorsFile)


@BOUNDED
@given(st.binary(max_size=256))
def test_any_bytes_give_a_typed_error_or_a_safetensors_file(data):
    read_safetensors(data)


@settings(BOUNDED, max_examples=100)
@given(headers, st.integers(min_value=0, max_value=64), st.integers(min_value=-8, max_value=8))
def test_any_header_gives_a_typed_error_or_a_safetensors_file(header, data_bytes, length_skew):
    blob = json.dumps(header).encode()
    n = max(0, len(blob) + length_skew)  # the declared length may lie too
    read_safetensors(struct.pack("<Q", n) + blob + bytes(data_bytes))


# -- grammar.msgpack ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grammar_doc(tiny_bundle):
    return msgpack.unpackb((tiny_bundle / GRAMMAR_FILE).read_bytes(), raw=False)


def read_grammar(data: bytes):
    typed_or_valid(lambda: Grammar.from_msgpack(data), len(data), Grammar)


@BOUNDED
@given(st.binary(max_size=256))
def test_any_bytes_give_a_typed_error_or_a_grammar(data):
    read_grammar(data)


msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=12), st.binary(max_size=16),
              st.integers(min_value=-2**63, max_value=2**64 - 1)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@STRUCTURED
@given(data=st.data())
def test_any_edit_of_a_real_grammar_gives_a_typed_error_or_a_grammar(grammar_doc, data):
    doc = json.loads(json.dumps(grammar_doc, default=lambda b: None))  # a deep copy without the bytes
    doc["arrays"] = {k: dict(v) for k, v in grammar_doc["arrays"].items()}
    key = data.draw(st.sampled_from(sorted(doc) + [f"arrays.{k}.{f}" for k in doc["arrays"]
                                                   for f in ("dtype", "shape", "data")]))
    value = data.draw(st.one_of(msgpack_values, st.lists(st.integers(min_value=0, max_value=2**63), max_size=3)))
    if key.startswith("arrays."):
        _, name, field = key.split(".")
        doc["arrays"][name][field] = value
    else:
        doc[key] = value
    read_grammar(msgpack.packb(doc, use_bin_type=True))


@pytest.mark.parametrize("name,shape", [("edge_token", [2**64 - 1]), ("edge_bits", [2**32, 2**32]),
                                        ("edge_bits", [2**62, 4]), ("edge_bits", [-1, 1])])
def test_a_grammar_array_with_an_overflowing_shape_is_typed(grammar_doc, name, shape):
    # int64 products wrap: 2^32 x 2^32 elements would claim 0 bytes and pass a numpy size check
    doc = dict(grammar_doc)
    doc["arrays"] = dict(grammar_doc["arrays"])
    doc["arrays"][name] = {**doc["arrays"][name], "shape": shape, "data": b""}
    with pytest.raises(EngineError) as info:
        Grammar.from_msgpack(msgpack.packb(doc, use_bin_type=True))
    assert info.value.code == "bundle_invalid"


# -- contract.json -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def contract_dict(tiny_bundle):
    return json.loads((tiny_bundle / CONTRACT_FILE).read_text())


def read_contract_text(data: bytes):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / CONTRACT_FILE).write_bytes(data)
        typed_or_valid(lambda: read_contract(d), len(data), Contract)


@BOUNDED
@given(st.binary(max_size=256))
def test_any_bytes_give_a_typed_error_or_a_contract(data):
    read_contract_text(data)


def paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from paths(v, prefix + (k,))


@STRUCTURED
@given(data=st.data())
def test_any_edit_of_a_real_contract_gives_a_typed_error_or_a_contract(contract_dict, data):
    doc = json.loads(json.dumps(contract_dict))
    where = data.draw(st.sampled_from(sorted(paths(doc))))
    node = doc
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = data.draw(json_values)
    read_contract_text(json.dumps(doc).encode())
