"""Reference tree and multi-draft verifiers, one short function per rule.

Leviathan et al. notation: ``p`` is the **target**, ``q`` the **draft**.  Every
verifier has the tree level's signature

    verify(tree, p_target [N, V], q_draft [N, V] | None, rng) -> (path, next_token)

(:mod:`specref.core.tree` for the tree and its rows): ``path`` lists the accepted
non-root nodes from the root down (``[]`` when the root's children are all
rejected), ``next_token`` is the one token drawn after the last accepted node.  The
emitted block is ``[tree.tokens[n] for n in path] + [next_token]``.  Randomness comes
from ``rng.random()`` (compared with thresholds only) and ``rng.choice(V, p=row)``,
so :func:`specref.verification.laws.enumeration.law` enumerates every verifier exactly; with
``Fraction`` rows every quantity is a rational.

Which drafting each rule assumes (the oracle drafts accordingly):

====================  ===========================================  ===============
verifier              children of a node                            lossless
====================  ===========================================  ===============
pointmass_verify      chosen without coins (top-k), any repeat      yes
rrs_with_replacement  i.i.d. from ``q_draft[node]``                 yes
rrs_without_repl.     drawn without replacement from ``q``          yes
kseq_verify           i.i.d. from ``q_draft[node]``                 yes
block_verify          a chain, ``x_i ~ q_draft[i - 1]``             yes
typical_acceptance    any (approximate: not lossless)               no
====================  ===========================================  ===============

Sources, and what was confirmed.  The rules follow the project's research notes on
tree verification, which cite the papers below.  Block verification's binary example
(10/9 tokens with token verification, 11/9 with block verification, 12/9 for the
full-information optimum) was confirmed in the paper's introduction (Sun et al.,
"Block Verification Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444,
§1, the introduction's motivating example); the other rules are implemented as described at each function, without a claim
about the paper's section, and each one's losslessness is checked exactly by the
tests (TV == 0 in rational mode) instead.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from specref.core.draws import draw
from specref.core.errors import SpecrefError, check_positive_int
from specref.core.numbers import is_exact
from specref.core.step import correction_row, residual_weights
from specref.core.tree import ROOT, DraftTree, check_tree_rows

__all__ = [
    "pointmass_verify",
    "rrs_with_replacement",
    "rrs_without_replacement",
    "kseq_verify",
    "kseq_rho",
    "block_verify",
    "block_weights",
    "typical_acceptance",
    "positive_residual",
    "VERIFIERS",
]


def positive_residual(p, q):
    """``norm(max(p - q, 0))`` (``p`` may be scaled); ``p`` normalised when that mass is 0.  ``[V], [V] -> [V]``

    :func:`specref.core.step.correction_row` with ``normalise_fallback=True``: block
    verification hands it a scaled ``p``, and RRS's fallback ``p / sum(p)`` differs from
    ``p`` in the last bits, so the fallback is normalised here and nowhere else.
    """
    return correction_row(p, q, normalise_fallback=True)


def _one_hot(V, x, like):
    row = np.zeros(V, dtype=like.dtype) if not is_exact(like) else np.array([Fraction(0)] * V, dtype=object)
    row[x] = 1
    return row


# ---------------------------------------------------------------- (a) point-mass


def pointmass_verify(tree: DraftTree, p_target, q_draft, rng, *, check: bool = True):
    """Point-mass tree verification, as EAGLE-2/3 and SGLang deploy it (top-k children).

    At node ``c`` with target ``p~ = p_target[c]``: try each child ``x`` in order and accept
    it with probability ``p~(x)`` (the draft is a point mass, so ``min(1, p/q) = p``); on
    rejection set ``p~(x) = 0`` and renormalise.  An accepted child becomes ``c`` with a
    fresh target row.  If every child is rejected the next token is drawn from ``p~``
    (the residual at the stopping node); at an accepted leaf it is drawn from the fresh
    ``p_target[leaf]``.  In law this is "draw ``y ~ p`` at each node and descend while
    ``y`` is a child" (SpecInfer's naive sampling), so the acceptance at a node is
    ``sum_i p(x_i)`` over the distinct tokens.  Children must be chosen without the coins; a
    token repeated under one parent (top-k with replacement, merged beams) is never accepted
    again -- its first copy's rejection set ``p~(x) = 0`` -- so the law is the same as with the
    repeat removed.  ``q_draft`` is ignored: deterministic children are point masses whatever
    the draft row they were ranked by.
    """
    if check:
        p_target, _ = check_tree_rows(tree, p_target, None)
    path, node = [], ROOT
    while True:
        p = p_target[node].copy()  # a fresh target row at every accepted node
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x]:  # P(accept) = p~(x)
                path.append(c)
                node = c
                break
            p[x] = 0  # rejected: remove x and renormalise (the mass left is 1 - p~(x) > 0; a repeat: p~(x) = 0)
            p = p / p.sum()
        else:  # every child rejected, or an accepted leaf: draw from p~ (= the fresh row at a leaf)
            return path, draw(rng, p)


# ---------------------------------------------------------------- (b), (c) RRS


def rrs_with_replacement(tree: DraftTree, p_target, q_draft, rng, *, check: bool = True):
    """SpecInfer's multi-step speculative sampling: recursive rejection sampling, children i.i.d. from q.

    At node ``c``: ``p~ = p_target[c]``, ``q = q_draft[c]``.  For each child ``x_i``:
    accept with probability ``min(1, p~(x_i)/q(x_i))`` and descend; on rejection
    ``p~ <- norm(max(p~ - q, 0))`` with ``q`` unchanged.  All rejected: the next token
    ``~ p~``; an accepted leaf: ``~ p_target[leaf]``.  (Miao et al., SpecInfer, 2024;
    the rule as described, section not confirmed.)
    """
    if check:
        p_target, q_draft = _need_q(tree, p_target, q_draft, "rrs_with_replacement")
    path, node = [], ROOT
    while True:
        p, q = p_target[node].copy(), q_draft[node]
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x] / q[x]:
                path.append(c)
                node = c
                break
            p = positive_residual(p, q)  # norm(max(p~ - q, 0))
        else:
            return path, draw(rng, p)


def rrs_without_replacement(tree: DraftTree, p_target, q_draft, rng, *, check: bool = True):
    """Recursive rejection sampling without replacement (Jeon et al. 2024, RSD, arXiv 2402.14160).

    Children of a node are drawn without replacement from ``q_draft[node]``, so they
    are distinct.  At node ``c``: ``p~ = p_target[c]``, ``q~ = q_draft[c]``; for each child
    ``x_i``: accept with probability ``min(1, p~(x_i)/q~(x_i))``; on rejection
    ``p~ <- norm(max(p~ - q~, 0))`` and then ``q~ <- q~`` with ``x_i`` removed,
    renormalised.  All rejected: next token ``~ p~``.  The rule as described; the
    paper's section is not confirmed here.
    """
    if check:
        p_target, q_draft = _need_q(tree, p_target, q_draft, "rrs_without_replacement")
        tree.check_distinct_children("recursive rejection sampling without replacement")
    path, node = [], ROOT
    while True:
        p, q = p_target[node].copy(), q_draft[node].copy()
        kids = tree.children(node)
        for j, c in enumerate(kids):
            x = tree.tokens[c]
            if rng.random() < p[x] / q[x]:
                path.append(c)
                node = c
                break
            p = positive_residual(p, q)  # norm(max(p~ - q~, 0))
            if j + 1 < len(kids):  # q~ without x, renormalised (only needed if a sibling follows)
                q[x] = 0
                q = q / q.sum()
        else:
            return path, draw(rng, p)


# ---------------------------------------------------------------- (d) K-SEQ


def _beta(p, q, rho):
    """``beta(rho) = sum_x min(q(x), p(x)/rho)``."""
    return np.minimum(q, p / rho).sum()


def kseq_rho(p, q, k: int):
    """The smallest ``rho`` in ``[1, k]`` with ``rho beta(rho) >= 1 - (1 - beta(rho))^k``.

    That inequality is exactly what keeps K-SEQ's residual non-negative (so any rho
    satisfying it is lossless); the smallest one maximises the acceptance
    ``1 - (1 - beta)^k``.  Float rows: bisection to 1e-13.  Fraction rows: the
    smallest multiple of 1/1000 above the bisection point that
    satisfies the inequality exactly (so the law stays exact and lossless); 1 itself when
    it satisfies it exactly.
    """
    k = check_positive_int("k", k)
    if k == 1:
        return Fraction(1) if is_exact(p) else 1.0
    # the kind is part of the key: Fraction(1, 2) == 0.5 hashes alike, and an exact law must not get a float rho
    key = (is_exact(p) and is_exact(q), tuple(p.tolist()), tuple(q.tolist()), k)
    if key not in _RHO:
        _RHO[key] = _rho(p, q, k)
    return _RHO[key]


_RHO: dict = {}  # kseq_rho per (p, q, k): the enumerator asks for the same rows on every path


def _rho(p, q, k):
    pf, qf = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)

    def ok(rho, p=pf, q=qf):
        b = _beta(p, q, rho)
        return rho * b >= 1 - (1 - b) ** k

    lo, hi = 1.0, float(k)
    if ok(lo):
        hi = lo
    while hi - lo > 1e-13:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    if not is_exact(p):
        return hi
    if ok(Fraction(1), p, q):  # exactly feasible at 1 (p = q, say): float rounding must not move it up
        return Fraction(1)
    den = 1000  # small denominators keep the exact law's fractions short
    # from one step below the float point (rounding may put it just above the exact one), upwards
    rho = max(Fraction(1), Fraction(math.floor(hi * den) - 1, den))
    while not ok(rho, p, q):  # exact check; a few steps at most
        rho += Fraction(1, den)
    return min(rho, Fraction(k))


def kseq_verify(tree: DraftTree, p_target, q_draft, rng, *, check: bool = True):
    """SpecTr's K-SEQ (Sun et al., NeurIPS 2023, arXiv 2310.15141), applied at every node.

    At node ``c`` with ``k`` children i.i.d. from ``q = q_draft[c]`` and ``p = p_target[c]``:
    with ``rho = kseq_rho(p, q, k)`` and ``beta = sum min(q, p/rho)``, scan the children and
    accept ``x_i`` with probability ``min(1, p(x_i) / (rho q(x_i)))``; the first acceptance
    wins.  If none: next token ``~ [p - min(q, p/rho) (1 - (1-beta)^k)/beta] / (1-beta)^k``.
    Acceptance is ``1 - (1 - beta)^k``.  The rule as described (paper section not
    confirmed here); applying it node by node needs i.i.d. children at every node.
    """
    if check:
        p_target, q_draft = _need_q(tree, p_target, q_draft, "kseq_verify")
    path: list[int] = []
    node = ROOT
    while True:
        p, q, kids = p_target[node], q_draft[node], tree.children(node)
        if not kids:
            return path, draw(rng, p)
        rho = kseq_rho(p, q, len(kids))
        for c in kids:
            x = tree.tokens[c]
            if rng.random() < p[x] / (rho * q[x]):
                path.append(c)
                node = c
                break
        else:
            beta = _beta(p, q, rho)
            if beta == 0:  # disjoint supports: nothing is ever accepted
                return path, draw(rng, p)
            accepted = np.minimum(q, p / rho) * ((1 - (1 - beta) ** len(kids)) / beta)
            return path, draw(rng, correction_row(p, accepted))  # norm(max(p - accepted, 0)), else p


# ---------------------------------------------------------------- (e) block verification


def block_weights(tree: DraftTree, p_target, q_draft):
    """``(p_i, h_i)`` for ``i = 0..gamma`` along a chain (block verification's weights).

    ``p_0 = 1``, ``p_i = min(1, p_{i-1} M_b(x_i) / M_s(x_i))`` with ``M_b = p_target[i - 1]``,
    ``M_s = q_draft[i - 1]``; for ``i < gamma``: ``r_i = sum max(p_i M_b(.|x_<=i) - M_s(.|x_<=i), 0)``
    and ``h_i = r_i / (r_i + 1 - p_i)`` (0 when both are 0); ``h_gamma = p_gamma``.
    ``q_draft`` None means one-hot drafts.
    """
    gamma = tree.size - 1
    V = p_target.shape[1]
    q = [q_draft[i] if q_draft is not None else (_one_hot(V, tree.tokens[i + 1], p_target) if i < gamma else
         p_target[i]) for i in range(gamma + 1)]
    weights = [1 if is_exact(p_target) else 1.0]
    for i in range(1, gamma + 1):
        x = tree.tokens[i]
        weights.append(min(1, weights[-1] * p_target[i - 1][x] / q[i - 1][x]))
    h = []
    for i in range(gamma + 1):
        if i == gamma:
            h.append(weights[i])
            continue
        r = residual_weights(weights[i] * p_target[i], q[i]).sum()
        den = r + 1 - weights[i]
        h.append(0 if den == 0 else r / den)
    return weights, h, q


def block_verify(tree: DraftTree, p_target, q_draft, rng, *, check: bool = True):
    """Block verification for one draft chain (Sun et al., ICLR 2025, arXiv 2403.10444).

    With ``p_i, h_i`` from :func:`block_weights`: draw independent ``eta_1..eta_gamma``
    and let ``tau`` be the *largest* ``i`` with ``eta_i <= h_i`` (0 if none) -- not the
    first failure.  Emit ``x_1..x_tau``, then ``y ~ norm(max(p_tau M_b(.|x_<=tau) -
    M_s(.|x_<=tau), 0))`` if ``tau < gamma``, else ``y ~ M_b(.|x_<=gamma)``.  The coins
    are drawn from ``i = gamma`` downwards, which stops at the largest success (same
    law, fewer coins).  The paper's binary example (§1) -- 10/9 expected accepted
    tokens with token verification, 11/9 with block verification -- is reproduced
    exactly by the tests.  The weight rule itself is implemented as described in the
    notes cited in the module docstring.
    """
    if check:
        p_target, q_draft = check_tree_rows(tree, p_target, q_draft)
    if not tree.is_chain():
        raise SpecrefError("block_verify needs a chain (every node at most one child); "
                           f"node {next(i for i in range(tree.size) if len(tree.children(i)) > 1)} has several")
    gamma = tree.size - 1
    weights, h, q = block_weights(tree, p_target, q_draft)
    tau = 0
    for i in range(gamma, 0, -1):
        if rng.random() < h[i]:
            tau = i
            break
    path = list(range(1, tau + 1))
    if tau == gamma:
        return path, draw(rng, p_target[gamma])
    return path, draw(rng, positive_residual(weights[tau] * p_target[tau], q[tau]))


# ---------------------------------------------------------------- (g) typical acceptance


def typical_acceptance(tree: DraftTree, p_target, q_draft, rng, *, epsilon=0.3, delta=0.09, check: bool = True):
    """Medusa's typical acceptance on a tree (Cai et al. 2024) -- approximate, not lossless.

    A node's token ``x`` passes when ``p(x) > min(epsilon, delta exp(-H(p)))``, ``p`` the
    target row at its parent and ``H`` its entropy (defaults 0.3 and 0.09).  The
    accepted path is the longest root path whose nodes all pass, ties broken by the
    larger product of target probabilities, then by the smaller node index; the next
    token is drawn from the target row at its end.  Deterministic except that draw.
    Medusa's own implementation differs in details (its first token, at T = 0 argmax
    matching); the oracle reports this rule's exact TV.
    """
    if check:
        p_target, _ = check_tree_rows(tree, p_target, None)
    pf = np.asarray(p_target, dtype=np.float64)

    def passes(node):
        row = pf[tree.parents[node]]
        nz = row[row > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        return pf[tree.parents[node], tree.tokens[node]] > min(epsilon, delta * math.exp(-entropy))

    best, best_key = [], (0, 0.0, 0)
    for node in range(1, tree.size):
        path = tree.path(node)
        if all(passes(n) for n in path):
            like = math.prod(pf[tree.parents[n], tree.tokens[n]] for n in path)
            key = (len(path), like, -node)
            if key > best_key:
                best, best_key = path, key
    return best, draw(rng, p_target[best[-1] if best else ROOT])


def _need_q(tree, p_target, q_draft, name):
    if q_draft is None:
        raise SpecrefError(f"{name} needs the draft rows q_draft [N, V] (its children are sampled from them), got None")
    return check_tree_rows(tree, p_target, q_draft)


VERIFIERS = {
    "pointmass": pointmass_verify,
    "rrs_with_replacement": rrs_with_replacement,
    "rrs_without_replacement": rrs_without_replacement,
    "kseq": kseq_verify,
    "block": block_verify,
    "typical": typical_acceptance,
}
"""The reference verifiers by name."""


# ---------------------------------------------------------------- (h) traversal verification


class _Traversal:
    """The working state of one traversal: per node its rows ``M_b``, ``M_s``, its rate ``p_alpha``, alive or deleted.

    ``mb[i]`` starts as ``p_target[i]`` and ``ms[i]`` as ``q_draft[i]``; both change only at a
    node one of whose children was rejected (its residual target and draft).  ``pa[i]`` is the
    sequence-level acceptance rate of the chain from the root to ``i``.
    """

    def __init__(self, tree: DraftTree, p_target, q_draft):
        self.tree = tree
        self.kids: list[list[int]] = [[] for _ in range(tree.size)]
        for i in range(1, tree.size):
            self.kids[tree.parents[i]].append(i)
        self.mb = [row.copy() for row in p_target]
        self.ms = [row.copy() for row in q_draft]
        self.pa = [Fraction(1) if is_exact(p_target) else 1.0] + [None] * (tree.size - 1)
        self.alive = [True] * tree.size

    def alive_kids(self, node: int) -> list[int]:
        return [c for c in self.kids[node] if self.alive[c]]

    def refresh(self, top: int) -> None:
        """``p_alpha(X_i) = min(p_alpha(X_{i-1}) M_b(X_i | X^{i-1}) / M_s(X_i | X^{i-1}), 1)`` below ``top``.

        Nodes come after their parents (``parents[i] < i``), so one pass in node order
        recomputes every alive descendant of ``top`` from its parent's (new) rate and rows.
        """
        done = {top}
        for i in range(top + 1, self.tree.size):
            a = self.tree.parents[i]
            if a in done and self.alive[i]:
                x = self.tree.tokens[i]
                self.pa[i] = min(self.pa[a] * self.mb[a][x] / self.ms[a][x], 1)
                done.add(i)


def _traversal_residual(state: _Traversal, u: int, x: int, *, replacement: bool) -> None:
    """Algorithm 1's update at the parent ``u`` of a rejected leaf carrying token ``x``.

    With ``p = p_alpha(u)``, ``M_b = M_b(. | X^u)``, ``M_s = M_s(. | X^u)`` before the update and
    ``S = sum_x max(p M_b(x) - M_s(x), 0)``:

    - ``M_b <- norm(max(p M_b - M_s, 0))`` (``M_b`` kept when ``p = 0``: ``u`` can then never
      be accepted, so the row is never drawn from);
    - ``M_s <- M_s`` with ``x`` removed and renormalised (drafting without replacement; only
      while a sibling is left to judge); ``replacement=True`` keeps ``M_s`` (i.i.d. children);
    - ``p_alpha(u) <- S / (S + 1 - p)``.  The denominator is 0 only when ``p = 1`` and ``S = 0``,
      which no rejection reaches with positive probability; the rate is then kept (1).
    """
    p, mb, ms = state.pa[u], state.mb[u], state.ms[u]
    s = residual_weights(p * mb, ms).sum()
    den = s + 1 - p
    state.pa[u] = s / den if den != 0 else p
    if p != 0:
        state.mb[u] = positive_residual(p * mb, ms)  # norm([p_alpha M_b - M_s]_+)
    if not replacement and state.alive_kids(u):
        ms = ms.copy()
        ms[x] = 0 * ms[x]
        state.ms[u] = ms / ms.sum()


def _traverse(tree: DraftTree, p_target, q_draft, rng, on_reject):
    """Traversal verification's loop, the update at a rejection as a hook ``on_reject(state, u, x)``.

    The steps cited are those of Weng et al.'s Algorithm 1 as :func:`traversal_verify` states them.
    """
    state = _Traversal(tree, p_target, q_draft)
    state.refresh(ROOT)  # (1) initial sequence-level rates, p_alpha(X_0) = 1
    while True:
        node = ROOT  # (2) the first node of the remaining tree in post-order: its leftmost leaf
        while state.alive_kids(node):
            node = state.alive_kids(node)[0]
        if node == ROOT:  # every chain rejected: nothing accepted, y ~ the root's residual M_b
            return [], draw(rng, state.mb[ROOT])
        if rng.random() < state.pa[node]:  # (3) eta < p_alpha(X_gamma): accept the whole chain
            return tree.path(node), draw(rng, state.mb[node])  # y ~ M_b(. | X^gamma) (a residual if it lost children)
        state.alive[node] = False  # (4) reject: delete the leaf,
        parent = tree.parents[node]
        on_reject(state, parent, tree.tokens[node])  # (5) residual M_b, M_s, p_alpha at its parent,
        state.refresh(parent)  # (6) and new rates for every chain still below the parent


def traversal_verify(tree: DraftTree, p_target, q_draft, rng, *, replacement: bool = False, check: bool = True):
    """Traversal verification (Weng et al., NeurIPS 2025, arXiv 2505.12398): leaves to root, whole chains.

    ``M_b = p_target`` (target), ``M_s = q_draft`` (draft), per node.  Algorithm 1:

    1. every node gets the sequence-level rate ``p_alpha(X_i) = min(p_alpha(X_{i-1})
       M_b(X_i | X^{i-1}) / M_s(X_i | X^{i-1}), 1)``, ``p_alpha(X_0) = 1`` at the root;
    2. take the first leaf ``X_gamma`` of the remaining tree in post-order (first children
       first; node order is sibling order);
    3. draw ``eta ~ U(0, 1)``; if ``eta < p_alpha(X_gamma)``, accept the whole chain from the
       root to ``X_gamma`` and draw the next token from ``M_b(. | X^gamma)`` (the fresh target
       row at an original leaf, the residual at a node whose children were all rejected);
    4. else delete ``X_gamma`` and, at its parent ``X_{gamma-1}`` with ``p = p_alpha``,
       ``M_b <- norm([p M_b - M_s]_+)``, ``M_s <- norm(M_s without X_gamma)``,
       ``p_alpha <- S / (S + 1 - p)`` with ``S = sum [p M_b - M_s]_+``; recompute ``p_alpha`` of
       every chain still below ``X_{gamma-1}``; go to 2.  When only the root is left, nothing
       is accepted and the next token is drawn from the root's residual ``M_b``.

    A parent is judged only after all its children were rejected.  Drafting: the children of a
    node are drawn **without replacement** from ``q_draft[node]`` (the paper's setting, the
    ``M_s`` update above; distinct children required).  ``replacement=True`` keeps ``M_s`` on a
    rejection, for i.i.d. children (SpecInfer's drafting): not in the paper; its law is
    checked exactly like the paper's rule.  On one node it is RRS (with or without
    replacement); on a chain it is :func:`block_verify` (``h_i = Z_i / (Z_i + 1 - p_i)`` is step
    4's rate), the chain optimum.  Coins: one ``rng.random()`` per judged chain.
    Confirmed against a summary of the paper (its Figure 1 order ``X_3, X_4, X_1, X_5, X_2``,
    the initial rates and the ``M_b`` update); the ``p_alpha`` and ``M_s`` updates follow
    block verification and RSD, and the exact tests confirm the law.
    """
    if check:
        p_target, q_draft = _need_q(tree, p_target, q_draft, "traversal_verify")
        if not replacement:
            tree.check_distinct_children("traversal verification without replacement")
    return _traverse(tree, p_target, q_draft, rng,
                     lambda state, u, x: _traversal_residual(state, u, x, replacement=replacement))


__all__.append("traversal_verify")
VERIFIERS["traversal"] = traversal_verify
