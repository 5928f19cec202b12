"""The multi-draft yardstick: the transport LP and the subset formula agree, and no verifier beats them."""

from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.tree_verify import (_beta, kseq_rho, kseq_verify, pointmass_verify, rrs_with_replacement,
                                      rrs_without_replacement)
from specref.verification.laws.optimal import (draft_set_law, iid_subset_formula, lp_optimum, node_acceptance,
                                          subset_optimum)


def random_pair(rng, V):
    return [np.array([F(int(c), int(w.sum())) for c in w], dtype=object) for w in rng.integers(1, 9, size=(2, V))]


@pytest.mark.parametrize("V, k", [(3, 2), (4, 2), (3, 3)])
def test_lp_and_subset_formula_agree(V, k):
    rng = np.random.default_rng(10 * V + k)
    for _ in range(3):
        p, q = random_pair(rng, V)
        iid = draft_set_law(q, k)
        assert sum(iid.values()) == 1
        exact = iid_subset_formula(p, q, k)
        assert exact == subset_optimum(p, iid)  # closed formula = min-cut over the set law
        assert abs(lp_optimum(p, iid) - float(exact)) < 1e-9  # = the transport LP
        wor = draft_set_law(q, k, replacement=False)
        assert abs(lp_optimum(p, wor) - float(subset_optimum(p, wor))) < 1e-9


def test_verifiers_stay_below_their_optimum_and_match_known_values():
    rng = np.random.default_rng(3)
    for _ in range(3):
        p, q = random_pair(rng, 3)
        k = 2
        opt_iid = iid_subset_formula(p, q, k)
        rrs, kseq = (node_acceptance(v, p, q, k, "iid") for v in (rrs_with_replacement, kseq_verify))
        assert np.minimum(p, q).sum() <= rrs <= opt_iid and kseq <= opt_iid
        beta = _beta(p, q, kseq_rho(p, q, k))
        assert kseq == 1 - (1 - beta) ** k  # K-SEQ's acceptance, exactly
        wor = node_acceptance(rrs_without_replacement, p, q, k, "without_replacement")
        assert wor <= subset_optimum(p, draft_set_law(q, k, replacement=False))
        top = sorted(range(3), key=lambda j: (-q[j], j))[:k]
        pm = node_acceptance(pointmass_verify, p, q, k, "topk")
        assert pm == sum(p[j] for j in top) == subset_optimum(p, {frozenset(top): F(1)})  # point mass is optimal
    assert node_acceptance(rrs_with_replacement, p, q, 1, "iid") == np.minimum(p, q).sum()
