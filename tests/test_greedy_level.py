"""The greedy tree levels: SGLang's ``verify_tree_greedy`` call and the one-tree step form.

The expected law is the argmax path (a point mass, or split uniformly among tied maxima when the
implementation declares ``ties="split"``), exact in Fractions.  The references pass; kernels that
stop one level short, ignore siblings, read the bonus at the wrong node, or break ties the wrong
way are flagged with the node named; SGLang's own Triton kernel (sglang 0.5.23, in Triton's
interpreter) passes.  The real-kernel tests need the pinned wheels (``python
scripts/fetch_engines.py``) and torch, and are skipped without.
"""

import inspect
from fractions import Fraction
from functools import partial

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree
from specref.verification.levels import LEVELS
from specref.verification.levels.trees.greedy import (PARAMETERS, SOURCE, GreedyTreeCase, argmax_law, declare_ties,
                                                default_greedy_cases, greedy_reference, greedy_step_reference,
                                                sglang_inputs, sglang_step)
from specref.verification.oracle import check
from tests.implementations import engines_missing



def cases(*names):
    by_name = {c.name: c for c in default_greedy_cases()}
    return [by_name[n] for n in names] if names else list(by_name.values())


MISSING = engines_missing()
needs_engines = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


# ---------------------------------------------------------------- the law


def test_the_levels_are_registered_with_sglangs_call_and_the_step_form():
    assert SOURCE == ("sglang", "0.5.23", "sglang/kernels/ops/speculative/spec_tree.py", "verify_tree_greedy_triton")
    assert tuple(inspect.signature(greedy_reference).parameters) == PARAMETERS
    assert LEVELS["greedy_tree"].signature.startswith("kernel(predicts [B N], accept_index [B, S]")
    assert LEVELS["greedy_tree_step"].signature == "step(tree, p_target [N, V], rng) -> (path, next_token)"


def test_the_law_follows_the_first_matching_child_and_splits_ties_exactly():
    (ties,) = cases("ties")
    tree, rows = ties.trees[0], ties.target[0]  # root: tokens 1 and 3 tie; node 1: 0, 2, 3; node 3: 0, 1
    assert argmax_law(tree, rows) == {((2,), 0): 1}
    split = argmax_law(tree, rows, "split")
    below_node_1 = {((1,), 0): Fraction(1, 6), ((1,), 3): Fraction(1, 6), ((1, 3), 0): Fraction(1, 12),
                    ((1, 3), 1): Fraction(1, 12)}
    assert split == {((2,), t): Fraction(1, 8) for t in range(4)} | below_node_1
    (dup,) = cases("duplicate-children")
    assert argmax_law(dup.trees[0], dup.target[0]) == {((1,), 0): 1}  # node 1, not the deeper duplicate node 2


def test_the_call_is_laid_out_as_sglangs_caller_allocates_it():
    (c,) = cases("padded-batch")  # trees of 4, 1 and 3 nodes in a dense batch of N = 4
    predict = [[int(np.argmax(np.asarray(r, dtype=float))) for r in rows] for rows in c.target]
    predicts, ai, num, cand, index, first, sibling, tp = sglang_inputs(c, predict)
    assert predicts.tolist() == [0] * 12 and ai.shape == (3, 4) and (ai == -1).all() and num.tolist() == [0, 0, 0]
    assert index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert first[1].tolist() == [-1] * 4 and sibling[1].tolist() == [-1] * 4  # padding: linked from nowhere
    assert cand[1, 1:].tolist() == [1, 1, 1] == tp[1, 1:].tolist()  # ... and carrying the root's argmax
    assert first[2].tolist() == [1, -1, -1, -1] and sibling[2].tolist() == [-1, 2, -1, -1]


# ---------------------------------------------------------------- the references pass


@pytest.mark.parametrize("ties", ["lowest", "split"])
def test_the_sglang_call_reference_passes_exactly(ties):
    report = check("greedy_tree", declare_ties(greedy_reference, ties))
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


@pytest.mark.parametrize("step", [greedy_step_reference, sglang_step(greedy_reference),
                                  declare_ties(partial(greedy_step_reference, ties="split"), "split")])
def test_the_step_references_pass_exactly(step):
    report = check("greedy_tree_step", step)
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


# ---------------------------------------------------------------- wrong kernels are flagged, the node named


def _walk(predicts, accept_index, accept_token_num, candidates, retrieve_index, next_token, next_sibling,
          target_predict, *, short=0, siblings=True, bonus_at_parent=False):
    """SGLang's walk with one fault switched on."""
    B, N = candidates.shape
    S, flat = accept_index.shape[1], target_predict.reshape(-1)
    for b in range(B):
        cur = 0
        last = parent = int(retrieve_index[b][0])
        accept_index[b][0], n = last, 0
        for _ in range(1, S - short):  # short = 1: the loop bound one level short
            want, child = flat[last], int(next_token[b][cur])
            while child != -1 and candidates[b][child] != want:
                child = int(next_sibling[b][child]) if siblings else -1
            if child == -1:
                break
            predicts[last] = want
            n, parent, last, cur = n + 1, last, int(retrieve_index[b][child]), child
            accept_index[b][n] = last
        accept_token_num[b] = n
        predicts[last] = flat[parent if bonus_at_parent else last]


@pytest.mark.parametrize("fault, case, words", [
    (dict(short=1), "chain-to-leaf-padded", "tree 0: stopped at node 2, but its child node 3 carries the target's "
                                            "argmax 0 there"),
    (dict(siblings=False), "ties", "tree 0: stopped at node 0, but its child node 2 carries the target's argmax 1"),
    (dict(bonus_at_parent=True), "duplicate-children", "tree 0: next token 1 at node 1, but the target's argmax there "
                                                       "is 0"),
])
def test_faulty_sglang_kernels_are_flagged_with_the_node_named(fault, case, words):
    report = check("greedy_tree", partial(_walk, **fault), cases=cases(case))
    (r,) = report.results
    assert r.status == "differs" and r.tv == 1 and r.detail.startswith(words), str(report)


def _ties_highest(tree, p_target, rng):
    path, cur = [], 0
    while True:
        row = list(p_target[cur])
        t = max(range(len(row)), key=lambda j: (row[j], j))
        child = next((c for c in tree.children(cur) if tree.tokens[c] == t), None)
        if child is None:
            return path, t
        path.append(child)
        cur = child


def _random_split(tree, p_target, rng):
    return greedy_step_reference(tree, p_target, rng, ties="split")


def test_ties_to_the_highest_id_are_flagged_at_the_tied_node():
    report = check("greedy_tree_step", _ties_highest)
    status = {r.case.name: r for r in report.results}
    assert status["ties"].status == "differs" and "at node 0 accepted node 1 (token 3), but the target's argmax at " \
        "node 0 is 1 (tied maxima [1, 3]; ties='lowest')" in status["ties"].detail, str(report)
    assert all(r.ok for name, r in status.items() if name != "ties")  # no tie on their paths: no difference


def test_a_decoder_splitting_ties_passes_when_it_declares_it_and_only_then():
    assert check("greedy_tree_step", declare_ties(_random_split, "split")).ok
    lowest = check("greedy_tree_step", _random_split, cases=cases("ties"))
    assert lowest.results[0].status == "differs" and lowest.results[0].tv == Fraction(7, 8)
    always_lowest = check("greedy_tree_step", declare_ties(greedy_step_reference, "split"), cases=cases("ties"))
    assert always_lowest.results[0].status == "differs"
    assert "not with the split law" in always_lowest.results[0].detail


def test_statistical_mode_takes_point_masses_and_split_laws():
    ok = check("greedy_tree_step", declare_ties(_random_split, "split"), mode="statistical", samples=2000, seed=1,
               progress=False)
    assert ok.ok, str(ok)
    bad = check("greedy_tree_step", _random_split, cases=cases("ties", "duplicate-children"), mode="statistical",
                seed=2, progress=False)
    ties, dup = bad.results
    assert ties.status == "differs" and "tree 0: at node 0 accepted node 1" in ties.detail, str(bad)
    assert dup.ok and dup.n_samples == 230  # a point mass: 230 samples detect a 1% stray rate with power 0.9


def test_a_kernel_that_forgets_the_batch_offset_is_an_invalid_output():
    def local_index(predicts, accept_index, accept_token_num, candidates, retrieve_index, *rest):
        greedy_reference(predicts, accept_index, accept_token_num, candidates,
                         retrieve_index - retrieve_index[:, :1], *rest)

    report = check("greedy_tree", local_index, cases=cases("distinct-children"))
    (r,) = report.results
    assert r.status == "invalid output" and r.detail.startswith("row 1: accept_index[1, 0] = 0, not the root's index 7")


def test_malformed_cases_are_refused():
    tree = DraftTree((-1, 0), (-1, 5))
    with pytest.raises(SpecrefError, match="out of range"):
        check("greedy_tree", greedy_reference, cases=[GreedyTreeCase("bad", (tree,), (np.full((2, 3), 1 / 3),))])
    with pytest.raises(SpecrefError, match="GreedyTreeCase"):
        check("greedy_tree", greedy_reference, cases=[object()])
    with pytest.raises(SpecrefError, match="ties must be one of"):
        declare_ties(greedy_reference, "highest")


# ---------------------------------------------------------------- SGLang's own kernel


def real_sglang_greedy():
    """sglang 0.5.23's ``verify_tree_greedy_triton`` in the level's call: NumPy buffers, written back in place."""
    import torch

    from specref.adapters.real_engines import sglang

    verify, shim = sglang._sglang("greedy")

    def kernel(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
               retrieve_next_sibling, target_predict):
        outs = [torch.from_numpy(np.ascontiguousarray(a)) for a in (predicts, accept_index, accept_token_num)]
        ins = [torch.from_numpy(np.array(a, dtype=np.int64))  # a copy: the inputs are handed read-only
               for a in (candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict)]
        with shim.active():
            verify(*outs, *ins)
        for buffer, out in zip((predicts, accept_index, accept_token_num), outs):
            buffer[...] = out.numpy()

    kernel.__name__ = "sglang_verify_tree_greedy_triton"
    return kernel, verify


@needs_engines
def test_sglangs_kernel_has_the_documented_signature():
    _, verify = real_sglang_greedy()
    assert tuple(inspect.signature(verify).parameters) == PARAMETERS


@needs_engines
@pytest.mark.parametrize("ties", ["lowest", "split"])
def test_sglangs_kernel_follows_the_argmax_path(ties):
    """Every default case: ties, duplicated children, a padded dense batch; ``split``: every tied
    argmax the rule can meet handed over as ``target_predict`` (48 calls on the ``ties`` case)."""
    kernel, _ = real_sglang_greedy()
    report = check("greedy_tree", declare_ties(kernel, ties), time_limit=60.0)
    print(f"\n{report}")
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


@needs_engines
def test_sglangs_kernel_in_the_step_form():
    kernel, _ = real_sglang_greedy()
    report = check("greedy_tree_step", sglang_step(kernel), time_limit=60.0)
    assert report.ok, str(report)


def test_statistical_mode_runs_isolated_by_default():
    """An implementation that ends its process is a status, not the end of the check: the greedy
    levels' statistical mode runs each case in a forked worker unless told otherwise."""
    import os

    parent = os.getpid()

    def exits(tree, p_target, rng):
        if os.getpid() != parent:
            os._exit(0)
        raise RuntimeError("called in the checking process")

    report = check("greedy_tree_step", exits, mode="statistical", samples=50)
    assert report.results and {r.status for r in report.results} == {"crashed"}, report
