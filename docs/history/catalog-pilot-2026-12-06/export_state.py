"""python3 export_state.py RUN_DIR {model|ema} OUT: HF folder from RUN_DIR/state.pt (saved at every eval)."""
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, '/tmp/pilot44')
from pathlib import Path
from model import Qwen3
from train2 import export
st = torch.load(Path(sys.argv[1]) / 'state.pt')
m = Qwen3(st['c']); m.load_state_dict(st[sys.argv[2]])
export(m, Path(sys.argv[3]))
print('exported step', st['step'], sys.argv[2], '->', sys.argv[3])
