"""Engine-shaped wrong implementations: bugs that batched serving verifiers shipped (SPEC §7).

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  Every entry is written in
a batched signature of :mod:`specref.verification.levels.batched.steps` and runs one engine-shaped
loop, :func:`_engine`, with named hook points (:class:`Hooks`: the coin source, the draft count,
the accept comparison, the scratch row the residual subtracts, the last draw); each bug is a small
function that replaces the reference's function at its hook (:data:`HOOKS`), so that it is the one
thing that differs (``out_of_vocab_id`` is two defects that show only together: two hooks):

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

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from specref.core.backend import host_rows, to_numpy
from specref.core.draws import categorical, coerce_rng
from specref.core.errors import SpecrefError
from specref.decoding.batched import PLACEHOLDER

__all__ = ["EngineZooEntry", "entries", "Hooks", "Coins", "REFERENCE", "HOOKS", "engine_reference", "engine_reference_batched",
           "shared_noise_stream", "coin_reused", "inclusive_zero_coin", "dirty_scratch",
           "placeholder_indexed", "out_of_vocab_id", "row_position_noise", "cross_row_residual"]

_TILE = 8  # lanes of the emulated tiled argmax (V is padded up to a multiple of this)


@dataclass(frozen=True)
class Coins:
    """The coins of one call, one row of coins per batch row (object arrays of lazy uniforms in
    exact mode).  A rejected row's final draw reads ``final[b]``, or ``recovery[b, i]`` when the
    coin source hands ``recovery`` (the coin of its rejected position ``i``)."""

    draft: np.ndarray | None  # [B, K] draft coins; None when the oracle hands the drafts over
    accept: np.ndarray  # [B, K] acceptance coins
    final: np.ndarray  # [B] coins of the residual or bonus draw
    recovery: np.ndarray | None = None  # [B, K] or None: where a rejected row's final coin comes from


def _coins_by_row(rng, coin_rows, K, draws_drafts) -> Coins:
    """Coins in order drafts [R, K] (when drawn here), acceptance [R, K], final [R]; batch row
    ``b`` reads coin row ``coin_rows[b]`` (``R = max(coin_rows) + 1``)."""
    R = int(coin_rows.max()) + 1
    draft = rng.random((R, K))[coin_rows] if draws_drafts else None
    accept = rng.random((R, K))[coin_rows]
    final = rng.random((R,))[coin_rows]
    return Coins(draft, accept, final)


def separate_streams(rng, B, K, draws_drafts) -> Coins:
    """(reference coin source) Three separate streams, one row of coins per batch row."""
    return _coins_by_row(rng, np.arange(B), K, draws_drafts)


def first_placeholder(x, K) -> np.ndarray:
    """(reference draft count) Row ``b`` has the drafts before its first -1 placeholder.  # [B, K] -> [B]"""
    pad = x == PLACEHOLDER
    return np.where(pad.any(axis=1), pad.argmax(axis=1), K)


def strict_below(u, ratio):
    """(reference accept comparison) Accept iff ``u < p/q`` (``u`` in [0, 1))."""
    return u < ratio


def own_draft_row(q, rows, at, zero):
    """(reference scratch row) The residual of row ``b`` subtracts ``q[b, at_b]``.  # -> [B, V]"""
    return q[rows, at]


def inverse_cdf(final, coin, rejected, mass, zero, V):
    """(reference residual and bonus draw) Inverse CDF by comparison: ``#{j : cdf_j / total <= u}``."""
    return categorical(final, coin, xp=np)


@dataclass(frozen=True)
class Hooks:
    """The named points of :func:`_engine` where an engine can differ; the defaults are the reference.

    Each wrong entry replaces the hooks its bug lives in and nothing else.
    """

    coins: Callable = separate_streams  # (rng, B, K, draws_drafts) -> Coins: the coin source
    drafts: Callable = first_placeholder  # (x [B, K], K) -> k [B]: how many of the oracle's drafts a row judges
    accepts: Callable = strict_below  # (u, ratio) -> bool: the accept comparison (scalars or arrays)
    scratch: Callable = own_draft_row  # (q, rows, at, zero) -> [B, V]: the row the residual subtracts
    sample: Callable = inverse_cdf  # (final [B, V], coin [B], rejected, mass, zero, V) -> y [B]: the last draw


REFERENCE = Hooks()
"""The reference engine: every hook at its default."""


def _engine(p_target, q_draft, seed, draft_tokens=None, hooks: Hooks = REFERENCE):
    """The chain rule over B rows, an engine-shaped loop with :class:`Hooks` (the defaults: correct).

    Coins, in order (the coin source): drafts [B, K] (when drawn here), acceptance [B, K], final [B].
    """
    p, q = host_rows(p_target), None if q_draft is None else host_rows(q_draft)
    B, K1, V = p.shape
    K = K1 - 1
    zero = p[0, 0, 0] * 0
    coins = hooks.coins(coerce_rng(seed), B, K, draft_tokens is None)
    if draft_tokens is None:  # draw the drafts: x[b, i] ~ q[b, i]
        x, k = _draw_drafts(q, coins.draft, B, K), np.full(B, K)
    else:
        x = to_numpy(draft_tokens).astype(np.int64)
        k = hooks.drafts(x, K)
    n = _accepted(p, q, x, k, coins.accept, hooks.accepts)
    rejected = n < k
    at = np.minimum(n, max(K - 1, 0))
    final, mass = _final_rows(p, q, x, n, at, rejected, zero, hooks.scratch)
    y = hooks.sample(final, _final_coins(coins, rejected, at), rejected, mass, zero, V)
    return _write(n, x, y, K1)


def _draw_drafts(q, u, B, K):
    """``x[b, i] ~ q[b, i]`` by inverse CDF on the draft coins.  # -> [B, K]"""
    return np.stack([categorical(q[:, i, :], u[:, i], xp=np) for i in range(K)], axis=1) if K else np.zeros((B, 0), int)


def _ratios(p, q, rows, i, xi):
    """``p_i(x) / q_i(x)`` per row (``p_i(x)`` for point-mass drafts).  # -> [B]"""
    px = p[rows, i, xi]
    if q is None:
        return px
    if p.dtype == object:
        return np.array([a / b if b > 0 else a * 0 + 2 for a, b in zip(px, q[rows, i, xi])], dtype=object)
    qx = q[rows, i, xi]  # a zero draft lane (a placeholder's) counts as always accepted
    return np.where(qx > 0, px / np.where(qx > 0, qx, 1.0), 2.0)


def _accepted(p, q, x, k, u_acc, accepts):
    """Drafts accepted per row: the first ``k_b`` positions judged until the first rejection.  # -> n [B]"""
    B, K = x.shape[0], p.shape[1] - 1
    rows = np.arange(B)
    n = np.zeros(B, dtype=np.int64)
    alive = np.ones(B, dtype=bool)
    for i in range(K):
        live = alive & (i < k)
        ratio = _ratios(p, q, rows, i, x[:, i])  # a placeholder -1 indexes the last column when live
        if u_acc.dtype != object:  # float coins: one vectorised comparison
            test = live & accepts(u_acc[:, i], ratio)
        else:
            test = np.zeros(B, dtype=bool)
            for b in np.flatnonzero(live):  # lazy coins: only live rows spend a comparison
                test[b] = accepts(u_acc[b, i], ratio[b])
        alive = live & test
        n = n + alive
    return n


def _final_rows(p, q, x, n, at, rejected, zero, scratch):
    """The last draw's rows: the residual ``max(0, p_n - scratch)`` after a rejection (``p_n``
    without the draft for point-mass drafts, ``p_n`` when it is all zero), else the bonus ``p_n``.
    Returns ``(rows [B, V], residual mass [B])``."""
    B, K1, V = p.shape
    rows = np.arange(B)
    p_n = p[rows, n]  # [B, V]
    if K1 == 1:
        return p_n, np.ones(B)
    if q is None:
        hit = np.arange(V)[None, :] == x[rows, at][:, None]
        diff = np.where(hit, zero, p_n)
    else:
        diff = p_n - scratch(q, rows, at, zero)
        diff = np.where(diff > zero, diff, zero)
    mass = diff.sum(axis=1)
    return np.where((rejected & (mass > zero))[:, None], diff, p_n), mass


def _final_coins(coins, rejected, at):
    """The last draw's coin per row: ``final``, or for a rejected row its ``recovery`` coin.  # -> [B]"""
    coin = coins.final.copy()
    if coins.recovery is not None:
        for b in np.flatnonzero(rejected):
            coin[b] = coins.recovery[b, at[b]]
    return coin


def _write(n, x, y, K1):
    """The output writer: ``n`` accepted drafts, then ``y``, padded with -1.  # -> [B, K+1]"""
    K = K1 - 1
    out = np.full((len(n), K1), PLACEHOLDER, dtype=np.int64)
    for j in range(K1):
        out[:, j] = np.where(n > j, x[:, j] if j < K else PLACEHOLDER, np.where(n == j, y, PLACEHOLDER))
    return out


# ---------------------------------------------------------------- the bugs, one hook each


def one_stream(rng, B, K, draws_drafts) -> Coins:
    """(shared_noise_stream's coin source) One coin per position draws the draft, tests it and
    draws the recovery: the acceptance stream is the draft stream."""
    rows = np.arange(B)
    draft = rng.random((B, K))[rows]
    final = rng.random((B,))[rows]
    return Coins(draft, draft, final, recovery=draft)


def acceptance_coin_recovers(rng, B, K, draws_drafts) -> Coins:
    """(coin_reused's coin source) A rejected row's final draw reads its rejected position's
    acceptance coin."""
    coins = separate_streams(rng, B, K, draws_drafts)
    return replace(coins, recovery=coins.accept)


def streams_of_row_pairs(rng, B, K, draws_drafts) -> Coins:
    """(row_position_noise's coin source) The streams are keyed by row // 2."""
    return _coins_by_row(rng, np.arange(B) // 2, K, draws_drafts)


def every_position(x, K) -> np.ndarray:
    """(placeholder_indexed's draft count) The rows' counts are read and then overridden: every row
    judges all K positions, placeholders too."""
    return np.full_like(first_placeholder(x, K), K)


def inclusive_below(u, ratio):
    """(inclusive_zero_coin's accept comparison) ``u <= p/q``: u = 0 accepts a p = 0 draft."""
    return u <= ratio


def half_open_above(u, ratio):
    """(out_of_vocab_id's accept comparison) Coins ``c = 1 - u`` in (0, 1] tested ``c < p/q``,
    written ``u > 1 - p/q``: c = 1 rejects a p = q draft."""
    return u > 1 - ratio


def tiled_argmax(final, coin, rejected, mass, zero, V):
    """(out_of_vocab_id's last draw) A tiled argmax over an all-zero residual: the last lane of the
    padded tile wins the tie, an id >= V."""
    y = categorical(final, coin, xp=np)
    return np.where(rejected & ~(mass > zero), -(-V // _TILE) * _TILE - 1, y)


def previous_draft_row_left(q, rows, at, zero):
    """(dirty_scratch's scratch row) The scratch row still holds the previous position's draft row."""
    return q[rows, at] + np.where((at > 0)[:, None], q[rows, np.maximum(at - 1, 0)], zero)


def previous_batch_row(q, rows, at, zero):
    """(cross_row_residual's scratch row) Row b subtracts row b-1's draft row (row 0 its own)."""
    return q[np.maximum(rows - 1, 0), at]


HOOKS = {
    "engine_reference": REFERENCE,
    "engine_reference_batched": REFERENCE,
    "shared_noise_stream": Hooks(coins=one_stream),
    "coin_reused": Hooks(coins=acceptance_coin_recovers),
    "inclusive_zero_coin": Hooks(accepts=inclusive_below),
    "dirty_scratch": Hooks(scratch=previous_draft_row_left),
    "placeholder_indexed": Hooks(drafts=every_position),
    # two hooks, one bug: the (0, 1] coins reach the all-zero residual only through the accept
    # comparison, and only the tiled argmax turns that residual into an id >= V
    "out_of_vocab_id": Hooks(accepts=half_open_above, sample=tiled_argmax),
    "row_position_noise": Hooks(coins=streams_of_row_pairs),
    "cross_row_residual": Hooks(scratch=previous_batch_row),
}
"""Every entry's hooks, by name: the reference's, or the reference's with its bug's hook replaced."""


# ---------------------------------------------------------------- the entries


def engine_reference(p_target, q_draft, seed):
    """(correct) Draws drafts from q, then the chain rule; three separate coin streams."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["engine_reference"])


def engine_reference_batched(p_target, q_draft, draft_tokens, seed):
    """(correct) The chain rule on the oracle's drafts; ragged rows end at their first -1."""
    return _engine(p_target, q_draft, seed, draft_tokens, hooks=HOOKS["engine_reference_batched"])


def shared_noise_stream(p_target, q_draft, seed):
    """One coin per position draws the draft, tests it and draws the recovery."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["shared_noise_stream"])


def coin_reused(p_target, q_draft, seed):
    """The rejected position's acceptance coin is the residual's inverse-CDF threshold."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["coin_reused"])


def inclusive_zero_coin(p_target, q_draft, seed):
    """Accept iff ``u <= p/q`` with ``u`` in [0, 1): u = 0 accepts a draft with p = 0."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["inclusive_zero_coin"])


def dirty_scratch(p_target, q_draft, seed):
    """The residual subtracts a scratch row left holding the previous position's draft row."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["dirty_scratch"])


def placeholder_indexed(p_target, q_draft, draft_tokens, seed):
    """Placeholder (-1) drafts of ragged rows are indexed and judged like real drafts."""
    return _engine(p_target, q_draft, seed, draft_tokens, hooks=HOOKS["placeholder_indexed"])


def out_of_vocab_id(p_target, q_draft, seed):
    """Coins in (0, 1] with a strict ``u q < p``; an all-zero residual's tiled argmax returns id >= V."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["out_of_vocab_id"])


def row_position_noise(p_target, q_draft, seed):
    """Rows 2j and 2j+1 draw identical coins: the stream is keyed by row // 2."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["row_position_noise"])


def cross_row_residual(p_target, q_draft, seed):
    """Row b's residual subtracts row b-1's draft row (row 0 its own)."""
    return _engine(p_target, q_draft, seed, hooks=HOOKS["cross_row_residual"])


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
    wrong: list[tuple[Callable[..., Any], str, str]] = [  # (implementation, level, where it shows)
        (shared_noise_stream, "draft_and_verify", "both"),
        (coin_reused, "draft_and_verify", "both"),
        (inclusive_zero_coin, "draft_and_verify", "exact"),
        (dirty_scratch, "draft_and_verify", "both"),
        (placeholder_indexed, "batched", "both"),
        (out_of_vocab_id, "draft_and_verify", "exact"),
        (row_position_noise, "draft_and_verify", "both"),
        (cross_row_residual, "draft_and_verify", "both"),
    ]
    all_ = [
        EngineZooEntry("engine_reference", "draft_and_verify", engine_reference, "correct", "both",
                       (engine_reference.__doc__ or "").split(") ", 1)[1]),
        EngineZooEntry("engine_reference_batched", "batched", engine_reference_batched, "correct", "both",
                       (engine_reference_batched.__doc__ or "").split(") ", 1)[1]),
    ] + [
        EngineZooEntry(fn.__name__, level, fn, "wrong", shows, (fn.__doc__ or "").strip())
        for fn, level, shows in wrong
    ]
    if kind is not None and kind not in ("wrong", "correct"):
        raise SpecrefError(f"kind must be 'wrong', 'correct' or None, got {kind!r}")
    return [e for e in all_ if kind is None or e.kind == kind]

