"""Grammar-constrained greedy decoding (catalog-name trie, SEP/END, empty allowed, <= 4 tools) on held-out
generated catalogs: exact-set / one-tool / multi / none rate. python3 decode_eval.py STATE_DIR {model|ema}"""
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, '/tmp/pilot44')
from model import Qwen3
from train3 import Encoder, END, collate
from gen import Gen

def allowed(gen, paths, sep, max_tools=4):
    parts, cur = [], []
    for t in gen:
        if t == sep:
            parts.append(tuple(cur)); cur = []
        else:
            cur.append(t)
    cur = tuple(cur)
    out = {p[len(cur)] for p in paths if len(p) > len(cur) and p[:len(cur)] == cur and p not in parts}
    if cur in paths:
        out |= {END} | ({sep} if len(parts) + 1 < max_tools else set())
    if not cur and not parts:
        out |= {END}
    return sorted(out)

@torch.no_grad()
def run(m, e, cats):
    stats = dict(all=[0, 0], one=[0, 0], multi=[0, 0], none=[0, 0])
    for tools, reqs in cats:
        prefix, suffix, paths, _ = e.catalog(tools)
        byp = {tuple(p): n for n, p in paths.items()}
        P = [tuple(p) for p in paths.values()]
        bodies = [r + suffix for r in e.requests([q for q, _ in reqs])]
        gens = [[] for _ in reqs]; done = [False] * len(reqs)
        while not all(done):
            ids, pos, seg, last = list(prefix), list(range(len(prefix))), [-1] * len(prefix), []
            for j, (b, g) in enumerate(zip(bodies, gens)):
                s = b + g
                ids += s; pos += range(len(prefix), len(prefix) + len(s)); seg += [j] * len(s); last.append(len(ids) - 1)
            T = len(ids); st = torch.tensor(seg)
            mask = (torch.ones(T, T, dtype=torch.bool).tril() & ((st[:, None] == st[None, :]) | (st[None, :] == -1)))
            h = m.hidden(torch.tensor([ids]), torch.tensor([pos]), mask[None, None])[0]
            logits = m.logits_at(h[last])
            for j in range(len(reqs)):
                if done[j]: continue
                c = allowed(gens[j], P, e.sep)
                t = c[logits[j, c].argmax().item()]
                if t == END: done[j] = True
                else: gens[j].append(t)
        for (q, gold), g in zip(reqs, gens):
            names, cur = [], []
            for t in g + [e.sep]:
                if t == e.sep:
                    if cur: names.append(byp.get(tuple(cur), '?'))
                    cur = []
                else: cur.append(t)
            ok = set(names) == set(gold)
            kind = 'none' if not gold else 'one' if len(gold) == 1 else 'multi'
            for k in ('all', kind):
                stats[k][0] += ok; stats[k][1] += 1
    return {k: f"{a / max(b, 1):.2f} ({b})" for k, (a, b) in stats.items()}

if __name__ == '__main__':
    import os, json
    if os.path.exists(sys.argv[1] + '/model.safetensors'):  # an exported HF folder (bf16)
        from safetensors.torch import load_file
        cf = json.load(open(sys.argv[1] + '/config.json'))
        c = dict(vocab=cf['vocab_size'], hidden=cf['hidden_size'], mlp=cf['intermediate_size'],
                 layers=cf['num_hidden_layers'], heads=cf['num_attention_heads'], kv=cf['num_key_value_heads'])
        sd = {k: v.float() for k, v in load_file(sys.argv[1] + '/model.safetensors').items() if k != 'lm_head.weight'}
        st = {'step': 'hf', 'c': c}
        m = Qwen3(c); m.load_state_dict(sd); m.eval()
    else:
        st = torch.load(sys.argv[1] + '/state.pt')
        m = Qwen3(st['c']); m.load_state_dict(st[sys.argv[2]]); m.eval()
    e = Encoder()
    g = Gen(4242, single_p=0.0, name_p=0.4)
    for n in (4, 12, 24, 36):
        cats = []
        for _ in range(3):
            t = g.catalog(n); cats.append((t, g.requests(t, 16)))
        print('step', st['step'], sys.argv[2], 'n', n, run(m, e, cats), flush=True)
