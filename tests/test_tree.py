"""Trees as data: the parent-index layout, the engines' layouts, and errors that name the node."""

from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.tree import (DraftTree, chain_tree, check_tree_rows, from_eagle_choices, from_padded, from_sglang,
                               sglang_slots, to_eagle_choices, to_sglang)

# root -> 1 (token 2), 2 (token 0); 1 -> 3 (token 1), 4 (token 0); 2 -> 5 (token 2)
TREE = DraftTree((-1, 0, 0, 1, 1, 2), (-1, 2, 0, 1, 0, 2))


def test_shape_queries():
    assert TREE.size == 6 and TREE.children(0) == [1, 2] and TREE.children(1) == [3, 4] and TREE.children(3) == []
    assert TREE.path(4) == [1, 4] and TREE.path(0) == [] and TREE.depth() == 2 and TREE.depth(5) == 2
    assert not TREE.is_chain() and chain_tree([2, 1]).is_chain()
    assert chain_tree([2, 1]) == DraftTree((-1, 0, 1), (-1, 2, 1))
    assert TREE.check_path([1, 3]) == [1, 3]


@pytest.mark.parametrize("parents, tokens, message", [
    ((-1, 2, 1), (-1, 0, 0), "node 1: its parent links form a cycle"),
    ((-1, 2, 0), (-1, 0, 1), "node 1: its parent 2 comes after it"),
    ((-1, 0, 7), (-1, 0, 1), "node 2: parent 7 is not a node"),
    ((0, 0), (-1, 1), "node 0 is the root"),
    ((-1, 0), (-1, -3), "node 1: token -3 is negative"),
    ((-1, 0), (-1,), "one token per node"),
])
def test_malformed_trees_name_the_node(parents, tokens, message):
    with pytest.raises(SpecrefError, match=message):
        DraftTree(parents, tokens)


def test_duplicate_children_and_bad_paths_name_the_node():
    dup = DraftTree((-1, 0, 0, 1), (-1, 1, 1, 0))
    with pytest.raises(SpecrefError, match="node 0: children 1 and 2 both carry token 1"):
        dup.check_distinct_children()
    TREE.check_distinct_children()  # distinct: no error
    with pytest.raises(SpecrefError, match=r"path\[1\] = 5 is not a child of node 1"):
        TREE.check_path([1, 5])


def _rows(n, V):
    return np.array([[F(1, V)] * V for _ in range(n)], dtype=object)


def test_rows_must_match_the_nodes():
    p = _rows(6, 3)
    check_tree_rows(TREE, p, p.copy())
    with pytest.raises(SpecrefError, match="one row per node"):
        check_tree_rows(TREE, _rows(5, 3))
    with pytest.raises(SpecrefError, match=r"q_draft must have shape \[N, V\] = \[6, 3\]"):
        check_tree_rows(TREE, p, _rows(6, 4))
    with pytest.raises(SpecrefError, match="node 1: token 2 is out of range"):
        check_tree_rows(TREE, _rows(6, 2))
    q = p.copy()
    q[0] = [F(1, 2), F(1, 2), F(0)]  # node 1 carries token 2 under the root's draft row
    with pytest.raises(SpecrefError, match=r"node 1: token 2 has q_draft\[0, 2\] = 0"):
        check_tree_rows(TREE, p, q)
    with pytest.raises(SpecrefError, match="both be Fraction"):
        check_tree_rows(TREE, p, p.astype(np.float64))


def test_sglang_links_round_trip():
    candidates, first, sibling = to_sglang(TREE, root_token=7)
    assert candidates == [7, 2, 0, 1, 0, 2]
    assert first == [1, 3, 5, -1, -1, -1] and sibling == [-1, 2, -1, 4, -1, -1]
    assert from_sglang(candidates, first, sibling) == TREE


def test_sglang_links_that_are_not_a_tree():
    with pytest.raises(SpecrefError, match="node 2 is not reachable"):
        from_sglang([0, 1, 2], [1, -1, -1], [-1, -1, -1])
    with pytest.raises(SpecrefError, match="node 1 is reached twice"):
        from_sglang([0, 1, 2], [1, 1, -1], [-1, -1, -1])
    with pytest.raises(SpecrefError, match="comes after it"):  # node 1's parent is node 2
        from_sglang([0, 1, 2], [2, -1, 1], [-1, -1, -1])


def test_eagle_choices_round_trip():
    choices = [[0], [1], [0, 0], [0, 1], [1, 0]]
    parents, ranks = from_eagle_choices(list(reversed(choices)))  # order of the list does not matter
    assert parents == (-1, 0, 0, 1, 1, 2) and ranks == (-1, 0, 1, 0, 1, 0)
    assert to_eagle_choices(parents, ranks) == choices
    with pytest.raises(SpecrefError, match=r"choice \[1, 0\] has no parent"):
        from_eagle_choices([[0], [1, 0]])
    with pytest.raises(SpecrefError, match="appears twice"):
        from_eagle_choices([[0], [0]])


def test_padded_slots_are_not_nodes():
    # slots 2 and 4 are padding (parent and token -1); the nodes left are numbered in slot order
    tree, slots = from_padded((-1, 0, -1, 1, -1, 0), (-1, 2, -1, 1, -1, 0))
    assert tree == DraftTree((-1, 0, 1, 0), (-1, 2, 1, 0)) and slots == (0, 1, 3, 5)
    assert from_padded(TREE.parents, TREE.tokens) == (TREE, tuple(range(6)))  # no padding: the tree itself
    # SGLang's links: slot 2 is reached by no link and its candidate is -1
    assert sglang_slots([7, 2, -1, 0], [1, -1, -1, -1], [-1, 3, -1, -1]) == ((-1, 0, -1, 0), (-1, 2, -1, 0))


@pytest.mark.parametrize("parents, tokens, message", [
    ((-1, 0, 2, 1), (-1, 0, -1, 1), r"node 2: tokens\[2\] = -1 marks padding but parents\[2\] = 2"),
    ((-1, -1, 0, 1), (-1, -1, 0, 1), r"node 3: its parent 1 is a padded slot, not a node \(parents\[3\]\)"),
    ((-1, 0, 3, 1), (-1, 0, 1, 1), r"node 2: its parent 3 comes after it"),  # named in slot numbers
])
def test_malformed_padded_layouts_name_the_slot(parents, tokens, message):
    with pytest.raises(SpecrefError, match=message):
        from_padded(parents, tokens)


def test_rows_seen_before_are_still_checked_for_their_kind():
    # check_tree_rows remembers Fraction rows it validated; an object row of floats equal to them
    # (0.5 == Fraction(1, 2), same hash) must still be refused, and a changed row still validated
    halves = np.array([[F(1, 2), F(1, 2), F(0)]] * 6, dtype=object)
    check_tree_rows(DraftTree((-1, 0, 0, 1, 1, 2), (-1, 0, 1, 0, 1, 0)), halves)
    floats = np.array([[0.5, 0.5, 0.0]] * 6, dtype=object)
    with pytest.raises(SpecrefError, match="must be a Fraction"):
        check_tree_rows(DraftTree((-1, 0, 0, 1, 1, 2), (-1, 0, 1, 0, 1, 0)), floats)
    off = halves.copy()
    off[3] = [F(1, 2), F(1, 3), F(0)]
    with pytest.raises(SpecrefError, match="row 3 sums to 5/6"):
        check_tree_rows(DraftTree((-1, 0, 0, 1, 1, 2), (-1, 0, 1, 0, 1, 0)), off)
