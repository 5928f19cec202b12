"""The yardstick for multi-draft verification: the best acceptance any valid verifier can reach.

At one node the target row is ``p`` and a drafting scheme proposes a set ``S`` of
candidate tokens with law ``Q`` (k i.i.d. draws from ``q``, k draws without
replacement, ...).  A verifier that preserves ``p`` is a coupling of ``S ~ Q`` with
``Y ~ p``; it accepts when ``Y`` is in ``S``.  The best acceptance is the value of the
optimal-transport linear program (as posed in SpecTr, Sun et al. 2023):

    maximise  sum_{S, y in S} pi(S, y)
    s.t.      sum_y pi(S, y) = Q(S),   sum_S pi(S, y) = p(y),   pi >= 0,

solved here with ``scipy.optimize.linprog`` (HiGHS).  By max-flow / min-cut the same
value is ``min over token sets H of [p(H) + 1 - Q(S subset of H)]`` (accepted mass
with ``Y`` in ``H`` is at most ``p(H)``; with ``Y`` outside ``H`` it needs ``S`` not inside
``H``), which for k i.i.d. drafts is ``min_H [p(H) + 1 - q(H)^k]`` -- the closed subset
formula of Hu et al. 2025 (arXiv 2502.18779) as stated in the project's notes.
:func:`subset_optimum` evaluates it exactly (in Fractions when the rows are), and the
tests check that both routes agree.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int, check_prob_rows

__all__ = ["draft_set_law", "lp_optimum", "subset_optimum", "iid_subset_formula", "node_acceptance", "acceptance_table"]


def draft_set_law(q, k: int, *, replacement: bool = True) -> dict:
    """``{frozenset of drafted tokens: probability}`` for k draws from ``q`` (ordered draws merged)."""
    q = np.asarray(q, dtype=object if isinstance(q[0], Fraction) else np.float64)
    check_prob_rows("q", q)
    k = check_positive_int("k", k)
    V = q.shape[0]
    if not replacement and k > int((q > 0).sum()):
        raise SpecrefError(f"k = {k} draws without replacement need k tokens with q > 0, got {int((q > 0).sum())}")
    out: dict = {}
    for xs in itertools.product(range(V), repeat=k):
        if not replacement and len(set(xs)) < k:
            continue
        w, left = 1, list(q)
        for x in xs:
            if replacement:
                w = w * q[x]
            else:
                w = w * left[x] / sum(left)
                left[x] = 0 * left[x]
        if w != 0:
            s = frozenset(xs)
            out[s] = out.get(s, 0) + w
    return out


def lp_optimum(p, set_law: dict) -> float:
    """The optimal-transport value: the largest P(Y in S) over couplings of ``S ~ set_law`` and ``Y ~ p``."""
    from scipy.optimize import linprog  # scipy is needed only for the yardstick

    p = np.asarray(p, dtype=np.float64)
    sets = list(set_law)
    V, n = p.shape[0], len(sets)
    c = np.array([-(y in s) for s in sets for y in range(V)], dtype=np.float64)  # maximise acceptance
    a_eq = np.zeros((n + V, n * V))
    for i in range(n):
        a_eq[i, i * V:(i + 1) * V] = 1  # sum_y pi(S_i, y) = Q(S_i)
    for y in range(V):
        a_eq[n + y, y::V] = 1  # sum_S pi(S, y) = p(y)
    b_eq = np.concatenate([[float(set_law[s]) for s in sets], p])
    res = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:
        raise SpecrefError(f"the transport LP did not solve: {res.message}")
    return float(-res.fun)


def subset_optimum(p, set_law: dict):
    """``min over token sets H of [p(H) + 1 - Q(S subset of H)]`` (exact for Fraction rows)."""
    V = len(p)
    best = None
    for r in range(V + 1):
        for H in itertools.combinations(range(V), r):
            h = frozenset(H)
            value = sum((p[y] for y in H), 0 * p[0]) + 1 - sum((w for s, w in set_law.items() if s <= h), 0 * p[0])
            best = value if best is None or value < best else best
    return best


def iid_subset_formula(p, q, k: int):
    """``min_H [p(H) + 1 - q(H)^k]``: the optimum for k i.i.d. drafts from ``q``."""
    k = check_positive_int("k", k)
    V = len(p)
    return min(sum((p[y] for y in H), 0 * p[0]) + 1 - sum((q[y] for y in H), 0 * q[0]) ** k
               for r in range(V + 1) for H in itertools.combinations(range(V), r))


def node_acceptance(verify, p, q, k: int, scheme: str):
    """P(some child is accepted) at one node whose k children are drafted from ``q`` by ``scheme``, exactly.

    ``verify`` is a tree verifier (:mod:`specref.core.tree_verify`); the law is enumerated over the
    drafting and the verifier's coins (:func:`specref.verification.laws.enumeration.law`).
    """
    from specref.decoding.tree import draft_tree
    from specref.verification.laws.enumeration import law

    def program(rng):
        tree, q_rows, _ = draft_tree((k,), lambda path: q if not path else p, scheme, rng)
        path, _ = verify(tree, np.stack([p] * tree.size), None if scheme == "topk" else q_rows, rng)
        return bool(path)

    return law(program).get(True, 0 * p[0])


def acceptance_table(n_cases: int = 20, V: int = 4, ks=(2, 3), seed: int = 0) -> list[dict]:
    """Mean per-node acceptance of each verifier and the optima over random rational (p, q), per k."""
    from specref.core.tree_verify import kseq_verify, pointmass_verify, rrs_with_replacement, rrs_without_replacement

    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        sums: dict = {}
        for _ in range(n_cases):
            p, q = (np.array([Fraction(int(c), int(w.sum())) for c in w], dtype=object)
                    for w in rng.integers(1, 9, size=(2, V)))
            values = {
                "single draft": np.minimum(p, q).sum(),
                "RRS with replacement": node_acceptance(rrs_with_replacement, p, q, k, "iid"),
                "K-SEQ": node_acceptance(kseq_verify, p, q, k, "iid"),
                "optimum, i.i.d. drafts": iid_subset_formula(p, q, k),
                "RRS without replacement": node_acceptance(rrs_without_replacement, p, q, k, "without_replacement"),
                "optimum, without replacement": subset_optimum(p, draft_set_law(q, k, replacement=False)),
                "point mass (top-k)": node_acceptance(pointmass_verify, p, q, k, "topk"),
            }
            for name, v in values.items():
                sums[name] = sums.get(name, 0) + float(v)
        rows.append({"k": k, "V": V, "cases": n_cases, **{n: s / n_cases for n, s in sums.items()}})
    return rows
