"""The tool-discovery model's data generator, training script and evaluation.

`python -m models.toolcall.train` writes `models/toolcall-qwen3-tiny`; `python -m
models.toolcall.eval BUNDLE` scores a bundle of it on a held-out split.
"""
