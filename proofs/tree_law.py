"""The one-node law of recursive rejection sampling with two children is the target (V = 2, 3).

Leviathan et al. notation: ``p`` target, ``q`` draft.  At one tree node two children
are drafted and tried in turn (the rule of :mod:`specref.core.tree_verify`):

- **with replacement** (SpecInfer): ``x1, x2 ~ q`` i.i.d.; accept ``x1`` with probability
  ``min(p, q)(x1) / q(x1)``; on rejection ``p' = norm(max(p - q, 0))`` and ``x2`` is
  accepted with probability ``min(p', q)(x2) / q(x2)``; if both fall, emit
  ``y ~ norm(max(p' - q, 0))``;
- **without replacement** (RSD): ``x2`` is drawn from ``q2 = q`` without ``x1``,
  renormalised, and the second trial and the final residual use ``q2`` in place of ``q``.

The claim: the emitted token has law ``p``.  The proof needs no case split: every
``min`` and ``max`` is written through an absolute value, ``min(a, b) = (a + b - |a - b|)/2``
and ``max(a, b) = (a + b + |a - b|)/2``, and each ``|.|`` is replaced by a fresh
symbol.  The law minus ``p`` is then a rational function of ``p``, ``q`` and those
symbols, and it reduces to 0 identically (after ``sum p = sum q = 1``) -- so it is 0
for every value of the absolute values, in particular the true ones.  A wrong rule
(e.g. the residual not updated after the first rejection) does not reduce to 0, and
the proof then searches rational points with the true absolute values for a
counterexample.
"""

from __future__ import annotations

import itertools
import random

import sympy as sp

from proofs.core import COUNTEREXAMPLE, PROVED, UNPROVED, CaseOutcome, Result, is_identically_zero, to_fraction

__all__ = ["one_node_law", "prove_rrs_one_node"]


class _Abs:
    """``|e|`` as a fresh symbol per distinct expression (opaque), or as ``sp.Abs`` (evaluation)."""

    def __init__(self, opaque: bool):
        self.opaque, self.table = opaque, {}

    def __call__(self, e):
        if not self.opaque:
            return sp.Abs(e)
        key = sp.srepr(sp.expand(e))
        if key not in self.table:
            self.table[key] = sp.Symbol(f"t{len(self.table)}", nonnegative=True)
        return self.table[key]


def one_node_law(p, q, *, replacement: bool, update_residual: bool = True, absolute=sp.Abs, parts=False):
    """The law of the emitted token at one node with two children, as sympy expressions.  [V], [V] -> [V]

    ``q`` must be positive at every token; ``p`` must differ from ``q`` (so the residual is
    defined).  ``update_residual=False`` is the "residual not updated" bug: the second
    trial uses ``p`` again.  ``parts=True`` returns the pieces the proof checks one by one:
    ``(first-trial accepted mass [V], {x1: (rejected mass of x1, second-stage law [V])}, p2)``.
    """
    V = len(p)

    def mn(a, b):
        return (a + b - absolute(a - b)) / 2

    def excess(a, b):  # max(a - b, 0); a >= 0, so max(a - 0, 0) = a
        return a if b == 0 else (a - b + absolute(a - b)) / 2

    ex1 = [excess(p[y], q[y]) for y in range(V)]
    p2 = [e / sp.Add(*ex1) for e in ex1] if update_residual else list(p)
    first = [mn(p[x], q[x]) for x in range(V)]  # q(x1) * min(p, q)(x1) / q(x1)
    second = {}
    for x1 in range(V):
        rejected1 = q[x1] - first[x1]
        if replacement:
            q2 = list(q)
        else:
            q2 = [sp.Integer(0) if y == x1 else q[y] / (1 - q[x1]) for y in range(V)]
        inner, rejected2 = [sp.Integer(0)] * V, sp.Integer(0)
        for x2 in range(V):
            if q2[x2] == 0:
                continue  # never drafted
            inner[x2] += mn(p2[x2], q2[x2])
            rejected2 += q2[x2] - mn(p2[x2], q2[x2])
        ex2 = [excess(p2[y], q2[y]) for y in range(V)]
        total2 = sp.Add(*ex2)
        inner = [inner[y] + rejected2 * ex2[y] / total2 for y in range(V)]  # the second trial's law
        second[x1] = (rejected1, inner)
    if parts:
        return first, second, p2
    return [first[y] + sp.Add(*(r * inner[y] for r, inner in second.values())) for y in range(V)]


def _rows(V):
    p = [sp.Symbol(f"p{i}", nonnegative=True) for i in range(V - 1)]
    q = [sp.Symbol(f"q{i}", positive=True) for i in range(V - 1)]
    return p + [1 - sp.Add(*p)], q + [1 - sp.Add(*q)]


def _counterexample(V, replacement, update_residual, tries=200, seed=0):
    rng = random.Random(seed)
    for _ in range(tries):
        wp = [rng.randint(0, 6) for _ in range(V)]
        wq = [rng.randint(1, 6) for _ in range(V)]
        if not sum(wp):
            continue
        p = [sp.Rational(w, sum(wp)) for w in wp]
        q = [sp.Rational(w, sum(wq)) for w in wq]
        if p == q:
            continue
        law = one_node_law(p, q, replacement=replacement, update_residual=update_residual)
        diff = [sp.nsimplify(a - b) for a, b in zip(law, p)]
        if not all(d.is_Rational for d in diff):  # a 0/0 on a branch of probability 0
            continue
        if any(d != 0 for d in diff):
            return {"p": [to_fraction(v) for v in p], "q": [to_fraction(v) for v in q],
                    "law - p": [to_fraction(d) for d in diff]}
    return None


def _prove(V, replacement, update_residual) -> CaseOutcome:
    """Lemma 1: after each first child x1 the second trial's law is the residual p2 (a single
    step with target p2).  Lemma 2: accepted mass + sum over x1 of rejected mass x p2 = p."""
    name = f"V = {V}, two children, {'with' if replacement else 'without'} replacement"
    p, q = _rows(V)
    first, second, p2 = one_node_law(p, q, replacement=replacement, update_residual=update_residual,
                                     absolute=_Abs(True), parts=True)
    target2 = p2
    lemma1 = all(is_identically_zero(sp.together(inner[y] - target2[y])) for _, inner in second.values()
                 for y in range(V))
    # with the true residual p2 (lemma 1 for the correct rule), the whole law
    law = [first[y] + sp.Add(*(r * target2[y] for r, _ in second.values())) for y in range(V)]
    lemma2 = all(is_identically_zero(sp.together(law[y] - p[y])) for y in range(V))
    if lemma1 and lemma2:
        return CaseOutcome(name, PROVED)
    found = _counterexample(V, replacement, update_residual)
    if found is not None:
        return CaseOutcome(name, COUNTEREXAMPLE, "law != p", found)
    return CaseOutcome(name, UNPROVED, "law - p does not reduce to 0 with opaque absolute values")


def prove_rrs_one_node(vocab_sizes=(2, 3), update_residual: bool = True) -> Result:
    """RRS with and without replacement, two children, V = 2 and V = 3: the emitted token ~ p."""
    cases = tuple(_prove(V, replacement, update_residual)
                  for V, replacement in itertools.product(vocab_sizes, (True, False)))
    return Result(
        title="One-node law of recursive rejection sampling, two children (V = 2, 3)",
        spec="tree verification (RRS with and without replacement)",
        statement=(
            "Two children tried in turn, with the residual p' = norm(max(p - q, 0)) after the first "
            "rejection (and, without replacement, the draft q with the first child removed): the "
            "emitted token has law p."
        ),
        assumptions=(
            "p(y) >= 0, q(y) > 0 at every token, sum p = sum q = 1 (imposed by solving for the last token)",
            "p != q, so the first residual is defined (when p = q every first child is accepted)",
            "min(a, b) = (a + b - |a - b|)/2 and max(a, b) = (a + b + |a - b|)/2; each |.| is an "
            "independent symbol, so an identity in them holds for the true values too",
        ),
        cases=cases,
    )
