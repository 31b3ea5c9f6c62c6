"""The CUDA backend's host code: device weights and KV pool, per-step launch lists, the decode graph."""
