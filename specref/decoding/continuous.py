"""Continuous batching: requests arrive, are cancelled and are preempted while others decode (SPEC §17).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  A serving engine never runs B
requests in lockstep from start to finish (:mod:`specref.decoding.serving` does): requests arrive
while others are mid-generation, clients disconnect (a cancellation, vLLM's ``abort_request``), and
under memory pressure a request is preempted -- its KV cache dropped and later recomputed from its
tokens, or swapped out to the host and back in.  Each of these touches the state of the requests
that remain.  A correct engine gives every request the same law whatever happens to the others.

**A schedule is data.**  :class:`Schedule` (frozen, validated on construction): the requests
(:class:`Request`: prompt, ``max_new_tokens``, stop tokens, sampling config), the step at which
each arrives, cancellations (:class:`Cancellation`: request, step), preemptions
(:class:`Preemption`: request, step, the step it may resume at, mode ``"recompute"`` or
``"swap"``), K, and an optional ``memory_budget`` in KV tokens.  Steps count from 0.

**One global step** ``t`` of :func:`continuous_decode`, in this order:

1. a request whose cancellation step is ``t`` leaves (its slot is freed); its output is what it
   emitted in the steps before ``t``, and nothing is emitted for it afterwards;
2. requests arriving at ``t`` join the waiting queue;
3. a request preempted at ``t`` leaves its slot (or the queue): ``"recompute"`` drops its KV
   (rebuilt from its tokens when it is admitted again), ``"swap"`` copies it to the host; it joins
   the waiting queue again at its resume step.  A preemption of a request that has finished
   (possible only at random) does nothing;
4. with a memory budget (vLLM's policy): while the running requests' next step does not fit --
   request ``r`` needs ``len(prompt) + len(emitted) + K`` KV tokens of the target, its tokens and
   its K drafts -- the running request that arrived last (ties: the larger index) is preempted by
   recompute and waits again;
5. admission: waiting requests first come first served (arrival step, then index), each to the
   lowest free slot while it fits in the budget (the first that does not fit stops the queue);
6. one speculative step for every running request: K draft positions, at each one draft row per
   request and its draft ``x_j ~ q_j``; one target call scoring every request's ``[tokens,
   x_1..x_K]`` (its K + 1 rows); then Algorithm 1 per request, :func:`specref.core.step.speculative_step`
   (accept ``x_i`` while ``u_i < p_i(x_i) / q_i(x_i)``, then a residual or bonus token); each request
   keeps its block up to ``max_new_tokens`` and through its first stop token;
7. a finished request leaves and frees its slot.

Without a memory budget the steps at which a request runs are fixed by the schedule
(:meth:`Schedule.scheduled_steps`); with one they depend on the other requests' lengths.

**Caches are data.**  Each slot holds, per model, the list of tokens whose KV it holds; each
request has the tokens still to feed (no KV yet).  A model's rows for a request are computed from
``slot's KV tokens + tokens to feed + drafts`` -- nothing else -- so the bookkeeping is what the
law depends on.  The operations (:class:`Hooks`; the defaults are the reference, the zoo
:mod:`specref.verification.zoo.schedules` replaces one at a time):

- admission to a slot clears the slot's KV (``clear``): the slot may hold a cancelled, finished or
  preempted request's tokens; a new or recomputed request then feeds its prompt and emitted tokens
  (``refill``), a swapped one gets its KV back;
- the target call writes KV for every token it was fed (the last tokens and ``x_1..x_K``), the
  draft for ``x_1..x_{K-1}`` too; after ``n`` accepted drafts both are rolled back
  (``rollback``) to the accepted prefix: the target by ``K - n`` tokens, the draft by
  ``max(0, K - 1 - n)``; what is still to feed is ``[y]`` (``[x_K, y]`` for the draft when all K
  were accepted).

**Randomness: one stream per request** (``coins``).  Request ``r`` draws every random choice of its
own steps from stream ``r`` (:func:`streams`), in its own order -- per step, its K draft draws
(``rng.choice(V, p=q_j)``), then :func:`~specref.core.step.speculative_step`'s: one acceptance coin
(``rng.random()``) per draft it judges, then one draw of the residual or bonus token.  With an int seed
stream ``r`` is ``Generator(PCG64(SeedSequence(seed, spawn_key=(r,))))``; with a
``numpy.random.Generator``, child ``r`` of ``rng.spawn(B)``; with the exact enumerator
(:func:`specref.verification.laws.enumeration.law`), the enumerator itself, drawn in this order within
a step: draft position 1 for every running request in index order, ..., position K, then each running
request's acceptance coins and final draw, in index order.  Preemption, recompute and swap draw
nothing.  So the output of a request that finishes is a function of its own stream alone, whatever the
schedule: with an int seed the same tokens under every schedule, in law the target's.  One batch
stream drawn in slot order has the same law as long as every draw is fresh (each coin is independent
of everything drawn before it); a stream keyed by the slot and restarted when the slot is reassigned
does not (the zoo's ``coins_by_slot``: a request replays the coins of the slot's last occupant).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int, check_tokens
from specref.core.numbers import same_kind
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.decoding.chain import model_rows, next_token_probs

__all__ = [
    "PREEMPTION_MODES",
    "Request",
    "Cancellation",
    "Preemption",
    "Schedule",
    "ContinuousResult",
    "Hooks",
    "REFERENCE",
    "RequestStreams",
    "streams",
    "continuous_decode",
]

PREEMPTION_MODES = ("recompute", "swap")  # vLLM's two preemption modes (V1 recomputes only)


def _show(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tuple(name: str, value) -> tuple:
    """A tuple, list or 1-D array as a tuple (read once), else SpecrefTypeError naming ``name``."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return tuple(value.tolist())
    if not isinstance(value, (tuple, list)):
        raise SpecrefTypeError(f"{name} must be a tuple or list, got {_show(value)}")
    return tuple(value)


def _step(name: str, value) -> int:
    return check_positive_int(name, value, minimum=0)


# ---------------------------------------------------------------- the schedule: data


@dataclass(frozen=True)
class Request:
    """One request: its prompt, how many tokens it may generate, its stop tokens and its sampling
    config (applied to its draft and its target rows alike).  Token ids are checked against the
    models' vocabulary when the schedule runs."""

    prompt: tuple  # [P] token ids, P >= 1
    max_new_tokens: int  # >= 1
    stop_tokens: tuple = ()  # a generated stop token ends the request (and is emitted)
    config: SamplingConfig = SamplingConfig()

    def __post_init__(self):
        prompt = check_tokens("Request.prompt", _tuple("Request.prompt", self.prompt), sys.maxsize)
        if not prompt:
            raise SpecrefError("Request.prompt must hold at least one token (models condition on it), got ()")
        object.__setattr__(self, "prompt", tuple(prompt))
        object.__setattr__(self, "max_new_tokens", check_positive_int("Request.max_new_tokens", self.max_new_tokens))
        stops = check_tokens("Request.stop_tokens", _tuple("Request.stop_tokens", self.stop_tokens), sys.maxsize)
        object.__setattr__(self, "stop_tokens", tuple(stops))
        if not isinstance(self.config, SamplingConfig):
            raise SpecrefTypeError(f"Request.config must be a SamplingConfig, got {_show(self.config)}")


@dataclass(frozen=True)
class Cancellation:
    """Request ``request`` is cancelled at step ``step``: it does not run at ``step`` or later."""

    request: int
    step: int

    def __post_init__(self):
        object.__setattr__(self, "request", _step("Cancellation.request", self.request))
        object.__setattr__(self, "step", _step("Cancellation.step", self.step))


@dataclass(frozen=True)
class Preemption:
    """Request ``request`` is preempted at ``step`` and may run again from ``resume`` (> ``step``) on.

    ``mode``: ``"recompute"`` (its KV is dropped and rebuilt from its tokens when it is admitted
    again) or ``"swap"`` (its KV is copied to the host and back)."""

    request: int
    step: int
    resume: int
    mode: str = "recompute"

    def __post_init__(self):
        object.__setattr__(self, "request", _step("Preemption.request", self.request))
        object.__setattr__(self, "step", _step("Preemption.step", self.step))
        object.__setattr__(self, "resume", _step("Preemption.resume", self.resume))
        if self.resume <= self.step:
            raise SpecrefError(f"Preemption.resume = {self.resume} must come after Preemption.step = {self.step}")
        if self.mode not in PREEMPTION_MODES:
            raise SpecrefError(f"Preemption.mode must be one of {PREEMPTION_MODES}, got {_show(self.mode)}")


@dataclass(frozen=True)
class Schedule:
    """Requests, when each arrives, cancellations, preemptions and a memory budget: what happens to a
    continuous batch, as data (module docstring).  Lists are stored as tuples; every field is
    validated here, each error a SpecrefError naming the field and its value.

    ``arrivals``: one step per request (empty or None: all at step 0).  ``k``: draft tokens per step.
    ``memory_budget``: None (no limit), or the target KV tokens the running requests may hold; it must
    hold every request alone at its last step (``len(prompt) + max_new_tokens - 1 + k``)."""

    requests: tuple
    arrivals: tuple = ()  # () or None: every request arrives at step 0
    k: int = 2
    cancellations: tuple = ()
    preemptions: tuple = ()
    memory_budget: int | None = None

    def __post_init__(self):
        requests = _tuple("requests", self.requests)
        if not requests:
            raise SpecrefError("requests must hold at least one Request, got ()")
        for r, req in enumerate(requests):
            if not isinstance(req, Request):
                raise SpecrefTypeError(f"requests[{r}] must be a Request, got {_show(req)}")
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "k", check_positive_int("k", self.k))
        self._check_arrivals()
        object.__setattr__(self, "cancellations", self._checked_cancellations())
        object.__setattr__(self, "preemptions", self._checked_preemptions())
        self._check_budget()

    # -- validation ---------------------------------------------------------

    def _check_arrivals(self):
        B = len(self.requests)
        arrivals = (0,) * B if self.arrivals is None or self.arrivals == () else _tuple("arrivals", self.arrivals)
        if len(arrivals) != B:
            raise SpecrefError(f"arrivals must hold one step per request ({B}), got {len(arrivals)}: {_show(arrivals)}")
        object.__setattr__(self, "arrivals", tuple(_step(f"arrivals[{r}]", a) for r, a in enumerate(arrivals)))

    def _request_index(self, name: str, r) -> int:
        r = _step(name, r)
        if r >= len(self.requests):
            raise SpecrefError(f"{name} = {r} is not a request (0..{len(self.requests) - 1})")
        return r

    def _checked_cancellations(self) -> tuple:
        out: tuple = _tuple("cancellations", self.cancellations)
        seen: dict[int, int] = {}
        for i, c in enumerate(out):
            if not isinstance(c, Cancellation):
                raise SpecrefTypeError(f"cancellations[{i}] must be a Cancellation, got {_show(c)}")
            r = self._request_index(f"cancellations[{i}].request", c.request)
            if c.step < self.arrivals[r]:
                raise SpecrefError(f"cancellations[{i}].step = {c.step} is before request {r}'s arrival "
                                   f"(arrivals[{r}] = {self.arrivals[r]}): a request cannot be cancelled before it "
                                   f"arrives")
            if r in seen:
                raise SpecrefError(f"cancellations[{i}] cancels request {r} again (cancellations[{seen[r]}] does)")
            seen[r] = i
        return out

    def _checked_preemptions(self) -> tuple:
        out: tuple = _tuple("preemptions", self.preemptions)
        held: dict[int, tuple[int, Preemption]] = {}  # request -> its latest preemption so far, by step
        for i, pr in sorted(enumerate(out), key=lambda e: (getattr(e[1], "step", 0), e[0])):
            if not isinstance(pr, Preemption):
                raise SpecrefTypeError(f"preemptions[{i}] must be a Preemption, got {_show(pr)}")
            r = self._request_index(f"preemptions[{i}].request", pr.request)
            where = f"preemptions[{i}].step = {pr.step}"
            if pr.step < self.arrivals[r]:
                raise SpecrefError(f"{where} is before request {r}'s arrival (arrivals[{r}] = {self.arrivals[r]})")
            cancel = self.cancel_step(r)
            if cancel is not None and pr.step >= cancel:
                raise SpecrefError(f"{where} preempts request {r} at or after its cancellation (at step {cancel})")
            if r in held and pr.step < held[r][1].resume:
                j, before = held[r]
                raise SpecrefError(f"{where} preempts request {r} while preemptions[{j}] holds it (steps "
                                   f"{before.step}..{before.resume - 1})")
            held[r] = (i, pr)
            if self.memory_budget is None:
                self._refuse_finished(where, r, pr.step, out)
        return out

    def _refuse_finished(self, where: str, r: int, step: int, preemptions) -> None:
        """SpecrefError when request ``r`` has certainly finished before ``step``: it ran at least
        ``max_new_tokens`` steps before it, each emitting at least one token (no memory budget)."""
        ran = [t for t in range(self.arrivals[r], step) if not _held(r, t, preemptions)]
        m = self.requests[r].max_new_tokens
        if len(ran) >= m:
            raise SpecrefError(f"{where} preempts request {r} after it has certainly finished: it runs at steps "
                               f"{_show(ran, 60)} before, each emitting at least one token, and max_new_tokens = {m}")

    def _check_budget(self):
        budget = self.memory_budget
        if budget is None:
            return
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise SpecrefError(f"memory_budget must be None or a positive number of KV tokens, got {_show(budget)}")
        object.__setattr__(self, "memory_budget", int(budget))
        for r, req in enumerate(self.requests):
            need = len(req.prompt) + req.max_new_tokens - 1 + self.k
            if need > budget:
                raise SpecrefError(f"memory_budget = {budget} KV tokens cannot hold request {r} alone: at its last step "
                                   f"it needs len(prompt) + max_new_tokens - 1 + k = {len(req.prompt)} + "
                                   f"{req.max_new_tokens} - 1 + {self.k} = {need}")

    # -- reading ------------------------------------------------------------

    def cancel_step(self, r: int) -> int | None:
        """The step at which request ``r`` is cancelled, or None."""
        return next((c.step for c in self.cancellations if c.request == r), None)

    def scheduled_steps(self, r: int, until: int) -> list[int]:
        """The steps before ``until`` at which request ``r`` runs unless it has finished (no memory
        budget: then a request runs at every step from its arrival on, but for its preemptions'
        steps ``step .. resume - 1``); SpecrefError with a memory budget (they depend on the others)."""
        if self.memory_budget is not None:
            raise SpecrefError(f"with memory_budget = {self.memory_budget} the steps at which a request runs depend "
                               f"on the other requests' lengths; they are not fixed by the schedule")
        return [t for t in range(self.arrivals[r], until) if not _held(r, t, self.preemptions)]

    def steps_before_cancel(self, r: int) -> int | None:
        """How many steps request ``r`` runs before its cancellation (fewer when it finishes first);
        None when it is not cancelled.  No memory budget (:meth:`scheduled_steps`)."""
        cancel = self.cancel_step(r)
        return None if cancel is None else len(self.scheduled_steps(r, cancel))


def _held(r: int, t: int, preemptions) -> bool:
    return any(p.request == r and p.step <= t < p.resume for p in preemptions)


# ---------------------------------------------------------------- the engine's operations (hooks)


def streams(rng, n: int) -> list:
    """``n`` independent generators from ``rng``: an int seed gives stream ``j`` the generator of
    ``SeedSequence(seed, spawn_key=(j,))``; a ``numpy.random.Generator`` its ``spawn(n)`` children;
    the exact enumerator is itself every stream (each of its draws is fresh)."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise SpecrefError(f"rng as an int seed must be >= 0, got {rng}")
        return [np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(rng), spawn_key=(j,))))
                for j in range(n)]
    if isinstance(rng, np.random.Generator):
        return list(rng.spawn(n))
    return [check_rng(rng)] * n


class RequestStreams:
    """(reference ``coins``) One stream per request (:func:`streams`): request ``r`` draws from stream
    ``r`` whatever slot it holds, so a request's coins never depend on the others or on the slots."""

    def __init__(self, rng, n_requests: int):
        self.streams = streams(rng, n_requests)

    def admitted(self, r: int, slot: int) -> None:
        """Request ``r`` was given ``slot`` (a stream per request does not care)."""

    def rng_for(self, r: int, slot: int):
        """The generator request ``r`` (running in ``slot``) draws from."""
        return self.streams[r]


def clear_kv(tokens: list, model: str) -> list:
    """(reference ``clear``) A slot given to a request holds no KV: ``[]`` for the target and the draft."""
    return []


def truncate(tokens: list, rejected: int, model: str) -> list:
    """(reference ``rollback``) Drop the KV of the ``rejected`` last tokens."""
    return tokens[: len(tokens) - rejected]


def prefill_emitted(request: Request, emitted: list, resample: Callable[[int], list]) -> list:
    """(reference ``refill``) A request admitted without KV feeds its prompt and every token it
    emitted: known tokens, no coins."""
    return list(request.prompt) + list(emitted)


def at_its_step(step: int, cancel_step: int) -> bool:
    """(reference ``cancelled``) A cancellation takes effect at its step: nothing runs from there on."""
    return step >= cancel_step


@dataclass(frozen=True)
class Hooks:
    """The operations of :func:`continuous_decode` that touch a request's state; the defaults are the
    reference.  Each of the zoo's schedule bugs replaces one."""

    coins: Callable = RequestStreams  # (rng, B) -> source: .rng_for(r, slot), .admitted(r, slot)
    clear: Callable = clear_kv  # (slot's KV tokens, "target" | "draft") -> KV tokens, on admission
    rollback: Callable = truncate  # (KV tokens, rejected count, "target" | "draft") -> KV tokens
    refill: Callable = prefill_emitted  # (request, emitted, resample(n)) -> tokens to feed on admission
    cancelled: Callable = at_its_step  # (step, cancellation step) -> whether the request is cancelled now


REFERENCE = Hooks()
"""The reference engine: every operation at its default."""


# ---------------------------------------------------------------- the result


@dataclass
class ContinuousResult:
    """What a continuous decode emitted, and what happened when."""

    tokens: list  # [B] lists: each request's emitted tokens (a cancelled one's: before its cancellation)
    steps: int = 0  # global steps run
    target_calls: int = 0  # one per step with a running request
    ran: list = field(default_factory=list)  # [B] lists: the steps at which each request decoded
    slots: list = field(default_factory=list)  # [B] lists: the slot it held at each of those steps
    accepted: list = field(default_factory=list)  # [B] lists: drafts accepted at each of its steps
    events: list = field(default_factory=list)  # (step, request, what) in order


# ---------------------------------------------------------------- the engine


class _Engine:
    """The state of one continuous decode: requests, slots, KV per slot and model, coins."""

    def __init__(self, schedule: Schedule, target, draft, rng, hooks: Hooks, memo: dict | None):
        B = len(schedule.requests)
        self.schedule, self.hooks, self.memo = schedule, hooks, memo
        self.models = {"target": target, "draft": draft}
        _check_vocab(target, schedule)
        self.state = ["pending"] * B  # pending, waiting, running, held, finished, cancelled
        self.slot: list[int | None] = [None] * B
        self.kv: dict[str, list[list[int]]] = {"target": [[] for _ in range(B)], "draft": [[] for _ in range(B)]}
        self.feed: dict[str, list[list[int]]] = {"target": [[] for _ in range(B)], "draft": [[] for _ in range(B)]}
        self.swapped: list = [None] * B  # a swapped request's (target KV, draft KV)
        self.resume_at: list[int | None] = [None] * B
        self.coins = hooks.coins(rng, B)
        self.out = ContinuousResult(tokens=[[] for _ in range(B)], ran=[[] for _ in range(B)],
                                    slots=[[] for _ in range(B)], accepted=[[] for _ in range(B)])

    # -- events ---------------------------------------------------------------

    def log(self, t: int, r: int, what: str) -> None:
        self.out.events.append((t, r, what))

    def free(self, r: int) -> None:
        self.slot[r] = None

    def events(self, t: int) -> None:
        """Steps 1-3 of the module docstring: cancellations, arrivals, preemptions and resumes at ``t``."""
        s = self.schedule
        for c in s.cancellations:
            if self.state[c.request] not in ("finished", "cancelled") and self.hooks.cancelled(t, c.step):
                self.free(c.request)
                self.state[c.request] = "cancelled"
                self.log(t, c.request, "cancelled")
        for r, a in enumerate(s.arrivals):
            if a == t and self.state[r] == "pending":
                self.state[r] = "waiting"
                self.log(t, r, "arrived")
        for p in s.preemptions:
            if p.step == t and self.state[p.request] in ("running", "waiting"):
                self.preempt(t, p.request, p.mode if self.state[p.request] == "running" else "recompute", p.resume)
        for r, at in enumerate(self.resume_at):
            if at == t and self.state[r] == "held":
                self.state[r], self.resume_at[r] = "waiting", None
                self.log(t, r, "resumed")

    def preempt(self, t: int, r: int, mode: str, resume: int | None) -> None:
        """Request ``r`` leaves its slot: its KV dropped (recompute) or copied to the host (swap)."""
        slot = self.slot[r]
        if mode == "swap" and slot is not None:
            self.swapped[r] = (list(self.kv["target"][slot]), list(self.kv["draft"][slot]))
        self.free(r)
        self.state[r] = "held" if resume is not None else "waiting"
        self.resume_at[r] = resume
        self.log(t, r, f"preempted ({mode})" if resume is not None else "preempted (memory budget, recompute)")

    def need(self, r: int) -> int:
        """Target KV tokens request ``r`` holds after its next target call: its tokens and K drafts."""
        return len(self.schedule.requests[r].prompt) + len(self.out.tokens[r]) + self.schedule.k

    def running(self) -> list[int]:
        return [r for r, st in enumerate(self.state) if st == "running"]

    def budget(self, t: int) -> None:
        """Step 4: preempt the last-arrived running request while the next step does not fit."""
        limit = self.schedule.memory_budget
        if limit is None:
            return
        while sum(self.need(r) for r in self.running()) > limit:
            victim = max(self.running(), key=lambda r: (self.schedule.arrivals[r], r))
            self.preempt(t, victim, "recompute", None)

    def admit(self, t: int) -> None:
        """Step 5: waiting requests in arrival order, each to the lowest free slot while it fits."""
        s, limit = self.schedule, self.schedule.memory_budget
        for r in sorted((r for r, st in enumerate(self.state) if st == "waiting"), key=lambda r: (s.arrivals[r], r)):
            if limit is not None and sum(self.need(x) for x in self.running()) + self.need(r) > limit:
                break
            used = {self.slot[x] for x in self.running()}
            slot = min(j for j in range(len(s.requests)) if j not in used)
            self.slot[r], self.state[r] = slot, "running"
            self.coins.admitted(r, slot)
            if self.swapped[r] is not None:  # swap in: the KV comes back, what was to feed is unchanged
                self.kv["target"][slot], self.kv["draft"][slot] = self.swapped[r]
                self.swapped[r] = None
            else:  # a new or recomputed request: a cleared slot, then its prompt and emitted tokens fed
                for model in ("target", "draft"):
                    self.kv[model][slot] = self.hooks.clear(self.kv[model][slot], model)
                tokens = self.hooks.refill(s.requests[r], self.out.tokens[r], lambda n, r=r: self.resample(r, n))
                self.feed["target"][r], self.feed["draft"][r] = list(tokens), list(tokens)
            self.log(t, r, f"admitted to slot {slot}")

    def resample(self, r: int, n: int) -> list[int]:
        """``n`` tokens drawn from the target after request ``r``'s prompt, with ``r``'s coins (the
        zoo's recompute bug: the engine samples instead of feeding what was emitted)."""
        req, slot = self.schedule.requests[r], self.slot[r]
        assert slot is not None  # called during admission
        drawn: list[int] = []
        for _ in range(n):
            drawn.append(draw(self.coins.rng_for(r, slot), self.rows("target", list(req.prompt) + drawn, 1, req)[0]))
        return drawn

    # -- one speculative step for every running request -------------------------

    def context(self, model: str, r: int, drafts: list[int]) -> list[int]:
        """What a model sees for request ``r``: its slot's KV tokens, the tokens to feed, the drafts."""
        slot = self.slot[r]
        assert slot is not None
        return self.kv[model][slot] + self.feed[model][r] + drafts

    def rows(self, model: str, tokens: list[int], n_rows: int, req: Request):
        """The model's processed rows for the last ``n_rows`` prefixes of ``tokens`` (memoised when asked)."""
        key = (model, tuple(tokens), n_rows, req.config)
        if self.memo is not None and key in self.memo:
            return self.memo[key]
        rows = model_rows(self.models[model], tokens, n_rows, req.config, name=model)
        if self.memo is not None:
            self.memo[key] = rows
        return rows

    def decode(self, t: int) -> None:
        """Step 6: K draft positions (one draft row per request each), one target call for all, then
        Algorithm 1 per request (:func:`specref.core.step.speculative_step`); then step 7."""
        running = []
        for r in self.running():
            slot = self.slot[r]
            assert slot is not None  # a running request holds a slot
            running.append((r, slot, self.coins.rng_for(r, slot)))
        if not running:
            return
        K, reqs = self.schedule.k, self.schedule.requests
        drafts: dict[int, list[int]] = {r: [] for r, _, _ in running}
        q: dict[int, list] = {r: [] for r, _, _ in running}
        for _ in range(K):  # position j: every request's draft row, then its draft x_j ~ q_j
            for r, _, rng in running:
                q_j = self.rows("draft", self.context("draft", r, drafts[r]), 1, reqs[r])[0]
                q[r].append(q_j)
                drafts[r].append(draw(rng, q_j))
        p = {r: self.rows("target", self.context("target", r, drafts[r]), K + 1, reqs[r])
             for r, _, _ in running}  # [K+1, V] each: one target call scores every request's K+1 prefixes
        self.out.target_calls += 1
        for r, slot, rng in running:  # Algorithm 1, request by request, each with its own coins
            p_r, q_r = same_kind(p[r], np.stack(q[r]))
            emitted = speculative_step(p_r, q_r, drafts[r], rng, check=False)
            self.commit(t, r, slot, drafts[r], len(emitted) - 1, emitted)

    def commit(self, t: int, r: int, slot: int, drafts: list[int], n: int, emitted: list[int]) -> None:
        """Keep request ``r``'s block (to ``max_new_tokens``, through a stop token) and roll its KV back."""
        K, req, out = self.schedule.k, self.schedule.requests[r], self.out
        out.ran[r].append(t)
        out.slots[r].append(slot)
        out.accepted[r].append(n)
        tokens = out.tokens[r]
        for x in emitted:
            if len(tokens) >= req.max_new_tokens:
                break
            tokens.append(x)
            if x in req.stop_tokens:
                break
        if len(tokens) >= req.max_new_tokens or (tokens and tokens[-1] in req.stop_tokens):
            self.free(r)
            self.state[r] = "finished"
            self.log(t, r, "finished")
            return
        hooks = self.hooks
        # the target call wrote KV for everything it was fed; keep the accepted prefix
        self.kv["target"][slot] = hooks.rollback(self.kv["target"][slot] + self.feed["target"][r] + drafts,
                                                 K - n, "target")
        self.feed["target"][r] = [emitted[-1]]
        self.kv["draft"][slot] = hooks.rollback(self.kv["draft"][slot] + self.feed["draft"][r] + drafts[:-1],
                                                max(0, K - 1 - n), "draft")
        self.feed["draft"][r] = [drafts[-1], emitted[-1]] if n == K else [emitted[-1]]

    def done(self) -> bool:
        return all(st in ("finished", "cancelled") for st in self.state)


def _check_vocab(target, schedule: Schedule) -> int:
    """The target's vocabulary size (declared, or read off one row); every token id is checked against it."""
    V = getattr(target, "vocab_size", None)
    if V is None:
        first = schedule.requests[0]
        V = next_token_probs(target, list(first.prompt), SamplingConfig(), name="target").shape[-1]
    for r, req in enumerate(schedule.requests):
        check_tokens(f"requests[{r}].prompt", req.prompt, V)
        check_tokens(f"requests[{r}].stop_tokens", req.stop_tokens, V)
    return int(V)


def continuous_decode(schedule: Schedule, target, draft, rng, *, hooks: Hooks = REFERENCE,
                      memo: dict | None = None) -> ContinuousResult:
    """Speculative decoding of every request of ``schedule`` under continuous batching (module docstring).

    ``target``, ``draft``: specref models (:func:`specref.decoding.chain.model_rows`: a callable
    returning logits for every position, or an object with ``probs``; Fraction rows make the law
    exact).  ``rng``: an int seed, a ``numpy.random.Generator`` or the exact enumerator's generator;
    each request draws from a stream of its own.  ``hooks``: the engine's operations (the zoo's bugs
    replace one).  ``memo``: a dict, held by the caller across runs with the same ``target`` and
    ``draft``, in which every processed row is kept by (model, tokens, config) and computed once --
    right for the exact enumerator, which runs the decode once per path of its coins (as
    :func:`specref.decoding.chain.speculative_transition`'s ``memo``); None computes every row.
    Returns each request's tokens and what happened when.
    """
    if not isinstance(schedule, Schedule):
        raise SpecrefTypeError(f"schedule must be a Schedule, got {_show(schedule)}")
    if not isinstance(hooks, Hooks):
        raise SpecrefTypeError(f"hooks must be a Hooks, got {_show(hooks)}")
    engine = _Engine(schedule, target, draft, rng, hooks, memo)
    last_event = max([*schedule.arrivals, *(p.resume for p in schedule.preemptions),
                      *(c.step for c in schedule.cancellations)])
    limit = last_event + 2 + sum(req.max_new_tokens for req in schedule.requests) * (1 + len(schedule.requests))
    t = 0
    while not engine.done():
        if t > limit:  # cannot happen with a valid schedule: every request fits the budget alone
            raise SpecrefError(f"the schedule did not end within {limit} steps (states {engine.state})")
        engine.events(t)
        engine.budget(t)
        engine.admit(t)
        engine.decode(t)
        t += 1
    engine.out.steps = t
    return engine.out

