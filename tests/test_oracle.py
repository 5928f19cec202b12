"""The oracle: verdicts, counterexamples that reproduce, and misbehaviour reported, never raised."""

import time

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.verification import oracle
from specref.verification.oracle import Case, check_decoder, check_logits_step, check_step, default_cases
from tests.implementations import decoder_reference, logits_reference, logits_target_only, resample_from_p


def test_reference_passes_exactly_at_every_level():
    for report in (check_step(speculative_step), check_logits_step(logits_reference),
                   check_decoder(decoder_reference, cases=default_cases("decoder")[:4])):
        assert report.ok, str(report)
        assert report.counterexample is None
        assert float(report.worst_tv) <= 1e-12


def test_wrong_step_is_flagged_and_its_counterexample_reproduces():
    report = check_step(resample_from_p)
    assert not report.ok and report.worst_tv > 1e-9
    case = report.counterexample
    again = check_step(resample_from_p, cases=[case])
    assert not again.ok and again.worst_tv == report.worst_tv
    assert check_step(speculative_step, cases=[case]).ok  # the case itself is fine for the reference
    # worked-example rows: min(p,q) + (2/5) p differs from p by TV 3/25 on the first token alone
    assert "worst outputs" in report.results[0].detail


def test_processor_on_one_side_only_is_flagged():
    report = check_logits_step(logits_target_only)
    assert not report.ok
    assert report.counterexample.config != SamplingConfig()


def test_decoder_that_ignores_stop_tokens_is_flagged():
    def no_stop(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        return decoder_reference(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                                 stop_tokens=(), rng=rng)

    stop_case = [c for c in default_cases("decoder") if c.stop_tokens]
    report = check_decoder(no_stop, cases=stop_case)
    assert not report.ok and report.worst_tv > 0.01


@pytest.mark.parametrize(
    "fn, status, word",
    [
        (lambda p, q, x, rng: 1 / 0, "raised", "ZeroDivisionError"),
        (lambda p, q, x, rng: [p.shape[1]], "invalid output", "outside the vocabulary"),
        (lambda p, q, x, rng: [], "invalid output", "returned 0 tokens"),
        (lambda p, q, x, rng: [0] * (len(x) + 2), "invalid output", "expected 1 to"),
        (lambda p, q, x, rng: "abc", "invalid output", "outside the vocabulary"),
        (lambda p, q, x, rng: [int(rng.random() * 2)], "lazy-uniform arithmetic", "comparisons"),
    ],
)
def test_misbehaviour_is_reported_with_its_case(fn, status, word):
    report = check_step(fn, cases=default_cases("step")[:2])
    assert not report.ok
    assert report.results[0].status == status and word in report.results[0].detail
    assert report.counterexample is report.results[0].case


def test_a_call_that_never_returns_times_out():
    def hang(p, q, x, rng):
        while True:
            pass

    t0 = time.perf_counter()
    report = check_step(hang, cases=default_cases("step")[:1], time_limit=0.3)
    assert report.results[0].status == "timeout"
    assert time.perf_counter() - t0 < 5


def test_statistical_mode_passes_a_correct_sampler_and_flags_the_classic_bug():
    """N = 20,000 per case, alpha = 1e-6 (planned-N detection is tested in the zoo tests).

    Both implementations use their own numpy generator seeded from the integer handed in.
    At the worked-example rows, the classic bug moves TV 3/25 = 0.12 on the first token:
    far above what N = 20,000 detects.
    """
    def own_rng(fn):
        return lambda p, q, x, seed: fn(p, q, x, np.random.default_rng(seed))

    cases = default_cases("step")[:1]
    good = check_step(own_rng(speculative_step), mode="statistical", cases=cases, samples=20_000, seed=1)
    bad = check_step(own_rng(resample_from_p), mode="statistical", cases=cases, samples=20_000, seed=1)
    assert good.ok, str(good)
    assert not bad.ok and bad.results[0].p_value < 1e-6
    r = good.results[0]
    assert r.n_samples == 20_000 and r.tv_interval[0] <= r.tv <= r.tv_interval[1]


def test_statistical_mode_plans_n_when_not_given():
    cases = default_cases("step")[5:6]  # K = 1, V = 3: 9 outcomes
    report = check_step(lambda p, q, x, seed: speculative_step(p, q, x, np.random.default_rng(seed)),
                        mode="statistical", cases=cases, detect_tv=0.05)
    from specref.verification.statistics.counts import samples_needed

    assert report.ok
    assert report.results[0].n_samples == samples_needed(0.05, 1e-6, 0.9, 10, null=_null(cases[0]))


def _null(case):
    from specref.verification.laws.enumeration import target_law

    target, _ = case.as_float().models()
    law = target_law(target, list(case.prompt), case.config, case.k + 1)
    return np.array([float(law[o]) for o in sorted(law)] + [0.0])


def test_bad_arguments_are_named():
    with pytest.raises(SpecrefError, match="mode"):
        check_step(speculative_step, mode="fast")
    with pytest.raises(SpecrefError, match="callable"):
        check_step(42)
    with pytest.raises(SpecrefError, match="logits"):
        check_logits_step(logits_reference, cases=default_cases("step")[:1])
    with pytest.raises(SpecrefError, match="level"):
        default_cases("token")
    with pytest.raises(SpecrefError, match="samples"):
        check_step(speculative_step, mode="statistical", samples=0)
    with pytest.raises(SpecrefError, match=r"shape \[V, V\]"):
        check_step(speculative_step, cases=[Case("bad", np.ones((2, 3)) / 3, np.ones((2, 3)) / 3)])
    with pytest.raises(SpecrefError, match="time_limit"):
        check_step(speculative_step, time_limit=0)


def test_case_round_trips_through_json():
    case = default_cases("step")[0]
    data = case.to_json()
    assert data["target"][0] == ["1/5", "1/2", "3/10"] and data["k"] == 2
    from fractions import Fraction

    rebuilt = oracle.Case(**{**data, "target": np.array([[Fraction(v) for v in r] for r in data["target"]]),
                             "draft": np.array([[Fraction(v) for v in r] for r in data["draft"]]),
                             "config": SamplingConfig(**data["config"]), "prompt": tuple(data["prompt"]),
                             "stop_tokens": tuple(data["stop_tokens"])})
    assert rebuilt.to_json() == data
    assert check_step(resample_from_p, cases=[rebuilt]).worst_tv == check_step(resample_from_p, cases=[case]).worst_tv


def test_cases_drawn_from_the_strategies_are_deterministic_and_checked():
    a = oracle.strategy_cases("step", 5)
    b = oracle.strategy_cases("step", 5)
    assert [c.to_json() for c in a] == [c.to_json() for c in b]
    assert check_step(speculative_step, cases=a).ok
    assert not check_step(resample_from_p, cases=a + default_cases("step", drawn=0)).ok
    logits = oracle.strategy_cases("logits", 4)
    assert all(c.tables == "logits" for c in logits) and check_logits_step(logits_reference, cases=logits).ok
    assert [c.name for c in default_cases("step")][-4:] == ["drawn-0", "drawn-1", "drawn-2", "drawn-3"]


def test_every_level_is_known_after_import_specref_alone():
    """One registry, built explicitly: no adapter import registers a level as a side effect."""
    import subprocess
    import sys

    script = ("import sys, specref; names = sorted(specref.LEVELS); "
              "assert not any(m.startswith('specref.adapters') for m in sys.modules), 'an adapter was imported'; "
              "print(' '.join(names))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert set(run.stdout.split()) >= {"step", "logits", "decoder", "batched", "draft_and_verify", "tree",
                                       "tree_batch", "vllm", "flashinfer"}


def test_a_difference_under_declared_rules_is_reported_as_differs_not_internal():
    # the re-check of a difference once used specref's rule order, not the declared one ("internal error")
    from specref.verification.zoo import chain as zoo

    case = [c for c in default_cases("logits") if c.name == "logits-rule-order"]
    report = check_logits_step(zoo.top_p_target_only, rules=("top_k", "top_p", "min_p", "temperature"), cases=case)
    assert report.results[0].status == "differs", report
    assert report.worst_tv > 0.1 and "from its own plain sampler" in str(report)


@pytest.mark.parametrize("mode", ["exact", "statistical"])
def test_a_crash_detail_carries_no_absolute_path(tmp_path, monkeypatch, mode):
    """An implementation outside the working directory, as a module and inside a package: its
    frame is named relative to where it was imported from; inside the working directory, relative to it."""
    import importlib
    import sys

    (tmp_path / "lonely_impl.py").write_text("def step(p, q, x, rng):\n    raise ValueError('boom')\n")
    (tmp_path / "impl_pkg").mkdir()
    (tmp_path / "impl_pkg" / "__init__.py").write_text("")
    (tmp_path / "impl_pkg" / "steps.py").write_text("def step(p, q, x, rng):\n    raise ValueError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = default_cases("step")[:1]
    for module, shown in [("lonely_impl", "lonely_impl.py:2 in step"), ("impl_pkg.steps", "impl_pkg/steps.py:2 in step")]:
        fn = importlib.import_module(module).step
        detail = check_step(fn, cases=case, mode=mode, samples=20, progress=False).results[0].detail
        assert f"(at {shown})" in detail and str(tmp_path) not in detail, detail
        sys.modules.pop(module)
    from tests.test_frames import crashes  # in the working directory (the repository root)

    detail = check_step(crashes, cases=case, mode=mode, samples=20, progress=False).results[0].detail
    assert "(at tests/test_frames.py:" in detail and "/tests/" not in detail, detail


def test_a_batched_report_states_the_cases_n_not_its_statistics():
    """1,500 batch draws of a case whose most significant statistic is a pair across copies of the
    rows (counted 750 times): the report's N is the 1,500 samples the case drew; the statistic's own
    N stays in its G-test text."""
    from specref.decoding.batched import batched_step

    def fn(P, Q, X, seed):
        return batched_step(P, Q, X, np.random.default_rng(seed))

    report = oracle.check_batched_step(fn, mode="statistical", samples=1500, progress=False, isolate=False)
    assert [r.n_samples for r in report.results] == [1500] * len(report.results)
    assert any("N = 750" in r.detail for r in report.results)  # the pair statistics' own count


# ---------------------------------------------------------------- the default case time limit follows the plan


def sleepy_step(p, q, x, seed):  # the reference, 1 ms per sample
    time.sleep(0.001)
    return speculative_step(p, q, x, np.random.default_rng(seed))


def test_a_slow_implementation_at_planned_n_is_not_cut_at_the_floor(monkeypatch):
    """The floor is patched from 300 s to 0.5 s, so that a run of about 1 ms x N (N planned for
    detect_tv = 0.1: about 1,900 samples, 2 s or more) needs more than the floor, as a real run at
    N = 180,000 would need more than 300 s.  By default (case_time_limit None) the case's limit is 3 x
    its ETA from the plan's timed calls: the check runs to its planned N; the same check held to the
    floor is cut.  The ETA is a few timed calls on a shared machine: the factor 3 is the margin."""
    from specref.verification import oracle
    from specref.verification.campaigns.planning import plan

    monkeypatch.setattr(oracle, "CASE_TIME_FLOOR", 0.5)
    case = [c for c in default_cases("step", drawn=0) if c.name == "worked-example-rows"]
    row = plan("step", sleepy_step, case, detect_tv=0.1, quiet=True)[0]
    assert row.n > 1500 and row.eta_s > 1.5 and row.case_time_limit == 3 * row.eta_s
    planned = check_step(sleepy_step, cases=case, mode="statistical", detect_tv=0.1, progress=False).results[0]
    assert planned.status == "ok" and planned.n_samples == row.n, planned
    cut = check_step(sleepy_step, cases=case, mode="statistical", detect_tv=0.1, progress=False,
                     case_time_limit=0.5).results[0]
    assert cut.status == "timeout" and "case_time_limit" in cut.detail, cut


def hanging_step(p, q, x, seed):
    time.sleep(3600)


def test_a_hanging_implementation_is_still_stopped_by_the_per_call_limit():
    """Under the default limit the plan's timed call and then the check's own first call each hang
    until time_limit = 0.5 s: a time-out naming time_limit, within seconds (forks included)."""
    t0 = time.perf_counter()
    result = check_step(hanging_step, cases=default_cases("step")[:1], mode="statistical", samples=100,
                        time_limit=0.5, progress=False).results[0]
    assert result.status == "timeout" and "time_limit = 0.5" in result.detail, result
    assert time.perf_counter() - t0 < 20


def test_the_default_case_time_limit_is_the_cap_in_exact_mode_and_the_plans_in_statistical(monkeypatch):
    """What the level's run is handed: exact mode the cap (no plan: it would enumerate the reference, and
    the floor stopped correct implementations of seconds a call; hangs are the per-call limit's);
    statistical mode the largest of the cases' plan limits (3 ETAs of 100,000 calls of >= 10 ms: over
    3,000 s, and at most twice 3 ETAs of the calls as timed here); a number given is used as it is."""
    from dataclasses import replace

    from specref.verification.levels import LEVELS

    used = []
    spec = LEVELS["step"]
    monkeypatch.setitem(LEVELS, "step", replace(spec, run=lambda s, fn, cases, settings: (
        used.append(settings.case_time_limit) or oracle.Report(level="step", mode=settings.mode))))

    def slow(p, q, x, seed):  # 10 ms per call
        time.sleep(0.01)
        return [int(x[0])]

    cases = default_cases("step")[:2]
    check_step(slow, cases=cases, mode="exact")
    check_step(slow, cases=cases, mode="statistical", samples=100_000)
    check_step(slow, cases=cases, mode="statistical", samples=100_000, case_time_limit=42.0)
    # the upper bound from calls timed here, not a fixed guess: a loaded machine makes every call slower
    timed = []
    for _ in range(20):
        t0 = time.perf_counter()
        slow(None, None, [0], 0)
        timed.append(time.perf_counter() - t0)
    ceiling = max(4500.0, 2 * 3 * 100_000 * sorted(timed)[10])
    assert used[0] == oracle.CASE_TIME_CAP == 24 * 3600.0 and 3000.0 <= used[1] <= ceiling and used[2] == 42.0, (
        used, ceiling)


def test_the_cli_impl_check_uses_the_planned_limit(monkeypatch, capsys):
    """``--impl`` (check_outside) goes through check: with the floor patched to 0.5 s, the slow
    implementation runs to its planned N there too."""
    from specref.verification import oracle
    from specref.verify import check_outside

    monkeypatch.setattr(oracle, "CASE_TIME_FLOOR", 0.5)
    case = [c for c in default_cases("step", drawn=0) if c.name == "worked-example-rows"]
    code = check_outside("tests.test_oracle:sleepy_step", "step", "statistical", 1500, progress=False, cases=case)
    out = capsys.readouterr().out
    assert code == 0 and "N=1500" in out and "timeout" not in out, out
