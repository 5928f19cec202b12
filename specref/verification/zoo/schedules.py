"""Wrong continuous-batching engines: bugs in what arrivals, cancellations and preemptions do (SPEC §17.4).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  Every entry is written at the
``schedules`` level, ``fn(schedule, target, draft, rng) -> [tokens of each request]``, and runs the
reference engine :func:`specref.decoding.continuous.continuous_decode` with one of its operations
(:class:`~specref.decoding.continuous.Hooks`) replaced, so that the bug is the one thing that
differs.  ``rng`` is the exact enumerator or an int seed (per-request streams, or the bug's own).

=====================  ==============================================================  =================
name                   what is wrong (the operation it replaces)                       the law it breaks
=====================  ==============================================================  =================
kv_not_rolled_back     ``rollback``: the target KV keeps the rejected drafts           the target law
refeeds_on_resume      ``refill``: a recomputed request feeds its last token twice     the target law
stale_target_slot      ``clear``: a reused slot keeps its last occupant's target KV    the target law
stale_draft_slot       ``clear``: a reused slot keeps its last occupant's draft KV     cancelled (only)
coins_by_slot          ``coins``: a slot's coin stream restarts when it is reassigned  independence
resample_on_recompute  ``refill``: recompute samples the emitted tokens again          the target law
cancel_one_step_late   ``cancelled``: a cancelled request runs one more step           cancelled
schedule_reference     (correct) every operation the reference's                       --
=====================  ==============================================================  =================

``stale_draft_slot`` changes only the draft rows, and speculative decoding is lossless for any
draft: every finishing request keeps the target law exactly (TV 0 on Fraction rows).  The draft
moves how many tokens a step emits, so the law of a cancelled request -- the tokens of a fixed
number of steps -- shows it.  ``coins_by_slot`` gives a request that takes over a slot the coins its
last occupant drew: each request's own law can stay exact while the joint law is not the product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.draws import categorical
from specref.core.errors import SpecrefError
from specref.decoding.continuous import Hooks, Request, continuous_decode, streams

__all__ = ["ScheduleZooEntry", "entries", "HOOKS", "SlotTapes", "schedule_reference", "kv_not_rolled_back", "refeeds_on_resume",
           "stale_target_slot", "stale_draft_slot", "coins_by_slot", "resample_on_recompute", "cancel_one_step_late"]


# ---------------------------------------------------------------- the bugs, one operation each


def target_not_rolled_back(tokens: list, rejected: int, model: str) -> list:
    """(kv_not_rolled_back's rollback) The draft KV is rolled back, the target KV keeps every draft."""
    return tokens if model == "target" else tokens[: len(tokens) - rejected]


def last_token_twice(request: Request, emitted: list, resample: Callable) -> list:
    """(refeeds_on_resume's refill) A recompute prefills every emitted token and feeds the last one,
    which was still to feed when the request was preempted, once more on top."""
    tokens = list(request.prompt) + list(emitted)
    return tokens + tokens[-1:] if emitted else tokens


def keeps_target_kv(tokens: list, model: str) -> list:
    """(stale_target_slot's clear) The target KV of a reused slot is not cleared."""
    return tokens if model == "target" else []


def keeps_draft_kv(tokens: list, model: str) -> list:
    """(stale_draft_slot's clear) The draft KV of a reused slot is not cleared."""
    return tokens if model == "draft" else []


class SlotTapes:
    """(coins_by_slot's coins) One coin tape per slot, read from its start again when the slot is
    given to a request: a stream keyed by the slot and restarted on reassignment.  Its coins come
    from :func:`~specref.decoding.continuous.streams` (one per slot); a categorical draw takes one
    coin and locates it in the row's CDF by comparison."""

    def __init__(self, rng, n_slots: int):
        self.streams = streams(rng, n_slots)
        self.tapes: list[list] = [[] for _ in range(n_slots)]
        self.read = [0] * n_slots

    def admitted(self, r: int, slot: int) -> None:
        self.read[slot] = 0  # the bug: the slot's coins start over for its new request

    def rng_for(self, r: int, slot: int) -> "_Tape":
        return _Tape(self, slot)

    def coin(self, slot: int):
        tape, i = self.tapes[slot], self.read[slot]
        if i == len(tape):
            tape.append(self.streams[slot].random())
        self.read[slot] = i + 1
        return tape[i]


class _Tape:
    """A slot's tape as a generator: ``random()`` and ``choice(n, p=row)``."""

    def __init__(self, tapes: SlotTapes, slot: int):
        self.tapes, self.slot = tapes, slot

    def random(self):
        return self.tapes.coin(self.slot)

    def choice(self, n: int, p):
        u = np.empty(1, dtype=object)
        u[0] = self.random()
        return int(categorical(np.asarray(p)[None, :], u, xp=np)[0])


def resampled(request: Request, emitted: list, resample: Callable) -> list:
    """(resample_on_recompute's refill) The KV is rebuilt by sampling the emitted positions again from
    the target (with the request's coins); the request keeps the tokens it emitted, but goes on
    from the resampled ones."""
    return list(request.prompt) + resample(len(emitted))


def one_step_late(step: int, cancel_step: int) -> bool:
    """(cancel_one_step_late's cancelled) The cancellation is applied after the step it arrives in."""
    return step > cancel_step


HOOKS = {
    "schedule_reference": Hooks(),
    "kv_not_rolled_back": Hooks(rollback=target_not_rolled_back),
    "refeeds_on_resume": Hooks(refill=last_token_twice),
    "stale_target_slot": Hooks(clear=keeps_target_kv),
    "stale_draft_slot": Hooks(clear=keeps_draft_kv),
    "coins_by_slot": Hooks(coins=SlotTapes),
    "resample_on_recompute": Hooks(refill=resampled),
    "cancel_one_step_late": Hooks(cancelled=one_step_late),
}
"""Every entry's operations, by name: the reference's, or the reference's with its bug's replaced."""


# ---------------------------------------------------------------- the entries


def _run(name: str, schedule, target, draft, rng) -> list:
    return continuous_decode(schedule, target, draft, rng, hooks=HOOKS[name]).tokens


def schedule_reference(schedule, target, draft, rng):
    """(correct) The reference engine: every operation its own."""
    return _run("schedule_reference", schedule, target, draft, rng)


def kv_not_rolled_back(schedule, target, draft, rng):
    """After a rejection the target KV keeps the rejected drafts: the next step reads them."""
    return _run("kv_not_rolled_back", schedule, target, draft, rng)


def refeeds_on_resume(schedule, target, draft, rng):
    """A request resumed by recompute feeds its last emitted token twice."""
    return _run("refeeds_on_resume", schedule, target, draft, rng)


def stale_target_slot(schedule, target, draft, rng):
    """A slot given to a new or recomputed request keeps its last occupant's target KV."""
    return _run("stale_target_slot", schedule, target, draft, rng)


def stale_draft_slot(schedule, target, draft, rng):
    """A slot given to a new or recomputed request keeps its last occupant's draft KV."""
    return _run("stale_draft_slot", schedule, target, draft, rng)


def coins_by_slot(schedule, target, draft, rng):
    """Coins come from a stream per slot, restarted when the slot is reassigned: a request reuses the
    coins of the slot's last occupant."""
    return _run("coins_by_slot", schedule, target, draft, rng)


def resample_on_recompute(schedule, target, draft, rng):
    """Recompute samples the preempted request's emitted tokens again instead of feeding them."""
    return _run("resample_on_recompute", schedule, target, draft, rng)


def cancel_one_step_late(schedule, target, draft, rng):
    """A cancellation takes effect one step late: the request emits one more block."""
    return _run("cancel_one_step_late", schedule, target, draft, rng)


@dataclass(frozen=True)
class ScheduleZooEntry:
    """One continuous-batching engine: its level, kind, and the law that catches it."""

    name: str
    level: str  # "schedules"
    fn: Callable
    kind: str  # "wrong" or "correct"
    breaks: str  # "target law", "cancelled law", "independence", or "-" (correct)
    description: str

    def __str__(self):
        return f"{self.name:<22} {self.level:<10} {self.kind:<8} {self.breaks:<14} {self.description}"


def entries(kind: str | None = None) -> list:
    """Every continuous-batching entry (``kind``: "wrong", "correct" or None for all)."""
    if kind is not None and kind not in ("wrong", "correct"):
        raise SpecrefError(f"kind must be 'wrong', 'correct' or None, got {kind!r}")
    wrong = [(kv_not_rolled_back, "target law"), (refeeds_on_resume, "target law"), (stale_target_slot, "target law"),
             (stale_draft_slot, "cancelled law"), (coins_by_slot, "independence"),
             (resample_on_recompute, "target law"), (cancel_one_step_late, "cancelled law")]
    all_ = [ScheduleZooEntry("schedule_reference", "schedules", schedule_reference, "correct", "-",
                             (schedule_reference.__doc__ or "").split(") ", 1)[1])]
    all_ += [ScheduleZooEntry(fn.__name__, "schedules", fn, "wrong", breaks, " ".join((fn.__doc__ or "").split()))
             for fn, breaks in wrong]
    return [e for e in all_ if kind is None or e.kind == kind]

