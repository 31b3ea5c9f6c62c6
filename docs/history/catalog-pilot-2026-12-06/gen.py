"""Generated catalogs + requests for the {tools}-template model (pilot 44).

A catalog: n tools, name = 1-3 words joined by "_" (often a common action verb first), description = a
sentence holding most of the name's words plus other content words and function words. Requests reuse 1-3
content words of their tool(s) (sometimes inflected) plus filler (stopwords, openers) and distractor words
that no tool of the catalog holds. Label consistency: a request's target tools share strictly more words
(stem-matched) with it than any other tool; no-tool requests share none.
"""
from __future__ import annotations

import random
import re

import wordfreq

from toolcall.models.recipe.overlap import STOPWORDS

_ALL = wordfreq.top_n_list("en", 30000)
CONTENT = [w for w in _ALL if re.fullmatch("[a-z]{3,12}", w) and w not in STOPWORDS][40:8000]
_TOK = __import__("tokenizers").Tokenizer.from_file("/work/main/models/toolcall-qwen3-tiny/tokenizer.json")
SINGLE = [w for w in (x for x in _ALL if re.fullmatch("[a-z]{3,12}", x) and x not in STOPWORDS)
          if len(_TOK.encode(" " + w).ids) == 1]  # one token after a space (608 words)
VERBS = ("get find search list create add update delete remove cancel book send check set show start stop "
         "track pay schedule reset open close play convert calculate translate share upload download order "
         "request report compare estimate lookup view edit save rename move copy renew submit verify enable "
         "disable register join leave rate review plan reserve transfer refund mark assign notify record "
         "scan print sync import export fetch read write call reply archive restore").split()
FUNC = ("the a an for with of to and by from in on your its any all or at into about").split()
OPENERS = ["", "", "", "please ", "can you ", "could you ", "i need to ", "i want to ", "help me ", "i'd like to ",
           "pls ", "hey, ", "would you ", "let's ", "i have to ", "we need to ", "can i ", "is it possible to ",
           "how do i ", "i would like you to ", "go ahead and ", "quick: ", "ok so ", "hi, can you "]
CLOSERS = ["", "", "", "", "?", ".", " please", " for me", " now", " today", " asap", " thanks", "!", " if you can"]
JOINERS = [" and ", " and then ", ", then ", " and also ", ". also ", ", and ", " then ", "; ", " plus ",
           ". after that ", " as well as "]
CHAT = ["thanks a lot", "how are you", "good morning", "you are great", "what do you think", "never mind",
        "ok thanks", "that is all", "hello there", "who are you", "tell me a joke", "i am bored",
        "what time is it", "nice work", "sounds good", "no thanks", "bye", "lol", "hmm", "cool"]


def stem(w: str) -> str:
    for suf in ("ing", "ed", "es", "s"):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            return w[: -len(suf)]
    return w


def words(text: str) -> set[str]:
    return {stem(w) for w in re.findall(r"[a-z0-9]+", text.lower())} - {stem(s) for s in STOPWORDS} - STOPWORDS


def inflect(w: str, rng: random.Random) -> str:
    base = stem(w)
    forms = [base + "s", base + "ing", base + "ed", base + "es" if base.endswith(("sh", "ch", "x")) else base + "s"]
    forms = [f for f in forms if f != w and stem(f) == base]
    return rng.choice(forms) if forms else w


class Gen:
    def __init__(self, seed: int, single_p: float = 0.0, name_p: float = 0.4):
        self.rng = random.Random(seed)
        self.single_p = single_p  # share of content words drawn from SINGLE (one-token words)
        self.name_p = name_p  # share of request words taken from the tool's name (else its description)

    def content(self, avoid: set[str] = frozenset()) -> str:
        while True:
            w = self.rng.choice(SINGLE if self.rng.random() < self.single_p else CONTENT)
            if stem(w) not in avoid:
                return w

    def tool(self, domain: list[str], used: set[str]) -> tuple[str, str]:
        rng = self.rng
        while True:
            k = rng.choices((1, 2, 3), (0.15, 0.5, 0.35))[0]
            verb = rng.choice(VERBS) if rng.random() < 0.65 else None
            nouns = []
            for _ in range(k - (1 if verb and k > 1 else 0)):
                nouns.append(rng.choice(domain) if domain and rng.random() < 0.35 else self.content())
            parts = ([verb] if verb else []) + nouns
            name = "_".join(parts)
            if name not in used and len(set(parts)) == len(parts):
                break
        # description
        cws = [n if rng.random() < 0.85 else inflect(n, rng) for n in nouns if rng.random() < 0.8]
        cws += [rng.choice(domain) if domain and rng.random() < 0.3 else self.content()
                for _ in range(rng.choice((1, 1, 2, 2, 3, 4, 5)))]
        rng.shuffle(cws)
        dverb = verb if verb and rng.random() < 0.6 else rng.choice(VERBS + ["look up", "give", "tell", "return"])
        out = [dverb]
        for w in cws:
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
        domain = [self.content() for _ in range(self.rng.randint(2, 6))] if self.rng.random() < 0.5 else []
        tools, used = [], set()
        for _ in range(n):
            name, desc = self.tool(domain, used)
            used.add(name)
            tools.append((name, desc))
        return tools

    def clause(self, tool: tuple[str, str], avoid: set[str]) -> str:
        rng = self.rng
        name, desc = tool
        pool = [w for w in re.findall(r"[a-z]+", (name.replace("_", " ") + " " + desc).lower())
                if w not in STOPWORDS and len(w) >= 3]
        namew = [w for w in name.split("_")]
        m = min(len(set(pool)), rng.choices((1, 2, 3), (0.45, 0.37, 0.18))[0])
        chosen = []
        for _ in range(m * 3):
            if len(chosen) >= m:
                break
            w = rng.choice(namew) if rng.random() < self.name_p else rng.choice(pool)
            if w not in chosen:
                chosen.append(w)
        chosen = [inflect(w, rng) if rng.random() < 0.2 else w for w in chosen]
        extra = [self.content(avoid) for _ in range(rng.choice((0, 0, 1, 1, 2)))]
        if rng.random() < 0.2:
            extra.append(str(rng.randint(1, 999)))
        ws = chosen + extra
        rng.shuffle(ws) if rng.random() < 0.5 else None
        out = []
        for w in ws:
            if rng.random() < 0.5:
                out.append(rng.choice(FUNC + ["my", "me", "some", "this", "that", "our"]))
            out.append(w)
        return " ".join(out)

    def request(self, tools: list[tuple[str, str]], kind: int) -> tuple[str, list[str]] | None:
        """kind: 0 no tool, 1-3 tools."""
        rng = self.rng
        avoid = set().union(*(words(n.replace("_", " ") + " " + d) for n, d in tools))
        tw = [words(n.replace("_", " ") + " " + d) for n, d in tools]
        if kind == 0:
            if rng.random() < 0.3:
                text = rng.choice(CHAT)
            else:
                ws = [self.content(avoid) for _ in range(rng.choice((1, 2, 2, 3)))]
                out = []
                for w in ws:
                    if rng.random() < 0.5:
                        out.append(rng.choice(FUNC + ["my", "me", "some"]))
                    out.append(w)
                text = rng.choice(OPENERS) + " ".join(out) + rng.choice(CLOSERS)
            if words(text) & avoid:
                return None
            return self.case(text), []
        idx = rng.sample(range(len(tools)), kind)
        clauses = [self.clause(tools[i], avoid) for i in idx]
        text = rng.choice(OPENERS) + clauses[0]
        for c in clauses[1:]:
            text += rng.choice(JOINERS) + c
        text += rng.choice(CLOSERS)
        rw = words(text)
        ov = [len(rw & t) for t in tw]
        lo = min(ov[i] for i in idx)
        if lo == 0 or any(ov[j] >= lo for j in range(len(tools)) if j not in idx):
            return None
        if kind > 1:  # each clause must point at its own tool
            for c, i in zip(clauses, idx):
                cw = words(c)
                if any(len(cw & tw[j]) >= len(cw & tw[i]) for j in idx if j != i):
                    return None
        return self.case(text), [tools[i][0] for i in idx]

    def case(self, text: str) -> str:
        text = text.strip()
        if self.rng.random() < 0.3:
            text = text[0].upper() + text[1:]
        return text

    def requests(self, tools, k: int, probs=(0.18, 0.57, 0.2, 0.05)) -> list[tuple[str, list[str]]]:
        out = []
        while len(out) < k:
            kind = self.rng.choices((0, 1, 2, 3), probs)[0]
            if kind > len(tools):
                continue
            r = self.request(tools, kind)
            if r is not None:
                out.append(r)
        return out


if __name__ == "__main__":
    g = Gen(0)
    for n in (3, 8):
        t = g.catalog(n)
        for name, d in t:
            print(f"{name}: {d}")
        for r in g.requests(t, 12):
            print("  ", r)
