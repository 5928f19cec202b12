"""Friendlier statistical runs: a plan with N and an ETA per case, and results kept case by case (SPEC §6, §15).

- :func:`plan` prints, before a long run, the N that
  :func:`specref.verification.statistics.counts.planned_n` plans for each case (TV >=
  ``detect_tv`` with power :data:`~specref.verification.statistics.counts.PLAN_POWER` at ``alpha``) and an ETA measured from a few calls of
  the implementation on that case: the first call timed apart (imports, compilation and caches
  warm up there), then ``calls`` warm calls, each of the implementation's declared batch
  (:func:`~specref.verification.levels.chain.programs.declare_batch`: ``B`` samples per call, at most one
  block), so ``ETA = first call + (calls the run makes - 1) x warm call``: about ``N / B`` warm
  calls.  ``mode="exact"`` plans an exact check instead: its calls are the paths of the
  reference's enumeration of the case (those of an implementation that draws as the reference
  does), each a call of one sample.
- :func:`run_each` runs the check one case at a time and hands every verdict to
  ``on_case(index, result)`` and/or appends it as one JSON line to ``json_lines``, so a
  long run that is stopped keeps what it finished, and a second run on the same file resumes:
  the cases it holds are not run again.  Case ``i`` uses seed ``settings.seed + i``, as in one
  :func:`~specref.verification.oracle.check` over all cases, so the verdicts are the same.
  Unless a ``case_time_limit`` is given, each case's is its plan's
  (:attr:`PlanRow.case_time_limit`: :data:`CASE_TIME_FACTOR` x its ETA, at least
  :data:`~specref.verification.oracle.CASE_TIME_FLOOR`, at most :data:`CASE_TIME_CAP`).

Every registered level plans (SPEC §15), from its own object
(:class:`~specref.verification.running.level.Level`): its ``planner`` gives a statistical case's
N, the samples per call and the calls (:class:`~specref.verification.running.level.CasePlan`) --
the chain, tree and greedy levels' :func:`~specref.verification.statistics.counts.planned_n` over
the case's target law, the batched levels' (batched, draft-and-verify, vllm, flashinfer, mrv2)
largest N over their statistics, in calls of as many copies of the case's rows as the check hands
over at once (``batch``) -- and a timer that makes the check's own calls of the implementation
(its :class:`~specref.verification.statistics.shards.Sampler`), so planning never runs a check.
Exact N at the chain levels (their ``exact_planner``) is the reference's enumerated paths.  Where a
level does not plan a mode itself -- exact mode at every other level, a level registered without a
planner -- the fallback counts the calls the level's exact check makes of its ``reference`` (an
estimate for an implementation that draws otherwise) and times the first calls of the level's own
check of the case (warm seconds per call: the mean time from the start of one call to the next,
the level's work in between included).  A level without a statistical mode (the coin levels) is a
SpecrefError in that mode; where N cannot be known before the run (no reference, a ``budget_s``,
no planner), the row says so and has no ETA (a ``budget_s`` row's ETA is the budget).  The core is
:func:`specref.verification.oracle.plan_rows`; the check's default ``case_time_limit`` comes from
the same rows.

Seeds: in statistical mode the implementation gets an int in ``[0, 2**63)`` per call.
``numpy.random.default_rng`` and ``torch.manual_seed`` take it as it is; NumPy's legacy
``RandomState`` needs ``seed % 2**32``; code that draws from torch's global generator
is wrapped by :func:`specref.adapters.hf_models.torch_seeded`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields, replace
from fractions import Fraction
from pathlib import Path

from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int
from specref.verification.cases.rules import RulesReport, rules_of
from specref.verification.levels import level_named
from specref.verification.levels.runner import not_run
from specref.verification.oracle import CASE_TIME_CAP, CASE_TIME_FACTOR, PlanRow, plan_rows
from specref.verification.running.report import TIMEOUT, CaseResult, Report, Settings
from specref.verification.statistics.counts import PLAN_POWER

__all__ = ["PlanRow", "plan", "run_each", "CASE_TIME_CAP", "CASE_TIME_FACTOR"]

_SETTINGS = {f.name for f in fields(Settings)}
MAX_PLAN_CALLS = 10_000  # warm calls a plan times per case: a few are enough for an ETA


def plan(level, fn, cases=None, *, settings: Settings | None = None, calls: int = 5, file=None,
         quiet: bool = False, **keywords) -> list[PlanRow]:
    """Print (to ``file``, default stdout; nothing when ``quiet``) and return N per case and an ETA:
    the first call and ``calls`` warm calls of the implementation timed on each case (module docstring).

    Any registered level (:data:`~specref.verification.levels.LEVELS`, by name, or a
    :class:`~specref.verification.running.level.Level`) in either mode; ``mode="statistical"`` at
    an exact-only level (coins in, exact out) is a SpecrefError naming both.  ``keywords`` are
    :func:`~specref.verification.oracle.check`'s: ``Settings`` fields (``mode`` is
    ``"statistical"`` unless given) and the level's own options (``batch``, ``rules``, ...).  The
    cases are validated as the check validates them.  The timed calls are the first calls of an
    implementation nobody has checked yet: they run in a forked worker per case (``isolate=False``
    runs them here), under ``time_limit`` per call, and a misbehaviour is the case's note, never an
    exception."""
    from specref.verification.oracle import _configured, _prepared  # the oracle's validation of keywords

    spec = level_named(level, need="plan needs a registered level")
    if not callable(fn):
        raise SpecrefTypeError(f"fn (the implementation to plan for) must be callable, got {fn!r:.80}")
    calls = check_positive_int("calls", calls)
    if calls > MAX_PLAN_CALLS:
        raise SpecrefError(f"calls (warm calls timed per case) must be at most {MAX_PLAN_CALLS:,}, got {calls!r:.80}")
    if not isinstance(quiet, bool):
        raise SpecrefTypeError(f"quiet must be True or False, got {quiet!r:.80}")
    if file is not None and not callable(getattr(file, "write", None)):
        raise SpecrefTypeError(f"file must be a text stream with write (or None: stdout), got {file!r:.80}")
    spec, settings = _configured(spec, settings, {"mode": "statistical", **keywords})
    fn, cases = _prepared(spec, fn, cases)
    if not cases:
        raise SpecrefError("cases is empty: there is nothing to plan")
    if spec.validate is not None:
        for case in cases:
            spec.validate(spec, case, settings)
    rows = plan_rows(spec, fn, cases, settings, calls=calls, isolate=True if settings.isolate is None else settings.isolate)
    if not quiet:
        print(_table(rows, settings), file=file or sys.stdout)
    return rows


def _table(rows, settings):
    what = ("exact mode: N is the implementation calls of the exact check (the reference's, counted)"
            if settings.mode == "exact" else f"detect TV >= {settings.detect_tv} with power {PLAN_POWER} at alpha = {settings.alpha}")
    lines = [f"plan: {what}",
             f"{'case':<24} {'outcomes':>8} {'N':>10} {'batch':>6} {'calls':>9} {'first s':>8} {'ms/call':>9} "
             f"{'ETA':>9} {'limit':>9}  note"]
    for r in rows:
        ms = "-" if r.seconds_per_call is None else f"{1e3 * r.seconds_per_call:.3g}"
        first = "-" if r.first_call_s is None else f"{r.first_call_s:.3g}"
        eta = "-" if r.eta_s is None else _duration(r.eta_s)
        calls = "-" if r.calls is None else f"{r.calls:,}"
        n = "-" if r.n is None else f"{r.n:,}"
        outcomes = "-" if r.outcomes is None else r.outcomes
        lines.append(f"{r.case:<24} {outcomes:>8} {n:>10} {r.batch:>6} {calls:>9} {first:>8} {ms:>9} "
                     f"{eta:>9} {_duration(r.case_time_limit):>9}  {r.note}")
    total = sum(r.eta_s for r in rows if r.eta_s is not None)
    unit = "calls" if settings.mode == "exact" else "samples"
    unknown = sum(r.eta_s is None for r in rows)
    lines.append(f"total ETA {_duration(total)} for {sum(r.n or 0 for r in rows):,} {unit}"
                 + (f" ({unknown} case(s) without an ETA: see their notes)" if unknown else ""))
    return "\n".join(lines)


def _duration(s):
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


# ---------------------------------------------------------------- case by case


def run_each(level, fn, cases=None, *, settings: Settings | None = None, on_case=None, json_lines=None,
             **keywords) -> Report:
    """The check, one case at a time: ``on_case(i, result)`` and/or one JSON line per verdict in ``json_lines``.

    A ``json_lines`` file that exists is resumed: its cases (by index, checked against the case's
    name, the level, the mode and the seed) are not run again, nor handed to ``on_case``, and keep
    their recorded verdicts in the report; a last line cut short is dropped and its case runs
    again.  A long statistical campaign runs an implementation with its own randomness: its cases
    are isolated (forked workers) unless ``isolate`` is set, at every level.  Without a
    ``case_time_limit`` (None, the default), each case gets its own plan's
    (:attr:`PlanRow.case_time_limit`), at every level.  Under the default time rule (``time_limit``
    None) the first time-out ends the run: the later cases are ``not run`` and not written, so a run
    on the same file runs them (SPEC §15).  ``keywords`` are :func:`~specref.verification.oracle.check`'s."""
    from specref.verification.oracle import _configured, _prepared, check  # check: looked up at each call

    options = {k: v for k, v in keywords.items() if k not in _SETTINGS}
    spec, settings = _configured(level_named(level), settings, keywords)
    if settings.isolate is None and settings.mode == "statistical":
        settings = replace(settings, isolate=True)
    declared, cases = _prepared(spec, fn, cases)
    level = spec.name
    if not cases:
        raise SpecrefError("cases is empty: a check on no case proves nothing")
    done = {} if json_lines is None else _finished(json_lines, cases, level, settings)
    limits, hung = _planned_limits(spec, fn, cases, [i for i in range(len(cases)) if i not in done], settings, options)
    results, head, ended = [], None, None
    for i, case in enumerate(cases):
        if i in done:
            results.append(done[i])
            continue
        if ended is not None:  # not written: a run on the same file runs it
            results.append(not_run(case, ended))
            continue
        report = (Report(level=level, mode=settings.mode, results=[
            CaseResult(case, TIMEOUT, detail=f"its first calls, timed to plan the case: {hung[i].partition(': ')[2]}")])
            if i in hung else check(spec, fn, cases=[case], settings=replace(settings, seed=settings.seed + i,
                                                                                case_time_limit=limits[i])))
        head = head or report
        results.append(report.results[0])
        if settings.time_limit is None and results[-1].status == TIMEOUT:  # the first time-out ends the run
            ended = f"case {case.name!r}"
        if on_case is not None:
            on_case(i, results[-1])
        if json_lines is not None:
            line = {"index": i, "level": level, "mode": settings.mode, "seed": settings.seed + i,
                    **report.to_json()["results"][0]}
            with open(json_lines, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")
    if head is None:  # every case was in the file
        head = Report(level=level, mode=settings.mode)
        head = head if rules_of(declared) is None else RulesReport.of(head, rules_of(declared))
    head.results = results
    return head


def _planned_limits(spec, fn, cases, todo, settings: Settings, options) -> tuple[list, dict]:
    """Each case's ``case_time_limit`` (the given one, or its plan's), and ``{i: note}`` of the first
    case in ``todo`` whose planned calls timed out under the default time rule (the run ends there)."""
    from specref.verification.oracle import _timed_out

    limits: list = [settings.case_time_limit] * len(cases)
    hung: dict[int, str] = {}
    if todo and settings.case_time_limit is None:
        planned = plan(spec, fn, [cases[i] for i in todo], settings=settings, quiet=True, mode=settings.mode, **options)
        for i, row in zip(todo, planned):
            limits[i] = row.case_time_limit
            if settings.time_limit is None and _timed_out(row) and not hung:
                hung[i] = row.note
    return limits, hung


def _finished(path, cases, level: str, settings: Settings) -> dict:
    """``{index: CaseResult}`` of the verdicts already in the JSON lines file ``path`` (none when it
    does not exist).  A line of another run (case name, level, mode or seed) is a SpecrefError; a
    last line cut short (no newline) is removed from the file."""
    path = Path(path)
    if not path.exists():
        return {}
    text = path.read_text()
    *complete, tail = text.split("\n")
    if tail:  # interrupted while writing: that case runs again
        path.write_text("".join(line + "\n" for line in complete))
    done: dict = {}
    for k, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            i, name = d["index"], d["case"]["name"]
        except (ValueError, KeyError, TypeError):
            raise SpecrefError(f"{path}, line {k}, is not a verdict run_each wrote: {line[:80]!r}") from None
        if not (isinstance(i, int) and 0 <= i < len(cases)) or name != cases[i].name:
            raise SpecrefError(f"{path}, line {k}: case {i!r} ({name!r}) is not case {i!r} of these {len(cases)} cases")
        theirs = (d.get("level", level), d.get("mode", settings.mode), d.get("seed", settings.seed + i))
        if theirs != (level, settings.mode, settings.seed + i):
            raise SpecrefError(f"{path}, line {k}: written by another run (level, mode, seed {theirs}, not "
                               f"{(level, settings.mode, settings.seed + i)}): use another file")
        done.setdefault(i, _result_of(cases[i], d))
    return done


def _result_of(case, d: dict) -> CaseResult:
    """A verdict read back from its JSON line (``Report.to_json``'s numbers: Fractions as strings)."""
    def number(v):
        return None if v is None else (Fraction(v) if isinstance(v, str) else v)

    interval = d.get("tv_interval")
    return CaseResult(case, d["status"], tv=number(d.get("tv")), detail=d.get("detail", ""),
                      n_samples=d.get("n_samples"), p_value=d.get("p_value"),
                      tv_interval=None if interval is None else tuple(number(v) for v in interval),
                      detectable_tv=d.get("detectable_tv"))
