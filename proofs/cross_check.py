"""specref's float and Fraction code against the symbolic results (SPEC §3, §8).

The proofs establish formulas; this module evaluates them at random rational points
and compares with what :mod:`specref.core.step` and :mod:`specref.core.cost` compute, on
``fractions.Fraction`` object arrays (must agree exactly) and on float64 arrays
(must agree to ``FLOAT_TOL``).  The symbolic side of the step is the case-resolved
formula of :mod:`proofs.step_law` for the ordering the point falls in -- not a second
NumPy computation.  A disagreement is reported with the point.
"""

from __future__ import annotations

import random
from fractions import Fraction

import sympy as sp

from proofs.core import AGREES, COUNTEREXAMPLE, UNPROVED, Case, CaseOutcome, Result, to_fraction
from proofs.cost_model import certified_best_k, closed_form, ops, speed
from proofs.step_law import accepted, rejected, residual, token_case

__all__ = [
    "FLOAT_TOL",
    "random_pair",
    "symbolic_step",
    "check_step_module",
    "check_cost_module",
    "prove_cross_check",
]

FLOAT_TOL = 1e-12  # float64 results must match the exact value this closely


# --- random rational points ---------------------------------------------------------


def _random_row(rng: random.Random, vocab: int) -> list[Fraction]:
    """A random rational distribution, often with zeros (weights 0..6, not all 0)."""
    weights = [rng.randint(0, 6) for _ in range(vocab)]
    if not any(weights):
        weights[rng.randrange(vocab)] = 1
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


def random_pair(rng: random.Random) -> tuple[list[Fraction], list[Fraction]]:
    """``(p, q)`` on 2 to 5 tokens; one time in five ``q = p``."""
    vocab = rng.randint(2, 5)
    p = _random_row(rng, vocab)
    q = list(p) if rng.random() < 0.2 else _random_row(rng, vocab)
    return p, q


# --- the symbolic step at a point ----------------------------------------------------


def _ordering(p: Fraction, q: Fraction) -> str:
    if p < q:
        return "<"
    if p == q:
        return "="
    return ">" if q > 0 else ">0"


def _base_values(order: str, syms, p: Fraction, q: Fraction) -> dict:
    """Values of the case symbols of :func:`proofs.step_law.token_case` at ``(p, q)``."""
    numbers = {"<": (p, q - p), "=": (q,), ">": (q, p - q), ">0": (p,)}[order]
    return {s: sp.Rational(v.numerator, v.denominator) for s, v in zip(syms, numbers)}


def symbolic_step(p, q) -> dict:
    """Accepted mass, β, rejection mass and residual from the case formulas, at ``(p, q)``.

    The point's ordering picks the case; its formulas are resolved symbolically
    (``min``/``max`` gone), then evaluated.  ``"residual"`` is None when β = 1.
    """
    p_row, q_row, values = [], [], {}
    for i, (p_i, q_i) in enumerate(zip(p, q)):
        order = _ordering(p_i, q_i)
        p_sym, q_sym, syms = token_case(order, f"_{i}")
        p_row.append(p_sym)
        q_row.append(q_sym)
        values.update(_base_values(order, syms, p_i, q_i))
    case = Case("the point's ordering", tuple(values), {"p": p_row, "q": q_row})

    def at_point(expr):
        return to_fraction(case.apply(expr).xreplace(values))

    accept = [at_point(accepted(a, b)) for a, b in zip(p_row, q_row)]
    reject_mass = at_point(sp.Add(*(rejected(a, b) for a, b in zip(p_row, q_row))))
    return {
        "accepted": accept,
        "beta": sum(accept, Fraction(0)),
        "rejection mass": reject_mass,
        "residual": None if reject_mass == 0 else [at_point(r) for r in residual(p_row, q_row)],
    }


# --- specref.core.step --------------------------------------------------------------------


def _as_arrays(p, q, exact: bool):
    import numpy as np

    if exact:
        return np.array(p, dtype=object), np.array(q, dtype=object)
    return np.array([float(x) for x in p]), np.array([float(x) for x in q])


def _agree(got, want, exact: bool) -> bool:
    if isinstance(want, list):
        got = list(got)
        return len(got) == len(want) and all(_agree(g, w, exact) for g, w in zip(got, want))
    if exact:
        return isinstance(got, (Fraction, int)) and got == want
    return abs(float(got) - float(want)) <= FLOAT_TOL


def check_step_module(step=None, *, points: int = 100, seed: int = 0, exact: bool = True) -> CaseOutcome:
    """``step.accepted_mass``, ``acceptance_rate``, ``residual_mass``, ``residual`` at random points."""
    kind = "Fraction" if exact else "float64"
    name = f"specref.core.step on {kind} rows, {points} random rational points"
    if step is None:
        try:
            from specref.core import step
        except ImportError as err:
            return CaseOutcome(name, UNPROVED, f"specref.core.step is not importable: {err}")
    from specref.core.errors import SpecrefError

    rng = random.Random(seed)
    for _ in range(points):
        p, q = random_pair(rng)
        want = symbolic_step(p, q)
        p_arr, q_arr = _as_arrays(p, q, exact)
        got = {
            "accepted": step.accepted_mass(p_arr, q_arr),
            "beta": step.acceptance_rate(p_arr, q_arr),
            "rejection mass": step.residual_mass(p_arr, q_arr),
        }
        try:
            got["residual"] = step.residual(p_arr, q_arr)
        except SpecrefError:
            got["residual"] = None  # refused: only right when the residual mass is 0
        for key, value in want.items():
            if value is None or got[key] is None:
                fine = value is None and got[key] is None
            else:
                fine = _agree(got[key], value, exact)
            if not fine:
                return CaseOutcome(
                    name,
                    COUNTEREXAMPLE,
                    f"{key} differs",
                    {"p": p, "q": q, "quantity": key, "symbolic": value, "specref": _show(got[key])},
                )
    return CaseOutcome(name, AGREES)


def _show(value):
    return None if value is None else value.tolist() if hasattr(value, "tolist") else value


# --- specref.core.cost --------------------------------------------------------------------


def _symbolic_cost(a: Fraction, k: int, cost: Fraction) -> dict:
    """E[L], S and the ops factor from the formulas of :mod:`proofs.cost_model`."""
    ra, rc = sp.Rational(a), sp.Rational(cost)
    if a == 1:  # the limit, proved in prove_expected_length
        length, op = sp.Integer(k + 1), (k * rc + k + 1) / sp.Integer(k + 1)
    else:
        length, op = closed_form(k, ra), ops(k, ra, rc)
    s = length / (1 + k * rc) if a == 1 else speed(k, ra, rc)
    return {"expected_tokens": length, "speed_ratio": s, "ops_factor": op}


def check_cost_module(cost_module=None, *, points: int = 100, seed: int = 0, exact: bool = True) -> CaseOutcome:
    """``expected_tokens``, ``speed_ratio``, ``ops_factor`` (and ``best_k``) at random points."""
    kind = "Fraction" if exact else "float"
    name = f"specref.core.cost on {kind} inputs, {points} random rational points"
    if cost_module is None:
        try:
            from specref.core import cost as cost_module
        except ImportError as err:
            return CaseOutcome(name, UNPROVED, f"specref.core.cost is not importable: {err}")
    rng = random.Random(seed)
    for _ in range(points):
        a, k, cost = Fraction(rng.randint(0, 20), 20), rng.randint(1, 8), Fraction(rng.randint(0, 10), 20)
        want = _symbolic_cost(a, k, cost)
        args = (a, k, cost) if exact else (float(a), k, float(cost))
        got = {
            "expected_tokens": cost_module.expected_tokens(*args[:2]),
            "speed_ratio": cost_module.speed_ratio(*args),
            "ops_factor": cost_module.ops_factor(*args),
        }
        for key, value in want.items():
            value = to_fraction(value)
            fine = got[key] == value if exact else abs(got[key] - float(value)) <= FLOAT_TOL * float(value)
            if not fine:
                point = {"alpha": a, "k": k, "c": cost, "quantity": key, "symbolic": value, "specref": got[key]}
                return CaseOutcome(name, COUNTEREXAMPLE, f"{key} differs", point)
        if exact and cost > 0 and a < 1:
            k_best, s_best, _ = certified_best_k(a, cost)
            if cost_module.best_k(a, cost) != (k_best, s_best):
                point = {"alpha": a, "c": cost, "certified": (k_best, s_best), "specref": cost_module.best_k(a, cost)}
                return CaseOutcome(name, COUNTEREXAMPLE, "best_k differs", point)
    return CaseOutcome(name, AGREES)


def prove_cross_check(points: int = 100, seed: int = 0) -> Result:
    """SPEC §3/§8: specref's implementations agree with the symbolic results."""
    return Result(
        title="Cross-check: specref agrees with the symbolic results",
        spec="SPEC §3, §8",
        statement=(
            "At random rational points, specref.core.step (accepted_mass, acceptance_rate, residual_mass, "
            "residual) and specref.core.cost (expected_tokens, speed_ratio, ops_factor, best_k) equal the "
            "symbolic formulas: exactly on Fractions, within 1e-12 on floats."
        ),
        assumptions=(
            "p, q: random rational rows on 2–5 tokens with zeros; q = p one time in five",
            "α ∈ {0, 1/20, …, 1}, K ∈ 1..8, c ∈ {0, 1/20, …, 1/2}; best_k is checked where c > 0 and α < 1",
            "where β = 1 the residual must be refused (SpecrefError), not evaluated",
            "a numerical check at finitely many points, not a proof",
        ),
        cases=(
            check_step_module(points=points, seed=seed, exact=True),
            check_step_module(points=points, seed=seed, exact=False),
            check_cost_module(points=points, seed=seed, exact=True),
            check_cost_module(points=points, seed=seed, exact=False),
        ),
    )
