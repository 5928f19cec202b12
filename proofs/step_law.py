"""One speculative step emits a token distributed exactly as p (SPEC §3).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  The step, for one
drafted token ``x ~ q``:

- accept ``x`` with probability ``min(1, p(x)/q(x))``, so the **accepted mass** of
  ``x`` is ``q(x)·min(1, p(x)/q(x))``;
- otherwise emit a token from the **correction** distribution, which for the correct
  algorithm is the residual ``r(x) = max(0, p(x) - q(x)) / Σ_y max(0, p(y) - q(y))``.

The output law is ``accepted(x) + (rejection mass)·correction(x)``, and the claim is
that it equals ``p(x)`` token by token (Leviathan et al., Appendix A.1).  The
functions below are the algorithm written on sympy expressions; the proofs run them
case by case (:mod:`proofs.core`).  Passing :func:`resample_from_target` (SPEC §7,
bug 1) instead of :func:`residual` must -- and does -- produce a counterexample.
"""

from __future__ import annotations

import itertools

import sympy as sp

from proofs.core import (
    INFEASIBLE,
    PROVED,
    UNPROVED,
    Case,
    CaseOutcome,
    Result,
    check_equal,
    check_zero,
    is_identically_zero,
    until_first_failure,
)

__all__ = [
    "ORDERINGS",
    "accepted",
    "rejected",
    "residual",
    "resample_from_target",
    "residual_at",
    "resample_at",
    "step_law",
    "token_case",
    "row_case",
    "prove_single_token",
    "prove_small_vocab",
    "prove_worked_example",
    "WORKED_EXAMPLE",
]

# How p(x) can sit against q(x).  Each is written with fresh symbols of known sign.
ORDERINGS = {
    "<": "p{i} < q{i}",  # p = p_i >= 0, q = p_i + d_i, d_i > 0
    "=": "p{i} = q{i}",  # p = q = q_i >= 0
    ">": "p{i} > q{i} > 0",  # q = q_i > 0, p = q_i + d_i, d_i > 0
    ">0": "p{i} > q{i} = 0",  # q = 0, p = d_i > 0: the draft never proposes x
}


# --- the step, on symbolic (or exact) numbers ------------------------------------


def _min(a, b):
    return sp.Min(a, b, evaluate=False)  # left for the case split to resolve (it is faster)


def _max(a, b):
    return sp.Max(a, b, evaluate=False)


def accepted(p, q):
    """Accepted mass of one token, ``q·min(1, p/q)``; 0 when ``q = 0`` (never proposed)."""
    if q == 0:
        return sp.Integer(0)
    return q * _min(1, p / q)


def rejected(p, q):
    """Mass of proposing the token and rejecting it, ``q·(1 - min(1, p/q))``."""
    if q == 0:
        return sp.Integer(0)
    return q * (1 - _min(1, p / q))


def residual(p_row, q_row):
    """The correct correction: ``max(0, p - q)`` normalized (SPEC §3)."""
    excess = [_max(0, p - q) for p, q in zip(p_row, q_row)]
    total = sp.Add(*excess)
    return [e / total for e in excess]


def resample_from_target(p_row, q_row):
    """SPEC §7 bug 1: on rejection, resample from p.  Wrong; kept to show a proof fail."""
    return list(p_row)


def residual_at(p, q, excess_total):
    """Residual at one token, given ``Σ_y max(0, p(y) - q(y))``."""
    return _max(0, p - q) / excess_total


def resample_at(p, q, excess_total):
    """Bug 1 at one token: the correction is ``p(x)`` itself."""
    return p


def step_law(p_row, q_row, case: Case, correction=residual):
    """Law of the token one step emits, resolved in ``case``  # [V], [V] -> [V]

    ``accepted(x) + R·correction(x)`` with ``R = Σ_y rejected(y)``; when ``R`` is 0 in
    this case (``p = q``) the correction is never evaluated (its 0/0 is not needed).
    """
    accept = [case.apply(accepted(p, q)) for p, q in zip(p_row, q_row)]
    reject_mass = case.apply(sp.Add(*(rejected(p, q) for p, q in zip(p_row, q_row))))
    if is_identically_zero(reject_mass):
        return accept
    fix = [case.apply(c) for c in correction(p_row, q_row)]
    return [a + reject_mass * c for a, c in zip(accept, fix)]


# --- case splits -------------------------------------------------------------------


def _pos(name):
    return sp.Symbol(name, positive=True)


def _nonneg(name):
    return sp.Symbol(name, nonnegative=True)


def token_case(order: str, i: str = ""):
    """``(p, q, base symbols)`` for one token in ordering ``order`` (see ORDERINGS)."""
    if order == "<":
        p, d = _nonneg(f"p{i}"), _pos(f"d{i}")
        return p, p + d, (p, d)
    if order == "=":
        q = _nonneg(f"q{i}")
        return q, q, (q,)
    if order == ">":
        q, d = _pos(f"q{i}"), _pos(f"d{i}")
        return q + d, q, (q, d)
    if order == ">0":
        d = _pos(f"d{i}")
        return d, sp.Integer(0), (d,)
    raise ValueError(f"unknown ordering {order!r}; expected one of {sorted(ORDERINGS)}")


def row_case(pattern, tag: str = "", label: str = ""):
    """A whole row pair ``(p, q)`` in one ordering pattern, with ``Σp = Σq = 1`` imposed.

    Returns ``(case, reason)``: ``reason`` is None for a feasible pattern, else why it
    is infeasible (``Σp - Σq`` is then provably non-zero) and ``case`` is unsolved.
    The constraints are solved for the ``d`` of the first token with ``p > q`` (from
    ``Σp = Σq``) and then for the first free symbol of ``Σq`` (from ``Σq = 1``).
    """
    p_row, q_row, base = [], [], []
    for i, order in enumerate(pattern):
        p, q, syms = token_case(order, f"{tag}_{i}")
        p_row.append(p)
        q_row.append(q)
        base.extend(syms)
    name = ", ".join(ORDERINGS[o].format(i=f"{label}[{i}]") for i, o in enumerate(pattern))
    rows = {f"p{label}": p_row, f"q{label}": q_row}
    balance = sp.Add(*p_row) - sp.Add(*q_row)  # Σp - Σq, must be 0
    if balance.is_positive or balance.is_negative:
        return Case(name, tuple(base), rows), f"Σp − Σq = {balance} cannot be 0"
    solved = {}
    over = [t for t, o in enumerate(pattern) if o in (">", ">0")]
    if over:
        d = token_case(pattern[over[0]], f"{tag}_{over[0]}")[2][-1]
        solved[d] = _solve_linear(balance, d)
    q_total = (sp.Add(*q_row) - 1).xreplace(solved)
    pick = next(s for s in base if s in q_total.free_symbols and s not in solved)
    solved[pick] = _solve_linear(q_total, pick)
    solved = {s: sp.expand(e.xreplace(solved)) for s, e in solved.items()}
    return Case(name, tuple(base), rows, solved), None


def _solve_linear(expr, symbol):
    """The ``symbol`` that makes the linear ``expr`` vanish."""
    expr = sp.expand(expr)
    slope = expr.coeff(symbol)
    return sp.expand(-(expr - slope * symbol) / slope)


def all_patterns(vocab: int):
    """Every assignment of an ordering to each of ``vocab`` tokens."""
    return itertools.product(ORDERINGS, repeat=vocab)


# --- 1. one token, symbolic β --------------------------------------------------------


def _excess_total(beta) -> CaseOutcome:
    """``Σ_y max(0, p(y) - q(y)) = Σ_y p(y) - Σ_y min(p(y), q(y)) = 1 - β``, any V."""
    y, vocab = sp.Symbol("y", integer=True, positive=True), sp.Symbol("V", integer=True, positive=True)
    p, m = sp.IndexedBase("p"), sp.IndexedBase("m")  # m(y) = min(p(y), q(y))
    total = sp.Sum(p[y] - m[y], (y, 1, vocab))  # Lemma B, term by term
    split = sp.factor_terms(sp.expand(total))  # linearity: Σ p(y) − Σ m(y)
    value = split.xreplace({sp.Sum(p[y], (y, 1, vocab)): 1, sp.Sum(m[y], (y, 1, vocab)): beta})
    name = "summed over y (symbolic V): Σ max(0, p − q) = Σ p − Σ min(p, q) = 1 − β"
    if value.has(sp.Sum) or not is_identically_zero(value - (1 - beta)):
        return CaseOutcome(name, UNPROVED, f"left with {value}")
    return CaseOutcome(name, PROVED)


def prove_single_token(correction_at=residual_at) -> Result:
    """SPEC §3: accepted + (1 − β)·residual = p at one token, in every ordering."""
    beta = _nonneg("beta")
    lemmas, main, beta_one = [], [], []
    for order in ORDERINGS:
        p, q, base = token_case(order)
        words = ORDERINGS[order].format(i="")
        rows = {"p(x)": [p], "q(x)": [q]}
        case = Case(words, base, rows)
        # Lemma A: the accepted mass is min(p, q).  Lemma B: the excess is p − min(p, q).
        # Lemma C: the rejected mass is q − min(p, q).  Summed over y (linearity) with
        # Σp = Σq = 1 and β = Σ min(p, q): Σ max(0, p − q) = Σ rejected = 1 − β.
        lemmas.append(
            check_zero(
                f"lemmas, {words}",
                {
                    "q·min(1, p/q) = min(p, q)": accepted(p, q) - sp.Min(p, q),
                    "max(0, p − q) = p − min(p, q)": sp.Max(0, p - q) - (p - sp.Min(p, q)),
                    "rejected = q − min(p, q)": rejected(p, q) - (q - sp.Min(p, q)),
                },
                case,
            )
        )
        # Main identity, β < 1: the rejection branch has probability 1 − β and the
        # correction's normalizer Σ max(0, p − q) is 1 − β too (Lemma B summed).
        with_beta = Case(words + ", β < 1", base + (beta,), {**rows, "β": [beta]}, domain=(beta < 1,))
        output = accepted(p, q) + (1 - beta) * correction_at(p, q, 1 - beta)
        main.append(check_zero(f"β < 1, {words}", {"output = p(x)": output - p}, with_beta))
        # β = 1: Σ max(0, p − q) = 0, a sum of non-negative terms, so each term is 0;
        # an ordering with p > q makes this token's term positive: impossible.  In the
        # others the rejection branch has probability 0 and the output is the accepted mass.
        excess = case.apply(sp.Max(0, p - q))
        if excess.is_positive:
            beta_one.append(CaseOutcome(f"β = 1, {words}", INFEASIBLE, f"max(0, p − q) = {excess} > 0"))
        else:
            beta_one.append(check_zero(f"β = 1, {words}", {"output = p(x)": accepted(p, q) - p}, case))
    return Result(
        title="Single-step mass balance for one token",
        spec="SPEC §3",
        statement=(
            "q·min(1, p/q) + (1 − β)·max(0, p − q)/(1 − β) = p at every token x, "
            "where p = p(x), q = q(x), β = Σ_y min(p(y), q(y)); "
            "and Σ_y max(0, p(y) − q(y)) = 1 − β. "
            "If β = 1 the rejection branch has probability 0 and the output q·min(1, p/q) is p."
        ),
        assumptions=(
            "p(y) ≥ 0 and q(y) ≥ 0 for every token y; Σ_y p(y) = Σ_y q(y) = 1",
            "a token with q(x) = 0 is never proposed: its accepted and rejected mass are 0",
            "a sum of non-negative terms is 0 only if each term is",
            "cases: " + "; ".join(ORDERINGS[o].format(i="") for o in ORDERINGS),
        ),
        cases=tuple(lemmas + [_excess_total(beta)] + main + beta_one),
    )


# --- 2. V = 2 and V = 3, fully symbolic ---------------------------------------------


def prove_row_pattern(pattern, correction=residual, tag="", label="") -> CaseOutcome:
    """All of SPEC §3 for one ordering pattern of whole rows ``p``, ``q``."""
    case, why_not = row_case(pattern, tag, label)
    if why_not is not None:
        return CaseOutcome(case.name, INFEASIBLE, why_not)
    p_row, q_row = case.rows[f"p{label}"], case.rows[f"q{label}"]
    beta = sp.Add(*(accepted(p, q) for p, q in zip(p_row, q_row)))
    excess_total = sp.Add(*(_max(0, p - q) for p, q in zip(p_row, q_row)))
    reject_mass = sp.Add(*(rejected(p, q) for p, q in zip(p_row, q_row)))
    law = step_law(p_row, q_row, case, correction)
    diffs = {
        "Σ max(0, p − q) = 1 − β": excess_total - (1 - beta),
        "rejection mass = 1 − β": reject_mass - (1 - beta),
        **{f"output[{x}] = p[{x}]": law[x] - p_row[x] for x in range(len(p_row))},
    }
    return check_zero(case.name, diffs, case)


def prove_small_vocab(vocab_sizes=(2, 3), correction=residual) -> Result:
    """SPEC §3 for V = 2 and V = 3: every ordering of every p_i against q_i."""
    cases = until_first_failure(
        prove_row_pattern(pattern, correction)
        for vocab in vocab_sizes
        for pattern in all_patterns(vocab)
    )
    return Result(
        title="Mass balance for V = 2 and V = 3, fully symbolic",
        spec="SPEC §3",
        statement=(
            "For all distributions p, q on V tokens (V = "
            + ", ".join(map(str, vocab_sizes))
            + "): accepted + (rejection mass)·residual = p token by token, "
            "Σ max(0, p − q) = 1 − β and the rejection mass is 1 − β, β = Σ min(p, q)."
        ),
        assumptions=(
            "p_i ≥ 0, q_i ≥ 0, Σ p_i = Σ q_i = 1 (imposed by solving for two symbols)",
            "each p_i against q_i is one of: " + "; ".join(o.format(i="_i") for o in ORDERINGS.values()),
            "a token with q_i = 0 is never proposed; when p = q the rejection branch "
            "has probability 0 and its residual (0/0) is never evaluated",
        ),
        cases=cases,
    )


# --- 3. the worked example ---------------------------------------------------------

R = sp.Rational
WORKED_EXAMPLE = {
    "p": [R(1, 5), R(1, 2), R(3, 10)],
    "q": [R(3, 5), R(3, 10), R(1, 10)],
    "accepted mass": [R(1, 5), R(3, 10), R(1, 10)],
    "acceptance β": R(3, 5),
    "rejection mass": R(2, 5),
    "residual": [R(0), R(1, 2), R(1, 2)],
    "output": [R(1, 5), R(1, 2), R(3, 10)],
    "resample-from-p output": [R(7, 25), R(1, 2), R(11, 50)],
}


def prove_worked_example(claimed=WORKED_EXAMPLE) -> Result:
    """SPEC §3 worked example, recomputed in exact rationals by the same functions."""
    p, q = claimed["p"], claimed["q"]
    exact = Case("exact rationals", (), {})  # no symbols: min/max of numbers, evaluated
    accept = [exact.apply(accepted(a, b)) for a, b in zip(p, q)]
    reject_mass = exact.apply(sp.Add(*(rejected(a, b) for a, b in zip(p, q))))
    cases = [
        check_equal("accepted mass q·min(1, p/q) = min(p, q)", accept, claimed["accepted mass"]),
        check_equal("acceptance β = Σ min(p, q)", sp.Add(*accept), claimed["acceptance β"]),
        check_equal("rejection mass", reject_mass, claimed["rejection mass"]),
        check_equal("residual", [exact.apply(r) for r in residual(p, q)], claimed["residual"]),
        check_equal("output with the residual", step_law(p, q, exact), claimed["output"]),
        check_equal(
            "output when resampling from p (SPEC §7 bug 1)",
            step_law(p, q, exact, resample_from_target),
            claimed["resample-from-p output"],
        ),
    ]
    return Result(
        title="The worked example in exact rationals",
        spec="SPEC §3",
        statement=(
            "p = [1/5, 1/2, 3/10], q = [3/5, 3/10, 1/10]: accepted mass [1/5, 3/10, 1/10], "
            "rejection mass 2/5, residual [0, 1/2, 1/2], output p; "
            "resampling from p instead gives [7/25, 1/2, 11/50]."
        ),
        assumptions=("exact rational arithmetic (sympy.Rational)",),
        cases=tuple(cases),
    )
