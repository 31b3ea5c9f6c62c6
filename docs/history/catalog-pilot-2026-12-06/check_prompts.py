"""After eval_unseen --json: do the runtime's prompt ids equal train2's encoding (template + request)?"""
import hashlib, json, sys
sys.path.insert(0, '/tmp/pilot44')
from train2 import Encoder
from toolcall.models.recipe.unseen import load_unseen
e = Encoder()
rep = json.load(open(sys.argv[1]))
u = {c.id: c for c in load_unseen(rep['set']['path']).catalogs}
ok = bad = 0
for row in rep['catalogs']:
    cat = u[row['id']]
    tools = [(t.name, t.description or "") for t in cat.tools]
    prefix, suffix, paths, _ = e.catalog(tools)
    for case in row['cases']:
        ids = prefix + e.requests([case['request']])[0] + suffix
        d = hashlib.sha256(json.dumps([int(t) for t in ids]).encode()).hexdigest()[:16]
        ok += d == case['prompt_sha256']; bad += d != case['prompt_sha256']
print('prompt ids equal', ok, 'differ', bad)
