"""The tree oracle level: correct verifiers pass exactly, every tree bug is caught, the coin adapter works."""

import numpy as np
import pytest

from specref.core import tree_verify
from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.oracle import check
from specref.verification.report import INVALID, RAISED
from specref.verification.trees import check_tree, from_coins, sglang_style_kernel, tree_cases
from specref.verification.zoo_trees import tree_bugs


def test_the_level_is_registered_with_the_oracle():
    assert "tree" in LEVELS and "(path, next_token)" in LEVELS["tree"].signature


@pytest.mark.parametrize("name, drafting", [
    ("pointmass", "topk"), ("rrs_with_replacement", "iid"), ("rrs_without_replacement", "without_replacement"),
    ("kseq", "iid"),
])
def test_reference_verifiers_pass_exactly(name, drafting):
    report = check_tree(tree_verify.VERIFIERS[name], drafting=drafting)
    assert report.ok and report.worst_tv == 0 and len(report.results) >= 4, str(report)


def test_the_sglang_style_kernel_passes_through_the_coin_adapter():
    report = check("tree", from_coins(sglang_style_kernel))  # default cases: top-k trees
    assert report.ok and report.worst_tv == 0, str(report)


@pytest.mark.parametrize("bug", tree_bugs("tree"), ids=lambda b: b.name)
def test_every_tree_bug_is_detected_in_exact_mode(bug):
    report = check_tree(bug.fn, drafting=bug.drafting)
    assert not report.ok and report.worst_tv > 0, str(report)


def test_typical_acceptance_is_reported_not_passed():
    report = check_tree(tree_verify.typical_acceptance)
    assert not report.ok and report.worst_tv > 0


def test_statistical_mode_passes_the_reference_and_catches_a_bug():
    # N = 2000 per case at alpha = 1e-6: the reference fails with probability <= 5e-6 (5 cases x alpha);
    # the chosen bug has exact TV 3/10 on three cases, far above what N = 2000 resolves (~0.07).
    ok = check_tree(tree_verify.pointmass_verify, mode="statistical", samples=2000, seed=3)
    assert ok.ok, str(ok)
    bug = next(b for b in tree_bugs("tree") if b.name == "node_row_off_by_one")
    bad = check_tree(bug.fn, mode="statistical", samples=2000, seed=3)
    assert not bad.ok


def test_misbehaviour_is_a_status():
    report = check_tree(lambda tree, p, q, rng: ([5, 1], 0), cases=tree_cases()[:1])
    assert report.results[0].status == INVALID
    report = check_tree(lambda tree, p, q, rng: 1 / 0, cases=tree_cases()[:1])
    assert report.results[0].status == RAISED
    with pytest.raises(SpecrefError, match="TreeCase"):
        check("tree", tree_verify.pointmass_verify, cases=[object()])


def test_dense_batches_of_trees_are_checked_jointly():
    from specref.verification.trees import batched_reference_kernel, check_tree_batch

    cases = tree_cases()[:2]
    ok = check_tree_batch(batched_reference_kernel, cases=cases)
    assert ok.ok and ok.worst_tv == 0, str(ok)

    def shared_coins(candidates, first, sibling, coins, finals, p):  # every row reads row 0's coins
        return batched_reference_kernel(candidates, first, sibling, [coins[0]] * len(coins),
                                        [finals[0]] * len(finals), p)

    bad = check_tree_batch(shared_coins, cases=cases)
    assert not bad.ok and bad.worst_tv > 0  # each row alone is right; the rows are not independent
    one_row = check_tree_batch(shared_coins, batch=1, cases=cases)
    assert one_row.ok  # with B = 1 the coupling cannot show
    broken = check_tree_batch(lambda *args: ([[0, 9]], [0]), batch=1, cases=cases[:1])
    assert broken.results[0].status == INVALID
