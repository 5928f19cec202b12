"""The state check (SPEC §13.5): every passed case judged again after other cases, ``stateful``
when its verdict or exact law changed; the zoo's state-keeping entries (zoo/stateful.py) caught
by it while each passes every case on its own; correct implementations never reported stateful."""

import re
from dataclasses import dataclass
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core import tree_verify
from specref.core.draws import draw
from specref.core.errors import SpecrefError
from specref.verification import oracle
from specref.verification.cases.chain import Case
from specref.verification.levels.batched.steps import BatchedCase
from specref.verification.levels.runner import second_order, shape_key
from specref.verification.levels.trees.sampled import TreeCase
from specref.verification.running.report import OK, STATEFUL, TIMEOUT, Settings
from specref.verification.zoo import chain as chain_zoo
from specref.verification.zoo import engines as engine_zoo
from specref.verification.zoo import stateful

U = ["1/3", "1/3", "1/3"]


def rows(*rs):
    return np.array([[F(v) for v in r] for r in rs], dtype=object)


# Step cases: A and B of one shape (K = 1, V = 3), C of another (K = 2).  Uniform drafts: every
# draft token is drawn, so the memo has every key after one case.
STEP_A = Case("A", rows(["1/2", "1/2", "0"], U, U), rows(U, U, U), k=1)  # residual [1/2, 1/2, 0]
STEP_B = Case("B", rows(["0", "1/2", "1/2"], U, U), rows(U, U, U), k=1)  # residual [0, 1/2, 1/2]
STEP_C = Case("C", STEP_A.target, STEP_A.draft, k=2)
# B after A: x = 0 (probability 1/3) is rejected (p = 0) and corrected from A's residual
# [1/2, 1/2, 0] instead of [0, 1/2, 1/2]; the completion after the first token is the target's
# in both, so the block's TV is that of the first token: 1/3 * 1/2 = 1/6.  A after B: the same
# with x = 2.
STEP_TV = {("B", "A"): F(1, 6), ("A", "B"): F(1, 6)}

# Batched cases (B = 1): A and B of one shape (K = 1), C with K = 2.
BATCH_A = BatchedCase("A", rows(["1/2", "1/2", "0"], U)[None], rows(["1/2", "0", "1/2"])[None])
BATCH_B = BatchedCase("B", rows(["1/2", "0", "1/2"], U)[None], rows(["1/2", "1/2", "0"])[None])
BATCH_C = BatchedCase("C", rows(["1/2", "1/2", "0"], U, U)[None], rows(["1/2", "0", "1/2"], U)[None])
# B judged with A's draft row: x ~ q_B; x = 0 is accepted either way (ratio 1); x = 1 (probability
# 1/2) has q_A(1) = 0, a lane the engine always accepts, so the row emits (1, bonus) where it must
# reject (p_B(1) = 0) and emit (2,): disjoint outputs, TV 1/2.  A judged with B's: the same with
# x = 2 (q_B(2) = 0), (2, bonus) for (1,): TV 1/2.
BATCH_TV = {("B", "A"): F(1, 2), ("A", "B"): F(1, 2)}

# Tree cases (top-k, widths (2,): the root's children are q's top two, tokens 0 and 1, in both).
TREE_Q = rows(["1/2", "3/10", "1/5"], U, U)
TREE_A = TreeCase("A", rows(["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], U), TREE_Q, widths=(2,))
TREE_B = TreeCase("B", rows(["7/10", "1/5", "1/10"], ["1/10", "1/10", "4/5"], U), TREE_Q, widths=(2,))
TREE_C = TreeCase("C", TREE_A.target, TREE_Q, widths=(1,))


def stale_tree_tv(case, before):
    """TV of ``case``'s block (y, z) when its rows are ``before``'s: point-mass verification draws y
    from the root row and, at an accepted child y, z from y's row; a y that is no child (2) is
    completed by the oracle from the true target.  The target law: y ~ p[0], z ~ p[y]."""
    p, s = case.target, before.target
    total = F(0)
    for y in range(3):
        for z in range(3):
            right = p[0][y] * p[y][z]
            stale = s[0][y] * (s[y][z] if y in (0, 1) else p[y][z])
            total += abs(right - stale)
    return total / 2


TREE_TV = {("A", "B"): stale_tree_tv(TREE_A, TREE_B), ("B", "A"): stale_tree_tv(TREE_B, TREE_A)}
LEVEL_CASES = {"step": [STEP_A, STEP_C, STEP_B], "batched": [BATCH_A, BATCH_C, BATCH_B], "tree": [TREE_A, TREE_C, TREE_B]}
EXPECTED_TV = {"step": STEP_TV, "batched": BATCH_TV, "tree": TREE_TV}
DETAIL = re.compile(r"case '(\w)' after case '(\w)': law differs from case '\1' (?:after case '(\w)'|run first) "
                    r"\(TV [0-9.e-]+ = (\d+/\d+); verdicts differs vs ok\)")


def test_the_hand_derived_tree_tvs():
    assert TREE_TV == {("A", "B"): F(107, 200), ("B", "A"): F(107, 200)}  # the same |differences|, swapped


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("bad", [1, 0, "yes", 1.0])
def test_state_check_is_validated(bad):
    with pytest.raises(SpecrefError, match=f"state_check must be True, False or None.*got {re.escape(repr(bad))}"):
        Settings(state_check=bad)


def test_state_check_defaults_to_exact_mode_and_refuses_stores_and_executors():
    assert Settings().checks_state and not Settings(mode="statistical").checks_state
    assert Settings(mode="statistical", state_check=True).checks_state and not Settings(state_check=False).checks_state
    with pytest.raises(SpecrefError, match="shard_store"):
        Settings(mode="statistical", state_check=True, shard_store={})
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool, pytest.raises(SpecrefError, match="executor"):
        Settings(mode="statistical", state_check=True, executor=pool)
    Settings(mode="statistical", shard_store={})  # the default (off in statistical mode) takes a store


# ---------------------------------------------------------------- the second order


@dataclass(frozen=True)
class Shaped:
    name: str
    rows: np.ndarray
    k: int = 1


def shaped(specs):
    return [Shaped(f"c{j}", np.zeros(shape), k) for j, (shape, k) in enumerate(specs)]


def predecessors(order, start):
    return [order[-1] if start is None else start] + order[:-1]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("isolate", [False, True])
def test_second_order_groups_shapes_and_changes_every_predecessor(seed, isolate):
    cases = shaped([((2, 3), 1), ((2, 3), 1), ((4, 3), 1), ((2, 3), 1), ((2, 3), 2), ((4, 3), 1), ((5,), 1)])
    n = len(cases)
    first = [None] * n if isolate else [None] + list(range(n - 1))
    start = None if isolate else n - 1
    order = second_order(cases, list(range(n)), first, seed, start=start)
    assert sorted(order) == list(range(n))
    keys = [shape_key(cases[i]) for i in order]
    runs = [k for j, k in enumerate(keys) if j == 0 or keys[j - 1] != k]
    assert len(runs) == len(set(runs)) == 4  # each group of shapes contiguous: (2,3)x3, (4,3)x2, k=2, (5,)
    for i, before in zip(order, predecessors(order, start)):
        assert before != first[i] and before != i  # another case than in the first pass, never itself here
    assert order == second_order(cases, list(range(n)), first, seed, start=start)  # seeded


def test_second_order_depends_on_the_seed_and_a_lone_case_comes_after_itself():
    cases = shaped([((2, 3), 1)] * 4)
    first = [None, 0, 1, 2]
    orders = {tuple(second_order(cases, [0, 1, 2, 3], first, seed, start=3)) for seed in range(10)}
    assert len(orders) > 1
    assert second_order(shaped([((2, 3), 1)]), [0], [None], 0, start=0) == [0]  # first run first, then after itself


def test_shape_key_reads_arrays_ints_tuples_and_widths():
    assert shape_key(STEP_A) == shape_key(STEP_B) != shape_key(STEP_C)  # k differs
    assert shape_key(BATCH_A) == shape_key(BATCH_B) != shape_key(BATCH_C)
    assert shape_key(TREE_A) == shape_key(TREE_B) != shape_key(TREE_C)  # widths by value
    assert shape_key(Case("p", STEP_A.target, STEP_A.draft, k=1, prompt=(2,))) == shape_key(STEP_A)  # prompt by length


# ---------------------------------------------------------------- the zoo's state-keeping entries


def level_check(level, fn, cases, **kw):
    """An exact check in this process (isolate=False; the default isolates): the implementation's state
    carries from case to case as in a server, and its counters are read here.  The isolated second
    runs are tested on their own (test_an_isolated_check_runs_each_second_run_after_its_predecessor...)."""
    return oracle.check(level, fn, cases=cases, **{"isolate": False, **kw})


@pytest.mark.parametrize("entry", stateful.entries(), ids=lambda e: e.name)
def test_each_entry_passes_every_case_on_its_own(entry):
    for case in LEVEL_CASES[entry.level]:
        report = level_check(entry.level, entry.make(), [case])  # a fresh implementation, one case
        assert report.ok and report.worst_tv == 0, str(report)
    report = level_check(entry.level, entry.make(), LEVEL_CASES[entry.level], state_check=False)
    assert report.ok, str(report)  # judged once in list order, the state is never seen: why the check exists


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("entry", stateful.entries(), ids=lambda e: e.name)
def test_each_entry_is_caught_as_stateful_with_the_pair_of_cases(entry, seed):
    report = level_check(entry.level, entry.make(), LEVEL_CASES[entry.level], seed=seed)
    assert not report.ok
    caught = [r for r in report.results if r.status == STATEFUL]
    assert caught and all(r.status in (OK, STATEFUL) for r in report.results), str(report)
    assert all(r.case.name != "C" for r in caught)  # C has no partner of its shapes: nothing stale
    for r in caught:
        m = DETAIL.search(r.detail)
        assert m, r.detail
        pair = (m.group(1), m.group(2))
        assert F(m.group(4)) == EXPECTED_TV[entry.level][pair]  # the TV between the two runs' laws
        assert r.tv == EXPECTED_TV[entry.level][pair]  # the first run had the target law exactly


def test_an_isolated_check_runs_each_second_run_after_its_predecessor_in_one_worker():
    report = oracle.check("step", stateful.StaleCorrectionMemo(), cases=LEVEL_CASES["step"], isolate=True)
    caught = [r for r in report.results if r.status == STATEFUL]
    assert caught, str(report)
    for r in caught:
        assert re.search(r"case '(\w)' after case '\w': law differs from case '\1' in a fresh worker", r.detail)


def test_statistical_mode_on_request(tmp_path):
    # N = 2048: two full blocks of 1024, so every call has the same shape and the buffer survives
    # from one case to the next; the stale row moves the accepted length by 1/4 (TV 1/4 or 1/2),
    # far above what N detects at alpha = 1e-6 (about 0.07).  Seeded (seed 0); isolated by default,
    # so each second run is a worker that samples the predecessor first.
    cases = LEVEL_CASES["batched"]
    off = oracle.check("batched", stateful.StaleDraftBuffer(), cases=cases, mode="statistical", samples=2048)
    assert off.ok, str(off)  # off by default in statistical mode
    on = oracle.check("batched", stateful.StaleDraftBuffer(), cases=cases, mode="statistical", samples=2048,
                      state_check=True)
    caught = [r for r in on.results if r.status == STATEFUL]
    assert caught and re.search(r"after case '\w': differs .*in a fresh worker: ok", caught[0].detail), str(on)
    right = oracle.check("batched", engine_zoo.engine_reference_batched, cases=cases, mode="statistical",
                         samples=2048, state_check=True)
    assert right.ok, str(right)  # the same seed in both runs: the same counts


# ---------------------------------------------------------------- correct implementations


class Counted:
    """An implementation and the number of calls made to it."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


REFERENCES = [("step", chain_zoo.reference), ("batched", engine_zoo.engine_reference_batched),
              ("tree", tree_verify.pointmass_verify)]


@pytest.mark.parametrize("level, reference, default_cases", [r + (False,) for r in REFERENCES] + [REFERENCES[0] + (True,)],
                         ids=[r[0] for r in REFERENCES] + ["step-default-cases"])
def test_references_are_never_stateful_and_are_judged_twice(level, reference, default_cases):
    # every level's reference passes with the default state check in its own test module; here
    # the second pass is counted: with state_check=True every case is enumerated again
    cases = None if default_cases else LEVEL_CASES[level]
    once, twice = Counted(reference), Counted(reference)
    a = level_check(level, once, cases, state_check=False)
    b = level_check(level, twice, cases, state_check=True)
    assert a.ok and b.ok, str(b)
    assert twice.calls == 2 * once.calls  # the same calls, in another order
    assert all(r.law is None for r in b.results)  # the laws were for the check only


STEP_D = Case("D", STEP_A.target, STEP_A.draft, k=3)  # a third shape


def test_the_default_second_pass_takes_partnered_cases_and_one_lone_shape():
    alone = {}
    for case in (STEP_A, STEP_B, STEP_C, STEP_D):
        counted = Counted(chain_zoo.reference)
        oracle.check("step", counted, isolate=False, cases=[case], state_check=False)
        alone[case.name] = counted.calls
    for case in (STEP_A, STEP_C):  # one case: nothing to come after, no second run by default
        counted = Counted(chain_zoo.reference)
        assert oracle.check("step", counted, isolate=False, cases=[case]).ok
        assert counted.calls == alone[case.name]
    counted = Counted(chain_zoo.reference)  # A and B partners; C, D lone shapes: one of them again
    assert oracle.check("step", counted, isolate=False, cases=[STEP_A, STEP_C, STEP_B, STEP_D]).ok
    once = sum(alone.values())
    assert counted.calls - once - alone["A"] - alone["B"] in (alone["C"], alone["D"])
    counted = Counted(chain_zoo.reference)
    oracle.check("step", counted, isolate=False, cases=[STEP_C], state_check=True)  # on request: after itself
    assert counted.calls == 2 * alone["C"]


@pytest.mark.parametrize("entry", [e for e in chain_zoo.entries(kind="correct") if "exact" in e.modes]
                         + engine_zoo.entries(kind="correct"), ids=lambda e: e.name)
def test_correct_zoo_entries_are_never_stateful(entry):
    cases = LEVEL_CASES["step" if entry.level == "step" else "batched"]  # the cases the stateful entries fail
    report = oracle.check(entry.level, entry.fn, cases=cases, state_check=True)
    assert report.ok and not any(r.status == STATEFUL for r in report.results), str(report)


def test_a_failed_case_is_not_judged_again():
    def wrong_at_k2(p_target, q_draft, draft_tokens, rng):  # at K = 2 (case C) every draft is accepted
        if len(draft_tokens) == 2:
            return [int(x) for x in draft_tokens] + [draw(rng, p_target[2])]
        return chain_zoo.reference(p_target, q_draft, draft_tokens, rng)

    alone = {}
    for case in LEVEL_CASES["step"]:
        counted = Counted(wrong_at_k2)
        oracle.check("step", counted, isolate=False, cases=[case], state_check=False)
        alone[case.name] = counted.calls
    counted = Counted(wrong_at_k2)
    report = oracle.check("step", counted, isolate=False, cases=LEVEL_CASES["step"])
    assert [r.status for r in report.results] == [OK, "differs", OK]
    assert counted.calls == 2 * alone["A"] + alone["C"] + 2 * alone["B"]


def test_a_second_run_that_times_out_is_a_time_out_not_stateful():
    once = Counted(chain_zoo.reference)
    oracle.check("step", once, isolate=False, cases=LEVEL_CASES["step"], state_check=False)

    class SlowLater(Counted):
        def __call__(self, *args):
            self.calls += 1
            if self.calls > once.calls:  # every call of the second pass
                import time

                time.sleep(0.5)
            return self.fn(*args)

    report = oracle.check("step", SlowLater(chain_zoo.reference), isolate=False, cases=LEVEL_CASES["step"],
                          time_limit=0.1)
    assert {r.status for r in report.results} == {TIMEOUT}, str(report)
    assert all("the state check's second run" in r.detail for r in report.results)


def test_the_cli_exits_3_on_a_stateful_implementation(tmp_path, monkeypatch, capsys):
    from specref.verify import EXIT_MISBEHAVES, check_outside

    (tmp_path / "stateful_step_mod.py").write_text(
        "from specref.verification.zoo.stateful import StaleCorrectionMemo\nstep = StaleCorrectionMemo()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_outside("stateful_step_mod:step", "step", "exact", None) == EXIT_MISBEHAVES  # stateful
    assert "stateful" in capsys.readouterr().out
