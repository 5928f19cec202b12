"""What a check reports: the settings it ran under, a verdict per case, and the report.

Plain data shared by every oracle level (:mod:`specref.verification.oracle`).

Statuses (SPEC §13.3): ``ok`` and ``differs`` judge the law; the others name a misbehaviour.
``stateful``: the case was judged twice (the state check, ``Settings.state_check``: by default
in exact mode) after different cases, and its verdict or its exact law changed -- the
implementation keeps something (scratch, a cache, an rng) from one call to the next that changes
what it returns; the detail names the two runs.  Not ok: a misbehaviour, the CLI exits 3 (SPEC §13.3).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

from specref.core.errors import SpecrefError, check_positive_int

__all__ = ["Settings", "CaseResult", "Report", "law_verdict", "OK", "DIFFERS", "RAISED", "INVALID", "TIMEOUT", "ARITHMETIC",
           "CRASHED", "BUDGET", "RNG_MISUSE", "WRITES", "STATEFUL", "INTERNAL", "NOT_RUN", "MAX_TOLERANCE",
           "TABLE_DETAIL", "BOUNDARY", "NOT_PIECEWISE", "NOT_RACE", "NOT_REPLAYED", "WORKER_FAILED", "EMITS_INVALID", "OUTCOMES", "EXIT_STATUS", "outcome_of", "EXIT_PRESERVES",
           "EXIT_ERROR"]

OK, DIFFERS, RAISED, INVALID, TIMEOUT, ARITHMETIC = (
    "ok", "differs", "raised", "invalid output", "timeout", "lazy-uniform arithmetic",
)
CRASHED = "crashed"  # an isolated worker died: os._exit, a segfault, a signal
BUDGET = "over budget"  # exact mode: the enumeration ran over max_paths
RNG_MISUSE = "bad rng use"  # exact mode: randomness not drawn from the rng handed over (not replayable)
WRITES = "writes into its inputs"  # a write into a read-only input (the batched and tree levels hand read-only rows)
# The verdict or exact law of a case depends on what the implementation was called with before: the state
# check (Settings.state_check) ran the case again after another case and got another law, or another verdict.
STATEFUL = "stateful"
INTERNAL = "internal error"  # the oracle's own failure (never the implementation's): the CLI exits 2
# Under the default time rule (time_limit=None) the first time-out ends a check: the cases after it are not run.
NOT_RUN = "not run"
# Coin-fed levels (SPEC §11.9, §11.11): a deviation made by single coin grid points; no coin law; no race.
BOUNDARY = "boundary"
NOT_PIECEWISE = "not piecewise constant"
NOT_RACE = "not an exponential race"
NOT_REPLAYED = "not replayed"  # vllm level, route="coins": an output that is not the reference on the coins the engine drew
WORKER_FAILED = "worker failed"  # statistical mode: the process that ran a shard died or could not be reached
# Batched levels (SPEC §11.7): an emitted id no engine may emit -- the placeholder before a real token, an id
# outside 0..V-1, or an accepted placeholder draft (a padded position taken as a draft).
EMITS_INVALID = "emits an invalid id"
EXIT_PRESERVES, EXIT_ERROR = 0, 2  # every case ok; a usage error, an import failure or an internal error
#: What a run's statuses say together (SPEC §13.3): the first outcome some case falls in names the run
#: (the report's first line) and gives the CLI's exit status.  ``ok`` everywhere: "preserves", exit 0;
#: an ``internal error`` anywhere: exit 2.  A status no level here makes (a user's level) misbehaves.
OUTCOMES = (
    ("differs", (DIFFERS,), 1),
    ("misbehaves", (RAISED, INVALID, EMITS_INVALID, CRASHED, ARITHMETIC, RNG_MISUSE, WRITES, STATEFUL), 3),
    ("boundary", (BOUNDARY,), 4),
    ("could not be judged", (BUDGET, NOT_PIECEWISE, NOT_RACE, NOT_REPLAYED, WORKER_FAILED), 5),
    ("timed out", (TIMEOUT, NOT_RUN), 6),
)
#: The CLI's exit status of each outcome (SPEC §13.3).
EXIT_STATUS = {"preserves": EXIT_PRESERVES, "internal error": EXIT_ERROR, **{n: code for n, _, code in OUTCOMES}}


def outcome_of(statuses) -> str:
    """What a run's statuses say together (SPEC §13.3): ``"preserves"`` when every one is ok (and there
    is one), ``"internal error"`` when the oracle failed on a case, else the first name of
    :data:`OUTCOMES` some status falls in (``"misbehaves"`` for a status no level here makes).

    >>> outcome_of(["ok", "boundary", "timeout"]), outcome_of(["boundary", "raised"]), outcome_of(["ok"])
    ('boundary', 'misbehaves', 'preserves')
    """
    found = set(statuses)
    if found and found <= {OK}:
        return "preserves"
    if INTERNAL in found or not found:
        return "internal error"
    for name, members, _ in OUTCOMES:
        if found & set(members):
            return name
    return "misbehaves"


MAX_TOLERANCE = 1e-3  # exact mode: a larger tolerance could let a wrong implementation pass
TABLE_DETAIL = 300  # characters of a detail shown in a report's table (to_json keeps it whole)


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """How a check runs; every field is validated here, once.

    ``isolate``: ``True`` runs each case in a forked worker that the oracle watches from outside
    (a hard deadline, SIGKILL): an implementation that exits, crashes, ignores signals, swallows
    the time-out or hangs in C code gets a status (``crashed``, ``timeout``) and the check goes
    on.  ``False`` runs the case in this process -- no fork (about 20 ms less per case), and the
    implementation's own side effects (counters, records) stay visible -- but it cannot survive
    ``os._exit``, a segfault or an abort (they end the whole process), and its time limit is a
    SIGALRM on the main thread, which an implementation that blocks or resets the signal,
    catches the time-out in a retry loop, or hangs inside C code, defeats.  Measured at the step
    level (``worked-example-rows``, statistical, N = 20,000, the reference with its own seeded
    generator, median of 3 on a shared 2-core machine): 3.7 and 4.7 s isolated against 4.2 and
    4.7 s in-process in two rounds -- no difference above the noise; at N = 32 (median of 15),
    30 ms against 10 ms: the fork costs about 20 ms per case.  ``None`` (the default): isolated
    in both modes at every level (SPEC §13.2), unless the implementation declares
    ``specref_isolate = False`` (``HFGenerate`` does: its records of target calls are read here) or
    this process has started CUDA (a forked worker could not use it); a statistical check on an
    executor runs its shards in the executor's processes.  The CLI, sweeps and
    :func:`~specref.verification.campaigns.planning.plan` isolate unless told otherwise.

    ``state_check``: ``True`` judges every case that passed once more, in a second, seeded
    order in which each case comes after another case than in the first (after a case of the
    same shapes where there is one), and reports ``stateful`` where the verdict or the exact law
    changed (:func:`~specref.verification.levels.runner.run_cases`).  ``None`` (the default): in
    exact mode, the cases with a partner of their shapes and one case of a lone shape (none when
    one case passed); off in statistical mode.  Not with a ``shard_store`` or an ``executor``.

    ``time_limit``: seconds per call of the implementation (its output's conversion included).
    ``None`` (the default) derives each call's limit from the calls measured in the case in progress
    (SPEC §13.2, :func:`~specref.verification.running.calling.derived_time_limit`): 45 s until a
    call has returned, then 4 x the slowest call so far, at least 10 s; and the first time-out
    ends the check (the later cases are ``not run``), so a never-returning implementation is
    answered within a minute.  A number holds every call to it, and every case runs.

    ``case_time_limit``: seconds per case, every call and the enumeration or sampling (each call
    is also held to its per-call limit).  ``None`` (the default) means "from the plan" (SPEC §13.2):
    :func:`~specref.verification.oracle.check` sets it before any case runs -- in exact mode to
    :data:`~specref.verification.oracle.CASE_TIME_CAP` (24 h: an exact check counts its calls only
    by running them, so there is no ETA to scale a limit from, and a fixed 300 s stopped correct
    implementations of 9 s a call; hangs are the per-call limit's); in statistical mode to the
    largest of its cases' plan limits, each ``CASE_TIME_FACTOR`` (3) x the case's ETA (its planned
    N, and its first and a few warm calls timed in a forked worker), at least
    :data:`~specref.verification.oracle.CASE_TIME_FLOOR` (300 s) and at most the cap; the cap where
    no worker can be forked to time them.  A number is used as it is.
    """

    mode: str = "exact"  # "exact" (enumerate the rng) or "statistical" (rng is an int seed)
    samples: int | None = None  # statistical mode: N per case (None: planned for detect_tv)
    seed: int = 0  # statistical mode: case i uses seed + i
    alpha: float = 1e-6  # statistical mode: the G-test's level
    detect_tv: float = 0.01  # statistical mode: the TV that N is planned to detect with power 0.9
    tolerance: float = 1e-9  # exact mode: TV above this differs
    time_limit: float | None = None  # seconds per call of the implementation; None: derived from the calls measured
    isolate: bool | None = None  # each case in a forked worker with a hard deadline; None: isolated unless declared
    case_time_limit: float | None = None  # seconds per case (every call and the sampling or enumeration); None: from the plan
    max_paths: int = 10**6  # exact mode: enumerated paths per case (the target law's prefixes too)
    executor: object = field(default=None, compare=False)  # statistical mode: a concurrent.futures.Executor for the shards
    shard_blocks: int = 4  # statistical mode: blocks of 1024 samples per shard (the verdict does not depend on it)
    progress: bool = True  # statistical mode: a progress bar on a terminal for runs over 2 s
    shard_store: object = field(default=None, compare=False)  # statistical mode: a dict keeping finished shards (sweeps resume from it)
    budget_s: float | None = None  # statistical mode: seconds per case; N is chosen from a timed pilot (samples= wins)
    state_check: bool | None = None  # each ok case run again after another case (None: in exact mode only)

    def __post_init__(self):
        if not isinstance(self.mode, str) or self.mode not in ("exact", "statistical"):
            raise SpecrefError(f"mode must be 'exact' or 'statistical', got {self.mode!r}")
        if self.samples is not None:
            check_positive_int("samples", self.samples)
        check_positive_int("seed", self.seed, minimum=0)
        if self.seed >= 2**63:
            raise SpecrefError(f"seed must be below 2**63, got {self.seed!r}")
        for name, upper in (("alpha", 1), ("detect_tv", 1), ("tolerance", MAX_TOLERANCE)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < upper:
                raise SpecrefError(f"{name} must be a number in (0, {upper}), got {value!r}")
        for name in ("time_limit", "case_time_limit"):
            t = getattr(self, name)
            if t is None:
                continue  # derived from measured calls, or from the plan (the docstring)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < _seconds(t) < math.inf:
                raise SpecrefError(f"{name} must be a positive finite number of seconds, got {t!r:.80}")
        if self.isolate is not None and not isinstance(self.isolate, bool):
            raise SpecrefError(f"isolate must be True, False or None (isolated in statistical mode), got {self.isolate!r}")
        check_positive_int("max_paths", self.max_paths)
        if self.executor is not None and not callable(getattr(self.executor, "submit", None)):
            raise SpecrefError(f"executor must be a concurrent.futures.Executor (with submit), got {self.executor!r}")
        _refuse_dask_threads(self.executor)
        check_positive_int("shard_blocks", self.shard_blocks)
        if not isinstance(self.progress, bool):
            raise SpecrefError(f"progress must be True or False, got {self.progress!r}")
        b = self.budget_s
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf):
            raise SpecrefError(f"budget_s must be a positive finite number of seconds or None, got {b!r}")
        self._check_state_check()

    def _check_state_check(self):
        """``state_check``: True, False or None; not with a shard store or an executor (statistical mode)."""
        s = self.state_check
        if s is not None and not isinstance(s, bool):
            raise SpecrefError(f"state_check must be True, False or None (on in exact mode), got {s!r}")
        if s and self.mode == "statistical" and self.shard_store is not None:
            raise SpecrefError(f"state_check=True cannot run with a shard_store (the second run would read the "
                               f"first run's stored shards), got shard_store={self.shard_store!r:.80}")
        if s and self.mode == "statistical" and self.executor is not None:
            raise SpecrefError(f"state_check=True cannot run on an executor (the order of the calls in its "
                               f"processes is not the oracle's), got executor={self.executor!r:.80}")

    @property
    def checks_state(self) -> bool:
        """Whether the runner runs the state check: ``state_check``, by default in exact mode."""
        return self.mode == "exact" if self.state_check is None else self.state_check


def _seconds(t) -> float:
    """``t`` as a float of seconds; an int beyond floats (10**400) is no finite number of seconds."""
    try:
        return float(t)
    except OverflowError:
        return math.inf


def _refuse_dask_threads(executor) -> None:
    """SpecrefError for a Dask ``Client`` or the executor of its own ``get_executor()`` (SPEC §6.4):
    their shards would run on Dask's worker threads, where every call's time limit needs a
    watchdog thread (the scaling guide's measured row: 2.07x a process pool's time), and a
    ``Client``'s futures are not ``concurrent.futures``' ones.  ``dask_executor`` (adapters)
    runs each shard on a main thread; with ``main_thread=False`` it hands its own wrapper."""
    module = type(executor).__module__ or ""
    if executor is None or module.partition(".")[0] != "distributed":
        return
    raise SpecrefError(f"executor is a Dask {type(executor).__name__} ({module}), whose shards would run on Dask's "
                       f"worker threads, where every call's time limit needs a watchdog thread (2.07x the time of a "
                       f"process pool, docs/guide/scaling.md): use specref.adapters.cluster.dask_executor("
                       f"client=client), or dask_executor('tcp://host:8786'), which runs each shard on a main thread")


# ---------------------------------------------------------------- results


@dataclass
class CaseResult:
    """The verdict on one case."""

    case: object  # the Case (or a level's own case type) the verdict is about
    status: str  # ok / differs / raised / invalid output / timeout / lazy-uniform arithmetic
    tv: float | Fraction | None = None  # exact TV, or the plug-in estimate in statistical mode
    detail: str = ""  # the error, or the outputs that differ most
    n_samples: int | None = None  # statistical mode: N
    p_value: float | None = None  # statistical mode: the G-test's p-value
    tv_interval: tuple | None = None  # statistical mode: confidence interval of the TV
    detectable_tv: float | None = None  # statistical mode: the TV this N detects with power 0.9
    seconds_per_sample: dict | None = None  # statistical mode: {"implementation": s, "oracle": s}; measured, so not in to_json
    law: dict | None = field(default=None, repr=False, compare=False)  # exact mode: the law got, until the state check

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class Report:
    """What a check found: the verdict, the worst TV, a counterexample and a table per case."""

    level: str
    mode: str
    results: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def worst_tv(self):
        tvs = [r.tv for r in self.results if r.tv is not None]
        return max(tvs) if tvs else None

    @property
    def counterexample(self):
        """The failing case with the largest TV (errors first), or None when all pass; a case ``not run``
        is none (it was not judged)."""
        bad = [r for r in self.results if not r.ok and r.status != NOT_RUN]
        if not bad:
            return None
        return max(bad, key=lambda r: (r.tv is None, r.tv or 0)).case

    def table(self) -> str:
        lines = [f"{'case':<24} {'status':<24} {'TV':>12}  detail"]
        for r in self.results:
            tv = "-" if r.tv is None else f"{float(r.tv):.3g}"
            extra = f"N={r.n_samples}, p={r.p_value:.2g}; " if r.n_samples else ""
            if r.detectable_tv is not None:
                extra += f"detectable TV {r.detectable_tv:.3g}; "
            if r.seconds_per_sample:
                extra += ("s/sample: implementation {implementation:.3g}, oracle {oracle:.3g}; "
                          .format(**r.seconds_per_sample))
            detail = r.detail if len(r.detail) <= TABLE_DETAIL else (
                r.detail[:TABLE_DETAIL] + f"... [{len(r.detail) - TABLE_DETAIL} more characters]")
            lines.append(f"{r.case.name:<24} {r.status:<24} {tv:>12}  {extra}{detail}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The whole record (details uncut): verdict, and per case its data, status and numbers."""
        def number(v):
            return None if v is None else (str(v) if isinstance(v, Fraction) else float(v))

        def case_data(c):
            return c.to_json() if callable(getattr(c, "to_json", None)) else {"name": getattr(c, "name", repr(c))}

        return {
            "level": self.level, "mode": self.mode, "ok": self.ok, "worst_tv": number(self.worst_tv),
            "results": [{"case": case_data(r.case), "status": r.status, "tv": number(r.tv), "detail": r.detail,
                         "n_samples": r.n_samples, "p_value": r.p_value, "detectable_tv": r.detectable_tv,
                         "tv_interval": None if r.tv_interval is None else [number(v) for v in r.tv_interval]}
                        for r in self.results],
        }

    @property
    def outcome(self) -> str:
        """What happened, in one word of :data:`OUTCOMES` (:func:`outcome_of` of the cases' statuses)."""
        return outcome_of(r.status for r in self.results)

    @property
    def exit_status(self) -> int:
        """The CLI's exit status (SPEC §13.3): :data:`EXIT_STATUS` of the :attr:`outcome`."""
        return EXIT_STATUS[self.outcome]

    def _counts(self, outcome: str) -> list:
        members = dict((n, m) for n, m, _ in OUTCOMES).get(outcome, ())
        known = {s for _, m, _ in OUTCOMES for s in m} | {OK, INTERNAL}
        return [r for r in self.results if r.status in members
                or (outcome == "misbehaves" and r.status not in known)]

    @property
    def verdict(self) -> str:
        """The first line's verdict (SPEC §13.3): what happened, and only that -- the :attr:`outcome`,
        then a count of each other outcome.  ``DIFFERS`` needs a case that differs (its TV, never an ok
        case's plug-in estimate); ``BOUNDARY`` a deviation made by single coin grid points and nothing
        worse; a time-out, or a case not run after one, is no verdict and is said so."""
        outcome = self.outcome
        if outcome == "preserves":
            return "preserves the target distribution"
        head = self._head(outcome)
        others = [f"{n} {len(self._counts(n))}" for n, _, _ in OUTCOMES if n != outcome and self._counts(n)]
        return head + (f"; other cases: {', '.join(others)}" if others else "")

    def _head(self, outcome: str) -> str:
        cases = self._counts(outcome)
        tvs = [r.tv for r in cases if r.tv is not None]
        worst = f"worst TV {float(max(tvs)):.3g}" if tvs else "no TV"
        kinds = ", ".join(f"{s}: {n}" for s, n in sorted(Counter(r.status for r in cases).items()))
        if outcome == "internal error":
            n = sum(r.status == INTERNAL for r in self.results)
            return f"INTERNAL ERROR: the oracle failed on {n} case(s) (see statuses)"
        if outcome == "differs":
            return f"DIFFERS from the target distribution ({worst})"
        if outcome == "misbehaves":
            return f"MISBEHAVES: {len(cases)} case(s) ({kinds}; see statuses)"
        if outcome == "boundary":
            return (f"BOUNDARY: {len(cases)} case(s) deviate from the target only on single coin grid points "
                    f"({worst}; see statuses)")
        if outcome == "could not be judged":
            return f"NO VERDICT: {len(cases)} case(s) could not be judged ({kinds}; see statuses)"
        timed_out = sum(r.status == TIMEOUT for r in cases)
        not_run = len(cases) - timed_out
        return (f"NO VERDICT: {timed_out} case(s) timed out" + (f", {not_run} not run after it" if not_run else "")
                + ", without a result to judge (see statuses)")

    def __str__(self):
        text = f"{self.level}-level check, {self.mode} mode: {self.verdict}\n{self.table()}"
        if self.counterexample is not None:
            text += f"\ncounterexample: {self.counterexample!r}"
        return text


def law_verdict(case, comparison, tolerance, *, label: str = "output, got, target", top: int = 3) -> CaseResult:
    """The verdict of an exact comparison (:func:`specref.verification.laws.enumeration.compare`):
    ``differs`` when its TV exceeds ``tolerance``, with the outputs that differ most."""
    status = OK if comparison.tv <= tolerance else DIFFERS
    detail = "" if status == OK else f"worst outputs ({label}): " + ", ".join(
        f"{o}: {float(a):.4g} vs {float(b):.4g}" for o, a, b in comparison.worst[:top])
    return CaseResult(case, status, tv=comparison.tv, detail=detail, law=comparison.law_a)
