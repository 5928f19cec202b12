"""The schedules level: a continuous-batching decoder under arrivals, cancellations and preemptions (SPEC §17).

``decode_fn(schedule, target, draft, rng) -> [tokens of each request]``: the implementation runs
every request of a :class:`~specref.decoding.continuous.Schedule` (arrival steps, cancellations,
preemptions by recompute or swap, a memory budget) with speculative decoding, K drafts a step,
``target`` and ``draft`` specref models (``probs(tokens)``), and returns each request's emitted
tokens (a list of lists, or an object with ``.tokens``; a cancelled request's: what it emitted in
the steps before its cancellation).  specref's reference is
:func:`~specref.decoding.continuous.continuous_decode`.

**The laws** (each computed here without the reference):

- a request that is never cancelled has the target sampler's law (:func:`target_law`), whatever
  happens to the others;
- a request cancelled at step ``c`` that runs ``s`` steps before it (fixed by the schedule,
  :meth:`~specref.decoding.continuous.Schedule.steps_before_cancel`) has the law of ``s``
  speculative steps (:func:`block_chain_law`): the target's output truncated at the tokens those
  ``s`` steps emitted, a random number whose law is Algorithm 1's (:func:`block_law`, closed form);
  completed by target sampling it has the target law again (:func:`completed_law`), and it has at
  most ``s (K + 1)`` tokens -- more were emitted after the cancellation (``invalid output``);
- requests are independent: the joint law is the product of the marginals.

A case with a memory budget and a cancellation is refused: the steps a cancelled request runs then
depend on the other requests' lengths, so its output depends on theirs (SPEC §17.2).

**Exact mode**: ``rng`` is the enumerator; the joint law of every request's output is compared with
the product of the expected marginals (TV above ``tolerance`` differs); a case that differs names the
laws that fail (each request's marginal against its law, then the joint against the product).
**Statistical mode**: ``rng`` is an int seed per sample; each request's marginal and each pair of
requests' joint counts are G-tested against the expected law (the pair: the product of the two
marginals, which tests independence), Bonferroni over the ``m`` tests; N is the largest any test
needs to detect ``detect_tv`` at ``alpha / m`` with power 0.9, at most :data:`MAX_SAMPLES`.

Every call gets the schedule (frozen) and copies of the models with read-only tables (a write is
``writes into its inputs``); the output is parsed inside the guarded call (:func:`parse_outputs`).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.core.numbers import same_kind
from specref.decoding.chain import kept_block, next_token_probs
from specref.decoding.continuous import Cancellation, Preemption, Request, Schedule, continuous_decode
from specref.verification.cases.models import PositionProbTable
from specref.verification.cases.tables import ProbTable
from specref.verification.laws.enumeration import Law, compare, law, target_law
from specref.verification.levels.runner import run_cases, samples_in_budget
from specref.verification.running.calling import Misbehaved, call, checked_tokens, foreign
from specref.verification.running.level import CasePlan, Level, fixed_reference
from specref.verification.running.progress import progress_bar
from specref.verification.running.report import DIFFERS, INVALID, OK, CaseResult, Report, Settings, law_verdict
from specref.verification.statistics.counts import PLAN_POWER, compare_counts, detectable_tv, planned_n
from specref.verification.statistics.shards import Sampler, tally, timed_calls

__all__ = [
    "ScheduleCase",
    "block_law",
    "block_chain_law",
    "completed_law",
    "expected_marginals",
    "schedule_law",
    "parse_outputs",
    "default_schedule_cases",
    "run_schedules",
    "reference_decode",
    "MAX_SAMPLES",
    "LEVELS",
]

MAX_SAMPLES = 2_000_000  # statistical mode: N per case is capped here (as at the batched levels)
CONTEXTS = ("last", "position")


# ---------------------------------------------------------------- the case


@dataclass(frozen=True)
class ScheduleCase:
    """A schedule and the target and draft tables its requests decode with.

    ``context="position"`` (default): ``[V, V, V]`` tables read as ``table[n % V, sum(prefix) % V]``
    (:class:`~specref.verification.cases.models.PositionProbTable`): every row depends on the
    length and on every token of the context, so a KV cache holding a token too many, too few or
    another request's shows in the law.  ``"last"``: ``[V] * (h + 1)`` tables over the last ``h``
    tokens (:class:`~specref.verification.cases.tables.ProbTable`).  Fraction tables make the law exact.
    """

    name: str
    schedule: Schedule
    target: np.ndarray
    draft: np.ndarray
    context: str = "position"

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[-1])

    @property
    def exact(self) -> bool:
        return self.target.dtype == object

    def models(self):
        """(target, draft) as specref models with ``probs``."""
        kind = PositionProbTable if self.context == "position" else ProbTable
        return kind(self.target), kind(self.draft)

    def as_float(self) -> "ScheduleCase":
        """The same case with float64 tables (statistical mode)."""
        return replace(self, target=np.asarray(self.target, dtype=np.float64),
                       draft=np.asarray(self.draft, dtype=np.float64))

    def to_json(self) -> dict:
        def rows(t):
            return np.vectorize(lambda v: str(v) if isinstance(v, Fraction) else float(v), otypes=[object])(t).tolist()

        s = self.schedule
        return {"name": self.name, "target": rows(self.target), "draft": rows(self.draft), "context": self.context,
                "schedule": {"requests": [{"prompt": list(r.prompt), "max_new_tokens": r.max_new_tokens,
                                           "stop_tokens": list(r.stop_tokens), "config": dict(vars(r.config))}
                                          for r in s.requests],
                             "arrivals": list(s.arrivals or ()), "k": s.k, "memory_budget": s.memory_budget,
                             "cancellations": [[c.request, c.step] for c in s.cancellations],
                             "preemptions": [[p.request, p.step, p.resume, p.mode] for p in s.preemptions]}}

    def __repr__(self):
        s = self.schedule
        return (f"ScheduleCase({self.name!r}, V={self.vocab_size}, B={len(s.requests)}, k={s.k}, "
                f"arrivals={s.arrivals}, cancellations={len(s.cancellations)}, preemptions={len(s.preemptions)}, "
                f"memory_budget={s.memory_budget})")


def _validate(level: Level, case, settings: Settings | None = None) -> None:
    """SpecrefError for a case this level cannot judge, naming the field."""
    if not isinstance(case, ScheduleCase):
        raise SpecrefTypeError(f"cases must hold ScheduleCase objects, got {case!r:.80}")
    if not isinstance(case.name, str):
        raise SpecrefTypeError(f"ScheduleCase name must be a string, got {case.name!r:.80}")
    if not isinstance(case.schedule, Schedule):
        raise SpecrefTypeError(f"ScheduleCase {case.name!r}: schedule must be a Schedule, got {case.schedule!r:.80}")
    if case.context not in CONTEXTS:
        raise SpecrefError(f"ScheduleCase {case.name!r}: context must be one of {CONTEXTS}, got {case.context!r:.80}")
    for name in ("target", "draft"):
        if not isinstance(getattr(case, name), np.ndarray):
            raise SpecrefTypeError(f"ScheduleCase {case.name!r}: {name} must be a NumPy table, got "
                                   f"{getattr(case, name)!r:.80}")
    if case.draft.shape != case.target.shape:
        raise SpecrefError(f"ScheduleCase {case.name!r}: draft table shape {case.draft.shape} != target "
                           f"{case.target.shape}")
    if case.context == "position" and case.target.ndim != 3:
        raise SpecrefError(f"ScheduleCase {case.name!r}: a position table has shape [V, V, V], got {case.target.shape}")
    case.models()  # validates the rows
    s, V = case.schedule, case.vocab_size
    for r, req in enumerate(s.requests):
        for field_, tokens in (("prompt", req.prompt), ("stop_tokens", req.stop_tokens)):
            bad = [t for t in tokens if t >= V]
            if bad:
                raise SpecrefError(f"ScheduleCase {case.name!r}: schedule.requests[{r}].{field_} holds {bad[0]}, "
                                   f"outside the vocabulary 0..{V - 1}")
    if s.memory_budget is not None and s.cancellations:
        raise SpecrefError(f"ScheduleCase {case.name!r}: schedule.memory_budget = {s.memory_budget} with "
                           f"{len(s.cancellations)} cancellation(s): the steps a cancelled request runs would "
                           f"depend on the other requests' lengths, so no law per request is fixed (SPEC 17.2); "
                           f"drop the budget or the cancellations")
    if settings is not None:
        _check_size(case, settings.max_paths)


def _check_size(case: ScheduleCase, max_paths: int) -> None:
    """SpecrefError (``over budget`` when it runs) when the joint law may have more than ``max_paths`` outputs."""
    V = case.vocab_size
    size = math.prod(sum(V ** i for i in range(req.max_new_tokens + 1)) for req in case.schedule.requests)
    if size > max_paths:
        raise SpecrefError(f"case {case.name!r}: the joint law of its requests may have up to {size} outputs (V={V}), "
                           f"over max_paths={max_paths}; shrink the case or raise max_paths")


# ---------------------------------------------------------------- the laws, in closed form


def _one(exact: bool):
    return Fraction(1) if exact else 1.0


def _finished(generated: tuple, request: Request) -> bool:
    return len(generated) >= request.max_new_tokens or (bool(generated) and generated[-1] in request.stop_tokens)


def block_law(target, draft, request: Request, generated: tuple, k: int) -> dict:
    """The law of the block one speculative step emits after ``prompt + generated``, in closed form.

    Leviathan et al. (2022), Algorithm 1, with ``p_i``, ``q_i`` the request's processed rows after
    ``prompt + generated + x_<i``: the step emits ``(x_1..x_n, y)`` with probability
    ``prod_{i<=n} min(p_i(x_i), q_i(x_i)) * max(0, p_{n+1}(y) - q_{n+1}(y))`` for ``n < K`` (a
    draft accepted has mass ``min(p, q)``; a rejection followed by ``y`` has mass
    ``max(0, p(y) - q(y))``) and ``prod_{i<=K} min(p_i(x_i), q_i(x_i)) * p_{K+1}(y)`` for the bonus.
    The block is then kept to ``max_new_tokens`` and through its first stop token (equal kept
    blocks add up).  Written without :mod:`specref.decoding`'s step: the independent law.
    """
    prompt, config = list(request.prompt) + list(generated), request.config
    out: dict = {}
    stack: list = [((), None)]  # (accepted drafts, their mass; None: 1)
    while stack:
        accepted, w = stack.pop()
        p, q = same_kind(next_token_probs(target, prompt + list(accepted), config, name="target"),
                         next_token_probs(draft, prompt + list(accepted), config, name="draft"))
        w = _one(p.dtype == object) if w is None else w
        final = p if len(accepted) == k else np.where(p > q, p - q, p * 0)  # the bonus row, or the residual mass
        for y, m in enumerate(final.tolist()):
            if m > 0:
                kept, _ = kept_block(tuple(generated), list(accepted) + [y], request.max_new_tokens,
                                     frozenset(request.stop_tokens))
                out[kept] = out.get(kept, 0) + w * m
        if len(accepted) < k:
            for x, m in enumerate(np.where(p < q, p, q).tolist()):
                if m > 0:
                    stack.append((accepted + (x,), w * m))
    return out


def block_chain_law(target, draft, request: Request, k: int, steps: int | None = None) -> Law:
    """The law of a request's output after ``steps`` speculative steps (None: until it finishes).

    ``law_{s+1}(g + b) = sum law_s(g) block_law(g)(b)`` over unfinished ``g``; a finished output
    (``max_new_tokens`` reached, or a stop token) stays.  With ``steps=None`` this is the target law
    (Leviathan et al., Theorem 1; the tests check it exactly).  The length after ``s`` steps is
    random: each step emits 1 to K + 1 tokens.
    """
    exact = next_token_probs(target, list(request.prompt), request.config, name="target").dtype == object
    dist: dict = {(): _one(exact)}
    memo: dict = {}
    done = 0
    while any(not _finished(g, request) for g in dist) and (steps is None or done < steps):
        nxt: dict = {}
        for g, w in dist.items():
            if _finished(g, request):
                nxt[g] = nxt.get(g, 0) + w
                continue
            if g not in memo:
                memo[g] = block_law(target, draft, request, g, k)
            for b, bw in memo[g].items():
                nxt[g + b] = nxt.get(g + b, 0) + w * bw
        dist, done = nxt, done + 1
    return Law(dist, paths=len(memo), states=len(memo))


def completed_law(prefixes: dict, target, request: Request) -> Law:
    """The law of ``o + rest``: ``o ~ prefixes``, then plain target sampling until the request finishes.

    A cancelled request's output completed so has the target law exactly (the tests check it): it is
    a prefix of a sample of that law."""
    out: dict = {}
    for o, w in prefixes.items():
        if _finished(o, request):
            out[o] = out.get(o, 0) + w
            continue
        rest = target_law(target, list(request.prompt) + list(o), request.config, request.max_new_tokens - len(o),
                          request.stop_tokens)
        for tail, tw in rest.items():
            out[o + tail] = out.get(o + tail, 0) + w * tw
    return Law(out)


def expected_marginals(case: ScheduleCase) -> list[tuple[str, Law]]:
    """Per request: ``(what its law is, the law)`` -- the target law, or the law of the steps a
    cancelled request runs before its cancellation."""
    target, draft = case.models()
    s = case.schedule
    out = []
    for r, req in enumerate(s.requests):
        cancel = s.cancel_step(r)
        if cancel is None:
            out.append((f"request {r}: the target law",
                        target_law(target, list(req.prompt), req.config, req.max_new_tokens, req.stop_tokens)))
        else:
            n = s.steps_before_cancel(r)
            out.append((f"request {r} (cancelled at step {cancel}, after {n} step(s)): the law of {n} speculative "
                        f"step(s)", block_chain_law(target, draft, req, s.k, steps=n)))
    return out


def schedule_law(case: ScheduleCase) -> Law:
    """The joint law of every request's output: the product of :func:`expected_marginals`."""
    joint: dict = {(): None}
    for _, marginal in expected_marginals(case):
        joint = {key + (o,): (v if w is None else w * v) for key, w in joint.items() for o, v in marginal.items()}
    return Law(joint)


def marginal(joint: dict, r: int) -> dict:
    """Request ``r``'s law from a joint law over tuples of outputs."""
    out: dict = {}
    for o, w in joint.items():
        out[o[r]] = out.get(o[r], 0) + w
    return out


# ---------------------------------------------------------------- the implementation's output


def parse_outputs(out, case: ScheduleCase) -> tuple:
    """``decode_fn``'s output as a tuple of each request's tokens, else ``invalid output`` naming the request.

    One token sequence per request (a list, tuple or 1-D array; or an object with ``.tokens``); ids
    in ``0..V-1``; at most ``max_new_tokens``; nothing after a stop token; a cancelled request at most
    ``s (K + 1)`` tokens, ``s`` the steps it runs before its cancellation."""
    s, V = case.schedule, case.vocab_size
    B = len(s.requests)
    with foreign("decode_fn's output"):
        seqs = out.tokens if hasattr(out, "tokens") and not isinstance(out, (list, tuple, np.ndarray)) else out
        seqs = list(seqs[:B + 1]) if isinstance(seqs, (list, tuple)) else list(seqs)
    if len(seqs) != B:
        raise Misbehaved(INVALID, f"decode_fn returned {len(seqs)} token sequences for {B} requests")
    parsed = []
    for r, (req, seq) in enumerate(zip(s.requests, seqs)):
        tokens = checked_tokens(seq, V, min_len=0, max_len=req.max_new_tokens, what=f"decode_fn (request {r})")
        stop = next((i for i, t in enumerate(tokens) if t in req.stop_tokens), None)
        if stop is not None and stop < len(tokens) - 1:
            raise Misbehaved(INVALID, f"decode_fn (request {r}) returned {tokens}: tokens after the stop token "
                                      f"{tokens[stop]} at position {stop}")
        steps = s.steps_before_cancel(r) if s.cancellations else None
        if steps is not None and len(tokens) > steps * (s.k + 1):
            raise Misbehaved(INVALID, f"decode_fn (request {r}) returned {len(tokens)} tokens {tokens}, more than its "
                                      f"{steps} step(s) before its cancellation at step {s.cancel_step(r)} can emit "
                                      f"(K + 1 = {s.k + 1} a step): tokens emitted after the cancellation")
        parsed.append(tuple(tokens))
    return tuple(parsed)


def _fresh(model):
    """A copy of a table model with its own read-only table: what the implementation does stays there."""
    twin = copy.copy(model)
    twin.table = model.table.copy()
    twin.table.flags.writeable = False
    return twin


def _called(fn, case: ScheduleCase, models, rng, time_limit):
    target, draft = models
    return call(fn, (case.schedule, _fresh(target), _fresh(draft), rng), {}, time_limit, read_only=True,
                convert=partial(parse_outputs, case=case))


# ---------------------------------------------------------------- exact mode


def _laws_that_fail(got: dict, marginals: list, tolerance: float) -> str:
    """Which law a differing joint law breaks: each request's marginal first, then independence."""
    failed = []
    for r, (label, expected) in enumerate(marginals):
        c = compare(marginal(got, r), expected, top=1)
        if c.tv > tolerance:
            failed.append(f"{label}: TV {float(c.tv):.4g}{f' = {c.tv}' if c.exact else ''}")
    if failed:
        return "; ".join(failed)
    product_law: dict = {(): None}
    for r in range(len(marginals)):
        m = marginal(got, r)
        product_law = {k + (o,): (v if w is None else w * v) for k, w in product_law.items() for o, v in m.items()}
    c = compare(got, product_law, top=1)
    return (f"every request has its law, but the requests are not independent: the joint law is TV "
            f"{float(c.tv):.4g}{f' = {c.tv}' if c.exact else ''} from the product of its marginals")


def _exact_case(fn, case: ScheduleCase, settings: Settings) -> CaseResult:
    """Every path of the implementation's run enumerated; its joint law against the product of the laws."""
    _check_size(case, settings.max_paths)
    marginals = expected_marginals(case)
    expected = schedule_law(case)
    models = case.models()
    got = law(lambda rng: _called(fn, case, models, rng, settings.time_limit), max_paths=settings.max_paths)
    result = law_verdict(case, compare(got, expected), settings.tolerance,
                         label="outputs of every request, got, expected", top=2)
    if result.status == DIFFERS:
        result.detail = _laws_that_fail(got, marginals, settings.tolerance) + "; " + result.detail
    return result


# ---------------------------------------------------------------- statistical mode


@dataclass(frozen=True)
class _Stat:
    """One G-test: a request's marginal, or a pair's joint against the product of its marginals."""

    name: str
    requests: tuple  # (r,) or (r1, r2)
    index: tuple  # per request of the test: {output: position in its support}
    null: np.ndarray  # probabilities of the categories, the last one (0) for outputs outside the support

    def category(self, joint: tuple) -> int:
        at, size = 0, 1
        for r, idx in zip(self.requests, self.index):
            i = idx.get(joint[r])
            if i is None:
                return len(self.null) - 1
            at, size = at * len(idx) + i, size * len(idx)
        return at


def statistics(case: ScheduleCase) -> list[_Stat]:
    """The tests of a case's statistical mode: each request's marginal, each pair of requests jointly."""
    marginals = expected_marginals(case.as_float())
    supports = [sorted(o for o, w in m.items() if w > 0) for _, m in marginals]
    probs = [np.array([float(m[o]) for o in sup]) for sup, (_, m) in zip(supports, marginals)]
    index = [{o: i for i, o in enumerate(sup)} for sup in supports]
    out = [_Stat(label, (r,), (index[r],), np.append(probs[r], 0.0)) for r, (label, _) in enumerate(marginals)]
    for r1, r2 in ((a, b) for a in range(len(marginals)) for b in range(a + 1, len(marginals))):
        null = np.append(np.outer(probs[r1], probs[r2]).ravel(), 0.0)
        out.append(_Stat(f"requests {r1} and {r2} jointly (independence)", (r1, r2), (index[r1], index[r2]), null))
    return out


def planned_samples(stats: list[_Stat], settings: Settings) -> int:
    """N: ``settings.samples``, else the largest N a test with two or more outcomes needs at ``alpha / m``
    (at most :data:`MAX_SAMPLES`); a case of certain outputs: what detects ``detect_tv`` with one outcome."""
    if settings.samples:
        return settings.samples
    alpha = settings.alpha / len(stats)
    needed = [planned_n(settings, s.null, alpha=alpha) for s in stats if (s.null > 0).sum() >= 2]
    if not needed:
        return math.ceil(math.log(0.1) / math.log(1 - settings.detect_tv))
    return min(MAX_SAMPLES, max(needed))


class _Recipe:
    """What a shard needs (plain data and the implementation); the runner is built where it runs."""

    def __init__(self, fn, case: ScheduleCase, time_limit, stats: list[_Stat]):
        self.fn, self.case, self.time_limit, self.stats = fn, case, time_limit, stats

    def __call__(self) -> "_Runner":
        return _Runner(self)


class _Runner(Sampler):
    """One sample per call: the implementation on the case with an int seed from the block's generator."""

    def __init__(self, recipe: _Recipe):
        self.fn, self.case, self.time_limit, self.stats = recipe.fn, recipe.case.as_float(), recipe.time_limit, recipe.stats
        self.models = self.case.models()

    def block(self, gen, m):
        return gen.integers(2**63, size=m)

    def call(self, seeds, a: int, b: int) -> list:
        return [_called(self.fn, self.case, self.models, int(seeds[i]), self.time_limit) for i in range(a, b)]

    def counter(self, outcomes) -> "_Counter":
        return _Counter(self.stats)


class _Counter:
    """Counts of every test's categories, side by side; joint outputs outside a support kept as strays."""

    def __init__(self, stats: list[_Stat]):
        self.stats = stats
        self.offsets = np.cumsum([0] + [len(s.null) for s in stats])
        self.counts = np.zeros(int(self.offsets[-1]) + 1, dtype=np.int64)
        self.strays: dict = {}

    def add(self, outs) -> None:
        for joint in outs:
            for j, s in enumerate(self.stats):
                c = s.category(joint)
                self.counts[self.offsets[j] + c] += 1
                if c == len(s.null) - 1 and len(s.requests) == 1:
                    self.strays[joint] = self.strays.get(joint, 0) + 1

    def result(self):
        return self.counts, self.strays


def _statistical_case(fn, case: ScheduleCase, settings: Settings, seed: int) -> CaseResult:
    """N samples in seeded shards, then every test at ``alpha / m``."""
    started = time.perf_counter()
    stats = statistics(case)
    m = len(stats)
    outcomes = tuple((j, c) for j, s in enumerate(stats) for c in range(len(s.null)))
    recipe = _Recipe(fn, case, settings.time_limit, stats)
    if settings.samples or settings.budget_s is None:
        n = planned_samples(stats, settings)
    else:  # timed pilots, then what the budget buys (SPEC 13.5)
        n = samples_in_budget(lambda k: tally(recipe, outcomes, k, seed), settings, started, most=MAX_SAMPLES)
    with progress_bar(n, case.name, enabled=settings.progress) as bar:
        t = tally(recipe, outcomes, n, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
                  progress=bar, store=settings.shard_store)
    if t.misbehaved:
        return CaseResult(case, t.misbehaved[1], detail=t.misbehaved[2])
    counts = np.split(t.counts[:-1], np.cumsum([len(s.null) for s in stats])[:-1])
    results = [compare_counts(c, s.null, alpha=settings.alpha / m) for c, s in zip(counts, stats)]
    worst = min(range(m), key=lambda j: results[j].g.p_value)
    r = results[worst]
    adjusted = min(1.0, r.g.p_value * m)
    detail = f"{m} tests, Bonferroni alpha/{m}; most significant: {stats[worst].name}: {r.g}; adjusted p = {adjusted:.3g}"
    if t.strays:
        detail += f"; outputs outside a request's law: {dict(list(t.strays.items())[:3])}"
    tested = [j for j in range(m) if (stats[j].null > 0).sum() >= 2]
    detectable = max((detectable_tv(n, settings.alpha / m, PLAN_POWER, len(stats[j].null), null=stats[j].null)
                      for j in tested), default=None)  # the weakest test's: each test sees at least this TV
    return CaseResult(case, DIFFERS if any(x.rejected for x in results) else OK, tv=r.tv.estimate, detail=detail,
                      n_samples=n, p_value=adjusted, tv_interval=(r.tv.lower, r.tv.upper), detectable_tv=detectable)


def _plan_statistical(level: Level, fn, case: ScheduleCase, settings: Settings, seed: int) -> CasePlan:
    stats = statistics(case)
    n = planned_samples(stats, settings)
    return CasePlan(None, n, 1, n, timer=timed_calls(_Recipe(fn, case, settings.time_limit, stats), seed, 1))


# ---------------------------------------------------------------- the level


def run_schedules(level: Level, fn, cases, settings: Settings) -> Report:
    """Judge ``fn`` on every case through the one runner (exact or statistical mode)."""
    return run_cases(level, cases, settings, validate=lambda case: _validate(level, case, settings), fn=fn,
                     exact=lambda case: partial(_exact_case, fn, case, settings),
                     statistical=lambda case, seed: partial(_statistical_case, fn, case, settings, seed))


def reference_decode(schedule, target, draft, rng) -> list:
    """specref's reference at this level: :func:`~specref.decoding.continuous.continuous_decode`'s tokens."""
    return continuous_decode(schedule, target, draft, rng).tokens


def _frac_table(weights) -> np.ndarray:
    """A ``[V, V, V]`` table of Fraction rows from integer weights (each row normalised)."""
    w = np.asarray(weights)
    out = np.empty(w.shape, dtype=object)
    for idx in np.ndindex(w.shape[:-1]):
        total = int(w[idx].sum())
        out[idx] = [Fraction(int(x), total) for x in w[idx]]
    return out


_TARGET = _frac_table([[[1, 3], [2, 1]], [[3, 1], [1, 2]]])  # row after n tokens summing to s: [n % 2][s % 2]
_DRAFT = _frac_table([[[1, 1], [1, 3]], [[1, 1], [3, 1]]])


def default_schedule_cases() -> list[ScheduleCase]:
    """Small exact cases (V = 2, position tables, K = 1): staggered arrivals; a cancellation whose slot
    a later request reuses, itself cancelled; preemption by recompute and by swap, with a request that
    takes the freed slot; a memory budget that forces a preemption."""
    req = Request
    return [
        ScheduleCase("arrivals", Schedule((req((0,), 2), req((1,), 2), req((0, 1), 2)), arrivals=(0, 1, 1), k=1),
                     _TARGET, _DRAFT),
        ScheduleCase("cancel-then-reuse", Schedule((req((0,), 3), req((1,), 3)), arrivals=(0, 1), k=1,
                                                   cancellations=(Cancellation(0, 1), Cancellation(1, 2))),
                     _TARGET, _DRAFT),
        ScheduleCase("preempt-recompute", Schedule((req((0,), 3), req((1,), 2)), arrivals=(0, 1), k=1,
                                                   preemptions=(Preemption(0, 1, 2, "recompute"),)),
                     _TARGET, _DRAFT),
        ScheduleCase("preempt-swap", Schedule((req((1,), 3), req((0,), 2)), arrivals=(0, 1), k=1,
                                              preemptions=(Preemption(0, 1, 2, "swap"),)),
                     _TARGET, _DRAFT),
        ScheduleCase("memory-budget", Schedule((req((0,), 3), req((1,), 2)), arrivals=(0, 0), k=1, memory_budget=5),
                     _TARGET, _DRAFT),
    ]


LEVELS = (
    Level("schedules", "decode_fn(schedule, target, draft, rng) -> [tokens of each request]",
          default_schedule_cases, run_schedules, validate=_validate, reference=fixed_reference(reference_decode),
          planner=_plan_statistical),
)
"""The schedules level (SPEC §17.3)."""

