"""The bundle folder: its file names, and the checks that need no loading (in load order).

Order: contract present → schema valid → format version supported → files present and
hashes match. Target and memory checks follow in ``runtime/machine.py``.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .contract import (CONTRACT_FILE, FORMAT_NAME, SUPPORTED_FORMAT_VERSIONS, Contract, FileEntry,
                       compute_bundle_id, parse_contract)
from common.errors import Refusal

WEIGHTS_FILE = "weights.safetensors"
TOKENIZER_FILE = "tokenizer.json"
GRAMMAR_FILE = "grammar.msgpack"
REPORT_FILE = "build-report.json"
KERNELS_DIR = "kernels"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(bytes=path.stat().st_size, sha256=sha256_file(path))


def read_contract(folder: str | Path) -> Contract:
    """The bundle's validated Contract; Refusal missing_contract / schema_invalid / format_unsupported."""
    path = Path(folder) / CONTRACT_FILE
    if not path.is_file():
        raise Refusal("missing_contract", f"{path} not found; expected a bundle folder written by "
                      "`builder compile`", path=str(path))
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Refusal("schema_invalid", f"{path} is not valid JSON ({e}); rebuild the bundle",
                      path="$", problem=str(e)) from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, dict) and fmt.get("name") == FORMAT_NAME and isinstance(fmt.get("version"), int) \
            and fmt["version"] not in SUPPORTED_FORMAT_VERSIONS:
        raise Refusal("format_unsupported", f"bundle format version {fmt['version']} is not supported; this "
                      f"runtime reads versions {SUPPORTED_FORMAT_VERSIONS.start}..{SUPPORTED_FORMAT_VERSIONS.stop - 1}; "
                      "rebuild with a matching builder or upgrade the runtime", found=fmt["version"],
                      supported=[SUPPORTED_FORMAT_VERSIONS.start, SUPPORTED_FORMAT_VERSIONS.stop - 1])
    return parse_contract(data)


def check_files(folder: str | Path, contract: Contract) -> None:
    """Every listed file is present with its size and sha256, and bundle_id matches them."""
    folder = Path(folder)
    for name, entry in sorted(contract.files.items()):
        path = folder / name
        if not path.is_file():
            raise Refusal("file_missing", f"{path} is listed in the contract but missing; copy the whole bundle",
                          file=name)
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
    bundle_id = compute_bundle_id(contract.files)
    if bundle_id != contract.engine.bundle_id:
        raise Refusal("hash_mismatch", f"bundle_id {contract.engine.bundle_id} does not match the listed files "
                      f"({bundle_id}); the contract was edited", expected=bundle_id, found=contract.engine.bundle_id)
