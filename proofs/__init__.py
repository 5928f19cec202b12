"""Symbolic proofs of the claims of SPEC §3 and §8/§10, with sympy.

``python -m proofs`` prints each claim, its assumptions, and "proved" or a
counterexample; it exits non-zero if any claim fails.  ``-v`` lists every case.

Each proof splits on the ordering of ``p`` against ``q`` (or on K, by induction),
resolves every ``min``/``max`` from the signs of the case's symbols, and reduces
``lhs - rhs`` to 0 exactly (:mod:`proofs.core`).  Nothing is proved by sampling; the
one numerical part, :mod:`proofs.cross_check`, compares specref's code with the
proved formulas and says so.  Leviathan et al. notation throughout: p is the target,
q the draft.

=====  ==========================================  =========================
claim  what                                         module
=====  ==========================================  =========================
1      single-step mass balance for one token       :mod:`proofs.step_law`
2      the same for V = 2 and V = 3, every ordering :mod:`proofs.step_law`
3      the SPEC §3 worked example, exact            :mod:`proofs.step_law`
4      two-token block law, V = 2, K = 2            :mod:`proofs.block_law`
5      cost model: E[L], S, K = 1, Table 1, best K  :mod:`proofs.cost_model`
6      specref agrees with the symbolic results     :mod:`proofs.cross_check`
7      one-node law of RRS, two children, V = 2, 3  :mod:`proofs.tree_law`
=====  ==========================================  =========================

``proofs`` stands apart: specref never imports it; only the cross-check imports specref.
"""

from __future__ import annotations

from proofs.core import Result

__all__ = ["CLAIMS", "selected", "run_all", "Result"]


def _claims():
    from proofs import block_law, cost_model, cross_check, step_law, tree_law

    return (
        ("1", step_law.prove_single_token),
        ("2", step_law.prove_small_vocab),
        ("3", step_law.prove_worked_example),
        ("4", block_law.prove_block_law),
        ("5a", cost_model.prove_expected_length),
        ("5b", cost_model.prove_cost_example),
        ("5c", cost_model.prove_one_draft_token),
        ("5d", cost_model.prove_table_1),
        ("5e", cost_model.prove_best_k),
        ("6", cross_check.prove_cross_check),
        ("7", tree_law.prove_rrs_one_node),
    )


CLAIMS = _claims()  # (number, function returning a Result), in SPEC order


def selected(only=None):
    """The claims whose number starts with one of ``only`` (all when ``only`` is empty)."""
    return [(num, prove) for num, prove in CLAIMS if not only or any(num.startswith(o) for o in only)]


def run_all(only=None) -> list[tuple[str, Result]]:
    """Run the selected claims: ``[(number, Result)]``."""
    return [(num, prove()) for num, prove in selected(only)]
