"""The CPU reference backend: numpy forward pass, float32 math, over a paged bf16 KV pool."""
