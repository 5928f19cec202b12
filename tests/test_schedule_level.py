"""The schedules level (SPEC §17.3): a continuous-batching decoder checked on the laws of SPEC §17.2,
exactly and by sampling; the zoo of schedule bugs caught there; every misbehaviour a status."""

import time
from dataclasses import replace

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.decoding.continuous import Cancellation, Request, Schedule, continuous_decode
from specref.verification.levels import LEVELS
from specref.verification.levels.batched.schedules import (ScheduleCase, default_schedule_cases, planned_samples,
                                                           reference_decode, statistics)
from specref.verification.oracle import check
from specref.verification.running.report import (ARITHMETIC, DIFFERS, INVALID, RAISED, RNG_MISUSE, STATEFUL,
                                                 TIMEOUT, WRITES, Settings)
from specref.verification.zoo import schedules as zoo

CASES = {c.name: c for c in default_schedule_cases()}
CHEAP = [CASES["cancel-then-reuse"]]  # 25 paths: the misbehaviour tests run here


def statuses(report):
    return {r.case.name: r.status for r in report.results}


def test_the_level_is_registered_with_its_call_and_its_reference():
    level = LEVELS["schedules"]
    assert level.signature == "decode_fn(schedule, target, draft, rng) -> [tokens of each request]"
    assert level.reference_for() is reference_decode and level.statistical and level.exact
    assert [c.name for c in level.cases()] == ["arrivals", "cancel-then-reuse", "preempt-recompute", "preempt-swap",
                                               "memory-budget"]


def test_the_reference_passes_every_default_case_exactly():
    """Default settings: each case in a forked worker, and the state check runs every case again after
    another (they share their shapes)."""
    report = check("schedules", reference_decode)
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


def test_the_reference_passes_in_statistical_mode():
    """N = 1500 per case, alpha = 1e-6 split over the case's tests: a correct decoder is flagged with
    probability at most 1e-6 per case; the numbers are seeded (seed 0), so the verdict is fixed."""
    report = check("schedules", reference_decode, mode="statistical", samples=1500, isolate=False,
                   cases=[CASES["arrivals"], CASES["preempt-recompute"]], progress=False)
    assert report.ok, str(report)
    assert all(r.n_samples == 1500 and "Bonferroni" in r.detail for r in report.results)


CATCHING = {  # each wrong entry, a default case where the level catches it, and how
    "kv_not_rolled_back": ("preempt-swap", DIFFERS), "refeeds_on_resume": ("preempt-recompute", DIFFERS),
    "stale_target_slot": ("preempt-recompute", DIFFERS), "stale_draft_slot": ("cancel-then-reuse", DIFFERS),
    "coins_by_slot": ("cancel-then-reuse", DIFFERS), "resample_on_recompute": ("memory-budget", DIFFERS),
    "cancel_one_step_late": ("cancel-then-reuse", INVALID),
}


@pytest.mark.parametrize("entry", zoo.entries("wrong"), ids=lambda e: e.name)
def test_each_zoo_entry_is_caught_at_the_level_in_exact_mode(entry):
    name, status = CATCHING[entry.name]
    report = check("schedules", entry.fn, mode="exact", cases=[CASES[name]], isolate=False)
    result = report.results[0]
    assert result.status == status, str(report)
    if status == DIFFERS:
        assert result.tv > 0 and {"target law": "the target law", "cancelled law": "speculative step",
                                  "independence": "not independent"}[entry.breaks] in result.detail
    else:
        assert "emitted after the cancellation" in result.detail
    again = check("schedules", entry.fn, mode="exact", cases=[report.counterexample], isolate=False)
    assert again.results[0].status == status  # the counterexample reproduces


def test_the_correct_zoo_entry_passes():
    assert check("schedules", zoo.schedule_reference, cases=[CASES["preempt-swap"]], isolate=False).ok


def test_coins_keyed_by_the_slot_are_caught_in_statistical_mode():
    """Exact TV 0.355 (joint against the product, tests/test_continuous.py); the pair test of N = 1000
    samples at alpha = 1e-6 / 3 detects a TV of about 0.11 with power 0.9."""
    report = check("schedules", zoo.coins_by_slot, mode="statistical", samples=1000, cases=CHEAP, isolate=False,
                   progress=False)
    result = report.results[0]
    assert result.status == DIFFERS and "jointly (independence)" in result.detail, str(report)


def test_the_statistical_plan_covers_every_test():
    """N is the largest any of the m tests needs at alpha / m (here 3 tests: two marginals, one pair)."""
    stats = statistics(CASES["cancel-then-reuse"])
    assert [s.requests for s in stats] == [(0,), (1,), (0, 1)]
    assert all(abs(s.null.sum() - 1) < 1e-12 and s.null[-1] == 0 for s in stats)
    n = planned_samples(stats, Settings(mode="statistical"))
    assert 10_000 < n <= 2_000_000
    assert planned_samples(stats, Settings(mode="statistical", samples=77)) == 77


# ---------------------------------------------------------------- misbehaviour: a status, never a raise


def _returns(value):
    def fn(schedule, target, draft, rng):
        return value() if callable(value) else value
    return fn


def _raises(schedule, target, draft, rng):
    raise RuntimeError("engine crashed")


def _writes(schedule, target, draft, rng):
    target.table[0, 0, 0] = target.table[0, 0, 1]
    return reference_decode(schedule, target, draft, rng)


def _arithmetic(schedule, target, draft, rng):
    return [[int(rng.random() * 2)], []]


def _hangs(schedule, target, draft, rng):
    while True:
        time.sleep(0.01)


@pytest.mark.parametrize("fn, status, words", [
    (_raises, RAISED, "engine crashed"),
    (_returns(None), INVALID, "decode_fn's output"),
    (_returns([[0]]), INVALID, "1 token sequences for 2 requests"),
    (_returns([[0], [7]]), INVALID, "outside the vocabulary"),
    (_returns([[0, 1, 0, 1], [1]]), INVALID, "returned 4 or more tokens"),
    (_returns([[0, 1, 1], [1]]), INVALID, "emitted after the cancellation"),
    (_returns(lambda: np.array([[0], [1]])), DIFFERS, ""),  # an array of rows is read as sequences; the law differs
    (_writes, WRITES, "read-only"),
    (_arithmetic, ARITHMETIC, ""),
])
def test_every_misbehaviour_is_a_status(fn, status, words):
    report = check("schedules", fn, mode="exact", cases=CHEAP, isolate=False)
    assert report.results[0].status == status and words in report.results[0].detail, str(report)


def test_a_stop_token_must_end_the_request():
    case = replace(CASES["cancel-then-reuse"], schedule=Schedule((Request((0,), 3, (1,)), Request((1,), 3)),
                                                                 arrivals=(0, 1), k=1))
    report = check("schedules", _returns([[1, 0], [0]]), mode="exact", cases=[case], isolate=False)
    assert report.results[0].status == INVALID and "tokens after the stop token 1" in report.results[0].detail


def test_a_hang_is_a_timeout():
    report = check("schedules", _hangs, mode="exact", cases=CHEAP, time_limit=1)
    assert report.results[0].status == TIMEOUT, str(report)


class _Flaky:
    """Draws a coin before decoding on every other call: its random calls differ when replayed."""

    def __init__(self):
        self.calls = 0

    def __call__(self, schedule, target, draft, rng):
        self.calls += 1
        if self.calls % 2 and rng.random() < 0.5:
            pass
        return reference_decode(schedule, target, draft, rng)


def test_randomness_that_does_not_replay_is_bad_rng_use():
    report = check("schedules", _Flaky(), mode="exact", cases=CHEAP, isolate=False)
    assert report.results[0].status == RNG_MISUSE, str(report)


class _KeepsItsFirstSchedule:
    """Right on every case alone; after another case with as many requests it decodes that case's
    schedule again (a server that caches the schedule by the number of requests)."""

    def __init__(self):
        self.first = None

    def __call__(self, schedule, target, draft, rng):
        if self.first is None or len(self.first.requests) != len(schedule.requests):
            self.first = schedule
        return continuous_decode(self.first, target, draft, rng).tokens


def test_an_implementation_that_keeps_state_is_stateful():
    """Each case in a fresh worker passes; the state check runs each after the other in one worker."""
    cases = [CASES["preempt-recompute"], CASES["preempt-swap"]]  # same shapes, other schedules
    report = check("schedules", _KeepsItsFirstSchedule(), mode="exact", cases=cases)
    assert set(statuses(report).values()) == {STATEFUL}, str(report)


# ---------------------------------------------------------------- usage errors


def test_a_case_with_a_budget_and_a_cancellation_is_refused_naming_the_field():
    s = Schedule((Request((0,), 2), Request((1,), 2)), memory_budget=4, k=1, cancellations=(Cancellation(1, 1),))
    case = replace(CASES["arrivals"], name="budget-and-cancel", schedule=s)
    with pytest.raises(SpecrefError, match=r"schedule\.memory_budget = 4 with 1 cancellation"):
        check("schedules", reference_decode, cases=[case])


@pytest.mark.parametrize("change, message", [
    (dict(context="bigram"), "context must be one of"),
    (dict(draft=np.ones((3, 3, 3), dtype=object)), "draft table shape"),
    (dict(schedule=Schedule((Request((3,), 2),))), r"schedule\.requests\[0\]\.prompt holds 3, outside the vocabulary"),
    (dict(schedule="not a schedule"), "schedule must be a Schedule"),
])
def test_malformed_cases_are_usage_errors(change, message):
    with pytest.raises(SpecrefError, match=message):
        check("schedules", reference_decode, cases=[replace(CASES["arrivals"], **change)])
    with pytest.raises(SpecrefError, match="ScheduleCase"):
        check("schedules", reference_decode, cases=["arrivals"])


def test_a_case_too_large_for_max_paths_is_refused():
    big = replace(CASES["arrivals"], schedule=Schedule(tuple(Request((0,), 6) for _ in range(3))))
    with pytest.raises(SpecrefError, match="over max_paths=1000"):
        check("schedules", reference_decode, cases=[big], max_paths=1000)


def test_a_case_is_plain_data_that_reports_itself():
    case = CASES["preempt-swap"]
    data = case.to_json()
    assert data["schedule"]["preemptions"] == [[0, 1, 2, "swap"]] and data["target"][0][0][0] == "1/4"
    assert "preemptions=1" in repr(case) and isinstance(case, ScheduleCase)
