"""Large generated slot-value pools for the training split (models/recipe/data.py).

The templates' own values (toolcall.models.recipe.templates.SLOTS, a few dozen per slot) would let a
small model key on the values it has seen ("Paris" means a travel tool). Training draws most
values from here instead: names, cities, amounts, times, dates, numbers, codes and file names
made up from syllables, digits and formats, so nearly every value a person types is new to
the model and only the request's wording can name the tool. Validation and test keep SLOTS.

``draw(slot, rng)`` gives one value of ``slot``; slots without a generator here fall back to
SLOTS (their values are phrases such as messages and tasks; see ``FREE_TEXT`` for those).
"""
from __future__ import annotations

import numpy as np

from toolcall.models.recipe.templates import SLOTS

_ONSETS = "b c d f g h j k l m n p r s t v w z br ch dr fl gr kl pr sh st tr th".split()
_VOWELS = "a e i o u a e i o ai ea ou ie".split()
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "t", "k", "nd", "st", "x"]
RELATIONS = ["my mom", "mom", "my dad", "dad", "my sister", "my brother", "grandma", "grandpa", "my wife",
             "my husband", "my boss", "my son", "my daughter", "my aunt", "my uncle", "my friend", "the landlord",
             "my neighbor", "my partner", "my doctor", "my coach", "the babysitter"]
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_MONTHS = "january february march april may june july august september october november december".split()
_DAY_WORDS = ["today", "tomorrow", "tonight", "this weekend", "next week", "next month", "this evening",
              "tomorrow morning", "later today", "in two days", "the day after tomorrow", "this afternoon"]
_EXTS = "pdf docx xlsx pptx txt zip png jpg csv mp4 json md key".split()
_WORDS = ("budget report notes photos holiday taxes draft final invoice contract slides resume plan summary "
          "backup scan minutes pics lease thesis recipe data project team offer memo").split()
_CUR = ["euros", "dollars", "yen", "pounds", "francs", "pesos", "rupees", "bucks", "kronor", "won", "yuan",
        "rand", "lira", "zloty", "dirhams", "reais", "swiss francs", "canadian dollars", "australian dollars"]
_CODE = "EUR USD JPY GBP CHF CAD AUD SEK NOK INR CNY KRW MXN BRL ZAR TRY PLN NZD SGD HKD".split()
_OPS = ["{a} times {b}", "{a} * {b}", "{a} x {b}", "{a} plus {b}", "{a} + {b}", "{a} minus {b}", "{a} - {b}",
        "{a} divided by {b}", "{a} / {b}", "{p}% of {a}", "{p} percent of {a}", "the square root of {a}",
        "{a} squared", "{a} to the power of {s}", "({a} + {b}) * {s}", "{a} over {b}"]
_UNITS = ["miles", "kilometers", "km", "pounds", "kilograms", "kilos", "liters", "gallons", "cups", "ounces",
          "grams", "inches", "centimeters", "cm", "feet", "meters", "yards", "celsius", "fahrenheit",
          "degrees celsius", "mph", "km/h", "tablespoons", "teaspoons", "acres", "hectares", "stone"]


def _pick(seq, rng: np.random.Generator):
    return seq[int(rng.integers(len(seq)))]


def made_up_word(rng: np.random.Generator, syllables: int | None = None) -> str:
    """A pronounceable made-up word of 1-3 syllables, lower case ("brailen", "tomix")."""
    k = syllables or 1 + int(rng.integers(3))
    return "".join(_pick(_ONSETS, rng) + _pick(_VOWELS, rng) + _pick(_CODAS, rng) for _ in range(k))


def _name(rng) -> str:
    return made_up_word(rng, 1 + int(rng.integers(2, 4)) // 2).capitalize()


def _number(rng, low: int = 1, high: int = 1000) -> str:
    return str(int(rng.integers(low, high)))


def _amount(rng) -> str:
    r = rng.random()
    if r < 0.5:
        return _number(rng, 1, 500)
    if r < 0.75:
        return f"{int(rng.integers(1, 99))},{int(rng.integers(0, 1000)):03d}"
    if r < 0.9:
        return f"{int(rng.integers(1, 999))}.{int(rng.integers(0, 100)):02d}"
    return _number(rng, 500, 20000)


def _time(rng) -> str:
    h, m = int(rng.integers(1, 13)), int(rng.integers(0, 12)) * 5
    forms = [f"{h}", f"{h}:{m:02d}", f"{h} am", f"{h}pm", f"{h}:{m:02d} pm", f"{h} o'clock", f"half past {h}",
             f"quarter to {h}", "noon", "midnight", f"{int(rng.integers(0, 24)):02d}:{m:02d}", f"{h}am"]
    return _pick(forms, rng)


def _day(rng) -> str:
    d = int(rng.integers(1, 29))
    nth = f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"
    month = _pick(_MONTHS, rng)
    forms = [_pick(_WEEKDAYS, rng), f"on {_pick(_WEEKDAYS, rng)}", f"next {_pick(_WEEKDAYS, rng)}",
             f"{month} {d}", f"{month[:3].capitalize()} {nth}", f"the {nth}", f"on the {nth}", f"in {month}",
             _pick(_DAY_WORDS, rng), _pick(_DAY_WORDS, rng), f"{d}/{int(rng.integers(1, 13))}",
             f"{_pick(_WEEKDAYS, rng)} {_pick(['morning', 'afternoon', 'evening', 'night'], rng)}"]
    return _pick(forms, rng)


def _phone(rng) -> str:
    digits = lambda n: "".join(str(int(x)) for x in rng.integers(0, 10, n))  # noqa: E731
    return _pick([f"{digits(3)} {digits(4)}", f"+{digits(2)} {digits(3)} {digits(3)} {digits(4)}",
                  f"0{digits(3)} {digits(3)} {digits(3)}", f"{digits(3)}-{digits(3)}-{digits(4)}", digits(10)], rng)


def _file(rng) -> str:
    parts = [_pick(_WORDS, rng) for _ in range(1 + int(rng.integers(2)))]
    if rng.random() < 0.4:
        parts.append(str(int(rng.integers(2015, 2031))))
    if rng.random() < 0.2:
        parts.append(f"v{int(rng.integers(1, 9))}")
    return _pick(["_", "-", ""], rng).join(parts) + "." + _pick(_EXTS, rng)


def _code(rng, letters: int, digits: tuple[int, int]) -> str:
    head = "".join(chr(65 + int(x)) for x in rng.integers(0, 26, letters))
    return f"{head}{_pick(['', ' '], rng)}{_number(rng, *digits)}"


def _expr(rng) -> str:
    return _pick(_OPS, rng).format(a=_number(rng, 2, 2000), b=_number(rng, 2, 200), p=_number(rng, 1, 100),
                                   s=_number(rng, 2, 10))


def _qty(rng) -> str:
    return f"{_pick([_number(rng, 1, 500), _number(rng, 1, 20) + '.5', 'a', 'half a'], rng)} {_pick(_UNITS, rng)}"


GENERATORS = {
    "person": lambda rng: _pick(RELATIONS, rng) if rng.random() < 0.2 else _name(rng),
    "surname": _name,
    "city": lambda rng: made_up_word(rng, 2 + int(rng.integers(2))).capitalize(),
    "day": _day,
    "fday": _day,
    "range": lambda rng: _pick(["this week", "next week", "last week", "this month", "last month", "today",
                                "tomorrow", "over the weekend", "in " + _pick(_MONTHS, rng), "since " +
                                _pick(_WEEKDAYS, rng), "for the next " + _number(rng, 2, 15) + " days"], rng),
    "time": _time,
    "n": lambda rng: _number(rng, 1, 10),
    "nights": lambda rng: _pick([_number(rng, 1, 15), "two", "three", "a couple of", "five"], rng),
    "party": lambda rng: _pick([_number(rng, 2, 13), _number(rng, 2, 9) + " people", "two", "four", "six"], rng),
    "flightno": lambda rng: _code(rng, 2, (1, 3000)),
    "hotel": lambda rng: _pick(["{} Hotel", "Hotel {}", "the {} Inn", "{} Suites", "{} Lodge", "{} Palace"],
                               rng).format(made_up_word(rng, 2).capitalize()),
    "restaurant": lambda rng: _pick(["{}'s", "Casa {}", "the {} Kitchen", "{} Bistro", "Chez {}", "{} Grill"],
                                    rng).format(made_up_word(rng, 2).capitalize()),
    "phone": _phone,
    "email": lambda rng: f"{made_up_word(rng)}{_pick(['.', '_', ''], rng)}{made_up_word(rng)}@"
                         f"{made_up_word(rng, 2)}.{_pick(['com', 'org', 'net', 'io', 'de', 'co.uk'], rng)}",
    "amount": _amount,
    "cur": lambda rng: _pick(_CUR, rng),
    "code": lambda rng: _pick(_CODE, rng),
    "stock": lambda rng: made_up_word(rng, 2).capitalize(),
    "ticker": lambda rng: "".join(chr(65 + int(x)) for x in rng.integers(0, 26, 2 + int(rng.integers(3)))),
    "invoice": lambda rng: _pick([_number(rng, 100, 99999), "#" + _number(rng, 100, 99999),
                                  _code(rng, 3, (100, 9999))], rng),
    "file": _file,
    "expr": _expr,
    "qty": _qty,
    "tounit": lambda rng: _pick(_UNITS, rng),
    "trackno": lambda rng: _code(rng, 2, (10000, 99999999)),
    "temp": lambda rng: _number(rng, 15, 30),
    "movie": lambda rng: " ".join(made_up_word(rng).capitalize() for _ in range(1 + int(rng.integers(2)))),
    "team": lambda rng: _pick(["the {}s", "{} United", "{} City", "{}"], rng).format(made_up_word(rng, 2).capitalize()),
    "artist": lambda rng: f"{_name(rng)} {_name(rng)}" if rng.random() < 0.6 else made_up_word(rng, 2).capitalize(),
    "song": lambda rng: " ".join(made_up_word(rng).capitalize() for _ in range(1 + int(rng.integers(3)))),
    "word": lambda rng: made_up_word(rng, 2 + int(rng.integers(3))),
}


# ``Wording.entity``: names made of everyday words, the catalog's cue words among them ("the Weather Inn", a song
# "Call Me Tonight"): a word inside a name must not name a tool; only the request around it may.
_NAMED = {
    "hotel": ("the {A} {B} Inn", "{A} View Hotel", "Hotel {A}", "the {A} House", "{A} & {B} Suites"),
    "restaurant": ("{A} {B}", "the {A} Kitchen", "{A} Garden", "Cafe {A}", "the {A} & {B}"),
    "song": ("{A} {B}", "{A} {B} {C}", "{A}", "the {A} {B}", "{A} Me {B}"),
    "movie": ("{A} {B}", "the {A}", "{A} of the {B}", "{A} {B} {C}", "{A} {N}"),
    "artist": ("the {A} {B}s", "{A} {B}", "{A} and the {B}s"),
    "playlist": ("{a} {b}", "{a}", "my {a} {b} mix"),
    "team": ("the {A} {B}s", "{A} United", "{A} Rovers"),
    "title": ("{a} {b}", "{a} list", "{a} {b} ideas"),
    "event": ("the {a} {b}", "{a} {b} sync", "the {a} review"),
    "doc": ("the {a} {b}", "this {a} page", "the {a} {b} report"),
    "wiki": ("the {A} {B}", "{A} {B}", "the history of {a}"),
}


def named(slot: str, rng: np.random.Generator, words: list[str]) -> str:
    """A ``slot`` value (one of ``_NAMED``) built from ``words``: {A} capitalized, {a} as is."""
    pattern = _pick(_NAMED[slot], rng)
    picks = [_pick(words, rng) for _ in range(3)]
    return pattern.format(A=picks[0].capitalize(), B=picks[1].capitalize(), C=picks[2].capitalize(),
                          a=picks[0], b=picks[1], N=_number(rng, 2, 2030))


# ``Wording.swap``: proper-noun slots whose values may trade places ("weather in Tobin" with a person's name, "call
# Brailen Vale" with a city's): the tool comes from the words around a name, never from the name's kind.
SWAPPABLE = ("person", "surname", "city", "stock", "artist", "movie", "song", "team")


# ``Wording.names``: slots whose capitalized values a person may write as any name ("in Portuguese" -> a made-up
# language, "at Osteria Nonna", "to 14 Elm Street"): they may take a person-like name or, for a place,
# a street address, so a name's look never picks the tool.
NAMEABLE = ("lang", "restaurant", "hotel", "region", "shop", "cuisine", "place", "road", "wiki", "playlist")
_STREETS = ("Street", "St", "Road", "Rd", "Avenue", "Ave", "Lane", "Drive", "Way", "Square", "Boulevard")
# ``Wording.listed``: slots that may hold a list of values inside one clause ("with Tobin, Ama and Rhys"): commas and
# "and" inside a clause must not mean another request.
LISTABLE = ("person", "song", "artist", "city", "stock", "ticker", "task", "dish", "lang", "file", "movie",
            "team", "genre", "cuisine", "email", "keyword", "topic")
_LIST_JOINS = (" and ", ", ", " & ", " or ", ", and ")


def _address(rng) -> str:
    return f"{_number(rng, 1, 400)}{_pick(['', 'B', 'a'], rng)} {_name(rng)} {_pick(_STREETS, rng)}"


def _any_name(slot: str, rng) -> str:
    """A person-like name (one or two capitalized made-up words), or for ``place`` sometimes an address."""
    if slot == "place" and rng.random() < 0.5:
        return _address(rng)
    return _name(rng) if rng.random() < 0.5 else f"{_name(rng)} {_name(rng)}"


def _listed(slot: str, rng, generated: float, words, entity: float, swap: float, names: float) -> str:
    """Two or three values of ``slot`` (distinct draws) joined as a person lists them."""
    values = [draw(slot, rng, generated, words, entity, swap, names) for _ in range(2 + int(rng.integers(2)))]
    if len(values) == 2:
        return values[0] + _pick(_LIST_JOINS, rng) + values[1]
    last = _pick((" and ", ", and ", " & ", ", "), rng)
    return ", ".join(values[:-1]) + last + values[-1]


def draw(slot: str, rng: np.random.Generator, generated: float = 0.8, words: list[str] | None = None,
         entity: float = 0.0, swap: float = 0.0, names: float = 0.0, listed: float = 0.0) -> str:
    """One value for ``slot``: with probability ``listed`` (for a LISTABLE slot) a list of two or
    three values; else with probability ``swap`` (for a SWAPPABLE slot) a generated value of
    another SWAPPABLE slot; else with probability ``names`` (for a NAMEABLE slot) a person-like
    name or an address; else with probability ``entity`` (given ``words``, for a ``_NAMED`` slot)
    a name made of those words; else from GENERATORS with probability ``generated`` (where one
    exists), else from the templates' SLOTS. With ``listed``, ``swap``, ``names`` and ``entity`` 0
    no extra draw is made, so the values are those drawn without these options."""
    if listed and slot in LISTABLE and rng.random() < listed:
        return _listed(slot, rng, generated, words, entity, swap, names)
    if names and slot in NAMEABLE and rng.random() < names:
        return _any_name(slot, rng)
    if swap and slot in SWAPPABLE and rng.random() < swap:
        others = [s for s in SWAPPABLE if s != slot]
        return GENERATORS[_pick(others, rng)](rng)
    if words and entity and slot in _NAMED and rng.random() < entity:
        return named(slot, rng, words)
    gen = GENERATORS.get(slot)
    if gen is not None and rng.random() < generated:
        return gen(rng)
    return _pick(SLOTS[slot], rng)
