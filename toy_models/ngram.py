"""n-gram language models with add-k smoothing and exact rational probabilities.

``P(x | c) = (count(c, x) + k) / (count(c) + k V)`` where ``c`` is the last ``n - 1``
tokens (the start of a document is padded with a begin marker that is not a
vocabulary token).  Probabilities are exact ``Fraction``; logits are their float64
logs (``-inf`` for probability 0).  With ``add_k = 0`` a context never seen in the
corpus backs off to the next shorter context, down to the unigram, so every row is
a distribution; with ``add_k > 0`` no backoff is needed.

An ``NGramModel`` is a specref model both ways (see :mod:`specref.decoding.chain`):
``model(tokens)`` gives logits ``[len(tokens), V]`` (the float path), and
``model.exact`` is a view with ``probs(tokens)``, the same distributions as Fractions
(the exact path: the decoders then compute in rationals).  Fitting is deterministic.
"""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int, check_tokens

__all__ = ["NGramModel", "random_table_corpus"]

_BOS = -1  # padding before a document; never a vocabulary token


class NGramModel:
    """An order-``n`` n-gram model over tokens ``0..vocab_size-1``."""

    def __init__(self, order: int, vocab_size: int, counts: dict, add_k=1):
        self.order = check_positive_int("order", order)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        if isinstance(add_k, bool) or not isinstance(add_k, (int, float, Fraction)) or not add_k >= 0:
            raise SpecrefError(f"add_k must be a number >= 0, got {add_k!r}")
        self.add_k = Fraction(add_k)
        self._counts = counts  # context tuple (any length < order) -> Counter of next tokens
        self._rows: dict[tuple, tuple] = {}
        self._logits: dict[tuple, np.ndarray] = {}
        if self.add_k == 0 and not self._counts.get((), Counter()):
            raise SpecrefError("add_k = 0 needs a non-empty corpus (the unigram is the last backoff)")

    @classmethod
    def fit(cls, corpus, *, order: int, vocab_size: int, add_k=1) -> "NGramModel":
        """Count n-grams in ``corpus``: a sequence of documents, each a sequence of token ids."""
        order = check_positive_int("order", order)
        vocab_size = check_positive_int("vocab_size", vocab_size)
        counts: dict[tuple, Counter] = {}
        for d, doc in enumerate(corpus):
            doc = check_tokens(f"corpus[{d}]", doc, vocab_size)
            padded = [_BOS] * (order - 1) + doc
            for i in range(order - 1, len(padded)):
                for h in range(order):  # every context length 0..n-1, for backoff
                    ctx = tuple(padded[i - h : i])
                    counts.setdefault(ctx, Counter())[padded[i]] += 1
        return cls(order, vocab_size, counts, add_k)

    @classmethod
    def random(cls, *, order: int, vocab_size: int, seed: int, zero_frac: float = 0.25, max_count: int = 6):
        """A random table model: every context gets random integer counts, some of them 0.

        Probabilities are exact Fractions with zeros (``add_k = 0``): the "random table
        models" of the verifier.  Deterministic in ``seed``.
        """
        order = check_positive_int("order", order)
        vocab_size = check_positive_int("vocab_size", vocab_size)
        if not 0 <= zero_frac < 1:
            raise SpecrefError(f"zero_frac must be in [0, 1), got {zero_frac!r}")
        rng = np.random.default_rng(seed)
        counts = {}
        for ctx in itertools.product(range(_BOS, vocab_size), repeat=order - 1):
            c = rng.integers(1, max_count + 1, size=vocab_size) * (rng.random(vocab_size) >= zero_frac)
            c[rng.integers(vocab_size)] += 1  # never an all-zero row
            counts[ctx] = Counter({x: int(n) for x, n in enumerate(c) if n})
        counts.setdefault((), Counter({x: 1 for x in range(vocab_size)}))
        return cls(order, vocab_size, counts, add_k=0)

    def context(self, tokens) -> tuple:
        """The conditioning context of the token after ``tokens``: its last n-1 tokens."""
        h = self.order - 1
        padded = [_BOS] * h + list(tokens)
        return tuple(padded[len(padded) - h :]) if h else ()

    def row(self, context: tuple) -> tuple:
        """``P(. | context)`` as a tuple of V Fractions (cached)."""
        if context not in self._rows:
            self._rows[context] = self._row(context)
        return self._rows[context]

    def _row(self, context):
        counts = self._counts.get(context, Counter())
        if self.add_k == 0 and not counts:  # unseen context: back off to a shorter one
            return self.row(context[1:])
        total = sum(counts.values()) + self.add_k * self.vocab_size
        return tuple((counts[x] + self.add_k) / total for x in range(self.vocab_size))

    def prob_rows(self, tokens):
        """Exact rows ``[len(tokens)] -> [len(tokens), V]`` (object array of Fraction)."""
        tokens = check_tokens("tokens", tokens, self.vocab_size)
        out = np.empty((len(tokens), self.vocab_size), dtype=object)
        for i in range(len(tokens)):
            out[i] = self.row(self.context(tokens[: i + 1]))
        return out

    def __call__(self, tokens):
        """Logits ``[len(tokens)] -> [len(tokens), V]`` (float64, -inf where P = 0)."""
        tokens = check_tokens("tokens", tokens, self.vocab_size)
        out = np.empty((len(tokens), self.vocab_size))
        for i in range(len(tokens)):
            ctx = self.context(tokens[: i + 1])
            if ctx not in self._logits:
                with np.errstate(divide="ignore"):
                    self._logits[ctx] = np.log(np.array(self.row(ctx), dtype=np.float64))
            out[i] = self._logits[ctx]
        return out

    @property
    def exact(self) -> "ExactView":
        """This model seen through ``probs`` only, so that decoders use its Fractions."""
        return ExactView(self)

    def __repr__(self):
        return f"NGramModel(order={self.order}, vocab_size={self.vocab_size}, add_k={self.add_k})"


class ExactView:
    """An exact model (``probs`` only): the decoders then compute in Fractions."""

    def __init__(self, model: NGramModel):
        self.model = model
        self.vocab_size = model.vocab_size

    def probs(self, tokens):
        return self.model.prob_rows(tokens)

    def __repr__(self):
        return f"{self.model!r}.exact"


def random_table_corpus(vocab_size: int, n_docs: int, doc_len: int, *, seed: int, concentration: float = 0.5):
    """Documents sampled from a random first-order Markov chain (Dirichlet rows).

    A synthetic corpus for tests: no download, deterministic in ``seed``.
    """
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(vocab_size, concentration), size=vocab_size)
    docs = []
    for _ in range(n_docs):
        x = int(rng.integers(vocab_size))
        doc = [x]
        for _ in range(doc_len - 1):
            x = int(rng.choice(vocab_size, p=trans[x]))
            doc.append(x)
        docs.append(doc)
    return docs
