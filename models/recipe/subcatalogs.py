"""Real-language sub-catalogs of the shipped 64 tools, for the catalog-reading model.

A sub-catalog is k of builder/data/tools-64.json's tools in a random order, with their hand-written
descriptions. Its requests come from the 64-tool training pool (make_split's paraphrased wording), so
the text is the everyday English the generated catalogs (catalog_gen) lack. A request's answer is the
request's tools that the sub-catalog holds, in the pool's order; none when it holds none of them. So the
model must read the catalog: a request it knows answers "none" when its tool is not offered.

With share ``rename_p`` a sub-catalog renames every tool to a generated name (catalog_gen's words),
so only the description links a request to its tool, as in a catalog the model has never seen.

A row's requests: share ``none_p`` whose tools the sub-catalog lacks, ``partial_p`` multi-tool requests
it holds only some tools of, the rest held whole.
"""
from __future__ import annotations

import random

from toolcall.models.recipe.catalog_gen import CatalogGenerator

Request = tuple[str, list[str], list[tuple[int, int, str]]]  # text, answer names, clause spans (a, b, name)


class SubcatalogSampler:
    """Seeded: the same seed, pool and calls give the same sub-catalogs and requests. ``tools``: the 64
    (name, description) pairs; ``pool``: (text, names, spans) requests over those names."""

    def __init__(self, tools: list[tuple[str, str]], pool: list[Request], seed: int,
                 rename_p: float = 0.3, none_p: float = 0.25, partial_p: float = 0.15):
        self.tools, self.pool = tools, pool
        self.shipped = frozenset(name for name, _ in tools)  # a generated name never takes one of these
        self.rng = random.Random(seed)
        self.names = CatalogGenerator(seed + 7, single_p=0.3)
        self.rename_p, self.none_p, self.partial_p = rename_p, none_p, partial_p
        self.by_tool: dict[str, list[int]] = {}
        for i, (_, names, _) in enumerate(pool):
            for n in names:
                self.by_tool.setdefault(n, []).append(i)
        self.multi = [i for i, (_, names, _) in enumerate(pool) if len(names) >= 2]

    def row(self, k: int, n: int) -> tuple[list[tuple[str, str]], list[Request]]:
        """A sub-catalog of ``k`` tools and ``n`` requests on it, answers in its (possibly renamed) names."""
        rng = self.rng
        chosen = rng.sample(self.tools, k)
        held = {name for name, _ in chosen}
        held_order = sorted(held)  # a fixed order to draw from: a set's order is not seeded
        rename = {}
        if rng.random() < self.rename_p:
            used: set[str] = set()
            for name, _ in chosen:
                new, _ = self.names.tool([], used | self.shipped)
                used.add(new)
                rename[name] = new
        tools = [(rename.get(name, name), desc) for name, desc in chosen]
        requests = []
        for _ in range(n):
            draw = rng.random()
            kind = "none" if draw < self.none_p else "partial" if draw < self.none_p + self.partial_p else "held"
            i = self._draw(kind, held, held_order)
            text, names, spans = self.pool[i]
            requests.append((text, [rename.get(t, t) for t in names if t in held],
                             [(a, b, rename.get(t, t)) for a, b, t in spans if t in held]))
        return tools, requests

    def _draw(self, kind: str, held: set[str], held_order: list[str]) -> int:
        """A pool index of the ``kind`` asked for. When 200 draws find none (a small catalog rarely holds
        part of a multi-tool request), a held tool's single-tool request, else any request."""
        rng = self.rng
        for _ in range(200):
            if kind == "none":
                i = rng.randrange(len(self.pool))
            elif kind == "partial":
                i = rng.choice(self.multi)
            else:
                i = rng.choice(self.by_tool.get(rng.choice(held_order), [0]))
            names = set(self.pool[i][1])
            inside = len(names & held)
            if (kind == "none" and inside == 0) or (kind == "partial" and 0 < inside < len(names)) \
                    or (kind == "held" and inside == len(names)):
                return i
        singles = [i for t in held_order for i in self.by_tool.get(t, []) if len(self.pool[i][1]) == 1]
        return rng.choice(singles) if singles else rng.randrange(len(self.pool))
