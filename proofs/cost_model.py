"""The cost model of SPEC §8 and the numbers of SPEC §10, derived symbolically.

Leviathan, Kalman & Matias (2022) §3: each draft token is accepted independently
with probability ``α``; one target call costs 1 and one draft token ``c``.  An
iteration emits ``L`` tokens: ``L = n <= K`` when the first rejection is at position
``n`` (``n - 1`` accepted tokens and one residual token), probability
``α^{n-1}(1 - α)``; ``L = K + 1`` when all ``K`` are accepted (with the bonus token),
probability ``α^K``.  Everything here is written from that law, independently of
:mod:`specref.core.cost` (which :mod:`proofs.cross_check` then compares against it).
"""

from __future__ import annotations

from fractions import Fraction

import sympy as sp

from proofs.core import COUNTEREXAMPLE, PROVED, UNPROVED, CaseOutcome, Result, check_equal, is_identically_zero

__all__ = [
    "expected_length_from_law",
    "geometric_sum",
    "closed_form",
    "speed",
    "ops",
    "speed_exact",
    "certified_best_k",
    "prove_expected_length",
    "prove_cost_example",
    "prove_one_draft_token",
    "prove_table_1",
    "prove_best_k",
    "TABLE_1",
    "BEST_K_ALPHAS",
    "BEST_K_COSTS",
]

alpha = sp.Symbol("alpha", positive=True)  # 0 < α; α < 1 where a proof divides by 1 − α
c = sp.Symbol("c", nonnegative=True)  # draft cost per token, target call = 1
c_hat = sp.Symbol("c_hat", nonnegative=True)  # the same in arithmetic operations
K = sp.Symbol("K", integer=True, nonnegative=True)
n = sp.Symbol("n", integer=True, positive=True)  # a length, 1..K
i = sp.Symbol("i", integer=True, nonnegative=True)  # an exponent, 0..K


def length_term(n_):
    """``n·P(L = n)`` for ``n <= K``: first rejection at position ``n``."""
    return n_ * alpha ** (n_ - 1) * (1 - alpha)


def expected_length_from_law(k):
    """``E[L] = Σ_{n=1}^{K} n·α^{n-1}(1 - α) + (K + 1)·α^K``."""
    return sp.Sum(length_term(n), (n, 1, k)) + (k + 1) * alpha**k


def geometric_sum(k):
    """``Σ_{i=0}^{K} α^i`` (SPEC §8)."""
    return sp.Sum(alpha**i, (i, 0, k))


def closed_form(k, a=alpha):
    """``(1 - α^{K+1}) / (1 - α)`` (Leviathan eq. 1), for ``α != 1``."""
    return (1 - a ** (k + 1)) / (1 - a)


def speed(k, a=alpha, cost=c):
    """``S = E[L] / (1 + K·c)``: tokens per unit of cost, plain decoding being 1 (Thm 3.8)."""
    return closed_form(k, a) / (1 + k * cost)


def ops(k, a=alpha, cost=c_hat):
    """``(1 - α)(K·ĉ + K + 1) / (1 - α^{K+1})`` (Thm 3.11)."""
    return (1 - a) * (k * cost + k + 1) / (1 - a ** (k + 1))


def speed_exact(a: Fraction, k: int, cost: Fraction) -> Fraction:
    """``speed`` in plain Fractions (fast, for tables); ``α = 1`` is the limit ``K + 1``."""
    length = Fraction(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)
    return length / (1 + k * cost)


# --- eq. (1): E[L] --------------------------------------------------------------------


def prove_expected_length() -> Result:
    """SPEC §8 / Leviathan eq. (1), by induction on K (symbolic K)."""
    # E(K) from the law of L.  E(K+1) - E(K): the sum gains n = K+1 and the all-accepted
    # term moves from (K+1)·α^K to (K+2)·α^(K+1).
    step_law = length_term(K + 1) + (K + 2) * alpha ** (K + 1) - (K + 1) * alpha**K
    step_closed = closed_form(K + 1) - closed_form(K)
    base = expected_length_from_law(0).doit()
    geometric = geometric_sum(K).doit()  # sympy: Piecewise((K + 1, α = 1), (closed form, True))
    (at_one, _), (elsewhere, _) = geometric.args
    law_at_one = expected_length_from_law(K).subs(alpha, 1).doit()
    cases = [
        _identity("K = 0: E[L] = 1 = (1 − α)/(1 − α)", [base - 1, closed_form(0) - 1]),
        _identity("step: E(K+1) − E(K) = α^(K+1), from the law of L", [step_law - alpha ** (K + 1)]),
        _identity("step: (1 − α^(K+2))/(1 − α) − (1 − α^(K+1))/(1 − α) = α^(K+1)", [step_closed - alpha ** (K + 1)]),
        _identity("Σ_{i=0}^{K} α^i (sympy.summation) = (1 − α^(K+1))/(1 − α) for α ≠ 1", [elsewhere - closed_form(K)]),
        _identity(
            "α = 1: E[L] = Σ 1 = K + 1 = lim_{α→1} (1 − α^(K+1))/(1 − α)",
            [law_at_one - (K + 1), at_one - (K + 1), sp.limit(closed_form(K), alpha, 1) - (K + 1)],
        ),
    ]
    return Result(
        title="Expected tokens per iteration (Leviathan eq. 1)",
        spec="SPEC §8, §10",
        statement=(
            "E[L] = Σ_{n=1}^{K} n·α^(n−1)(1 − α) + (K + 1)·α^K = Σ_{i=0}^{K} α^i "
            "= (1 − α^(K+1))/(1 − α) for every K ≥ 0 (α = 1: K + 1)."
        ),
        assumptions=(
            "each draft token is accepted independently with probability α (0 < α ≤ 1)",
            "first rejection at position n ≤ K emits n tokens; K acceptances emit K + 1 (bonus)",
            "induction on K: E[L] and the closed form agree at K = 0 and grow by the same α^(K+1)",
        ),
        cases=tuple(cases),
    )


def _identity(name, diffs) -> CaseOutcome:
    """Each expression in ``diffs`` is identically 0 (no case split needed)."""
    for diff in diffs:
        if not is_identically_zero(sp.simplify(diff)):
            return CaseOutcome(name, UNPROVED, f"left with {sp.simplify(diff)}")
    return CaseOutcome(name, PROVED)


# --- SPEC §8 worked example ---------------------------------------------------------

R = sp.Rational


def prove_cost_example(claimed=None) -> Result:
    """α = 4/5, K = 4, c = 1/10: E[L] = 2101/625, S ≈ 2.40114; α = 1/5: S ≈ 0.89257."""
    claimed = claimed or {
        "E[L] at α = 4/5": R(2101, 625),
        "cost 1 + K·c": R(7, 5),
        "S at α = 4/5, to 5 decimals": R(240114, 100000),
        "S at α = 1/5, to 5 decimals": R(89257, 100000),
    }
    k, cost = 4, R(1, 10)
    fast, slow = speed(k, R(4, 5), cost), speed(k, R(1, 5), cost)
    cases = [
        check_equal("E[L] at α = 4/5", closed_form(k, R(4, 5)), claimed["E[L] at α = 4/5"]),
        check_equal("cost 1 + K·c", 1 + k * cost, claimed["cost 1 + K·c"]),
        check_equal("S at α = 4/5, to 5 decimals", _rounded(fast, 5), claimed["S at α = 4/5, to 5 decimals"]),
        check_equal("S at α = 1/5, to 5 decimals", _rounded(slow, 5), claimed["S at α = 1/5, to 5 decimals"]),
        CaseOutcome("α = 1/5 is slower than plain decoding (S < 1)", PROVED if slow < 1 else COUNTEREXAMPLE),
    ]
    return Result(
        title="Cost model worked example",
        spec="SPEC §8",
        statement=(
            f"α = 4/5, K = 4, c = 1/10: E[L] = 2101/625 = 3.3616, cost 7/5, S = {fast} ≈ 2.40114; "
            f"α = 1/5: S = {slow} ≈ 0.89257 < 1."
        ),
        assumptions=("S = E[L]/(1 + K·c) with E[L] = (1 − α^(K+1))/(1 − α)", "exact rationals"),
        cases=tuple(cases),
    )


def _rounded(x, places: int):
    """``x`` rounded to ``places`` decimals, exactly (half away from zero)."""
    scaled = sp.Rational(x) * 10**places
    return sp.Rational(sp.floor(scaled + R(1, 2)), 10**places)


# --- K = 1 and Leviathan Cor 3.9 -----------------------------------------------------


def prove_one_draft_token() -> Result:
    """K = 1: S − 1 = (α − c)/(1 + c), so S > 1 exactly when α > c."""
    s1 = speed(1)
    margin = (alpha - c) / (1 + c)
    cases = [
        _identity("S(K=1) = (1 + α)/(1 + c)", [s1 - (1 + alpha) / (1 + c)]),
        _identity("S(K=1) − 1 = (α − c)/(1 + c)", [s1 - 1 - margin]),
        CaseOutcome(
            "1 + c > 0, so sign(S − 1) = sign(α − c)",
            PROVED if (1 + c).is_positive else UNPROVED,
        ),
    ]
    return Result(
        title="One draft token pays off exactly when α > c",
        spec="SPEC §10 (Leviathan Cor 3.9)",
        statement=(
            "For K = 1, S = (1 + α)/(1 + c) and S > 1 ⟺ α > c; hence when α > c some K "
            "(K = 1) gives at least (1 + α)/(1 + c) > 1 (Cor 3.9)."
        ),
        assumptions=("0 < α < 1, c ≥ 0",),
        cases=tuple(cases),
    )


# --- Leviathan Table 1 ----------------------------------------------------------------

# (α, γ) -> (walltime speed, operations factor) as published, c = ĉ = 0.
TABLE_1 = {
    ("0.6", 2): ("1.96", "1.53"),
    ("0.7", 3): ("2.53", "1.58"),
    ("0.8", 2): ("2.44", "1.23"),
    ("0.8", 5): ("3.69", "1.63"),
    ("0.9", 2): ("2.71", "1.11"),
    ("0.9", 10): ("6.86", "1.60"),
}


def prove_table_1(published=TABLE_1) -> Result:
    """Leviathan Table 1 (c = ĉ = 0), recomputed exactly and rounded to 2 decimals."""
    cases = []
    for (a, k), (want_speed, want_ops) in published.items():
        a_exact = R(a)
        got = [_rounded(speed(k, a_exact, 0), 2), _rounded(ops(k, a_exact, 0), 2)]
        cases.append(check_equal(f"α = {a}, γ = {k}: speed, ops", got, [R(want_speed), R(want_ops)]))
    return Result(
        title="Leviathan et al. Table 1 reproduced",
        spec="SPEC §10",
        statement="With c = ĉ = 0, (α, γ) → speed / ops: "
        + "; ".join(f"({a}, {k}) {s} / {o}" for (a, k), (s, o) in published.items()),
        assumptions=(
            "speed (1 − α^(γ+1))/((1 − α)(1 + γc)) (Thm 3.8), ops (1 − α)(γĉ + γ + 1)/(1 − α^(γ+1)) (Thm 3.11)",
            "published values have 2 decimals; exact values are rounded half up",
        ),
        cases=tuple(cases),
    )


# --- best K ---------------------------------------------------------------------------

BEST_K_ALPHAS = (Fraction(1, 2), Fraction(3, 5), Fraction(7, 10), Fraction(4, 5), Fraction(9, 10), Fraction(19, 20))
BEST_K_COSTS = (Fraction(1, 100), Fraction(1, 20), Fraction(1, 10), Fraction(1, 5), Fraction(1, 2))


def certified_best_k(a: Fraction, cost: Fraction):
    """The K ≥ 1 that maximises S, with the K past which the bound rules every K out.

    For ``0 <= α < 1`` and ``c > 0``: ``S(K) <= 1/((1 - α)(1 + K·c))`` (proved in
    :func:`prove_best_k`), a bound falling to 0 as K grows; once it is at or below
    the best S seen, no later K can beat it.  Ties go to the smaller K.
    Returns ``(k_best, S_best, k_checked)``.
    """
    if not (0 <= a < 1 and cost > 0):
        raise ValueError("certified_best_k needs 0 <= alpha < 1 and c > 0")
    k_best, s_best, k = 1, speed_exact(a, 1, cost), 1
    while 1 / ((1 - a) * (1 + (k + 1) * cost)) > s_best:
        k += 1
        s = speed_exact(a, k, cost)
        if s > s_best:
            k_best, s_best = k, s
    return k_best, s_best, k


def best_k_table(alphas=BEST_K_ALPHAS, costs=BEST_K_COSTS) -> str:
    """The best K for each α (rows) and c (columns), with its S, as text."""
    head = "α \\ c " + "".join(f"{float(cost):>13}" for cost in costs)
    lines = [head]
    for a in alphas:
        cells = []
        for cost in costs:
            k, s, _ = certified_best_k(a, cost)
            cells.append(f"{f'K={k} S={float(s):.2f}':>13}")
        lines.append(f"{float(a):<6}" + "".join(cells))
    return "\n".join(lines)


def prove_best_k(a=Fraction(4, 5), cost=Fraction(1, 10), claimed_k=6, claimed_s="2.47") -> Result:
    """The best K for α = 0.8, c = 0.1 is 6 (S ≈ 2.47), over all K ≥ 1."""
    bound = 1 / ((1 - alpha) * (1 + K * c))
    gap = alpha ** (K + 1) / ((1 - alpha) * (1 + K * c))
    h = sp.Symbol("h", positive=True)  # α = 1/(1 + h) with h > 0 is any 0 < α < 1
    k_best, s_best, k_checked = certified_best_k(a, cost)
    cases = [
        _identity("1/((1 − α)(1 + K·c)) − S(K) = α^(K+1)/((1 − α)(1 + K·c))", [bound - speed(K) - gap]),
        CaseOutcome(
            "α^(K+1)/((1 − α)(1 + K·c)) ≥ 0 for α < 1, so S(K) ≤ 1/((1 − α)(1 + K·c))",
            PROVED if sp.factor(sp.together(gap.subs(alpha, 1 / (1 + h)))).is_nonnegative else UNPROVED,
        ),
        check_equal(f"best K for α = {a}, c = {cost} (K ≤ {k_checked} compared exactly)", k_best, claimed_k),
        check_equal("its S, to 2 decimals", _rounded(sp.Rational(s_best), 2), R(claimed_s)),
        CaseOutcome(
            f"K > {k_checked}: bound ≤ S({k_best})",
            PROVED if 1 / ((1 - a) * (1 + (k_checked + 1) * cost)) <= s_best else UNPROVED,
        ),
    ]
    return Result(
        title="The best number of draft tokens",
        spec="SPEC §10",
        statement=(
            f"For α = {float(a)}, c = {float(cost)} the speed S(K) is largest at K = {claimed_k} "
            f"(S = {s_best} ≈ {float(s_best):.3f}) among all K ≥ 1. "
            "Best K for other α, c (each certified the same way):"
        ),
        assumptions=(
            "0 < α < 1, c > 0; S(K) = (1 − α^(K+1))/((1 − α)(1 + K·c))",
            "K beyond the bound's crossing cannot win, since the bound falls with K and S(K) ≤ bound",
        ),
        cases=tuple(cases),
        table=best_k_table(),
    )
