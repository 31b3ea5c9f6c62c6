"""Device buffers of the CUDA backend: planned by name from the contract, allocated once.

``workspace_plan`` gives the float32 step buffers under builder/memory_plan.py's
``workspace_breakdown`` names (a CPU test checks the bytes agree where they correspond) plus
the small integer buffers the kernels need besides (rows, candidates, grammar state, the
graph's prompt rows). ``DeviceArena`` places named buffers in one allocation, 256-byte
aligned, so a load takes one cuMemAlloc per arena and frees it in one call.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolcall.kernels.launch import DeviceArray
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.layout import attention_partials_bytes
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.cuda.step_io import step_io_bytes

ALIGN = 256  # bytes; every buffer starts on a 256-byte boundary (16-byte vector loads need 16)
F32, I32 = 4, 4


def graph_chunks(limits: Limits) -> int:
    """Prefill chunks of the longest prompt in the single-request graph (padded chunks)."""
    return -(-limits.max_input_tokens // limits.prefill_chunk)


def workspace_plan(cfg: ModelConfig, limits: Limits, max_edges: int, bitset_words: int) -> dict[str, int]:
    """Bytes of every step buffer, by name. T = max_tokens_per_step rows, R = min(T, max_sequences)
    sampled rows, M = max_edges, W = bitset words (the widest grammar a row may
    bring), C = prefill chunk."""
    t = limits.max_tokens_per_step
    r, n = min(t, limits.max_sequences), limits.max_sequences
    h, i = cfg.hidden_size, cfg.intermediate_size
    rows = graph_chunks(limits) * limits.prefill_chunk
    return {
        # float32, the names of builder/memory_plan.py's workspace_breakdown
        "hidden": t * h * F32,  # [T, hidden] residual stream x
        "normed": t * h * F32,  # [T, hidden] final RMSNorm output; head input uploads
        "q": t * cfg.q_dim * F32,  # [T, heads * head_dim]  } one [T, q_dim + 2 kv_dim] buffer
        "k": t * cfg.kv_dim * F32,  # [T, kv_heads * head_dim] } when q/k/v are one fused
        "v": t * cfg.kv_dim * F32,  # [T, kv_heads * head_dim] } weight (fp8, bf16)
        "attn_out": t * cfg.q_dim * F32,  # [T, heads * head_dim] attention output
        "gate": t * i * F32,  # [T, inter]  } one [T, 2 inter] buffer when gate/up are fused
        "up": t * i * F32,  # [T, inter]    }
        # part_o [rows, heads, S, head_dim] + part_ml [rows, heads, S, 2]: prefill or decode splits (layout.py)
        "attn_partials": attention_partials_bytes(cfg, limits),
        "rope": t * cfg.head_dim * F32,  # [T, head_dim / 2, 2]: the step's rotary (cos, sin), embed_gather's
        "logits_sparse": r * max_edges * F32,  # [R, M] candidate logits
        "logits_dense": r * cfg.vocab_size * F32,  # [R, vocab] cross-check head
        # integer side buffers (not in the builder's breakdown: small)
        "rows": 5 * t * I32,  # int32 [5, T]: tokens, seq, pos, tile_start, tile_len of one host step
        "cand": r * max_edges * I32,  # int32 [R, M] candidate token ids
        "valid": r * max_edges,  # uint8 [R, M]
        "prompt_rows": 3 * rows * I32,  # int32 [3, chunks * C]: the graph's prompt tokens, seq, pos
        "graph_tiles": 2 * limits.prefill_chunk * I32,  # int32 [2, C]: fixed prefill tiles of one chunk
        "decode_rows": 4 * I32,  # int32 [4]: token, pos, seq (= sample_seq), sample row
        "gram_state": n * (1 + bitset_words) * 8,  # uint64 [max_seqs, 1 + W]
        "gram_status": n * I32,  # int32 [max_seqs]
        "gram_max_tools": n * I32,  # int32 [max_seqs]: each sequence's most tools
        "gram_allow_empty": n,  # uint8 [max_seqs]: each sequence's empty answer allowed
        "out_len": n * I32,  # int32 [max_seqs]
        "out_tokens": n * limits.max_output_tokens * I32,  # int32 [max_seqs, max_out]
        "attn_count": t * cfg.num_kv_heads * I32,  # int32 [T, kv_heads], zero between launches (attention_decode)
        "sync_ws": 2 * I32,  # int32 [2], zero between launches (grammar_advance's block count)
        "cond": I32,  # int32 [1], the loop condition as grammar_advance last wrote it
        "step_io": step_io_bytes(r, max_edges, 1 + bitset_words),  # the device step's plan and record
    }


def arena_sizes(plan: dict[str, int]) -> dict[str, int]:
    """The workspace plan with q/k/v and gate/up merged into one buffer each (fused layouts)."""
    sizes = {k: v for k, v in plan.items() if k not in ("q", "k", "v", "gate", "up")}
    return {"qkv": plan["q"] + plan["k"] + plan["v"], "gate_up": plan["gate"] + plan["up"], **sizes}


BREAKDOWN_NAMES = ("hidden", "normed", "q", "k", "v", "attn_out", "gate", "up", "attn_partials", "rope",
                   "logits_sparse", "logits_dense")


@dataclass
class DeviceArena:
    """Named buffers at aligned offsets inside one allocation. ``allocate(gpu)`` makes the
    allocation; ``[name]`` is then a DeviceArray view (not separately freed)."""

    sizes: dict[str, int]

    def __post_init__(self):
        self.offsets: dict[str, int] = {}
        end = 0
        for name, nbytes in self.sizes.items():
            self.offsets[name] = end
            end += -(-max(int(nbytes), 1) // ALIGN) * ALIGN
        self.nbytes = end
        self.base: DeviceArray | None = None

    def allocate(self, gpu) -> "DeviceArena":
        self.base = gpu.alloc(self.nbytes)
        return self

    def __getitem__(self, name: str) -> DeviceArray:
        assert self.base is not None, "arena not allocated"
        return DeviceArray(self.base.ptr + self.offsets[name], int(self.sizes[name]))

    def free(self, gpu) -> None:
        if self.base is not None:
            gpu.free(self.base)
            self.base = None


def offset(arr: DeviceArray, nbytes: int) -> DeviceArray:
    """A view ``nbytes`` into ``arr`` (a column block of a fused buffer, say)."""
    assert 0 <= nbytes <= arr.nbytes
    return DeviceArray(arr.ptr + nbytes, arr.nbytes - nbytes)
