"""A generated toy language: the corpus the toy models are fitted to (nothing downloaded).

A small probabilistic grammar over ``VOCAB`` = 40 word tokens, with structure at
three ranges so that models of different sizes capture different amounts of it:

- local: determiner -> adjectives -> noun, the plural suffix ``-s``, ``.`` ends a sentence;
- sentence range: the verb agrees in number with the *head* of the subject noun
  phrase (``the lion of the bears chase-s``: across the ``of`` phrase), and which
  verb follows depends on that head noun;
- paragraph range: a paragraph opens with a topic token (``#zoo``, ``#farm``,
  ``#sea``, ``#town``) that makes its nouns likely for the next 2-5 sentences.

A bigram model sees only the local part; a one-layer transformer learns most of
it; a deeper one learns all of it.  The language (its word lists and preference
tables) is fixed; ``seed`` only picks which text is sampled from it.

    >>> tokens = corpus(40, seed=0)
    >>> len(tokens), max(tokens) < VOCAB
    (40, True)
    >>> decode(tokens[:12])  # every corpus opens a paragraph with its topic
    '#farm two horses find the pigs . the small small'
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from specref.core.errors import SpecrefError

__all__ = ["VOCAB", "WORDS", "PERIOD", "TOPICS", "corpus", "decode", "encode"]

TOPIC_NOUNS = {
    "#zoo": ["lion", "tiger", "bear", "monkey"],
    "#farm": ["cow", "horse", "pig", "hen"],
    "#sea": ["fish", "whale", "crab", "boat"],
    "#town": ["man", "woman", "child", "dog"],
}
VERBS = ["see", "like", "chase", "eat", "find", "want"]
ADJECTIVES = ["big", "small", "old", "red", "happy", "wild"]
DETERMINERS = ["the", "a", "two"]  # "a": singular only, "two": plural only
FUNCTION = ["of", "and", "that", "-s"]

TOPICS = list(TOPIC_NOUNS)
NOUNS = [n for ns in TOPIC_NOUNS.values() for n in ns]
WORDS = ["."] + TOPICS + NOUNS + VERBS + ADJECTIVES + DETERMINERS + FUNCTION
VOCAB = len(WORDS)  # 40
PERIOD = 0  # "." ends every sentence
_ID = {w: i for i, w in enumerate(WORDS)}

# Fixed preference tables (the language, not the sample): drawn once from a
# constant seed so that every corpus, whatever its seed, speaks the same language.
_lang = np.random.default_rng(20221130)
_VERB_GIVEN_NOUN = {n: _lang.dirichlet(np.full(len(VERBS), 0.5)) for n in NOUNS}
_ADJ_GIVEN_TOPIC = {t: _lang.dirichlet(np.full(len(ADJECTIVES), 1.0)) for t in TOPICS}
_TOPIC_NOUN_WEIGHTS = [0.4, 0.3, 0.2, 0.1]  # within a topic: a Zipf-ish preference
P_ON_TOPIC = 0.85  # a noun comes from the paragraph's topic, else from all 16 nouns
P_PLURAL = 0.4
P_OF = 0.15  # "NOUN of NP"
P_AND = 0.25  # "VERB NP and VERB NP"
P_THAT = 0.15  # "NP that VERB NP"
ADJ_COUNT = [0.5, 0.35, 0.15]  # P(0, 1, 2 adjectives)
SENTENCES = [0.25, 0.25, 0.25, 0.25]  # P(2, 3, 4, 5 sentences in a paragraph)


class _Draws:
    """Uniforms from ``rng`` in blocks, turned into categorical choices (fast in pure Python)."""

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._block: list[float] = []

    def uniform(self) -> float:
        if not self._block:
            self._block = self._rng.random(4096).tolist()
        return self._block.pop()

    def pick(self, items, weights=None):
        if weights is None:
            return items[int(self.uniform() * len(items))]
        cum = list(itertools.accumulate(weights))
        return items[min(bisect.bisect(cum, self.uniform() * cum[-1]), len(items) - 1)]


def _noun_phrase(d: _Draws, topic: str, out: list[str], allow_of: bool = True) -> tuple[str, bool]:
    """Append ``DET ADJ* NOUN [-s] [of NP]``; return the head noun and whether it is plural."""
    plural = d.uniform() < P_PLURAL
    out.append(d.pick(["the", "two"]) if plural else d.pick(["the", "a"], [0.6, 0.4]))
    for _ in range(d.pick([0, 1, 2], ADJ_COUNT)):
        out.append(d.pick(ADJECTIVES, _ADJ_GIVEN_TOPIC[topic]))
    if d.uniform() < P_ON_TOPIC:
        noun = d.pick(TOPIC_NOUNS[topic], _TOPIC_NOUN_WEIGHTS)
    else:
        noun = d.pick(NOUNS)
    out.append(noun)
    if plural:
        out.append("-s")
    if allow_of and d.uniform() < P_OF:
        out.append("of")
        _noun_phrase(d, topic, out, allow_of=False)
    return noun, plural


def _verb(d: _Draws, head: str, plural: bool, out: list[str]) -> None:
    """Append a verb chosen by the head noun, with ``-s`` when the head is singular."""
    out.append(d.pick(VERBS, _VERB_GIVEN_NOUN[head]))
    if not plural:
        out.append("-s")


def _sentence(d: _Draws, topic: str, out: list[str]) -> None:
    head, plural = _noun_phrase(d, topic, out)
    while True:
        _verb(d, head, plural, out)
        obj, obj_plural = _noun_phrase(d, topic, out)
        if d.uniform() < P_THAT:
            out.append("that")
            _verb(d, obj, obj_plural, out)
            _noun_phrase(d, topic, out, allow_of=False)
        if d.uniform() >= P_AND:
            break
        out.append("and")
    out.append(".")


def corpus(n_tokens: int, seed: int) -> list[int]:
    """``n_tokens`` token ids of text sampled from the toy language (deterministic in ``seed``).

    The text is a run of paragraphs, each a topic token and 2-5 sentences ending
    in ``.``; the last one is cut at ``n_tokens``.
    """
    d = _Draws(np.random.default_rng(seed))
    out: list[str] = []
    while len(out) < n_tokens:
        topic = d.pick(TOPICS)
        out.append(topic)
        for _ in range(2 + d.pick([0, 1, 2, 3], SENTENCES)):
            _sentence(d, topic, out)
    return [_ID[w] for w in out[:n_tokens]]


def decode(tokens) -> str:
    """The words of ``tokens``, ``-s`` glued to the word before it."""
    return " ".join(WORDS[int(t)] for t in tokens).replace(" -s", "s")


def encode(text: str) -> list[int]:
    """Inverse of :func:`decode` for text it produced (plural ``s`` split off as ``-s``)."""
    out = []
    for word in text.split():
        if word in _ID:
            out.append(_ID[word])
        elif word.endswith("s") and word[:-1] in _ID:
            out += [_ID[word[:-1]], _ID["-s"]]
        else:
            raise SpecrefError(f"text: unknown word {word!r}")
    return out
