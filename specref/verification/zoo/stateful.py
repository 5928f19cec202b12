"""Wrong implementations that keep state from one call to the next (SPEC §13.5, the state check).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  Each entry is right on any one
case on its own -- every call of one case sees the same rows, so what it kept from an earlier call
of that case is still right -- and wrong on a case that comes after another case of the same
shapes, because what it keeps is invalidated only when the shapes change (the buffer is
reallocated), never when the contents do.  A check that judges each case once, in list order,
passes them whenever no two cases of the same shapes come one after the other; the runner's
state check (:func:`specref.verification.levels.runner.run_cases`) reports them ``stateful``.

Each entry is a class: :meth:`StatefulEntry.make` builds a fresh implementation (its own state),
so two checks never share what one of them kept.

=======================  ========  ========================================================
name                     level     what it keeps
=======================  ========  ========================================================
stale_correction_memo    step      correction rows memoised by the draft tokens, cleared only
                                   when the rows' shape changes: the rows of the case before
stale_draft_buffer       batched   a "device" copy of ``q_draft`` refreshed only when its
                                   shape changes: the rows of the case before
stale_prefix_cache       tree      target rows cached by each node's drafted tokens, cleared
                                   only when ``p_target``'s shape changes: a prefix cache
                                   that ignores the prompt and the model
=======================  ========  ========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.draws import coerce_rng, draw
from specref.core.errors import SpecrefError
from specref.core.step import correction_row
from specref.core.tree_verify import pointmass_verify
from specref.verification.zoo.engines import engine_reference_batched

__all__ = ["StatefulEntry", "entries", "StaleCorrectionMemo", "StaleDraftBuffer", "StalePrefixCache"]


class StaleCorrectionMemo:
    """Step level: ``fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> tokens``.

    The chain rule, with the correction rows ``norm(max(0, p_i - q_i))`` of every position
    memoised by the draft tokens -- within one case the tokens fix the rows, since row ``i``
    follows the prompt and ``x_<i`` -- and the memo cleared only when the rows' shape or dtype
    changes: a later case of the same shapes draws its corrections from the case before.
    ``rng``: a generator, the exact enumerator, or an int seed.
    """

    def __init__(self):
        self.kind, self.corrections = None, {}  # (shape, dtype) the memo holds; draft tokens -> K rows

    def __call__(self, p_target, q_draft, draft_tokens, rng):
        rng = coerce_rng(rng)
        p, q = np.asarray(p_target), np.asarray(q_draft)  # [K+1, V], [K, V]
        K = q.shape[0]
        if (q.shape, q.dtype) != self.kind:
            self.kind, self.corrections = (q.shape, q.dtype), {}  # the only invalidation: a new shape
        drafts = tuple(int(x) for x in draft_tokens)
        if drafts not in self.corrections:  # the bug: the key leaves out the rows themselves
            self.corrections[drafts] = [correction_row(p[i], q[i]) for i in range(K)]
        out = []
        for i, x in enumerate(drafts):
            if rng.random() < p[i, x] / q[i, x]:  # accept with probability min(1, p/q); q(x) > 0 as x ~ q
                out.append(x)
                continue
            return out + [draw(rng, self.corrections[drafts][i])]
        return out + [draw(rng, p[K])]  # every draft accepted: the bonus from p_target[K]


class StaleDraftBuffer:
    """Batched level: ``fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)``.

    The engine reference (:func:`~specref.verification.zoo.engines.engine_reference_batched`)
    reading ``q_draft`` from a buffer of its own that is filled only when it is (re)allocated, for
    a new shape or dtype: a later case of the same shapes is judged against the draft rows of the
    case before.  Point-mass calls (``q_draft`` None) do not touch it.
    """

    def __init__(self):
        self.buffer = None  # [B, K, V], kept between calls

    def __call__(self, p_target, q_draft, draft_tokens, seed):
        if q_draft is not None:
            q = np.asarray(q_draft)
            if self.buffer is None or self.buffer.shape != q.shape or self.buffer.dtype != q.dtype:
                self.buffer = q.copy()  # the bug: copied in on allocation only
            q_draft = self.buffer
        return engine_reference_batched(p_target, q_draft, draft_tokens, seed)


class StalePrefixCache:
    """Tree level (top-k trees): ``fn(tree, p_target [N, V], q_draft None, rng) -> (path, next_token)``.

    Point-mass verification (:func:`~specref.core.tree_verify.pointmass_verify`) on target rows
    looked up in a cache keyed by each node's drafted tokens from the root, filled from
    ``p_target`` on a miss and cleared only when ``p_target``'s shape changes: the key leaves out
    the prompt and the model, so a later tree of the same shape reuses the rows of the case before.
    """

    def __init__(self):
        self.shape, self.rows = None, {}  # the shape the cache was built for; drafted tokens -> row

    def __call__(self, tree, p_target, q_draft, rng):
        p = np.asarray(p_target)
        if p.shape != self.shape:
            self.shape, self.rows = p.shape, {}  # the only invalidation: a new shape
        prefixes = [()] * len(tree.tokens)
        for node in range(1, len(tree.tokens)):  # parents come before their children
            prefixes[node] = prefixes[tree.parents[node]] + (tree.tokens[node],)
        cached = np.array([self.rows.setdefault(prefixes[n], p[n].copy()) for n in range(len(prefixes))])
        return pointmass_verify(tree, cached, q_draft, coerce_rng(rng))


@dataclass(frozen=True)
class StatefulEntry:
    """One state-keeping implementation: ``make()`` builds a fresh one (nothing kept yet)."""

    name: str
    level: str  # the oracle level it is written at
    make: Callable[[], Callable]
    description: str

    def __str__(self):
        return f"{self.name:<24} {self.level:<8} {self.description}"


def entries(level: str | None = None) -> list:
    """Every state-keeping entry (``level``: "step", "batched", "tree", or None for all)."""
    all_ = [
        StatefulEntry("stale_correction_memo", "step", StaleCorrectionMemo,
                      "correction rows memoised by the draft tokens, cleared only on a new shape"),
        StatefulEntry("stale_draft_buffer", "batched", StaleDraftBuffer,
                      "q_draft copied into its buffer only when the buffer is reallocated"),
        StatefulEntry("stale_prefix_cache", "tree", StalePrefixCache,
                      "target rows cached by drafted tokens, cleared only on a new p_target shape"),
    ]
    if level is not None and level not in {e.level for e in all_}:
        raise SpecrefError(f"level must be 'step', 'batched', 'tree' or None, got {level!r}")
    return [e for e in all_ if level is None or e.level == level]
