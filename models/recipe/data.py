"""Seeded tool-discovery examples for the 64-tool example catalog (builder/data/tools-64.json).

Every tool has seven request templates (clauses with ``{slot}`` holes). A request joins one
to four clauses of distinct tools with connectors ("and", "then", "also"...); its label is
the tools in the order their clauses appear, the order the steps would run (canonical order).
Splits are by template: per tool, one template is test-only, one validation-only, five are
train-only (chosen from the seed), so test requests use phrasings never seen in training.
The train split may also take clauses from toolcall.models.recipe.lexicon (tool words in frames all
tools share), from toolcall.models.recipe.paraphrases and the phrasing lists
(toolcall.models.recipe.phrasings_everyday, phrasings_situations, phrasings_details: more phrasings
per tool) and wording noise; and, with ``wording`` (see ``Wording``), slot values from the large
generated pools of toolcall.models.recipe.pools, typos, casual spellings and varied joins
(toolcall.models.recipe.wording), and requests that need no tool (toolcall.models.recipe.chitchat),
labelled with the empty answer. Validation and test examples take only their split's held-out
templates, never a noise, lexicon, paraphrase or phrasing clause: with SLOTS values, or with
``wording`` its pooled values, typos, joins and no-tool requests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from toolcall.models.recipe.chitchat import no_tool_request
from toolcall.models.recipe.lexicon import lexicon_clauses
from toolcall.models.recipe.paraphrases import PARAPHRASES
from toolcall.models.recipe.phrasings_details import DETAIL_PHRASINGS
from toolcall.models.recipe.phrasings_everyday import EVERYDAY_PHRASINGS
from toolcall.models.recipe.phrasings_situations import SITUATION_PHRASINGS
from toolcall.models.recipe.pools import draw
from toolcall.models.recipe.templates import PAIRED, SLOTS, TEMPLATES
from toolcall.models.recipe.wording import TRAILERS, join, roughen, vary_request

SPLITS = ("train", "val", "test")
LEXICON_ID = -1  # template id of a training-only lexicon clause
PARAPHRASE_ID = -2  # template id of a training-only paraphrase clause
PHRASING_ID = -3  # template id of a training-only clause from the phrasing lists (phrasings_*.py)
SPLIT_SIZES = {"train": 60_000, "val": 500, "test": 1000}  # default example counts per split
TOOL_COUNT_WEIGHTS = (0.3, 0.35, 0.2, 0.15)  # P(1, 2, 3, 4 tools in a request)
RELATED_WINDOW = 8  # Wording.related: a related request's tools lie within this many consecutive catalog tools
CONNECTORS = (" and ", " and then ", ", then ", " then ", ". Also ", " and also ", ", plus ", "; after that ",
              ". After that, ", ", and ")
# Training-time noise (make_split(noise=...)): politeness around a clause, filler words inside it,
# template words dropped; slot values are never touched. It keeps a model from keying on a
# template's exact wording, so held-out phrasings of the same intent still land.
PREFIXES = ("please ", "could you ", "can you ", "I want to ", "I'd like to ", "go ahead and ", "quickly ",
            "hey, ", "now ", "I need to ")
SUFFIXES = (" please", " for me", " now", " right away", " asap", " thanks", " if you can", " today",
            " when you get a chance", " too")
FILLERS = ("just", "quickly", "really", "maybe", "kindly", "actually", "the", "my", "now", "a", "to", "for", "me",
           "some", "in", "on", "with", "this", "that", "at", "of", "about", "new", "all", "any", "please")


@dataclass(frozen=True)
class Wording:
    """The training-only variety of requests (``make_split(wording=...)``): ``no_tool`` share of
    requests that need no tool (empty answer), ``pooled`` share of slot values from the generated
    pools, ``typos`` per-word typo rate, ``phrasings`` whether toolcall.models.recipe.phrasings_everyday
    joins the training templates (minus those near a held-out template).

    Every option below ``phrasings`` is off by default, and off it draws nothing from the generator:
    the data with it off is byte for byte the data without it (tests/test_toolcall_*.py pin sha256
    digests of such data). train.py's flags turn them on."""

    no_tool: float = 0.1
    pooled: float = 0.8
    typos: float = 0.03
    phrasings: bool = True
    # Words that must not name a tool on their own: ``entity`` share of name slots (hotel, song,
    # movie...) made of everyday and cue words, ``trailers`` share of clauses with a detail that asks
    # for nothing more, ``statements`` share of no-tool requests that are statements naming catalog
    # things; ``more`` whether toolcall.models.recipe.phrasings_situations joins the training phrasings.
    entity: float = 0.0
    trailers: float = 0.0
    statements: float = 0.0
    more: bool = False
    # ``swap`` share of proper-noun slots (pools.SWAPPABLE) filled with another such slot's generated value.
    swap: float = 0.0
    # ``names`` share of pools.NAMEABLE slots (language, restaurant, place...) given a person-like name
    # or an address; ``listed`` share of pools.LISTABLE slots holding a list of two or three values;
    # ``lists`` share of multi-intent requests joined as one list ("a, b and c", "1) a 2) b", "first a,
    # then b, and finally c": wording.list_join); ``extra`` whether
    # toolcall.models.recipe.phrasings_details joins the training phrasings.
    names: float = 0.0
    listed: float = 0.0
    lists: float = 0.0
    extra: bool = False
    # ``related`` share of multi-intent requests whose tools come from one window of RELATED_WINDOW
    # neighbouring catalog tools (the catalog lists a domain's tools together: flights, hotels,
    # calendar, money, home...), as people chain related steps ("cancel the hotel, find another, book
    # it"), so near tools must be told apart inside one request; ``sentences`` share of the joins
    # between clauses taken from wording.SENTENCE_JOINS (longer, sentence-like joins).
    related: float = 0.0
    sentences: float = 0.0
    # ``vary`` share of requests given the robustness check's kind of change from training vocabulary
    # only (wording.vary_request: digits re-drawn, mid-sentence capitalized words renamed from the
    # pools, closing punctuation toggled, first letter's case flipped); the tools are unchanged.
    vary: float = 0.0


def entity_words() -> list[str]:
    """Every plain word (3+ letters) of the templates, the everyday and situation phrasings and the
    paraphrases, sorted: the cue words that ``Wording.entity``'s made-up names are built from."""
    text = " ".join([*TEMPLATES.values(), *EVERYDAY_PHRASINGS.values(), *SITUATION_PHRASINGS.values(),
                     *(" ".join(v) for v in PARAPHRASES.values())])
    return sorted({w for w in re.findall(r"(?<![{\w])[a-z]{3,}(?![}\w])", text.lower())})


@dataclass(frozen=True)
class Example:
    """One labelled request: ``tools`` in canonical order, ``clauses[i]`` the text naming ``tools[i]``,
    ``patterns[i]`` the clause before slot filling and noise, ``template_ids[i]`` its template
    (LEXICON_ID, PARAPHRASE_ID, PHRASING_ID for a training-only lexicon, paraphrase or phrasing clause)."""

    request: str
    tools: tuple[str, ...]
    clauses: tuple[str, ...]
    patterns: tuple[str, ...]
    template_ids: tuple[int, ...]

    def clause_spans(self) -> list[tuple[int, int]]:
        """(start, end) character span in ``request`` of each clause, in order (connectors and the
        closing punctuation fall outside every span)."""
        spans, pos = [], 0
        for clause in self.clauses:  # the first clause starts capitalized: match from its 2nd character
            start = self.request.index(clause[1:], pos) - 1
            spans.append((start, start + len(clause)))
            pos = start + len(clause)
        return spans


def stem(word: str) -> str:
    """The word without one plural or verb ending (-ing, -ed, -es, -s), so "emails" ~ "email"."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[:-len(suffix)]
    return word


def near_held_out(pattern: str, held_out: list[str]) -> bool:
    """Whether ``pattern`` shares a run of three words with one of ``held_out``, or at least half of
    the distinct words of the two together (Jaccard >= 0.5); words compare by ``stem`` and a
    {slot} counts as a word. The decontamination rule that keeps paraphrases of a held-out
    template out of training."""
    def words(text: str) -> list[str]:
        return [stem(w) for w in text.replace(",", " ,").split()]

    def trigrams(w: list[str]) -> set[tuple[str, ...]]:
        return {tuple(w[i:i + 3]) for i in range(len(w) - 2)}

    mine = words(pattern)
    for other in map(words, held_out):
        if trigrams(mine) & trigrams(other) or len(set(mine) & set(other)) >= 0.5 * len(set(mine) | set(other)):
            return True
    return False


def template_table() -> list[tuple[str, str]]:
    """Every (tool, template) pair; a template's id is its index here (tools in TEMPLATES order)."""
    return [(tool, t) for tool, text in TEMPLATES.items() for t in text.split("|")]


def template_splits(seed: int) -> dict[int, str]:
    """Template id -> split: per tool one test, one val, the rest train, drawn from ``seed``."""
    rng = np.random.default_rng([seed, 1])
    out, first = {}, 0
    for text in TEMPLATES.values():
        ids = first + rng.permutation(len(text.split("|")))
        out[int(ids[0])], out[int(ids[1])] = "test", "val"
        out.update({int(i): "train" for i in ids[2:]})
        first += len(text.split("|"))
    return out


def _fill_pooled(template: str, rng: np.random.Generator, pooled: float, words: list[str] | None = None,
                 entity: float = 0.0, swap: float = 0.0, names: float = 0.0, listed: float = 0.0) -> str:
    """Replaces every {slot} with a toolcall.models.recipe.pools value (a generated one with p=``pooled``);
    {x2} differs from {x}. Paired slots are drawn apart (a made-up unit pair is still a conversion)."""
    parts = template.split("{")
    out, seen = [parts[0]], {}
    for part in parts[1:]:
        name, rest = part.split("}", 1)
        base = name[:-1] if name.endswith("2") else name
        value = draw(base, rng, pooled, words, entity, swap, names, listed)
        for _ in range(5):
            if value != seen.get(base):
                break
            value = draw(base, rng, pooled, words, entity, swap, names, listed)
        seen.setdefault(base, value)
        out.append(value + rest)
    words = "".join(out).split(" ")
    words = [w for k, w in enumerate(words) if not (w == "the" and k + 1 < len(words) and words[k + 1] == "the")]
    cap = rng.random() < 0.5  # people type "i" as often as "I"
    return " ".join("I" if w == "i" and cap else w for w in words)


def _fill(template: str, rng: np.random.Generator) -> str:
    """Replaces every {slot} with a value; {x2} differs from {x} in the same clause."""
    chosen: dict[str, int] = {}  # slot name -> index drawn into its value list
    parts = template.split("{")
    out = [parts[0]]
    for part in parts[1:]:
        name, rest = part.split("}", 1)
        base = name[:-1] if name.endswith("2") else name
        values = SLOTS[base]
        partner = PAIRED.get(name) or next((k for k, v in PAIRED.items() if v == name), None)
        if partner in chosen:  # a paired slot reuses its partner's index, in either order
            chosen[name] = chosen[partner]
        else:
            choices = [i for i in range(len(values)) if name == base or i != chosen.get(base)]
            chosen[name] = choices[int(rng.integers(len(choices)))]
        out.append(values[chosen[name]] + rest)
    words = "".join(out).split(" ")
    # "the {event}" with event "the budget meeting": say "the" once
    words = [w for k, w in enumerate(words) if not (w == "the" and k + 1 < len(words) and words[k + 1] == "the")]
    return " ".join("I" if w == "i" else w for w in words)


def _perturb(template: str, rng: np.random.Generator, noise: float) -> str:
    """The template with each plain word dropped with p=noise or swapped for a filler with p=noise/2,
    fillers inserted with p=noise/2, a prefix / suffix with p=2*noise each, and with p=2.5*noise
    the words shuffled (a bag of words: only the tool's own words can tell it apart). Words
    holding a {slot} are never dropped or swapped."""
    words = []
    for w in template.split(" "):
        r = rng.random()
        if "{" in w or r >= 1.5 * noise:
            words.append(w)
        elif r >= noise:
            words.append(FILLERS[int(rng.integers(len(FILLERS)))])
        if rng.random() < noise / 2:
            words.append(FILLERS[int(rng.integers(len(FILLERS)))])
    if rng.random() < 2.5 * noise:
        words = [words[i] for i in rng.permutation(len(words))]
    text = " ".join(words) or template
    if rng.random() < 2 * noise:
        text = PREFIXES[int(rng.integers(len(PREFIXES)))] + text
    if rng.random() < 2 * noise:
        text += SUFFIXES[int(rng.integers(len(SUFFIXES)))]
    return text


QUESTION_WORDS = ("what", "what's", "how", "is", "are", "when", "which", "who", "did", "do", "has", "will", "where",
                  "can")


def _example(rng: np.random.Generator, by_tool: dict[str, list[tuple[int, str]]], noise: float,
             lexicon: dict[str, list[str]] | None, lexicon_share: float,
             counts: tuple[float, ...], wording: Wording | None = None, words: list[str] | None = None) -> Example:
    """One example: ``_unvaried_example``, then with p=``wording.vary`` its request varied
    (wording.vary_request), the tools unchanged."""
    example = _unvaried_example(rng, by_tool, noise, lexicon, lexicon_share, counts, wording, words)
    if wording is not None and wording.vary and rng.random() < wording.vary:
        request, clauses = vary_request(example.request, example.clauses, rng, example.clause_spans())
        example = Example(request, example.tools, clauses, example.patterns, example.template_ids)
    return example


def _unvaried_example(rng: np.random.Generator, by_tool: dict[str, list[tuple[int, str]]], noise: float,
                      lexicon: dict[str, list[str]] | None, lexicon_share: float,
                      counts: tuple[float, ...], wording: Wording | None = None,
                      words: list[str] | None = None) -> Example:
    """One example: with ``wording``, a no-tool request with p=``wording.no_tool``; else one to four
    distinct tools (``counts``), a pattern each (a lexicon clause with p=``lexicon_share``, else one
    of ``by_tool``), filled and joined: with ``wording`` by its pools, typos and joins, without it by
    SLOTS values and CONNECTORS."""
    if wording is not None and rng.random() < wording.no_tool:
        return Example(no_tool_request(rng, wording.statements), (), (), (), ())
    names = list(by_tool)
    k = 1 + int(rng.choice(4, p=counts))
    if wording is not None and wording.related and k >= 2 and rng.random() < wording.related:  # neighbouring tools
        first = int(rng.integers(len(names) - RELATED_WINDOW + 1))
        tools = [names[first + int(i)] for i in rng.choice(RELATED_WINDOW, size=k, replace=False)]
    else:
        tools = [names[int(i)] for i in rng.choice(len(names), size=k, replace=False)]
    ids, patterns = [], []
    for t in tools:
        if lexicon and rng.random() < lexicon_share:
            ids.append(LEXICON_ID)
            patterns.append(lexicon[t][int(rng.integers(len(lexicon[t])))])
        else:
            i, pattern = by_tool[t][int(rng.integers(len(by_tool[t])))]
            ids.append(i)
            patterns.append(pattern)
    last = patterns[-1].split(" ")[0]
    question = last in QUESTION_WORDS
    if wording is not None:
        clauses = [roughen(_fill_pooled(_perturb(p, rng, noise) if noise else p, rng, wording.pooled, words,
                                        wording.entity, wording.swap, wording.names, wording.listed)
                           + (TRAILERS[int(rng.integers(len(TRAILERS)))]
                              if wording.trailers and rng.random() < wording.trailers else ""), rng, wording.typos)
                   for p in patterns]
        return Example(join(clauses, rng, question, wording.lists, wording.sentences), tuple(tools), tuple(clauses),
                       tuple(patterns), tuple(ids))
    clauses = [_fill(_perturb(p, rng, noise) if noise else p, rng) for p in patterns]
    text = clauses[0][0].upper() + clauses[0][1:]
    for clause in clauses[1:]:
        joiner = CONNECTORS[int(rng.integers(len(CONNECTORS)))]
        text += joiner + clause
    text += "?" if question else (".", "", "!")[int(rng.integers(3))]
    return Example(text, tuple(tools), tuple(clauses), tuple(patterns), tuple(ids))


def make_split(split: str, seed: int = 0, size: int | None = None, noise: float = 0.0,
               lexicon: float = 0.0, counts: tuple[float, ...] = TOOL_COUNT_WEIGHTS,
               paraphrases: bool = False, wording: Wording | None = None) -> list[Example]:
    """The ``split`` examples (train, val or test) for ``seed``; the same arguments give the same list.

    Training only: ``noise`` (0 to 0.4) perturbs each clause's wording (see ``_perturb``);
    ``lexicon`` (0 to 1) is the share of clauses drawn from toolcall.models.recipe.lexicon instead
    of the tool's training templates (never a pattern equal to a held-out template).
    ``paraphrases``: the tool's toolcall.models.recipe.paraphrases phrasings join its training
    templates, drawn alike, except those ``near_held_out`` its validation or test template.
    ``counts``: P(1, 2, 3, 4 tools) per request (of the requests that need a tool).
    ``wording``: the training variety (see ``Wording``): no-tool requests, pooled slot values,
    typos and joins, and (train only) the phrasing lists (phrasings_everyday, and with
    ``wording.more`` / ``wording.extra`` phrasings_situations / phrasings_details); on validation or
    test it varies the held-out templates' wording, never their words. None: the plain template data
    (SLOTS values, CONNECTORS joins), which its own pinned digest in the tests keeps unchanged.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if split != "train" and (noise or lexicon or paraphrases or (wording and wording.phrasings)):
        raise ValueError(f"noise, lexicon and paraphrase clauses are for the train split only, not {split!r}")
    table, assign = template_table(), template_splits(seed)
    held_by_tool: dict[str, list[str]] = {}  # tool -> its validation and test templates
    for i, (tool, pattern) in enumerate(table):
        if assign[i] != "train":
            held_by_tool.setdefault(tool, []).append(pattern)
    held_out = {t for held in held_by_tool.values() for t in held}
    clauses = {tool: [c for c in lexicon_clauses(tool) if c not in held_out] for tool in TEMPLATES} if lexicon else None
    if clauses and wording is not None:  # with wording: a bare value ("{person}", "{phone}") names no tool
        clauses = {tool: [c for c in cl if not (c.startswith("{") and c.endswith("}") and c.count("{") == 1)]
                   for tool, cl in clauses.items()}
    by_tool: dict[str, list[tuple[int, str]]] = {}  # tool -> its (template id, pattern) to draw from
    for i, (tool, pattern) in enumerate(table):
        if assign[i] == split:
            by_tool.setdefault(tool, []).append((i, pattern))
    if paraphrases:
        for tool, phrasings in PARAPHRASES.items():
            by_tool[tool] += [(PARAPHRASE_ID, p) for p in phrasings if not near_held_out(p, held_by_tool[tool])]
    if wording is not None and wording.phrasings:
        for tool, text in EVERYDAY_PHRASINGS.items():
            by_tool[tool] += [(PHRASING_ID, p) for p in text.split("|") if not near_held_out(p, held_by_tool[tool])]
    if wording is not None and wording.phrasings and wording.more:
        for tool, text in SITUATION_PHRASINGS.items():
            by_tool[tool] += [(PHRASING_ID, p) for p in text.split("|") if not near_held_out(p, held_by_tool[tool])]
    if wording is not None and wording.phrasings and wording.extra:
        for tool, text in DETAIL_PHRASINGS.items():
            by_tool[tool] += [(PHRASING_ID, p) for p in text.split("|") if not near_held_out(p, held_by_tool[tool])]
    words = entity_words() if wording is not None and wording.entity else None
    rng = np.random.default_rng([seed, 2, SPLITS.index(split)])
    n = SPLIT_SIZES[split] if size is None else size
    return [_example(rng, by_tool, noise, clauses, lexicon, counts, wording, words) for _ in range(n)]
