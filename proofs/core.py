"""The machinery every proof shares: results, case splits, and the zero test.

A claim is proved by **case analysis plus algebra**, never by sampling:

1. split on the ordering of each ``p(x)`` against ``q(x)`` and write each case with
   fresh non-negative symbols (``p > q`` becomes ``p = q + d`` with ``d > 0``), so that
   every ``min`` and ``max`` in the claim has a known sign and is resolved
   (:func:`resolve_min_max`);
2. impose the linear constraints of the case (``Σp = Σq = 1``) by substitution;
3. bring ``lhs - rhs`` over a common denominator; the case is proved when the
   numerator expands to the zero polynomial (:func:`is_identically_zero`).

When step 3 leaves something non-zero the claim is not thrown away silently:
:func:`find_counterexample` searches small rational points *inside the case* and
reports one where ``lhs != rhs``.  This is what lets a proof fail -- the tests run the
"resample from p" rule through the same machinery and expect a counterexample.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp

__all__ = [
    "PROVED",
    "COUNTEREXAMPLE",
    "UNPROVED",
    "INFEASIBLE",
    "AGREES",
    "CaseOutcome",
    "Result",
    "Case",
    "resolve_min_max",
    "is_identically_zero",
    "find_counterexample",
    "check_zero",
    "check_equal",
    "until_first_failure",
    "to_fraction",
]

PROVED = "proved"  # lhs - rhs reduces to exactly 0 in this case
COUNTEREXAMPLE = "counterexample"  # a point inside the case where lhs != rhs
UNPROVED = "unproved"  # neither: sympy could not decide (a failure, never a pass)
INFEASIBLE = "infeasible"  # the case's constraints cannot all hold; nothing to prove
AGREES = "agrees"  # a numerical cross-check that passed at every point tried

_PASSING = (PROVED, INFEASIBLE, AGREES)


@dataclass(frozen=True)
class CaseOutcome:
    """The verdict on one case of a proof (one ordering, one table row, ...)."""

    name: str  # e.g. "p0 > q0, p1 < q1"
    status: str  # one of PROVED, COUNTEREXAMPLE, UNPROVED, INFEASIBLE, AGREES
    detail: str = ""  # why infeasible, what was left over, ...
    counterexample: dict | None = None  # concrete values where lhs != rhs

    @property
    def ok(self) -> bool:
        return self.status in _PASSING


@dataclass(frozen=True)
class Result:
    """One claim of SPEC §3/§8/§10, its assumptions and the verdict."""

    title: str  # short name, e.g. "Single-step mass balance for one token"
    spec: str  # where the claim is stated, e.g. "SPEC §3"
    statement: str  # the claim in words and formulas
    assumptions: tuple[str, ...]  # everything the proof relies on
    cases: tuple[CaseOutcome, ...] = field(default_factory=tuple)
    table: str = ""  # a table the claim comes with, printed under it (text)

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def status(self) -> str:
        """PROVED / AGREES when every case passes, else the first failing case's status."""
        for case in self.cases:
            if not case.ok:
                return case.status
        if not self.cases:
            return UNPROVED
        return AGREES if any(c.status == AGREES for c in self.cases) else PROVED

    @property
    def counterexample(self) -> dict | None:
        """The first counterexample found, with the case it lives in; None if proved."""
        for case in self.cases:
            if case.counterexample is not None:
                return {"case": case.name, **case.counterexample}
        return None


@dataclass(frozen=True)
class Case:
    """One branch of a case split, written in fresh symbols with known signs.

    ``rows`` holds the claim's quantities (``"p"``, ``"q"``, ...) as expressions in
    ``base`` symbols, each created ``positive=True`` or ``nonnegative=True`` -- e.g.
    ``p > q`` is written ``p = q + d`` with ``d > 0``.  ``solved`` then eliminates
    some base symbols through the case's linear constraints (``Σp = Σq = 1``);
    ``domain`` lists any further relations the base symbols must meet.
    """

    name: str
    base: tuple[sp.Symbol, ...]
    rows: dict  # label -> list of expressions in the base symbols
    solved: dict = field(default_factory=dict)  # base symbol -> expression in the others
    domain: tuple = ()  # sympy relationals over the base symbols

    def apply(self, expr):
        """Min/max resolution from the case's signs, then the constraints (in that order)."""
        expr = resolve_min_max(sp.sympify(expr))
        return expr.xreplace(self.solved) if self.solved else expr

    def free(self) -> tuple[sp.Symbol, ...]:
        """Base symbols left free once the constraints are solved."""
        return tuple(s for s in self.base if s not in self.solved)

    def merge(self, other: "Case") -> "Case":
        """The product case: both case splits at once (independent symbols)."""
        return Case(
            name=f"{self.name}; {other.name}",
            base=self.base + other.base,
            rows={**self.rows, **other.rows},
            solved={**self.solved, **other.solved},
            domain=self.domain + other.domain,
        )


@functools.lru_cache(maxsize=None)
def _sign_of(diff):
    """+1 if ``diff >= 0`` follows from the symbols' signs, -1 if ``<= 0``, else None."""
    for form in (diff, sp.cancel(diff), sp.factor(diff)):  # cheapest first
        if form.is_nonnegative:
            return 1
        if form.is_nonpositive:
            return -1
    return None


def _pick(node):
    """One ``Min``/``Max`` node, resolved if the case decides its order."""
    if len(node.args) != 2:
        return node
    a, b = node.args
    sign = _sign_of(a - b)
    if sign is None:
        return node
    a_is_larger = sign > 0
    if isinstance(node, sp.Min):
        return b if a_is_larger else a
    return a if a_is_larger else b


@functools.lru_cache(maxsize=None)
def resolve_min_max(expr):
    """Replace each two-argument ``Min``/``Max`` whose order the case decides.

    ``Min(a, b)`` becomes ``b`` when ``a - b`` is provably ``>= 0`` (from the
    assumptions on the symbols alone), ``a`` when provably ``<= 0``.  Undecided ones
    are left in place, so a proof whose case split is too coarse stays unproved.
    """
    previous = None
    while previous != expr:  # resolving an inner node can make an outer one decidable
        previous = expr
        expr = expr.replace(lambda e: isinstance(e, (sp.Min, sp.Max)), _pick)
    return expr


def is_identically_zero(expr) -> bool:
    """True when the rational function ``expr`` is identically 0.

    Written as ``N / D`` over a common denominator (``D`` a non-zero polynomial), it
    vanishes identically exactly when the polynomial ``N`` expands to 0.
    """
    expr = sp.sympify(expr)
    if expr.has(sp.Min, sp.Max, sp.Piecewise, sp.nan, sp.zoo, sp.oo):
        return False
    numerator, _ = expr.as_numer_denom()
    return sp.expand(numerator) == 0


_SAMPLES_POSITIVE = [Fraction(1, n) for n in (2, 3, 4, 5, 7, 10, 20)]
_SAMPLES_NONNEG = [Fraction(0)] + _SAMPLES_POSITIVE


def _in_case(case: Case, values: dict) -> bool:
    """Does a point (values of every base symbol) satisfy the case's sign facts?"""
    for s in case.base:
        v = values[s]
        if (s.is_positive and not v > 0) or (s.is_nonnegative and not v >= 0):
            return False
    return all(bool(rel.xreplace(values)) for rel in case.domain)


def find_counterexample(diff, case: Case, *, tries: int = 2000, seed: int = 0):
    """A rational point inside ``case`` where ``diff`` (``lhs - rhs``) is not 0.

    The free symbols get small rationals (seeded, so reports are reproducible), the
    solved ones follow from the constraints, and the point is kept only if every sign
    fact of the case holds there.  ``diff`` is then evaluated exactly at the point,
    with every ``min``/``max`` computed on numbers.  Returns a dict, or None.
    """
    rng = random.Random(seed)
    free = case.free()
    for _ in range(tries):
        values = {}
        for s in free:
            v = rng.choice(_SAMPLES_POSITIVE if s.is_positive else _SAMPLES_NONNEG)
            values[s] = sp.Rational(v.numerator, v.denominator)
        for s, expr in case.solved.items():
            values[s] = sp.sympify(expr).xreplace(values)
        if not _in_case(case, values):
            continue
        value = sp.sympify(diff).xreplace(values)
        if value.has(sp.nan, sp.zoo) or not value.is_Rational:  # e.g. a 0/0 residual
            continue
        if value != 0:
            report = {
                label: [to_fraction(sp.sympify(e).xreplace(values)) for e in exprs]
                for label, exprs in case.rows.items()
            }
            report["lhs - rhs"] = to_fraction(value)
            return report
    return None


def check_zero(name: str, diffs: dict, case: Case) -> CaseOutcome:
    """Prove every ``lhs - rhs`` in ``diffs`` is 0 in ``case``, or find a counterexample.

    ``diffs`` maps a label (which identity) to ``lhs - rhs`` in the case's base symbols.
    """
    leftovers = {}
    for label, diff in diffs.items():
        reduced = case.apply(diff)
        if not is_identically_zero(reduced):
            leftovers[label] = (diff, reduced)
    if not leftovers:
        return CaseOutcome(name, PROVED)
    for label, (diff, _) in leftovers.items():
        found = find_counterexample(diff, case)
        if found is not None:
            return CaseOutcome(name, COUNTEREXAMPLE, f"{label} fails", {"identity": label, **found})
    label, (_, reduced) = next(iter(leftovers.items()))
    return CaseOutcome(name, UNPROVED, f"{label}: left with {sp.simplify(reduced)}")


def check_equal(name: str, got, expected) -> CaseOutcome:
    """An exact fact about numbers: ``got == expected`` (rationals, or lists of them)."""
    got_f, expected_f = _fractions(got), _fractions(expected)
    if got_f == expected_f:
        return CaseOutcome(name, PROVED)
    return CaseOutcome(name, COUNTEREXAMPLE, "values differ", {"expected": expected_f, "got": got_f})


def _fractions(value):
    if isinstance(value, (list, tuple)):
        return [_fractions(v) for v in value]
    return to_fraction(sp.sympify(value))


def until_first_failure(outcomes) -> tuple[CaseOutcome, ...]:
    """Case outcomes, in order, up to and including the first that fails.

    One counterexample settles a claim; checking the remaining cases would only cost time.
    """
    kept = []
    for outcome in outcomes:
        kept.append(outcome)
        if not outcome.ok:
            break
    return tuple(kept)


def to_fraction(value):
    """A sympy rational as ``fractions.Fraction`` (for reports and cross-checks)."""
    if isinstance(value, Fraction):
        return value
    value = sp.sympify(value)
    if isinstance(value, sp.Rational):
        return Fraction(int(value.p), int(value.q))
    return value
