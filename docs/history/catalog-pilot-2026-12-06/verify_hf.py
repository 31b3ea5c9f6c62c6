"""Logits of an exported HF folder vs the torch model in state.pt (one generated prompt, bf16 weights both)."""
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, '/tmp/pilot44')
from pathlib import Path
from transformers import Qwen3ForCausalLM
from model import Qwen3
from train2 import Encoder
from gen import Gen
st = torch.load(Path(sys.argv[1]) / 'state.pt')
m = Qwen3(st['c']); m.load_state_dict(st[sys.argv[2]]); m = m.to(torch.bfloat16).float().eval()
hf = Qwen3ForCausalLM.from_pretrained(sys.argv[3], dtype=torch.float32).eval()
e = Encoder(); g = Gen(99); t = g.catalog(6); r = g.requests(t, 1)[0]
p, s, paths, _ = e.catalog(t)
ids = torch.tensor([p + e.requests([r[0]])[0] + s]); T = ids.shape[1]
with torch.no_grad():
    a = m.logits_at(m.hidden(ids, torch.arange(T)[None], torch.ones(T, T, dtype=torch.bool).tril()[None, None]))
    b = hf(input_ids=ids).logits
print('max |diff|', (a - b).abs().max().item(), 'argmax equal', (a.argmax(-1) == b.argmax(-1)).float().mean().item())
