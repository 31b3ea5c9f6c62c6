"""The robustness check's variation rule: a request with its numbers, names and punctuation
changed, which must not change its answer (models/recipe/eval.py --handwritten).

``vary(request, seed)`` is deterministic in (request, seed):
- every run of digits becomes another number of as many digits (a leading digit stays nonzero);
- every capitalized word that does not open the request (or a sentence) and is not on the
  keep list (I, weekdays, months, product names the request may be about) becomes a name
  from ``NAMES``, the same word always the same name within one request;
- the closing punctuation changes (removed if there was one, else one of . ! ? added), and
  the first letter's case flips.
Quoted text ('...' or "...") is kept as it is: it is the text a tool works on.
"""
from __future__ import annotations

import re
import zlib

import numpy as np

NAMES = ("Noor", "Mateo", "Ines", "Yuki", "Sven", "Amara", "Diego", "Freya", "Tobias", "Leila", "Kenji",
         "Zara", "Bogdan", "Anouk", "Rafael", "Siobhan")
KEEP = {"I", "I'm", "I'll", "I'd", "Wikipedia", "Google", "Uber", "Lyft", "Monday", "Tuesday", "Wednesday",
        "Thursday", "Friday", "Saturday", "Sunday", "January", "February", "March", "April", "May", "June",
        "July", "August", "September", "October", "November", "December", "English"}
# the pieces a request is varied by: quoted text, digit runs, words, single characters
PIECES = re.compile(r"('[^']*'|\"[^\"]*\"|\d+|[A-Za-z][\w'-]*|.)", re.S)


def redraw_digits(run: str, rng: np.random.Generator) -> str:
    """Another number of as many digits (a leading digit stays nonzero unless it was 0)."""
    return "".join(str(int(rng.integers(1 if i == 0 and run[0] != "0" else 0, 10))) for i in range(len(run)))


def flip_ending(text: str, rng: np.random.Generator) -> str:
    """The closing punctuation toggled (removed if there is one, else one of . ! ? added) and the first
    letter's case flipped; "" stays ""."""
    stripped = text.rstrip()
    if stripped and stripped[-1] in ".!?":
        text = stripped.rstrip(".!?")
    else:
        text = stripped + (".", "!", "?")[int(rng.integers(3))]
    return (text[0].lower() if text[0].isupper() else text[0].upper()) + text[1:] if text else text


def vary(request: str, seed: int = 0) -> str:
    """The varied request (see the module docstring); "" stays ""."""
    if not request.strip():
        return request
    rng = np.random.default_rng([seed, zlib.crc32(request.encode())])
    names: dict[str, str] = {}
    out, sentence_start = [], True
    for tok in PIECES.findall(request):
        if tok[0] in "'\"" and len(tok) > 1:
            out.append(tok)
        elif tok.isdigit():
            out.append(redraw_digits(tok, rng))
        elif tok[0].isupper() and not tok.isupper() and not sentence_start and tok not in KEEP:
            if tok not in names:
                names[tok] = NAMES[int(rng.integers(len(NAMES)))]
            out.append(names[tok])
        else:
            out.append(tok)
        if tok.strip():
            sentence_start = tok in ".!?\n"
        elif "\n" in tok:
            sentence_start = True
    return flip_ending("".join(out), rng)
