"""Hypothesis strategies for property-testing speculative decoders against specref.

Other projects import these, the way they import ``hypothesis.extra.numpy``::

    from hypothesis import given
    from specref.verification.cases.strategies import step_inputs

    @given(step_inputs(exact=True))
    def test_my_step_has_the_law_of_specref(step):
        ...  # compare my_step(*step, rng) with specref.core.step.speculative_step

What they draw, and why (SPEC §3 "edge cases that must be defined and tested", §9):

- :func:`distributions`: one probability row ``[V]`` with zeros, exact ties,
  near-ties (gaps of 1e-12..1e-15, or tiny rationals), a peak (one token >= 0.99),
  flat (uniform on its support) and random shapes;
- :func:`distribution_pairs`: ``(p, q)`` with ``p == q``, zeros of ``q`` where
  ``p > 0`` and the other way round, disjoint supports, near-equal rows;
- :func:`logits`: float64 logit rows with ties, large offsets and ``-inf`` masks;
- :func:`sampling_configs`: :class:`~specref.core.sampling.SamplingConfig` s (greedy,
  temperature, top-k, top-p, min-p), exact ones with ``Fraction`` thresholds;
- :func:`step_inputs`: valid inputs of :func:`specref.core.step.speculative_step`, with
  forced edge cases (``p = q``, ``p(x_1) = 0``, draft rows with zeros, all-accept);
- :func:`table_models` and :func:`table_model_pairs`: bigram
  :class:`~specref.verification.cases.tables.ProbTable` / :class:`~specref.verification.cases.tables.LogitTable`
  models, and (target, draft) pairs that are identical, near-equal or always reject;
- :func:`schedules`: valid continuous-batching :class:`~specref.decoding.continuous.Schedule` s
  (arrivals, cancellations, preemptions by recompute and swap, a memory budget).

Conventions are specref's: float rows are float64 summing to 1 within 1e-12; exact
rows (``exact=True``) are NumPy object arrays of ``fractions.Fraction`` summing to
exactly 1.  Every choice is a hypothesis draw (no NumPy random state), so examples
are reproducible, shrink, and replay from hypothesis's database.  Sizes stay small
(``V <= 8``, ``K <= 4`` by default) so that the exact verifier can enumerate every
output.  Bad options raise ``hypothesis.errors.InvalidArgument``, as hypothesis's
own strategies do.

This module needs ``hypothesis`` (the ``test`` extra); nothing else in specref
imports it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from specref.core.sampling import SamplingConfig
from specref.decoding.continuous import PREEMPTION_MODES, Cancellation, Preemption, Request, Schedule
from specref.verification.cases.tables import LogitTable, ProbTable

__all__ = [
    "SHAPES",
    "RELATIONS",
    "StepInput",
    "distributions",
    "distribution_pairs",
    "logits",
    "sampling_configs",
    "step_inputs",
    "table_models",
    "table_model_pairs",
    "schedules",
]

SHAPES = ("zeros", "ties", "near_ties", "peaked", "flat", "random")
"""Shapes of one row that :func:`distributions` draws (all of them by default)."""

RELATIONS = ("equal", "independent", "q_zeros", "p_zeros", "disjoint", "near", "mixture", "permuted")
"""How ``q`` is made from ``p`` in :func:`distribution_pairs` (all by default)."""

_STEP_CASES = ("random", "equal", "all_accept", "reject_first", "reject", "q_zeros", "near")
_TABLE_RELATIONS = ("identical", "independent", "disjoint", "near", "mixed")

_DEFAULT_VOCAB = st.integers(2, 8)
_DEFAULT_K = st.integers(1, 4)
_FLOAT_GAPS = (1e-12, 1e-13, 1e-14, 1e-15)  # a near-tie: two entries this far apart
_EXACT_GAPS = tuple(Fraction(1, 10**e) for e in (6, 9, 12, 15))  # the same, as rationals
_PEAKS = (99, 999, 10**6, 10**9)  # peak weight / rest weight: the peak holds M/(M+1) >= 0.99


class StepInput(NamedTuple):
    """One valid input of :func:`specref.core.step.speculative_step`; unpacks as a tuple.

    ``speculative_step(*step, rng)`` runs it.  ``q_draft[i, draft_tokens[i]] > 0``.
    """

    p_target: np.ndarray  # [K+1, V] target rows; row K is the bonus row
    q_draft: np.ndarray  # [K, V] draft rows that draft_tokens were drawn from
    draft_tokens: np.ndarray  # [K] int64


# ---------------------------------------------------------------- option checks


def _size(name: str, value, default, minimum: int):
    """An int option (or a strategy of ints) -> a strategy of ints."""
    if value is None:
        return default
    if isinstance(value, st.SearchStrategy):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgument(f"{name} must be an int >= {minimum} or a strategy of them, got {value!r}")
    return st.just(int(value))


def _drawn_size(draw, name: str, strategy, minimum: int) -> int:
    value = draw(strategy)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgument(f"the {name} strategy drew {value!r}; it must draw ints >= {minimum}")
    return int(value)


def _choices(name: str, given, allowed) -> tuple:
    given = tuple(given)
    unknown = [g for g in given if g not in allowed]
    if not given or unknown:
        raise InvalidArgument(f"{name} must be a non-empty selection of {allowed}, got {given!r}")
    return given


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


# ---------------------------------------------------------------- row arithmetic


def _normalise(weights, exact: bool) -> np.ndarray:
    """Non-negative weights (not all 0) -> a row summing to 1 (exactly, for Fractions)."""
    if exact:
        total = sum((Fraction(w) for w in weights), Fraction(0))
        return np.array([Fraction(w) / total for w in weights], dtype=object)
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def _zeros(V: int, exact: bool) -> np.ndarray:
    return np.full(V, Fraction(0), dtype=object) if exact else np.zeros(V)


def _restrict(row, keep, exact: bool) -> np.ndarray:
    """``row`` with every token outside ``keep`` zeroed and renormalised (flat on ``keep``
    when ``row`` has no mass there)."""
    w = _zeros(len(row), exact)
    w[keep] = row[keep]
    if w.sum() == 0:
        w[keep] = 1
    return _normalise(list(w), exact)


def _nudge(row, i: int, j: int, d) -> np.ndarray:
    """Move mass ``d`` from token ``j`` to token ``i`` (``row[j] > d``): a near-tie."""
    out = row.copy()
    out[i] = out[i] + d
    out[j] = out[j] - d
    return out


def _near(draw, row, exact: bool) -> np.ndarray:
    """A row within 1e-12 (or a tiny rational) of ``row``, usually not equal to it."""
    V = len(row)
    if not exact and draw(st.booleans()):
        # the same distribution computed another way: differs by rounding only (ulps)
        with np.errstate(divide="ignore"):
            w = np.exp(np.log(row))
        return w / w.sum()
    if V == 1:
        return row.copy()
    j = int(np.argmax(row))  # row[j] >= 1/V, far above any gap
    i = draw(st.sampled_from([t for t in range(V) if t != j]))
    gap = draw(st.sampled_from(_EXACT_GAPS if exact else _FLOAT_GAPS))
    return _nudge(row, i, j, gap / 2)


# ---------------------------------------------------------------- distributions


def _feasible_shapes(shapes, V: int, min_zeros: int, allow_zeros: bool):
    ok = []
    for s in shapes:
        if s == "zeros" and not (allow_zeros and V >= 2):
            continue
        if s in ("ties", "near_ties") and V - min_zeros < 2:  # two nonzero tokens to tie
            continue
        ok.append(s)
    return ok or ["random"]


def _support(draw, n: int, shape: str, exact: bool) -> np.ndarray:
    """A row of ``n`` positive probabilities of the given shape."""
    ints = st.integers(1, 20)
    if shape == "flat":
        return _normalise([1] * n, exact)
    if shape == "ties":  # n values from m < n distinct ones: some two are equal
        m = draw(st.integers(1, n - 1))
        values = draw(st.lists(st.integers(1, 10), min_size=m, max_size=m, unique=True))
        return _normalise([values[draw(st.integers(0, m - 1))] for _ in range(n)], exact)
    if shape == "near_ties":  # entries 0 and 1 tie, then move apart by a tiny gap
        a = draw(st.integers(1, 10))
        row = _normalise([a, a] + draw(st.lists(ints, min_size=n - 2, max_size=n - 2)), exact)
        gap = draw(st.sampled_from(_EXACT_GAPS if exact else _FLOAT_GAPS))
        return _nudge(row, 0, 1, gap / 2)
    if shape == "peaked":
        rest = draw(st.lists(st.integers(1, 9), min_size=n - 1, max_size=n - 1))
        peak = draw(st.sampled_from(_PEAKS)) * max(sum(rest), 1)
        return _normalise([peak] + rest, exact)
    # "random" and "zeros" (whose zeros are placed by the caller)
    if exact or draw(st.booleans()):
        return _normalise(draw(st.lists(ints, min_size=n, max_size=n)), exact)
    floats = st.floats(1e-6, 1.0, allow_nan=False, allow_infinity=False)
    return _normalise(draw(st.lists(floats, min_size=n, max_size=n)), exact)


def _row(draw, V: int, *, exact: bool, shapes=SHAPES, min_zeros: int = 0, allow_zeros: bool = True):
    """One row of size ``V``: a shape for the nonzero part, then zeros, then token ids."""
    if min_zeros >= V:
        raise InvalidArgument(f"min_zeros={min_zeros} leaves no token with probability > 0 at vocab_size={V}")
    shape = draw(st.sampled_from(_feasible_shapes(shapes, V, min_zeros, allow_zeros)))
    most = (V - 1 if allow_zeros else 0) - (shape in ("ties", "near_ties"))  # zeros at most
    if shape == "zeros":
        z = draw(st.integers(max(1, min_zeros), most))
    elif allow_zeros and most > min_zeros and draw(st.booleans()):
        z = draw(st.integers(min_zeros, most))
    else:
        z = min_zeros
    support = _support(draw, V - z, shape, exact)
    where = draw(st.permutations(range(V)))[: V - z]  # which tokens get the mass
    row = _zeros(V, exact)
    row[where] = support
    return row


@st.composite
def _distribution(draw, vocab, exact, shapes, min_zeros, allow_zeros):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    return _row(draw, V, exact=exact, shapes=shapes, min_zeros=min_zeros, allow_zeros=allow_zeros)


def distributions(
    *,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    exact: bool = False,
    min_zeros: int = 0,
    allow_zeros: bool = True,
    shapes=SHAPES,
) -> st.SearchStrategy[np.ndarray]:
    """One probability row ``[V]``: float64 summing to 1 within 1e-12, or (``exact``)
    an object array of ``Fraction`` summing to exactly 1.

    * ``vocab_size``: an int or a strategy of ints (default 2..8).
    * ``shapes``: any of :data:`SHAPES`:

      - ``"zeros"``: at least one token has probability 0;
      - ``"ties"``: two or more nonzero tokens have exactly equal probability;
      - ``"near_ties"``: two tokens differ by 1e-12..1e-15 (float), or by
        1e-6..1e-15 as a rational (exact);
      - ``"peaked"``: one token holds >= 0.99 (one-hot when it is alone);
      - ``"flat"``: uniform on its support;
      - ``"random"``: integer weights, or (float) uniform weights in [1e-6, 1].

      A shape that cannot occur at the drawn size (ties need two nonzero tokens)
      gives way to another.  Any shape may also get zeros when ``allow_zeros``.
    * ``min_zeros``: every row has at least this many zero entries (< V).
    * ``allow_zeros=False``: every entry is > 0.

    Where the mass sits is drawn too, so ties and peaks fall on any token id.

    >>> from specref.verification.cases.strategies import distributions
    >>> distributions(vocab_size=4).example()  # doctest: +SKIP
    array([0.24324324, 0.27027027, 0.24324324, 0.24324324])
    >>> distributions(vocab_size=3, exact=True, shapes=["peaked"]).example()  # doctest: +SKIP
    array([Fraction(0, 1), Fraction(1, 1000000001),
           Fraction(1000000000, 1000000001)], dtype=object)
    """
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    exact = _flag("exact", exact)
    allow_zeros = _flag("allow_zeros", allow_zeros)
    shapes = _choices("shapes", shapes, SHAPES)
    if isinstance(min_zeros, bool) or not isinstance(min_zeros, (int, np.integer)) or min_zeros < 0:
        raise InvalidArgument(f"min_zeros must be an int >= 0, got {min_zeros!r}")
    if min_zeros and not allow_zeros:
        raise InvalidArgument(f"min_zeros={min_zeros} contradicts allow_zeros=False")
    if shapes == ("zeros",) and not allow_zeros:
        raise InvalidArgument('shapes=("zeros",) contradicts allow_zeros=False')
    if vocab_size is None and min_zeros >= 2:
        vocab = st.integers(min_zeros + 1, max(8, min_zeros + 1))
    if isinstance(vocab_size, (int, np.integer)) and min_zeros >= vocab_size:
        raise InvalidArgument(f"min_zeros={min_zeros} must be < vocab_size={vocab_size}")
    return _distribution(vocab, exact, shapes, int(min_zeros), allow_zeros)


# ---------------------------------------------------------------- pairs


def _pair(draw, V: int, exact: bool, relation: str):
    """``(p, q)`` rows of size V related as ``relation`` says (see :data:`RELATIONS`)."""
    if V == 1 and relation in ("q_zeros", "p_zeros", "disjoint"):
        relation = "equal"  # the only distribution on one token is [1]
    p = _row(draw, V, exact=exact)
    if relation == "equal":
        return p, p.copy()
    if relation == "near":
        return p, _near(draw, p, exact)
    if relation == "permuted":
        return p, p[draw(st.permutations(range(V)))]
    other = _row(draw, V, exact=exact)
    if relation == "independent":
        return p, other
    if relation == "mixture":  # q close to p, but not within rounding
        lam = draw(st.sampled_from([Fraction(1, 2), Fraction(1, 10), Fraction(1, 1000)]))
        lam = lam if exact else float(lam)
        return p, (1 - lam) * p + lam * other
    if relation == "disjoint":  # min(p, q) = 0 everywhere: every draft token is rejected
        order = draw(st.permutations(range(V)))
        a = draw(st.integers(1, V - 1))
        return _restrict(p, order[:a], exact), _restrict(other, order[a:], exact)
    # "q_zeros" / "p_zeros": one row is 0 on some tokens where the other is > 0
    base, zeroed = (p, other) if relation == "q_zeros" else (other, p)
    positive = [t for t in range(V) if base[t] > 0]
    positive = draw(st.permutations(positive))
    drop = set(positive[: draw(st.integers(1, min(len(positive), V - 1)))])
    zeroed = _restrict(zeroed, [t for t in range(V) if t not in drop], exact)
    return (base, zeroed) if relation == "q_zeros" else (zeroed, base)


@st.composite
def _distribution_pair(draw, vocab, exact, relations):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    return _pair(draw, V, exact, draw(st.sampled_from(relations)))


def distribution_pairs(
    *,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    exact: bool = False,
    relations=RELATIONS,
) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """``(p, q)``: a target and a draft row over the same vocabulary, drawn related.

    * ``relations``: any of :data:`RELATIONS`:

      - ``"equal"``: ``q == p`` (acceptance 1; the residual is 0/0);
      - ``"independent"``: two rows of :func:`distributions`;
      - ``"q_zeros"`` / ``"p_zeros"``: ``q`` is 0 on some tokens where ``p > 0``
        (the residual must reach them) / ``p`` is 0 on some tokens where ``q > 0``
        (those draft tokens are always rejected);
      - ``"disjoint"``: no token has ``p > 0`` and ``q > 0`` (acceptance 0);
      - ``"near"``: ``q`` moves a near-tie gap (1e-12..1e-15, or a rational
        1e-6..1e-15) from ``p``'s largest token to another one (possibly one where
        ``p = 0``), or (float) is ``p`` recomputed as ``exp(log p)``, differing by
        rounding only: the residual mass is ~0 (SPEC §3's rounding case);
      - ``"mixture"``: ``q = (1 - l) p + l r`` with ``l`` in {1/2, 1/10, 1/1000};
      - ``"permuted"``: ``q`` is ``p`` with its tokens shuffled.

      On one token only ``p == q == [1]`` exists, so every relation gives that.
    * ``vocab_size``, ``exact``: as in :func:`distributions`.

    >>> from specref.verification.cases.strategies import distribution_pairs
    >>> distribution_pairs(vocab_size=3, exact=True).example()  # doctest: +SKIP
    (array([Fraction(3, 7), Fraction(0, 1), Fraction(4, 7)], dtype=object),
     array([Fraction(0, 1), Fraction(1, 1), Fraction(0, 1)], dtype=object))
    """
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    exact = _flag("exact", exact)
    relations = _choices("relations", relations, RELATIONS)
    return _distribution_pair(vocab, exact, relations)


# ---------------------------------------------------------------- logits


@st.composite
def _logit_row(draw, vocab, allow_neg_inf):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    shape = draw(st.sampled_from(["random", "ties", "near_ties", "flat", "peaked", "log_probs"]))
    values = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
    if shape == "log_probs":  # softmax gives back this row exactly (up to rounding)
        p = _row(draw, V, exact=False, allow_zeros=allow_neg_inf)
        with np.errstate(divide="ignore"):
            z = np.log(p)  # -inf where p = 0
    elif shape == "flat":
        z = np.full(V, draw(values))
    elif shape == "ties":
        pool = draw(st.lists(st.integers(-4, 4), min_size=1, max_size=max(1, V - 1), unique=True))
        z = np.array([pool[draw(st.integers(0, len(pool) - 1))] for _ in range(V)], dtype=np.float64)
    else:
        z = np.array(draw(st.lists(values, min_size=V, max_size=V)), dtype=np.float64)
        if shape == "peaked":
            z[draw(st.integers(0, V - 1))] = z.max() + draw(st.sampled_from([5.0, 20.0, 50.0]))
        if shape == "near_ties" and V >= 2:
            i, j = draw(st.permutations(range(V)))[:2]
            z[j] = z[i] + draw(st.sampled_from(_FLOAT_GAPS))
    # softmax is shift invariant; large offsets catch a missing max subtraction
    z = z + draw(st.sampled_from([0.0, 0.0, 0.0, 1e3, -1e3, 1e5]))
    if allow_neg_inf and V >= 2 and draw(st.booleans()):
        finite = [t for t in range(V) if np.isfinite(z[t])]
        masked = draw(st.permutations(finite))[: draw(st.integers(1, len(finite) - 1))] if len(finite) > 1 else []
        z[masked] = -np.inf
    return z


def logits(
    *,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    allow_neg_inf: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """One float64 logit row ``[V]``: never NaN or +inf, always one finite entry.

    Shapes: random values in [-10, 10], exact ties (small integers), near-ties
    (two logits 1e-12..1e-15 apart), flat, one peak (+5, +20 or +50 above the rest),
    and ``log(p)`` of a :func:`distributions` row (``-inf`` where ``p = 0``).  A
    constant offset (0, +-1e3, 1e5) is added at times, and with ``allow_neg_inf``
    some (never all) entries are masked to ``-inf``.

    >>> from specref.verification.cases.strategies import logits
    >>> logits(vocab_size=4).example()  # doctest: +SKIP
    array([  -inf, -998.5,   -inf, -948.5])
    """
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    return _logit_row(vocab, _flag("allow_neg_inf", allow_neg_inf))


# ---------------------------------------------------------------- sampling configs


def sampling_configs(
    *,
    vocab_size: int = 8,
    allow_greedy: bool = True,
    exact: bool = False,
) -> st.SearchStrategy[SamplingConfig]:
    """:class:`~specref.core.sampling.SamplingConfig` s for rows of ``vocab_size`` tokens.

    * temperature: 0 (greedy, if ``allow_greedy``), 1/2, 0.7, 1, 1.5, 2; with
      ``exact`` a ``Fraction`` whose inverse is an integer (0, 1, 1/2, 1/3), the only
      temperatures :func:`specref.core.sampling.process_probs` keeps rational;
    * top_k: None or 1..``vocab_size``;
    * top_p: 1 (off) or a value in (0, 1];
    * min_p: 0 (off) or a value in [0, 1).

    With ``exact`` every number is a ``Fraction`` (thresholds with small
    denominators, so that a cumulative mass often lands exactly on ``top_p``), and
    processing ``Fraction`` rows with the config stays exact.

    >>> from specref.verification.cases.strategies import sampling_configs
    >>> sampling_configs(vocab_size=4).example()  # doctest: +SKIP
    SamplingConfig(temperature=0.7, top_k=2, top_p=0.1, min_p=0.0)
    >>> sampling_configs(exact=True).example()  # doctest: +SKIP
    SamplingConfig(temperature=Fraction(0, 1), top_k=None, top_p=Fraction(3, 4), min_p=Fraction(1, 2))
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise InvalidArgument(f"vocab_size must be an int >= 1 (the largest top_k drawn), got {vocab_size!r}")
    allow_greedy, exact = _flag("allow_greedy", allow_greedy), _flag("exact", exact)
    temps: list[Any]  # Fractions with exact, floats without
    top_p: st.SearchStrategy[Any]
    min_p: st.SearchStrategy[Any]
    zero: float | Fraction
    if exact:
        F = Fraction
        temps = [F(1), F(1, 2), F(1, 3)]
        on_p = [F(1, 10), F(1, 4), F(1, 3), F(1, 2), F(2, 3), F(3, 4), F(4, 5), F(9, 10), F(19, 20)]
        top_p = st.just(F(1)) | st.sampled_from(on_p) | st.fractions(0, 1, max_denominator=12).filter(bool)
        on_m = [F(1, 20), F(1, 10), F(1, 4), F(1, 3), F(1, 2), F(9, 10)]
        min_p = st.just(F(0)) | st.sampled_from(on_m) | st.fractions(0, 1, max_denominator=12).filter(lambda m: m < 1)
        zero = F(0)
    else:
        temps = [0.5, 0.7, 1.0, 1.5, 2.0]
        top_p = st.just(1.0) | st.sampled_from([0.1, 0.5, 0.8, 0.9, 0.95]) | st.floats(0, 1, exclude_min=True)
        min_p = st.just(0.0) | st.sampled_from([0.05, 0.1, 0.3, 0.5]) | st.floats(0, 1, exclude_max=True)
        zero = 0.0
    temperature = (st.just(zero) | st.sampled_from(temps)) if allow_greedy else st.sampled_from(temps)
    return st.builds(
        SamplingConfig,
        temperature=temperature,
        top_k=st.none() | st.integers(1, int(vocab_size)),
        top_p=top_p,
        min_p=min_p,
    )


# ---------------------------------------------------------------- step inputs


def _rows(rows, exact: bool) -> np.ndarray:
    out = np.empty((len(rows), len(rows[0])), dtype=object if exact else np.float64)
    for i, r in enumerate(rows):
        out[i] = r
    return out


@st.composite
def _step_input(draw, ks, vocab, exact, cases):
    K = _drawn_size(draw, "k", ks, 1)
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    if V == 1:  # one token: p = q = [1] at every position, nothing can be rejected
        cases = ["equal"]
    case = draw(st.sampled_from(cases))
    rejected_at = None  # the position i with p_i(x_i) = 0, if any
    if case == "reject_first":
        rejected_at = 0
    elif case == "reject":
        rejected_at = draw(st.integers(0, K - 1))
    ps, qs, xs = [], [], []
    for i in range(K):
        if case == "equal":
            p, q = _pair(draw, V, exact, "equal")
        elif case == "near":
            p, q = _pair(draw, V, exact, "near")
        elif case == "q_zeros":
            p, q = _row(draw, V, exact=exact), _row(draw, V, exact=exact, min_zeros=1)
        elif case == "all_accept":
            q = _row(draw, V, exact=exact)
            p = None  # made from q and the token below
        else:
            p, q = _pair(draw, V, exact, draw(st.sampled_from(RELATIONS)))
        x = draw(st.sampled_from([t for t in range(V) if q[t] > 0]))  # x_i ~ q_i: q_i(x_i) > 0
        if case == "all_accept":  # p(x) >= q(x): accepted with probability 1
            lam = draw(st.sampled_from([Fraction(0), Fraction(1, 4), Fraction(1, 2), Fraction(1)]))
            lam = lam if exact else float(lam)
            p = (1 - lam) * q
            p[x] = p[x] + lam
            if p[x] < q[x]:  # float rounding only
                p[x] = q[x]
        if i == rejected_at:  # p(x_i) = 0: always rejected here
            p = _restrict(p, [t for t in range(V) if t != x], exact)
        ps.append(p)
        qs.append(q)
        xs.append(x)
    ps.append(_row(draw, V, exact=exact))  # the bonus row
    return StepInput(_rows(ps, exact), _rows(qs, exact), np.array(xs, dtype=np.int64))


def step_inputs(
    *,
    k: int | st.SearchStrategy[int] | None = None,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    exact: bool = False,
) -> st.SearchStrategy[StepInput]:
    """A :class:`StepInput` ``(p_target [K+1, V], q_draft [K, V], draft_tokens [K])``
    that :func:`specref.core.step.speculative_step` accepts.

    Each draft token is drawn from the support of its draft row.  One case is drawn
    for the whole input:

    - ``"random"``: each position a :func:`distribution_pairs` pair of any relation;
    - ``"equal"``: ``p_i = q_i`` at every position (all accepted, then the bonus);
    - ``"all_accept"``: ``p_i(x_i) >= q_i(x_i)`` at every position, ``p_i != q_i``;
    - ``"reject_first"``: ``p_1(x_1) = 0`` (one token is emitted, from the residual);
    - ``"reject"``: ``p_i(x_i) = 0`` at one position ``i``;
    - ``"q_zeros"``: every draft row has zeros;
    - ``"near"``: ``p_i`` within a near-tie gap or rounding of ``q_i`` (the residual
      mass is ~0: SPEC §3's rounding case).

    * ``k``, ``vocab_size``: ints or strategies (default 1..4 and 2..8).

    >>> from specref.verification.cases.strategies import step_inputs
    >>> from specref.core.step import speculative_step
    >>> import numpy as np
    >>> step = step_inputs(k=2, vocab_size=3).example()
    >>> step.p_target.shape, step.q_draft.shape, step.draft_tokens.shape
    ((3, 3), (2, 3), (2,))
    >>> 1 <= len(speculative_step(*step, np.random.default_rng(0))) <= 3
    True
    """
    ks = _size("k", k, _DEFAULT_K, 1)
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    return _step_input(ks, vocab, _flag("exact", exact), _STEP_CASES)


# ---------------------------------------------------------------- table models


def _log(row) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(row.astype(np.float64))  # -inf where the probability is 0


def _kind(kind, exact):
    if kind not in ("probs", "logits"):
        raise InvalidArgument(f'kind must be "probs" or "logits", got {kind!r}')
    if kind == "logits" and exact:
        raise InvalidArgument('kind="logits" has float logits only; use kind="probs" with exact=True')
    return kind


@st.composite
def _table_model(draw, vocab, exact, kind):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    if kind == "logits":
        return LogitTable(np.stack([draw(_logit_row(st.just(V), True)) for _ in range(V)]))
    return ProbTable(_rows([_row(draw, V, exact=exact) for _ in range(V)], exact))


def table_models(
    *,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    exact: bool = False,
    kind: Literal["probs", "logits"] = "probs",
) -> st.SearchStrategy[ProbTable | LogitTable]:
    """A bigram model: ``table[x]`` is the next-token row after token ``x``.

    ``kind="probs"`` gives a :class:`~specref.verification.cases.tables.ProbTable` whose ``[V, V]``
    rows are :func:`distributions` rows (``Fraction`` when ``exact``);
    ``kind="logits"`` a :class:`~specref.verification.cases.tables.LogitTable` of :func:`logits`
    rows (float only).

    >>> from specref.verification.cases.strategies import table_models
    >>> table_models(vocab_size=3, exact=True).example()  # doctest: +SKIP
    ProbTable(V=3, exact=True)
    >>> table_models(vocab_size=2, kind="logits").example().table  # doctest: +SKIP
    array([[ 0.7936209 ,  0.7936209 ],
           [-0.88489291,        -inf]])
    """
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    exact = _flag("exact", exact)
    return _table_model(vocab, exact, _kind(kind, exact))


@st.composite
def _table_model_pair(draw, vocab, exact, kind, relations):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    relation = draw(st.sampled_from(relations))
    if relation == "independent" and kind == "logits":
        return draw(_table_model(st.just(V), False, "logits")), draw(_table_model(st.just(V), False, "logits"))
    pair_relation = {"identical": "equal", "independent": "independent", "disjoint": "disjoint", "near": "near"}
    ps, qs = [], []
    for _ in range(V):
        r = pair_relation.get(relation) or draw(st.sampled_from(RELATIONS))
        p, q = _pair(draw, V, exact, r)
        ps.append(p)
        qs.append(q)
    if kind == "logits":
        target = np.stack([_log(p) for p in ps])
        draft = target.copy() if relation == "identical" else np.stack([_log(q) for q in qs])
        return LogitTable(target), LogitTable(draft)
    return ProbTable(_rows(ps, exact)), ProbTable(_rows(qs, exact))


def table_model_pairs(
    *,
    vocab_size: int | st.SearchStrategy[int] | None = None,
    exact: bool = False,
    kind: Literal["probs", "logits"] = "probs",
    relations=_TABLE_RELATIONS,
) -> st.SearchStrategy[tuple[ProbTable, ProbTable] | tuple[LogitTable, LogitTable]]:
    """``(target, draft)`` bigram models over the same vocabulary (see :func:`table_models`).

    * ``relations``: any of

      - ``"identical"``: equal tables (separate objects): every draft token is accepted;
      - ``"independent"``: two independent tables;
      - ``"disjoint"``: after every token the two rows share no support, so every draft
        token is rejected (with one token, ``V = 1``, the rows are equal instead);
      - ``"near"``: rows within a near-tie gap or rounding of each other;
      - ``"mixed"``: each row pair with its own relation of :data:`RELATIONS`.

    >>> from specref.verification.cases.strategies import table_model_pairs
    >>> target, draft = table_model_pairs(vocab_size=3, exact=True).example()
    >>> target.vocab_size == draft.vocab_size == 3
    True
    """
    vocab = _size("vocab_size", vocab_size, _DEFAULT_VOCAB, 1)
    exact = _flag("exact", exact)
    relations = _choices("relations", relations, _TABLE_RELATIONS)
    return _table_model_pair(vocab, exact, _kind(kind, exact), relations)


# ---------------------------------------------------------------- continuous-batching schedules


def _request_events(draw, r: int, arrival: int, m: int, kinds: tuple) -> tuple[list, list]:
    """Request ``r``'s cancellation and preemption, valid by construction: a preemption at one of
    the ``m`` steps it surely still runs (arrival .. arrival + m - 1), resumed 1 or 2 steps later;
    a cancellation at or after its arrival, after its preemption when it has both."""
    kind = draw(st.sampled_from(kinds))
    cancels: list = []
    preempts: list = []
    if kind in ("preempt", "both"):
        step = arrival + draw(st.integers(0, m - 1))
        preempts.append(Preemption(r, step, step + draw(st.integers(1, 2)), draw(st.sampled_from(PREEMPTION_MODES))))
    if kind == "cancel":
        cancels.append(Cancellation(r, arrival + draw(st.integers(0, m))))
    elif kind == "both":
        cancels.append(Cancellation(r, preempts[0].step + draw(st.integers(1, 3))))
    return cancels, preempts


@st.composite
def _schedule(draw, vocab, n_requests, ks, new_tokens, horizon, kinds, budget):
    V = _drawn_size(draw, "vocab_size", vocab, 1)
    B = _drawn_size(draw, "requests", n_requests, 1)
    k = _drawn_size(draw, "k", ks, 1)
    requests, arrivals, cancels, preempts = [], [], [], []
    for r in range(B):
        prompt = tuple(draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=2)))
        m = _drawn_size(draw, "max_new_tokens", new_tokens, 1)
        stop = tuple(draw(st.lists(st.integers(0, V - 1), max_size=1))) if V > 1 else ()
        requests.append(Request(prompt, m, stop))
        arrivals.append(draw(st.integers(0, horizon - 1)))
        c, p = _request_events(draw, r, arrivals[-1], m, kinds)
        cancels += c
        preempts += p
    memory = None
    if budget and not cancels and draw(st.booleans()):  # a budget between one request alone and a little more
        memory = max(len(q.prompt) + q.max_new_tokens - 1 + k for q in requests) + draw(st.integers(0, 3))
    return Schedule(tuple(requests), tuple(arrivals), k, tuple(cancels), tuple(preempts), memory)


def schedules(
    *,
    vocab_size: int | st.SearchStrategy[int] = 2,
    requests: int | st.SearchStrategy[int] | None = None,
    k: int | st.SearchStrategy[int] | None = None,
    max_new_tokens: int | st.SearchStrategy[int] | None = None,
    horizon: int = 3,
    events: bool = True,
    cancellations: bool = True,
    budget: bool = True,
) -> st.SearchStrategy[Schedule]:
    """A valid :class:`~specref.decoding.continuous.Schedule` for :func:`specref.decoding.continuous.continuous_decode`.

    Each request: a prompt of 1 or 2 tokens, ``max_new_tokens`` new tokens, none or one stop token,
    the default sampling config, an arrival step in ``0..horizon-1``; with ``events``, each request
    also draws one of: nothing, a cancellation (at its arrival step up to ``max_new_tokens`` steps
    later), a preemption (recompute or swap, at a step it surely still runs, resumed 1 or 2 steps
    later), or both (the cancellation after the preemption); ``cancellations=False`` leaves the
    cancellations out (nothing or a preemption).  With ``budget`` and no cancellation,
    half the schedules get a memory budget between the largest request's need alone
    (``len(prompt) + max_new_tokens - 1 + k``) and 3 KV tokens more, which forces preemptions
    when requests overlap.  A memory budget is never drawn with a cancellation: the steps a
    cancelled request runs would then depend on the others (SPEC §17.2).

    * ``vocab_size``: an int or a strategy (default 2: the exact law stays small);
    * ``requests``, ``k``, ``max_new_tokens``: ints or strategies (default 1..3, 1..2, 1..3).

    >>> from specref.verification.cases.strategies import schedules
    >>> schedules(requests=2, k=1).example()  # doctest: +SKIP
    Schedule(requests=(Request(prompt=(0,), max_new_tokens=2, ...), ...), arrivals=(0, 1), k=1, ...)
    """
    vocab = _size("vocab_size", vocab_size, st.just(2), 1)
    n_requests = _size("requests", requests, st.integers(1, 3), 1)
    ks = _size("k", k, st.integers(1, 2), 1)
    new_tokens = _size("max_new_tokens", max_new_tokens, st.integers(1, 3), 1)
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise InvalidArgument(f"horizon must be an int >= 1, got {horizon!r}")
    kinds: tuple[str, ...] = ("none", "cancel", "preempt", "both") if _flag("cancellations", cancellations) \
        else ("none", "preempt")
    kinds = kinds if _flag("events", events) else ("none",)
    return _schedule(vocab, n_requests, ks, new_tokens, int(horizon), kinds, _flag("budget", budget))
