"""The one case runner every level goes through.

A level supplies only what is its own: how to validate a case, the body that judges one case
in exact mode, the body that judges it in statistical mode (given its seed), and optionally a
re-check of a case that differs.  :func:`run_cases` does the rest, the same way for every level:
validation of every case before any runs, isolation (a forked worker with a hard deadline,
``Settings.isolate``), the per-call and per-case time limits (under the default time rule the
first time-out ends the check, :func:`one_check`), seeds ``settings.seed + i``, the
state check (``Settings.state_check``, by default in exact mode: :func:`second_order`) and the
:class:`~specref.verification.running.report.Report`.

The state check (SPEC §13.5) judges cases that passed a second time -- by default those with a
partner of their shapes (:func:`shape_key`) and one case of a lone shape, with
``state_check=True`` every one -- in an order drawn from ``settings.seed`` in which the cases of
the same shapes run one after another and each case comes after another case than in the first
pass.  In-process the
implementation's state carries from one case to the next as it would in a server; isolated, each
second run is a forked worker that runs the case's predecessor first, then the case.  A case whose
verdict, or whose exact law (Fractions: equal; floats: within ``tolerance``), changed is reported
``stateful``, with both runs named; a time-out or an internal error of the second run is reported
as itself (a loaded machine, or the oracle, is not the implementation's state).

Levels whose cases are randomized programs with an exact law (chain, tree, tree batch) share
the two bodies below: :func:`exact_verdict` enumerates the program (SPEC §5) and
:func:`sampled_verdict` samples it in seeded shards and G-tests the counts (SPEC §6, §16).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from contextvars import ContextVar
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from specref.verification.laws.enumeration import compare, law
from specref.core.errors import SpecrefError
from specref.verification.running.calling import Misbehaved, cuda_started, run_case
from specref.verification.running.level import CasePlan
from specref.verification.running.progress import progress_bar
from specref.verification.running.report import (DIFFERS, INTERNAL, NOT_RUN, OK, STATEFUL, TIMEOUT, CaseResult, Report,
                                                 Settings, law_verdict)
from specref.verification.statistics.counts import PLAN_POWER, compare_counts, detectable_tv, planned_n
from specref.verification.statistics.shards import tally, timed_calls

__all__ = ["run_cases", "isolated", "one_check", "not_run", "exact_verdict", "sampled_verdict", "target_null", "program_plan", "samples_in_budget", "shape_key",
           "second_order", "PILOT", "ORDER_TRIES"]

PILOT = 16  # samples in the timed pilot of a budgeted check (Settings.budget_s)
MIN_BUDGET_SAMPLES = 2 * PILOT  # a budget too small for this still samples this many: the report says so
MAX_BUDGET_SAMPLES = 2_000_000  # a budget never buys more than this per case (the batched level's cap too)
ORDER_TRIES = 64  # seeded shuffles tried for the state check's second order (the first without a repeat wins)


_UNKNOWN = object()  # run_cases was not told the implementation
# The case whose time-out ended the check in progress (SPEC §13.2), shared by all its run_cases calls (one_check)
_ENDED: ContextVar[list | None] = ContextVar("specref_check_ended", default=None)


@contextmanager
def one_check():
    """Within the block every :func:`run_cases` call belongs to one check: under the default time rule
    (``time_limit=None``) the first time-out among them ends the check, and the cases after it, in
    any of the calls, are ``not run`` (the mrv2 level runs each case through a call of its own).
    Outside such a block each :func:`run_cases` call is a check of its own."""
    token = _ENDED.set([None])
    try:
        yield
    finally:
        _ENDED.reset(token)


def not_run(case, where: str) -> CaseResult:
    """The verdict on a case that a time-out before it kept from running (SPEC §13.2)."""
    return CaseResult(case, NOT_RUN, detail=f"not run: the check ended at the time-out of {where} (time_limit=None: "
                                            f"the first time-out ends a check, SPEC 13.2; give time_limit to run "
                                            f"every case)")


def isolated(settings: Settings, fn=_UNKNOWN) -> bool:
    """Whether a case runs in a forked worker: ``settings.isolate`` when set; by default (None) in
    both modes (SPEC §13.2: only a worker's hard deadline stops an implementation that swallows the
    time-out), unless the implementation ``fn`` declares ``specref_isolate = False`` or this process
    has started CUDA (a forked worker could not use it).  A statistical check on an executor is the
    one exception: its shards run in processes of the executor's own, which the fork cannot hold."""
    if settings.mode == "statistical" and settings.executor is not None:
        return False
    if settings.isolate is not None:
        return settings.isolate
    if cuda_started():
        return False
    if fn is _UNKNOWN:  # a level that keeps its implementation to itself: nothing declared to read
        return True
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
    in its worker; what it added comes back here.  With ``settings.checks_state`` every case
    that passed is judged again, its body reused (see the module docstring).
    """
    for case in cases:
        validate(case)
    report = Report(level=level.name, mode=settings.mode)
    isolate = isolated(settings, fn)
    store = settings.shard_store if settings.mode == "statistical" else None
    ended = _ENDED.get() or [None]  # outside one_check: this call is the check
    bodies: list = []
    for i, case in enumerate(cases):
        if ended[0] is not None:
            bodies.append(None)
            report.results.append(not_run(case, ended[0]))
            continue
        body = exact(case) if settings.mode == "exact" else statistical(case, settings.seed + i)
        bodies.append(body)
        result = run_case(body, case, isolate=isolate, time_limit=settings.time_limit,
                          case_time_limit=_case_time_limit(settings), store=store)
        report.results.append(result if recheck is None else recheck(case, result))
        if result.status == TIMEOUT and settings.time_limit is None:
            ended[0] = f"case {getattr(case, 'name', i)!r}"
    if settings.checks_state and ended[0] is None:
        _check_state(report.results, cases, bodies, settings, isolate=isolate, recheck=recheck, ended=ended)
    for result in report.results:
        result.law = None  # kept only for the state check: reports stay small
    return report


def _case_time_limit(settings: Settings) -> float:
    """``settings.case_time_limit``, which the oracle has set from the plan by the time a level runs
    (``check``, ``plan``); a TypeError, as the arithmetic on None would raise, when it has not."""
    limit = settings.case_time_limit
    if limit is None:
        raise TypeError("run_cases needs settings.case_time_limit: check() sets it from the plan when it is None")
    return limit


# ---------------------------------------------------------------- the state check


def shape_key(case) -> tuple:
    """What makes two cases "of the same shapes" for the state check: the shape of every array the
    case holds, which fields are None, its integer fields (K, ...), the length of its tuples (a
    prompt, drafts per row), and a tree case's ``widths`` (the tree's shape).  A case whose fields
    cannot be read so is a shape of its own."""
    try:
        names = ([f.name for f in dataclasses.fields(case)] if dataclasses.is_dataclass(case)
                 else sorted(getattr(case, "__dict__", {})))
        key: list = [type(case).__name__]
        for name in names:
            v: Any = getattr(case, name, None)
            if hasattr(v, "shape") and hasattr(v, "ndim"):
                key.append((name, tuple(v.shape)))
            elif v is None or (isinstance(v, int) and not isinstance(v, bool)):
                key.append((name, v))
            elif isinstance(v, tuple):
                key.append((name, v if name == "widths" else len(v)))  # a prompt by its length; widths: a tree's shape
        return tuple(key)
    except Exception:  # noqa: BLE001 - a user's case type with fields that raise: its own group
        return ("unreadable", id(case))


def second_order(cases, passed, first, seed: int, *, start) -> list:
    """The state check's second order of the case indices ``passed``.

    ``first[i]``: the index of the case that ran just before case ``i`` in the first pass (None:
    nothing did).  The second run of the case at position ``j`` comes after the one at ``j - 1``,
    the first one after case ``start`` (in-process: the last case of the first pass; isolated:
    None, meaning the last of this order).  Cases of the same :func:`shape_key` are kept together
    (members and groups in a shuffled order), so each case with a partner of its shapes comes
    after one, but the first of its group; of :data:`ORDER_TRIES` shuffles drawn from ``seed``,
    the first in which no case comes after the same case as in the first pass, nor after itself,
    is taken (else the one with fewest such repeats).
    """
    rng = np.random.default_rng(seed)
    by_shape: dict[tuple, list[int]] = {}
    for i in passed:
        by_shape.setdefault(shape_key(cases[i]), []).append(i)
    groups = list(by_shape.values())
    best: list = []  # set by the first try (ORDER_TRIES > 0)
    fewest: int | None = None
    for _ in range(ORDER_TRIES):
        blocks = [[g[m] for m in rng.permutation(len(g))] for g in groups]
        order = [i for b in rng.permutation(len(blocks)) for i in blocks[b]]
        repeats = sum(2 * (before == first[i]) + (before == i)
                      for i, before in zip(order, _predecessors(order, start)))
        if fewest is None or repeats < fewest:
            best, fewest = order, repeats
        if repeats == 0:
            break
    return best


def _partnered(cases, passed, seed: int) -> list:
    """The default state check's cases: those with a partner of their shapes among ``passed``, and
    one case of a lone shape (drawn from ``seed``) that comes after a case of another shape; none
    when one case passed (``state_check=True`` judges every passed case again)."""
    if len(passed) < 2:
        return []
    groups: dict[tuple, list[int]] = {}
    for i in passed:
        groups.setdefault(shape_key(cases[i]), []).append(i)
    lone = [g[0] for g in groups.values() if len(g) == 1]
    keep = {i for g in groups.values() if len(g) > 1 for i in g}
    if lone:
        keep.add(lone[int(np.random.default_rng([seed, 1]).integers(len(lone)))])
    return [i for i in passed if i in keep]


def _predecessors(order, start) -> list:
    """The case each run of ``order`` comes after (``start``; None: the last of the order)."""
    return [(order[-1] if start is None else start)] + order[:-1]


def _check_state(results, cases, bodies, settings: Settings, *, isolate: bool, recheck=None, ended=None):
    """Judge each passed case again in :func:`second_order`; ``results[i]`` becomes ``stateful``
    when the verdict or the law changed, or the second run's time-out or internal error (under the
    default time rule a time-out ends the check: no second run after it)."""
    n = len(cases)
    passed = [i for i, r in enumerate(results) if r.status == OK]  # a case that failed has its verdict
    if settings.state_check is None:  # the default: where state between cases of one shape can show
        passed = _partnered(cases, passed, settings.seed)
    if not passed:
        return
    first = [None] * n if isolate else [None] + list(range(n - 1))
    start = None if isolate else n - 1
    order = second_order(cases, passed, first, settings.seed, start=start)
    limit = _case_time_limit(settings)
    if isolate and isinstance(limit, (int, float)):
        limit = 2 * limit  # a worker runs the predecessor, then the case
    for i, before in zip(order, _predecessors(order, start)):
        body = _after(bodies[before], bodies[i]) if isolate else bodies[i]
        again = run_case(body, cases[i], isolate=isolate, time_limit=settings.time_limit, case_time_limit=limit)
        if recheck is not None:
            again = recheck(cases[i], again)
        runs = (_run_name(cases, i, before, isolate), _run_name(cases, i, first[i], isolate))
        results[i] = _judged_twice(results[i], again, runs, settings.tolerance)
        if again.status == TIMEOUT and settings.time_limit is None and ended is not None:
            ended[0] = f"the state check's second run of {_run_name(cases, i, before, isolate)}"
            break


def _after(before: Callable, body: Callable) -> Callable:
    """One isolated worker's second run: the predecessor's body (its verdict was taken in the first
    pass: a misbehaviour of it here is left out), then the case's."""
    def pair():
        try:
            before()
        except (Misbehaved, SpecrefError):
            pass
        return body()

    return pair


def _run_name(cases, i, before, isolate) -> str:
    name = f"case {getattr(cases[i], 'name', i)!r}"
    if before is None:
        return name + (" in a fresh worker" if isolate else " run first")
    if before == i:
        return name + " after itself"
    return name + f" after case {getattr(cases[before], 'name', before)!r}"


def _judged_twice(first: CaseResult, again: CaseResult, runs: tuple, tolerance: float) -> CaseResult:
    """The verdict on a case judged in two runs (``runs``: their names, the second run's first):
    ``stateful`` when both carry laws and they differ (Fractions: at all; floats: by more than
    ``tolerance``), when the verdicts differ, or when exact TVs to the target do."""
    second_run, first_run = runs
    if again.status in (TIMEOUT, INTERNAL):
        again.detail, again.law = f"{second_run} (the state check's second run): {again.detail}", None
        return again
    tv = max((r.tv for r in (first, again) if r.tv is not None), default=None)
    c = None if first.law is None or again.law is None else compare(again.law, first.law, top=2)
    if c is not None and (c.tv > 0 if c.exact else c.tv > tolerance):
        exactly = f" = {c.tv}" if c.exact else ""
        worst = ", ".join(f"{o}: {float(a):.4g} vs {float(b):.4g}" for o, a, b in c.worst)
        detail = (f"{second_run}: law differs from {first_run} (TV {float(c.tv):.4g}{exactly}; verdicts "
                  f"{again.status} vs {first.status}); worst outputs (output, second run, first run): {worst}")
    elif again.status != first.status:
        said = f"{again.status}" + (f" ({again.detail})" if again.detail else "")
        detail = f"{second_run}: {said}; {first_run}: {first.status}"
    elif isinstance(first.tv, Fraction) and isinstance(again.tv, Fraction) and first.tv != again.tv:
        detail = f"{second_run}: TV to the target {again.tv} differs from {first_run}: {first.tv}"
    else:
        return first
    return dataclasses.replace(again, case=first.case, status=STATEFUL, tv=tv, detail=detail, law=None)


def exact_verdict(case, program, expected, settings: Settings) -> CaseResult:
    """Enumerate ``program(rng)`` (the implementation draws from the same lazy generator) and
    compare its law with ``expected``; misbehaviour propagates for ``run_case`` to report."""
    got = law(program, max_paths=settings.max_paths)
    return law_verdict(case, compare(got, expected), settings.tolerance)


def samples_in_budget(pilot: Callable[[int], object], settings: Settings, started: float, *, most: int) -> int:
    """N for ``settings.budget_s``, from timed pilots whose samples are discarded.

    ``pilot(m)`` samples ``m`` times.  Pilots of ``PILOT``, ``4 PILOT``, ``16 PILOT``, ... run
    until one takes a twentieth of the budget; the rate is the marginal one between the last two
    (so a call's fixed set-up is not counted per sample).  N is what the rest of the budget buys
    at that rate, at least ``MIN_BUDGET_SAMPLES`` and at most ``most``.  ``started``: when the
    case began (``time.perf_counter()``): set-up and pilots come out of the budget.  The report
    states N and the TV that N detects, so a budget too small shows as a large detectable TV.
    """
    budget = settings.budget_s
    if budget is None:
        raise TypeError("samples_in_budget needs settings.budget_s")
    timings = []  # (m, seconds)
    m = PILOT
    while True:
        t0 = time.perf_counter()
        pilot(m)
        timings.append((m, time.perf_counter() - t0))
        if timings[-1][1] >= budget / 20 or 4 * m > most or time.perf_counter() - started > budget / 4:
            break
        m *= 4
    (m1, t1), (m0, t0_) = timings[-1], timings[-2] if len(timings) > 1 else (0, 0.0)
    per_sample = (t1 - t0_) / (m1 - m0) if t1 > t0_ else t1 / m1
    left = budget - (time.perf_counter() - started)
    return int(min(most, max(MIN_BUDGET_SAMPLES, left / max(per_sample, 1e-9))))


def target_null(expected: dict) -> np.ndarray:
    """The null of a G-test against the law ``expected``: its probabilities by sorted output, and one
    last bin, of probability 0, for the outputs the target never makes."""
    return np.array([float(expected[o]) for o in sorted(expected)] + [0.0])


def program_plan(expected: dict, recipe: Callable, settings: Settings, seed: int) -> CasePlan:
    """The plan of a statistical check by :func:`sampled_verdict` (one sample per call of the program
    ``recipe()`` builds): N over ``expected``, timed as the check makes its calls."""
    n = planned_n(settings, target_null(expected))
    return CasePlan(len(expected), n, 1, n, timer=timed_calls(recipe, seed, 1))


def sampled_verdict(case, recipe, expected, settings: Settings, seed: int) -> CaseResult:
    """N samples of the program or :class:`~specref.verification.statistics.shards.Sampler` that
    ``recipe()`` builds (where a shard runs), counted in seeded blocks
    (:mod:`specref.verification.statistics.shards`: the same counts on any executor), then a pooled
    G-test against ``expected`` with one extra bin for outputs it never makes."""
    started = time.perf_counter()
    outcomes = sorted(expected)
    null = target_null(expected)
    if settings.samples or settings.budget_s is None:
        n = planned_n(settings, null)
    else:
        n = samples_in_budget(lambda m: tally(recipe, outcomes, m, seed), settings, started,
                              most=MAX_BUDGET_SAMPLES)
    with progress_bar(n, f"{case.name}", enabled=settings.progress) as bar:
        t = tally(recipe, outcomes, n, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
                  progress=bar, store=settings.shard_store)
    if t.misbehaved:
        _, status, detail = t.misbehaved
        return CaseResult(case, status, detail=detail)
    result = compare_counts(t.counts, null, alpha=settings.alpha)
    est, detail = result.tv, f"{result.g}"
    if t.strays:
        detail += f"; outputs the target never makes: {dict(list(t.strays.items())[:3])}"
    detectable = detectable_tv(n, settings.alpha, PLAN_POWER, len(null), null=null)
    spent = t.seconds.get("implementation")
    seconds = None if spent is None else {
        "implementation": spent / n, "oracle": max(0.0, time.perf_counter() - started - spent) / n}
    return CaseResult(case, DIFFERS if result.rejected else OK, tv=est.estimate, detail=detail,
                      n_samples=n, p_value=result.g.p_value, tv_interval=(est.lower, est.upper),
                      detectable_tv=detectable, seconds_per_sample=seconds)

