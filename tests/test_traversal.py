"""Traversal verification (Weng et al. 2025): exact losslessness, its law by second routes, its acceptance.

Lossless: TV == 0 exactly (Fraction rows) at the tree level on the default cases of its drafting
and on chains, wider trees, p = q and zeros in p or q.  Second routes: on one node it is RRS, on a
chain it is block verification (the whole law of (path, next token)) and its accepted-length law
is the closed form from the chain's weights.  Acceptance: exact expected accepted length, equal
to the chain optimum on chains (the LP of ``tree_optimum``), at least RRS on trees and at most
the tree optimum.  Wrong variants -- no residual update, a stale rate, the rate
``S / (1 - M_s(x))``, the draft row not updated, the deepest leaf first, the fresh target row
after an accepted inner node -- are flagged with an exact TV > 0.
"""

import itertools
import math
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.draws import draw
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.core.step import residual_weights
from specref.core.tree import ROOT, DraftTree, chain_tree
from specref.core.tree_verify import (_traversal_residual, _Traversal, _traverse, block_verify, rrs_with_replacement,
                                      rrs_without_replacement, traversal_verify)
from specref.decoding.tree import draft_tree, tree_transition
from specref.verification.laws.enumeration import compare, law, law_iterated, target_law
from specref.verification.laws.optimal import (draft_set_law, node_acceptance, random_tree_rows, subset_optimum,
                                               tree_acceptance, tree_acceptance_row, tree_optimum)
from specref.verification.levels.trees.sampled import TreeCase, memo_rows, tree_cases
from specref.verification.oracle import check
from toy_models.ngram import NGramModel


def traversal_iid(tree, p_target, q_draft, rng):
    """The i.i.d. variant: ``M_s`` kept on a rejection (children drawn with replacement)."""
    return traversal_verify(tree, p_target, q_draft, rng, replacement=True)


def frac(*rows):
    return np.array([[F(v) for v in row] for row in rows], dtype=object)


P = frac(["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"])
Q = frac(["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"])
P_ZEROS = frac(["0", "3/5", "2/5"], ["1/2", "0", "1/2"], ["1/4", "3/4", "0"])
Q_ZEROS = frac(["1/2", "1/2", "0"], ["0", "1/3", "2/3"], ["1/3", "1/3", "1/3"])


def own_cases(drafting):
    """Chains, wider trees, p = q and zeros in p or q (bigram tables, V = 3)."""
    return [TreeCase("chain-depth3", P, Q, widths=(1, 1, 1), drafting=drafting),
            TreeCase("width2-width2", P, Q, widths=(2, 2), drafting=drafting),
            TreeCase("width3-depth2", P, Q, prompt=(2,), widths=(3, 1), drafting=drafting),
            TreeCase("zeros-in-p", P_ZEROS, Q, widths=(2, 1), drafting=drafting),
            TreeCase("zeros-in-q", P, Q_ZEROS, prompt=(2,), widths=(2, 1), drafting=drafting),
            TreeCase("p-equals-q-depth2", P, P, widths=(2, 1), drafting=drafting)]


SCHEMES = [("without_replacement", traversal_verify), ("iid", traversal_iid)]


# --- lossless, exactly --------------------------------------------------------------------------

@pytest.mark.parametrize("drafting, fn", SCHEMES, ids=[s for s, _ in SCHEMES])
def test_traversal_is_lossless_exactly_on_the_default_and_own_tree_cases(drafting, fn):
    cases = tree_cases(drafting) + own_cases(drafting)
    report = check("tree", fn, cases=cases)
    assert report.ok and report.worst_tv == 0 and len(report.results) == len(cases), str(report)
    assert all(isinstance(r.tv, (F, int)) for r in report.results)  # rational, not rounded


def test_float_rows_agree_within_rounding():
    cases = [c.as_float() for c in tree_cases("without_replacement")[:2] + own_cases("without_replacement")[1:2]]
    report = check("tree", traversal_verify, cases=cases)
    assert report.ok and report.worst_tv <= 1e-12, str(report)


def test_tree_decoding_with_traversal_has_the_target_law_exactly():
    """The whole loop (several tree steps, a stop token) through ``tree_transition``'s registry name."""
    target = NGramModel.random(order=2, vocab_size=3, seed=7).exact
    draft = NGramModel.random(order=2, vocab_size=3, seed=8, zero_frac=0.3).exact
    config = SamplingConfig()
    it = tree_transition(target, draft, [0], widths=(2, 1), scheme="without_replacement", verify="traversal",
                         config=config, max_new_tokens=3, stop_tokens=(2,))
    c = compare(law_iterated((), it, key=lambda g: (g[-1:], len(g))), target_law(target, [0], config, 3, (2,)))
    assert c.exact and c.tv == 0, str(c)


# --- second routes: one node is RRS, a chain is block verification -----------------------------

def step_law(verify, tree, p_rows, q_rows):
    return law(lambda rng: (lambda r: (tuple(r[0]), r[1]))(verify(tree, p_rows, q_rows, rng)))


def random_rows(rng, n, V=3, low=1):
    w = rng.integers(low, 6, size=(n, V))
    w[w.sum(axis=1) == 0, 0] = 1
    return np.array([[F(int(c), int(r.sum())) for c in r] for r in w], dtype=object)


@pytest.mark.parametrize("k", [2, 3])
def test_on_one_node_traversal_is_rrs(k):
    rng = np.random.default_rng(k)
    for _ in range(3):
        p, q = random_rows(rng, 2, low=0)[0], random_rows(rng, 1)[0]
        assert node_acceptance(traversal_verify, p, q, k, "without_replacement") == \
            node_acceptance(rrs_without_replacement, p, q, k, "without_replacement")
        assert node_acceptance(traversal_iid, p, q, k, "iid") == node_acceptance(rrs_with_replacement, p, q, k, "iid")
    tree = DraftTree((-1,) + (0,) * k, (-1,) + tuple(range(k)))
    p_rows, q_rows = random_rows(rng, k + 1), random_rows(rng, k + 1)
    assert step_law(traversal_verify, tree, p_rows, q_rows) == step_law(rrs_without_replacement, tree, p_rows, q_rows)


def chain_tau_law(p_rows, q_rows, gamma):
    """Second route, no verifier code: the law of tau from the chain's weights (Sun et al.), summed over drafts.

    ``p_i = min(1, p_{i-1} M_b(x_i) / M_s(x_i))``, ``h_i = Z_i / (Z_i + 1 - p_i)`` with
    ``Z_i = sum max(p_i M_b - M_s, 0)`` (``h_gamma = p_gamma``); tau = the largest i with
    ``eta_i < h_i``: ``P(tau = i) = h_i prod_{j > i} (1 - h_j)`` (``h_0 = 1``).  Context-free rows
    per depth: ``M_b = p_rows[i]``, ``M_s = q_rows[i]`` after i drafts.
    """
    out = {}
    for xs in itertools.product(range(p_rows.shape[1]), repeat=gamma):
        weight = math.prod((q_rows[i][x] for i, x in enumerate(xs)), start=F(1))
        if weight == 0:
            continue
        w = [F(1)]
        for i, x in enumerate(xs):
            w.append(min(F(1), w[-1] * p_rows[i][x] / q_rows[i][x]))
        h = []
        for i in range(gamma + 1):
            z = sum(max(w[i] * a - b, F(0)) for a, b in zip(p_rows[i], q_rows[i])) if i < gamma else None
            h.append(F(1) if i == 0 else w[i] if i == gamma else (z / (z + 1 - w[i]) if z + 1 - w[i] else F(0)))
        for i in range(gamma + 1):
            out[i] = out.get(i, F(0)) + weight * h[i] * math.prod((1 - h[j] for j in range(i + 1, gamma + 1)), start=F(1))
    return {i: v for i, v in out.items() if v}


@pytest.mark.parametrize("gamma", [2, 3])
def test_on_a_chain_traversal_is_block_verification(gamma):
    rng = np.random.default_rng(gamma)
    for _ in range(3):
        p_rows, q_rows = random_rows(rng, gamma + 1, low=0), random_rows(rng, gamma + 1)
        tree = chain_tree([int(np.argmax(q_rows[i])) for i in range(gamma)])
        mine, block = step_law(traversal_verify, tree, p_rows, q_rows), step_law(block_verify, tree, p_rows, q_rows)
        assert mine == block  # the whole law of (path, next token), one drafted chain

        def program(r, p_rows=p_rows, q_rows=q_rows):  # drafting included, context-free rows per depth
            t, q, paths = draft_tree((1,) * gamma, lambda path: q_rows[len(path)], "iid", r)
            return len(traversal_verify(t, np.stack([p_rows[len(path)] for path in paths]), q, r)[0])
        assert dict(law(program)) == chain_tau_law(p_rows, q_rows, gamma)  # the closed form, a second route


MB, MS = frac(["1/3", "2/3"], ["1/3", "2/3"], ["1/3", "2/3"]), frac(["2/3", "1/3"], ["2/3", "1/3"], ["2/3", "1/3"])


def test_block_verifications_binary_example_and_the_chain_optimum():
    """Sun et al.'s example: 10/9 token-level, 11/9 block = traversal = the LP optimum, not the 12/9 coupling bound."""
    rows = (lambda path: MB[0], lambda path: MS[0])
    assert tree_acceptance(rrs_with_replacement, *rows, (1, 1), "iid") == F(10, 9)
    assert tree_acceptance(traversal_verify, *rows, (1, 1), "without_replacement") == F(11, 9)
    assert abs(tree_optimum(*rows, (1, 1), "iid") - 11 / 9) < 1e-9
    assert chain_tau_law(MB, MS, 2) == {0: F(1, 3), 1: F(1, 9), 2: F(5, 9)}  # mean 1/9 + 10/9 = 11/9


def case_rows(case):
    target, draft = case.models()
    row = memo_rows(case.prompt)
    return (lambda path: row(target, path)), (lambda path: row(draft, path))


def test_the_tree_optimum_is_the_node_optimum_on_one_node_and_block_verification_on_chains():
    rng = np.random.default_rng(4)
    for _ in range(2):
        tr, dr = random_tree_rows(3, rng), random_tree_rows(3, rng)
        node = subset_optimum(tr(()), draft_set_law(dr(()), 2, replacement=False))
        assert abs(tree_optimum(tr, dr, (2,), "without_replacement") - float(node)) < 1e-9
        for widths in [(1, 1), (1, 1, 1)]:
            block = tree_acceptance(block_verify, tr, dr, widths, "iid")
            assert abs(tree_optimum(tr, dr, widths, "iid") - float(block)) < 1e-9


# --- acceptance: the numbers ----------------------------------------------------------------------

EXPECTED = {  # E[draft tokens accepted] per default case, exactly; the optimum from the LP (floats)
    ("without_replacement", "width2-depth2"): {"traversal": F(97, 60), "RRS without replacement": F(38, 25)},
    ("without_replacement", "width2-depth1"): {"traversal": F(5, 8), "RRS without replacement": F(5, 8)},
    ("without_replacement", "chain-depth2"): {"traversal": F(31, 24), "RRS without replacement": F(371, 300),
                                              "block": F(31, 24)},
    ("iid", "width2-depth2"): {"traversal": F(407, 300), "RRS with replacement": F(383, 300)},
    ("iid", "width3-depth1"): {"traversal": F(23, 24), "RRS with replacement": F(23, 24)},
}


@pytest.mark.parametrize("drafting", ["without_replacement", "iid"])
def test_traversal_accepts_at_least_rrs_at_most_the_optimum_and_the_chain_optimum_on_chains(drafting):
    rrs = "RRS without replacement" if drafting == "without_replacement" else "RRS with replacement"
    for case in tree_cases(drafting):
        row = tree_acceptance_row(*case_rows(case), case.widths, drafting)
        assert row["traversal"] >= row[rrs] and float(row["traversal"]) <= row["optimum"] + 1e-9, (case, row)
        if "block" in row:
            assert row["traversal"] == row["block"] and abs(float(row["block"]) - row["optimum"]) < 1e-9
        for name, value in EXPECTED.get((drafting, case.name), {}).items():
            assert row[name] == value, (case.name, name, row[name])


def test_traversal_accepts_at_least_rrs_on_random_trees():
    rng = np.random.default_rng(11)
    strict = 0
    for i in range(3):
        tr, dr = random_tree_rows(3, rng, low=0 if i == 0 else 1), random_tree_rows(3, rng)
        for widths, scheme, rrs in [((2, 1), "without_replacement", rrs_without_replacement),
                                    ((1, 2), "without_replacement", rrs_without_replacement),
                                    ((2, 1), "iid", rrs_with_replacement)]:
            verify = traversal_verify if scheme == "without_replacement" else traversal_iid
            mine, token = (tree_acceptance(v, tr, dr, widths, scheme) for v in (verify, rrs))
            assert isinstance(mine, F) and mine >= token
            strict += mine > token
    assert strict >= 1


# --- wrong variants ------------------------------------------------------------------------------

def no_residual(tree, p_target, q_draft, rng):
    """Sequence-level acceptance, but a rejection only deletes the leaf: no residual, no new rate."""
    return _traverse(tree, p_target, q_draft, rng, lambda state, u, x: None)


def stale_rate(tree, p_target, q_draft, rng):
    """The residual rows are updated, the parent's rate ``p_alpha`` is not (``S / (S + 1 - p)`` skipped)."""
    def update(state, u, x):
        rate = state.pa[u]
        _traversal_residual(state, u, x, replacement=False)
        state.pa[u] = rate
    return _traverse(tree, p_target, q_draft, rng, update)


def rate_over_draft_left(tree, p_target, q_draft, rng):
    """The parent's new rate ``min(S / (1 - M_s(x)), 1)`` instead of ``S / (S + 1 - p)`` (a small TV)."""
    def update(state, u, x):
        s = residual_weights(state.pa[u] * state.mb[u], state.ms[u]).sum()
        left = 1 - state.ms[u][x]
        _traversal_residual(state, u, x, replacement=False)
        state.pa[u] = min(s / left, 1) if left else 0 * s
    return _traverse(tree, p_target, q_draft, rng, update)


def draft_row_kept(tree, p_target, q_draft, rng):
    """Children drawn without replacement, but ``M_s`` not updated on a rejection (the i.i.d. rule)."""
    return traversal_verify(tree, p_target, q_draft, rng, replacement=True)


def _loop(tree, p_target, q_draft, rng, *, pick, bonus):
    """Traversal's steps with the leaf choice ``pick(state)`` and the accepted node's row ``bonus(state, node)``."""
    state = _Traversal(tree, p_target, q_draft)
    state.refresh(ROOT)
    while True:
        node = pick(state)
        if node == ROOT:
            return [], draw(rng, state.mb[ROOT])
        if rng.random() < state.pa[node]:
            return tree.path(node), draw(rng, bonus(state, node))
        state.alive[node] = False
        _traversal_residual(state, tree.parents[node], tree.tokens[node], replacement=False)
        state.refresh(tree.parents[node])


def _post_order_leaf(state):
    node = ROOT
    while state.alive_kids(node):
        node = state.alive_kids(node)[0]
    return node


def deepest_leaf_first(tree, p_target, q_draft, rng):
    """The deepest remaining leaf first (ties to the first in depth-first order), not post-order."""
    def pick(state):
        leaves = [n for n in range(tree.size) if state.alive[n] and not state.alive_kids(n)]
        return max(leaves, key=lambda n: (tree.depth(n), [-m for m in tree.path(n)]))
    return _loop(tree, p_target, q_draft, rng, pick=pick, bonus=lambda state, node: state.mb[node])


def fresh_bonus_row(tree, p_target, q_draft, rng):
    """An accepted node whose children were all rejected draws from its fresh target row, not its residual."""
    return _loop(tree, p_target, q_draft, rng, pick=_post_order_leaf, bonus=lambda state, node: p_target[node])


def test_the_loop_with_the_papers_choices_is_the_reference():
    """The variants' loop is faithful: with post-order and the residual row it has the reference's law."""
    case = own_cases("without_replacement")[1]
    report = check("tree", lambda t, p, q, rng: _loop(t, p, q, rng, pick=_post_order_leaf,
                                                      bonus=lambda state, node: state.mb[node]), cases=[case])
    assert report.ok and report.worst_tv == 0, str(report)


@pytest.mark.parametrize("bug", [no_residual, stale_rate, rate_over_draft_left, draft_row_kept, deepest_leaf_first,
                                 fresh_bonus_row],
                         ids=lambda f: f.__name__)
def test_wrong_variants_are_flagged_with_an_exact_tv(bug):
    report = check("tree", bug, cases=tree_cases("without_replacement") + own_cases("without_replacement"))
    assert not report.ok and isinstance(report.worst_tv, F) and report.worst_tv > 0, str(report)


# --- the rule's parts -----------------------------------------------------------------------------

def test_the_traversal_order_is_post_order_as_in_the_papers_figure_1():
    """Root children X1, X2; X1's children X3, X4; X2's child X5: judged X3, X4, X1, X5, X2 when all fail."""
    tree = DraftTree((-1, 0, 0, 1, 1, 2), (-1, 1, 2, 3, 4, 5))  # node i carries token i
    V = 6
    p_rows = np.array([[F(1, V)] * V] * tree.size, dtype=object)
    q_rows = np.array([[F(0)] + [F(1, 5)] * 5] * tree.size, dtype=object)  # every ratio 5/6: every rate below 1
    judged = []

    class Fails:  # every coin fails (each rate is below 1 here), the last draw takes token 0
        def random(self):
            return 1 - F(1, 10**9)

        def choice(self, n, p):
            return 0

    def record(state, u, x):
        judged.append(x)
        _traversal_residual(state, u, x, replacement=False)

    assert _traverse(tree, p_rows, q_rows, Fails(), record) == ([], 0)
    assert judged == [3, 4, 1, 5, 2]


def test_the_sequence_level_rate_is_the_clipped_product_of_ratios():
    """The paper's motivating numbers: ratio 1/2 at X1 and 4/3 at its child: rate min(1/2 * 4/3, 1) = 2/3, not 1/2."""
    tree = chain_tree([0, 0])
    p_rows = frac(["1/4", "3/4"], ["2/3", "1/3"], ["1/2", "1/2"])
    q_rows = frac(["1/2", "1/2"], ["1/2", "1/2"], ["1/2", "1/2"])
    state = _Traversal(tree, p_rows, q_rows)
    state.refresh(ROOT)
    assert state.pa == [1, F(1, 2), F(2, 3)]
    got = law(lambda rng: len(traversal_verify(tree, p_rows, q_rows, rng)[0]))
    assert got[2] == F(2, 3)  # the whole chain in one test


def test_bad_input():
    rows = np.stack([P[0]] * 3)
    dup = DraftTree((-1, 0, 0), (-1, 1, 1))
    with pytest.raises(SpecrefError, match="needs the draft rows"):
        traversal_verify(dup, rows, None, np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="node 0: children 1 and 2 both carry token 1"):
        traversal_verify(dup, rows, rows.copy(), np.random.default_rng(0))
    path, token = traversal_verify(dup, rows, rows.copy(), np.random.default_rng(0), replacement=True)
    assert dup.check_path(path) == path and 0 <= token < 3
