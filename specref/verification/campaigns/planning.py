"""Friendlier statistical runs: a plan with N and an ETA per case, and results kept case by case (SPEC §6).

- :func:`plan` prints, before a long run, the N that
  :func:`specref.verification.statistics.counts.samples_needed` plans for each case (TV >=
  ``detect_tv`` with power 0.9 at ``alpha``) and an ETA measured from a few calls of
  the implementation on that case.
- :func:`run_each` runs the check one case at a time and hands every verdict to
  ``on_case(index, result)`` and/or appends it as one JSON line to ``json_lines``, so a
  long run that is stopped keeps what it finished.  Case ``i`` uses seed
  ``settings.seed + i``, as in one :func:`~specref.verification.oracle.check` over all
  cases, so the verdicts are the same.

Seeds: in statistical mode the implementation gets an int in ``[0, 2**63)`` per call.
``numpy.random.default_rng`` and ``torch.manual_seed`` take it as it is; NumPy's legacy
``RandomState`` needs ``seed % 2**32``; code that draws from torch's global generator
is wrapped by :func:`specref.adapters.hf_models.torch_seeded`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int
from specref.verification.cases.chain import Case
from specref.verification.running.calling import guarded
from specref.verification.levels import LEVELS
from specref.verification.running.report import Report, Settings
from specref.verification.statistics.counts import samples_needed

__all__ = ["PlanRow", "plan", "run_each"]


@dataclass(frozen=True)
class PlanRow:
    """One case of a plan."""

    case: str
    outcomes: int  # outputs with positive target probability
    n: int  # planned (or given) samples
    seconds_per_call: float | None  # measured; None when the implementation misbehaved
    eta_s: float | None  # n * seconds_per_call
    note: str = ""


def _settings(settings, fields_):
    return replace(settings or Settings(), mode="statistical", **fields_)


def plan(level: str, fn, cases=None, *, settings: Settings | None = None, calls: int = 5, file=None,
         quiet: bool = False, **fields_) -> list[PlanRow]:
    """Print (to ``file``, default stdout; nothing when ``quiet``) and return N per case and an ETA
    from ``calls`` timed calls of the implementation on each case.

    The timed calls are the first calls of an implementation nobody has checked yet: they run in a
    forked worker per case (``isolate=False`` runs them here), under ``time_limit`` per call and
    ``case_time_limit`` per case, and a misbehaviour is the case's note, never an exception."""
    if not isinstance(level, str) or level not in LEVELS or LEVELS[level].program is None:
        raise SpecrefError(f"plan needs a level run by programs (step, logits, decoder), got {level!r}")
    if not callable(fn):
        raise SpecrefTypeError(f"fn (the implementation to plan for) must be callable, got {fn!r:.80}")
    calls = check_positive_int("calls", calls)
    settings = _settings(settings, fields_)
    spec = LEVELS[level]
    try:
        cases = spec.cases() if cases is None else list(cases)
    except TypeError:
        raise SpecrefTypeError(f"cases must be an iterable of Case objects, got {cases!r:.80}") from None
    if not cases:
        raise SpecrefError("cases is empty: there is nothing to plan")
    for case in cases:
        if not isinstance(case, Case):
            raise SpecrefError(f"plan's cases must be specref.verification.cases.chain.Case objects, got {case!r:.120}")
        case.models()  # validates the tables
    isolate = True if settings.isolate is None else settings.isolate
    rows = []
    for i, case in enumerate(cases):
        program, expected = spec.program(fn, case.as_float(), settings.time_limit)
        null = np.array([float(w) for w in expected.values()] + [0.0])
        n = settings.samples or samples_needed(settings.detect_tv, settings.alpha, 0.9, len(null), null=null)
        status, value = guarded(partial(_timed_calls, program, settings.seed + i, calls), isolate=isolate,
                                time_limit=settings.time_limit, case_time_limit=settings.case_time_limit)
        if status == "result":
            rows.append(PlanRow(case.name, len(expected), n, value, n * value))
        else:
            rows.append(PlanRow(case.name, len(expected), n, None, None, note=f"{status}: {value[:80]}"))
    if not quiet:
        print(_table(rows, settings), file=file or sys.stdout)
    return rows


def _timed_calls(program, seed, calls) -> float:
    """Seconds per call of ``calls`` runs of the case's program (each one call of the implementation)."""
    gen = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(calls):
        program(gen, int(gen.integers(2 ** 63)))
    return (time.perf_counter() - t0) / calls


def _table(rows, settings):
    lines = [f"plan: detect TV >= {settings.detect_tv} with power 0.9 at alpha = {settings.alpha}",
             f"{'case':<24} {'outcomes':>8} {'N':>10} {'ms/call':>9} {'ETA':>9}  note"]
    for r in rows:
        ms = "-" if r.seconds_per_call is None else f"{1e3 * r.seconds_per_call:.3g}"
        eta = "-" if r.eta_s is None else _duration(r.eta_s)
        lines.append(f"{r.case:<24} {r.outcomes:>8} {r.n:>10,} {ms:>9} {eta:>9}  {r.note}")
    total = sum(r.eta_s for r in rows if r.eta_s is not None)
    lines.append(f"total ETA {_duration(total)} for {sum(r.n for r in rows):,} samples")
    return "\n".join(lines)


def _duration(s):
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def run_each(level: str, fn, cases=None, *, settings: Settings | None = None, on_case=None, json_lines=None,
             rules=None, **fields_) -> Report:
    """The check, one case at a time: ``on_case(i, result)`` and/or one JSON line per verdict in ``json_lines``.

    A long statistical campaign runs an implementation with its own randomness: its cases are
    isolated (forked workers) unless ``isolate`` is set, at every level."""
    from specref.verification.oracle import check  # the oracle registers the levels; imported where used

    settings = replace(settings or Settings(), **fields_)
    if settings.isolate is None and settings.mode == "statistical":
        settings = replace(settings, isolate=True)
    spec = LEVELS.get(level)
    cases = (spec.cases() if spec else []) if cases is None else list(cases)
    if not cases:
        raise SpecrefError("cases is empty: a check on no case proves nothing")
    merged = None
    for i, case in enumerate(cases):
        report = check(level, fn, cases=[case], settings=replace(settings, seed=settings.seed + i), rules=rules)
        result = report.results[0]
        if merged is None:
            merged = report
        else:
            merged.results.append(result)
        if on_case is not None:
            on_case(i, result)
        if json_lines is not None:
            with open(json_lines, "a") as f:
                f.write(json.dumps({"index": i, **report.to_json()["results"][0]}, default=str) + "\n")
    return merged
