"""The tree oracle level: correct verifiers pass exactly, every tree bug is caught, the coin adapter works."""

import pytest

from specref.core import tree_verify
from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.oracle import check
from specref.verification.running.report import INVALID, RAISED
from specref.verification.levels.trees.sampled import from_coins, sglang_style_kernel, tree_cases
from specref.verification.oracle import check_tree
from specref.verification.zoo.trees import tree_bugs


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


def test_the_point_mass_loop_with_its_reference_hooks_passes_exactly():
    # the loop two tree bugs replace one hook of (the judged row, the renormalisation) is correct as it is
    from specref.verification.zoo.trees import _pointmass_loop

    report = check_tree(lambda tree, p, q, rng: _pointmass_loop(tree, p, rng), drafting="topk")
    assert report.ok and report.worst_tv == 0, str(report)


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
    from specref.verification.levels.trees.sampled import batched_reference_kernel
    from specref.verification.oracle import check_tree_batch

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


def test_tree_batches_run_under_settings_like_every_level():
    """check_tree_batch goes through the one case runner: Settings are validated and honoured
    (statistical mode, the path budget), a kernel that hangs gets its time limit."""
    import time

    from specref.verification.levels.trees.sampled import batched_reference_kernel
    from specref.verification.oracle import check_tree_batch

    cases = tree_cases()[:1]
    with pytest.raises(SpecrefError, match="tolerance"):
        check_tree_batch(batched_reference_kernel, cases=cases, tolerance=1.0)
    with pytest.raises(SpecrefError, match="batch"):
        check_tree_batch(batched_reference_kernel, batch=0, cases=cases)
    # N = 20,000 pairs of blocks; alpha = 1e-6: a correct kernel is rejected with probability 1e-6
    stat = check_tree_batch(batched_reference_kernel, cases=cases, mode="statistical", samples=20_000, progress=False)
    assert stat.ok and stat.results[0].n_samples == 20_000, str(stat)

    def shared_coins(candidates, first, sibling, coins, finals, p):
        return batched_reference_kernel(candidates, first, sibling, [coins[0]] * len(coins), [finals[0]] * len(finals), p)

    coupled = check_tree_batch(shared_coins, cases=cases, mode="statistical", samples=20_000, progress=False)
    assert not coupled.ok, str(coupled)  # rows that share coins: the joint law is far from the product
    budget = check_tree_batch(batched_reference_kernel, cases=cases, batch=4, max_paths=1000)
    assert budget.results[0].status != "ok" and "max_paths" in budget.results[0].detail, str(budget)

    def hangs(*args):
        time.sleep(30)

    start = time.monotonic()
    slow = check_tree_batch(hangs, cases=cases, time_limit=0.5)
    assert slow.results[0].status == "timeout" and time.monotonic() - start < 10


def test_only_trailing_padding_is_dropped_from_accept_index():
    """A -1 with an accepted node after it is not padding: `invalid output` naming the row and position
    (dropping every -1 used to turn [0, 1, -1, 3] into the valid path [1, 3] and pass the kernel)."""
    from specref.verification.levels.trees.sampled import batched_reference_kernel
    from specref.verification.oracle import check_tree_batch

    def gap(*args):  # the reference kernel with a -1 written after the first accepted node
        accept, token = sglang_style_kernel(*args)
        return accept[:2] + [-1] + accept[2:], token

    report = check_tree(from_coins(gap), cases=tree_cases()[:1])  # widths (2, 2): some paths accept two nodes
    assert report.results[0].status == INVALID, str(report)
    assert "path[1] = -1 but accepted node" in report.results[0].detail, report.results[0].detail

    def gap_rows(*args):
        rows, tokens = batched_reference_kernel(*args)
        return [row[:2] + [-1] + row[2:] for row in rows], tokens

    report = check_tree_batch(gap_rows, cases=tree_cases()[:1])
    assert report.results[0].status == INVALID, str(report)
    assert "row 0: accept_index[0][2] = -1 but accepted node" in report.results[0].detail, report.results[0].detail

    def trailing(*args):  # trailing padding is padding: the law is the reference's
        rows, tokens = batched_reference_kernel(*args)
        return [row + [-1, -1] for row in rows], tokens

    assert check_tree_batch(trailing, cases=tree_cases()[:1]).worst_tv == 0
    assert check_tree(from_coins(lambda *a: (lambda r: (r[0] + [-1], r[1]))(sglang_style_kernel(*a))),
                      cases=tree_cases()[:1]).worst_tv == 0
