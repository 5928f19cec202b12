"""Sampling in shards: statistical checks on one core, a process pool or a Dask cluster,
with the same numbers on all of them (docs/spec.md §6).

N samples are cut into fixed **blocks** of :data:`BLOCK` samples.  Block ``j`` draws
from its own generator, seeded by the ``j``-th child of ``SeedSequence(seed)``
(``SeedSequence(seed, spawn_key=(j,))``, what ``SeedSequence(seed).spawn`` hands out
as child ``j``), so the samples of a block do not depend on which worker runs it or
on how many blocks a shard holds.  A **shard** is a run of consecutive blocks: the
unit of work sent to an executor.  Shards return counts -- one integer per outcome,
plus the outputs the target never makes -- never samples, and counts merge by
addition, which is exact and does not depend on the order shards finish in.  So a
verdict and its numbers are identical for 1, 2 or 8 workers and for any shard size.

An implementation that misbehaves stops its shard; the merged tally reports the
misbehaviour with the lowest sample index, which again does not depend on sharding.

``executor`` is any :class:`concurrent.futures.Executor`: ``ProcessPoolExecutor``
(the implementation and the case must pickle) or the executor of
:func:`~specref.adapters.cluster.dask_executor` (cloudpickle: lambdas travel too).  ``check``
refuses a Dask ``Client`` or its own ``get_executor()`` (SPEC §6.4): their shards would run on
Dask's worker threads; this module alone takes any executor it is handed.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Callable, MutableMapping, Protocol

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from specref.verification.running.calling import implementation_seconds, Misbehaved, case_budget, case_time_left
from specref.verification.running.report import TIMEOUT, WORKER_FAILED

__all__ = ["BLOCK", "Tally", "Sampler", "ProgramSampler", "OutcomeCounter", "block_rng", "count_blocks", "tally",
           "tally_blocks", "sampler_of", "calls_for", "timed_calls", "shard_key", "check_executor", "check_travel", "WORKER_FAILED"]

#: Samples per block; fixed, so that results do not depend on how work is cut.
BLOCK = 1024


def block_rng(seed: int, j: int) -> np.random.Generator:
    """The generator of block ``j``: child ``j`` of ``SeedSequence(seed)``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(j,))))


@dataclass
class Tally:
    """Counts of outputs over some samples; tallies of disjoint shards add up exactly."""

    counts: np.ndarray  # [n_outcomes + 1] int64; the last bin: outputs the target never makes
    strays: dict = field(default_factory=dict)  # output -> count, for outputs outside the target's support
    samples: int = 0  # samples counted
    misbehaved: tuple | None = None  # (sample index, status, detail) of the first misbehaviour
    seconds: dict = field(default_factory=dict, compare=False)  # name -> seconds spent; measured, so not kept in JSON

    def merge(self, other: "Tally") -> "Tally":
        strays = dict(self.strays)
        for out, c in other.strays.items():
            strays[out] = strays.get(out, 0) + c
        bad = [m for m in (self.misbehaved, other.misbehaved) if m is not None]
        seconds = {k: self.seconds.get(k, 0.0) + other.seconds.get(k, 0.0) for k in {**self.seconds, **other.seconds}}
        return Tally(self.counts + other.counts, strays, self.samples + other.samples,
                     min(bad, key=lambda m: m[0]) if bad else None, seconds)

    def to_json(self) -> dict:
        return {"counts": [int(c) for c in self.counts], "samples": self.samples,
                "strays": [[list(out), c] for out, c in self.strays.items()],
                "misbehaved": None if self.misbehaved is None else list(self.misbehaved)}

    @classmethod
    def from_json(cls, d: dict) -> "Tally":
        return cls(np.array(d["counts"], dtype=np.int64), {tuple(out): c for out, c in d["strays"]}, d["samples"],
                   None if d["misbehaved"] is None else tuple(d["misbehaved"]))


def shard_key(seed: int, first: int, stop: int, n: int) -> str:
    """The name a finished shard is kept under: seed, block range and N."""
    return f"seed={seed}:blocks={first}-{stop}:n={n}"


class Sampler:
    """One case's calls of an implementation in statistical mode, as :func:`count_blocks` makes them.

    A block of ``m`` samples first makes its own draws from its generator (``block(gen, m)``;
    by default none: the generator itself), then calls the implementation on samples ``a..b-1``
    of the block, ``per_call`` at a time (``call(drawn, a, b) -> outputs``); ``counter(outcomes)``
    counts the outputs.  A level builds its sampler where a shard runs (the recipe travels, the
    sampler does not).  ``names_calls``: a misbehaviour's detail names the call's samples.
    """

    per_call: int = 1
    names_calls: bool = False

    def block(self, gen: np.random.Generator, m: int):
        return gen

    def call(self, drawn, a: int, b: int) -> list:
        raise NotImplementedError

    def counter(self, outcomes: tuple) -> "Counter":
        return OutcomeCounter(outcomes)


class ProgramSampler(Sampler):
    """One sample per call of ``program(rng, impl_seed) -> output``: each sample draws the
    implementation's integer seed from the block's generator, then the program draws from it too
    (the draft tokens and completions the oracle itself draws)."""

    def __init__(self, program: Callable):
        self.program = program

    def call(self, gen, a: int, b: int) -> list:
        return [self.program(gen, int(gen.integers(2**63)))]


class Counter(Protocol):
    """What :meth:`Sampler.counter` gives: ``add(outputs)`` for each call's outputs, then
    ``result() -> (counts, strays)`` (:class:`OutcomeCounter`, or a level's own)."""

    def add(self, outs) -> None: ...

    def result(self) -> tuple[np.ndarray, dict]: ...


class OutcomeCounter:
    """Counts of outputs over ``outcomes``, and of the outputs outside them (the last bin, and by output)."""

    def __init__(self, outcomes: tuple):
        self.index = {o: i for i, o in enumerate(outcomes)}
        self.counts = np.zeros(len(outcomes) + 1, dtype=np.int64)
        self.strays: dict = {}

    def add(self, outs) -> None:
        for out in outs:
            i = self.index.get(out)
            if i is None:
                self.strays[out] = self.strays.get(out, 0) + 1
                i = len(self.index)
            self.counts[i] += 1

    def result(self) -> tuple[np.ndarray, dict]:
        return self.counts, self.strays


def count_blocks(sampler: Sampler, outcomes: tuple, seed: int, first: int, stop: int, n: int) -> Tally:
    """Blocks ``first..stop-1`` of an ``n``-sample check, counted: the one block tally.

    Block ``j`` draws from :func:`block_rng` ``(seed, j)`` (``sampler.block``), then its samples are
    called ``sampler.per_call`` at a time (the last call of a block may be shorter; no call spans two
    blocks), so its counts do not depend on the shard it is in.  A misbehaviour stops the shard at
    the sample it concerns (a call's first sample, or the row its output got wrong).
    """
    started, spent = time.perf_counter(), implementation_seconds()
    counter = sampler.counter(outcomes)
    done, bad = 0, None
    for j in range(first, stop):
        lo = j * BLOCK
        m = min(n, lo + BLOCK) - lo
        drawn = sampler.block(block_rng(seed, j), m)
        for a in range(0, m, sampler.per_call):
            b = min(a + sampler.per_call, m)
            try:
                outs = sampler.call(drawn, a, b)
            except Misbehaved as e:
                named = f" (the call for samples {lo + a}..{lo + b - 1})" if sampler.names_calls else ""
                bad = (lo + a + getattr(e, "row", 0), e.status, e.detail + named)
                break
            counter.add(outs)
            done += b - a
        if bad is not None:
            break
    counts, strays = counter.result()
    return Tally(counts, strays, done, bad, {"implementation": implementation_seconds() - spent,
                                             "shards": time.perf_counter() - started})


def tally_blocks(make_sampler: Callable, outcomes: tuple, seed: int, first: int, stop: int, n: int,
                 budget: float = math.inf) -> Tally:
    """Run blocks ``first..stop-1`` of an ``n``-sample check (runs in a worker): :func:`count_blocks`.

    ``make_sampler()`` builds, where it runs, a :class:`Sampler`, or ``program(rng, impl_seed) ->
    output`` (a :class:`ProgramSampler`: each sample gets the oracle's generator and an integer seed
    for the implementation), so only the recipe travels.  ``budget``: seconds its case had left
    when the shard was sent.
    """
    with case_budget(budget):
        return count_blocks(sampler_of(make_sampler()), outcomes, seed, first, stop, n)


def sampler_of(made) -> Sampler:
    """``made`` itself when it is a :class:`Sampler`; a program ``(rng, impl_seed) -> output`` as a :class:`ProgramSampler`."""
    return made if isinstance(made, Sampler) else ProgramSampler(made)


def calls_for(n: int, per_call: int) -> int:
    """Calls that cover ``n`` samples: blocks of :data:`BLOCK`, each cut into calls of ``per_call``
    (no call spans two blocks)."""
    full, rest = divmod(n, BLOCK)
    return full * math.ceil(BLOCK / per_call) + math.ceil(rest / per_call)


def timed_calls(make_sampler: Callable, seed: int, per_call: int) -> Callable[[int], Callable]:
    """A plan's timer (:class:`~specref.verification.running.level.CasePlan`): ``timer(calls)``
    builds the sampler (:func:`sampler_of` what ``make_sampler()`` makes) and draws ``(calls + 1) x per_call`` samples as block 0 of a check seeded
    ``seed`` draws them; its ``call(i)`` makes call ``i`` on samples of its own."""
    def timer(calls: int) -> Callable[[int], list]:
        sampler = sampler_of(make_sampler())
        drawn = sampler.block(block_rng(seed, 0), (calls + 1) * per_call)
        return lambda i: sampler.call(drawn, i * per_call, (i + 1) * per_call)

    return timer


def check_executor(executor):
    """``executor`` is None or has ``submit`` (a concurrent.futures.Executor), else SpecrefError."""
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise SpecrefError(f"executor must be a concurrent.futures.Executor (with submit), got {executor!r}")
    return executor


def check_travel(executor, obj) -> None:
    """SpecrefError unless ``obj`` can be sent to ``executor``'s workers.

    A ``ProcessPoolExecutor`` pickles (module-level functions travel, lambdas do
    not); other executors (Dask's cloudpickle, threads) are left to try.
    """
    check_executor(executor)
    if isinstance(executor, cf.ProcessPoolExecutor):
        try:
            pickle.dumps(obj)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
            raise _cannot_send(e) from None


def tally(make_program: Callable, outcomes, n: int, seed: int, *, executor=None, shard_blocks: int = 32,
          progress: Callable[[int], None] | None = None, store=None, run_blocks: Callable = tally_blocks) -> Tally:
    """Counts of ``n`` samples of ``make_program()``, in shards of ``shard_blocks`` blocks.

    ``progress(k)`` is called with the number of samples each finished shard counted.
    Without ``executor`` the shards run here, one after another, through the same code.
    ``store`` (a mutable mapping, for example a sweep's JSON record) keeps each finished
    shard under :func:`shard_key`; shards found there are not run again.
    ``make_program()`` builds a :class:`Sampler` (or a program) where a shard runs;
    ``run_blocks`` counts one shard there, with :func:`tally_blocks`'s signature (the default).
    """
    n = check_positive_int("n", n)
    shard_blocks = check_positive_int("shard_blocks", shard_blocks)
    check_executor(executor)
    outcomes = tuple(outcomes)
    blocks = math.ceil(n / BLOCK)
    shards = [(a, min(a + shard_blocks, blocks)) for a in range(0, blocks, shard_blocks)]
    total = _empty(outcomes)
    if store is not None:  # shards finished by an earlier, interrupted run
        total, shards = _kept(store, shards, seed, n, total)
    job = _Job(make_program, outcomes, n, seed, progress, store, run_blocks)
    if executor is None:
        return _tally_here(job, shards, total)
    return _tally_on(executor, job, shards, total)


@dataclass(frozen=True)
class _Job:
    """What every shard of one :func:`tally` shares."""

    make_program: Callable
    outcomes: tuple
    n: int
    seed: int
    progress: Callable[[int], None] | None
    store: MutableMapping[str, dict] | None
    run_blocks: Callable

    def run(self, a, b, budget) -> Tally:
        """Blocks ``a..b-1`` counted here (or, submitted, where the executor runs them)."""
        return self.run_blocks(self.make_program, self.outcomes, self.seed, a, b, self.n, budget)

    def done(self, a, b, part: Tally, total: Tally) -> Tally:
        """A finished shard: kept in the store (unless its worker failed), merged, reported."""
        if self.store is not None and (part.misbehaved is None or part.misbehaved[1] != WORKER_FAILED):
            self.store[shard_key(self.seed, a, b, self.n)] = part.to_json()
        total = total.merge(part)
        if self.progress:
            self.progress(part.samples)
        return total


def _empty(outcomes, misbehaved: tuple | None = None) -> Tally:
    """No samples counted over ``outcomes`` (and a misbehaviour, for a shard that ran no block)."""
    return Tally(np.zeros(len(outcomes) + 1, dtype=np.int64), misbehaved=misbehaved)


def _kept(store, shards, seed, n, total) -> tuple:
    """``total`` with the shards found in ``store`` merged in, and the shards still to run."""
    todo = []
    for a, b in shards:
        kept = store.get(shard_key(seed, a, b, n))
        if kept is None:
            todo.append((a, b))
        else:
            total = total.merge(Tally.from_json(kept))
    return total, todo


def _cannot_send(e) -> SpecrefError:
    """The error for an implementation or case that cannot travel to ``executor``'s workers."""
    return SpecrefError(f"executor cannot send the implementation or case to a worker ({type(e).__name__}: {e}); "
                        f"use a module-level function, or specref.adapters.cluster.dask_executor")


def _tally_here(job: _Job, shards, total) -> Tally:
    """The shards one after another in this process, each under the case's budget; stops at the
    first shard that misbehaved (later shards cannot change the verdict)."""
    for a, b in shards:
        part = job.run(a, b, case_time_left())  # the case's budget, here too
        total = job.done(a, b, part, total)
        if part.misbehaved:
            break
    return total


def _tally_on(executor, job: _Job, shards, total) -> Tally:
    """The shards submitted to ``executor`` and merged as they finish; a shard whose worker died
    is a :data:`WORKER_FAILED` misbehaviour, shards still out when the case's budget ends a time-out."""
    try:
        futures = {executor.submit(job.run_blocks, job.make_program, job.outcomes, job.seed, a, b, job.n,
                                   case_time_left()): (a, b) for a, b in shards}
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise _cannot_send(e) from None
    pending, left = dict(futures), case_time_left()
    try:  # the case's budget holds here as in a local run: shards still out when it ends are a time-out
        for future in cf.as_completed(futures, timeout=None if math.isinf(left) else max(left, 0.0)):
            a, b = pending.pop(future)
            try:
                part = future.result()
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise _cannot_send(e) from None
            except Exception as e:  # the worker died (BrokenProcessPool, KilledWorker) or was lost
                part = _empty(job.outcomes, (a * BLOCK, WORKER_FAILED,
                                             f"shard of blocks {a}..{b - 1}: {type(e).__name__}: {e}"))
            total = job.done(a, b, part, total)
    except cf.TimeoutError:
        for future in pending:
            future.cancel()
        first = min(a for a, _ in pending.values())
        total = total.merge(_empty(job.outcomes, (first * BLOCK, TIMEOUT,
                                                  "the case ran over its time budget (case_time_limit)")))
    return total
