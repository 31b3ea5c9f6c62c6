"""The tool-discovery model's data generator, training script and evaluation.

`python -m toolcall.models.recipe.train` writes `models/toolcall-qwen3-tiny`; `python -m
toolcall.models.recipe.eval BUNDLE` scores a bundle of it on a held-out split.
"""
