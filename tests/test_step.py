"""The single speculative step of SPEC §3: the law, every edge case, and bad input."""

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specref.core.errors import SpecrefError
from specref.core.step import (
    RESIDUAL_TOL,
    acceptance_rate,
    accepted_mass,
    draw,
    residual,
    residual_mass,
    speculative_step,
)


def frac(*values):
    return np.array([F(v) for v in values], dtype=object)


class ScriptedRng:
    """Plays back fixed uniforms and records every ``choice`` distribution it is asked for."""

    def __init__(self, uniforms, picks=()):
        self.uniforms, self.picks, self.choices = list(uniforms), list(picks), []

    def random(self):
        return self.uniforms.pop(0)

    def choice(self, n, p):
        self.choices.append(np.array(p))
        return self.picks.pop(0) if self.picks else int(np.flatnonzero(np.asarray(p, dtype=float) > 0)[0])


# ---------------------------------------------------------------- the single-position law

# distributions with zeros, near-ties and p = q, as exact rationals
weights = st.lists(st.integers(0, 6), min_size=3, max_size=3).filter(any)


def to_dist(ws):
    total = sum(ws)
    return frac(*[F(w, total) for w in ws])


@settings(max_examples=300, deadline=None)
@given(weights, weights, st.booleans())
def test_accepted_plus_rejected_residual_is_p_exactly(wp, wq, same):
    p, q = to_dist(wp), to_dist(wp if same else wq)
    alpha = acceptance_rate(p, q)
    assert residual_mass(p, q) == 1 - alpha  # sum max(0, p - q) = 1 - sum min(p, q)
    if alpha == 1:  # p = q: rejection has probability 0 and the residual is undefined
        assert list(accepted_mass(p, q)) == list(p)
        with pytest.raises(SpecrefError, match="residual"):
            residual(p, q)
        return
    total = accepted_mass(p, q) + (1 - alpha) * residual(p, q)
    assert list(total) == list(p)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=4, max_size=4).filter(lambda xs: sum(xs) > 0.1),
    st.lists(st.floats(0, 1), min_size=4, max_size=4).filter(lambda xs: sum(xs) > 0.1),
    st.floats(0, 1e-14),
)
def test_float_mass_balance_with_near_ties(a, b, eps):
    p = np.array(a) / sum(a)
    q = (1 - eps) * p + eps * np.array(b) / sum(b)  # q within ~eps of p: a near-tie
    alpha = acceptance_rate(p, q)
    rejection = residual_mass(p, q)
    assert abs(alpha + rejection - 1) < 1e-12
    if rejection > RESIDUAL_TOL:
        np.testing.assert_allclose(accepted_mass(p, q) + rejection * residual(p, q), p, atol=1e-12)


def test_worked_example():
    p, q = frac("1/5", "1/2", "3/10"), frac("3/5", "3/10", "1/10")
    assert list(accepted_mass(p, q)) == [F(1, 5), F(3, 10), F(1, 10)]
    assert acceptance_rate(p, q) == F(3, 5)
    assert list(residual(p, q)) == [0, F(1, 2), F(1, 2)]
    assert list(accepted_mass(p, q) + F(2, 5) * residual(p, q)) == list(p)
    # the classic bug, "on rejection resample from p", gives a different law
    assert list(accepted_mass(p, q) + F(2, 5) * p) == [F(7, 25), F(1, 2), F(11, 50)]


# ---------------------------------------------------------------- Monte Carlo


def test_monte_carlo_first_token_and_block_length():
    """N = 40,000 seeded steps with K = 2 against the exact laws; tolerance 5 standard errors.

    The first emitted token must follow p_1 exactly.  The block length follows from the
    per-position acceptance alpha_i = sum min(p_i, q_i) (draft rows do not depend on the
    drafted tokens here): P(L = 1) = 1 - a1, P(L = 2) = a1 (1 - a2), P(L = 3) = a1 a2.
    """
    rng = np.random.default_rng(20261129)
    p = np.array([[0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    q = np.array([[0.4, 0.2, 0.2, 0.2], [0.1, 0.2, 0.3, 0.4]])
    N = 40_000
    first, length = Counter(), Counter()
    for _ in range(N):
        drafted = [draw(rng, q[0]), draw(rng, q[1])]
        out = speculative_step(p, q, drafted, rng)
        first[out[0]] += 1
        length[len(out)] += 1
    a1, a2 = acceptance_rate(p[0], q[0]), acceptance_rate(p[1], q[1])
    for law, counts in [(p[0], first), ({1: 1 - a1, 2: a1 * (1 - a2), 3: a1 * a2}, length)]:
        for x, prob in (law.items() if isinstance(law, dict) else enumerate(law)):
            se = max(np.sqrt(prob * (1 - prob) / N), 1 / N)
            assert abs(counts[x] / N - prob) <= 5 * se, (x, counts[x] / N, prob)


# ---------------------------------------------------------------- edge cases


def test_p_equal_q_accepts_everything_and_draws_the_bonus():
    row = np.array([0.2, 0.3, 0.5])
    p, q = np.stack([row, row, row]), np.stack([row, row])
    bonus = np.array([0.0, 0.0, 1.0])
    p[2] = bonus
    rng = ScriptedRng([0.999999, 0.999999])
    assert speculative_step(p, q, [1, 0], rng) == [1, 0, 2]
    assert len(rng.choices) == 1 and np.array_equal(rng.choices[0], bonus)  # only the bonus draw


def test_rejection_at_position_one_emits_one_token_from_the_residual():
    p = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = np.array([[0.0, 0.2, 0.8]])
    rng = ScriptedRng([0.0])  # u = 0 < p/q would accept anything with p > 0
    out = speculative_step(p, q, [2], rng)  # p(x)=0: ratio 0, always rejected
    assert len(out) == 1
    np.testing.assert_allclose(rng.choices[0], [5 / 8, 3 / 8, 0.0])  # max(0, p - q) normalised


def test_p_zero_is_always_rejected_exactly():
    p = np.array([frac("1/2", "1/2", "0"), frac("1/3", "1/3", "1/3")])
    q = np.array([frac("0", "0", "1")])
    for u in [0.0, 0.5, 0.999]:
        rng = ScriptedRng([u])
        out = speculative_step(p, q, [2], rng)
        assert len(out) == 1 and out[0] != 2
        assert list(rng.choices[0]) == [F(1, 2), F(1, 2), 0]  # Fractions reach the generator


def test_acceptance_threshold_is_p_over_q():
    p = np.array([[0.3, 0.7], [0.5, 0.5]])
    q = np.array([[0.6, 0.4]])  # ratio for token 0 = 0.5
    assert speculative_step(p, q, [0], ScriptedRng([0.49], picks=[1])) == [0, 1]  # accepted + bonus
    assert speculative_step(p, q, [0], ScriptedRng([0.5], picks=[1])) == [1]  # rejected at u = 0.5


def test_truncation_after_the_first_rejection():
    """Position 2 would be accepted with certainty, but position 1 was rejected."""
    p = np.array([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.5, 0.5], [0.5, 0.5]])
    rng = ScriptedRng([0.9, 0.0])
    assert speculative_step(p, q, [0, 0], rng) == [1]
    assert rng.uniforms == [0.0]  # the second uniform was never drawn


def test_k_equals_one():
    p = np.array([[0.25, 0.75], [1.0, 0.0]])
    q = np.array([[0.5, 0.5]])
    assert speculative_step(p, q, [1], ScriptedRng([0.3])) == [1, 0]


def test_residual_positive_only_through_rounding_draws_from_p():
    eps = 1e-13  # residual mass 1e-13 <= RESIDUAL_TOL: rejection only through rounding
    p = np.array([[0.5 - eps, 0.5 + eps], [0.5, 0.5]])
    q = np.array([[0.5, 0.5]])
    rng = ScriptedRng([1 - 1e-16])  # forces the (probability 2e-13) rejection
    out = speculative_step(p, q, [0], rng)
    assert len(out) == 1
    np.testing.assert_array_equal(rng.choices[0], p[0])  # from p, not from ~0/~0
    assert residual_mass(p[0], q[0]) <= RESIDUAL_TOL


def test_works_with_numpy_generator_on_fraction_rows():
    p = np.array([frac("1/5", "1/2", "3/10"), frac("1/2", "1/2", "0")])
    q = np.array([frac("3/5", "3/10", "1/10")])
    out = speculative_step(p, q, [2], np.random.default_rng(0))
    assert 1 <= len(out) <= 2 and all(0 <= t < 3 for t in out)


def test_array_api_strict_rows_are_accepted():
    xps = pytest.importorskip("array_api_strict")
    p = xps.asarray([[0.25, 0.75], [1.0, 0.0]])
    q = xps.asarray([[0.5, 0.5]])
    assert speculative_step(p, q, [1], ScriptedRng([0.3])) == [1, 0]


# ---------------------------------------------------------------- bad input

P2 = np.array([[0.5, 0.5], [0.5, 0.5]])
Q1 = np.array([[0.5, 0.5]])


@pytest.mark.parametrize(
    "p, q, tokens, word",
    [
        (P2, np.array([[0.0, 1.0]]), [0], r"q_draft\[0, 0\] = 0"),
        (P2, Q1, [2], "out of range"),
        (P2, Q1, [-1], "out of range"),
        (P2, Q1, [0, 1], "must hold 1 tokens"),
        (P2, Q1, [0.5], "integer"),
        (P2[:1], Q1, [0], "K\\+1 = 2"),
        (np.ones((2, 3)) / 3, Q1, [0], "vocabulary mismatch"),
        (P2, np.zeros((0, 2)), [], "K >= 1"),
        (P2, np.array([0.5, 0.5]), [0], r"\[K, V\]"),
        (np.array([[0.5, 0.6], [0.5, 0.5]]), Q1, [0], "p_target row 0 sums to"),
        (P2, np.array([[1.5, -0.5]]), [0], "q_draft.*negative"),
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), Q1, [0], "not finite"),
        (np.array([frac("1/2", "1/3"), frac("1/2", "1/2")]), np.array([frac("1/2", "1/2")]), [0], "not exactly 1"),
        (np.array([frac("1/2", "1/2"), frac("1/2", "1/2")]), Q1, [0], "must both be Fraction"),
    ],
)
def test_bad_step_input_is_named(p, q, tokens, word):
    with pytest.raises(SpecrefError, match=word):
        speculative_step(p, q, tokens, np.random.default_rng(0))


def test_helpers_refuse_mismatched_rows():
    with pytest.raises(SpecrefError, match="same vocabulary"):
        accepted_mass(np.array([0.5, 0.5]), np.array([0.2, 0.3, 0.5]))
    with pytest.raises(SpecrefError, match="shape \\[V\\]"):
        acceptance_rate(P2, P2)


# ---------------------------------------------------------------- the shared residual, recomputed in rationals
# specref.core.step.residual_weights / residual_usable / normalised / correction_weights /
# correction_row are what every rejection in core and decoding draws from.  The second
# route below is plain Python on Fractions (the float rows' exact values), no NumPy.


def _rational_correction(p, q, *, normalise_fallback=False):
    """max(0, p - q) / its mass, else p (or p / sum(p)): the SPEC §3 rule, in exact arithmetic."""
    p, q = [F(float(v)) if not isinstance(v, F) else v for v in p], [F(float(v)) if not isinstance(v, F) else v for v in q]
    w = [max(a - b, F(0)) for a, b in zip(p, q)]
    return [v / sum(w) for v in w] if sum(w) else ([v / sum(p) for v in p] if normalise_fallback else p), sum(w)


def _residual_pairs():
    rng = np.random.default_rng(11)
    pairs = []
    for _ in range(40):
        p, q = rng.dirichlet(np.ones(5), size=2)
        p[rng.random(5) < 0.3] = 0.0
        p = p / p.sum() if p.sum() else q
        pairs.append((p, q))
    pairs.append((np.full(5, 0.2), np.full(5, 0.2)))  # no residual at all: the fallback
    return pairs


def test_residual_weights_and_correction_row_match_rationals():
    from specref.core.step import correction_row, residual_weights

    for p, q in _residual_pairs():
        want, mass = _rational_correction(p, q)
        w = residual_weights(p, q)
        exact_w = [max(F(float(a)) - F(float(b)), F(0)) for a, b in zip(p, q)]
        assert all(abs(F(float(v)) - e) <= F(1, 2**53) for v, e in zip(w, exact_w))  # one rounding, values <= 1
        assert all((v == 0) == (e == 0) for v, e in zip(w, exact_w))  # and the same support
        got = correction_row(p, q)
        tol = F(1, 2**50)  # the float route rounds the difference and the division once each
        if mass > 1e-9:
            assert all(abs(F(float(g)) - v) <= tol for g, v in zip(got, want))
        elif mass == 0:
            assert got is p
        pf, qf = np.array([F(float(v)) for v in p], dtype=object), np.array([F(float(v)) for v in q], dtype=object)
        assert list(correction_row(pf, qf)) == want  # Fraction rows: exactly the rational rule


def test_residual_usable_is_the_documented_threshold():
    from specref.core.step import residual_usable

    assert not residual_usable(RESIDUAL_TOL, exact=False)
    assert residual_usable(np.nextafter(RESIDUAL_TOL, 1.0), exact=False)
    assert residual_usable(F(1, 10**30), exact=True) and not residual_usable(F(0), exact=True)
    assert residual_usable(np.array([0.0, 1e-13, 1e-11]), exact=False).tolist() == [False, False, True]


def test_correction_weights_per_row_is_correction_row_unnormalised():
    """Batched rows [B, V] on NumPy and array_api_strict: normalising each gives correction_row."""
    import array_api_strict as xps

    from specref.core.step import correction_row, correction_weights, residual_weights

    pairs = _residual_pairs()
    eps = 1e-13  # a row whose residual is rounding only: the fallback p
    tiny = (np.array([0.5 + eps, 0.5 - eps]), np.array([0.5, 0.5]))
    p = np.stack([a for a, _ in pairs])
    q = np.stack([b for _, b in pairs])
    for xp, asarray in ((np, np.asarray), (xps, xps.asarray)):
        got = np.asarray(correction_weights(residual_weights(asarray(p), asarray(q), xp=xp), asarray(p), xp=xp,
                                            exact=False))
        for row, (a, b) in zip(got, pairs):
            want = correction_row(a, b)
            if want is a:  # the fallback: p itself, unnormalised in both
                assert row.tolist() == a.tolist()
            else:
                assert np.allclose(row / row.sum(), want, rtol=1e-15, atol=0)
        small = correction_weights(residual_weights(asarray(tiny[0]), asarray(tiny[1]), xp=xp), asarray(tiny[0]),
                                   xp=xp, exact=False)
        assert np.asarray(small).tolist() == tiny[0].tolist()


def test_scaled_fallback_is_normalised_only_when_asked():
    from specref.core.step import correction_row
    from specref.core.tree_verify import positive_residual

    p = frac("1/10", "1/5", "0")  # a scaled row (mass 3/10), as block verification hands it
    q = frac("1/2", "1/2", "0")
    assert list(correction_row(p, q)) == list(p)
    assert list(correction_row(p, q, normalise_fallback=True)) == [F(1, 3), F(2, 3), F(0)]
    assert list(positive_residual(p, q)) == [F(1, 3), F(2, 3), F(0)]
    assert list(positive_residual(frac("1/2", "1/4", "1/4"), q)) == [F(0), F(0), F(1)]
