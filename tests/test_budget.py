"""Checks within a time budget (Settings.budget_s): N from a timed pilot, the TV that N detects
stated, and the implementation's and the oracle's own seconds per sample reported."""

import time

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.step import speculative_step
from specref.decoding.batched import batched_step
from specref.verification.levels.batched.steps import large_vocab_case
from specref.verification.levels.runner import MIN_BUDGET_SAMPLES
from specref.verification.oracle import check, default_cases
from specref.verification.laws.enumeration import target_law
from specref.verification.statistics.counts import planned_power


def slow_step(p_target, q_draft, draft_tokens, rng):
    time.sleep(0.002)  # an implementation at 2 ms a call, like an interpreted kernel
    return speculative_step(p_target, q_draft, draft_tokens, np.random.default_rng(rng))


def batched(p_target, q_draft, draft_tokens, seed):
    return batched_step(p_target, q_draft, draft_tokens, seed).tokens


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "2", True])
def test_a_bad_budget_is_named(bad):
    with pytest.raises(SpecrefError, match="budget_s"):
        check("step", slow_step, mode="statistical", budget_s=bad)


def test_a_budget_picks_n_and_states_what_it_detects():
    case = default_cases("step")[:1]
    start = time.perf_counter()
    report = check("step", slow_step, cases=case, mode="statistical", budget_s=2.0, progress=False)
    took = time.perf_counter() - start
    r = report.results[0]
    assert report.ok, str(report)
    # at 2 ms a sample, 2 s buys about 1,000 samples; the pilot's estimate is within a factor of 3
    assert MIN_BUDGET_SAMPLES <= r.n_samples <= 3000 and took < 6.0, (r.n_samples, took)
    # the stated TV is the planner's inverse at this N (checked through planned_power, the forward route)
    c = case[0]
    target, _ = c.models()
    law = target_law(target, list(c.prompt), c.config, c.k + 1)
    null = np.array([float(law[o]) for o in sorted(law)] + [0.0])
    tv = r.detectable_tv
    assert planned_power(r.n_samples, tv * 1.01, 1e-6, len(null), null=null) >= 0.9
    assert planned_power(r.n_samples, tv * 0.99, 1e-6, len(null), null=null) < 0.9
    assert r.seconds_per_sample["implementation"] >= 0.002 * 0.9  # the sleep is the implementation's
    assert r.seconds_per_sample["oracle"] < r.seconds_per_sample["implementation"]


def test_a_larger_budget_buys_a_smaller_detectable_tv():
    case = [large_vocab_case(V=64, K=3, B=2)]
    small = check("batched", batched, cases=case, mode="statistical", budget_s=0.5, progress=False).results[0]
    large = check("batched", batched, cases=case, mode="statistical", budget_s=4.0, progress=False).results[0]
    assert small.ok and large.ok
    assert large.n_samples > small.n_samples and large.detectable_tv < small.detectable_tv
    assert set(large.seconds_per_sample) == {"implementation", "oracle"}


def test_samples_wins_over_a_budget():
    case = default_cases("step")[:1]
    r = check("step", slow_step, cases=case, mode="statistical", budget_s=100.0, samples=200, progress=False)
    assert r.results[0].n_samples == 200
