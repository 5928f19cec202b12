"""Wrong tree verifiers, each one the bug class seen in a deployed engine, one line off the reference.

Leviathan et al. notation (p target, q draft).  Every entry is a :class:`TreeBug`:
a ``tree_step_fn`` at the ``tree`` level (:mod:`specref.verification.levels.trees.sampled`), or for
the processing-order bug a target-row hook for the tree decoding loop
(:func:`specref.decoding.tree.tree_transition`), with the drafting its cases use.
Each one is detected in exact mode (TV > 0) by ``python -m specref.verify``.

=========================  ========  ======================================================
name                       drafting  what is wrong
=========================  ========  ======================================================
bonus_from_stale_residual  topk      accepted leaf after a rejected sibling: bonus from that
                                     level's residual instead of the fresh target row
residual_not_updated       iid       RRS: p~ not updated after a sibling is rejected
no_renormalisation         topk      point mass: rejected sibling zeroed, p~ not renormalised
duplicate_children         iid       running-sum kernel fed i.i.d. children, duplicates kept
children_after_coins       topk      the coin is looked at first; the child it would accept
                                     is tried first
dirty_scratch              topk      running-sum kernel with an uninitialised scratch row
node_row_off_by_one        topk      node ``c``'s children judged against ``p_target[c + 1]``
rules_reordered            topk      verification rows processed top-p before top-k
=========================  ========  ======================================================

Wrong engines on user-built trees (:data:`USER_TREE_BUGS`, level ``"user_tree"``: their cases
are :func:`~specref.verification.levels.trees.sampled.user_tree_cases` of their drafting):

=========================  =============  =================================================
name                       drafting       what is wrong
=========================  =============  =================================================
min_p_over_q_on_topk       topk           ``min(1, p/q)`` and the residual ``max(p - q, 0)``
                                          applied to top-k children whenever q is handed in
duplicates_counted_twice   deterministic  running-sum kernel: a repeated token's bucket is
                                          added again
dedup_adjacent_only        deterministic  running sum that skips a repeated token only next
                                          to its first copy (enough for a sorted list)
=========================  =============  =================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.numbers import is_exact
from specref.core.sampling import SamplingConfig, process_probs
from specref.core.step import draw
from specref.core.tree import ROOT
from specref.core.tree_verify import pointmass_verify, positive_residual, rrs_with_replacement
from specref.verification.levels.trees.sampled import from_coins, sglang_style_kernel

__all__ = ["TreeBug", "TREE_BUGS", "USER_TREE_BUGS", "tree_bugs", "reordered_target_row", "REORDER_CONFIG"]


@dataclass(frozen=True)
class TreeBug:
    name: str
    fn: Callable  # tree_step_fn, or for level "decoder" a target_row hook (model, tokens, config) -> [V]
    drafting: str  # the drafting scheme of its cases
    description: str
    level: str = "tree"  # "tree" (oracle tree level), "decoder" (tree decoding loop), "user_tree" (user-built trees)


def bonus_from_stale_residual(tree, p_target, q_draft, rng):
    """Point mass; an accepted leaf reached after a sibling was rejected draws its bonus from
    the stale residual of that level (the EAGLE bug) instead of ``p_target[leaf]``."""
    path, node = [], ROOT
    while True:
        p, rejected = p_target[node].copy(), False
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x]:
                path.append(c)
                if not tree.children(c) and rejected:
                    p[x] = 0  # BUG: the bonus comes from this level's residual, not the fresh row
                    return path, draw(rng, p / p.sum()) if p.sum() > 0 else draw(rng, p_target[c])
                node = c
                break
            p[x] = 0
            p = p / p.sum()
            rejected = True
        else:
            return path, draw(rng, p)


def residual_not_updated(tree, p_target, q_draft, rng):
    """RRS with replacement, but p~ stays the target after a rejection; only the final draw uses
    one residual ``norm(max(p - q, 0))``."""
    path, node = [], ROOT
    while True:
        p, q = p_target[node], q_draft[node]
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x] / q[x]:  # BUG: p, not the updated p~
                path.append(c)
                node = c
                break
        else:
            kids = tree.children(node)
            return path, draw(rng, positive_residual(p, q) if kids else p)


def _own_row(node):
    """(reference) Node ``c``'s children are judged against ``p_target[c]``."""
    return node


def _renormalised(p):
    """(reference) After a rejected sibling is zeroed, p~ is renormalised."""
    return p / p.sum()


def _pointmass_loop(tree, p_target, rng, *, row=_own_row, after_rejection=_renormalised):
    """Point-mass tree verification with two hooks: the row a node is judged by and what happens
    to p~ after a rejected sibling is zeroed; each entry below replaces one of them (its bug)."""
    path, node = [], ROOT
    while True:
        p = p_target[row(node)].copy()
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x]:
                path.append(c)
                node = c
                break
            p[x] = 0
            p = after_rejection(p)
        else:
            return path, draw(rng, p / p.sum())


def _left_unnormalised(p):
    return p  # BUG: no p / p.sum() between trials


def no_renormalisation(tree, p_target, q_draft, rng):
    """Point mass; a rejected sibling is zeroed but p~ is not renormalised before the next trial."""
    return _pointmass_loop(tree, p_target, rng, after_rejection=_left_unnormalised)


def children_after_coins(tree, p_target, q_draft, rng):
    """Point mass; one coin per node is drawn first and the first child whose own test it passes
    is accepted -- the order of trial chosen after seeing the coin."""
    path, node = [], ROOT
    while True:
        p, u = p_target[node].copy(), rng.random()
        kids = tree.children(node)
        for c in kids:
            if u < p[tree.tokens[c]]:  # BUG: every child is tried against the same, already-seen coin
                path.append(c)
                node = c
                break
        else:
            for c in kids:
                p[tree.tokens[c]] = 0
            return path, draw(rng, p / p.sum())


def _kernel_without_check(*args):
    return sglang_style_kernel(*args, check_distinct=False)


def _dirty_kernel(candidates, first, sibling, coins, final, p):
    V = p.shape[1]
    garbage = Fraction(1, 4 * V) if is_exact(p) else 1 / (4 * V)
    scratch = np.full(p.shape, garbage, dtype=p.dtype)  # BUG: scratch not zeroed
    return sglang_style_kernel(candidates, first, sibling, coins, final, p, scratch=scratch)


def node_row_off_by_one(tree, p_target, q_draft, rng):
    """Point mass with node ``c``'s children judged against row ``c + 1`` (the wrong logits slice)."""
    last = tree.size - 1
    return _pointmass_loop(tree, p_target, rng, row=lambda node: min(node + 1, last))  # BUG: row c + 1


REORDER_CONFIG = SamplingConfig(top_k=3, top_p=Fraction(4, 5))
"""The config the processing-order control runs under (both rules bite on its rows)."""


def reordered_target_row(model, tokens, config):
    """The target's row for verification with top-p applied before top-k (plain sampling: top-k first)."""
    raw = model.probs(list(tokens))[-1:]
    first = process_probs(raw, SamplingConfig(temperature=config.temperature, top_p=config.top_p))
    return process_probs(first, SamplingConfig(top_k=config.top_k))[0]


TREE_BUGS = {b.name: b for b in [
    TreeBug("bonus_from_stale_residual", bonus_from_stale_residual, "topk",
            "accepted leaf after a rejected sibling: bonus from the stale residual"),
    TreeBug("residual_not_updated", residual_not_updated, "iid", "RRS: residual not updated after a sibling rejection"),
    TreeBug("no_renormalisation", no_renormalisation, "topk", "point mass: no renormalisation between sibling trials"),
    TreeBug("duplicate_children", from_coins(_kernel_without_check), "iid",
            "running-sum kernel accepts duplicate children"),
    TreeBug("children_after_coins", children_after_coins, "topk", "children tried in an order chosen after the coin"),
    TreeBug("dirty_scratch", from_coins(_dirty_kernel), "topk", "uninitialised scratch subtracted in the residual"),
    TreeBug("node_row_off_by_one", node_row_off_by_one, "topk", "node-to-row off by one"),
    TreeBug("rules_reordered", reordered_target_row, "topk",
            "verification rows processed top-p before top-k, plain sampling top-k first", level="decoder"),
]}


def min_p_over_q_on_topk(tree, p_target, q_draft, rng):
    """One verify path for every tree: whenever q rows are handed in, SpecInfer's RRS --
    accept w.p. ``min(1, p~/q)``, residual ``norm(max(p~ - q, 0))`` -- even for top-k children,
    which were chosen without coins (point masses, not draws from q)."""
    if q_draft is None:
        return pointmass_verify(tree, p_target, None, rng)
    return rrs_with_replacement(tree, p_target, q_draft, rng, check=False)  # BUG: q used for top-k children


def _any_repeat(x, tried, previous):
    """(reference) A token already tried at this node is skipped: its bucket was counted once."""
    return x in tried


def _adjacent_repeat(x, tried, previous):
    return x == previous  # BUG: only a repeat of the sibling just before is skipped


def _running_sum_loop(tree, p_target, rng, *, skip=_any_repeat):
    """SGLang's running-sum point mass as a ``tree_step_fn``: one coin per node, child ``i`` accepted
    when the coin falls in its bucket ``p(x_i)``, the next token from the target with the tried
    tokens removed; ``skip(x, tried, previous)`` says which repeated child is left out."""
    path, node = [], ROOT
    while True:
        p, u = p_target[node], rng.random()
        runsum, previous, tried, chosen = 0 * p[0], None, [], None
        for c in tree.children(node):
            x = tree.tokens[c]
            if skip(x, tried, previous):
                continue
            previous = x
            runsum = runsum + p[x]
            if u < runsum:
                chosen = c
                break
            tried.append(x)
        if chosen is None:
            rest = p.copy()
            rest[tried] = 0
            return path, draw(rng, rest / rest.sum())
        path.append(chosen)
        node = chosen


def dedup_adjacent_only(tree, p_target, q_draft, rng):
    """The running-sum point mass that skips a repeated token only when it repeats the sibling just
    before it -- enough for a sorted top-k list, wrong for siblings ``[a, b, a]``."""
    return _running_sum_loop(tree, p_target, rng, skip=_adjacent_repeat)


USER_TREE_BUGS = {b.name: b for b in [
    TreeBug("min_p_over_q_on_topk", min_p_over_q_on_topk, "topk",
            "min(1, p/q) and the q residual applied to top-k children", level="user_tree"),
    TreeBug("duplicates_counted_twice", from_coins(_kernel_without_check), "deterministic",
            "running-sum kernel adds a repeated token's bucket again", level="user_tree"),
    TreeBug("dedup_adjacent_only", dedup_adjacent_only, "deterministic",
            "running sum skips a repeated token only next to its first copy", level="user_tree"),
]}
"""Wrong engines on user-built trees, each detected in exact mode on its drafting's user trees."""


def tree_bugs(level: str | None = None) -> list[TreeBug]:
    """The tree bugs, optionally only those at one level ("tree" or "decoder")."""
    return [b for b in TREE_BUGS.values() if level is None or b.level == level]
