"""The sympy proof of the one-node RRS law: it holds, and the residual-not-updated rule fails it."""

from fractions import Fraction as F

import sympy as sp

from proofs.core import COUNTEREXAMPLE, PROVED
from proofs.tree_law import one_node_law, prove_rrs_one_node


def test_rrs_one_node_law_is_proved_for_both_drafting_schemes():
    result = prove_rrs_one_node()
    assert result.ok and result.status == PROVED and len(result.cases) == 4


def test_the_rule_without_the_residual_update_gets_a_counterexample():
    result = prove_rrs_one_node(vocab_sizes=(2,), update_residual=False)
    assert result.status == COUNTEREXAMPLE
    ce = result.counterexample
    p, q = [sp.Rational(v.numerator, v.denominator) for v in ce["p"]], [sp.Rational(v.numerator, v.denominator)
                                                                       for v in ce["q"]]
    law = one_node_law(p, q, replacement=True, update_residual=False)
    assert [F(str(sp.nsimplify(a - b))) for a, b in zip(law, p)] == ce["law - p"] != [0, 0]


def test_the_symbolic_laws_match_the_code_by_enumeration():
    """Second route: the sympy law at numbers equals the enumerated law of the code, right and wrong."""
    import numpy as np

    from specref.core.tree_verify import rrs_with_replacement, rrs_without_replacement
    from specref.decoding.tree import draft_tree
    from specref.verification.laws.enumeration import law
    from specref.verification.zoo.trees import residual_not_updated

    pf = np.array([F(1, 5), F(1, 2), F(3, 10)], dtype=object)
    qf = np.array([F(3, 5), F(3, 10), F(1, 10)], dtype=object)
    p, q = [sp.Rational(str(v)) for v in pf], [sp.Rational(str(v)) for v in qf]

    def enumerated(verify, scheme):
        def program(rng):
            tree, q_rows, _ = draft_tree((2,), lambda path: qf if not path else pf, scheme, rng)
            path, y = verify(tree, np.stack([pf] * 3), q_rows, rng)
            return tree.tokens[path[0]] if path else y
        got = law(program)
        return [got.get(y, F(0)) for y in range(3)]

    for replacement, update, verify, scheme in [
        (True, True, rrs_with_replacement, "iid"), (False, True, rrs_without_replacement, "without_replacement"),
        (True, False, residual_not_updated, "iid"),
    ]:
        symbolic = [F(str(sp.nsimplify(v))) for v in one_node_law(p, q, replacement=replacement, update_residual=update)]
        assert symbolic == enumerated(verify, scheme)
    assert symbolic != list(pf)  # the wrong rule's law is not p
