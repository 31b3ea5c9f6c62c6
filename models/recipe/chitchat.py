"""Training requests that need no tool, answered with the empty answer (END first).

``no_tool_request(rng)`` builds one from parts: greetings, thanks and acknowledgements,
small talk about the assistant or the user, statements of fact, opinions, made-up words,
keyboard mashes, digits, punctuation, emoji and the empty or blank request. Written from the
kinds of text a person sends that the 64-tool catalog cannot serve; the wording is composed
from these lists and made-up words, so no fixed sentence dominates.
"""
from __future__ import annotations

import numpy as np

from toolcall.models.recipe.pools import made_up_word

GREETINGS = ["hi", "hello", "hey", "hiya", "howdy", "yo", "sup", "greetings", "good morning", "good afternoon",
             "good evening", "good night", "morning", "evening", "hey there", "hello there", "hi there",
             "hallo", "hola", "bonjour", "ciao", "heya", "hey hey", "hellooo", "hii", "heyy"]
ACKS = ["thanks", "thank you", "thank you so much", "thx", "ty", "cheers", "ok", "okay", "k", "cool", "great",
        "nice", "awesome", "perfect", "got it", "sure", "yes", "no", "yep", "nope", "yeah", "nah", "maybe",
        "bye", "goodbye", "see you", "see ya", "later", "talk soon", "nevermind", "never mind", "forget it",
        "sorry", "my bad", "lol", "haha", "hahaha", "wow", "hmm", "uh", "um", "oops", "fine", "alright",
        "that's all", "nothing", "no thanks", "all good", "done", "wait", "hold on", "brb", "omg", "meh"]
ABOUT_YOU = ["how are you", "how's it going", "what's up", "who are you", "what are you", "are you a robot",
             "are you real", "what is your name", "what's your name", "do you have feelings", "are you there",
             "can you hear me", "where are you from", "how old are you", "do you sleep", "who made you",
             "are you smart", "do you like me", "are you happy", "what's new", "how was your day",
             "you're awesome", "you are funny", "you're useless", "i love you", "you're the best",
             "what do you dream about", "tell me about yourself", "are you listening", "how do you feel"]
CHAT = ["tell me a joke", "tell me a story", "say something funny", "sing me a song", "let's chat",
        "i'm bored", "i'm tired", "i'm so happy today", "i'm sad", "i'm hungry", "i can't sleep",
        "what's the meaning of life", "do you believe in ghosts", "what is love", "what do you think about {x}",
        "do you like {x}", "i like {x}", "i hate {x}", "{x} is the best", "i just saw a {x}",
        "my {x} is {y}", "the {x} is {y}", "i think {x} is {y}", "my favorite color is {c}", "my {x} likes {z}",
        "i had {z} for lunch", "i am a {w}", "my cat is sleeping", "the sky is {c}", "it's a nice day",
        "what a day", "just testing", "this is a test", "can we talk", "guess what", "you know what",
        "that's interesting", "i don't know", "no idea", "whatever", "interesting", "tell me something",
        "what should i do with my life", "life is hard", "happy birthday", "merry christmas", "happy new year",
        "congrats", "good job", "well done", "i'm back", "long time no see", "are we done"]
NOUNS = "dogs cats pizza music rain winter summer coffee tea books football cars trees the ocean mountains".split()
ADJS = "great boring nice weird blue red tall small fun old new cold warm lazy".split()
COLORS = "blue green red purple yellow orange black".split()
FOODS = "pasta soup salad a sandwich rice noodles cake".split()
ROLES = "teacher student nurse cook painter pilot farmer".split()
EMOJI = [":)", ":(", ":D", ";)", "<3", ":-)", "xD", "^^", ":P", "o_O", "\U0001F600", "\U0001F44D", "\U0001F642"]
PUNCT = ["", "", "", ".", "!", "?", "!!", "...", " :)", "?!", "!!!"]


def _cap(text: str, rng: np.random.Generator) -> str:
    r = rng.random()
    return text.capitalize() if r < 0.4 else text.upper() if r < 0.47 else text


def _mash(rng: np.random.Generator) -> str:
    rows = ["qwertyuiop", "asdfghjkl", "zxcvbnm", "1234567890"]
    row = rows[int(rng.integers(len(rows)))]
    start = int(rng.integers(len(row) - 2))
    return row[start:start + 3 + int(rng.integers(len(row) - start - 2))] * (1 + int(rng.integers(2)))


def _nonsense(rng: np.random.Generator) -> str:
    r = rng.random()
    if r < 0.35:
        return " ".join(made_up_word(rng) for _ in range(1 + int(rng.integers(5))))
    if r < 0.55:
        return _mash(rng)
    if r < 0.65:
        return str(int(rng.integers(0, 100000)))
    if r < 0.75:
        return "".join(rng.choice(list(".?!,;:-*#@ "), 1 + int(rng.integers(5))))
    if r < 0.85:
        return " ".join(EMOJI[int(i)] for i in rng.integers(0, len(EMOJI), 1 + int(rng.integers(3))))
    if r < 0.92:
        return "lorem ipsum dolor sit amet"[:5 + int(rng.integers(22))]
    return "".join(chr(97 + int(x)) for x in rng.integers(0, 26, 1 + int(rng.integers(12))))


# ``Wording.statements``: statements and feelings that mention the catalog's things but ask for nothing ("my flight
# was fine", "I already paid the bill"): a tool word alone is not a request.
THINGS = ("flight", "hotel", "meeting", "email", "trip", "dinner", "lunch", "movie", "song", "weather", "train",
          "taxi ride", "package", "call", "playlist", "party", "concert", "game", "invoice", "bill", "alarm",
          "timer", "note", "task", "calendar", "news", "traffic", "forecast", "presentation", "report", "music",
          "restaurant", "interview", "appointment", "holiday", "weekend", "match", "message", "exam", "delivery")
DONE = ("paid the {t}", "booked the {t}", "sent the {t}", "cancelled the {t}", "checked the {t}", "read the {t}",
        "finished the {t}", "got the {t}", "saw the {t}", "heard the {t}", "fixed the {t}", "moved the {t}")
STATEMENTS = ("the {t} was {a}", "my {t} was {a}", "that {t} was {a}", "the {t} went well", "I loved the {t}",
              "I already {d}", "I {d} yesterday", "we {d} last week", "{p} {d}", "no need, I {d}",
              "what a {a} {t}", "thanks for the {t}", "the {t} is fine, thanks", "I hate {t}s", "{t}s are {a}",
              "my {t} got {a}", "I'm so tired after the {t}", "the {t} was {a} lol", "just got back from the {t}",
              "can you {x}", "do you {x}", "I'm feeling {f} today", "feeling {f}", "I feel {f}", "I'm {f}",
              "it was a {a} {t}, wasn't it", "remember the {t}?", "never again that {t}")
FEELINGS = ("down", "great", "sad", "happy", "stressed", "lonely", "sleepy", "excited", "nervous", "sick", "bored",
            "a bit off", "much better", "anxious", "grateful")
ABILITIES = ("dance", "cook", "keep quiet", "swim", "laugh", "lie", "think", "fly", "love", "read minds",
             "feel pain", "see me", "count to ten", "speak", "get tired", "have fun", "sing", "juggle")
STATE_ADJS = ("great", "fine", "long", "late", "boring", "amazing", "terrible", "ok", "cancelled", "delayed",
              "awful", "fun", "short", "perfect", "weird", "cold", "expensive", "cheap")


def statement(rng: np.random.Generator) -> str:
    """One statement or feeling that names a catalog thing but asks for nothing."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    done = pick(DONE).format(t=pick(THINGS))
    return pick(STATEMENTS).format(t=pick(THINGS), a=pick(STATE_ADJS), d=done, f=pick(FEELINGS),
                                   x=pick(ABILITIES), p=pick(["mom", "my boss", "she", "he", "they",
                                                              made_up_word(rng).capitalize()]))


def no_tool_request(rng: np.random.Generator, statements: float = 0.0) -> str:
    """One request that needs no tool; about 3% are empty or blank; with ``statements`` > 0 that share
    are ``statement``s."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    if statements and rng.random() < statements:
        return _cap(statement(rng), rng) + pick(PUNCT)
    r = rng.random()
    if r < 0.03:
        return pick(["", " ", "  ", "\n", "\t"])
    if r < 0.2:
        text = pick(GREETINGS)
        if rng.random() < 0.3:
            text += pick([" ", ", ", " "]) + pick(["there", "buddy", "friend", "bot", "assistant",
                                                   made_up_word(rng).capitalize()])
    elif r < 0.38:
        text = pick(ACKS)
    elif r < 0.52:
        text = pick(ABOUT_YOU)
    elif r < 0.75:
        text = pick(CHAT).format(x=pick(NOUNS), y=pick(ADJS), c=pick(COLORS), z=pick(FOODS), w=pick(ROLES))
    else:
        return _nonsense(rng)
    if rng.random() < 0.25:  # two of them: "hi, how are you", "ok thanks"
        text += pick([", ", " ", ". ", "! "]) + pick(ACKS + ABOUT_YOU + GREETINGS)
    return _cap(text, rng) + pick(PUNCT)
