"""Many independent speculative steps at once (SPEC §3), for Monte Carlo checks.

Leviathan et al. notation: ``p_target`` is the target, ``q_draft`` the draft
(Leviathan, Kalman & Matias 2022, Algorithm 1; Chen et al. 2023, Algorithm 2).

:func:`sample_steps` runs ``n`` independent copies of one speculative step with
*fixed* rows: ``q_draft`` is ``[K, V]`` and ``p_target`` is ``[K+1, V]``, the same
for every copy (at step level nothing depends on earlier tokens).  Each copy

1. draws ``x_i ~ q_i`` (or takes the given ``draft_tokens``),
2. accepts ``x_i`` iff ``u_i < p_i(x_i) / q_i(x_i)``, until the first rejection,
3. on the first rejection at position ``i`` emits one token from the residual
   ``normalize(max(0, p_i - q_i))``; if that residual mass is ``<= RESIDUAL_MASS_TOL``
   (a rejection that is possible only through rounding, SPEC §3) it emits from ``p_i``
   instead; if all ``K`` are accepted it emits a bonus token from ``p_{K+1}``.

Indexing: the SPEC counts positions 1..K+1; arrays here are 0-based, so row ``i``
of ``q_draft`` and of ``p_target`` belongs to draft position ``i + 1`` and row ``K``
of ``p_target`` is the bonus row.

Every categorical draw is inverse-CDF sampling: a uniform ``u`` is scaled by the
row's total mass and located in the row's cumulative sum with ``searchsorted``
(``side="right"``, so a zero-probability token can never be returned).  Scaling by
the total instead of dividing the row by it means that the residual is never
normalized, so nothing divides by a sum that may be tiny.  The residual and its
fallback are :func:`specref.core.step.residual_weights` and
:func:`~specref.core.step.correction_weights`; the draw is
:func:`specref.core.draws.categorical` (``scaled_coin=True``).

Backends: all arithmetic uses the array-API namespace of the inputs (NumPy,
``array_api_strict``, CuPy).  Uniforms come from the caller's ``rng`` on the host
and move to the device with ``xp.asarray``.  Everything is computed in float64.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import device as _device

from specref.core.backend import namespace, to_numpy
from specref.core.draws import categorical
from specref.core.errors import (
    SpecrefError,
    SpecrefTypeError,
    check_positive_int,
    check_prob_rows,
    check_tokens,
)
from specref.core.numbers import is_exact
from specref.core.step import RESIDUAL_TOL, correction_weights, residual_weights

__all__ = [
    "RESIDUAL_MASS_TOL",
    "StepSamples",
    "FirstTokenFrequencies",
    "sample_steps",
    "first_token_frequencies",
]

# residual mass at or below this: the rejection came from rounding; sample p_i (the rule of specref.core.step)
RESIDUAL_MASS_TOL = RESIDUAL_TOL
_CHUNK = 1 << 20  # steps per batch in first_token_frequencies (bounds memory, ~200 MB at K = 4)


class StepSamples(NamedTuple):
    """``n`` speculative steps: ``tokens`` [n, K+1] padded with -1, ``n_emitted`` [n] in 1..K+1.

    Unpacks as ``tokens, n_emitted = sample_steps(...)``.  Both are int64 arrays of the
    input's namespace.  ``tokens[s, :n_emitted[s]]`` is what step ``s`` emitted: its
    accepted draft tokens, then one residual or bonus token.
    """

    tokens: Any  # [n, K+1] int64, -1 after the last emitted token
    n_emitted: Any  # [n] int64, accepted draft tokens + 1


@dataclass(frozen=True)
class FirstTokenFrequencies:
    """The classic experiment: how often each token came out first, against ``p_1``.

    All arrays are host NumPy (float64 / int64) of shape [V].
    """

    n: int  # number of steps sampled
    counts: np.ndarray  # [V] how often each token was the first emitted token
    frequencies: np.ndarray  # [V] counts / n
    target: np.ndarray  # [V] p_1, the exact law of the first emitted token
    std_err: np.ndarray  # [V] sqrt(p_1 (1 - p_1) / n), the standard error of each frequency
    max_abs_z: float  # max over tokens of |frequency - p_1| / std_err (inf: a p_1 = 0 token came out)

    def __str__(self) -> str:
        lines = [f"first emitted token, N = {self.n}: max |freq - p| = {self.max_abs_z:.2f} standard errors"]
        lines.append(f"{'token':>6} {'p_1':>10} {'freq':>10} {'std err':>10} {'z':>7}")
        for v, (p, f, se) in enumerate(zip(self.target, self.frequencies, self.std_err)):
            z = (f - p) / se if se > 0 else (0.0 if f == p else float("inf"))
            lines.append(f"{v:>6} {p:>10.6f} {f:>10.6f} {se:>10.2e} {z:>7.2f}")
        return "\n".join(lines)


def _as_float_rows(name, rows, shape):
    # Validation runs on a host copy (check_prob_rows copies anyway).  Fraction (object)
    # rows are exact and NumPy-only; the sampler works in floats.
    host = check_prob_rows(name, to_numpy(rows), shape=shape)
    if is_exact(host) or not hasattr(rows, "shape"):  # Fractions, or a nested list
        return host.astype(np.float64)
    if host.dtype == np.float64 and to_numpy(rows).dtype.itemsize < 8:  # float32/16 rows, renormalised
        xp = namespace(rows)
        return xp.asarray(host, device=_device(rows))
    return rows


def _check_draft_tokens(draft_tokens, q_host, n):
    """Host-side validation: ints in range, shape [K] or [n, K], q_i(x_i) > 0."""
    k, v = q_host.shape
    host = to_numpy(draft_tokens)
    if host.ndim == 1:
        check_tokens("draft_tokens", host, v, length=k)
        host = host.astype(np.int64)[None, :]
    elif host.ndim == 2 and host.shape == (n, k):
        if host.dtype.kind not in "iu":
            raise SpecrefError(f"draft_tokens must hold integer token ids, got dtype {host.dtype}")
        if host.size and (host.min() < 0 or host.max() >= v):
            bad = host[(host < 0) | (host >= v)][0]
            raise SpecrefError(f"draft_tokens holds {bad}, out of range for vocabulary size {v}")
        host = host.astype(np.int64)
    else:
        raise SpecrefError(f"draft_tokens must have shape [{k}] or [{n}, {k}], got {tuple(host.shape)}")
    zero = q_host[np.arange(k)[None, :], host] == 0
    if zero.any():
        s, i = map(int, np.argwhere(zero)[0])
        raise SpecrefError(
            f"draft_tokens[{i}] = {int(host[s, i])} has q_draft[{i}] probability 0: "
            "the draft can never propose it (SPEC §3)"
        )
    return host


def _check_coin_rng(rng):
    """``rng`` is an instance with ``random(shape)``: not None, the Generator class, the np.random module or a RandomState."""
    if (isinstance(rng, (type, types.ModuleType, np.random.RandomState))
            or not callable(getattr(rng, "random", None))):
        raise SpecrefTypeError(f"rng must be a numpy.random.Generator instance (numpy.random.default_rng(seed)), "
                           f"got {'the class ' + rng.__name__ if isinstance(rng, type) else repr(rng)[:80]}")


def sample_steps(p_target, q_draft, n: int, rng, *, draft_tokens=None) -> StepSamples:
    """Run ``n`` independent speculative steps of SPEC §3 at once.

    p_target [K+1, V], q_draft [K, V] -> tokens [n, K+1] (padded with -1), n_emitted [n]

    ``draft_tokens``: None to draw ``x_i ~ q_draft[i]`` independently in every step,
    or fixed ids, ``[K]`` (the same for every step) or ``[n, K]``.  A fixed token with
    ``q_draft[i, x_i] == 0`` is refused.  ``rng`` is a ``numpy.random.Generator``; only
    ``rng.random(shape)`` is called, in this order: draft uniforms [n, K] (when the
    draft is sampled), acceptance uniforms [n, K], final-token uniforms [n].
    """
    p_target = _as_float_rows("p_target", p_target, (None, None))
    kp1, v = p_target.shape
    if kp1 < 2:
        raise SpecrefError(
            f"p_target must have K+1 >= 2 rows (K >= 1 draft positions), got shape {tuple(p_target.shape)}"
        )
    k = kp1 - 1
    q_draft = _as_float_rows("q_draft", q_draft, (k, v))
    xp = namespace(p_target, q_draft)  # after validation: a list or a string has no namespace
    n = check_positive_int("n", n)
    _check_coin_rng(rng)
    fixed = None if draft_tokens is None else _check_draft_tokens(draft_tokens, to_numpy(q_draft), n)

    dev = _device(p_target)
    p = xp.astype(xp.asarray(p_target, device=dev), xp.float64)
    q = xp.astype(xp.asarray(q_draft, device=dev), xp.float64)

    def uniforms(shape):
        return xp.asarray(rng.random(shape), dtype=xp.float64, device=dev)

    # 1. draft tokens x_i ~ q_i (or the fixed ones)                       # [n, K]
    if fixed is None:
        u_draft = uniforms((n, k))
        x = xp.stack([categorical(q[i, :], u_draft[:, i], xp=xp, scaled_coin=True) for i in range(k)], axis=1)
    else:
        x = xp.asarray(fixed, dtype=xp.int64, device=dev)
        if x.shape[0] != n:
            x = xp.broadcast_to(x, (n, k))
    x = xp.astype(x, xp.int64)
    # 2. accept x_i iff u_i < p_i(x_i) / q_i(x_i), until the first rejection
    n_accepted = _accepted(p, q, x, uniforms((n, k)), xp=xp)
    # 3. the final token: residual at the first rejection, or the bonus from p_{K+1}
    final = _final_tokens(p, q, n_accepted, uniforms((n,)), xp=xp)
    # 4. assemble: accepted draft tokens, the final token, then -1 padding
    pad = xp.full((n,), -1, dtype=xp.int64, device=dev)
    cols = []
    for i in range(k + 1):
        draft_col = x[:, i] if i < k else pad
        cols.append(xp.where(n_accepted > i, draft_col, xp.where(n_accepted == i, final, pad)))
    return StepSamples(tokens=xp.stack(cols, axis=1), n_emitted=n_accepted + 1)


def _accepted(p, q, x, u_accept, *, xp):
    """Draft tokens accepted per step; ``q_i(x_i) > 0`` (sampled from q, or checked).  [K+1, V], [K, V], [n, K] x2 -> [n]"""
    n, k = x.shape
    n_accepted = xp.zeros((n,), dtype=xp.int64, device=_device(p))
    alive = xp.ones((n,), dtype=xp.bool, device=_device(p))  # no rejection yet
    for i in range(k):
        ratio = xp.take(p[i, :], x[:, i]) / xp.take(q[i, :], x[:, i])
        alive = xp.logical_and(alive, u_accept[:, i] < ratio)
        n_accepted = n_accepted + xp.astype(alive, xp.int64)
    return n_accepted


def _final_tokens(p, q, n_accepted, u_final, *, xp):
    """The token after the accepted ones: residual row ``i`` serves the steps first rejected at ``i``.

    [K+1, V], [K, V], [n], [n] -> [n].  Rows are the unnormalised residuals (``p_i``
    where the mass is rounding only, SPEC §3) and the bonus row ``p_K``.
    """
    k = q.shape[0]
    residual = residual_weights(p[:k, :], q, xp=xp)  # [K, V], unnormalized
    final_rows = xp.concat([correction_weights(residual, p[:k, :], xp=xp, exact=False), p[k:, :]], axis=0)
    final = xp.zeros(n_accepted.shape, dtype=xp.int64, device=_device(p))
    for i in range(k + 1):  # i == K: the bonus row
        drawn = categorical(final_rows[i, :], u_final, xp=xp, scaled_coin=True)
        final = xp.where(n_accepted == i, drawn, final)
    return final


def _token_counts(tokens, v, *, xp):
    """How often each id in 0..v-1 occurs in ``tokens`` (sort + searchsorted).  # [n] -> [v]"""
    ordered = xp.sort(tokens)
    edges = xp.searchsorted(ordered, xp.arange(v + 1, dtype=ordered.dtype, device=_device(tokens)), side="left")
    return edges[1:] - edges[:-1]


def first_token_frequencies(p_target, q_draft, n: int, rng) -> FirstTokenFrequencies:
    """The classic experiment: sample the first emitted token ``n`` times, compare with ``p_1``.

    p_target [K+1, V], q_draft [K, V] -> counts, frequencies, p_1, standard errors [V]

    Runs :func:`sample_steps` (draft sampled from ``q_draft``) in batches of at most
    2**20 steps and counts the first token of each.  A correct step emits its first
    token with law exactly ``p_1 = p_target[0]`` (SPEC §3), so every frequency should lie
    within a few standard errors ``sqrt(p_1 (1 - p_1) / n)`` of ``p_1``; ``max_abs_z`` is
    the largest deviation in standard errors.  For a formal test feed ``counts`` to
    :func:`specref.verification.statistics.counts.g_test`.
    """
    n = check_positive_int("n", n)
    p_target = _as_float_rows("p_target", p_target, (None, None))
    q_draft = _as_float_rows("q_draft", q_draft, (None, p_target.shape[1]))
    xp = namespace(p_target, q_draft)
    v = p_target.shape[1]
    counts = np.zeros(v, dtype=np.int64)
    done = 0
    while done < n:
        m = min(_CHUNK, n - done)
        steps = sample_steps(p_target, q_draft, m, rng)
        counts += to_numpy(_token_counts(steps.tokens[:, 0], v, xp=xp)).astype(np.int64)
        done += m
    target = to_numpy(xp.astype(p_target[0, :], xp.float64)).astype(np.float64)
    freqs = counts / n
    std_err = np.sqrt(target * (1.0 - target) / n)
    dev = np.abs(freqs - target)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(std_err > 0, dev / np.where(std_err > 0, std_err, 1.0), np.where(dev > 0, np.inf, 0.0))
    return FirstTokenFrequencies(
        n=n, counts=counts, frequencies=freqs, target=target, std_err=std_err, max_abs_z=float(z.max())
    )
