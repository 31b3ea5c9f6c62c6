"""llama.cpp's convert_hf_to_gguf.py on a synthetic checkpoint (for bench/cpu_compare.py --make-gguf).

    LLAMA_CPP_SRC=DIR python bench/llama_convert.py CKPT --outtype bf16 --outfile OUT.gguf

DIR: a llama.cpp source tree (the llama-cpp-python sdist's vendor/llama.cpp: convert_hf_to_gguf.py,
conversion/, gguf-py/). The converter imports torch and transformers, so run it with the project's
python (its test extra has both); llama-cpp-python's own venv needs neither. The synthetic BPE tokenizer (builder/synth_tokenizer.py) has no entry in the
converter's pre-tokenizer hash table and no sentencepiece model, so the pre-tokenizer is declared
as qwen2's and the vocabulary read from tokenizer.json (gpt2-style). Only the benchmark's token
ids pass through it; the weights are converted untouched.
"""
import os
import runpy
import sys
from pathlib import Path

src = Path(os.environ["LLAMA_CPP_SRC"])
sys.path.insert(0, str(src))
sys.path.insert(1, str(src / "gguf-py"))
import conversion.base as base  # noqa: E402
import conversion.qwen as qwen  # noqa: E402

for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
qwen.Qwen2Model.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [str(src / "convert_hf_to_gguf.py")] + sys.argv[1:]
runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")
