"""specref.core.draws: the categorical draws and the rng, each computed a second, independent way.

Exact checks enumerate the draw's law over Fraction rows, or locate dyadic coins in
dyadic rows (every cumulative sum and ratio is exact in float64, so the expected token
is known with no rounding).  Seeded Monte Carlo checks state N and use scipy's
chi-square test at alpha = 1e-6.
"""

from fractions import Fraction as F

import array_api_strict as xps
import numpy as np
import pytest
from scipy import stats

from specref.core import draws, step
from specref.core.draws import categorical, check_rng, coerce_rng, draw
from specref.core.errors import SpecrefError
from specref.verification.laws.enumeration import law

ALPHA = 1e-6  # level of the seeded chi-square tests
WEIGHTS = np.array([0.0, 3.0, 0.0, 1.0, 4.0, 0.0])  # unnormalised, zeros inside and at the end (total 8)


def _expected_index(weights, u):
    """Second route, in rationals: the first j with u < cum_j / total (the inverse CDF)."""
    cum, total = [], sum(F(w) for w in weights)
    acc = F(0)
    for w in weights:
        acc += F(w)
        cum.append(acc / total)
    return next(j for j, c in enumerate(cum) if F(u) < c)


def _grid(n):
    return (np.arange(n) + 0.5) / n  # dyadic for n a power of 2: exact in float64


@pytest.mark.parametrize("scaled_coin", [False, True])
def test_categorical_on_dyadic_coins_is_the_exact_inverse_cdf(scaled_coin):
    u = _grid(256)
    if scaled_coin:
        got = categorical(WEIGHTS, u, xp=np, scaled_coin=True)
    else:
        got = categorical(np.broadcast_to(WEIGHTS, (u.size, WEIGHTS.size)), u, xp=np)
    assert got.dtype == np.int64 and got.shape == u.shape
    assert got.tolist() == [_expected_index(WEIGHTS, v) for v in u]


def test_categorical_forms_agree_and_run_on_array_api_strict():
    rows = np.random.default_rng(3).dirichlet(np.ones(7), size=5)
    rows[:, 2] = 0.0
    u = np.random.default_rng(4).random(5)
    for xp, asarray in ((np, np.asarray), (xps, xps.asarray)):
        per_row = categorical(asarray(rows), asarray(u), xp=xp)
        shared = [int(categorical(asarray(rows[b]), asarray(u[b:b + 1]), xp=xp, scaled_coin=True)[0])
                  for b in range(5)]
        assert np.asarray(per_row).tolist() == shared
        assert 2 not in shared  # a zero-weight token is never drawn


def test_comparison_form_on_one_shared_row_is_the_per_row_count_bit_for_bit():
    """1-D weights (searchsorted on cdf / total) against the [n, V] comparison count, coins on the edges too."""
    gen = np.random.default_rng(8)
    for _ in range(20):
        row = gen.dirichlet(np.ones(9)) * gen.uniform(0.1, 3)
        row[gen.random(9) < 0.3] = 0.0
        row[0] += 1e-3
        cdf = np.cumsum(row)
        u = np.concatenate([gen.random(500), cdf[:-1] / cdf[-1], np.nextafter(cdf[:-1] / cdf[-1], 0.0), [0.0]])
        u = u[u < 1]
        for xp, asarray in ((np, np.asarray), (xps, xps.asarray)):
            one = np.asarray(categorical(asarray(row), asarray(u), xp=xp))
            many = np.asarray(categorical(asarray(np.broadcast_to(row, (u.size, 9)).copy()), asarray(u), xp=xp))
            assert one.dtype == np.int64 and one.tolist() == many.tolist()


def test_categorical_comparison_form_has_the_exact_law_on_lazy_coins():
    """The exact enumerator's lazy uniforms: the law is the normalised rows, as rationals (TV == 0)."""
    rows = np.array([[F(0), F(2), F(1)], [F(5), F(0), F(3)]], dtype=object)  # unnormalised Fractions
    got = law(lambda rng: tuple(int(t) for t in categorical(rows, rng.random((2,)), xp=np)))
    want = {(i, j): rows[0, i] / 3 * rows[1, j] / 8 for i in range(3) for j in range(3) if rows[0, i] * rows[1, j]}
    assert dict(got) == want


@pytest.mark.parametrize("scaled_coin", [False, True])
def test_categorical_frequencies_match_the_row(scaled_coin):
    """N = 200,000 seeded coins; chi-square against WEIGHTS / 8 at alpha = 1e-6, and no zero-weight token."""
    n = 200_000
    u = np.random.default_rng(20261201).random(n)
    if scaled_coin:
        got = categorical(WEIGHTS, u, xp=np, scaled_coin=True)
    else:
        got = categorical(np.broadcast_to(WEIGHTS, (n, WEIGHTS.size)), u, xp=np)
    counts = np.bincount(got, minlength=WEIGHTS.size)
    support = WEIGHTS > 0
    assert counts[~support].sum() == 0
    assert stats.chisquare(counts[support], n * WEIGHTS[support] / WEIGHTS.sum()).pvalue > ALPHA


def test_scaled_coin_never_returns_a_trailing_zero_token():
    """u just below 1 with u * total rounding up to total: the clip returns the last positive token."""
    row = np.array([0.1, 0.2, 0.7, 0.0, 0.0])
    u = np.array([np.nextafter(1.0, 0.0), 0.0])
    assert categorical(row, u, xp=np, scaled_coin=True).tolist() == [2, 0]
    assert categorical(np.stack([row, row]), u, xp=np).tolist() == [2, 0]


def test_draw_keeps_exact_rows_exact_and_matches_float_rows_on_a_generator():
    row = np.array([F(1, 6), F(0), F(1, 2), F(1, 3)], dtype=object)
    assert dict(law(lambda rng: draw(rng, row))) == {0: F(1, 6), 2: F(1, 2), 3: F(1, 3)}
    exact = [draw(np.random.default_rng(s), row) for s in range(50)]
    floats = [draw(np.random.default_rng(s), row.astype(np.float64)) for s in range(50)]
    assert exact == floats


def test_coerce_rng_turns_seeds_into_generators_and_leaves_the_rest():
    want = np.random.default_rng(7).random(4)
    for seed in (7, np.int64(7)):
        assert np.array_equal(coerce_rng(seed).random(4), want)
    gen = np.random.default_rng(0)
    assert coerce_rng(gen) is gen and coerce_rng(gen, check=True) is gen
    assert coerce_rng(True) is True  # a bool is not a seed; unchecked, it comes back as it is
    for bad in (True, None, "seed", object()):
        with pytest.raises(SpecrefError, match="rng must be a numpy.random.Generator, an int seed or the enumerator"):
            coerce_rng(bad, check=True)


def test_step_reexports_the_one_check_rng_and_draw():
    assert step.check_rng is draws.check_rng is check_rng
    assert step.draw is draws.draw is draw
    with pytest.raises(TypeError, match="got the legacy RandomState"):
        check_rng(np.random.RandomState(0))
