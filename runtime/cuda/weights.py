"""Bundle weights on the device, in the bundle's own formats, uploaded once at load.

A linear goes up as its stored tensors (common/formats.py ``WeightFormat.stored``), one device buffer
each, as its format's matvec kernels take them (kernels/weight_args.py):
  fp8_e4m3: codes uint8 [out, in] + float32 per-row scale [out]
  nvfp4:    packed uint8 [out, in/2] + e4m3 block scales uint8 [out, in/16] + float32 global
            scale per output row [out] (weight_scale_2 of the row's source tensor)
  bf16:     bf16 [out, in]
Embedding, (untied) head and norms stay bf16; biases go up as float32 (exact).

Fusions that change no bit: every output row is computed alone with its own scales (fp8's
per-row scale; nvfp4's block scales and its tensor's global scale, repeated per row; bf16
none), so q/k/v become one [q_dim + 2 kv_dim, hidden] weight and gate/up one [2 inter,
hidden] weight in every format.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from toolcall.common.errors import Refusal
from toolcall.common.formats import WEIGHT_FORMATS, WeightFormat
from toolcall.kernels.launch import DeviceArray
from toolcall.kernels.weight_args import weight_args
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.rope import inv_freq
from toolcall.runtime.bundle.tensor_file import DTYPE_NAMES
from toolcall.runtime.cuda.buffers import DeviceArena
from toolcall.runtime.grammar.trie import Grammar

GRAMMAR_ARRAYS = ("node_edge_start", "edge_token", "edge_kind", "edge_bits", "edge_child", "edge_tool")


@dataclass
class Matvec:
    """One linear layer's device weights: ``weight_args`` are its kernel's weight arguments by name."""

    fmt: WeightFormat
    n_in: int
    n_out: int
    keys: dict[str, str]  # kernel parameter (w, then its scales) -> arena name
    bias_key: str | None = None  # float32 [out]
    arena: DeviceArena | None = None

    def weight_args(self) -> dict:
        return {param: self.arena[key] for param, key in self.keys.items()}

    def bias(self):
        return None if self.bias_key is None else self.arena[self.bias_key]


@dataclass
class LayerWeights:
    qkv: Matvec  # q | k | v rows
    o: Matvec
    gate_up: Matvec  # gate | up rows
    down: Matvec
    norms: dict[str, str] = field(default_factory=dict)  # ln_in, ln_post, q_norm, k_norm -> arena key


class DeviceWeights:
    """Plans, then uploads, every tensor of a bundle (``tensors``: name -> numpy view) whose linears are
    in ``precision`` (a WeightFormat, or its name as the contract records it)."""

    def __init__(self, cfg: ModelConfig, precision: WeightFormat | str, tensors, grammar: Grammar):
        fmt = precision if isinstance(precision, WeightFormat) else WEIGHT_FORMATS.get(precision)
        assert fmt is not None, f"weight format {precision!r}: refused by shape_problems before"
        self.cfg, self.fmt, self.t = cfg, fmt, tensors
        self.lookup = tensors.get if isinstance(tensors, dict) else (
            lambda n: tensors.get(n) if n in tensors.tensors else None)  # a SafetensorsFile
        self.producers: dict[str, callable] = {}
        self.sizes: dict[str, int] = {}
        self.shapes = cfg.tensor_shapes()
        self.layers = [self._plan_layer(i) for i in range(cfg.num_layers)]
        self.embed = self._add("embed", lambda: self._get("model.embed_tokens.weight", "BF16",
                                                          (cfg.vocab_size, cfg.hidden_size)))
        self.head = self.embed if cfg.tie_word_embeddings else self._add(
            "lm_head", lambda: self._get("lm_head.weight", "BF16", (cfg.vocab_size, cfg.hidden_size)))
        self.final_norm = self._add("final_norm", lambda: self._get("model.norm.weight", "BF16", (cfg.hidden_size,)))
        self.inv_freq = self._add("inv_freq", lambda: inv_freq(cfg))
        for name in GRAMMAR_ARRAYS:
            self._add("grammar." + name, lambda n=name: getattr(grammar, n))
        self.arena = DeviceArena(dict(self.sizes))
        for layer in self.layers:
            for mv in (layer.qkv, layer.o, layer.gate_up, layer.down):
                mv.arena = self.arena

    # ---- planning ----
    def _get(self, name: str, dtype: str, shape: tuple) -> np.ndarray:
        """The tensor ``name`` checked against (dtype, shape); Refusal("bundle_invalid") otherwise."""
        arr = self.lookup(name)
        if arr is None:
            raise Refusal("bundle_invalid", f"weights file: tensor {name} is missing; expected {dtype}{list(shape)}; "
                          "rebuild the bundle", tensor=name)
        found = DTYPE_NAMES.get(arr.dtype, str(arr.dtype))
        if found != dtype or tuple(arr.shape) != tuple(shape):
            raise Refusal("bundle_invalid", f"weights file: {name} is {found}{list(arr.shape)}, expected "
                          f"{dtype}{list(shape)}; rebuild the bundle", tensor=name,
                          expected=[dtype, list(shape)], found=[found, list(arr.shape)])
        return arr

    def _add(self, key: str, producer, nbytes: int | None = None) -> str:
        """Registers arena buffer ``key``; ``producer()`` gives its host array at upload time.
        Without ``nbytes`` the producer runs now to size it (views of the mmapped file: cheap)."""
        self.producers[key] = producer
        self.sizes[key] = int(producer().nbytes) if nbytes is None else int(nbytes)
        return key

    def _linear(self, names: list[str], key: str) -> Matvec:
        """One Matvec over the row-concatenation of ``names`` (one name: no concatenation)."""
        cfg, fmt = self.cfg, self.fmt
        shapes = [self.shapes[n + ".weight"] for n in names]
        n_in, n_out = shapes[0][1], sum(s[0] for s in shapes)
        cat = (lambda parts: parts[0]) if len(names) == 1 else (lambda parts: np.concatenate(parts, axis=0))
        keys = {}
        for arg in weight_args(fmt):
            keys[arg.param] = self._add(f"{key}.{arg.param}", lambda arg=arg: cat(
                [self._stored(arg, n + ".weight", s) for n, s in zip(names, shapes)]), arg.nbytes(n_out, n_in))
        mv = Matvec(fmt, n_in, n_out, keys)
        if cfg.qkv_bias and names[0].endswith(("q_proj", "k_proj", "v_proj")):
            mv.bias_key = self._add(key + ".b", lambda: np.concatenate(
                [self._get(n + ".bias", "BF16", (s[0],)).astype(np.float32) for n, s in zip(names, shapes)]), 4 * n_out)
        return mv

    def _stored(self, arg, weight: str, shape: tuple[int, int]) -> np.ndarray:
        """Weight argument ``arg`` of the linear ``weight`` [out, in] from its stored tensor, checked; a
        per-tensor scalar repeated per output row (fused linears keep each tensor's own)."""
        name, dtype, stored_shape = next(s for s in self.fmt.stored(weight, shape) if s[0] == weight + arg.suffix)
        arr = self._get(name, dtype, stored_shape)
        return np.full(shape[0], arr[()], arr.dtype) if arg.per_row else arr

    def _plan_layer(self, i: int) -> LayerWeights:
        p, cfg, key = f"model.layers.{i}.", self.cfg, f"L{i}."
        qkv = [p + "self_attn." + m for m in ("q_proj", "k_proj", "v_proj")]
        gu = [p + "mlp.gate_proj", p + "mlp.up_proj"]
        layer = LayerWeights(qkv=self._linear(qkv, key + "qkv"), o=self._linear([p + "self_attn.o_proj"], key + "o"),
                             gate_up=self._linear(gu, key + "gu"), down=self._linear([p + "mlp.down_proj"], key + "down"))
        norms = {"ln_in": ("input_layernorm", cfg.hidden_size),
                 "ln_post": ("post_attention_layernorm", cfg.hidden_size)}
        if cfg.qk_norm:
            norms.update(q_norm=("self_attn.q_norm", cfg.head_dim), k_norm=("self_attn.k_norm", cfg.head_dim))
        for short, (name, n) in norms.items():
            layer.norms[short] = self._add(key + short,
                                           lambda name=name, n=n: self._get(p + name + ".weight", "BF16", (n,)))
        return layer

    # ---- upload and sizes ----
    def upload(self, gpu) -> None:
        """One allocation, then every tensor copied in (one host temporary at a time)."""
        self.arena.allocate(gpu)
        for key, producer in self.producers.items():
            gpu.copy_in(self.arena[key], np.ascontiguousarray(producer()).reshape(-1).view(np.uint8))

    def free(self, gpu) -> None:
        self.arena.free(gpu)

    def after_attention(self, i: int) -> DeviceArray:
        """The arena span a decode step reads after layer ``i``'s attention: its o_proj, gate|up and down (their
        scales and biases), its norms and layer i + 1's q|k|v (layers lie in order, each linear's arguments
        together): what attention_decode prefetches into L2."""
        off, size = self.arena.offsets, self.arena.sizes
        start = off[self.layers[i].o.keys["w"]]
        last = self.layers[i + 1].qkv.keys.values() if i + 1 < len(self.layers) else \
            [k for k in size if k.startswith(f"L{i}.")]
        end = max(off[k] + size[k] for k in last)
        return DeviceArray(self.arena.base.ptr + start, end - start)

    def layer_bytes(self) -> int:
        """Bytes of the decoder layers' weights, scales and norms: what one decode step reads."""
        return sum(n for k, n in self.arena.sizes.items() if k.startswith("L"))

    def decode_bytes(self, max_edges: int) -> int:
        """Weight bytes one decode token reads: layers, final norm, one embedding row, head rows of the candidates."""
        h = self.cfg.hidden_size
        return self.layer_bytes() + self.arena.sizes[self.final_norm] + 2 * h + 2 * h * max_edges
