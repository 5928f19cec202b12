"""The statistical verifier: the G-test, the TV interval and the planner (SPEC §6).

Simulations are seeded and draw counts with ``rng.multinomial``.  Tolerances: a
rate estimated from R replicates must lie within 3 standard errors
(sqrt(rate (1 - rate) / R)) of what is claimed, on the side that matters.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sps

from specref.core.errors import SpecrefError
from specref.decoding.vectorized import first_token_frequencies
from specref.verification.statistics.counts import (
    compare_counts,
    detectable_tv,
    g_test,
    planned_power,
    samples_needed,
    tv_estimate,
)

R = 400  # replicates per power simulation


def three_se(rate, reps):
    return 3.0 * math.sqrt(rate * (1.0 - rate) / reps)


# ----------------------------------------------------------------------------- G-test


def test_g_statistic_matches_scipy_without_pooling():
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    counts = np.array([12, 25, 24, 39])
    res = g_test(counts, probs)
    g, pval = sps.power_divergence(counts, 100 * probs, lambda_="log-likelihood")
    assert res.statistic == pytest.approx(g, rel=1e-12)
    assert res.p_value == pytest.approx(pval, rel=1e-10)
    assert (res.n, res.dof, res.n_bins, res.n_pooled, res.impossible) == (100, 3, 4, 0, 0)


def test_rare_bins_are_pooled_into_one():
    probs = np.array([0.5, 0.4, 0.05, 0.03, 0.02])  # N = 100: expected 50, 40, 5, 3, 2
    counts = np.array([48, 41, 4, 6, 1])
    res = g_test(counts, probs, min_expected=5)
    obs, exp = np.array([48, 41, 4, 7]), np.array([50.0, 40.0, 5.0, 5.0])
    g = 2 * np.sum(obs * np.log(obs / exp))
    assert res.statistic == pytest.approx(g, rel=1e-12)
    assert res.p_value == pytest.approx(sps.chi2.sf(g, 3), rel=1e-10)
    assert (res.dof, res.n_bins, res.n_pooled, res.pooled_expected) == (3, 4, 2, pytest.approx(5.0))
    assert "2 rare outcomes pooled" in str(res)


def test_pool_below_threshold_stays_its_own_bin():
    probs = np.array([0.6, 0.39, 0.01])  # N = 100: the lone rare bin expects 1
    res = g_test(np.array([60, 39, 1]), probs)
    assert (res.n_bins, res.dof, res.n_pooled) == (3, 2, 1)
    assert res.pooled_expected == pytest.approx(1.0)


def test_zero_probability_outcome_observed_rejects_outright():
    probs = np.array([0.5, 0.5, 0.0])
    res = g_test(np.array([50, 49, 1]), probs)
    assert res.p_value == 0.0 and res.statistic == math.inf and res.impossible == 1
    assert res.rejects(1e-12)
    assert "probability-0" in str(res)


def test_zero_probability_outcome_unobserved_is_left_out():
    a = g_test(np.array([50, 50, 0]), np.array([0.5, 0.5, 0.0]))
    b = g_test(np.array([50, 50]), np.array([0.5, 0.5]))
    assert (a.statistic, a.dof, a.p_value, a.impossible) == (b.statistic, b.dof, b.p_value, 0)


def test_single_bin_has_nothing_to_test():
    res = g_test(np.array([3, 0, 0]), np.array([0.98, 0.01, 0.01]), min_expected=5)
    assert (res.n_bins, res.n_pooled, res.dof, res.p_value) == (1, 3, 0, 1.0)  # N = 3: all pooled
    res = g_test(np.array([3]), np.array([1.0]))
    assert (res.dof, res.p_value, res.statistic) == (0, 1.0, 0.0)


def test_fraction_probabilities():
    F = Fraction
    res = g_test([30, 70], np.array([F(3, 10), F(7, 10)], dtype=object))
    assert res.statistic == pytest.approx(0.0, abs=1e-12) and res.p_value == pytest.approx(1.0)


def test_g_test_size_with_pooling():
    """Under the null (20 of 40 outcomes rare at N = 2000) the test rejects at most ~alpha."""
    rng = np.random.default_rng(31)
    probs = 0.8 ** np.arange(40)
    probs /= probs.sum()
    alpha, reps = 0.05, 2000
    counts = rng.multinomial(2000, probs, size=reps)
    results = [g_test(c, probs) for c in counts]
    assert results[0].n_pooled > 10
    rate = np.mean([r.rejects(alpha) for r in results])
    assert rate <= alpha + three_se(alpha, reps), rate


@pytest.mark.parametrize(
    ("counts", "probs", "kwargs", "match"),
    [
        ([1, -1], [0.5, 0.5], {}, "negative"),
        ([1.5, 2], [0.5, 0.5], {}, "whole numbers"),
        ([0, 0], [0.5, 0.5], {}, "N = 0"),
        ([1, 2, 3], [0.5, 0.5], {}, "probs must have shape"),
        ([1, 2], [0.5, 0.6], {}, "sums to"),
        ([1, 2], [0.5, 0.5], {"min_expected": 0}, "min_expected"),
        ([[1, 2]], [0.5, 0.5], {}, "1-D"),
    ],
)
def test_g_test_bad_input(counts, probs, kwargs, match):
    with pytest.raises(SpecrefError, match=match):
        g_test(np.array(counts), np.array(probs), **kwargs)


# ----------------------------------------------------------------------------- TV estimate


def test_tv_point_estimate_and_width():
    probs = np.array([0.25, 0.25, 0.5])
    counts = np.array([30, 20, 50])
    res = tv_estimate(counts, probs, confidence=0.99)
    assert res.estimate == pytest.approx(0.05)
    # half-width: the smaller of Bretagnolle-Huber-Carol and McDiarmid, recomputed here
    d = 0.01
    bhc = math.sqrt(2 * (math.log(2**3 - 2) + math.log(1 / d)) / 100)
    mcd = math.sqrt(2 / 100) + math.sqrt(2 * math.log(1 / d) / 100)
    assert res.half_width == pytest.approx(0.5 * min(bhc, mcd))
    assert res.lower == max(0.0, res.estimate - res.half_width)
    assert res.upper == pytest.approx(min(1.0, res.estimate + res.half_width))
    assert "N = 100" in str(res) and "+/-" in str(res)


def test_tv_interval_for_many_outcomes_uses_mcdiarmid():
    # k = 2000 outcomes: 2^k - 2 is astronomically large, McDiarmid is used (and stays finite)
    probs = np.full(2000, 1 / 2000)
    res = tv_estimate(np.full(2000, 500), probs, confidence=0.999)
    assert res.estimate == 0.0
    expected = 0.5 * (math.sqrt(1999 / 1e6) + math.sqrt(2 * math.log(1000) / 1e6))
    assert res.half_width == pytest.approx(expected)


@pytest.mark.parametrize("shift", [0.0, 0.1])
def test_tv_interval_coverage(shift):
    """The interval holds the true TV in >= 99% of 500 replicates (it is conservative: all of them)."""
    rng = np.random.default_rng(32)
    probs = np.array([0.1, 0.2, 0.3, 0.4, 0.0])
    law = probs.copy()
    law[3] -= shift
    law[4] += shift  # the sampler puts mass on an impossible outcome
    true_tv = 0.5 * np.abs(law - probs).sum()
    reps = 500
    inside = [
        (r.lower <= true_tv <= r.upper)
        for r in (tv_estimate(c, probs) for c in rng.multinomial(3000, law, size=reps))
    ]
    assert np.mean(inside) >= 0.99 - three_se(0.99, reps)


def test_tv_separates_a_wrong_law_at_large_n():
    rng = np.random.default_rng(33)
    probs = np.array([0.2, 0.5, 0.3])
    bug = np.array([0.28, 0.5, 0.22])  # SPEC §3: "resample from p" on the worked example, TV 0.08
    res = tv_estimate(rng.multinomial(100_000, bug), probs)
    assert res.lower > 0.07 and res.upper < 0.09
    assert res.null_mean < 0.01


# ----------------------------------------------------------------------------- planner


def test_planner_is_the_smallest_n_under_its_model():
    n = samples_needed(0.01, 1e-6, 0.9, 32)
    k, dof = 32, 31
    crit = sps.chi2.isf(1e-6, dof)

    def power(m):  # the planner's model written out: lam = 4 m (tv - 5 k / m)^2
        return sps.ncx2.sf(crit, dof, 4 * m * (0.01 - 5 * k / m) ** 2)

    assert power(n) >= 0.9 > power(n - 1)
    assert planned_power(n, 0.01, 1e-6, 32) == pytest.approx(power(n))


def test_planner_monotone():
    base = samples_needed(0.02, 1e-3, 0.8, 10)
    assert samples_needed(0.01, 1e-3, 0.8, 10) > base  # smaller TV
    assert samples_needed(0.02, 1e-6, 0.8, 10) > base  # smaller alpha
    assert samples_needed(0.02, 1e-3, 0.95, 10) > base  # more power
    assert samples_needed(0.02, 1e-3, 0.8, 100) > base  # more outcomes
    uniform = np.full(10, 0.1)
    assert samples_needed(0.02, 1e-3, 0.8, 10, null=uniform) <= base  # knowing the null helps


def test_detectable_tv_inverts_the_planner():
    n = samples_needed(0.01, 1e-6, 0.9, 32)
    assert detectable_tv(n, 1e-6, 0.9, 32) == pytest.approx(0.01, rel=1e-4)
    assert detectable_tv(10, 1e-6, 0.9, 32) == math.inf  # every outcome pooled


@pytest.mark.parametrize(
    ("tv", "alpha", "power", "n_outcomes", "match"),
    [
        (0.0, 0.01, 0.9, 3, "tv must be"),
        (0.1, 0.0, 0.9, 3, "alpha must be"),
        (0.1, 0.01, 1.0, 3, "power must be"),
        (0.1, 0.01, 0.9, 1, "n_outcomes must be an integer >= 2"),
    ],
)
def test_planner_bad_input(tv, alpha, power, n_outcomes, match):
    with pytest.raises(SpecrefError, match=match):
        samples_needed(tv, alpha, power, n_outcomes)


def least_favourable(null, tv):
    """The alternative that is hardest to detect at a given TV: null * (1 + c) on a set of
    null mass s ~ 1/2, null * (1 - c') on the rest (chi2 divergence tv^2 / (s (1 - s)) ~ 4 tv^2)."""
    order = np.argsort(-null)
    top = order[: int(np.searchsorted(np.cumsum(null[order]), 0.5)) + 1]
    s = null[top].sum()
    alt = null * (1 - tv / (1 - s))
    alt[top] = null[top] * (1 + tv / s)
    assert 0.5 * np.abs(alt - null).sum() == pytest.approx(tv)
    return alt


UNIFORM_32 = np.full(32, 1 / 32)
GEOMETRIC_40 = 0.7 ** np.arange(40) / (0.7 ** np.arange(40)).sum()  # many outcomes pooled at the planned N
SPEC_3 = np.array([0.2, 0.5, 0.3])


HEAVY_2_RARE_2000 = np.concatenate([[0.45, 0.45], np.full(2000, 0.1 / 2000)])


def shift_inside_rare(null, tv):
    """Move mass tv among the 2000 rare outcomes only: invisible while they are pooled."""
    alt = null.copy()
    alt[2:1002] += tv / 1000
    alt[1002:] -= tv / 1000
    return alt


def two_bin_shift(null, tv):
    alt = null.copy()
    alt[0] += tv
    alt[1] -= tv
    return alt


POWER_CASES = [
    # (name, null, alternative, tv, alpha, power) -- the headline: TV 0.01 at alpha 1e-6
    ("uniform32-least-favourable", UNIFORM_32, least_favourable(UNIFORM_32, 0.01), 0.01, 1e-6, 0.9),
    ("uniform32-two-bin-shift", UNIFORM_32, two_bin_shift(UNIFORM_32, 0.01), 0.01, 1e-6, 0.9),
    ("geometric40-least-favourable", GEOMETRIC_40, least_favourable(GEOMETRIC_40, 0.02), 0.02, 1e-6, 0.9),
    ("spec3-least-favourable", SPEC_3, least_favourable(SPEC_3, 0.08), 0.08, 1e-6, 0.9),
    ("spec3-resample-from-p-bug", SPEC_3, np.array([0.28, 0.5, 0.22]), 0.08, 1e-6, 0.9),
    ("shift-hidden-in-the-pool", HEAVY_2_RARE_2000, shift_inside_rare(HEAVY_2_RARE_2000, 0.05), 0.05, 1e-6, 0.9),
    ("geometric40-lower-power", GEOMETRIC_40, least_favourable(GEOMETRIC_40, 0.02), 0.02, 1e-2, 0.8),
]


def simulated_power(null, alt, n, alpha, seed):
    rng = np.random.default_rng(seed)
    return float(np.mean([g_test(c, null).rejects(alpha) for c in rng.multinomial(n, alt, size=R)]))


@pytest.mark.parametrize("use_null", [True, False], ids=["null-known", "null-unknown"])
@pytest.mark.parametrize(("name", "null", "alt", "tv", "alpha", "power"), POWER_CASES, ids=[c[0] for c in POWER_CASES])
def test_planned_n_reaches_the_stated_power(name, null, alt, tv, alpha, power, use_null):
    """Observed power over R = 400 seeded replicates >= power - 3 standard errors."""
    n = samples_needed(tv, alpha, power, len(null), null=null if use_null else None)
    observed = simulated_power(null, alt, n, alpha, seed=34)
    assert observed >= power - three_se(power, R), f"{name}: N = {n}, observed power {observed}"


@pytest.mark.parametrize(("name", "null", "alt", "tv", "alpha", "power"), [c for c in POWER_CASES if "least" in c[0]])
def test_plan_is_tight_for_the_least_favourable_alternative(name, null, alt, tv, alpha, power):
    """Half the planned N falls well short: the plan is not padded by a large factor."""
    n = samples_needed(tv, alpha, power, len(null), null=null)
    observed = simulated_power(null, alt, n // 2, alpha, seed=35)
    assert observed < power - three_se(power, R), f"{name}: N/2 = {n // 2} already has power {observed}"


# ----------------------------------------------------------------------------- report, classic experiment


def test_compare_counts_classic_experiment():
    """The SPEC §3 worked example, sampled with the vectorised step, is consistent with p;
    the "resample from p" bug at the same N is rejected."""
    p = np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    q = np.array([[0.6, 0.3, 0.1]])
    n = samples_needed(0.01, 1e-6, 0.9, 3)
    exp = first_token_frequencies(p, q, n, np.random.default_rng(36))
    ok = compare_counts(exp.counts, p[0])
    assert not ok.rejected and ok.tv.upper < 0.02
    assert f"N = {n}" in str(ok) and "consistent with" in str(ok)
    bug = compare_counts(np.random.default_rng(37).multinomial(n, [0.28, 0.5, 0.22]), p[0])
    assert bug.rejected and bug.tv.lower > 0.07
    assert "DIFFERS" in str(bug)


def test_single_outcome_null_is_planned_in_closed_form():
    """With one possible outcome, any sample elsewhere rejects: N = ceil(ln(1-power)/ln(1-tv)).

    Seeded simulation: R = 2,000 replicates of the planned N from an alternative that puts
    exactly mass tv elsewhere; the observed power must reach 0.9 - 3 standard errors.
    """
    import math

    from specref.verification.statistics.counts import g_test, samples_needed

    null = np.array([1.0, 0.0, 0.0])
    n = samples_needed(0.01, 1e-6, 0.9, 3, null=null)
    assert n == math.ceil(math.log(0.1) / math.log(0.99))
    rng = np.random.default_rng(3)
    hits = sum(g_test(rng.multinomial(n, [0.99, 0.005, 0.005]), null).rejects(1e-6) for _ in range(2000))
    assert hits / 2000 >= 0.9 - 3 * math.sqrt(0.09 / 2000)


def test_detectable_tv_of_a_point_mass_is_the_closed_form():
    """One possible outcome: n samples see TV t with power 1 - (1 - t)^n, so the detectable TV is
    1 - 0.1^(1/n); the planner's probe at an absurd TV once overflowed at n = 200."""
    import numpy as np

    from specref.verification.statistics.counts import detectable_tv

    for n in (50, 200, 2000):
        assert detectable_tv(n, 1e-6, 0.9, 2, null=np.array([1.0, 0.0])) == pytest.approx(1 - 0.1 ** (1 / n), rel=1e-6)
