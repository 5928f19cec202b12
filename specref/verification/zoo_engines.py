"""Engine-shaped wrong implementations: bugs that batched serving verifiers shipped (SPEC §7).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  Every entry is written in
a batched signature of :mod:`specref.verification.batched` and shares one loop,
:func:`_chain`, so that each bug is the one argument that differs:

- level ``"batched"``: ``fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)``;
- level ``"draft_and_verify"``: ``fn(p_target [B, K+1, V], q_draft [B, K, V], seed)``: the
  implementation draws its drafts, so couplings between its random streams are in scope.

``seed`` is an int (statistical mode) or the exact enumerator's generator (exact mode); every
draw is a comparison of a coin with thresholds, so both modes run the same code.

====================  ================  =====  =====================================================
name                  level             shows  what is wrong (the engine bug it stands for)
====================  ================  =====  =====================================================
shared_noise_stream   draft_and_verify  both   one coin per position draws the draft, tests it and
                                               draws the recovery (one Philox key for three streams)
coin_reused           draft_and_verify  both   the acceptance coin is the residual's inverse-CDF
                                               threshold (it is then U(ratio, 1), not U(0, 1))
inclusive_zero_coin   draft_and_verify  exact  ``u <= p/q`` with coins in [0, 1): u = 0 accepts a
                                               p = 0 draft (grid coins: an exact 2^-24 branch)
dirty_scratch         draft_and_verify  both   the residual subtracts a scratch row that still holds
                                               the previous position's draft row
placeholder_indexed   batched           both   -1 placeholder drafts of ragged rows are indexed
                                               (``p[-1]``) and judged like real drafts
out_of_vocab_id       draft_and_verify  exact  coins in (0, 1] and a strict ``u q < p`` reject a
                                               p = q draft at u = 1; the all-zero residual's tiled
                                               argmax returns a padded lane id >= V
row_position_noise    draft_and_verify  both   rows 2j and 2j+1 draw the same coins (the stream is
                                               keyed by row // 2: batch-composition randomness)
cross_row_residual    draft_and_verify  both   the residual of row b subtracts row b-1's draft row
engine_reference      both              both   (correct) the chain rule, row by row
====================  ================  =====  =====================================================

"exact" in the shows column: the bug's TV is below 1e-6 (it lives on a set of coins of
probability 2^-24), so only exact mode with grid coins (``BatchedCase.grid = 24``) or an invalid
output shows it; "both": exact mode, and statistical mode where the bug moves the low-dimensional
statistics.  On ``large_vocab_case(V=32000, K=5)`` at N = 3,000 per row every "both" entry is
flagged (``benchmarks/bench_batched.py``); ``cross_row_residual``'s TV there (0.0146) lies in which
tail tokens the residual favours, so only the residual-support statistic (draws outside
``max(0, p - q)``'s support) sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.decoding.batched import PLACEHOLDER

__all__ = ["EngineZooEntry", "entries", "engine_reference", "engine_reference_batched",
           "shared_noise_stream", "coin_reused", "inclusive_zero_coin", "dirty_scratch",
           "placeholder_indexed", "out_of_vocab_id", "row_position_noise", "cross_row_residual"]

_TILE = 8  # lanes of the emulated tiled argmax (V is padded up to a multiple of this)


def _host(rows):
    """Host rows: Fraction rows as they are, float rows as float64 renormalised.  # [B, R, V]"""
    if rows is None:
        return None
    h = to_numpy(rows)
    if h.dtype == object:
        return h
    h = h.astype(np.float64)
    return h / h.sum(axis=2, keepdims=True)


def _rng(seed):
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return np.random.default_rng(int(seed))
    return seed


def _cat(rows, u):
    """Inverse-CDF draw by comparison, ``#{j : cdf_j / total <= u}``.  # [B, V], [B] -> [B]"""
    cdf = np.cumsum(rows, axis=1)
    return ((cdf / cdf[:, -1:]) <= u[:, None]).sum(axis=1).astype(np.int64)


def _chain(p_target, q_draft, seed, draft_tokens=None, *, shared_coin=False, reuse_coin=False,
           inclusive=False, scratch=False, index_placeholders=False, one_minus_coin=False,
           coin_rows=None, residual_row=None):
    """The chain rule over B rows, with one switch per bug (all off: correct).

    Coins, in order: drafts [R, K] (when drawn here), acceptance [R, K], final [R], with
    ``R = B`` rows of coins (``coin_rows`` maps each row to its coin row).
    """
    p, q = _host(p_target), _host(q_draft)
    rng = _rng(seed)
    B, K1, V = p.shape
    K = K1 - 1
    zero = p[0, 0, 0] * 0
    rowmap = np.arange(B) if coin_rows is None else coin_rows(B)
    R = int(rowmap.max()) + 1
    rows = np.arange(B)
    if draft_tokens is None:  # draw the drafts: x[b, i] ~ q[b, i]
        u_draft = rng.random((R, K))[rowmap]
        x = np.stack([_cat(q[:, i, :], u_draft[:, i]) for i in range(K)], axis=1) if K else np.zeros((B, 0), int)
        k = np.full(B, K)
    else:
        x = to_numpy(draft_tokens).astype(np.int64)
        pad = x == PLACEHOLDER
        k = np.where(pad.any(axis=1), pad.argmax(axis=1), K)
        u_draft = None
    u_acc = u_draft if shared_coin else rng.random((R, K))[rowmap]
    u_fin = rng.random((R,))[rowmap]
    n = np.zeros(B, dtype=np.int64)
    alive = np.ones(B, dtype=bool)
    for i in range(K):
        live = alive if index_placeholders else alive & (i < k)
        xi = x[:, i]  # a placeholder -1 indexes the last column when live
        px = p[rows, i, xi]
        if q is None:
            ratio = px
        elif p.dtype == object:
            ratio = np.array([a / b if b > 0 else a * 0 + 2 for a, b in zip(px, q[rows, i, xi])], dtype=object)
        else:  # a zero draft lane (a placeholder's) counts as always accepted
            qx = q[rows, i, xi]
            ratio = np.where(qx > 0, px / np.where(qx > 0, qx, 1.0), 2.0)
        if u_acc.dtype != object:  # float coins: one vectorised comparison
            u = u_acc[:, i]
            test = live & ((u <= ratio) if inclusive else (u > 1 - ratio) if one_minus_coin else (u < ratio))
        else:
            test = np.zeros(B, dtype=bool)
            for b in np.flatnonzero(live):  # lazy coins: only live rows spend a comparison
                u = u_acc[b, i]
                test[b] = (u <= ratio[b]) if inclusive else (u > 1 - ratio[b]) if one_minus_coin else (u < ratio[b])
        alive = live & test
        n = n + alive
    limit = K if index_placeholders else k
    rejected = n < limit
    at = np.minimum(n, max(K - 1, 0))
    p_n = p[rows, n]  # [B, V]
    if K:
        if q is None:
            hit = np.arange(V)[None, :] == x[rows, at][:, None]
            diff = np.where(hit, zero, p_n)
        else:
            sub = q[rows if residual_row is None else residual_row(B), at]
            if scratch:  # the scratch row still holds the previous position's draft row
                sub = sub + np.where((at > 0)[:, None], q[rows, np.maximum(at - 1, 0)], zero)
            diff = p_n - sub
            diff = np.where(diff > zero, diff, zero)
        mass = diff.sum(axis=1)
        final = np.where((rejected & (mass > zero))[:, None], diff, p_n)
    else:
        mass, final = np.ones(B), p_n
    coin = u_fin.copy()
    if reuse_coin or shared_coin:
        src = u_acc if reuse_coin else u_draft
        for b in np.flatnonzero(rejected):
            coin[b] = src[b, at[b]]
    y = _cat(final, coin)
    if one_minus_coin:  # a tiled argmax over an all-zero residual: a padded lane wins the tie
        y = np.where(rejected & ~(mass > zero), -(-V // _TILE) * _TILE - 1, y)  # the last lane of the padded tile
    out = np.full((B, K1), PLACEHOLDER, dtype=np.int64)
    for j in range(K1):
        out[:, j] = np.where(n > j, x[:, j] if j < K else PLACEHOLDER, np.where(n == j, y, PLACEHOLDER))
    return out


# ---------------------------------------------------------------- the entries


def engine_reference(p_target, q_draft, seed):
    """(correct) Draws drafts from q, then the chain rule; three separate coin streams."""
    return _chain(p_target, q_draft, seed)


def engine_reference_batched(p_target, q_draft, draft_tokens, seed):
    """(correct) The chain rule on the oracle's drafts; ragged rows end at their first -1."""
    return _chain(p_target, q_draft, seed, draft_tokens)


def shared_noise_stream(p_target, q_draft, seed):
    """One coin per position draws the draft, tests it and draws the recovery."""
    return _chain(p_target, q_draft, seed, shared_coin=True)


def coin_reused(p_target, q_draft, seed):
    """The rejected position's acceptance coin is the residual's inverse-CDF threshold."""
    return _chain(p_target, q_draft, seed, reuse_coin=True)


def inclusive_zero_coin(p_target, q_draft, seed):
    """Accept iff ``u <= p/q`` with ``u`` in [0, 1): u = 0 accepts a draft with p = 0."""
    return _chain(p_target, q_draft, seed, inclusive=True)


def dirty_scratch(p_target, q_draft, seed):
    """The residual subtracts a scratch row left holding the previous position's draft row."""
    return _chain(p_target, q_draft, seed, scratch=True)


def placeholder_indexed(p_target, q_draft, draft_tokens, seed):
    """Placeholder (-1) drafts of ragged rows are indexed and judged like real drafts."""
    return _chain(p_target, q_draft, seed, draft_tokens, index_placeholders=True)


def out_of_vocab_id(p_target, q_draft, seed):
    """Coins in (0, 1] with a strict ``u q < p``; an all-zero residual's tiled argmax returns id >= V."""
    return _chain(p_target, q_draft, seed, one_minus_coin=True)


def row_position_noise(p_target, q_draft, seed):
    """Rows 2j and 2j+1 draw identical coins: the stream is keyed by row // 2."""
    return _chain(p_target, q_draft, seed, coin_rows=lambda B: np.arange(B) // 2)


def cross_row_residual(p_target, q_draft, seed):
    """Row b's residual subtracts row b-1's draft row (row 0 its own)."""
    return _chain(p_target, q_draft, seed, residual_row=lambda B: np.maximum(np.arange(B) - 1, 0))


@dataclass(frozen=True)
class EngineZooEntry:
    """One engine-shaped implementation: its level, kind, and where its bug shows."""

    name: str
    level: str  # "batched" or "draft_and_verify"
    fn: Callable
    kind: str  # "wrong" or "correct"
    shows: str  # "exact" (TV < 1e-6: grid coins or an invalid output) or "both"
    description: str

    def __str__(self):
        return f"{self.name:<22} {self.level:<17} {self.kind:<8} {self.shows:<6} {self.description}"


def entries(kind: str | None = None) -> list:
    """Every engine-shaped entry (``kind``: "wrong", "correct" or None for all)."""
    all_ = [
        EngineZooEntry("engine_reference", "draft_and_verify", engine_reference, "correct", "both",
                       engine_reference.__doc__.split(") ", 1)[1]),
        EngineZooEntry("engine_reference_batched", "batched", engine_reference_batched, "correct", "both",
                       engine_reference_batched.__doc__.split(") ", 1)[1]),
    ] + [
        EngineZooEntry(fn.__name__, level, fn, "wrong", shows, fn.__doc__.strip())
        for fn, level, shows in [
            (shared_noise_stream, "draft_and_verify", "both"),
            (coin_reused, "draft_and_verify", "both"),
            (inclusive_zero_coin, "draft_and_verify", "exact"),
            (dirty_scratch, "draft_and_verify", "both"),
            (placeholder_indexed, "batched", "both"),
            (out_of_vocab_id, "draft_and_verify", "exact"),
            (row_position_noise, "draft_and_verify", "both"),
            (cross_row_residual, "draft_and_verify", "both"),
        ]
    ]
    if kind is not None and kind not in ("wrong", "correct"):
        raise SpecrefError(f"kind must be 'wrong', 'correct' or None, got {kind!r}")
    return [e for e in all_ if kind is None or e.kind == kind]

