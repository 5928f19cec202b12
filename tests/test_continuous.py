"""Continuous batching (SPEC §17): schedules as data, schedule independence exactly, the zoo of schedule bugs.

Every law here is exact: Fraction tables, the enumerator (:func:`specref.verification.laws.enumeration.law`)
over the reference engine, compared with laws computed without it -- the target sampler's law as a
product of conditionals (:func:`target_law`), and Algorithm 1's block law in closed form
(:func:`block_law`, :func:`block_chain_law`).
"""

import time
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.decoding.chain import speculative_block
from specref.decoding.continuous import (REFERENCE, Cancellation, Preemption, Request, Schedule,
                                         continuous_decode)
from specref.verification.cases.models import PositionProbTable
from specref.verification.cases.strategies import schedules
from specref.verification.laws.enumeration import compare, law, target_law
from specref.verification.levels.batched.schedules import (ScheduleCase, block_chain_law, block_law, completed_law,
                                                           default_schedule_cases, expected_marginals, marginal)
from specref.verification.zoo import schedules as zoo

HYPOTHESIS = settings(max_examples=6, deadline=None, database=None, derandomize=True)


def table(weights):
    """A ``[V, V, V]`` position table of Fraction rows (``table[n % V, sum % V]``) from integer weights."""
    w = np.asarray(weights)
    out = np.empty(w.shape, dtype=object)
    for idx in np.ndindex(w.shape[:-1]):
        out[idx] = [F(int(x), int(w[idx].sum())) for x in w[idx]]
    return out


T2 = PositionProbTable(table([[[1, 3], [2, 1]], [[3, 1], [1, 2]]]))  # V = 2: the level's default tables
D2 = PositionProbTable(table([[[1, 1], [1, 3]], [[1, 1], [3, 1]]]))
T3 = PositionProbTable(table(np.arange(27).reshape(3, 3, 3) % 4 + 1))  # V = 3, rows with three weights
D3 = PositionProbTable(table((np.arange(27).reshape(3, 3, 3) * 5 + 2) % 3 + 1))
CASES = {c.name: c for c in default_schedule_cases()}
_LAWS: dict = {}
_MEMO: dict = {}


def joint(schedule, target=T2, draft=D2, hooks=REFERENCE):
    """The exact joint law of every request's output under ``schedule`` (memoised per test module)."""
    key = (schedule, id(target), id(draft), hooks)
    if key not in _LAWS:
        memo = _MEMO.setdefault((id(target), id(draft)), {})  # rows computed once per (model, tokens, config)
        _LAWS[key] = law(lambda rng: tuple(map(tuple, continuous_decode(schedule, target, draft, rng, hooks=hooks,
                                                                         memo=memo).tokens)))
    return _LAWS[key]


def product_of_marginals(j):
    out = {(): F(1)}
    for r in range(len(next(iter(j)))):
        m = marginal(j, r)
        out = {k + (o,): w * v for k, w in out.items() for o, v in m.items()}
    return out


def the_target_law(req, target=T2):
    return target_law(target, list(req.prompt), req.config, req.max_new_tokens, req.stop_tokens)


def assert_schedule_laws(schedule, target=T2, draft=D2):
    """The three laws of SPEC §17.2 on the reference's exact joint law: finishing requests have the target
    law; a cancelled request the law of its steps, completed to the target law, and no more tokens
    than its steps can emit; the joint law is the product of the marginals."""
    j = joint(schedule, target, draft)
    for r, req in enumerate(schedule.requests):
        m = marginal(j, r)
        if schedule.cancel_step(r) is None:
            assert compare(m, the_target_law(req, target)).tv == 0, r
            continue
        s = schedule.steps_before_cancel(r)
        assert compare(m, block_chain_law(target, draft, req, schedule.k, steps=s)).tv == 0, r
        assert compare(completed_law(m, target, req), the_target_law(req, target)).tv == 0, r
        assert all(len(o) <= s * (schedule.k + 1) for o in m), r
    assert compare(j, product_of_marginals(j)).tv == 0


# ---------------------------------------------------------------- the laws, computed two ways


@pytest.mark.parametrize("context", [(0,), (1, 2), (2, 2, 0)])
def test_the_closed_form_block_law_is_the_enumerated_speculative_step(context):
    """block_law (Algorithm 1's block law written out) against the chain loop's step enumerated."""
    req = Request(context, 10)  # no truncation within one block
    for k in (1, 2):
        enumerated = law(lambda rng, k=k: tuple(speculative_block(T3, D3, list(context), k=k, config=SamplingConfig(),
                                                                  rng=rng)))
        assert compare(block_law(T3, D3, req, (), k), enumerated).tv == 0


def test_steps_to_the_end_have_the_target_law_and_fewer_steps_are_random_prefixes():
    """Leviathan et al.'s theorem on a chain of blocks: until the request finishes, the target law; after
    s steps a law whose length is random (1 to K + 1 tokens a step) and which, completed by target
    sampling, is the target law again."""
    stopping = Request((1,), 3, stop_tokens=(2,))
    assert compare(block_chain_law(T3, D3, stopping, 2), the_target_law(stopping, T3)).tv == 0
    req = Request((1,), 3)
    target = the_target_law(req, T3)
    one = block_chain_law(T3, D3, req, 1, steps=1)
    assert {len(o) for o in one} == {1, 2}  # the tokens a step emits: a random number
    assert compare(one, target).tv > 0  # a prefix is not the whole output ...
    assert compare(completed_law(one, T3, req), target).tv == 0  # ... but completed it has the target law


# ---------------------------------------------------------------- schedule independence on the default cases


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_keeps_every_law_on_the_default_schedules(name):
    assert_schedule_laws(CASES[name].schedule)


def test_each_request_keeps_the_law_of_its_own_sampling_config():
    """Per-request configs (greedy, temperature 1/2, top-k) applied to that request's draft and target
    rows: each has its own sampler's law, with a preemption and a cancellation among them."""
    reqs = (Request((0,), 2, config=SamplingConfig(temperature=0)),
            Request((1,), 2, config=SamplingConfig(temperature=F(1, 2))),
            Request((2,), 2, config=SamplingConfig(top_k=2)))
    s = Schedule(reqs, arrivals=(0, 0, 1), k=1, preemptions=(Preemption(0, 1, 2, "recompute"),),
                 cancellations=(Cancellation(2, 2),))
    assert_schedule_laws(s, T3, D3)
    greedy = marginal(joint(s, T3, D3), 0)
    assert len(greedy) == 1  # greedy: one output, the target's argmax path


def test_a_cancelled_request_emits_nothing_after_its_cancellation():
    """The log of a run: a cancelled request runs at no step from its cancellation on, and its law's
    lengths are those its steps can emit (SPEC §17.2: the number emitted by the cancel step is random)."""
    s = CASES["cancel-then-reuse"].schedule
    for seed in range(20):
        res = continuous_decode(s, T2, D2, seed)
        for c in s.cancellations:
            assert all(t < c.step for t in res.ran[c.request]) and (c.step, c.request, "cancelled") in res.events
        assert res.slots[1] == [0]  # request 1 reuses request 0's slot
    lengths = {len(o) for o in marginal(joint(s), 0)}
    assert lengths == {1, 2}  # one step: one token after a rejection, two after an acceptance


def test_the_log_follows_the_schedule():
    """Without a budget a request runs exactly at its scheduled steps (until it finishes); a swap keeps its
    KV; the budget case preempts."""
    for name in ("arrivals", "preempt-recompute", "preempt-swap"):
        s = CASES[name].schedule
        for seed in range(10):
            res = continuous_decode(s, T2, D2, seed)
            for r in range(len(s.requests)):
                assert res.ran[r] == s.scheduled_steps(r, res.steps)[:len(res.ran[r])], (name, r)
    budget = CASES["memory-budget"].schedule
    events = [e for seed in range(10) for e in continuous_decode(budget, T2, D2, seed).events]
    assert any(what.startswith("preempted (memory budget") for _, _, what in events)


@given(schedules(requests=st.integers(1, 3), k=1, max_new_tokens=st.integers(1, 2)))
@HYPOTHESIS
def test_schedule_laws_hold_over_drawn_schedules(schedule):
    assert_schedule_laws(schedule)


@given(schedules(requests=2, k=2, max_new_tokens=st.integers(1, 2), horizon=2))
@HYPOTHESIS
def test_schedule_laws_hold_over_drawn_schedules_with_two_drafts(schedule):
    assert_schedule_laws(schedule)


@given(schedules(requests=st.integers(2, 3), k=1, max_new_tokens=st.integers(1, 2), cancellations=False))
@HYPOTHESIS
def test_schedule_laws_hold_over_drawn_schedules_with_preemptions_and_budgets(schedule):
    assert_schedule_laws(schedule)


def test_the_schedule_strategy_draws_every_kind_of_event():
    """Each feature occurs among the strategy's examples (derandomized search, as tests/test_strategies.py)."""
    from hypothesis import Phase, find

    found = settings(max_examples=500, database=None, derandomize=True, phases=[Phase.generate], deadline=None)
    features = {
        "cancellation": lambda s: bool(s.cancellations),
        "cancellation at arrival": lambda s: any(c.step == s.arrivals[c.request] for c in s.cancellations),
        "recompute": lambda s: any(p.mode == "recompute" for p in s.preemptions),
        "swap": lambda s: any(p.mode == "swap" for p in s.preemptions),
        "preempted then cancelled": lambda s: any(s.cancel_step(p.request) is not None for p in s.preemptions),
        "overlapping requests": lambda s: len(set(s.arrivals)) < len(s.arrivals),
    }
    for name, has in features.items():
        assert has(find(schedules(requests=3), has, settings=found)), name
    budgeted = find(schedules(requests=3, cancellations=False), lambda s: s.memory_budget is not None, settings=found)
    assert budgeted.memory_budget is not None and not budgeted.cancellations


def test_a_memory_budget_with_a_cancellation_couples_the_requests():
    """A finding, not a bug: under a budget the steps a cancelled request runs depend on the other requests'
    lengths (it is preempted when they grow), so its output depends on theirs.  Each finishing request
    keeps the target law and the cancelled one completes to it, but the joint law is not the product."""
    s = Schedule((Request((0,), 3), Request((1,), 3)), arrivals=(0, 0), k=1, memory_budget=6,
                 cancellations=(Cancellation(1, 2),))
    j = joint(s)
    assert compare(marginal(j, 0), the_target_law(s.requests[0])).tv == 0
    assert compare(completed_law(marginal(j, 1), T2, s.requests[1]), the_target_law(s.requests[1])).tv == 0
    assert compare(j, product_of_marginals(j)).tv > 0
    with pytest.raises(SpecrefError, match="depend on the other requests' lengths"):
        s.steps_before_cancel(1)


def test_an_int_seed_gives_a_finishing_request_the_same_tokens_under_every_schedule():
    """Per-request streams (SPEC §17.1): a request that finishes draws only from its own stream, so with
    the same seed its tokens do not depend on when it arrived, on the others, or on preemptions."""
    reqs = (Request((0,), 3), Request((1,), 3), Request((0, 1), 3))
    variants = [Schedule(reqs, arrivals=(0, 0, 0), k=2), Schedule(reqs, arrivals=(2, 0, 1), k=2),
                Schedule(reqs, arrivals=(0, 1, 1), k=2, preemptions=(Preemption(0, 1, 3, "swap"),
                                                                     Preemption(2, 1, 2, "recompute"))),
                Schedule(reqs, arrivals=(0, 0, 0), k=2, memory_budget=6)]
    for seed in range(5):
        outs = [continuous_decode(s, T3, D3, seed).tokens for s in variants]
        assert all(o == outs[0] for o in outs), seed
    assert len({str(continuous_decode(variants[0], T3, D3, seed).tokens) for seed in range(5)}) > 1  # seeds matter


def test_the_exact_law_of_three_requests_is_fast():
    """The exact joint law of a case of 3 requests (V <= 4, <= 3 new tokens each) in at most 10 s of CPU;
    here V = 3, K = 1, two new tokens each, staggered arrivals and a swap: 7,600 paths (measured 1.2 s)."""
    s = Schedule((Request((0,), 2), Request((1,), 2), Request((2, 0), 2)), arrivals=(0, 1, 2), k=1,
                 preemptions=(Preemption(0, 1, 2, "swap"),))
    t0 = time.process_time()  # CPU seconds: the machine may be shared
    j = law(lambda rng: tuple(map(tuple, continuous_decode(s, T3, D3, rng, memo={}).tokens)))
    seconds = time.process_time() - t0
    assert j.paths == 7600 and len(j) == 3**6  # every pair of tokens for each request
    assert compare(j, product_of_marginals(j)).tv == 0
    assert seconds <= 10, seconds


# ---------------------------------------------------------------- the zoo


ZOO_CASES = {  # each wrong entry on a default schedule where it shows, and the law it breaks there
    "kv_not_rolled_back": "arrivals", "refeeds_on_resume": "preempt-recompute",
    "stale_target_slot": "preempt-recompute", "stale_draft_slot": "cancel-then-reuse",
    "coins_by_slot": "cancel-then-reuse", "resample_on_recompute": "preempt-recompute",
    "cancel_one_step_late": "cancel-then-reuse",
}


def tvs(name, schedule):
    """Per request the TV of the entry's marginal to its law, and the TV of its joint law to the product
    of its own marginals (independence)."""
    j = law(lambda rng: tuple(map(tuple, continuous_decode(schedule, T2, D2, rng, hooks=zoo.HOOKS[name]).tokens)))
    case = ScheduleCase("zoo", schedule, T2.table, D2.table)
    per_request = [compare(marginal(j, r), expected).tv for r, (_, expected) in enumerate(expected_marginals(case))]
    return per_request, compare(j, product_of_marginals(j)).tv


def test_every_wrong_entry_has_a_case_and_the_reference_is_correct():
    assert {e.name for e in zoo.entries("wrong")} == set(ZOO_CASES)
    assert [e.name for e in zoo.entries("correct")] == ["schedule_reference"]
    per_request, dependence = tvs("schedule_reference", CASES["preempt-recompute"].schedule)
    assert per_request == [0, 0] and dependence == 0
    with pytest.raises(SpecrefError, match="kind must be"):
        zoo.entries("bogus")


@pytest.mark.parametrize("entry", [e for e in zoo.entries("wrong") if e.breaks == "target law"], ids=lambda e: e.name)
def test_kv_and_recompute_bugs_break_a_finishing_request_s_target_law(entry):
    schedule = CASES[ZOO_CASES[entry.name]].schedule
    per_request, _ = tvs(entry.name, schedule)
    finishing = [tv for r, tv in enumerate(per_request) if schedule.cancel_step(r) is None]
    assert finishing and max(finishing) > 0, per_request  # a request that runs to its end is off the target law


def test_a_stale_draft_slot_is_lossless_and_only_the_cancelled_law_sees_it():
    """A finding: speculative decoding is exact for any draft, so a draft cache that keeps a cancelled
    request's tokens leaves every finishing request at the target law (TV exactly 0); it moves how
    many tokens a step emits, so the law of a cancelled request -- its steps' tokens -- differs."""
    finishing = Schedule((Request((0,), 3), Request((1,), 3)), arrivals=(0, 1), k=1,
                         cancellations=(Cancellation(0, 1),))
    per_request, dependence = tvs("stale_draft_slot", finishing)
    assert per_request[1] == 0 and dependence == 0  # request 1 finishes in request 0's slot: exact
    per_request, _ = tvs("stale_draft_slot", CASES["cancel-then-reuse"].schedule)
    assert per_request[0] == 0 and per_request[1] > 0  # request 1 is cancelled too: its 1-step law differs


def test_coins_keyed_by_the_slot_break_independence_only():
    """Request 1 takes request 0's slot and replays its coins: each keeps its own law, jointly they are
    dependent."""
    per_request, dependence = tvs("coins_by_slot", CASES["cancel-then-reuse"].schedule)
    assert per_request == [0, 0] and dependence > 0


def test_a_late_cancellation_breaks_the_cancelled_law():
    s = Schedule((Request((0,), 3),), k=1, cancellations=(Cancellation(0, 1),))  # one step, 1 or 2 tokens
    late = law(lambda rng: tuple(map(tuple, continuous_decode(s, T2, D2, rng, hooks=zoo.HOOKS["cancel_one_step_late"])
                                     .tokens)))
    expected = block_chain_law(T2, D2, s.requests[0], 1, steps=1)
    assert compare(marginal(late, 0), expected).tv > 0
    assert max(len(o[0]) for o in late) == 3  # two steps' tokens: more than one step can emit (K + 1 = 2)


# ---------------------------------------------------------------- bad input


def test_a_schedule_that_cancels_a_request_before_it_arrives_is_refused():
    with pytest.raises(SpecrefError, match=r"cancellations\[0\]\.step = 1 is before request 1's arrival "
                                           r"\(arrivals\[1\] = 2\)"):
        Schedule((Request((0,), 2), Request((1,), 2)), arrivals=(0, 2), cancellations=(Cancellation(1, 1),))


def test_a_schedule_that_preempts_a_finished_or_cancelled_request_is_refused():
    reqs = (Request((0,), 2), Request((1,), 2))
    with pytest.raises(SpecrefError, match=r"preemptions\[0\]\.step = 2 preempts request 0 after it has certainly "
                                           r"finished.*max_new_tokens = 2"):
        Schedule(reqs, preemptions=(Preemption(0, 2, 3),))
    with pytest.raises(SpecrefError, match=r"preemptions\[0\]\.step = 1 preempts request 1 at or after its "
                                           r"cancellation \(at step 1\)"):
        Schedule(reqs, cancellations=(Cancellation(1, 1),), preemptions=(Preemption(1, 1, 2),))
    with pytest.raises(SpecrefError, match=r"preemptions\[1\]\.step = 1 preempts request 0 while preemptions\[0\] "
                                           r"holds it"):
        Schedule((Request((0,), 3),), preemptions=(Preemption(0, 0, 2), Preemption(0, 1, 3)))
    Schedule(reqs, preemptions=(Preemption(0, 1, 3),))  # after one of its two steps: it may still run


def test_a_memory_budget_of_zero_or_too_small_is_refused():
    reqs = (Request((0, 1), 3), Request((1,), 2))
    with pytest.raises(SpecrefError, match="memory_budget must be None or a positive number of KV tokens, got 0"):
        Schedule(reqs, memory_budget=0)
    with pytest.raises(SpecrefError, match=r"memory_budget = 5 KV tokens cannot hold request 0 alone: .* = 6"):
        Schedule(reqs, k=2, memory_budget=5)
    assert Schedule(reqs, k=2, memory_budget=6).memory_budget == 6


@pytest.mark.parametrize("make, message", [
    (lambda: Schedule((Request((0,), 2),), arrivals=(0, 1)), r"arrivals must hold one step per request \(1\)"),
    (lambda: Schedule((Request((0,), 2),), arrivals=(-1,)), r"arrivals\[0\] must be an integer >= 0, got -1"),
    (lambda: Schedule((Request((0,), 2),), cancellations=(Cancellation(3, 0),)),
     r"cancellations\[0\]\.request = 3 is not a request \(0\.\.0\)"),
    (lambda: Schedule((Request((0,), 2),), cancellations=(Cancellation(0, 0), Cancellation(0, 1))),
     r"cancellations\[1\] cancels request 0 again"),
    (lambda: Schedule(((0,),)), r"requests\[0\] must be a Request"),
    (lambda: Schedule((Request((0,), 2),), k=0), "k must be an integer >= 1, got 0"),
    (lambda: Preemption(0, 2, 2), r"Preemption\.resume = 2 must come after Preemption\.step = 2"),
    (lambda: Preemption(0, 1, 2, "evict"), r"Preemption\.mode must be one of \('recompute', 'swap'\), got 'evict'"),
    (lambda: Request((), 2), r"Request\.prompt must hold at least one token"),
    (lambda: Request((0,), 0), r"Request\.max_new_tokens must be an integer >= 1, got 0"),
])
def test_malformed_schedules_name_the_field_and_the_value(make, message):
    with pytest.raises(SpecrefError, match=message):
        make()


def test_tokens_outside_the_vocabulary_are_refused_when_the_schedule_runs():
    s = Schedule((Request((0,), 2), Request((5,), 2)))
    with pytest.raises(SpecrefError, match=r"requests\[1\]\.prompt\[0\]"):
        continuous_decode(s, T2, D2, 0)


def test_a_schedule_is_frozen_hashable_data():
    s = Schedule([Request([0, 1], 2, [1])], arrivals=[0], cancellations=[Cancellation(0, 1)])
    assert s.requests[0].prompt == (0, 1) and s.requests[0].stop_tokens == (1,) and isinstance(s.cancellations, tuple)
    assert hash(s) == hash(Schedule((Request((0, 1), 2, (1,)),), arrivals=(0,), cancellations=(Cancellation(0, 1),)))
    with pytest.raises(AttributeError):
        s.k = 3  # type: ignore[misc]
