"""specref as an oracle: check another implementation, get a verdict and a counterexample.

:func:`check` runs any level of :data:`~specref.verification.levels.LEVELS` under one
:class:`~specref.verification.running.report.Settings`; the ``check_*`` functions are its shorthands, one per level:

- **step**, **logits**, **decoder** (SPEC §3-§4; :mod:`specref.verification.levels.chain`);
- **batched**, **draft_and_verify** (SPEC §11; :mod:`specref.verification.levels.batched`);
- **tree** (SPEC §12; :mod:`specref.verification.levels.trees`), and dense batches of trees
  (:func:`check_tree_batch`);
- **vllm**, **flashinfer**: the batched level in the engines' calls
  (:mod:`specref.verification.levels.engines`).

``batch=n`` (step, logits and decoder levels) says "call me with ``n`` samples at once": the
same as :func:`~specref.verification.levels.chain.declare_batch` (SPEC §13.1).

Cases are plain data, so a counterexample reproduces when passed back in
(``check_step(fn, cases=[report.counterexample])``).

Modes:

- ``"exact"``: the implementation draws all its randomness from the ``rng`` it is handed;
  specref enumerates every path (:mod:`specref.verification.laws`) and computes the total
  variation to the target law exactly.  It fails when TV > ``tolerance`` (SPEC §13).
- ``"statistical"``: the implementation uses its own randomness and ``rng`` is an integer
  seed; specref draws N samples (planned by
  :func:`specref.verification.statistics.counts.samples_needed` to detect TV >= ``detect_tv``
  with power 0.9 at ``alpha``), runs a pooled G-test, and reports N, the p-value and a TV interval.

Misbehaviour is reported, never raised: an implementation that raises, returns tokens
outside the vocabulary, returns an empty or over-long block, does arithmetic on a lazy
uniform, or does not return within ``time_limit`` seconds gets that status, with the case
that caused it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace
from functools import partial
from numbers import Integral

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.verification.cases.chain import Case, default_cases, fixed_cases, strategy_cases
from specref.verification.cases.rules import RulesReport, declare_rules, rules_of
from specref.verification.laws.enumeration import compare
from specref.verification.levels import LEVELS, register
from specref.verification.levels.batched import default_batched_cases
from specref.verification.levels.chain import batch_of, declare_batch, run_programs
from specref.verification.levels.trees import run_tree_batch, tree_cases
from specref.verification.running.calling import can_isolate, cuda_started, guarded
from specref.verification.running.level import Level
from specref.verification.running.report import (ARITHMETIC, BUDGET, CRASHED, INTERNAL, INVALID, RAISED, RNG_MISUSE,
                                                 TIMEOUT, WRITES, CaseResult, Report, Settings)
from specref.verification.statistics.shards import BLOCK, block_rng, check_travel

__all__ = [
    "Case",
    "CaseResult",
    "Report",
    "Settings",
    "Level",
    "LEVELS",
    "register",
    "run_programs",
    "check",
    "declared",
    "check_step",
    "check_logits_step",
    "check_decoder",
    "check_batched_step",
    "check_draft_and_verify",
    "check_tree",
    "check_tree_batch",
    "compare",
    "default_cases",
    "fixed_cases",
    "strategy_cases",
]


BATCH_LEVELS = ("step", "logits", "decoder")  # the levels where batch= (calls of n samples) applies


def check(level: str, fn, *, cases=None, settings: Settings | None = None, rules=None, batch: int | None = None,
          **fields_) -> Report:
    """Check ``fn`` at ``level`` (a key of :data:`~specref.verification.levels.LEVELS`) on ``cases`` (default: the level's own).

    Settings come as one :class:`~specref.verification.running.report.Settings`, or as its fields by keyword
    (``check("step", fn, mode="statistical")``); keywords override ``settings``.
    ``rules`` (logits and decoder levels): the implementation's declared rule order or its
    own plain sampler (:mod:`specref.verification.cases.rules`); speculative output is then
    checked against that sampler, and the report says so.
    ``batch`` (step, logits and decoder levels): ``fn`` takes ``batch`` samples per call, rows
    stacked (:func:`~specref.verification.levels.chain.declare_batch`; SPEC §13.1).
    """
    if not isinstance(level, str) or level not in LEVELS:
        raise SpecrefError(f"level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    return _check(LEVELS[level], fn, cases=cases, settings=settings, rules=rules, batch=batch, **fields_)


def declared(level: str, fn, *, rules=None, batch: int | None = None):
    """``fn`` with ``rules`` and ``batch`` declared on it (:func:`check`'s arguments), validated:
    ``batch`` a positive int (not a bool) at the step, logits and decoder levels, ``rules`` at the
    logits and decoder levels.  A batch already declared keeps its array, device and dtype."""
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({level} level) must be callable, got {fn!r:.80}")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, Integral) or batch < 1:
            raise SpecrefError(f"batch (samples per call) must be a positive integer, got {batch!r:.80}")
        if level not in BATCH_LEVELS:
            raise SpecrefError(f"batch (samples per call) applies at the {', '.join(BATCH_LEVELS)} levels, "
                               f"not {level!r}")
        form = batch_of(fn)
        kw = {} if form is None else dict(array=form.array, device=form.device, dtype=form.dtype)
        fn = declare_batch(fn, int(batch), **kw)
    if rules is not None:
        fn = declare_rules(fn, rules)
    if rules_of(fn) is not None and level not in ("logits", "decoder"):
        raise SpecrefError(f"rules apply at the logits and decoder levels, not {level!r}")
    return fn


def _check(spec: Level, fn, *, cases, settings, rules, batch=None, **fields_) -> Report:
    """:func:`check` on a level object (a registered level, or a variant of one)."""
    level = spec.name
    unknown = set(fields_) - {f.name for f in fields(Settings)}
    if unknown:
        raise SpecrefError(f"unknown setting(s) {sorted(unknown)}; Settings has {[f.name for f in fields(Settings)]}")
    settings = replace(settings or Settings(), **fields_)
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({spec.signature.split('(')[0]}) must be callable, got {fn!r:.80}")
    fn = declared(level, fn, rules=rules, batch=batch)
    try:
        cases = spec.cases() if cases is None else list(cases)
    except TypeError:
        raise SpecrefTypeError(f"cases must be an iterable of Case objects, got {cases!r:.80}") from None
    if not cases:
        raise SpecrefError(f"cases is empty: a check on no case proves nothing (level {level!r})")
    if settings.mode == "statistical":
        check_travel(settings.executor, fn)  # before any case runs: a usage error, not the implementation's
    if settings.case_time_limit is None:  # from the plan (Settings' docstring)
        settings = replace(settings, case_time_limit=_planned_case_time(spec, fn, cases, settings))
    report = spec.run(spec, fn, cases, settings)
    return report if rules_of(fn) is None else RulesReport.of(report, rules_of(fn))


def check_step(step_fn, **options) -> Report:
    """``check("step", step_fn, **options)``: ``step_fn(p_target, q_draft, draft_tokens, rng)``."""
    return check("step", step_fn, **options)


def check_logits_step(step_fn, **options) -> Report:
    """``check("logits", step_fn, **options)``: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng)``."""
    return check("logits", step_fn, **options)


def check_decoder(decode_fn, **options) -> Report:
    """``check("decoder", decode_fn, **options)``: ``decode_fn(target, draft, prompt, *, k, config, ...)``."""
    return check("decoder", decode_fn, **options)


def _with_array(cases, array):
    return cases if array is None else [replace(c, array=array) for c in cases]


def check_batched_step(step_fn, *, cases=None, array: str | None = None, **settings) -> Report:
    """``check("batched", step_fn)``: ``step_fn(p_target [B,K+1,V], q_draft [B,K,V] | None, draft_tokens [B,K], seed)``.

    ``array="torch"`` hands the implementation torch tensors in statistical mode.
    """
    cases = default_batched_cases("batched") if cases is None else list(cases)
    return check("batched", step_fn, cases=_with_array(cases, array), **settings)


def check_draft_and_verify(step_fn, *, cases=None, array: str | None = None, **settings) -> Report:
    """``check("draft_and_verify", step_fn)``: ``step_fn(p_target [B,K+1,V], q_draft [B,K,V], seed)``."""
    cases = default_batched_cases("draft_and_verify") if cases is None else list(cases)
    return check("draft_and_verify", step_fn, cases=_with_array(cases, array), **settings)


def check_tree(tree_step_fn, *, drafting: str = "topk", **options) -> Report:
    """``check("tree", fn, cases=tree_cases(drafting), **options)``."""
    options.setdefault("cases", tree_cases(drafting))
    return check("tree", tree_step_fn, **options)


def check_tree_batch(kernel, *, batch: int = 2, cases=None, **options) -> Report:
    """``check("tree_batch", kernel)`` with ``batch`` trees per call (SPEC §12): exact with the
    kernel's coins as lazy uniforms, or statistical; ``options`` are :class:`~specref.verification.running.report.Settings` fields."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecrefError(f"batch must be a positive integer, got {batch!r}")
    spec = replace(LEVELS["tree_batch"], run=partial(run_tree_batch, batch=batch))
    return _check(spec, kernel, cases=cases, settings=options.pop("settings", None), rules=options.pop("rules", None),
                  **options)


# ---------------------------------------------------------------- plans: N, calls, an ETA and the case time limit

CASE_TIME_FLOOR = 300.0  # a case's time limit is never below this by default (exact mode: the default itself)
CASE_TIME_FACTOR = 3.0  # a planned case's default limit: this many ETAs (a few timed calls; load varies)
CASE_TIME_CAP = 24 * 3600.0  # ... and never more than a day per case
PLAN_CALLS = 3  # warm calls the default case time limit of a statistical check times per case
EXACT_ONLY = ("batched_coins", "tree_coins", "vllm_coins")  # coins in, exact out: no statistical mode
_MISBEHAVED = (RAISED, INVALID, TIMEOUT, ARITHMETIC, CRASHED, BUDGET, RNG_MISUSE, WRITES, INTERNAL)
_BATCHED_FAMILY = {"batched": "batched", "draft_and_verify": "draft_and_verify", "vllm": "batched",
                   "flashinfer": "batched", "mrv2": "batched"}  # level -> the batched level its statistics are of


def planned_case_time(eta_s: float | None) -> float:
    """A case's default ``case_time_limit`` from its ETA: :data:`CASE_TIME_FACTOR` x ETA, at least
    :data:`CASE_TIME_FLOOR`, at most :data:`CASE_TIME_CAP`; the floor when there is no ETA."""
    if eta_s is None:
        return CASE_TIME_FLOOR
    return min(CASE_TIME_CAP, max(CASE_TIME_FLOOR, CASE_TIME_FACTOR * eta_s))


@dataclass(frozen=True)
class PlanRow:
    """One case of a plan (:func:`~specref.verification.campaigns.planning.plan`)."""

    case: str
    outcomes: int | None  # outputs with positive target probability (None where the level's law is not one table)
    n: int | None  # statistical: planned (or given) samples; exact: the implementation calls the check makes (estimate)
    seconds_per_call: float | None  # a warm call of `batch` samples; None when the implementation misbehaved
    eta_s: float | None  # first_call_s + (calls - 1) * seconds_per_call; None with the reason in `note`
    note: str = ""
    batch: int = 1  # samples per call: the declared batch (batched levels: copies of the case's rows), at most n
    calls: int | None = None  # calls of the implementation the run makes
    first_call_s: float | None = None  # the first call, timed apart

    @property
    def case_time_limit(self) -> float:
        """The case time limit the check uses for this case by default (:func:`planned_case_time`)."""
        return planned_case_time(self.eta_s)


def _reference_of(level: str, rules=None):
    """specref's own implementation at a registered ``level`` (None for a level it has none for)."""
    from specref.decoding.batched import batched_draft_and_verify, batched_step
    from specref.verification.levels import coins, engine_coins, engines, greedy, mrv2, trees
    from specref.verification.levels.chain import _reference

    if level in ("step", "logits", "decoder"):
        return _reference(level, rules)
    return {"batched": batched_step, "draft_and_verify": batched_draft_and_verify,
            "vllm": engines.vllm_reference, "flashinfer": engines.flashinfer_reference,
            "tree": trees.from_coins(trees.sglang_style_kernel), "tree_batch": trees.batched_reference_kernel,
            "batched_coins": coins.engine_coin_kernel, "tree_coins": coins.sglang_coin_kernel,
            "vllm_coins": engine_coins.vllm_coin_reference, "mrv2": mrv2.mrv2_reference,
            "greedy_tree": greedy.greedy_reference, "greedy_tree_step": greedy.greedy_step_reference}.get(level)


class _Timed:
    """``fn`` with each call's start timed; after ``stop`` calls it raises :class:`_Enough` (the
    level's own check then ends the case: the pilot has what it came for).  Attributes (a declared
    batch, rules, ties, ``specref_isolate``) are ``fn``'s."""

    def __init__(self, fn, stop: int):
        self.fn, self.stop, self.starts, self.first = fn, stop, [], None

    def __getattr__(self, name):
        return getattr(self.__dict__["fn"], name)

    def __call__(self, *args, **kwargs):
        if len(self.starts) >= self.stop:
            raise _Enough()
        t0 = time.perf_counter()
        self.starts.append(t0)
        try:
            return self.fn(*args, **kwargs)
        finally:
            if len(self.starts) == 1:
                self.first = time.perf_counter() - t0


class _Enough(Exception):
    """The pilot's stop: enough calls timed."""


def _quiet(settings: Settings, **more) -> Settings:
    """Settings for the oracle's own runs inside a plan: here, one case, no state check, no bar."""
    return replace(settings, isolate=False, state_check=False, progress=False, executor=None, shard_store=None,
                   **more)


def _pilot(spec: Level, fn, case, settings: Settings, calls: int) -> tuple:
    """The level's own check of ``case`` (its first calls are the run's), stopped after the first
    call and ``calls + 1`` more: ``(first call s, warm s per call, None)`` -- warm: the mean time from
    the start of one call to the next (the oracle's work between calls included) -- or
    ``(None, None, "status: detail")`` when the implementation misbehaved first."""
    timed = _Timed(fn, calls + 2)
    limit = CASE_TIME_FLOOR + (calls + 2) * settings.time_limit
    result = spec.run(spec, timed, [case], _quiet(settings, case_time_limit=limit)).results[0]
    s = timed.starts
    if not s or (len(s) < timed.stop and result.status in _MISBEHAVED):
        return None, None, f"{result.status}: {result.detail[:80]}"
    if len(s) >= 3:
        warm = (s[-1] - s[1]) / (len(s) - 2)
    else:
        warm = timed.first
    return timed.first, warm, None


def _counted(spec: Level, reference, case, settings: Settings) -> tuple:
    """``(calls, None)``: the calls the level's exact check of ``case`` makes of ``reference``;
    ``(None, why)`` when that check does not pass (over budget, say)."""
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return reference(*args, **kwargs)

    counting.__dict__.update(getattr(reference, "__dict__", {}))
    result = spec.run(spec, counting, [case], _quiet(settings, case_time_limit=CASE_TIME_CAP)).results[0]
    if result.status != "ok":
        return None, f"the reference's exact check: {result.status}: {result.detail[:80]}"
    return count[0], None


def _statistical_n(spec: Level, fn, case, settings: Settings, seed: int) -> tuple:
    """``(outcomes, n, samples per call, calls)`` a statistical check of ``case`` plans, as the level
    plans them (SpecrefError for a level it does not know)."""
    from specref.verification.levels import batched, greedy, trees
    from specref.verification.statistics.counts import samples_needed

    name = _BATCHED_FAMILY.get(spec.name)
    if name is not None:  # the batched level's own planner: N rows, in calls of `copies` copies of the case
        bc = case.law_case() if spec.name == "mrv2" else case
        f = bc.as_float()
        if settings.samples:
            n = settings.samples
        else:
            stats = batched.statistics_nulls(f, name, salt=seed)
            alpha = settings.alpha / len(stats)
            n = min(batched.MAX_SAMPLES, max(
                samples_needed(settings.detect_tv, alpha, 0.9, max(2, len(s.null)), null=batched._plan_null(s.null))
                for s in stats if (s.null > 0).sum() >= 2))
        copies = batched._copies_per_call(bc, n)
        return None, n, copies, batched._calls(n, copies)
    if spec.name in ("tree", "tree_batch"):
        size = getattr(spec.run, "keywords", {}).get("batch", 2) if spec.name == "tree_batch" else 1
        one = trees._budget(case.as_float(), settings, size)
        expected = one if size == 1 else trees._product(one, size)
    elif spec.name in ("greedy_tree", "greedy_tree_step"):
        expected = greedy._batch_law(case, greedy.ties_of(fn))
        if len(expected) == 1:  # a point mass: N that sees a stray of probability detect_tv with power 0.9
            n = settings.samples or math.ceil(math.log(0.1) / math.log1p(-settings.detect_tv))
            return 1, n, 1, n
    else:
        raise SpecrefError(f"plan does not know how the {spec.name!r} level plans N (a level registered "
                           f"outside specref)")
    null = np.array([float(expected[o]) for o in sorted(expected)] + [0.0])
    n = settings.samples or samples_needed(settings.detect_tv, settings.alpha, 0.9, len(null), null=null)
    return len(expected), n, 1, n


def plan_rows(spec: Level, fn, cases, settings: Settings, *, calls: int, isolate: bool) -> list[PlanRow]:
    """A :class:`PlanRow` per case of ``spec`` (``fn`` declared, ``cases`` validated): N and the calls
    as the check makes them, and the first call and ``calls`` warm calls timed (in a forked worker
    per case with ``isolate``, under the per-call ``time_limit``); a misbehaviour is the row's note."""
    if settings.mode == "statistical" and spec.name in EXACT_ONLY:
        raise SpecrefError(f"the {spec.name} level has no statistical mode (coins in, exact out): plan it with "
                           f"mode='exact', got mode='statistical'")
    return [_plan_case(spec, fn, case, settings, settings.seed + i, calls, isolate) for i, case in enumerate(cases)]


def _plan_case(spec: Level, fn, case, settings: Settings, seed: int, calls: int, isolate: bool) -> PlanRow:
    """One case's row: N and the calls (exact mode: counted on the reference, in the guarded body),
    then the timed calls in a guarded body."""
    guard = partial(guarded, isolate=isolate, time_limit=settings.time_limit,
                    case_time_limit=(settings.case_time_limit or CASE_TIME_FLOOR) + (calls + 2) * settings.time_limit)
    if spec.program is not None:
        return _chain_row(spec, fn, case, settings, seed, calls, guard)
    outcomes, n, per_call, total, note, reference = None, None, 1, None, "", None
    if settings.mode == "exact":
        reference = _reference_of(spec.name, rules_of(fn))
        if reference is None:
            note = f"N unknown until run: specref has no reference at the {spec.name!r} level to count calls on"
    elif settings.budget_s is not None and not settings.samples:
        note = f"N chosen at run time from budget_s = {settings.budget_s} s"
    else:
        try:
            outcomes, n, per_call, total = _statistical_n(spec, fn, case, settings, seed)
        except SpecrefError as e:
            note = f"N unknown until run: {e}"[:160]
    status, value = guard(partial(_level_timings, spec, fn, reference, case, replace(settings, seed=seed), calls))
    if status != "result":
        return PlanRow(case.name, outcomes, n, None, None, note=f"{status}: {value[:80]}", batch=per_call, calls=total)
    counted, why, first, warm, bad = value
    if reference is not None:
        n = total = counted
        note = why or "N: the calls of the reference's exact check (an estimate for another implementation)"
    if bad is not None:
        return PlanRow(case.name, outcomes, n, None, None, note=bad + (f"; {note}" if note else ""), batch=per_call,
                       calls=total)
    if total is None:
        eta = float(settings.budget_s) if settings.budget_s is not None and settings.mode == "statistical" else None
    else:
        eta = first + (total - 1) * warm
    return PlanRow(case.name, outcomes, n, warm, eta, note=note, batch=per_call, calls=total, first_call_s=first)


def _level_timings(spec, fn, reference, case, settings, calls) -> tuple:
    """In the guarded body: ``(reference calls, why not, first s, warm s, the implementation's misbehaviour)``."""
    counted, why = (None, None) if reference is None else _counted(spec, reference, case, settings)
    first, warm, bad = _pilot(spec, fn, case, settings, calls)
    return counted, why, first, warm, bad


def _calls(n: int, per_call: int) -> int:
    """Calls for ``n`` samples: blocks of ``BLOCK``, each cut into calls of ``per_call`` (no call spans two)."""
    full, rest = divmod(n, BLOCK)
    return full * math.ceil(BLOCK / per_call) + math.ceil(rest / per_call)


def _chain_row(spec, fn, case, settings: Settings, seed: int, calls: int, guard) -> PlanRow:
    """A chain level's row: N (exact mode: the reference's paths), then the timed calls in a guarded body."""
    from specref.verification.levels.chain import _reference, batch_of
    from specref.verification.laws.enumeration import law
    from specref.verification.statistics.counts import samples_needed

    if settings.mode == "exact":
        _, expected = spec.program(fn, case, settings.time_limit)
        reference, _ = spec.program(_reference(spec.name, rules_of(fn)), case, settings.time_limit)
        try:
            n = law(lambda rng: reference(rng, rng), max_paths=settings.max_paths).paths
        except SpecrefError as e:  # over max_paths: the exact check stops there too
            return PlanRow(case.name, len(expected), settings.max_paths, None, None, note=f"over budget: {e}"[:120])
        per_call, total = 1, n
        body = partial(_timed_exact, spec, fn, case, settings.time_limit, seed, calls)
    else:
        _, expected = spec.program(fn, case.as_float(), settings.time_limit)
        null = np.array([float(w) for w in expected.values()] + [0.0])
        n = settings.samples or samples_needed(settings.detect_tv, settings.alpha, 0.9, len(null), null=null)
        form = batch_of(fn)
        per_call = 1 if form is None else min(form.per_call, n)
        total = _calls(n, per_call)
        body = partial(_timed_batches, spec.name, fn, case.as_float(), settings.time_limit, seed, calls, per_call)
    status, value = guard(body)
    if status != "result":
        return PlanRow(case.name, len(expected), n, None, None, note=f"{status}: {value[:80]}", batch=per_call,
                       calls=total)
    first, warm = value
    return PlanRow(case.name, len(expected), n, warm, first + (total - 1) * warm, batch=per_call, calls=total,
                   first_call_s=first)


def _timed(call, calls) -> tuple[float, float]:
    """``(seconds of the first call, seconds per warm call)`` of ``call(i)``: ``i = 0``, then ``1..calls``."""
    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, calls + 1):
        call(i)
    return first, (time.perf_counter() - t0) / calls


def _timed_batches(level, fn, case, time_limit, seed, calls, per_call) -> tuple[float, float]:
    """Statistical mode at a chain level: calls as the check makes them
    (:mod:`specref.verification.levels.chain`), one sample per call or ``per_call`` in one call, each
    on samples of its own, seeded and drawn as the samples of block 0 are (one ``block_rng(seed, 0)``)."""
    from specref.verification.levels.chain import _sampler_of

    sampler = _sampler_of(level, fn, case, time_limit)
    gen = block_rng(seed, 0)
    m = (calls + 1) * per_call
    seeds, coins = gen.integers(2**63, size=m), gen.random((m, sampler.coins))
    if sampler.form is None:
        return _timed(lambda i: sampler.one(coins[i], int(seeds[i])), calls)
    return _timed(lambda i: sampler.many(seeds[i * per_call:(i + 1) * per_call], coins[i * per_call:(i + 1) * per_call]),
                  calls)


def _timed_exact(spec, fn, case, time_limit, seed, calls) -> tuple[float, float]:
    """Exact mode at a chain level: runs of the case's program on a seeded generator, each one call."""
    program, _ = spec.program(fn, case, time_limit)
    gen = np.random.default_rng(seed)
    return _timed(lambda i: program(gen, gen), calls)


def _planned_case_time(spec: Level, fn, cases, settings: Settings) -> float:
    """``check``'s ``case_time_limit`` when it is None (``Settings``' docstring): the floor in exact
    mode; in statistical mode the largest of the cases' plan limits (:data:`PLAN_CALLS` warm calls
    timed per case in a forked worker), the cap where no worker can be forked."""
    if settings.mode == "exact":
        return CASE_TIME_FLOOR
    if not can_isolate() or cuda_started():
        return CASE_TIME_CAP
    try:
        rows = plan_rows(spec, fn, cases, settings, calls=PLAN_CALLS, isolate=True)
    except Exception:  # noqa: BLE001 - a malformed case: the level's validation names it when the check runs
        return CASE_TIME_FLOOR
    return max(row.case_time_limit for row in rows)
