"""Contract edits the tests make as a forger would: consistent, so only the later checks can refuse them."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from toolcall.runtime.bundle.contract import CONTRACT_FILE, parse_contract
from toolcall.runtime.bundle.layout import workspace_breakdown

H200 = dict(name="h200", gpu_names=["h200"], compute_capability="9.0", sm_arch="sm_90", min_driver_version=13000)


def retarget_h200(d: dict) -> None:
    """A parsed contract.json re-targeted to h200 in place, its workspace the CUDA backend's (the
    memory section stays consistent; the caller re-lists files and recomputes bundle_id)."""
    d["target"].update(H200)
    c = parse_contract(d)
    ws = sum(workspace_breakdown(c.model, c.limits, c.grammar.max_edges_per_node, "h200").values())
    d["memory"]["total_bytes"] += ws - d["memory"]["workspace_bytes"]
    d["memory"]["workspace_bytes"] = ws


def retarget_bundle_h200(folder: Path) -> None:
    """Edits a CPU bundle's contract to an h200 target as a forger would: every file (kernels/
    included) listed and hashed, bundle_id recomputed, so only the later checks can refuse it."""
    from toolcall.runtime.bundle.contract import compute_bundle_id
    from toolcall.runtime.bundle.files import file_entry
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    retarget_h200(d)
    for p in sorted((folder / "kernels").glob("*")) if (folder / "kernels").is_dir() else []:
        d["files"][f"kernels/{p.name}"] = dataclasses.asdict(file_entry(p))
    d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d))
