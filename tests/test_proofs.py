"""The symbolic proofs (SPEC §3, §8, §10): each one holds, and each one can fail."""

from __future__ import annotations

import subprocess
import sys
import types
from fractions import Fraction

import pytest
import sympy as sp

import proofs
from proofs import __main__ as cli
from proofs import block_law, core, cost_model, cross_check, step_law
from proofs.core import AGREES, COUNTEREXAMPLE, INFEASIBLE, PROVED, UNPROVED, Case

F = Fraction


# --- every claim holds ----------------------------------------------------------------


@pytest.mark.parametrize("number, prove", proofs.CLAIMS, ids=[n for n, _ in proofs.CLAIMS])
def test_claim_holds(number, prove):
    result = prove()
    assert result.ok, (result.status, result.counterexample, [c for c in result.cases if not c.ok])
    assert result.statement and result.assumptions
    assert result.status == (AGREES if number == "6" else PROVED)


def test_claim_numbers_follow_the_issue():
    assert [n for n, _ in proofs.CLAIMS] == ["1", "2", "3", "4", "5a", "5b", "5c", "5d", "5e", "6", "7"]


def test_small_vocab_covers_every_ordering():
    result = step_law.prove_small_vocab()
    orderings = len(step_law.ORDERINGS)
    assert len(result.cases) == orderings**2 + orderings**3
    proved = [c for c in result.cases if c.status == PROVED]
    # feasible: at least one token with p > q and one with p < q, or p = q everywhere
    assert len(proved) == (4 + 1) + (30 + 1)
    assert all(c.status in (PROVED, INFEASIBLE) for c in result.cases)


def test_block_law_covers_every_ordering_at_every_position():
    result = block_law.prove_block_law()
    assert sum(c.status == PROVED for c in result.cases) == 5**3  # 5 feasible row patterns, 3 row pairs


def test_single_token_treats_beta_one_separately():
    names = [c.name for c in step_law.prove_single_token().cases]
    assert sum(n.startswith("β = 1") for n in names) == len(step_law.ORDERINGS)
    assert sum(n.startswith("β < 1") for n in names) == len(step_law.ORDERINGS)


# --- the wrong rule is not proved ------------------------------------------------------


def _step_output(p, q, correction):
    """Independent Fraction computation of one step's output law (SPEC §3)."""
    accept = [min(a, b) for a, b in zip(p, q)]
    reject = 1 - sum(accept)
    return [a + reject * c for a, c in zip(accept, correction(p, q))]


def _resample_from_p(p, q):
    return list(p)


def test_single_token_resample_from_p_fails():
    result = step_law.prove_single_token(correction_at=step_law.resample_at)
    assert not result.ok and result.status == COUNTEREXAMPLE
    example = result.counterexample
    (p,), (q,), (beta,) = example["p(x)"], example["q(x)"], example["β"]
    assert min(p, q) + (1 - beta) * p - p == example["lhs - rhs"] != 0


def test_small_vocab_resample_from_p_fails_with_a_real_counterexample():
    result = step_law.prove_small_vocab(correction=step_law.resample_from_target)
    assert result.status == COUNTEREXAMPLE
    example = result.counterexample
    p, q = example["p"], example["q"]
    assert sum(p) == sum(q) == 1 and min(p + q) >= 0
    assert _step_output(p, q, _resample_from_p) != p


def test_block_law_resample_from_p_fails():
    result = block_law.prove_block_law(correction=step_law.resample_from_target)
    assert result.status == COUNTEREXAMPLE
    assert result.counterexample["lhs - rhs"] != 0


def test_worked_example_with_wrong_numbers_fails():
    claimed = dict(step_law.WORKED_EXAMPLE, residual=[0, sp.Rational(1, 3), sp.Rational(2, 3)])
    result = step_law.prove_worked_example(claimed)
    assert result.status == COUNTEREXAMPLE
    assert result.counterexample["got"] == [F(0), F(1, 2), F(1, 2)]


def test_worked_example_matches_an_independent_fraction_computation():
    p, q = [F(1, 5), F(1, 2), F(3, 10)], [F(3, 5), F(3, 10), F(1, 10)]
    excess = [max(F(0), a - b) for a, b in zip(p, q)]
    residual = [e / sum(excess) for e in excess]
    assert residual == [0, F(1, 2), F(1, 2)]
    assert _step_output(p, q, lambda p, q: residual) == p
    assert _step_output(p, q, _resample_from_p) == [F(7, 25), F(1, 2), F(11, 50)]


def test_cost_claims_can_fail():
    wrong_table = dict(cost_model.TABLE_1)
    wrong_table[("0.8", 5)] = ("3.70", "1.63")
    assert cost_model.prove_table_1(wrong_table).status == COUNTEREXAMPLE
    assert cost_model.prove_best_k(claimed_k=5).status == COUNTEREXAMPLE
    wrong = {
        "E[L] at α = 4/5": sp.Rational(336, 100),
        "cost 1 + K·c": sp.Rational(7, 5),
        "S at α = 4/5, to 5 decimals": sp.Rational(240114, 100000),
        "S at α = 1/5, to 5 decimals": sp.Rational(89257, 100000),
    }
    assert cost_model.prove_cost_example(wrong).status == COUNTEREXAMPLE


# --- the machinery ----------------------------------------------------------------------


def test_resolve_min_max_uses_the_case_signs_only():
    q, d = sp.Symbol("q", positive=True), sp.Symbol("d", positive=True)
    x, y = sp.Symbol("x", nonnegative=True), sp.Symbol("y", nonnegative=True)
    assert core.resolve_min_max(sp.Min(1, (q + d) / q, evaluate=False)) == 1
    assert core.resolve_min_max(sp.Max(0, x - (x + d), evaluate=False)) == 0
    undecided = sp.Min(x, y)
    assert core.resolve_min_max(undecided) == undecided


def test_is_identically_zero():
    a, b = sp.symbols("a b", positive=True)
    assert core.is_identically_zero(a / (a + b) + b / (a + b) - 1)
    assert not core.is_identically_zero(a / (a + b) - 1)
    assert not core.is_identically_zero(sp.Min(a, b) - sp.Min(a, b) + sp.Max(a, b, evaluate=False))


def test_a_case_split_too_coarse_is_unproved_not_passed():
    x, y = sp.Symbol("x", nonnegative=True), sp.Symbol("y", positive=True)
    coarse = Case("no ordering of x against y", (x, y), {"p": [x], "q": [y]})
    true_but_undecided = step_law.accepted(x, y) - sp.Min(x, y)
    assert core.check_zero("coarse", {"identity": true_but_undecided}, coarse).status == UNPROVED


def test_check_zero_finds_a_counterexample_inside_the_case():
    q, d = sp.Symbol("q", positive=True), sp.Symbol("d", positive=True)
    case = Case("p > q", (q, d), {"p": [q + d], "q": [q]})
    outcome = core.check_zero("wrong", {"min(p, q) = p": sp.Min(q + d, q, evaluate=False) - (q + d)}, case)
    assert outcome.status == COUNTEREXAMPLE
    (p,), (qv,) = outcome.counterexample["p"], outcome.counterexample["q"]
    assert p > qv > 0 and outcome.counterexample["lhs - rhs"] == qv - p


def test_infeasible_orderings_are_recognised():
    case, why_not = step_law.row_case((">", ">"))
    assert why_not is not None and "cannot be 0" in why_not
    case, why_not = step_law.row_case(("<", ">0"))
    assert why_not is None and len(case.solved) == 2


# --- item 6: the cross-check -------------------------------------------------------------


def test_symbolic_step_matches_a_direct_fraction_computation():
    import random

    rng = random.Random(1)
    for _ in range(50):
        p, q = cross_check.random_pair(rng)
        got = cross_check.symbolic_step(p, q)
        accept = [min(a, b) for a, b in zip(p, q)]
        excess = [max(F(0), a - b) for a, b in zip(p, q)]
        assert got["accepted"] == accept
        assert got["beta"] == sum(accept) == 1 - sum(excess)
        assert got["rejection mass"] == sum(excess)
        assert got["residual"] == (None if sum(excess) == 0 else [e / sum(excess) for e in excess])


@pytest.mark.parametrize("exact", [True, False], ids=["fraction", "float"])
def test_specref_step_agrees_with_symbolic(exact):
    outcome = cross_check.check_step_module(points=150, seed=7, exact=exact)
    assert outcome.status == AGREES, outcome.counterexample


@pytest.mark.parametrize("exact", [True, False], ids=["fraction", "float"])
def test_specref_cost_agrees_with_symbolic(exact):
    outcome = cross_check.check_cost_module(points=150, seed=7, exact=exact)
    assert outcome.status == AGREES, outcome.counterexample


def test_cross_check_catches_a_broken_step():
    from specref.core import step

    broken = types.SimpleNamespace(**{n: getattr(step, n) for n in dir(step) if not n.startswith("__")})
    broken.residual = lambda p, q: p  # SPEC §7 bug 1
    outcome = cross_check.check_step_module(broken, points=100, seed=0)
    assert outcome.status == COUNTEREXAMPLE and outcome.counterexample["quantity"] == "residual"


def test_cross_check_catches_a_broken_cost_model():
    from specref.core import cost

    broken = types.SimpleNamespace(
        expected_tokens=lambda a, k: cost.expected_tokens(a, k - 1) if k > 1 else 1,  # off by one
        speed_ratio=cost.speed_ratio,
        ops_factor=cost.ops_factor,
        best_k=cost.best_k,
    )
    outcome = cross_check.check_cost_module(broken, points=50)
    assert outcome.status == COUNTEREXAMPLE and outcome.counterexample["quantity"] == "expected_tokens"


# --- python -m proofs -------------------------------------------------------------------


def test_command_line_prints_claims_and_exits_zero():
    run = subprocess.run(
        [sys.executable, "-m", "proofs", "3", "5d"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "assumptions:" in run.stdout and "=> PROVED" in run.stdout
    assert "[3] The worked example" in run.stdout and "[5d]" in run.stdout and "[4]" not in run.stdout


def test_command_line_exits_nonzero_and_shows_the_counterexample(monkeypatch, capsys):
    wrong = ("9", lambda: step_law.prove_small_vocab((2,), correction=step_law.resample_from_target))
    monkeypatch.setattr(proofs, "CLAIMS", proofs.CLAIMS + (wrong,))
    assert cli.main(["9"]) == 1
    out = capsys.readouterr().out
    assert "COUNTEREXAMPLE in case" in out and "lhs - rhs" in out and "FAILED: claim 9" in out
