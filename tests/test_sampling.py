"""The sampling rules of SPEC §2: order, boundary cases, backends, bad input."""

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig, process, process_probs


def frac_row(*values):
    return np.array([[F(v) for v in values]], dtype=object)


def kept(row):
    return {i for i, v in enumerate(np.asarray(row).ravel()) if v > 0}


# ---------------------------------------------------------------- the order is pinned
# Each example is built so that the documented order and the swapped order disagree.


def test_top_k_runs_before_top_p():
    p = frac_row("2/5", "3/10", "1/5", "1/10")
    # top-k(2) first: [4/7, 3/7]; then top-p(1/2): 4/7 already reaches 1/2 -> only token 0.
    # (top-p first would keep {0, 1} and top-k would change nothing.)
    out = process_probs(p, SamplingConfig(top_k=2, top_p=F(1, 2)))
    assert out.tolist() == [[1, 0, 0, 0]]


def test_top_p_runs_before_min_p():
    p = frac_row("2/5", "7/20", "1/4")
    # top-p(1/2) first keeps {0, 1} (2/5 < 1/2 <= 3/4); min-p(7/10) then needs >= 0.28 of
    # 8/15 and keeps both.  (min-p first keeps {0, 1}, renormalised [8/15, 7/15], and top-p
    # then keeps only token 0.)
    out = process_probs(p, SamplingConfig(top_p=F(1, 2), min_p=F(7, 10)))
    assert out.tolist() == [[F(8, 15), F(7, 15), 0]]


def test_temperature_runs_before_top_p():
    p = frac_row("1/2", "3/10", "1/5")
    # T = 1/2 squares and renormalises: [25/38, 9/38, 4/38]; top-p(3/5) then keeps token 0.
    # (top-p first would keep {0, 1}.)
    out = process_probs(p, SamplingConfig(temperature=F(1, 2), top_p=F(3, 5)))
    assert out.tolist() == [[1, 0, 0]]


# ---------------------------------------------------------------- two routes agree

logit_rows = st.lists(st.floats(-6, 6, allow_nan=False), min_size=2, max_size=8).map(
    lambda xs: np.array(xs, dtype=np.float64)
)
configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.5, 0.7, 1.0, 1.5]),
    top_k=st.none() | st.integers(1, 8),
    top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.2]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)


@settings(max_examples=200, deadline=None)
@given(logit_rows, configs)
def test_logits_route_equals_probability_route(logits, config):
    """softmax(l / T) then rules == (softmax(l)) ** (1/T) then rules: two computations."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    a = process(logits, config)
    b = process_probs(p, config)
    # a rounding flip at an exact boundary can change the kept set: such draws are
    # discarded (hypothesis fails the test if it has to discard too many)
    assume(kept(a) == kept(b))
    np.testing.assert_allclose(a, b, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(logit_rows, configs)
def test_rule_properties(logits, config):
    out = process(logits, config)
    scaled = np.exp((logits - logits.max()) / config.temperature)
    scaled /= scaled.sum()
    assert np.all(out >= 0) and abs(out.sum() - 1) < 1e-12
    s = kept(out)
    assert int(np.argmax(logits)) in s  # the most probable token survives every rule
    # kept set is an upper set of the scaled distribution: nothing kept is less likely
    # than something dropped
    dropped = set(range(len(logits))) - s
    if dropped:
        assert min(scaled[list(s)]) >= max(scaled[list(dropped)]) - 1e-15
    if config.top_k is not None:
        # ties at the boundary are kept, so more than k only when tied with the k-th
        kth = np.sort(scaled)[::-1][min(config.top_k, len(logits)) - 1]
        assert all(scaled[i] >= kth - 1e-15 for i in s)
    if config.min_p > 0:
        # min-p is the last rule: every kept token is >= min_p x the kept maximum
        assert all(out[i] >= config.min_p * out.max() - 1e-12 for i in s)
    # surviving tokens keep their relative odds: out is the scaled law restricted to s
    ratio = out[list(s)] / scaled[list(s)]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)


def test_top_p_keeps_the_crossing_token_and_ties():
    p = frac_row("1/2", "1/5", "1/5", "1/10")
    # 1/2 < 3/5 so the crossing token is a 1/5 one; its tie is kept too
    assert kept(process_probs(p, SamplingConfig(top_p=F(3, 5)))) == {0, 1, 2}
    # 1/2 reaches 1/2 exactly: nothing else
    assert kept(process_probs(p, SamplingConfig(top_p=F(1, 2)))) == {0}


def test_top_k_keeps_ties_at_the_boundary():
    p = frac_row("2/5", "1/5", "1/5", "1/5")
    assert kept(process_probs(p, SamplingConfig(top_k=2))) == {0, 1, 2, 3}
    assert kept(process_probs(p, SamplingConfig(top_k=1))) == {0}


def test_min_p_boundary_is_inclusive():
    p = frac_row("1/2", "1/4", "1/4")
    assert kept(process_probs(p, SamplingConfig(min_p=F(1, 2)))) == {0, 1, 2}
    assert kept(process_probs(p, SamplingConfig(min_p=F(3, 5)))) == {0}


def test_greedy_is_one_hot_with_ties_to_lowest_id():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(process(logits, GREEDY), [[0, 1, 0, 0], [1, 0, 0, 0]])
    assert process_probs(frac_row("1/3", "1/3", "1/3"), GREEDY).tolist() == [[1, 0, 0]]


def test_exact_rows_stay_exact():
    p = frac_row("1/6", "1/3", "1/2")
    out = process_probs(p, SamplingConfig(temperature=F(1, 2), top_k=2))
    assert out.dtype == object and out.tolist() == [[0, F(4, 13), F(9, 13)]]
    assert sum(out[0]) == 1


def test_batched_shapes_are_kept():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5))
    out = process(logits, SamplingConfig(top_p=0.7))
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out.sum(-1), 1)
    np.testing.assert_array_equal(out[1, 2], process(logits[1, 2], SamplingConfig(top_p=0.7)))


def test_minus_inf_logits_are_masked_tokens():
    out = process(np.array([0.0, -np.inf, 1.0]), SamplingConfig())
    assert out[1] == 0 and abs(out.sum() - 1) < 1e-15


def test_tiny_temperature_does_not_overflow():
    out = process(np.array([1.0, 1.0 + 1e-9, 0.0]), SamplingConfig(temperature=1e-300))
    assert np.all(np.isfinite(out)) and out[1] == 1


# ---------------------------------------------------------------- backends


def test_array_api_strict_backend_matches_numpy():
    xps = pytest.importorskip("array_api_strict")
    logits = np.random.default_rng(1).normal(size=(4, 7))
    for config in [SamplingConfig(), SamplingConfig(temperature=0.6, top_k=3, top_p=0.8, min_p=0.1), GREEDY]:
        a = process(logits, config)
        b = process(xps.asarray(logits), config)
        assert type(b).__module__.startswith("array_api_strict")
        np.testing.assert_allclose(np.asarray(b), a, atol=1e-15)


def test_cupy_backend_matches_numpy():
    cp = pytest.importorskip("cupy")
    logits = np.random.default_rng(1).normal(size=(4, 7))
    config = SamplingConfig(temperature=0.6, top_k=3, top_p=0.8, min_p=0.1)
    np.testing.assert_allclose(process(cp.asarray(logits), config).get(), process(logits, config), atol=1e-15)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"min_p": -0.2}, "min_p"),
    ],
)
def test_invalid_settings_are_named(kwargs, word):
    with pytest.raises(SpecrefError, match=word):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize(
    "logits, word",
    [
        (np.array([0.0, np.nan, 1.0]), "NaN"),
        (np.array([0.0, np.inf]), r"\+inf"),
        (np.array([-np.inf, -np.inf]), "all -inf"),
        (np.zeros((2, 0)), "logits"),
        (np.float64(1.0), "logits"),
    ],
)
def test_bad_logits_are_refused(logits, word):
    with pytest.raises(SpecrefError, match=word):
        process(logits, SamplingConfig())


def test_bad_probability_rows_are_refused():
    with pytest.raises(SpecrefError, match="sums to"):
        process_probs(np.array([0.5, 0.6]), SamplingConfig())
    with pytest.raises(SpecrefError, match="negative"):
        process_probs(np.array([1.5, -0.5]), SamplingConfig())
    with pytest.raises(SpecrefError, match="not exactly 1"):
        process_probs(frac_row("1/3", "1/3"), SamplingConfig())
    with pytest.raises(SpecrefError, match="temperature"):
        process_probs(frac_row("1/2", "1/2"), SamplingConfig(temperature=0.7))
    with pytest.raises(SpecrefError, match="config"):
        process(np.zeros(3), {"temperature": 1})
