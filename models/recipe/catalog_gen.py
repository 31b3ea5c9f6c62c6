"""Generated catalogs and labelled requests for the catalog-reading model (the ``{tools}`` template).

A catalog: n tools, each named by 1-3 words joined by "_" (often a common action verb first) and
described by a sentence holding most of the name's words plus other content words and function
words, all drawn from wordfreq's English list (ranks about 40-8,000). A request reuses 1-3 words of
each of its tools (sometimes inflected), with filler (openers, function words) and distractor words
no tool of the catalog holds.

Labels follow one rule, so the data never contradicts itself. Words are stem-matched, and an action
verb (VERBS) is a weak word: it counts 1, a content word 2. A request's tools each share at least one
content word with it and score strictly higher than every other tool; a no-tool request shares no
content word with any tool (it may share a verb: "get the parcel" names no tool of a weather catalog).
Each clause of a multi-tool request points at its own tool.
"""
from __future__ import annotations

import random
import re
from pathlib import Path

import wordfreq
from tokenizers import Tokenizer

from toolcall.models.recipe.data import stem
from toolcall.models.recipe.overlap import STOPWORDS

TOKENIZER = Path(__file__).parents[1] / "toolcall-qwen3-tiny" / "tokenizer.json"
_ALL = wordfreq.top_n_list("en", 30000)
CONTENT = [w for w in _ALL if re.fullmatch("[a-z]{3,12}", w) and w not in STOPWORDS][40:8000]
VERBS = ("get find search list create add update delete remove cancel book send check set show start stop "
         "track pay schedule reset open close play convert calculate translate share upload download order "
         "request report compare estimate lookup view edit save rename move copy renew submit verify enable "
         "disable register join leave rate review plan reserve transfer refund mark assign notify record "
         "scan print sync import export fetch read write call reply archive restore").split()
FUNC = "the a an for with of to and by from in on your its any all or at into about".split()
OPENERS = ["", "", "", "please ", "can you ", "could you ", "i need to ", "i want to ", "help me ", "i'd like to ",
           "pls ", "hey, ", "would you ", "let's ", "i have to ", "we need to ", "can i ", "is it possible to ",
           "how do i ", "i would like you to ", "go ahead and ", "quick: ", "ok so ", "hi, can you "]
CLOSERS = ["", "", "", "", "?", ".", " please", " for me", " now", " today", " asap", " thanks", "!", " if you can"]
JOINERS = [" and ", " and then ", ", then ", " and also ", ". also ", ", and ", " then ", "; ", " plus ",
           ". after that ", " as well as "]
CHAT = ["thanks a lot", "how are you", "good morning", "you are great", "what do you think", "never mind",
        "ok thanks", "that is all", "hello there", "who are you", "tell me a joke", "i am bored",
        "what time is it", "nice work", "sounds good", "no thanks", "bye", "lol", "hmm", "cool"]
# P(0, 1, 2, 3 tools) per request.
KIND_WEIGHTS = (0.25, 0.5, 0.2, 0.05)


_STOP_STEMS = {stem(s) for s in STOPWORDS} | STOPWORDS
VERB_STEMS = frozenset(stem(v) for v in VERBS)


def words(text: str) -> set[str]:
    """Stems of the text's words, stopwords dropped."""
    return {stem(w) for w in re.findall(r"[a-z0-9]+", text.lower())} - _STOP_STEMS


def tool_words(tool: tuple[str, str]) -> set[str]:
    return words(tool[0].replace("_", " ") + " " + tool[1])


def match_score(request: set[str], tool: set[str]) -> tuple[int, int]:
    """(content words shared, score): a content word counts 2, an action verb 1."""
    shared = request & tool
    content = len(shared - VERB_STEMS)
    return content, 2 * content + len(shared) - content


def _single_token_words() -> list[str]:
    tok = Tokenizer.from_file(str(TOKENIZER))
    return [w for w in _ALL if re.fullmatch("[a-z]{3,12}", w) and w not in STOPWORDS
            and len(tok.encode(" " + w).ids) == 1]


SINGLE = _single_token_words()  # one token after a space: the early curriculum's words


def inflect(w: str, rng: random.Random) -> str:
    base = stem(w)
    forms = [base + "s", base + "ing", base + "ed", base + "es" if base.endswith(("sh", "ch", "x")) else base + "s"]
    forms = [f for f in forms if f != w and stem(f) == base]
    return rng.choice(forms) if forms else w


class CatalogGenerator:
    """Seeded: the same seed and calls give the same catalogs and requests. ``single_p``: share of
    content words drawn from SINGLE; ``name_p``: share of a clause's words taken from the tool's name."""

    def __init__(self, seed: int, single_p: float = 0.0, name_p: float = 0.4):
        self.rng = random.Random(seed)
        self.single_p = single_p
        self.name_p = name_p

    def content(self, avoid: set[str] = frozenset()) -> str:
        while True:
            w = self.rng.choice(SINGLE if self.rng.random() < self.single_p else CONTENT)
            if stem(w) not in avoid and stem(w) not in VERB_STEMS:
                return w

    def tool(self, domain: list[str], used: set[str]) -> tuple[str, str]:
        rng = self.rng
        while True:
            k = rng.choices((1, 2, 3), (0.15, 0.5, 0.35))[0]
            verb = rng.choice(VERBS) if rng.random() < 0.65 else None
            nouns = [rng.choice(domain) if domain and rng.random() < 0.35 else self.content()
                     for _ in range(k - (1 if verb and k > 1 else 0))]
            parts = ([verb] if verb else []) + nouns
            name = "_".join(parts)
            if name not in used and len(set(parts)) == len(parts):
                break
        described = [n if rng.random() < 0.85 else inflect(n, rng) for n in nouns if rng.random() < 0.8]
        described += [rng.choice(domain) if domain and rng.random() < 0.3 else self.content()
                      for _ in range(rng.choice((1, 1, 2, 2, 3, 4, 5)))]
        rng.shuffle(described)
        dverb = verb if verb and rng.random() < 0.6 else rng.choice(VERBS + ["look up", "give", "tell", "return"])
        out = [dverb]
        for w in described:
            if rng.random() < 0.5:
                out.append(rng.choice(FUNC))
            out.append(w)
        desc = " ".join(out)
        desc = desc[0].upper() + desc[1:]
        if rng.random() < 0.15:
            desc += ", " + " ".join([rng.choice(FUNC), self.content()])
        if rng.random() < 0.85:
            desc += "."
        return name, desc

    def catalog(self, n: int) -> list[tuple[str, str]]:
        """n (name, description) tools; half the catalogs share a few domain words across tools."""
        domain = [self.content() for _ in range(self.rng.randint(2, 6))] if self.rng.random() < 0.5 else []
        tools, used = [], set()
        for _ in range(n):
            name, desc = self.tool(domain, used)
            used.add(name)
            tools.append((name, desc))
        return tools

    def _clause(self, tool: tuple[str, str], avoid: set[str]) -> str:
        rng = self.rng
        name, desc = tool
        pool = [w for w in re.findall(r"[a-z]+", (name.replace("_", " ") + " " + desc).lower())
                if w not in STOPWORDS and len(w) >= 3]
        name_words = name.split("_")
        m = min(len(set(pool)), rng.choices((1, 2, 3), (0.45, 0.37, 0.18))[0])
        chosen: list[str] = []
        for _ in range(m * 3):
            if len(chosen) >= m:
                break
            w = rng.choice(name_words) if rng.random() < self.name_p else rng.choice(pool)
            if w not in chosen:
                chosen.append(w)
        chosen = [inflect(w, rng) if rng.random() < 0.2 else w for w in chosen]
        picked = chosen + [self.content(avoid) for _ in range(rng.choice((0, 0, 1, 1, 2)))]
        if rng.random() < 0.2:
            picked.append(str(rng.randint(1, 999)))
        if rng.random() < 0.5:
            rng.shuffle(picked)
        return self._with_function_words(picked, FUNC + ["my", "me", "some", "this", "that", "our"])

    def _with_function_words(self, picked: list[str], function_words: list[str]) -> str:
        out = []
        for w in picked:
            if self.rng.random() < 0.5:
                out.append(self.rng.choice(function_words))
            out.append(w)
        return " ".join(out)

    def _no_tool_text(self, avoid: set[str]) -> str:
        rng = self.rng
        if rng.random() < 0.3:
            return rng.choice(CHAT)
        picked = [self.content(avoid) for _ in range(rng.choice((1, 2, 2, 3)))]
        if rng.random() < 0.4:  # an action verb alone names no tool
            picked.insert(0, rng.choice(VERBS))
        text = self._with_function_words(picked, FUNC + ["my", "me", "some"])
        return rng.choice(OPENERS) + text + rng.choice(CLOSERS)

    def request(self, tools: list[tuple[str, str]], kind: int) -> tuple[str, list[str]] | None:
        """A request needing ``kind`` tools (0: none) and its answer, or None when the draw breaks the rule."""
        rng = self.rng
        tw = [tool_words(t) for t in tools]
        avoid = set().union(*tw)
        if kind == 0:
            text = self._no_tool_text(avoid)
            rw = words(text)
            return None if any(match_score(rw, t)[0] for t in tw) else (self._case(text), [])
        idx = rng.sample(range(len(tools)), kind)
        clauses = [self._clause(tools[i], avoid) for i in idx]
        text = rng.choice(OPENERS) + clauses[0]
        for c in clauses[1:]:
            text += rng.choice(JOINERS) + c
        text += rng.choice(CLOSERS)
        scores = [match_score(words(text), t) for t in tw]
        if any(scores[i][0] == 0 for i in idx):
            return None
        lowest = min(scores[i][1] for i in idx)
        if any(scores[j][1] >= lowest for j in range(len(tools)) if j not in idx):
            return None
        for c, i in zip(clauses, idx):  # each clause points at its own tool
            cw = words(c)
            if any(match_score(cw, tw[j])[1] >= match_score(cw, tw[i])[1] for j in idx if j != i):
                return None
        return self._case(text), [tools[i][0] for i in idx]

    def _case(self, text: str) -> str:
        text = text.strip()
        return text[0].upper() + text[1:] if self.rng.random() < 0.3 else text

    def requests(self, tools: list[tuple[str, str]], k: int) -> list[tuple[str, list[str]]]:
        out: list[tuple[str, list[str]]] = []
        while len(out) < k:
            kind = self.rng.choices((0, 1, 2, 3), KIND_WEIGHTS)[0]
            if kind <= len(tools) and (r := self.request(tools, kind)) is not None:
                out.append(r)
        return out
