"""specref as an oracle: check another implementation, get a verdict and a counterexample.

:func:`check` is the one door: ``check(level, fn, **keywords)`` runs any level of
:data:`~specref.verification.levels.LEVELS` (by name, or a
:class:`~specref.verification.running.level.Level` object) on its cases.  ``keywords`` are
:class:`~specref.verification.running.report.Settings` fields (``mode="statistical"``,
``samples=...``) or the level's own options (``batch=n`` at the step, logits and decoder levels:
``n`` samples per call, SPEC §13.1; ``rules`` at the logits and decoder levels; ``drafting`` at the
tree level; ``batch`` trees per call at the tree_batch level; ``array`` at the batched levels):
each level declares them (``Level.options``), and an unknown keyword is an error that lists both.
The oracle reads everything about a level from its object and names none.

The ``check_*`` functions (``check_step``, ``check_tree``, ...) are the 0.2 shorthands, kept for
the 0.3 release as thin wrappers over :func:`check`: each is a level's ``shorthand`` (module ``__getattr__``).

Cases are plain data, so a counterexample reproduces when passed back in
(``check(level, fn, cases=[report.counterexample])``).

Modes:

- ``"exact"``: the implementation draws all its randomness from the ``rng`` it is handed;
  specref enumerates every path (:mod:`specref.verification.laws`) and computes the total
  variation to the target law exactly.  It fails when TV > ``tolerance`` (SPEC §13).
- ``"statistical"``: the implementation uses its own randomness and ``rng`` is an integer
  seed; specref draws N samples (planned by
  :func:`specref.verification.statistics.counts.planned_n` to detect TV >= ``detect_tv``
  with power :data:`~specref.verification.statistics.counts.PLAN_POWER` at ``alpha``), runs a
  pooled G-test, and reports N, the p-value and a TV interval.

Misbehaviour is reported, never raised: an implementation that raises, returns tokens
outside the vocabulary, returns an empty or over-long block, does arithmetic on a lazy
uniform, or does not return within its per-call limit gets that status, with the case
that caused it.  The per-call limit is ``time_limit``, or by default one derived from the calls
measured, and then the first time-out ends the check (SPEC §13.2).  The door (:func:`_door`)
reads the implementation's declarations once, before any case: an attribute whose reading
raises is a SpecrefError naming it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import partial

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.verification.cases.chain import Case, default_cases, fixed_cases, strategy_cases
from specref.verification.cases.rules import RulesReport, rules_of
from specref.verification.laws.enumeration import compare
from specref.verification.levels import LEVELS, level_named, register
from specref.verification.levels.chain.programs import run_programs
from specref.verification.levels.runner import not_run, one_check
from specref.verification.running.calling import (CALL_MARGIN, FIRST_CALL_LIMIT, can_isolate, cuda_started, describe,
                                                  guarded, short_repr)
from specref.verification.running.level import CasePlan, Level, Option
from specref.verification.running.report import (ARITHMETIC, BUDGET, CRASHED, INTERNAL, INVALID, RAISED, RNG_MISUSE,
                                                 TIMEOUT, WRITES, CaseResult, Report, Settings)
from specref.verification.statistics.shards import check_travel

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
    "compare",
    "default_cases",
    "fixed_cases",
    "strategy_cases",
]

_SETTINGS = tuple(f.name for f in fields(Settings))


def check(level: str | Level, fn, *, cases=None, settings: Settings | None = None, **keywords) -> Report:
    """Check ``fn`` at ``level`` (a name in :data:`~specref.verification.levels.LEVELS`, or a
    :class:`~specref.verification.running.level.Level`) on ``cases`` (default: the level's own).

    ``keywords`` are :class:`~specref.verification.running.report.Settings` fields
    (``check(level, fn, mode="statistical")``) or the level's own options (``Level.options``:
    ``batch``, ``rules``, ``drafting``, ``array``, ...); a keyword that is neither is a
    SpecrefError listing both.  ``settings`` (one Settings object, which keywords override) is
    the 0.2 way, kept for callers that hold one.
    """
    spec, settings = _configured(level_named(level), settings, keywords)
    with _attribute_reads(fn):
        fn, cases = _prepared(spec, fn, cases)
        if not cases:
            raise SpecrefError(f"cases is empty: a check on no case proves nothing (level {spec.name!r})")
        if settings.mode == "statistical":
            check_travel(settings.executor, fn)  # before any case runs: a usage error, not the implementation's
        with one_check():  # under the default time rule the first time-out ends the check (SPEC §13.2)
            if settings.case_time_limit is None:  # from the plan (Settings' docstring)
                limit, hung = _planned_case_time(spec, fn, cases, settings)
                if hung is not None:
                    return _unanswered(spec, fn, cases, settings, *hung)
                settings = replace(settings, case_time_limit=limit)
            return spec.run(spec, fn, cases, settings)


def declared(level: str | Level, fn, **options):
    """``fn`` with ``level``'s ``options`` declared on it (:func:`check`'s, e.g. ``batch`` and
    ``rules``), validated as :func:`check` validates them (a value of None is not given)."""
    spec, _ = _configured(level_named(level), None, options)
    return _prepared(spec, fn, [])[0]  # no cases: only fn is wanted


def _configured(spec: Level, settings: Settings | None, keywords: dict) -> tuple[Level, Settings]:
    """``spec`` with its options among ``keywords`` chosen, and the settings the rest make; a keyword
    that is neither a Settings field nor one of the level's options is a SpecrefError."""
    given = {k: v for k, v in keywords.items() if k not in _SETTINGS}
    own = {k: v for k, v in given.items() if k in spec.option_names()}
    unknown = sorted(k for k, v in given.items() if k not in own and not (v is None and _holders(k)))
    if unknown:
        raise _not_an_option(spec, unknown, {k: given[k] for k in unknown})
    if settings is not None and not isinstance(settings, Settings):
        raise SpecrefTypeError(f"settings must be a Settings, got {settings!r:.80}")
    fields_ = {k: v for k, v in keywords.items() if k in _SETTINGS}
    return spec.with_options(**own), replace(settings or Settings(), **fields_)


DECLARATIONS = ("specref_batch", "specref_rules", "specref_ties", "specref_isolate", "__name__", "__qualname__",
                "__wrapped__", "__dict__")
"""The implementation's attributes that the oracle and its levels read (its declarations, and what a
wrapper copies): read once at the door, before any case (SPEC §13.2)."""


def _prepared(spec: Level, fn, cases) -> tuple:
    """``fn`` with the level's chosen options declared, checked against the options it declares
    itself (an attribute such as ``specref_rules``), and the cases (the level's, or those given;
    each with a name where the level has no ``validate`` of its own to say what a case is).  Every
    attribute the oracle reads of ``fn`` is read first (:func:`_door`)."""
    _door(spec, fn)
    fn, cases = spec.prepared(fn, cases)
    for opt in {id(o): o for lv in LEVELS.values() for o in lv.options}.values():
        if opt.declared is not None and opt.declared(fn) is not None and opt not in spec.options:
            raise _not_an_option(spec, [opt.name], {opt.name: opt.declared(fn)})
    for i, case in enumerate(cases if spec.validate is None else ()):  # a level's validate names its own cases
        if not isinstance(getattr(case, "name", None), str):
            raise SpecrefError(f"case {i} of the {spec.name} level, {short_repr(case, 80)}, is not a case: cases are "
                               f"plain data with a str name (the level's own cases, or a counterexample of a report)")
    return fn, cases


def _door(spec: Level, fn) -> None:
    """SpecrefError unless ``fn`` is callable, reading each of its :data:`DECLARATIONS` returns or
    raises AttributeError (absent), and what a specref declaration wraps (``declare_batch``'s and
    ``declare_rules``' ``fn``, ``functools.wraps``' ``__wrapped__``) is callable too."""
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({spec.signature.split('(')[0]}, {spec.name} level) must be "
                               f"callable, got {short_repr(fn, 80)}")
    seen: set[int] = set()
    inner = fn
    while inner is not None and id(inner) not in seen and len(seen) < 16:  # a chain that makes new links ends
        seen.add(id(inner))
        for name in DECLARATIONS:
            try:
                getattr(inner, name, None)
            except (Exception, SystemExit, GeneratorExit) as e:  # noqa: BLE001 - named, not raised
                raise _unreadable(f"attribute {name!r}", e) from None
        own = type(inner).__module__.startswith("specref.")  # declare_batch, declare_rules: the call goes to .fn
        wrapped = getattr(inner, "__dict__", {}).get("fn") if own else None
        wrapped = getattr(inner, "__wrapped__", None) if wrapped is None else wrapped
        if wrapped is not None and not callable(wrapped):
            raise SpecrefTypeError(f"the implementation {short_repr(inner, 60)} declares a non-callable: it wraps "
                                   f"{short_repr(wrapped, 80)}")
        inner = wrapped


def _unreadable(what: str, e: BaseException) -> SpecrefError:
    """The error for an attribute of the implementation whose reading raised ``e``."""
    return SpecrefError(f"reading the implementation's {what} raised {describe(e)}: the oracle reads its "
                        f"declarations ({', '.join(DECLARATIONS[:4])}) before any case, and an attribute that is not "
                        f"there must raise AttributeError (SPEC 13.2)")


@contextmanager
def _attribute_reads(fn):
    """An exception out of ``fn``'s own ``__getattr__`` or ``__getattribute__`` anywhere in the block
    (a declaration read again later, after the door read each once) is a SpecrefError naming it."""
    hooks = {getattr(getattr(type(fn), h, None), "__code__", None) for h in ("__getattr__", "__getattribute__")}
    hooks.discard(None)
    try:
        yield
    except SpecrefError:
        raise
    except Exception as e:
        tb, there = e.__traceback__, False
        while tb is not None:
            there = there or tb.tb_frame.f_code in hooks
            tb = tb.tb_next
        if not there:
            raise
        raise _unreadable("attribute read during the check", e) from None


def _holders(name: str) -> list[tuple[Option, list[str]]]:
    """Each distinct option called ``name`` among the registered levels, with the levels that take it."""
    found: dict[int, tuple[Option, list[str]]] = {}
    for lv in LEVELS.values():
        for opt in lv.options:
            if opt.name == name:
                found.setdefault(id(opt), (opt, []))[1].append(lv.name)
    return list(found.values())


def _not_an_option(spec: Level, names: list[str], values: dict | None = None) -> SpecrefError:
    """The error for keywords ``names`` (given ``values``) that ``spec`` does not take: each with its
    value, where each applies, and what ``spec`` takes."""
    where = []
    for name in names:
        for opt, levels in _holders(name):
            listed = " and ".join(levels) if len(levels) == 2 else ", ".join(levels)
            where.append(f"{opt.phrase or opt.name + ' applies'} at the {listed} level{'s' if len(levels) > 1 else ''}")
    said = f"{where[0]}, not {spec.name!r}" + (f" ({'; '.join(where[1:])})" if len(where) > 1 else "") if where else (
        f"unknown keyword(s) {names} at the {spec.name!r} level")
    got = ", ".join(f"{k}={short_repr(v, 60)}" for k, v in (values or {}).items())
    return SpecrefError(f"{said}{f' (got {got})' if got else ''}; the {spec.name} level takes the Settings fields "
                        f"{list(_SETTINGS)} and its own options {spec.option_names() or 'none'}")


# ---------------------------------------------------------------- the 0.2 shorthands: check(level, fn, **keywords)


def __getattr__(name: str):
    """The 0.2 shorthands (``check_step``, ``check_tree``, ...), kept for the 0.3 release: ``name`` is
    the ``shorthand`` of a registered level, and the function is ``check`` at that level."""
    for level in LEVELS.values():
        if level.shorthand == name:
            shorthand = _shorthand(level, name)
            globals()[name] = shorthand  # found here directly from now on
            return shorthand
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _shorthand(level: Level, name: str):
    """``check`` at ``level``, named ``name`` (the level's ``shorthand``)."""
    def shorthand(fn, **keywords) -> Report:
        return check(level.name, fn, **keywords)

    shorthand.__name__ = shorthand.__qualname__ = name
    shorthand.__doc__ = f"``check({level.name!r}, fn, **keywords)`` (0.2 name): ``{level.signature}``."
    return shorthand


# ---------------------------------------------------------------- plans: N, calls, an ETA and the case time limit

CASE_TIME_FLOOR = 300.0  # a case's time limit is never below this by default (exact mode: the default itself)
CASE_TIME_FACTOR = 3.0  # a planned case's default limit: this many ETAs (a few timed calls; load varies)
CASE_TIME_CAP = 24 * 3600.0  # ... and never more than a day per case
PLAN_CALLS = 3  # warm calls the default case time limit of a statistical check times per case
_MISBEHAVED = (RAISED, INVALID, TIMEOUT, ARITHMETIC, CRASHED, BUDGET, RNG_MISUSE, WRITES, INTERNAL)

EXACT_ONLY = tuple(name for name, lv in LEVELS.items() if not lv.statistical)
"""specref's levels without a statistical mode (coins in, exact out): ``Level.statistical`` is False (0.2 name)."""

STATISTICAL_ONLY = tuple(name for name, lv in LEVELS.items() if not lv.exact)
"""specref's levels without an exact mode (float logits, an engine's own generators): ``Level.exact`` is False."""


def _reference_of(level: str | Level, rules=None):
    """specref's own implementation at ``level`` (``Level.reference_for``; None where it has none; 0.2 name)."""
    return level_named(level).reference_for(rules)


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


def plan_rows(spec: Level, fn, cases, settings: Settings, *, calls: int, isolate: bool,
              at_most_the_checks: bool = False) -> list[PlanRow]:
    """A :class:`PlanRow` per case of ``spec`` (``fn`` declared, ``cases`` validated): N and the calls
    as the check makes them, and the first call and ``calls`` warm calls timed (in a forked worker
    per case with ``isolate``, under the per-call ``time_limit``); a misbehaviour is the row's note.
    ``at_most_the_checks``: no more warm calls than the check's own after its first (a check of one
    call per case times that one call: its ETA is exact, and timing three more would cost three
    checks -- the default case time limit of a statistical check plans this way)."""
    if settings.mode == "statistical" and not spec.statistical:
        raise SpecrefError(f"the {spec.name} level has no statistical mode (coins in, exact out): plan it with "
                           f"mode='exact', got mode='statistical'")
    if settings.mode == "exact" and not spec.exact:
        raise SpecrefError(f"the {spec.name} level is statistical only (no exact mode): plan it with "
                           f"mode='statistical', got mode='exact'")
    rows: list[PlanRow] = []
    hung = None  # under the default time rule the first time-out ends the plan, as it ends a check
    for i, case in enumerate(cases):
        if hung is not None:
            rows.append(PlanRow(case.name, None, None, None, None, note=f"not timed: the calls of case {hung!r} timed "
                                                                       f"out (time_limit=None: the first time-out ends "
                                                                       f"a plan, SPEC 13.2)"))
            continue
        rows.append(_plan_case(spec, fn, case, settings, settings.seed + i, calls, isolate, at_most_the_checks))
        if settings.time_limit is None and _timed_out(rows[-1]):
            hung = case.name
    return rows


def _note(status: str, detail: str) -> str:
    """A row's note on its timed calls' misbehaviour: cut to 80 characters, a time-out's whole (its
    limit and how it was derived are the check's answer when the plan ends it)."""
    return f"{status}: {detail if status == TIMEOUT else detail[:80]}"


def _timed_out(row: PlanRow) -> bool:
    """Whether a row's timed calls timed out (its note then begins with the status)."""
    return row.note.startswith(f"{TIMEOUT}: ")


def _per_call_bound(settings: Settings) -> float:
    """What a plan's guard allows per timed call: ``time_limit``, or under the derived rule the
    first call's limit times the margin (a generous bound: each call is held to its own limit)."""
    return settings.time_limit if settings.time_limit is not None else FIRST_CALL_LIMIT * CALL_MARGIN


def _plan_case(spec: Level, fn, case, settings: Settings, seed: int, calls: int, isolate: bool,
               at_most_the_checks: bool = False) -> PlanRow:
    """One case's row: the level's plan of N and its calls (:class:`CasePlan`), its calls timed in a
    guarded body; where the level does not plan the mode itself, the fallback (:func:`_fallback_row`)."""
    guard = partial(guarded, isolate=isolate, time_limit=settings.time_limit,
                    case_time_limit=(settings.case_time_limit or CASE_TIME_FLOOR) + (calls + 2) * _per_call_bound(settings))
    budget_s = settings.budget_s if settings.mode == "statistical" and not settings.samples else None
    budgeted = budget_s is not None
    planner = spec.exact_planner if settings.mode == "exact" else spec.planner
    if planner is None:
        return _fallback_row(spec, fn, case, settings, seed, calls, guard)
    try:
        planned = planner(spec, fn, case, settings, seed)
    except SpecrefError as e:
        return _fallback_row(spec, fn, case, settings, seed, calls, guard, why=f"N unknown until run: {e}"[:160])
    if budgeted:
        planned = CasePlan(None, None, 1, None, planned.timer, f"N chosen at run time from budget_s = {settings.budget_s} s")
    if planned.timer is None:
        return PlanRow(case.name, planned.outcomes, planned.n, None, None, note=planned.note, batch=planned.per_call,
                       calls=planned.calls)
    if at_most_the_checks and planned.calls is not None:
        calls = min(calls, max(planned.calls - 1, 0))
    status, value = guard(partial(_timed, planned.timer, calls))
    if status != "result":
        return PlanRow(case.name, planned.outcomes, planned.n, None, None, note=_note(status, value),
                       batch=planned.per_call, calls=planned.calls)
    first, warm = value
    eta = float(budget_s) if budget_s is not None else first + (planned.calls - 1) * warm
    return PlanRow(case.name, planned.outcomes, planned.n, warm, eta, note=planned.note, batch=planned.per_call,
                   calls=planned.calls, first_call_s=first)


def _timed(timer, calls: int) -> tuple[float, float]:
    """``(seconds of the first call, seconds per warm call)``: ``timer(calls)``'s call ``0``, then ``1..calls``
    (no warm call: the first call's seconds for both)."""
    call = timer(calls)
    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    if calls == 0:
        return first, first
    t0 = time.perf_counter()
    for i in range(1, calls + 1):
        call(i)
    return first, (time.perf_counter() - t0) / calls


# ---------------------------------------------------------------- the fallback: the level's own check, timed


def _fallback_row(spec: Level, fn, case, settings: Settings, seed: int, calls: int, guard, why: str = "") -> PlanRow:
    """A row for a level that does not plan this mode itself (every level's exact mode but the chain
    levels'; a level registered without a planner): N in exact mode is the calls the level's exact
    check makes of its reference (counted: an estimate for another implementation), in statistical
    mode unknown until run; the calls are timed as the first calls of the level's own check of the
    case (:func:`_pilot`)."""
    n, note, reference = None, why, None
    if settings.mode == "exact":
        reference = spec.reference_for(rules_of(fn))
        if reference is None:
            note = f"N unknown until run: specref has no reference at the {spec.name!r} level to count calls on"
    elif settings.budget_s is not None and not settings.samples:
        note = f"N chosen at run time from budget_s = {settings.budget_s} s"
    elif not note:
        note = (f"N unknown until run: plan does not know how the {spec.name!r} level plans N (a level without a "
                f"planner)")
    status, value = guard(partial(_level_timings, spec, fn, reference, case, replace(settings, seed=seed), calls))
    if status != "result":
        return PlanRow(case.name, None, None, None, None, note=_note(status, value))
    counted, counted_why, first, warm, bad = value
    if reference is not None:
        n = counted
        note = counted_why or "N: the calls of the reference's exact check (an estimate for another implementation)"
    if bad is not None:
        return PlanRow(case.name, None, n, None, None, note=bad + (f"; {note}" if note else ""), calls=n)
    if n is None:
        eta = float(settings.budget_s) if settings.budget_s is not None and settings.mode == "statistical" else None
    else:
        eta = first + (n - 1) * warm
    return PlanRow(case.name, None, n, warm, eta, note=note, calls=n, first_call_s=first)


def _level_timings(spec, fn, reference, case, settings, calls) -> tuple:
    """In the guarded body: ``(reference calls, why not, first s, warm s, the implementation's misbehaviour)``."""
    counted, why = (None, None) if reference is None else _counted(spec, reference, case, settings)
    first, warm, bad = _pilot(spec, fn, case, settings, calls)
    return counted, why, first, warm, bad


class _Timed:
    """``fn`` with each call's start timed; after ``stop`` calls it raises :class:`_Enough` (the
    level's own check then ends the case: the pilot has what it came for).  Attributes (a declared
    batch, rules, ties, ``specref_isolate``) are ``fn``'s."""

    def __init__(self, fn, stop: int):
        self.fn, self.stop = fn, stop
        self.starts: list[float] = []  # each call's start (time.perf_counter())
        self.first: float | None = None  # the first call's seconds, once it returned

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
    """Settings for the level's own runs inside a plan: here, one case, no state check, no bar."""
    return replace(settings, isolate=False, state_check=False, progress=False, executor=None, shard_store=None,
                   **more)


def _pilot(spec: Level, fn, case, settings: Settings, calls: int) -> tuple:
    """The level's own check of ``case`` (its first calls are the run's), stopped after the first
    call and ``calls + 1`` more: ``(first call s, warm s per call, None)`` -- warm: the mean time from
    the start of one call to the next (the level's work between calls included) -- or
    ``(None, None, "status: detail")`` when the implementation misbehaved first."""
    timed = _Timed(fn, calls + 2)
    limit = CASE_TIME_FLOOR + (calls + 2) * _per_call_bound(settings)
    result = spec.run(spec, timed, [case], _quiet(settings, case_time_limit=limit)).results[0]
    s = timed.starts
    warm: float | None
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


def _planned_case_time(spec: Level, fn, cases, settings: Settings) -> tuple:
    """``(case_time_limit, None)`` for ``check`` when it is None (``Settings``' docstring): the cap in
    exact mode (no ETA without running the enumeration); in statistical mode the largest of the
    cases' plan limits (:data:`PLAN_CALLS` warm calls timed per case in a forked worker), the cap
    where no worker can be forked.  ``(None, (i, note))`` when, under the default time rule, case
    ``i``'s timed calls timed out: the check ends there (:func:`_unanswered`)."""
    if settings.mode == "exact" or not can_isolate() or cuda_started():
        return CASE_TIME_CAP, None
    try:
        rows = plan_rows(spec, fn, cases, settings, calls=PLAN_CALLS, isolate=True, at_most_the_checks=True)
    except Exception:  # noqa: BLE001 - a malformed case: the level's validation names it when the check runs
        return CASE_TIME_FLOOR, None
    for i, row in enumerate(rows):
        if settings.time_limit is None and _timed_out(row):
            return None, (i, row.note)
    return max(row.case_time_limit for row in rows), None


def _unanswered(spec: Level, fn, cases, settings: Settings, i: int, note: str) -> Report:
    """The report of a check that ended in its plan (SPEC §13.2): case ``i``'s calls, timed before any
    case ran, timed out; no other case is run."""
    for case in cases:  # a malformed case is still a usage error
        if spec.validate is not None:
            spec.validate(spec, case, settings)
    where = f"case {cases[i].name!r}"
    detail = f"its first calls, timed to plan the check before any case ran: {note.partition(': ')[2]}"
    report = Report(level=spec.name, mode=settings.mode,
                    results=[CaseResult(c, TIMEOUT, detail=detail) if j == i else not_run(c, where)
                             for j, c in enumerate(cases)])
    rules = rules_of(fn)
    return report if rules is None else RulesReport.of(report, rules)
