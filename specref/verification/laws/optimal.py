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

For a whole draft tree (depth > 1) the yardstick is :func:`tree_optimum`: the same kind of
linear program over (drafted tree, emitted block), where validity is the tree level's
criterion -- the block, completed by target sampling, has the target law -- so no verifier
of that drafting accepts more draft tokens in expectation.  :func:`tree_acceptance` is a
verifier's exact expected accepted length on one drafted tree, and
:func:`tree_acceptance_row` / :func:`tree_acceptance_table` put traversal verification
beside the token-level verifiers and that optimum.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int, check_prob_rows

__all__ = ["draft_set_law", "lp_optimum", "subset_optimum", "iid_subset_formula", "node_acceptance", "acceptance_table",
           "tree_acceptance", "tree_set_law", "tree_optimum", "tree_acceptance_row", "random_tree_rows",
           "tree_acceptance_table"]


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
    from specref.core.tree_verify import (kseq_verify, pointmass_verify, rrs_with_replacement, rrs_without_replacement,
                                          traversal_verify)

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
                # on one node traversal verification is RRS, so these two repeat the RRS columns exactly
                "traversal, i.i.d.": node_acceptance(_traversal_iid, p, q, k, "iid"),
                "traversal, without replacement": node_acceptance(traversal_verify, p, q, k, "without_replacement"),
            }
            for name, v in values.items():
                sums[name] = sums.get(name, 0) + float(v)
        rows.append({"k": k, "V": V, "cases": n_cases, **{n: s / n_cases for n, s in sums.items()}})
    return rows


# ---------------------------------------------------------------- whole trees


def _traversal_iid(tree, p_target, q_draft, rng):
    """Traversal verification for i.i.d. children (``M_s`` kept on a rejection)."""
    from specref.core.tree_verify import traversal_verify

    return traversal_verify(tree, p_target, q_draft, rng, replacement=True)


def tree_acceptance(verify, target_row, draft_row, widths, scheme: str):
    """E[draft tokens accepted] by ``verify`` in one tree step, exactly (enumerated over the drafting and the coins).

    ``target_row(path) -> [V]`` and ``draft_row(path) -> [V]`` are the rows after a path of draft
    tokens (``()`` at the root); the tree of shape ``widths`` is drafted by ``scheme``
    (:func:`specref.decoding.tree.draft_tree`).  Fraction rows give a Fraction.
    """
    from specref.decoding.tree import draft_tree, tree_rows
    from specref.verification.laws.enumeration import law

    def program(rng):
        tree, q_rows, paths = draft_tree(widths, draft_row, scheme, rng)
        path, _ = verify(tree, tree_rows(target_row, paths), None if scheme == "topk" else q_rows, rng)
        return len(path)

    dist = law(program)
    return sum((k * w for k, w in dist.items()), 0 * next(iter(dist.values())))


def tree_set_law(draft_row, widths, scheme: str) -> dict:
    """``{frozenset of drafted token paths: probability}``: the drafted tree as the paths it spells (orders merged)."""
    from specref.decoding.tree import draft_tree
    from specref.verification.laws.enumeration import law

    return dict(law(lambda rng: frozenset(draft_tree(widths, draft_row, scheme, rng)[2][1:])))


def tree_optimum(target_row, draft_row, widths, scheme: str) -> float:
    """The largest E[draft tokens accepted] of any valid verifier of trees drafted by ``scheme``: a linear program.

    A verifier maps the drafted tree ``T`` (law ``Q``, :func:`tree_set_law`) and its coins to a
    block ``z`` = a root path of ``T`` and one more token, with probability ``pi(T, z) / Q(T)``; it
    is valid when ``z`` completed to ``d + 1`` tokens by the target has the target law ``P``:
    ``sum_T sum_{z prefix of y} pi(T, z) P(y | z) = P(y)`` for every ``y`` of ``d + 1`` tokens
    (and ``pi(T, z) = 0`` where ``P(z) = 0``).  Maximise ``sum pi(T, z) (|z| - 1)`` subject to that,
    ``sum_z pi(T, z) = Q(T)`` and ``pi >= 0`` (HiGHS; once more without presolve if presolve finds
    float rows infeasible).  On a chain this is block verification's value (Sun et al.'s
    optimality); it bounds every lossless verifier of this drafting.
    """
    from scipy.optimize import linprog

    depth, trees = len(widths), list(tree_set_law(draft_row, widths, scheme).items())
    V = len(target_row(()))

    def prob(z):  # the target law of the prefix z
        out = 1
        for i in range(len(z)):
            out = out * target_row(tuple(z[:i]))[z[i]]
        return out

    blocks: dict[tuple[int, ...], Any] = {}  # z -> P(z) > 0 for the blocks some tree allows
    cols: list[tuple[int, tuple[int, ...]]] = []  # (tree index, z) per variable
    for t, (paths, _) in enumerate(trees):
        for path in {()} | set(paths):
            for y in range(V):
                z = tuple(path) + (y,)
                if z not in blocks:
                    blocks[z] = prob(z)
                if blocks[z] != 0:
                    cols.append((t, z))
    fulls = {y: prob(y) for y in itertools.product(range(V), repeat=depth + 1)}
    fulls = {y: float(v) for y, v in fulls.items() if v != 0}
    a_eq = np.zeros((len(trees) + len(fulls), len(cols)))
    for j, (t, z) in enumerate(cols):
        a_eq[t, j] = 1  # sum_z pi(T, z) = Q(T)
        for r, (full, p_full) in enumerate(fulls.items()):
            if full[:len(z)] == z:
                a_eq[len(trees) + r, j] = p_full / float(blocks[z])  # P(y | z): the completion's weight
    b_eq = np.concatenate([[float(w) for _, w in trees], list(fulls.values())])
    c = np.array([-(len(z) - 1) for _, z in cols], dtype=np.float64)
    res = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status == 2:  # presolve's verdict on float rows; the problem is feasible (accept nothing is valid)
        res = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs", options={"presolve": False})
    if res.status != 0:
        raise SpecrefError(f"the tree LP did not solve: {res.message}")
    return float(-res.fun)


def tree_acceptance_row(target_row, draft_row, widths, scheme: str, *, optimum: bool = True) -> dict:
    """Exact E[draft tokens accepted] per verifier for one drafting, and the LP optimum (a float).

    ``scheme`` ``"without_replacement"``: traversal and RRS without replacement; ``"iid"``:
    traversal (i.i.d. variant), RRS with replacement and K-SEQ; on a chain also block verification.
    """
    from specref.core.tree_verify import (block_verify, kseq_verify, rrs_with_replacement, rrs_without_replacement,
                                          traversal_verify)

    verifiers = ({"traversal": traversal_verify, "RRS without replacement": rrs_without_replacement}
                 if scheme == "without_replacement" else
                 {"traversal": _traversal_iid, "RRS with replacement": rrs_with_replacement, "K-SEQ": kseq_verify})
    if all(w == 1 for w in widths):
        verifiers["block"] = block_verify
    row = {name: tree_acceptance(v, target_row, draft_row, widths, scheme) for name, v in verifiers.items()}
    if optimum:
        row["optimum"] = tree_optimum(target_row, draft_row, widths, scheme)
    return row


def random_tree_rows(V: int, rng, *, low: int = 1, high: int = 9):
    """``row(path) -> [V]``: an independent random rational row per path, drawn once (memoised)."""
    memo: dict = {}

    def row(path):
        key = tuple(path)
        if key not in memo:
            w = rng.integers(low, high, size=V)
            memo[key] = np.array([Fraction(int(c), int(w.sum())) for c in w], dtype=object)
        return memo[key]

    return row


def tree_acceptance_table(n_cases: int = 5, V: int = 3, shapes=((1, 1), (2, 1), (1, 2), (2, 2)),
                          schemes=("without_replacement", "iid"), seed: int = 0) -> list[dict]:
    """Mean exact E[accepted] per verifier and the tree optimum over random rational rows, per shape and scheme.

    Each case draws an independent row per path for target and draft (:func:`random_tree_rows`);
    chains are listed once (their two schemes coincide).  Also the relative gain of traversal
    over the scheme's RRS, as the paper reports it.
    """
    rng = np.random.default_rng(seed)
    pairs = [(random_tree_rows(V, rng), random_tree_rows(V, rng)) for _ in range(n_cases)]
    rows = []
    for widths in shapes:
        for scheme in (schemes[:1] if all(w == 1 for w in widths) else schemes):
            sums: dict = {}
            for target_row, draft_row in pairs:
                for name, v in tree_acceptance_row(target_row, draft_row, widths, scheme).items():
                    sums[name] = sums.get(name, 0) + v
            means = {name: float(s) / n_cases for name, s in sums.items()}
            rrs = means["RRS without replacement" if scheme == "without_replacement" else "RRS with replacement"]
            rows.append({"widths": tuple(widths), "scheme": scheme, "V": V, "cases": n_cases, **means,
                         "traversal gain over RRS": means["traversal"] / rrs - 1})
    return rows
