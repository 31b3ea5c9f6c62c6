"""The paged KV cache on the host: numpy K/V storage over the shared page allocator."""
from __future__ import annotations

import numpy as np

from toolcall.common.formats import KV_BF16, KvFormat
from toolcall.runtime.batching.pages import PageAllocator
from toolcall.runtime.bundle.kv_scales import KvScales
from toolcall.runtime.bundle.model_config import ModelConfig

E4M3_READ = np.float32(256.0)  # the kernels decode an E4M3 code as e4m3 / 256 (runtime/cpu/simd_ir.py decode_fp8)


class PagedKVPool(PageAllocator):
    """K and V per layer as (num_pages, page_size, kv_heads, head_dim) arrays, pages handed out per slot.

    Slots, pages and the block table follow runtime/batching/pages.py: reserved for a
    sequence's whole lifetime at admission, lowest ids first. Elements of ``kv_format`` (common/formats.py
    ``KV_FORMATS``); a scaled format's per-(layer, kv head) ``scales`` (runtime/bundle/kv_scales.py) are
    required, an unscaled one's are 1.
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, max_seqs: int,
                 max_tokens_per_seq: int, kv_format: KvFormat = KV_BF16, scales: KvScales | None = None):
        super().__init__(num_pages, page_size, max_seqs, max_tokens_per_seq)
        assert kv_format.scaled == (scales is not None), f"{kv_format}: scales needed exactly when scaled"
        self.format, self.dtype = kv_format, kv_format.dtype
        self.scales = scales if scales is not None else KvScales.ones(cfg)
        read = E4M3_READ if kv_format.scaled else np.float32(1.0)
        # (4, layers, kv_heads) f32 for the fast kernels: inverse K and V scales (writes), then what a decoded K
        # and V element is multiplied by (reads: 256 * scale for E4M3 codes, decoded as e4m3 / 256; else 1)
        self.kernel_scales = np.ascontiguousarray(np.stack([self.scales.inv_k, self.scales.inv_v, read * self.scales.k,
                                                            read * self.scales.v]), np.float32)
        shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        # (2, layers, *shape): K then V of every layer in one array, so copy_rows is one numpy copy;
        # k[layer] and v[layer] are its C-contiguous views. Copied as raw bits (uint16 for bf16).
        self._kv = np.zeros((2, cfg.num_layers, *shape), self.dtype)
        self._bits = self._kv.view(np.uint16) if self.dtype.itemsize == 2 else self._kv
        self.k, self.v = list(self._kv[0]), list(self._kv[1])

    @staticmethod
    def kernel_pool(layer: np.ndarray) -> np.ndarray:
        """A layer's K or V in the fast kernels' element type: bf16 as its uint16 bits, E4M3 codes and float32
        as they are."""
        return layer.view(np.uint16) if layer.dtype.itemsize == 2 else layer

    @property
    def nbytes(self) -> int:
        return self._kv.nbytes

    def copy_rows(self, src_page: int, dst_page: int, rows: int, first: int = 0) -> None:
        """K/V rows first..first+rows-1 of every layer, page to page (a shared prefix's partial last page, a
        repeated prompt's last page, an answer's rows)."""
        self._bits[:, :, dst_page, first:first + rows] = self._bits[:, :, src_page, first:first + rows]

    def write(self, layer: int, slots: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Stores k, v (T, kv_heads, head_dim) float32 at each row's (slot, position), encoded in the pool's format."""
        pages, offsets = self.rows_at(slots, positions)
        inv_k, inv_v = self.kernel_scales[:2, layer]  # the kernels' own inverse scales: the same codes
        self.k[layer][pages, offsets] = self.format.encode(k, inv_k)
        self.v[layer][pages, offsets] = self.format.encode(v, inv_v)

    def rows_at(self, slots: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pages, offsets) (T,) of each row's (slot, position), checked; the same for every layer of a step."""
        self.check_rows(slots, positions)
        return self.block_table[slots, positions // self.page_size], positions % self.page_size

    def gather(self, layer: int, slot: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(length, kv_heads, head_dim) float32 K and V of positions 0..length-1 of a slot."""
        pages = self.block_table[slot, : self.pages_for(length)]
        k = self.k[layer][pages].reshape(-1, *self.k[layer].shape[2:])[:length]
        v = self.v[layer][pages].reshape(-1, *self.v[layer].shape[2:])[:length]
        return self.format.decode(k, self.scales.k[layer]), self.format.decode(v, self.scales.v[layer])
