"""User-built trees at the tree level: each drafting's expected law, wrong engines with their exact TV,
and malformed trees refused at the door naming the node and the field."""

from fractions import Fraction as F

import numpy as np
import pytest

from specref.core import tree_verify
from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree
from specref.decoding.tree import draft_on_shape
from specref.verification.laws.enumeration import law
from specref.verification.levels.trees.sampled import (UserTreeCase, from_coins, sglang_style_kernel, tree_program,
                                               user_tree_cases)
from specref.verification.oracle import check_tree, check_tree_batch
from specref.verification.zoo.trees import USER_TREE_BUGS, _running_sum_loop


def frac(*rows):
    return np.array([[F(v) for v in row] for row in rows], dtype=object)


# bigram tables, V = 3 (the default user trees use the same ones); the root follows prompt token 0
P = frac(["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"])
Q = frac(["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"])
CASES = {c.name: c for c in user_tree_cases()}


def rows_of(tokens):
    """Each slot's q row: the draft's row after its token (the root: after the prompt's 0)."""
    return np.stack([Q[0] if i == 0 else Q[t] for i, t in enumerate(tokens)])


def one_level(tokens, drafting="deterministic", q=True):
    """A depth-1 user tree: the root's children carry ``tokens``, in that order."""
    slots = (-1,) + tuple(tokens)
    return UserTreeCase("one-level", P, (-1,) + (0,) * len(tokens), slots, q_draft=rows_of(slots) if q else None,
                        drafting=drafting)


def tv_of_first_token(law_first):
    """TV between a first-token law and the target's P[0]: for a depth-1 tree whose second token always
    follows the target's row after the first (a fresh bonus row or the completion), it is the block's TV."""
    return sum(abs(law_first[x] - P[0][x]) for x in range(3)) / 2


# ---------------------------------------------------------------- the reference rules pass exactly


@pytest.mark.parametrize("name, verify, kinds", [
    ("pointmass", tree_verify.pointmass_verify, sorted(CASES)),  # lossless for children chosen without its coins
    ("sglang kernel", from_coins(sglang_style_kernel), ["topk-with-q", "topk-point-mass", "sglang-padded",
                                                        "without-replacement"]),
    ("rrs_with_replacement", tree_verify.rrs_with_replacement, ["iid"]),
    ("kseq", tree_verify.kseq_verify, ["iid"]),
    ("traversal, i.i.d.", lambda t, p, q, rng: tree_verify.traversal_verify(t, p, q, rng, replacement=True), ["iid"]),
    ("rrs_without_replacement", tree_verify.rrs_without_replacement, ["without-replacement"]),
    ("traversal", tree_verify.traversal_verify, ["without-replacement"]),
])
def test_reference_rules_have_the_target_law_on_user_trees(name, verify, kinds):
    report = check_tree(verify, cases=[CASES[k] for k in kinds])
    assert report.ok and report.worst_tv == 0 and len(report.results) == len(kinds), str(report)


def test_the_implementation_gets_the_q_rows_it_was_given_and_the_tree_without_padding():
    seen = []

    def recording(tree, p_target, q_draft, rng):
        seen.append((tree, None if q_draft is None else q_draft.copy()))
        return tree_verify.pointmass_verify(tree, p_target, q_draft, rng)

    check_tree(recording, isolate=False, cases=[CASES["topk-with-q"]])
    tree, q = seen[-1]
    assert q is not None and (q == rows_of((-1, 0, 1, 0, 1, 1, 2))).all()  # q given for top-k children: handed on
    seen.clear()
    check_tree(recording, isolate=False, cases=[CASES["topk-point-mass"]])
    assert seen[-1][1] is None
    seen.clear()
    check_tree(recording, isolate=False, cases=[CASES["sglang-padded"]])  # slots 2 and 5 are padding: nodes 0, 1, 3, 4 remain
    tree, q = seen[-1]
    assert tree == DraftTree((-1, 0, 0, 1), (-1, 1, 0, 1)) and CASES["sglang-padded"].slots == (0, 1, 3, 4)
    assert (q == np.stack([Q[0], Q[1], Q[0], Q[1]])).all()


def test_a_sampled_tree_is_redrawn_from_its_rows_and_why():
    # the law of the redrawn tokens is the product of the q rows (i.i.d. under the root, node 1's child from q[1])
    case = CASES["iid"]  # root children 1, 2, 3 (q row Q[0]); node 4 under node 1 (node 1's row, Q[0])
    got = law(lambda rng: draft_on_shape(case.tree, case.q_rows, "iid", rng).tokens)
    assert dict(got) == {(-1, a, b, c, d): Q[0][a] * Q[0][b] * Q[0][c] * Q[0][d]
                         for a in range(3) for b in range(3) for c in range(3) for d in range(3)}
    # the user's own draw held fixed: RRS's law given that one tree is not the target's (so the level redraws).
    # By hand: children 0, 0, 2 under the root, p0 = (1/5, 1/2, 3/10), q0 = (3/5, 3/10, 1/10): the first 0 is
    # accepted w.p. 1/3, else p~ = (0, 1/2, 1/2); the second 0 w.p. 0, then p~ = norm(0, 1/5, 2/5) = (0, 1/3, 2/3);
    # token 2 w.p. min(1, (2/3)/(1/10)) = 1.  So token 1, of target probability 1/2, is never emitted first.
    tree, rows = case.tree, case.q_rows
    p_rows = np.stack([P[0], P[0], P[0], P[2], P[1]])  # after the prompt's 0; after 0; after 0; after 2; after 0, 1

    def first_token(rng):
        path, y = tree_verify.rrs_with_replacement(tree, p_rows, rows, rng)
        return tree.tokens[path[0]] if path else y

    fixed = law(first_token)
    assert dict(fixed) == {0: F(1, 3), 2: F(2, 3)}


# ---------------------------------------------------------------- wrong engines, each with its exact TV


def test_min_p_over_q_on_topk_children_has_tv_3_10():
    # top-2 children 0, 1 of q0 = (3/5, 3/10, 1/10), p0 = (1/5, 1/2, 3/10), by hand: accept 0 w.p.
    # min(1, (1/5)/(3/5)) = 1/3; else p~ = norm(max(p0 - q0, 0)) = (0, 1/2, 1/2) and token 1 is accepted
    # w.p. min(1, (1/2)/(3/10)) = 1: first token (1/3, 2/3, 0) against p0, TV = 3/10
    bug = USER_TREE_BUGS["min_p_over_q_on_topk"]
    case = UserTreeCase("top-2", P, (-1, 0, 0), (-1, 0, 1), q_draft=rows_of((-1, 0, 1)), ties="lowest")
    report = check_tree(bug.fn, cases=[case])
    assert report.worst_tv == tv_of_first_token((F(1, 3), F(2, 3), F(0))) == F(3, 10), str(report)
    assert check_tree(tree_verify.pointmass_verify, cases=[case]).worst_tv == 0  # the rule for top-k children


@pytest.mark.parametrize("name", ["duplicates_counted_twice", "dedup_adjacent_only"])
def test_repeated_children_counted_twice_have_tv_1_5(name):
    # root children carry 1, 2, 1; one coin u, buckets by running sum of p0 = (1/5, 1/2, 3/10): [0, 1/2) token 1,
    # [1/2, 4/5) token 2, [4/5, 13/10) token 1 again: first token (0, 7/10, 3/10) against p0, TV = 1/5
    report = check_tree(USER_TREE_BUGS[name].fn, cases=[one_level((1, 2, 1))])
    assert report.worst_tv == tv_of_first_token((F(0), F(7, 10), F(3, 10))) == F(1, 5), str(report)
    for ok in (tree_verify.pointmass_verify, lambda t, p, q, rng: _running_sum_loop(t, p, rng)):
        assert check_tree(ok, cases=[one_level((1, 2, 1))]).worst_tv == 0  # the repeat skipped: the target law


def test_an_adjacent_repeat_is_skipped_correctly_by_the_adjacent_dedup():
    report = check_tree(USER_TREE_BUGS["dedup_adjacent_only"].fn, cases=[one_level((1, 1, 2))])
    assert report.ok and report.worst_tv == 0, str(report)  # its bug needs [a, b, a]


@pytest.mark.parametrize("bug", USER_TREE_BUGS.values(), ids=lambda b: b.name)
def test_every_user_tree_bug_is_detected_on_its_default_trees(bug):
    report = check_tree(bug.fn, cases=[c for c in CASES.values() if c.drafting == bug.drafting])
    assert not report.ok and report.worst_tv > 0, str(report)


def test_statistical_mode_on_a_user_tree():
    # N = 2000 at alpha = 1e-6: the reference fails with probability <= 1e-6; the bug's exact TV on this
    # case is 97/200 (exact mode, above), far above what N = 2000 resolves (~0.07)
    case = CASES["topk-with-q"]
    assert check_tree(USER_TREE_BUGS["min_p_over_q_on_topk"].fn, cases=[case]).worst_tv == F(97, 200)
    ok = check_tree(tree_verify.pointmass_verify, cases=[case], mode="statistical", samples=2000, seed=3)
    assert ok.ok, str(ok)
    bad = check_tree(USER_TREE_BUGS["min_p_over_q_on_topk"].fn, cases=[case], mode="statistical", samples=2000, seed=3)
    assert not bad.ok, str(bad)


# ---------------------------------------------------------------- malformed trees, at the door


def make(parents=(-1, 0, 0, 1), tokens=(-1, 0, 1, 2), q="rows", **options):
    rows = rows_of(tokens) if isinstance(q, str) else q
    return UserTreeCase("bad", P, parents, tokens, q_draft=rows, **options)


@pytest.mark.parametrize("options, message", [
    (dict(parents=(-1, 3, 0, 1)), r"node 1: its parent links form a cycle through node 1 \(parents\)"),
    (dict(parents=(-1, 0, 3, 0)), r"node 2: its parent 3 comes after it; parents must precede children "
                                  r"\(parents\[2\]\)"),
    (dict(tokens=(-1, 0, 5, 2), q=None), r"node 2: token 5 is outside the vocabulary 0..2 \(tokens\[2\]\)"),
    (dict(tokens=(-1, 1, 1, 2)), r"node 0: children 1 and 2 both carry token 1; drafting 'topk' draws distinct "
                                 r"children \(tokens\[2\]\)"),
    (dict(tokens=(-1, 1, 1, 2), drafting="without_replacement"), r"node 0: children 1 and 2 .*'without_replacement'"),
    (dict(ties="random"), r"ties must be one of \('any', 'lowest'\), got 'random'"),
    (dict(drafting="beam"), r"drafting must be one of"),
    (dict(q=None, drafting="iid"), r"drafting 'iid' samples the children from q: q_draft \[slots, V\] is needed"),
    (dict(parents=(-1, 0, -1, 1), tokens=(-1, 0, 1, 2)), r"node 2: parents\[2\] = -1 but tokens\[2\] = 1"),
    (dict(parents=(-1, -1, 0, 1), tokens=(-1, -1, 1, 2)), r"node 3: its parent 1 is a padded slot, not a node "
                                                           r"\(parents\[3\]\)"),
])
def test_a_malformed_tree_names_the_node_and_the_field(options, message):
    with pytest.raises(SpecrefError, match=message):
        make(**options)


def test_q_rows_with_the_wrong_count():
    with pytest.raises(SpecrefError, match=r"q_draft must have shape \[slots, V\] = \[4, 3\].*got \(3, 3\)"):
        make(q=rows_of((-1, 0, 1)))


def test_q_rows_with_the_wrong_vocabulary():
    with pytest.raises(SpecrefError, match=r"q_draft must have shape \[slots, V\] = \[4, 3\].*got \(4, 4\)"):
        make(q=np.full((4, 4), F(1, 4), dtype=object))


def test_q_rows_that_are_not_distributions():
    q = rows_of((-1, 0, 1, 2))
    q[2] = [F(1, 2), F(1, 4), F(1, 5)]
    with pytest.raises(SpecrefError, match=r"node 2: q_draft\[2\] is not a distribution: it sums to 19/20"):
        make(q=q)


def test_q_zero_at_a_drafted_token():
    q = rows_of((-1, 0, 1, 2))
    q[1] = [F(1, 2), F(1, 2), F(0)]  # node 3 carries token 2 under node 1
    with pytest.raises(SpecrefError, match=r"node 3: token 2 has q_draft\[1, 2\] = 0 at its parent 1.*"
                                           r"\(q_draft\[1\]\[2\]\)"):
        make(q=q, drafting="deterministic")


def test_topk_children_that_are_not_the_top_k_of_q():
    # q0 = (3/5, 3/10, 1/10): the top-2 are 0, 1; children 0, 2 are not, whatever the tie rule
    with pytest.raises(SpecrefError, match=r"node 2: token 2 \(q = 1/10\) is a child of node 0 but token 1"):
        make(parents=(-1, 0, 0), tokens=(-1, 0, 2))
    with pytest.raises(SpecrefError, match=r"node 1: token 1 is child 0 of node 0, but the draft's rank-0 token"):
        make(parents=(-1, 0, 0), tokens=(-1, 1, 0), ties="lowest")  # the right set in the wrong order
    make(parents=(-1, 0, 0), tokens=(-1, 1, 0))  # ties="any": the set is what counts
    make(parents=(-1, 0, 0), tokens=(-1, 0, 2), drafting="deterministic")  # any choice without the coins


def test_padded_slots_in_sglang_links_and_the_errors_name_the_slot():
    case = CASES["sglang-padded"]
    assert case.tree.size == 4 and case.parents == (-1, 0, -1, 0, 1, -1)
    with pytest.raises(SpecrefError, match=r"node 2 is not reachable from the root through the links and carries "
                                           r"token 1 \(candidates\[2\]\)"):
        UserTreeCase.from_sglang("bad", P, [0, 1, 1], [1, -1, -1], [-1, -1, -1])
    with pytest.raises(SpecrefError, match=r"node 3: token 2 has q_draft\[1, 2\] = 0"):  # slot 3's parent is slot 1
        q = rows_of((-1, 1, -1, 2))
        q[1] = [F(1, 2), F(1, 2), F(0)]
        UserTreeCase.from_sglang("bad", P, [0, 1, -1, 2], [1, 3, -1, -1], [-1, -1, -1, -1], q_draft=q,
                                 drafting="deterministic")


def test_the_batch_level_refuses_user_trees():
    with pytest.raises(SpecrefError, match="TreeCase"):
        check_tree_batch(lambda *args: None, cases=[CASES["topk-with-q"]])


def test_a_user_tree_is_judged_against_the_target_law_of_its_depth_plus_one():
    # the expected law of a depth-2 tree: 3 tokens after the prompt's 0, the bigram product P[0][a] P[a][b] P[b][c]
    _, expected = tree_program(tree_verify.pointmass_verify, CASES["topk-with-q"], 10.0)
    assert dict(expected) == {(a, b, c): P[0][a] * P[a][b] * P[b][c]
                              for a in range(3) for b in range(3) for c in range(3)}
    _, one = tree_program(tree_verify.pointmass_verify, one_level((1, 2)), 10.0)
    assert dict(one) == {(a, b): P[0][a] * P[a][b] for a in range(3) for b in range(3)}
