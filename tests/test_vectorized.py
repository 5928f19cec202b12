"""The vectorised sampler against laws derived by hand (SPEC §3).

Monte Carlo checks are seeded; each states its N and its tolerance.  Per-outcome
checks allow 5 standard errors (sqrt(P (1 - P) / N)); joint checks use the pooled
G-test of specref.verification.statistics.counts at alpha = 1e-6.  Backends: numpy and array_api_strict
(cupy when installed).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.decoding.vectorized import RESIDUAL_MASS_TOL, first_token_frequencies, sample_steps
from specref.verification.statistics.counts import g_test

Z_TOL = 5.0  # standard errors allowed per outcome
ALPHA = 1e-6  # level of the joint G-tests


@pytest.fixture(params=["numpy", "array_api_strict", "cupy"])
def xp(request):
    if request.param == "numpy":
        return np
    return pytest.importorskip(request.param)


def rows(seed, k, v, *, zeros=0):
    """Target [K+1, V] and draft [K, V] rows from a seeded Dirichlet, ``zeros`` entries per row set to 0."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(v), size=k + 1)
    q = rng.dirichlet(np.ones(v), size=k)
    for r in (*p, *q):
        r[rng.choice(v, size=zeros, replace=False)] = 0.0
        r /= r.sum()
    return p, q


def host(a):
    return to_numpy(a)


def assert_close_to_law(counts, law, n, what):
    """Every frequency within Z_TOL standard errors of the exact law (and no sample where law == 0)."""
    counts = np.asarray(counts, dtype=float)
    law = np.asarray(law, dtype=float)
    assert counts[law == 0].sum() == 0, f"{what}: samples on probability-0 outcomes"
    se = np.sqrt(law * (1 - law) / n)
    z = np.abs(counts / n - law) / np.where(se > 0, se, 1.0)
    assert z.max() <= Z_TOL, f"{what}: max deviation {z.max():.2f} standard errors > {Z_TOL} (N = {n})"


# ----------------------------------------------------------------------------- exact laws, by hand


def acceptance_rates(p, q):
    """beta_i = P(accept position i | reached) = sum_x q_i(x) min(1, p_i(x)/q_i(x)) = sum min(p_i, q_i)."""
    return np.minimum(p[:-1], q).sum(axis=1)


def exact_length_law(p, q):
    """P(n_emitted = j + 1): j acceptances, then a rejection (j < K) or the bonus (j = K)."""
    beta = acceptance_rates(p, q)
    k = q.shape[0]
    law = [np.prod(beta[:j]) * (1 - beta[j]) for j in range(k)] + [np.prod(beta)]
    return np.array(law)


def exact_block_law(p, q):
    """Law of the whole emitted block, written from the algorithm (not from the code):

    P(x_1..x_j accepted, then y) = prod_i q_i(x_i) min(1, p_i(x_i)/q_i(x_i))
        * (j < K:  P(reject at j+1) * residual_{j+1}(y),  P(reject) = sum_x q(x) (1 - min(1, p/q)))
        * (j = K:  p_{K+1}(y)).
    """
    k, v = q.shape
    law = {}
    for j in range(k + 1):
        for prefix in itertools.product(range(v), repeat=j):
            reach = 1.0
            for i, x in enumerate(prefix):
                reach *= q[i, x] * min(1.0, p[i, x] / q[i, x]) if q[i, x] > 0 else 0.0
            if j < k:
                with np.errstate(divide="ignore", invalid="ignore"):
                    keep = np.where(q[j] > 0, np.minimum(1.0, p[j] / q[j]), 0.0)
                reject = float((q[j] * (1 - keep)).sum())
                resid = np.maximum(p[j] - q[j], 0.0)
                final = resid / resid.sum() if resid.sum() > 0 else np.zeros(v)
                last = reject * final
            else:
                last = p[k]
            for y in range(v):
                if reach * last[y] > 0:
                    law[(*prefix, y)] = reach * last[y]
    return law


def block_counts(tokens, n_emitted):
    """Counter of emitted blocks (tuples) from the sampler's padded output."""
    tokens, n_emitted = host(tokens), host(n_emitted)
    keys, counts = np.unique(tokens, axis=0, return_counts=True)
    out = {}
    for key, c in zip(keys, counts):
        length = int((key >= 0).sum())
        out[tuple(int(t) for t in key[:length])] = int(c)
    return out


# ----------------------------------------------------------------------------- laws


def test_first_token_law_is_p1(xp):
    p, q = rows(1, k=3, v=6)
    n = 200_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(11))
    first = host(out.tokens)[:, 0]
    assert_close_to_law(np.bincount(first, minlength=6), p[0], n, "first token")


def test_block_length_law(xp):
    p, q = rows(2, k=4, v=5)
    n = 200_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(12))
    lengths = host(out.n_emitted)
    assert lengths.min() >= 1 and lengths.max() <= 5
    assert_close_to_law(np.bincount(lengths - 1, minlength=5), exact_length_law(p, q), n, "block length")


def test_whole_block_law_with_zeros(xp):
    """K = 2, V = 3 with zeros in p and q: every emitted block against its exact probability."""
    p, q = rows(3, k=2, v=3, zeros=1)
    law = exact_block_law(p, q)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    n = 200_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(13))
    seen = block_counts(out.tokens, out.n_emitted)
    assert set(seen) <= set(law), f"impossible blocks emitted: {set(seen) - set(law)}"
    keys = sorted(law)
    counts = np.array([seen.get(key, 0) for key in keys])
    probs = np.array([law[key] for key in keys])
    assert_close_to_law(counts, probs, n, "emitted block")
    assert not g_test(counts, probs / probs.sum()).rejects(ALPHA)


def test_spec_worked_example_classic_experiment():
    """SPEC §3: p = [1/5, 1/2, 3/10], q = [3/5, 3/10, 1/10]; the first token has law p (N = 1e6)."""
    p = np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    q = np.array([[0.6, 0.3, 0.1]])
    res = first_token_frequencies(p, q, 1_000_000, np.random.default_rng(14))
    assert res.n == 1_000_000 and res.counts.sum() == res.n
    np.testing.assert_allclose(res.std_err, np.sqrt(p[0] * (1 - p[0]) / res.n))
    assert res.max_abs_z <= Z_TOL, str(res)
    # the classic bug ("resample from p") gives [0.28, 0.50, 0.22]: 80 standard errors away on token 0
    assert abs(0.28 - res.frequencies[0]) / res.std_err[0] > 50
    assert "N = 1000000" in str(res)


def test_first_token_frequencies_backends(xp):
    p, q = rows(4, k=2, v=4)
    res = first_token_frequencies(xp.asarray(p), xp.asarray(q), 100_000, np.random.default_rng(15))
    assert isinstance(res.counts, np.ndarray) and res.counts.sum() == 100_000
    np.testing.assert_allclose(res.target, p[0])
    assert res.max_abs_z <= Z_TOL, str(res)


# ----------------------------------------------------------------------------- SPEC §3 edge cases


def test_p_equals_q_accepts_everything(xp):
    p, _ = rows(5, k=3, v=5)
    q = p[:3].copy()
    n = 50_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(16))
    assert np.all(host(out.n_emitted) == 4)
    bonus = host(out.tokens)[:, 3]
    assert_close_to_law(np.bincount(bonus, minlength=5), p[3], n, "bonus token")


def test_draft_token_with_p_zero_is_always_rejected(xp):
    p = np.array([[0.0, 0.6, 0.4], [0.3, 0.3, 0.4]])
    q = np.array([[0.5, 0.25, 0.25]])
    n = 50_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(17), draft_tokens=[0])
    assert np.all(host(out.n_emitted) == 1)
    resid = np.maximum(p[0] - q[0], 0)
    assert_close_to_law(np.bincount(host(out.tokens)[:, 0], minlength=3), resid / resid.sum(), n, "residual")


def test_fixed_draft_tokens_acceptance(xp):
    """Fixed tokens, one per step ([n, K]): position 1 accepted with probability min(1, p/q)."""
    p = np.array([[0.1, 0.5, 0.4], [0.2, 0.2, 0.6], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.4, 0.5, 0.1], [0.25, 0.25, 0.5]])
    n = 90_000
    fixed = np.tile(np.array([[0, 2], [1, 0], [2, 1]]), (n // 3, 1))
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(18), draft_tokens=xp.asarray(fixed))
    acc1 = host(out.n_emitted) >= 2
    for tok in range(3):
        sel = fixed[:, 0] == tok
        rate = min(1.0, p[0, tok] / q[0, tok])
        m = int(sel.sum())
        got = acc1[sel].mean()
        assert abs(got - rate) <= Z_TOL * max(np.sqrt(rate * (1 - rate) / m), 1 / m), (tok, got, rate)
    kept = host(out.tokens)[acc1]
    np.testing.assert_array_equal(kept[:, 0], fixed[acc1, 0])


def test_first_position_rejection_and_k_equals_1(xp):
    """K = 1: blocks are [y] (rejected, y ~ residual) or [x, bonus]; exact law of both."""
    p = np.array([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]])
    q = np.array([[0.6, 0.3, 0.1]])
    law = exact_block_law(p, q)
    n = 100_000
    out = sample_steps(xp.asarray(p), xp.asarray(q), n, np.random.default_rng(19))
    seen = block_counts(out.tokens, out.n_emitted)
    keys = sorted(law)
    assert set(seen) <= set(keys)
    assert_close_to_law([seen.get(key, 0) for key in keys], [law[key] for key in keys], n, "K = 1 block")


class ConstantRng:
    """Every uniform equals ``value``: forces a branch that has probability ~0 with a real rng."""

    def __init__(self, value):
        self.value = value

    def random(self, size):
        return np.full(size, self.value)


U_MAX = 1.0 - 2.0**-53  # the largest float64 below 1


def test_rounding_only_residual_samples_p(xp):
    """p ~ q up to rounding: a forced rejection finds residual mass 1e-15 <= tol and samples p_1."""
    p = np.array([[0.5 + 1e-15, 0.5 - 1e-15], [0.5, 0.5]])
    q = np.array([[0.5, 0.5]])
    assert np.maximum(p[0] - q[0], 0).sum() <= RESIDUAL_MASS_TOL
    out = sample_steps(xp.asarray(p), xp.asarray(q), 4, ConstantRng(U_MAX), draft_tokens=[1])
    assert np.all(host(out.n_emitted) == 1)  # the forced rejection happened
    # the residual [1e-15, 0] would give token 0; p_1 at u = U_MAX gives its last token, 1
    np.testing.assert_array_equal(host(out.tokens), [[1, -1]] * 4)


def test_real_residual_is_used_above_tolerance(xp):
    p = np.array([[0.6, 0.4], [0.5, 0.5]])
    q = np.array([[0.5, 0.5]])
    out = sample_steps(xp.asarray(p), xp.asarray(q), 3, ConstantRng(U_MAX), draft_tokens=[1])
    np.testing.assert_array_equal(host(out.tokens), [[0, -1]] * 3)  # residual [0.1, 0] -> token 0


def test_extreme_uniforms_never_give_zero_probability_tokens(xp):
    """u = 0 and u = 1 - 2**-53 everywhere: tokens stay in range and off probability-0 entries."""
    p, q = rows(6, k=3, v=6, zeros=2)
    for u in (0.0, U_MAX):
        out = sample_steps(xp.asarray(p), xp.asarray(q), 2, ConstantRng(u))
        tokens, lengths = host(out.tokens), host(out.n_emitted)
        for row, length in zip(tokens, lengths):
            assert np.all(row[length:] == -1)
            for i, t in enumerate(row[:length]):
                assert 0 <= t < 6 and p[i, t] > 0, (u, row)
                if i < length - 1:
                    assert q[i, t] > 0


def test_padding_and_lengths(xp):
    p, q = rows(7, k=4, v=8)
    tokens, lengths = sample_steps(xp.asarray(p), xp.asarray(q), 5_000, np.random.default_rng(20))
    tokens, lengths = host(tokens), host(lengths)
    assert tokens.shape == (5_000, 5) and lengths.shape == (5_000,)
    assert np.array_equal((tokens >= 0).sum(axis=1), lengths)
    assert np.all((tokens >= 0) == (np.arange(5)[None, :] < lengths[:, None]))


def test_same_seed_same_steps_on_every_backend(xp):
    """The uniforms come from the host rng, so every backend emits the same tokens for one seed."""
    p, q = rows(8, k=3, v=7)
    ref = sample_steps(p, q, 2_000, np.random.default_rng(21))
    out = sample_steps(xp.asarray(p), xp.asarray(q), 2_000, np.random.default_rng(21))
    np.testing.assert_array_equal(host(out.tokens), ref.tokens)
    np.testing.assert_array_equal(host(out.n_emitted), ref.n_emitted)


def test_fraction_rows_are_accepted():
    F = Fraction
    p = np.array([[F(1, 5), F(1, 2), F(3, 10)], [F(1, 3), F(1, 3), F(1, 3)]], dtype=object)
    q = np.array([[F(3, 5), F(3, 10), F(1, 10)]], dtype=object)
    ref = sample_steps(p.astype(float), q.astype(float), 100, np.random.default_rng(22))
    out = sample_steps(p, q, 100, np.random.default_rng(22))
    np.testing.assert_array_equal(out.tokens, ref.tokens)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(draft_tokens=[1]), "probability 0"),  # q_draft[0, 1] == 0
        (dict(draft_tokens=[3]), "out of range"),
        (dict(draft_tokens=[0, 0]), "must hold 1 tokens"),
        (dict(draft_tokens=np.zeros((5, 1), dtype=np.int64)), r"shape \[1\] or \[4, 1\]"),
        (dict(n=0), "n must be an integer >= 1"),
        (dict(rng=42), "rng must be a numpy.random.Generator"),
    ],
)
def test_bad_input(kwargs, match):
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[1.0, 0.0, 0.0]])
    args = dict(n=4, rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(SpecrefError, match=match):
        sample_steps(p, q, args.pop("n"), args.pop("rng"), **args)


def test_bad_rows():
    p = np.array([[0.5, 0.5], [0.2, 0.8]])
    with pytest.raises(SpecrefError, match="q_draft must have shape"):
        sample_steps(p, np.array([[0.5, 0.5], [0.5, 0.5]]), 3, np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="K\\+1 >= 2 rows"):
        sample_steps(p[:1], p[:0], 3, np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="sums to"):
        sample_steps(np.array([[0.5, 0.6], [0.5, 0.5]]), p[:1], 3, np.random.default_rng(0))
