"""The bundle folder: its file names, and the checks that need no loading (in load order).

Order: contract present → schema valid → format version supported → files present and
hashes match, bundle_id over the contract's own content. Target and memory checks follow in
``runtime/bundle/machine.py``; the contract against the files it describes in ``runtime/bundle/checks.py``.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from toolcall.common.errors import Refusal
from toolcall.runtime.bundle.contract import (
    CONTRACT_FILE,
    CPU_TARGET,
    FORMAT_NAME,
    SUPPORTED_FORMAT_VERSIONS,
    Contract,
    FileEntry,
    compute_bundle_id,
    parse_contract,
)
from toolcall.runtime.bundle.file_kind import path_kind, require_file
from toolcall.runtime.bundle.kv_scales import KV_SCALES_FILE

WEIGHTS_FILE = "weights.safetensors"
TOKENIZER_FILE = "tokenizer.json"
GRAMMAR_FILE = "grammar.msgpack"
REPORT_FILE = "build-report.json"
KERNELS_DIR = "kernels"


# Files every bundle has and the runtime reads; a contract that does not list one is refused
# (a file no hash covers could be replaced freely). GPU bundles add every kernels/*.cubin.
REQUIRED_FILES = (WEIGHTS_FILE, TOKENIZER_FILE, GRAMMAR_FILE)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(bytes=path.stat().st_size, sha256=sha256_file(path))


def _contract_error(message: str, **details) -> Refusal:
    code = "missing_contract" if details.get("kind") in ("missing", "broken symlink") else "schema_invalid"
    return Refusal(code, message + "; expected a bundle folder written by `builder compile`",
                   path=details.get("file"), **details)


def read_contract(folder: str | Path) -> Contract:
    """The bundle's validated Contract; Refusal missing_contract / schema_invalid / format_unsupported."""
    path = require_file(Path(folder) / CONTRACT_FILE, _contract_error, "the bundle's contract.json")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        problem = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise Refusal("schema_invalid", f"{path} is not valid JSON ({problem}); rebuild the bundle",
                      path="$", problem=problem) from None
    except OSError as e:
        raise Refusal("schema_invalid", f"{path}: cannot read ({e.strerror}); check the bundle's permissions",
                      path="$", problem=str(e.strerror)) from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, dict) and fmt.get("name") == FORMAT_NAME and type(fmt.get("version")) is int \
            and fmt["version"] not in SUPPORTED_FORMAT_VERSIONS:
        raise Refusal("format_unsupported", f"bundle format version {fmt['version']} is not supported; this "
                      f"runtime reads versions {SUPPORTED_FORMAT_VERSIONS.start}..{SUPPORTED_FORMAT_VERSIONS.stop - 1}; "
                      "rebuild with a matching builder or upgrade the runtime", found=fmt["version"],
                      supported=[SUPPORTED_FORMAT_VERSIONS.start, SUPPORTED_FORMAT_VERSIONS.stop - 1])
    try:
        return parse_contract(data)
    except RecursionError:
        raise Refusal("schema_invalid", f"{path}: nested too deeply to validate; rebuild the bundle",
                      path="$", problem="nested too deeply") from None


def required_files(folder: Path, contract: Contract) -> list[str]:
    """Names the contract must list: REQUIRED_FILES, the KV scales where the KV format is scaled, and on GPU
    targets every kernels/ file present (the CUDA backend loads each kernels/*.cubin it finds)."""
    names = list(REQUIRED_FILES)
    if contract.precision.kv_format.scaled:
        names.append(KV_SCALES_FILE)
    if contract.target.name != CPU_TARGET:
        kernels = folder / KERNELS_DIR
        if path_kind(kernels) == "folder":
            names += sorted(str(p.relative_to(folder)) for p in kernels.rglob("*") if not p.is_dir())
    return names


def check_files(folder: str | Path, contract: Contract) -> None:
    """Every file the runtime reads is listed; every listed file is a regular file with its size
    and sha256; bundle_id equals the hash of the canonical contract content."""
    folder = Path(folder)
    for name in required_files(folder, contract):
        if name not in contract.files:
            raise Refusal("bundle_invalid", f"the contract's files do not list {name}, which the runtime reads; "
                          "no hash would cover it: rebuild the bundle", file=name, missing=name)

    def missing(message: str, **details) -> Refusal:
        code = "file_missing" if details.get("kind") in ("missing", "broken symlink") else "bundle_invalid"
        return Refusal(code, message + " (the contract lists it): copy the whole bundle again", **details)

    for name, entry in sorted(contract.files.items()):
        path = require_file(folder / name, missing, f"bundle file {name}")
        size = path.stat().st_size
        if size != entry.bytes:
            raise Refusal("hash_mismatch", f"{name}: {size} bytes, the contract says {entry.bytes}; the file is "
                          "damaged or was replaced: copy the bundle again", file=name, expected_bytes=entry.bytes,
                          found_bytes=size)
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise Refusal("hash_mismatch", f"{name}: sha256 {digest}, the contract says {entry.sha256}; the file "
                          "is damaged or was replaced: copy the bundle again", file=name, expected=entry.sha256,
                          found=digest)
    bundle_id = compute_bundle_id(contract)
    if bundle_id != contract.engine.bundle_id:
        raise Refusal("hash_mismatch", f"bundle_id {contract.engine.bundle_id} does not match the contract's "
                      f"content and files ({bundle_id}); contract.json was edited: rebuild the bundle",
                      expected=bundle_id, found=contract.engine.bundle_id)
