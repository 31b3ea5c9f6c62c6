"""A real byte-level BPE tokenizer trained on text the project generates, deterministic from a seed.

Special tokens come first: ``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2
(end of turn, the answer's END). Byte-level BPE means any text encodes, and "\n" (the
default separator) is always one token.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
END_OF_TURN = "<|im_end|>"
DEFAULT_VOCAB_SIZE = 4096

# Words of tool-discovery requests and of tool names (snake_case parts), so both tokenize compactly.
_VERBS = ("search get create send book cancel convert translate find list update delete check schedule "
          "play pause set add remove open close read write summarize compare calculate order track share "
          "upload download reset start stop show lookup reserve refund transfer pay call rate").split()
_NOUNS = ("flights flight hotel hotels weather forecast calendar event events email emails message messages "
          "currency exchange rate rates file files folder document documents note notes reminder reminders "
          "alarm timer music song playlist news stock stocks price prices recipe recipes restaurant table "
          "taxi ride train bus route directions map traffic contact contacts meeting meetings invoice payment "
          "account balance password order package delivery text language photo photos video translation "
          "definition word task tasks todo list lights thermostat temperature door movie tickets sports score "
          "wikipedia article time zone date dictionary unit units distance package shipment").split()
_PLACES = ("Paris London Tokyo Berlin Madrid Rome Lisbon Oslo Cairo Lima Sydney Toronto Chicago Boston "
           "Seattle Denver Austin Dublin Vienna Prague Warsaw Athens Istanbul Mumbai Delhi Seoul Beijing "
           "Singapore Dubai Nairobi Lagos Mexico Bogota Santiago Zurich Geneva Amsterdam Brussels").split()
_PEOPLE = "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent Victor Wendy".split()
_FILLER = ("please can you could i need to want would like the a an for from to on in at with my me "
           "tomorrow today tonight next week monday tuesday wednesday thursday friday saturday sunday "
           "and then also about of is what how much many when where which who this that it "
           "euros dollars yen pounds morning evening afternoon report budget project team").split()


def training_corpus(seed: int, sentences: int = 6000) -> list[str]:
    """Deterministic synthetic text: requests, snake_case tool names, numbers, dates."""
    rng = np.random.default_rng(seed)
    pools = (_VERBS, _NOUNS, _PLACES, _PEOPLE, _FILLER)
    lines = []
    for _ in range(sentences):
        kind = rng.integers(0, 4)
        if kind == 0:
            lines.append(f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}")
        elif kind == 1:
            lines.append(f"{rng.integers(1, 29)}-{rng.integers(1, 13):02d}-2026 {rng.integers(0, 10000)}")
        else:
            n = int(rng.integers(4, 14))
            words = [str(rng.choice(pools[int(rng.integers(0, len(pools)))])) for _ in range(n)]
            lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ""]))
    return lines


def train_tokenizer(seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE, extra_text: Sequence[str] = ()) -> Tokenizer:
    """Trains the project's byte-level BPE tokenizer; same arguments give the same tokenizer.

    ``extra_text``: domain lines appended to the synthetic corpus (a trained model's requests and
    tool names), so that domain's words become single tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*training_corpus(seed), *extra_text], trainer=trainer)
    return tok
