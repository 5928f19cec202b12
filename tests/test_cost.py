"""specref.core.cost against SPEC §8, Leviathan et al. (§3, Table 1) and the symbolic formulas."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

from specref.core.cost import best_k, best_k_table, expected_tokens, ops_factor, speed_ratio
from specref.core.errors import SpecrefError

F = Fraction


# --- SPEC §8 worked example -------------------------------------------------------------


def test_worked_example_exact():
    assert expected_tokens(F(4, 5), 4) == F(2101, 625)
    assert speed_ratio(F(4, 5), 4, F(1, 10)) == F(2101, 625) / F(7, 5)
    assert round(float(speed_ratio(F(4, 5), 4, F(1, 10))), 5) == 2.40114
    assert round(float(speed_ratio(F(1, 5), 4, F(1, 10))), 5) == 0.89257


def test_worked_example_float():
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert speed_ratio(0.8, 4, 0.1) == pytest.approx(2.401142857142857, abs=1e-12)
    assert speed_ratio(0.2, 4, 0.1) < 1  # slower than plain decoding


# --- Leviathan et al. --------------------------------------------------------------------

# Table 1 as published (c = ĉ = 0): (α, γ) -> (speed, ops).  Checked to 2 decimals.
TABLE_1 = [
    (0.6, 2, 1.96, 1.53),
    (0.7, 3, 2.53, 1.58),
    (0.8, 2, 2.44, 1.23),
    (0.8, 5, 3.69, 1.63),
    (0.9, 2, 2.71, 1.11),
    (0.9, 10, 6.86, 1.60),
]


@pytest.mark.parametrize("alpha, gamma, speed, ops", TABLE_1)
def test_table_1(alpha, gamma, speed, ops):
    assert speed_ratio(alpha, gamma, 0) == pytest.approx(speed, abs=0.005)
    assert ops_factor(alpha, gamma, 0) == pytest.approx(ops, abs=0.005)


def test_best_k_for_alpha_08_c_01_is_6():
    k, s = best_k(0.8, 0.1)
    assert k == 6 and s == pytest.approx(2.470, abs=5e-4)
    assert best_k(F(4, 5), F(1, 10)) == (6, F(61741, 25000))


def test_bigram_draft_example():
    # SPEC §10: α ≈ 0.2, γ = 3, c ≈ 0 gives ≈ 1.25x
    assert speed_ratio(0.2, 3, 0) == pytest.approx(1.25, abs=0.005)


def test_one_draft_token_pays_off_exactly_when_alpha_exceeds_c():
    grid = [F(i, 10) for i in range(11)]
    for alpha in grid:
        for c in grid:
            assert (speed_ratio(alpha, 1, c) > 1) == (alpha > c)
            assert speed_ratio(alpha, 1, c) == (1 + alpha) / (1 + c)


def test_corollary_3_9():
    # α > c: the best K gives at least (1 + α)/(1 + c)
    for alpha, c in [(F(1, 2), F(1, 10)), (F(9, 10), F(1, 2)), (F(3, 10), F(1, 5))]:
        assert best_k(alpha, c)[1] >= (1 + alpha) / (1 + c)


def test_ops_factor_formula():
    alpha, k, c_hat = F(7, 10), 3, F(1, 4)
    assert ops_factor(alpha, k, c_hat) == (1 - alpha) * (k * c_hat + k + 1) / (1 - alpha ** (k + 1))


# --- edges and types ---------------------------------------------------------------------


def test_alpha_one_and_zero():
    assert expected_tokens(1, 5) == 6 and isinstance(expected_tokens(1, 5), Fraction)
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0, 5) == 1
    assert ops_factor(1, 4, 0) == 1  # every position is useful
    assert speed_ratio(0, 3, F(1, 10)) == F(1, F(13, 10))


def test_exact_in_exact_out_float_in_float_out():
    assert isinstance(speed_ratio(F(1, 3), 2, F(1, 7)), Fraction)
    assert isinstance(speed_ratio(F(1, 3), 2, 0.1), float)
    assert isinstance(expected_tokens(0.5, 2), float)
    assert isinstance(speed_ratio(np.float64(0.5), np.int64(2), 0), float)


def test_float_is_stable_near_alpha_one():
    alpha = 1 - 1e-12  # the closed form (1 - α^{K+1})/(1 - α) loses most digits here
    assert expected_tokens(alpha, 4) == pytest.approx(5, abs=1e-9)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: expected_tokens(-0.1, 2), "alpha"),
        (lambda: expected_tokens(1.5, 2), "alpha"),
        (lambda: expected_tokens(math.nan, 2), "alpha"),
        (lambda: expected_tokens("0.5", 2), "alpha"),
        (lambda: expected_tokens(True, 2), "alpha"),
        (lambda: expected_tokens(0.5, 0), "k"),
        (lambda: expected_tokens(0.5, 1.5), "k"),
        (lambda: expected_tokens(0.5, True), "k"),
        (lambda: speed_ratio(0.5, 2, -0.1), "c"),
        (lambda: speed_ratio(0.5, 2, math.inf), "c"),
        (lambda: ops_factor(0.5, 2, -1), "c_hat"),
        (lambda: best_k(0.5, 0.1, k_max=0), "k_max"),
        (lambda: best_k(2, 0.1), "alpha"),
    ],
)
def test_bad_input_is_refused_by_name(call, name):
    with pytest.raises(SpecrefError, match=rf"^{name} must"):
        call()


# --- best K ------------------------------------------------------------------------------


def _brute_force_best(alpha, c, k_max):
    ratios = [speed_ratio(alpha, k, c) for k in range(1, k_max + 1)]
    best = max(ratios)
    return ratios.index(best) + 1, best  # first (smallest) K on ties


def test_best_k_equals_brute_force():
    for alpha in [F(i, 10) for i in range(0, 11)]:
        for c in [F(0), F(1, 100), F(1, 10), F(1, 2), F(1), F(3, 2)]:
            assert best_k(alpha, c, k_max=60) == _brute_force_best(alpha, c, 60), (alpha, c)


def test_best_k_ties_go_to_the_smaller_k():
    assert best_k(0, 0) == (1, 1)  # S = 1 for every K
    assert best_k(1, 1, k_max=10) == (1, 1)  # (K + 1)/(1 + K) = 1 for every K


def test_best_k_is_capped_when_speculation_always_pays():
    assert best_k(F(1, 2), 0, k_max=10)[0] == 10  # c = 0: more K never hurts
    assert best_k(1, F(1, 2), k_max=7)[0] == 7


def test_best_k_table():
    table = best_k_table([0.6, 0.8], [0.05, 0.1])
    assert set(table) == {(0.6, 0.05), (0.6, 0.1), (0.8, 0.05), (0.8, 0.1)}
    assert table[(0.8, 0.1)][0] == 6


# --- cross-check against the symbolic formulas at random rational points -------------------


def test_agrees_with_sympy_closed_forms_at_random_rational_points():
    a, c, c_hat = sp.symbols("alpha c c_hat", positive=True)
    rng = random.Random(3)
    for _ in range(60):
        alpha = F(rng.randint(0, 29), 30)  # α < 1: the closed form is defined
        k, cost, ops_cost = rng.randint(1, 12), F(rng.randint(0, 20), 40), F(rng.randint(0, 20), 40)
        point = {a: sp.Rational(alpha), c: sp.Rational(cost), c_hat: sp.Rational(ops_cost)}
        length = (1 - a ** (k + 1)) / (1 - a)
        want = {
            "E": length.subs(point),
            "S": (length / (1 + k * c)).subs(point),
            "ops": ((1 - a) * (k * c_hat + k + 1) / (1 - a ** (k + 1))).subs(point),
        }
        got = {
            "E": expected_tokens(alpha, k),
            "S": speed_ratio(alpha, k, cost),
            "ops": ops_factor(alpha, k, ops_cost),
        }
        for key in want:
            assert got[key] == F(int(want[key].p), int(want[key].q)), (key, alpha, k, cost)
            as_float = {"E": expected_tokens, "S": speed_ratio, "ops": ops_factor}[key]
            args = (float(alpha), k) if key == "E" else (float(alpha), k, float(cost if key == "S" else ops_cost))
            assert as_float(*args) == pytest.approx(float(want[key]), rel=1e-12)
