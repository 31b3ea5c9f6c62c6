"""The wording variety of generated requests (``data.Wording``): typos, casual spellings, casing,
varied joins of multi-intent requests, greetings around a request, and requests varied like the
robustness check (models/recipe/data.py).

Everything here acts on filled clause text and is drawn from the caller's generator, so the
same seed gives the same requests. The train split uses all of it; a validation split made with a
``wording`` (train.py's model choice) gets its typos, casing and joins around the held-out
templates' own words; the test split that eval.py scores never passes through it.
"""
from __future__ import annotations

import numpy as np

from toolcall.models.recipe.pools import _MONTHS, _WEEKDAYS, GENERATORS
from toolcall.models.recipe.variation import PIECES, flip_ending, redraw_digits

# Joins between the clauses of a multi-intent request: words, punctuation, symbols, new lines.
JOINS = (" and ", " and then ", ", then ", " then ", ". Also ", " and also ", ", plus ", "; after that ",
         ". After that, ", ", and ", " & ", " + ", "; ", ", ", ". ", "\n", " also ", ", also ", " plus ",
         " as well as ", ". oh and ", ", btw ", " after that ", ". Next, ", " and afterwards ", " n ",
         ", and also ", " and after that ", ". Then ", " - ", ", next ", " also can you ", ". and ", " AND ",
         "... and ", ", and please ", " / ", ". Finally, ", " before that ", ", as well as ")
OPENERS = ("hi, ", "hey, ", "hello! ", "hi ", "hey there, ", "good morning, ", "yo ", "ok so ", "so ", "um ",
           "quick one: ", "hey can you ", "hi, can you ", "please ", "pls ", "could you ", "i need you to ",
           "can u ", "would you ", "I was wondering if you could ", "help: ", "ok, ")
CLOSERS = (" thanks", ", thanks!", " thx", " please", " pls", " ty", " :)", ", cheers", " asap",
           " thank you", " for me", " if you can", " right now", " real quick")
ENDINGS = ("", "", "", ".", ".", "?", "!", "!!", "...", " ?", "??", " .")
CASUAL = {"you": "u", "please": "pls", "what's": "whats", "your": "ur", "are": "r", "tonight": "tonite",
          "thanks": "thx", "to": "2", "for": "4", "want to": "wanna", "going to": "gonna", "i'm": "im",
          "don't": "dont", "can't": "cant", "i'd": "id", "it's": "its", "where's": "wheres", "how's": "hows",
          "message": "msg", "tomorrow": "tmrw", "minutes": "mins", "minute": "min", "and": "&"}
# ``Wording.trailers``: details after a clause that add no second request, several with "and" ("... and let me know"),
# so that a join word alone never means a second tool.
TRAILERS = (" for me", " if possible", ", it's urgent", " and let me know", " and tell me when it's done",
            " when you have a sec", " for my trip", " for the weekend", " for work", " and make it quick",
            " and get back to me", ", no rush", " as soon as possible", " and thanks", " and keep it short",
            " for tonight", " and do it now", ", please and thank you", " and that's it", " this time",
            " like last time", " and confirm", " and be quick about it", " again", ", the usual",
            " and don't forget", " or whatever works", " if that's ok", " and hurry", ", as discussed")
KEYBOARD = "qwertyuiop asdfghjkl zxcvbnm".split()


def _neighbor(ch: str, rng: np.random.Generator) -> str:
    for row in KEYBOARD:
        k = row.find(ch)
        if k >= 0:
            options = [row[j] for j in (k - 1, k + 1) if 0 <= j < len(row)]
            return options[int(rng.integers(len(options)))]
    return ch


def typo(word: str, rng: np.random.Generator) -> str:
    """``word`` with one slip: two letters swapped, one dropped, doubled or hit next to."""
    if len(word) < 3 or not word.isalpha():
        return word
    k = int(rng.integers(1, len(word) - 1))
    op = int(rng.integers(4))
    if op == 0:
        return word[:k] + word[k + 1] + word[k] + word[k + 2:]
    if op == 1:
        return word[:k] + word[k + 1:]
    if op == 2:
        return word[:k] + word[k] + word[k:]
    return word[:k] + _neighbor(word[k].lower(), rng) + word[k + 1:]


def roughen(clause: str, rng: np.random.Generator, typos: float) -> str:
    """The clause with each word given a typo with p=``typos``, casual spellings with p=3*typos
    each, apostrophes dropped with p=0.1, and lower-cased or upper-cased now and then."""
    text = clause
    if typos > 0:
        for formal, casual in CASUAL.items():
            if f" {formal} " in f" {text} " and rng.random() < 3 * typos:
                text = f" {text} ".replace(f" {formal} ", f" {casual} ", 1)[1:-1]
        text = " ".join(typo(w, rng) if rng.random() < typos else w for w in text.split(" "))
    r = rng.random()
    if r < 0.1:
        text = text.replace("'", "")
    r = rng.random()
    if r < 0.2:
        text = text.lower()
    elif r < 0.22:
        text = text.upper()
    return text


# ``Wording.lists``: a multi-intent request written as one list. Each style is (before the first clause, between
# clauses, before the last); "{i}" is the clause's number from 1.
LIST_STYLES = (("", ", ", " and "), ("", ", ", ", and "), ("", ", ", " & "), ("", "; ", "; and "), ("", ", ", ", "),
               ("", ", ", ", and also "), ("", ", ", " and then "), ("first ", ", then ", ", and finally "),
               ("first ", ", then ", " and then "), ("first ", ", next ", ", and last "), ("1) ", " {i}) ", " {i}) "),
               ("1. ", " {i}. ", " {i}. "), ("1. ", "\n{i}. ", "\n{i}. "), ("- ", "\n- ", "\n- "), ("* ", " * ", " * "),
               ("(1) ", ", ({i}) ", " and ({i}) "), ("a few things: ", ", ", " and "), ("{n} things: ", "; ", "; "),
               ("can you ", ", ", " and "), ("i need you to ", ", ", ", and "), ("", ". ", ". "), ("", ", ", " plus "),
               ("", " and ", " and "), ("", ", ", " as well as "), ("todo: ", ", ", ", "))
_NUMBERS = ("two", "three", "four")
# ``Wording.sentences``: longer, sentence-like joins between clauses (written from how people chain requests, not from any
# evaluation line); after one that ends a sentence the next clause may start capitalized.
SENTENCE_JOINS = (". Oh, and ", ". One more thing: ", ". Also, can you ", ". And ", "! Also ", "? And ", ", oh and ",
                  ". Plus ", ". Lastly, ", ". Additionally, ", ". Then please ", " and could you also ",
                  ". I also need you to ", ". Can you also ", " and then also ", "; then ", ". Besides that, ",
                  ", followed by ", ", after which ", ", and lastly ", ". Last thing: ", ". Next: ", "? Also ",
                  ".\nAlso ", "\nand ", "\n\n", ". After that I need you to ", ", and on top of that ",
                  ". Also please ", " -- also ", ", then after that ", ". Second, ", ". Oh also ", " and, also, ",
                  ". Another thing: ", ", and then please ", "! And ", ". And then ", " and finally ", "\nthen ")


def list_join(clauses: list[str], rng: np.random.Generator) -> str:
    """The clauses as one list in a style of LIST_STYLES (clause text kept verbatim)."""
    start, middle, last = LIST_STYLES[int(rng.integers(len(LIST_STYLES)))]
    text = start.replace("{n}", _NUMBERS[len(clauses) - 2]) + clauses[0]
    for i, clause in enumerate(clauses[1:], 2):
        text += (last if i == len(clauses) else middle).replace("{i}", str(i)) + clause
    return text[0].upper() + text[1:] if rng.random() < 0.6 else text


def join(clauses: list[str], rng: np.random.Generator, question: bool, lists: float = 0.0,
         sentences: float = 0.0) -> str:
    """One request from its clauses: the first capitalized or not, varied joins and endings,
    sometimes an opener ("hi, ") or a closer (" thanks"). Clause text is kept verbatim (but for a
    later clause's first letter, capitalized with p=0.5 after a SENTENCE_JOINS join that ends a
    sentence). With p=``lists`` (two clauses or more) the clauses form one list (``list_join``);
    with p=``sentences`` a join is one of SENTENCE_JOINS; with ``lists`` / ``sentences`` 0 no
    extra draw is made."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    if lists and len(clauses) >= 2 and rng.random() < lists:
        text = list_join(clauses, rng)
    else:
        first = clauses[0]
        text = first[0].upper() + first[1:] if rng.random() < 0.6 else first
        for clause in clauses[1:]:
            if sentences and rng.random() < sentences:
                joiner = pick(SENTENCE_JOINS)
                if joiner.rstrip(" ")[-1:] in ".!?:\n" and rng.random() < 0.5:
                    clause = clause[0].upper() + clause[1:]
                text += joiner + clause
            else:
                text += pick(JOINS) + clause
    if rng.random() < 0.12:
        opener = pick(OPENERS)
        text = (opener[0].upper() + opener[1:] if rng.random() < 0.5 else opener) + text
    if rng.random() < 0.08:
        text += pick(CLOSERS)
    if text.endswith("?"):
        text += pick(("", "", "?"))
    else:
        text += "?" if question and rng.random() < 0.6 else pick(ENDINGS)
    return text


# ``Wording.vary``: invariance augmentation. The same kind of change as the robustness check
# (models/recipe/variation.py, whose mechanics it shares) but drawn from training vocabulary only: names
# come from the training pools (pools.GENERATORS["person"]), never from the check's own name or keep lists.
_KEPT = {"I", "I'm", "I'll", "I'd", "I've", *(w.capitalize() for w in (*_WEEKDAYS, *_MONTHS))}


def _pool_name(rng: np.random.Generator) -> str:
    """A capitalized person name from the training pools (the generator's relations skipped)."""
    for _ in range(8):
        name = GENERATORS["person"](rng)
        if name[:1].isupper():
            return name
    return "Sam"


def vary_request(request: str, clauses: tuple[str, ...], rng: np.random.Generator,
                 spans: list[tuple[int, int]]) -> tuple[str, tuple[str, ...]]:
    """The request with every digit run re-drawn (as many digits, a leading digit nonzero unless it was 0),
    every capitalized word that opens no sentence and no clause (and is not "I" or a weekday or month, nor all
    capitals) replaced by a pool name (the same word the same name within the request), the closing punctuation
    toggled (removed if there is one, else one of . ! ? added) and the first letter's case flipped; quoted
    text is kept. Returns it with its clauses re-cut at the same places (``spans``: the old clause spans),
    so the clause labels still line up; the tools are the caller's, unchanged. Where a re-cut clause would not
    be found again (a clause of one character), the request and clauses are returned unchanged."""
    if not request.strip():
        return request, clauses
    starts = {a for a, _ in spans}  # a clause's first word is its verb ("Call ..." after "hi, "), never a name
    out, shifts, names, start_of_sentence = [], [], {}, True  # shifts: (old end, length change) per changed piece
    for m in PIECES.finditer(request):
        tok = new = m.group(0)
        if tok[0] in "'\"" and len(tok) > 1:
            pass
        elif tok.isdigit():
            new = redraw_digits(tok, rng)
        elif (tok[0].isupper() and not tok.isupper() and not start_of_sentence and tok not in _KEPT
              and m.start() not in starts):
            if tok not in names:
                names[tok] = _pool_name(rng)
            new = names[tok]
        if len(new) != len(tok):
            shifts.append((m.end(), len(new) - len(tok)))
        out.append(new)
        if tok.strip():
            start_of_sentence = tok in ".!?\n"
        elif "\n" in tok:
            start_of_sentence = True
    text = "".join(out)

    def moved(pos: int) -> int:
        return pos + sum(d for end, d in shifts if end <= pos)

    text = flip_ending(text, rng)
    new_clauses = tuple(text[max(0, moved(a)):min(moved(b), len(text))] for a, b in spans)
    pos = 0  # the re-cut clauses must be found again as Example.clause_spans finds them, else no change
    for clause in new_clauses:
        found = text.find(clause[1:], pos) - 1 if len(clause) > 1 else -2
        if found < 0 or text[found:found + len(clause)] != clause:
            return request, clauses
        pos = found + len(clause)
    return text, new_clauses
