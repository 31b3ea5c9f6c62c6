"""Trains the small tool-discovery model and writes models/toolcall-qwen3-tiny/ (a Hugging Face folder).

    python3 -m toolcall.models.recipe.train [--out models/toolcall-qwen3-tiny] [--max-seconds S]

With no flags this is the committed model's recipe, from a fresh init: seed 1, two torch threads, 6,500
steps of 48 requests over 320,000 generated ones, peak LR 2e-3 (warmup 100, cosine decay), the last
step's exponential moving average of the weights (decay 0.998) kept; 46-51 minutes on a 2-vCPU
AMD EPYC (Zen 4). Same flags on the same kind of CPU and torch build, same bytes (bench/RESULTS.md,
"Tool model training").

The model: a ``transformers.Qwen3ForCausalLM`` (6 layers, hidden 192, MLP 512, 3 heads / 1 KV
head of 64 (head_dim 64: the smallest the GPU attention kernels take), tied embeddings, vocab
2048: 2.76M parameters) learns to answer a request, wrapped in the catalog's prompt template,
with its tools' token paths joined by SEP and closed by END, or END alone when no tool fits:
the exact token sequence the runtime's grammar walks.

- Tokenizer: the project's byte-level BPE trained on its synthetic corpus plus the train split's
  requests, so a request is about 1.2 tokens a word (2 with the generic tokenizer).
- Data: toolcall.models.recipe.data's train split for the 64-tool catalog (training templates,
  toolcall.models.recipe.paraphrases' and the phrasing lists' (phrasings_everyday, _situations,
  _details) phrasings not near a held-out template, half the clauses from the shared-frame lexicon,
  light wording noise) with ``Wording``: slot values from generated pools, typos, varied joins,
  swapped and listed names, digits and names re-drawn (``--vary``), and 15 % of the requests
  needing no tool. Any request equal to a hand-written evaluation request is dropped. (``--v1``:
  no ``Wording`` and no such filter, the plain template data.)
- Model choice: none inside a run (``--keep last``; ``--keep best`` keeps the snapshot answering
  most validation-template requests); between runs, the dev sets (models/recipe/devset*.tsv);
  never the hand-written set (models/recipe/handwritten.tsv).
- Losses: the answer tokens; plus, with weight ``--clause-loss``, a training-only linear probe on
  the middle layer that names each request token's clause (its tool and its index). It teaches
  the model to segment a request into clauses, the skill multi-intent requests need.
- Torch on CPU, deterministic from the seed and the thread count (seeded init, fixed data order,
  no dropout) on one kind of CPU and torch build (another may pick kernels that round differently).
  ``--max-seconds`` ends a run early (on a busy machine); ``--stop-step`` repeats such a run exactly.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

from toolcall.builder.catalog import load_catalog, tokenize_catalog
from toolcall.builder.synth_tokenizer import END_OF_TURN, SPECIAL_TOKENS, train_tokenizer
from toolcall.models.recipe.data import Wording, make_split
from toolcall.models.recipe.handwritten import without_evaluation_requests

CATALOG = "builder/data/tools-64.json"
END_ID, PAD_ID = SPECIAL_TOKENS.index(END_OF_TURN), 0  # END = <|im_end|> = 2; pad never enters a loss
# Every linear's input dim is a multiple of 16, as NVFP4's 16-element blocks need; head_dim 64 is the
# smallest the GPU attention kernels take.
MODEL = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=6, num_attention_heads=3,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=2048, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=0, eos_token_id=END_ID,
             pad_token_id=PAD_ID)


# P(1, 2, 3, 4 tools) in training: mostly multi-intent requests, unlike the test split (0.3, 0.35,
# 0.2, 0.15), since finding the k-th clause is what a small model learns last (and one-tool
# requests are learnt anyway). Against (0.2, 0.3, 0.3, 0.2): 92.6 -> 94.2 % validation exact-set.
TRAIN_COUNTS = (0.25, 0.3, 0.25, 0.2)
CLAUSES = len(TRAIN_COUNTS)  # the most clauses (tools) a request holds: clause labels are tool * CLAUSES + index


def encode_examples(examples, tokenizer, catalog) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, answer ids, clause labels) per example; the prompt is encoded exactly as runtime
    Engine.encode does. A prompt token's clause label is CLAUSES * tool index + clause index for a token
    inside a clause (by its last character), -1 elsewhere (template, connectors, punctuation)."""
    tokenized = tokenize_catalog(catalog, tokenizer, END_ID)
    path = dict(zip(catalog.names, tokenized.paths))
    tool_index = {name: i for i, name in enumerate(catalog.names)}
    offset = catalog.prompt_template.index("{request}")  # the request's first character in the prompt
    prompts = tokenizer.encode_batch([catalog.prompt_template.replace("{request}", e.request) for e in examples])
    out = []
    for e, p in zip(examples, prompts):
        answer: list[int] = [] if e.tools else [END_ID]  # no tool: the empty answer, END first
        for i, tool in enumerate(e.tools):
            answer += [*path[tool], tokenized.sep_token_id if i + 1 < len(e.tools) else END_ID]
        spans = e.clause_spans()
        labels = []
        for start, end in p.offsets:
            last = end - 1 - offset
            k = next((k for k, (a, b) in enumerate(spans) if end > start and a <= last < b), None)
            labels.append(-1 if k is None else CLAUSES * tool_index[e.tools[k]] + k)
        out.append((p.ids, answer, labels))
    return out


def toolcall_tokenizer(train, catalog, vocab_size: int):
    """The synthetic corpus plus the train split's requests and the tool names (repeated so each
    name is a few tokens), never a validation or test request: held-out phrasings may split
    into pieces, as unseen words do."""
    return train_tokenizer(seed=0, vocab_size=vocab_size,
                           extra_text=[e.request for e in train] + list(catalog.names) * 100)


def batch_tensors(examples, torch):
    """Right-padded ids [B, T]; for the answer loss, flat (row, position) indices and their target
    ids; for the clause loss, flat (row, position) indices of clause tokens and their labels.

    Position t predicts token t+1, so the answer's tokens are targets at positions P-1 .. P+A-2.
    Right padding needs no attention mask: a causal model never looks at later (pad) positions.
    """
    width = max(len(p) + len(a) for p, a, _ in examples) - 1  # the last answer token (END) is never an input
    ids = torch.full((len(examples), width), PAD_ID, dtype=torch.long)
    rows, cols, targets, clause_rows, clause_cols, clause_labels = [], [], [], [], [], []
    for b, (p, a, labels) in enumerate(examples):
        seq = (p + a)[:width]
        ids[b, :len(seq)] = torch.tensor(seq)
        rows += [b] * len(a)
        cols += range(len(p) - 1, len(p) + len(a) - 1)
        targets += a
        inside = [t for t, label in enumerate(labels) if label >= 0]
        clause_rows += [b] * len(inside)
        clause_cols += inside
        clause_labels += [labels[t] for t in inside]
    def tensor(values):  # long even when empty (a batch of no-tool requests has no clause tokens)
        return torch.tensor(values, dtype=torch.long)
    return ids, tensor(rows), tensor(cols), tensor(targets), tensor(clause_rows), tensor(clause_cols), tensor(clause_labels)


def epoch_batches(lengths: np.ndarray, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's batches of example indices: shuffled, then sorted by length within windows of
    32 batches so a batch pads little (about half the padded tokens of random batches)."""
    order = rng.permutation(len(lengths))
    window = 32 * batch
    batches = []
    for start in range(0, len(order) - batch + 1, window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch] for i in range(0, len(chunk) - batch + 1, batch)]
    return [batches[i] for i in rng.permutation(len(batches))]


def val_answer_accuracy(model, val_tensors, torch) -> float:
    """Share of validation examples whose every answer token is the argmax given the right prefix:
    exactly the requests whose greedy answer (even unconstrained) equals the label."""
    ids, rows, cols, targets = val_tensors[:4]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        pred = (model.model(input_ids=ids).last_hidden_state[rows, cols] @ model.model.embed_tokens.weight.T)
        wrong = torch.zeros(ids.shape[0], dtype=torch.long).index_add_(0, rows, (pred.argmax(-1) != targets).long())
    model.train(was_training)
    return (wrong == 0).float().mean().item()


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 5% of peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


def write_folder(model, tokenizer, out: Path, torch) -> None:
    """config.json + model.safetensors (bf16) via save_pretrained, then the tokenizer and EOS files."""
    tmp = out.parent / f".{out.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    tokenizer.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": END_OF_TURN, "bos_token": None, "pad_token": SPECIAL_TOKENS[PAD_ID],
         "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MODEL["max_position_embeddings"]},
        indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [END_ID, 0], "bos_token_id": 0, "pad_token_id": PAD_ID, "do_sample": False},
        indent=2) + "\n")
    for f in tmp.iterdir():  # save_pretrained leaves the weights owner-only (0600)
        f.chmod(0o644)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/toolcall-qwen3-tiny")
    ap.add_argument("--seed", type=int, default=1,
                    help="model init, data and order; same seed and --threads, same weights (1: the committed model)")
    ap.add_argument("--steps", type=int, default=6500)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--counts", type=float, nargs=4, default=TRAIN_COUNTS, help="P(1, 2, 3, 4 tools) per request")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch CPU threads (part of the recipe: another count may round differently); on a "
                         "shared, busy machine use 1 (2 ran 6x slower there, spinning)")
    ap.add_argument("--clause-loss", type=float, default=0.5,
                    help="weight of the auxiliary loss that labels each request token with its clause's tool and index")
    ap.add_argument("--ema", type=float, default=0.998,
                    help="decay of an exponential moving average of the weights (0: off); its snapshots are kept")
    ap.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size of the trained tokenizer")
    ap.add_argument("--layers", type=int, default=MODEL["num_hidden_layers"])
    ap.add_argument("--hidden", type=int, default=MODEL["hidden_size"])
    ap.add_argument("--mlp", type=int, default=MODEL["intermediate_size"])
    ap.add_argument("--noise", type=float, default=0.05, help="wording noise of the train split (make_split)")
    ap.add_argument("--lexicon", type=float, default=0.5, help="share of training clauses from the lexicon")
    ap.add_argument("--paraphrases", action=argparse.BooleanOptionalAction, default=True,
                    help="add toolcall.models.recipe.paraphrases to each tool's training templates, "
                         "except those near its held-out templates")
    ap.add_argument("--heads", type=int, default=MODEL["num_attention_heads"], help="attention heads of 64")
    ap.add_argument("--kv-heads", type=int, default=MODEL["num_key_value_heads"])
    ap.add_argument("--train-size", type=int, default=320000, help="train examples (0: the split's own size)")
    ap.add_argument("--no-tool", type=float, default=0.15, help="share of requests that need no tool (empty answer)")
    ap.add_argument("--pooled", type=float, default=0.8, help="share of slot values from the generated pools")
    ap.add_argument("--typos", type=float, default=0.05, help="per-word typo rate")
    ap.add_argument("--swap", type=float, default=0.2,
                    help="share of proper-noun slots (person, city, artist...) filled with another such slot's value")
    ap.add_argument("--names", type=float, default=0.2,
                    help="share of language/restaurant/place... slots given a person-like name or an address")
    ap.add_argument("--listed", type=float, default=0.1, help="share of name/item slots holding a list of 2-3 values")
    ap.add_argument("--lists", type=float, default=0.3, help="share of multi-intent requests joined as one list")
    ap.add_argument("--extra", action=argparse.BooleanOptionalAction, default=True,
                    help="add toolcall.models.recipe.phrasings_details (details inside one clause) "
                         "to the training phrasings")
    ap.add_argument("--related", type=float, default=0.0,
                    help="share of multi-intent requests whose tools are neighbours in the catalog")
    ap.add_argument("--sentences", type=float, default=0.0,
                    help="share of the joins between clauses that are sentence-like (wording.SENTENCE_JOINS)")
    ap.add_argument("--vary", type=float, default=0.2,
                    help="share of train requests with digits re-drawn, mid-sentence capitalized words renamed "
                         "from the pools, closing punctuation toggled and the first letter's case flipped")
    ap.add_argument("--entity", type=float, default=0.25, help="share of name slots made of everyday/cue words")
    ap.add_argument("--trailers", type=float, default=0.1, help="share of clauses with a detail asking nothing more")
    ap.add_argument("--statements", type=float, default=0.25,
                    help="share of no-tool requests that are statements naming catalog things")
    ap.add_argument("--more", action=argparse.BooleanOptionalAction, default=True,
                    help="add toolcall.models.recipe.phrasings_situations (polite, own-situation, "
                         "note-to-self forms) to the training phrasings")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop early (after a validation check) once training has run this long; the run "
                         "then reports the step it stopped at, and only a rerun that stops there repeats it")
    ap.add_argument("--stop-step", type=int, default=None,
                    help="stop after this step (the LR schedule still spans --steps): repeats a run that "
                         "--max-seconds ended at that step")
    ap.add_argument("--init-from", default=None,
                    help="continue from this folder's weights and tokenizer (instead of a fresh init)")
    ap.add_argument("--skip", type=int, default=0,
                    help="drop the first N train examples (a continued run then sees new ones)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--keep", choices=("best", "last"), default="last",
                    help="the weights written to OUT: the snapshot with the best validation (the first of equals), "
                         "or the last step's (with --ema, its average)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also write the model at every N-th step to OUT-stepN (candidates for a choice on the dev set)")
    ap.add_argument("--v1", action="store_true",
                    help="train on the plain template data: no Wording (no pooled values, typos, varied joins, "
                         "phrasing lists or no-tool requests; validation without it too) and no filter of "
                         "evaluation requests")
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    start = time.perf_counter()
    catalog = load_catalog(CATALOG)
    wording = None if args.v1 else Wording(no_tool=args.no_tool, pooled=args.pooled, typos=args.typos,
                                           entity=args.entity, swap=args.swap, trailers=args.trailers, statements=args.statements,
                                           more=args.more, names=args.names, listed=args.listed, lists=args.lists,
                                           extra=args.extra, related=args.related, sentences=args.sentences,
                                           vary=args.vary)
    train = make_split("train", args.seed, size=args.train_size or None, noise=args.noise, lexicon=args.lexicon,
                       counts=tuple(args.counts), paraphrases=args.paraphrases, wording=wording)
    if args.init_from:
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(Path(args.init_from) / "tokenizer.json"))
    else:
        tokenizer = toolcall_tokenizer(train, catalog, args.vocab)
    train = train[args.skip:]
    if not args.v1:  # no hand-written test or dev request is ever trained on verbatim
        kept = without_evaluation_requests(train)
        print(f"dropped {len(train) - len(kept)} train requests equal to an evaluation request", flush=True)
        train = kept
    pairs = encode_examples(train, tokenizer, catalog)
    # Model choice: the validation templates (never trained on) with the training wording (pooled values,
    # typos, joins) and its share of no-tool requests; never the hand-written set.
    val_wording = None if args.v1 else Wording(no_tool=args.no_tool, pooled=args.pooled, typos=args.typos,
                                                phrasings=False)
    val = encode_examples(make_split("val", args.seed, wording=val_wording), tokenizer, catalog)
    vocab = -(-tokenizer.get_vocab_size() // 64) * 64
    shape = {**MODEL, "num_hidden_layers": args.layers, "hidden_size": args.hidden, "intermediate_size": args.mlp,
             "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads}
    if args.init_from:
        model = transformers.Qwen3ForCausalLM.from_pretrained(args.init_from, dtype=torch.float32).train()
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(vocab_size=vocab, **shape)).float().train()
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(pairs)} train examples, "
          f"data ready in {time.perf_counter() - start:.1f} s", flush=True)

    # A training-only probe on the middle layer: never saved, the checkpoint stays a plain Qwen3.
    clause_head = torch.nn.Linear(args.hidden, len(catalog.names) + CLAUSES)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2] + [clause_head.weight]
    other = [p for n, p in model.named_parameters() if p.dim() < 2] + [clause_head.bias]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    lengths = np.array([len(p) + len(a) for p, a, _ in pairs])
    data_rng = np.random.default_rng([args.seed, 3])
    schedule: list[np.ndarray] = []
    embed = model.model.embed_tokens.weight  # [V, H], tied head
    val_tensors = batch_tensors(val, torch)
    best: tuple[float, int, dict] = (-1.0, -1, {})  # (val accuracy, step, state dict)
    # With --ema, the candidates are an exponential moving average of the weights, not the weights.
    averaged = copy.deepcopy(model).eval() if args.ema > 0 else model
    averaged_params, params = list(averaged.parameters()), list(model.parameters())
    for step in range(args.steps):
        if not schedule:  # a new epoch, in a deterministic order
            schedule = epoch_batches(lengths, args.batch, data_rng)
        ids, rows, cols, targets, clause_rows, clause_cols, clause_labels = batch_tensors(
            [pairs[i] for i in schedule.pop()], torch)
        out = model.model(input_ids=ids, output_hidden_states=args.clause_loss > 0)
        logits = out.last_hidden_state[rows, cols] @ embed.T  # [answer tokens, V]: the head only where a loss is taken
        loss = torch.nn.functional.cross_entropy(logits, targets)
        if args.clause_loss > 0 and len(clause_labels):  # which tool, and which clause, each request token is in
            middle = out.hidden_states[args.layers // 2][clause_rows, clause_cols]  # [clause tokens, H]
            guess = clause_head(middle)  # [clause tokens, tools + CLAUSES]
            tools = len(catalog.names)
            aux = (torch.nn.functional.cross_entropy(guess[:, :tools], clause_labels // CLAUSES)
                   + torch.nn.functional.cross_entropy(guess[:, tools:], clause_labels % CLAUSES))
            loss = loss + args.clause_loss * aux
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup=args.warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if args.ema > 0:
            with torch.no_grad():
                torch._foreach_mul_(averaged_params, args.ema)
                torch._foreach_add_(averaged_params, params, alpha=1 - args.ema)
        last = step == args.steps - 1
        out_of_time = ((args.max_seconds is not None and time.perf_counter() - start > args.max_seconds)
                       or (args.stop_step is not None and step >= args.stop_step))
        last = last or out_of_time
        if step % 100 == 0 or last:
            line = f"step {step} loss {loss.item():.4f} {time.perf_counter() - start:.0f} s"
            # Training loss spikes now and then; keep the snapshot that answers most validation requests.
            if (step >= args.steps // 2 or out_of_time) and (step % 100 == 0 or last):
                acc = val_answer_accuracy(averaged, val_tensors, torch)
                line += f", val answers exact {acc:.4f}"
                if acc > best[0] or (last and args.keep == "last"):
                    best = (acc, step, {k: v.detach().clone() for k, v in averaged.state_dict().items()})
            if args.save_every and step and step % args.save_every == 0:
                snapshot = copy.deepcopy(averaged).eval()
                write_folder(snapshot, tokenizer, Path(f"{args.out}-step{step}"), torch)
            print(line, flush=True)
        if out_of_time:
            print(f"stopped at step {step} of {args.steps} (--max-seconds {args.max_seconds} --stop-step "
                  f"{args.stop_step})", flush=True)
            break

    model.load_state_dict(best[2])
    print(f"kept step {best[1]}: val answers exact {best[0]:.4f}")
    write_folder(model.eval(), tokenizer, Path(args.out), torch)
    size = sum(f.stat().st_size for f in Path(args.out).iterdir())
    print(f"wrote {args.out}: {size / 1e6:.2f} MB, {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
