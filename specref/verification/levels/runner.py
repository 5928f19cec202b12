"""The one case runner every level goes through.

A level supplies only what is its own: how to validate a case, the body that judges one case
in exact mode, the body that judges it in statistical mode (given its seed), and optionally a
re-check of a case that differs.  :func:`run_cases` does the rest, the same way for every level:
validation of every case before any runs, isolation (a forked worker with a hard deadline,
``Settings.isolate``), the per-call and per-case time limits, seeds ``settings.seed + i``, and
the :class:`~specref.verification.running.report.Report`.

Levels whose cases are randomized programs with an exact law (chain, tree, tree batch) share
the two bodies below: :func:`exact_verdict` enumerates the program (SPEC §5) and
:func:`sampled_verdict` samples it in seeded shards and G-tests the counts (SPEC §6, §16).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from specref.verification.laws.enumeration import compare, law
from specref.verification.running.calling import cuda_started, run_case
from specref.verification.running.progress import progress_bar
from specref.verification.running.report import DIFFERS, OK, CaseResult, Report, Settings, law_verdict
from specref.verification.statistics.counts import compare_counts, detectable_tv, samples_needed
from specref.verification.statistics.shards import tally, tally_blocks

__all__ = ["run_cases", "isolated", "exact_verdict", "sampled_verdict", "samples_in_budget", "PILOT"]

PILOT = 16  # samples in the timed pilot of a budgeted check (Settings.budget_s)
MIN_BUDGET_SAMPLES = 2 * PILOT  # a budget too small for this still samples this many: the report says so
MAX_BUDGET_SAMPLES = 2_000_000  # a budget never buys more than this per case (the batched level's cap too)


_UNKNOWN = object()  # run_cases was not told the implementation


def isolated(settings: Settings, fn=_UNKNOWN) -> bool:
    """Whether a case runs in a forked worker: ``settings.isolate`` when set; by default (None) in
    statistical mode, when the runner knows the implementation ``fn`` and it does not declare
    ``specref_isolate = False``, and this process has not started CUDA (a forked worker could not
    use it).  A statistical check on an executor is the one exception: its shards run in processes
    of the executor's own, which the fork cannot hold."""
    if settings.mode == "statistical" and settings.executor is not None:
        return False
    if settings.isolate is not None:
        return settings.isolate
    if settings.mode != "statistical" or fn is _UNKNOWN or cuda_started():
        return False
    try:
        declared = getattr(fn, "specref_isolate", True)
    except Exception:  # noqa: BLE001 - a hostile __getattr__: isolate
        declared = True
    return declared is not False


def run_cases(level, cases, settings: Settings, *, validate: Callable, exact: Callable, statistical: Callable,
              recheck: Callable | None = None, fn=_UNKNOWN) -> Report:
    """Judge every case of ``level`` under ``settings``.

    ``validate(case)`` raises :class:`~specref.core.errors.SpecrefError` for a malformed case
    (a usage error: before any case runs); ``exact(case) -> body`` and
    ``statistical(case, seed) -> body`` give the body, ``body() -> CaseResult``, that
    :func:`~specref.verification.running.calling.run_case` runs with every misbehaviour made a
    status; ``recheck(case, result) -> CaseResult`` may revise a verdict (the chain levels
    confirm a difference against the reference).  ``fn``: the implementation, for the default
    isolation (:func:`isolated`).  An isolated statistical case fills ``settings.shard_store``
    in its worker; what it added comes back here.
    """
    for case in cases:
        validate(case)
    report = Report(level=level.name, mode=settings.mode)
    isolate = isolated(settings, fn)
    store = settings.shard_store if settings.mode == "statistical" else None
    for i, case in enumerate(cases):
        body = exact(case) if settings.mode == "exact" else statistical(case, settings.seed + i)
        result = run_case(body, case, isolate=isolate, time_limit=settings.time_limit,
                          case_time_limit=settings.case_time_limit, store=store)
        report.results.append(result if recheck is None else recheck(case, result))
    return report


def exact_verdict(case, program, expected, settings: Settings) -> CaseResult:
    """Enumerate ``program(rng)`` (the implementation draws from the same lazy generator) and
    compare its law with ``expected``; misbehaviour propagates for ``run_case`` to report."""
    got = law(program, max_paths=settings.max_paths)
    return law_verdict(case, compare(got, expected), settings.tolerance)


def samples_in_budget(pilot: Callable[[int], None], settings: Settings, started: float, *, most: int) -> int:
    """N for ``settings.budget_s``, from timed pilots whose samples are discarded.

    ``pilot(m)`` samples ``m`` times.  Pilots of ``PILOT``, ``4 PILOT``, ``16 PILOT``, ... run
    until one takes a twentieth of the budget; the rate is the marginal one between the last two
    (so a call's fixed set-up is not counted per sample).  N is what the rest of the budget buys
    at that rate, at least ``MIN_BUDGET_SAMPLES`` and at most ``most``.  ``started``: when the
    case began (``time.perf_counter()``): set-up and pilots come out of the budget.  The report
    states N and the TV that N detects, so a budget too small shows as a large detectable TV.
    """
    timings = []  # (m, seconds)
    m = PILOT
    while True:
        t0 = time.perf_counter()
        pilot(m)
        timings.append((m, time.perf_counter() - t0))
        if timings[-1][1] >= settings.budget_s / 20 or 4 * m > most or time.perf_counter() - started > settings.budget_s / 4:
            break
        m *= 4
    (m1, t1), (m0, t0_) = timings[-1], timings[-2] if len(timings) > 1 else (0, 0.0)
    per_sample = (t1 - t0_) / (m1 - m0) if t1 > t0_ else t1 / m1
    left = settings.budget_s - (time.perf_counter() - started)
    return int(min(most, max(MIN_BUDGET_SAMPLES, left / max(per_sample, 1e-9))))


def sampled_verdict(case, recipe, expected, settings: Settings, seed: int, *,
                    run_blocks: Callable = tally_blocks) -> CaseResult:
    """N samples of the program ``recipe()`` builds (where a shard runs), counted in seeded
    blocks (:mod:`specref.verification.statistics.shards`: the same counts on any executor),
    then a pooled G-test against ``expected`` with one extra bin for outputs it never makes.
    ``run_blocks`` counts one shard (:func:`~specref.verification.statistics.shards.tally`'s
    argument): the chain levels pass their own, which calls an implementation in batches."""
    started = time.perf_counter()
    outcomes = sorted(expected)
    null = np.array([float(expected[o]) for o in outcomes] + [0.0])  # last bin: outputs the target never makes
    if settings.samples or settings.budget_s is None:
        n = settings.samples or samples_needed(settings.detect_tv, settings.alpha, 0.9, len(null), null=null)
    else:
        n = samples_in_budget(lambda m: tally(recipe, outcomes, m, seed, run_blocks=run_blocks), settings, started,
                              most=MAX_BUDGET_SAMPLES)
    with progress_bar(n, f"{case.name}", enabled=settings.progress) as bar:
        t = tally(recipe, outcomes, n, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
                  progress=bar, store=settings.shard_store, run_blocks=run_blocks)
    if t.misbehaved:
        _, status, detail = t.misbehaved
        return CaseResult(case, status, detail=detail)
    result = compare_counts(t.counts, null, alpha=settings.alpha)
    est, detail = result.tv, f"{result.g}"
    if t.strays:
        detail += f"; outputs the target never makes: {dict(list(t.strays.items())[:3])}"
    detectable = detectable_tv(n, settings.alpha, 0.9, len(null), null=null)
    spent = t.seconds.get("implementation")
    seconds = None if spent is None else {
        "implementation": spent / n, "oracle": max(0.0, time.perf_counter() - started - spent) / n}
    return CaseResult(case, DIFFERS if result.rejected else OK, tv=est.estimate, detail=detail,
                      n_samples=n, p_value=result.g.p_value, tv_interval=(est.lower, est.upper),
                      detectable_tv=detectable, seconds_per_sample=seconds)

