"""The paged KV cache on the device: bf16 K/V storage over the shared page allocator.

Layout: one allocation [layers, 2 (K, V), pages, page_size, kv_heads, head_dim] bf16, so
layer l's K is the (pages, page_size, kv_heads, head_dim) block the kernels take as
``k_cache``. The block table lives on the host (runtime/batching/pages.py) and is mirrored
to an int32 [max_seqs, max_pages_per_seq] device buffer by ``sync`` when it changed.
"""
from __future__ import annotations

import numpy as np

from toolcall.common.formats import KV_BF16
from toolcall.kernels.launch import DeviceArray
from toolcall.runtime.batching.pages import PageAllocator
from toolcall.runtime.bundle.model_config import ModelConfig

# the kernels read and write bf16 K/V (kernels/attention.cuh): the one KV format this pool holds
KV_FORMAT = KV_BF16


class CudaKVPool(PageAllocator):
    """Device K/V pages; ``k(layer)``/``v(layer)`` are the kernels' cache pointers."""

    def __init__(self, gpu, cfg: ModelConfig, num_pages: int, page_size: int, max_seqs: int,
                 max_tokens_per_seq: int):
        super().__init__(num_pages, page_size, max_seqs, max_tokens_per_seq)
        self.gpu = gpu
        self.num_kv_heads, self.head_dim, self.num_layers = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
        self.layer_bytes = num_pages * page_size * cfg.num_kv_heads * cfg.head_dim * KV_FORMAT.itemsize
        self.storage: DeviceArray | None = None
        self.table: DeviceArray | None = None
        self.storage = gpu.alloc(2 * cfg.num_layers * self.layer_bytes)
        try:
            self.table = gpu.alloc(self.block_table.nbytes)
        except BaseException:  # the model never holds a half-made pool: free its storage here
            self.free()
            raise
        self._synced_version = -1

    @property
    def nbytes(self) -> int:
        """Bytes of K and V storage (the contract's kv_pool_bytes)."""
        return self.storage.nbytes if self.storage is not None else 0

    def k(self, layer: int) -> DeviceArray:
        return DeviceArray(self.storage.ptr + (2 * layer) * self.layer_bytes, self.layer_bytes)

    def v(self, layer: int) -> DeviceArray:
        return DeviceArray(self.storage.ptr + (2 * layer + 1) * self.layer_bytes, self.layer_bytes)

    def copy_rows(self, src_page: int, dst_page: int, rows: int, first: int = 0) -> None:
        """K/V rows first..first+rows-1 of every layer, page to page (the pinned prefix's partial last page, a
        repeated prompt's last page, an answer's rows): 2 * layers device-to-device copies per call, on the
        legacy default stream, so ordered after and before the model's (blocking) stream's work."""
        row_bytes = self.num_kv_heads * self.head_dim * KV_FORMAT.itemsize  # rows lead the (page_size, heads, dim) page
        page_bytes, n = self.page_size * row_bytes, rows * row_bytes
        for block in range(2 * self.num_layers):
            base = self.storage.ptr + block * self.layer_bytes + first * row_bytes
            src, dst = (DeviceArray(base + page * page_bytes, n) for page in (src_page, dst_page))
            self.gpu.copy_device(dst, src, n)

    def sync(self) -> None:
        """Uploads the block table if admissions or releases changed it since the last upload."""
        if self._synced_version != self.version:
            self.gpu.copy_in(self.table, np.ascontiguousarray(self.block_table))
            self._synced_version = self.version

    def free(self) -> None:
        for arr in (self.storage, self.table):
            if arr is not None:
                self.gpu.free(arr)
        self.storage = self.table = None
