"""The efficiency verdict: target calls per decode against the reference's exact value (SPEC §8).

"Preserves the target distribution" says nothing about speed: a decoder that warps
the draft twice, rejects needlessly or drafts tokens it never verifies is lossless
but wasteful.  On a decoder case the reference (:func:`specref.decoding.chain.speculative_decode`,
Leviathan et al. 2022, Algorithm 1) needs a random number of iterations -- target
calls -- whose law :func:`reference_iterations` enumerates exactly.  An
implementation's measured iterations per decode (``measured``) give a mean with a
normal-approximation interval; :func:`efficiency` compares the two.

Drafting fewer tokens near ``max_new_tokens`` or after a stop token does not change
the count: the tokens that are not drafted would have been cut anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.stats import norm

from specref.core.errors import SpecrefError
from specref.decoding.chain import speculative_decode, speculative_transition
from specref.decoding.prompt_lookup import lookup_transition
from specref.verification.laws.enumeration import law, law_iterated
from specref.verification.cases.rules import ruled

__all__ = ["reference_iterations", "iterations_law", "lookup_iterations", "Efficiency", "efficiency", "MEAN_TOL"]

_MARK = -1  # ends each iteration's block in the memoised enumeration: never a token


def reference_iterations(case, *, rules=None, draft_rules=None, memoise: bool = True):
    """The exact law of the reference's number of target calls on ``case``: ``{iterations: probability}``.

    ``rules``: the implementation's declared rules (:mod:`specref.verification.cases.rules`),
    used for the target and, unless ``draft_rules`` is given, for the draft.
    ``memoise=True`` enumerates one iteration at a time
    (:func:`specref.verification.laws.enumeration.law_iterated` over
    :func:`specref.decoding.chain.speculative_transition`, each iteration's block marked
    with a ``-1`` that is counted afterwards); ``memoise=False`` enumerates whole runs of
    :func:`~specref.decoding.chain.speculative_decode` -- the independent route, for K <= 2.
    """
    target, draft = case.models()
    t, config = ruled(target, case.config, rules)
    d, _ = ruled(draft, case.config, draft_rules if draft_rules is not None else rules)
    settings = dict(k=case.k, config=config, max_new_tokens=case.max_new_tokens, stop_tokens=case.stop_tokens)
    if memoise:
        return iterations_law(speculative_transition(t, d, list(case.prompt), **settings))
    dist: dict = {}
    for out, w in law(lambda rng: speculative_decode(t, d, list(case.prompt), rng=rng, **settings).iterations).items():
        n = out[0] if isinstance(out, tuple) else out
        dist[n] = dist.get(n, 0) + w
    return dist


def iterations_law(iteration, *, memoise: bool = True) -> dict:
    """The exact law of the number of iterations (target calls) of a decoder written as iterations.

    ``iteration(state, rng) -> (block, next state)`` from the empty state ``()``, one target call
    each (:func:`specref.decoding.cross_vocab.tli_transition`,
    :func:`specref.decoding.prompt_lookup.lookup_transition`, ...); each block is marked and the
    marks counted.  ``memoise=False`` enumerates whole runs (the independent route).
    """
    def marked(state, rng):
        block, nxt = iteration(state, rng)
        return tuple(block) + (_MARK,), nxt

    dist: dict = {}
    for out, w in law_iterated((), marked, memoise=memoise).items():
        n = sum(1 for x in out if x == _MARK)
        dist[n] = dist.get(n, 0) + w
    return dist


def lookup_iterations(case, *, num_tokens: int | None = None, max_ngram: int = 2, rules=None,
                      memoise: bool = True) -> dict:
    """The exact law of prompt lookup decoding's number of target calls on ``case``: ``{calls: probability}``.

    The reference for a decoder that drafts by prompt lookup (:mod:`specref.decoding.prompt_lookup`,
    SPEC §15) instead of from ``case``'s draft: ``num_tokens`` drafted at most (default ``case.k``),
    n-grams of up to ``max_ngram`` tokens, the target's rows under ``rules``.  ``memoise=True``
    enumerates one iteration at a time, ``memoise=False`` whole runs (the independent route).
    """
    target, _ = case.models()
    t, config = ruled(target, case.config, rules)
    step = lookup_transition(t, list(case.prompt), num_tokens=case.k if num_tokens is None else num_tokens,
                             max_new_tokens=case.max_new_tokens, config=config, stop_tokens=case.stop_tokens,
                             max_ngram=max_ngram)
    return iterations_law(step, memoise=memoise)


def _mean(dist):
    return sum(Fraction(n) * w if isinstance(w, Fraction) else n * float(w) for n, w in dist.items())


def _std(dist) -> float:
    """The law's standard deviation (float): the spread of one decode's calls under the reference."""
    mean = float(_mean(dist))
    return math.sqrt(max(0.0, sum(float(w) * (n - mean) ** 2 for n, w in dist.items())))


#: Relative slack when the reference's exact mean meets an interval's end: a float law's mean is a
#: sum of products of float probabilities (``0.9999999999999999`` for exactly one call), and an
#: interval of zero width (every decode the same count) must still hold the value it is.
MEAN_TOL = 1e-9


@dataclass(frozen=True)
class Efficiency:
    """Measured mean target calls per decode against the reference's exact mean."""

    n: int  # decodes measured
    mean: float  # the implementation's mean target calls per decode
    interval: tuple  # its confidence interval (normal approximation)
    reference: float  # the reference's exact mean
    level: float  # the interval's confidence

    @property
    def verdict(self) -> str:
        low, high = self.interval
        slack = MEAN_TOL * max(1.0, abs(self.reference))  # rounding of a float law's mean, not a difference
        if self.reference < low - slack:
            return "wasteful"  # more target calls than the reference needs
        if self.reference > high + slack:
            return "fewer calls than the reference"  # not lossless, or drafts differently
        return "as efficient as the reference"

    def __str__(self):
        low, high = self.interval
        return (f"target calls per decode: {self.mean:.4g} [{low:.4g}, {high:.4g}] ({self.level:.0%}, N={self.n}) "
                f"vs the reference's exact {self.reference:.4g}: {self.verdict}")


def efficiency(measured, case, *, rules=None, level: float = 0.99, reference: dict | None = None) -> Efficiency:
    """Compare ``measured`` (target calls per decode, one int per decode) with the reference on ``case``.

    ``reference``: the reference's law of calls, ``{calls: probability}``, where the decoder's
    reference is not the chain's (:func:`lookup_iterations`, :func:`iterations_law`); default
    :func:`reference_iterations` of ``case`` under ``rules``.

    The interval is ``mean +- z s / sqrt(n)`` with ``s = max(sample std, the reference's exact std)``:
    when every decode makes the same number of calls the sample std is 0, and an interval of zero
    width would call two decodes of 3 calls each "fewer calls" than a reference whose calls vary;
    under the null (the implementation's calls have the reference's law) the spread of one decode
    is the reference's own, which the law gives exactly.  The verdict meets the interval's ends
    within :data:`MEAN_TOL` (relative).
    """
    x = np.asarray(list(measured), dtype=np.float64)
    if x.size < 2:
        raise SpecrefError(f"measured must hold at least 2 decodes, got {x.size}")
    if not 0 < level < 1:
        raise SpecrefError(f"level must be in (0, 1), got {level!r}")
    law = reference_iterations(case, rules=rules) if reference is None else reference
    if not law or not math.isclose(sum(float(w) for w in law.values()), 1.0, rel_tol=1e-9):
        raise SpecrefError(f"reference must be a law of calls summing to 1, got {law!r:.200}")
    ref = float(_mean(law))
    half = norm.ppf(0.5 + level / 2) * max(float(x.std(ddof=1)), _std(law)) / math.sqrt(x.size)
    return Efficiency(int(x.size), float(x.mean()), (float(x.mean() - half), float(x.mean() + half)), ref, level)
