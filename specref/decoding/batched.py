"""Batched speculative steps: B sequences at once, each with its own acceptance (SPEC §3).

Leviathan et al. notation: ``p_target`` is the target, ``q_draft`` the draft (Leviathan,
Kalman & Matias 2022, Algorithm 1; Chen et al. 2023, Algorithm 2), applied row by row:
row ``b`` of a batch is one sequence's step, independent of every other row.

:func:`batched_step` takes, per row ``b``, ``p_target[b]`` ``[K+1, V]``, ``q_draft[b]``
``[K, V]`` (or None: point-mass drafts, as EAGLE and n-gram drafters pass) and the draft
tokens ``draft_tokens[b]`` ``[K]``.  Rows may be ragged: row ``b`` has ``k_b <= K`` draft
tokens (``num_draft``, or the count before the first placeholder in ``draft_tokens``) and
its bonus row is ``p_target[b, k_b]``.  Per row:

1. accept ``x_i`` iff ``u_i < p_i(x_i) / q_i(x_i)`` (point mass: ``u_i < p_i(x_i)``), for
   ``i < k_b``, until the first rejection;
2. on a rejection at ``i`` emit one token from the residual ``max(0, p_i - q_i)`` (point
   mass: ``p_i`` with ``x_i`` removed), or from ``p_i`` when that mass is at most
   ``RESIDUAL_TOL`` (SPEC §3); if all ``k_b`` are accepted emit the bonus from ``p_{k_b}``;
3. write the emitted tokens into ``[B, K+1]``, padded with the placeholder (default -1).

The residual and its fallback are :func:`specref.core.step.residual_weights` and
:func:`~specref.core.step.correction_weights`, the draw :func:`specref.core.draws.categorical`
(its comparison form), an int seed becomes a generator in :func:`specref.core.draws.coerce_rng`.

Randomness: ``rng.random((B, K))`` acceptance coins, then ``rng.random((B,))`` final-draw
coins (and, in :func:`batched_draft_and_verify`, ``rng.random((B, K))`` draft coins first).
Every draw is a comparison of a coin with thresholds -- ``u < ratio`` and, for a categorical,
``cdf / total <= u`` -- never arithmetic on the coin.  So the same vectorised code runs on
float coins (a ``numpy.random.Generator`` or an int seed; NumPy, CuPy or torch rows through
array-api-compat) and on the exact enumerator's lazy uniforms over ``Fraction`` rows
(:func:`specref.verification.laws.enumeration.law`), which is how the tests compare each row's law
with :func:`specref.core.step.speculative_step` exactly.

Float32 rows are accepted: each used row must sum to 1 within :func:`row_tolerance`
(``8 sqrt(V) eps``, eps of the row's dtype) and is renormalised in float64.  float16 and
bfloat16 rows are refused (their rounding moves the law by more than specref can vouch for).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, NamedTuple

import types

import numpy as np
from array_api_compat import device as _device

from specref.core import errors as _errors
from specref.core.backend import namespace, to_host, to_numpy
from specref.core.draws import categorical, coerce_rng
from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.core.step import correction_weights, residual_weights

__all__ = [
    "PLACEHOLDER",
    "BatchedSteps",
    "row_tolerance",
    "check_batched_inputs",
    "batched_step",
    "sample_drafts",
    "batched_draft_and_verify",
]

PLACEHOLDER = -1  # the padding id engines use (vLLM PLACEHOLDER_TOKEN_ID, FlashInfer's -1)
_REFUSED_DTYPES = ("float16", "bfloat16", "half")


class BatchedSteps(NamedTuple):
    """``B`` speculative steps: ``tokens`` [B, K+1] padded, ``n_accepted`` and ``n_emitted`` [B].

    ``tokens[b, :n_emitted[b]]`` is what row ``b`` emitted: ``n_accepted[b]`` draft tokens,
    then one residual or bonus token; ``n_emitted = n_accepted + 1``.
    """

    tokens: Any  # [B, K+1] int64, placeholder after the last emitted token
    n_accepted: Any  # [B] int64
    n_emitted: Any  # [B] int64


def row_tolerance(dtype, V: int) -> float:
    """How far from 1 a probability row of ``dtype`` over ``V`` tokens may sum: ``8 sqrt(V) eps``.

    :func:`specref.core.errors.row_tolerance` with this level's documented formula:
    uncapped (``cap=None``) and applied to float64 too (``scale_float64=True``), at
    least 1e-9.  float32 at V = 32,000: 1.7e-4.  (It parts from the core default only
    for float32 at V > 1.1e8, where the default caps at 1e-2, and float64 at V > 3.2e11.)
    """
    return _errors.row_tolerance(dtype, V, cap=None, scale_float64=True)


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).rsplit(".", 1)[-1]  # torch.float32, array_api_strict.float64


def _host_rows(name, rows, shape, used):
    """Validated float64 (or Fraction) rows ``[B, R, V]`` on the rows' own backend and device.

    ``used`` [B, R] (host bools) marks the rows that are checked and read; the others are
    replaced by a uniform row.  Only [B, R] summaries (sums, minima) travel to the host.
    """
    dtype = _dtype_name(rows)
    if any(d == dtype for d in _REFUSED_DTYPES):
        raise SpecrefError(f"{name} has dtype {dtype}: float16/bfloat16 rows are refused (round them to "
                           "float32 or float64 first; their rounding moves the law by more than a tolerance)")
    if isinstance(rows, (list, tuple)):
        rows = np.asarray(rows)
    if getattr(rows, "ndim", None) != 3:
        raise SpecrefError(f"{name} must have shape {shape}, got {tuple(getattr(rows, 'shape', ()))}")
    if isinstance(rows, np.ndarray) and rows.dtype == object:
        return _exact_rows(name, rows, used)
    if dtype not in ("float32", "float64"):
        raise SpecrefError(f"{name} must hold float32/float64 probabilities, got dtype {dtype}")
    xp = namespace(rows)
    V = rows.shape[2]
    tol = row_tolerance(np.dtype(dtype), V)
    rows64 = xp.astype(rows, xp.float64)
    sums = to_host(xp.sum(rows64, axis=2))  # NaN and inf entries make their row's sum non-finite
    bad = ~np.isfinite(sums) & used
    if bad.any():
        b, i = map(int, np.argwhere(bad)[0])
        raise SpecrefError(f"{name}[{b}, {i}] (row {b}) is not finite (NaN or inf)")
    neg = (to_host(xp.min(rows64, axis=2)) < 0) & used
    if neg.any():
        b, i = map(int, np.argwhere(neg)[0])
        raise SpecrefError(f"{name}[{b}, {i}] (row {b}) has a negative entry")
    off = (np.abs(sums - 1.0) > tol) & used
    if off.any():
        b, i = map(int, np.argwhere(off)[0])
        raise SpecrefError(f"{name}[{b}, {i}] (row {b}) sums to {sums[b, i]!r}, not 1 within "
                           f"{tol:.3g} (row_tolerance({dtype}, V={V}))")
    dev = _device(rows)
    if not used.all():  # unused rows: any distribution, never read for a draw
        rows64 = xp.where(xp.asarray(used, device=dev)[..., None], rows64, xp.asarray(1.0 / V, dtype=xp.float64, device=dev))
        sums = np.where(used, sums, 1.0)
    return rows64 / xp.asarray(sums, dtype=xp.float64, device=dev)[..., None]  # renormalise in float64


def _exact_rows(name, host, used):
    for (b, i), u in np.ndenumerate(used):
        if not u:
            continue
        row = host[b, i]
        if not all(type(v) in (Fraction, int) for v in row):
            raise SpecrefError(f"{name}[{b}, {i}] (row {b}) must hold Fractions (object rows are exact)")
        if min(row) < 0 or sum(row) != 1:
            raise SpecrefError(f"{name}[{b}, {i}] (row {b}) is not a distribution: sums to {sum(row)}")
    V = host.shape[2]
    out = host.copy()
    out[~used] = Fraction(1, V)
    return out


def check_batched_inputs(p_target, q_draft, draft_tokens, num_draft=None, *, placeholder: int = PLACEHOLDER):
    """Validate one batch; host ``(p [B, K+1, V], q [B, K, V] | None, x [B, K], k [B])``.

    ``num_draft`` [B] (each in 0..K) gives the ragged counts; None infers them from
    ``draft_tokens`` (the entries before the first placeholder).  Entries at or after
    ``k_b`` must be the placeholder; entries before must be ids in ``0..V-1`` with
    ``q_draft[b, i, x] > 0``.  Every message names the argument and the row.
    """
    x = to_host(draft_tokens)
    if x.ndim != 2:
        raise SpecrefError(f"draft_tokens must have shape [B, K], got {tuple(x.shape)}")
    if x.dtype.kind not in "iu":
        raise SpecrefError(f"draft_tokens must hold integer ids, got dtype {x.dtype}")
    B, K = x.shape
    if B == 0:
        raise SpecrefError(f"draft_tokens must hold at least one row (B >= 1), got shape {tuple(x.shape)}")
    pshape = tuple(getattr(p_target, "shape", ()))
    if len(pshape) != 3 or pshape[0] != B or pshape[1] != K + 1:
        raise SpecrefError(f"p_target must have shape [B, K+1, V] = [{B}, {K + 1}, V] for draft_tokens "
                           f"[{B}, {K}], got {list(pshape)}")
    V = int(pshape[2])
    if V == 0:
        raise SpecrefError(f"p_target must have a non-empty vocabulary axis (V >= 1), got shape {list(pshape)}")
    placeholder = check_placeholder(placeholder, V)
    if q_draft is not None:
        qshape = tuple(getattr(q_draft, "shape", ()))
        if qshape != (B, K, V):
            raise SpecrefError(f"q_draft must have shape [B, K, V] = [{B}, {K}, {V}] (from p_target and "
                               f"draft_tokens), got {list(qshape)}")
    x = x.astype(np.int64)
    is_pad = x == placeholder
    if num_draft is None:
        k = np.where(is_pad.any(axis=1), is_pad.argmax(axis=1), K).astype(np.int64) if K else np.zeros(B, np.int64)
    else:
        k = check_num_draft(num_draft, B, K)
    pos = np.arange(K)[None, :]
    live = pos < k[:, None]  # [B, K]
    stray = ~live & ~is_pad
    if stray.any():
        b, i = map(int, np.argwhere(stray)[0])
        raise SpecrefError(f"draft_tokens[{b}, {i}] = {x[b, i]} (row {b}) follows the row's {k[b]} draft "
                           f"tokens; pad with the placeholder {placeholder}")
    out = live & ((x < 0) | (x >= V))
    if out.any():
        b, i = map(int, np.argwhere(out)[0])
        raise SpecrefError(f"draft_tokens[{b}, {i}] = {x[b, i]} (row {b}) is out of range for V = {V}")
    used_p = np.arange(K + 1)[None, :] <= k[:, None]  # rows 0..k_b: k_b judged positions and the bonus
    p = _host_rows("p_target", p_target, f"[{B}, {K + 1}, {V}]", used_p)
    q = None if q_draft is None else _host_rows("q_draft", q_draft, f"[{B}, {K}, {V}]", live)
    xs = np.where(live, x, 0)
    if q is not None:
        xq = namespace(q) if q.dtype != object else np
        zero = live & (to_host(_pick(q, xq.asarray(xs, device=_device(q)), xp=xq)) == 0)
        if zero.any():
            b, i = map(int, np.argwhere(zero)[0])
            raise SpecrefError(f"draft_tokens[{b}, {i}] = {x[b, i]} (row {b}) has q_draft[{b}, {i}, {x[b, i]}] = 0: "
                               "the draft cannot have proposed it")
    return p, q, np.where(live, x, placeholder), k


def check_placeholder(placeholder, V: int) -> int:
    """The padding id: an int (not a bool) outside the vocabulary ``0..V-1``, else SpecrefError naming it."""
    if isinstance(placeholder, (bool, np.bool_)) or not isinstance(placeholder, (int, np.integer)):
        raise SpecrefTypeError(f"placeholder must be an integer id outside the vocabulary (e.g. -1), "
                               f"got {placeholder!r:.80}")
    if 0 <= placeholder < V:
        raise SpecrefError(f"placeholder = {placeholder} is a token of the vocabulary 0..{V - 1}; "
                           f"padding must be told apart from tokens (use -1)")
    return int(placeholder)


def check_num_draft(num_draft, B: int, K: int) -> np.ndarray:
    """``num_draft`` as ``[B]`` int64 counts in ``0..K``, else SpecrefError naming it and the row."""
    k = to_numpy(num_draft)
    if k.shape != (B,) or k.dtype.kind not in "iu":
        raise SpecrefError(f"num_draft must be [B] = [{B}] integers, got {k.dtype} {tuple(k.shape)}")
    k = k.astype(np.int64)
    if (k < 0).any() or (k > K).any():
        b = int(np.argmax((k < 0) | (k > K)))
        raise SpecrefError(f"num_draft[{b}] = {k[b]} (row {b}) is outside 0..K = 0..{K}")
    return k


def _batched_rng(rng):
    """The generator the batched samplers draw from: an int seed, a Generator instance or the
    enumerator; a class (``np.random.Generator`` itself), a module, None or the legacy
    ``RandomState`` is refused (an unbound ``Generator.random`` crashes the interpreter)."""
    if rng is None or isinstance(rng, (type, types.ModuleType, np.random.RandomState)):
        what = "the class" if isinstance(rng, type) else ("the module" if isinstance(rng, types.ModuleType)
                                                           else type(rng).__name__)
        raise SpecrefTypeError(f"rng must be a generator instance or an int seed, got {what} "
                               f"{getattr(rng, '__name__', '')}".rstrip() + "; pass numpy.random.default_rng(seed)")
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)) and rng < 0:
        raise SpecrefError(f"rng as an int seed must be >= 0, got {rng}")
    return coerce_rng(rng, check=True)


def _lazy(rng) -> bool:
    """True for the exact enumerator's generator (its coins only answer comparisons)."""
    return not isinstance(rng, (np.random.Generator, int, np.integer))


def _gather(rows, idx, *, xp):
    """``rows[b, idx[b], :]`` with standard array-API calls.  # [B, R, V], [B] -> [B, V]"""
    B, R, V = rows.shape
    flat = xp.reshape(rows, (B * R, V))
    return xp.take(flat, xp.arange(B, device=_device(rows)) * R + idx, axis=0)


def _pick(rows, tokens, *, xp):
    """``rows[b, i, tokens[b, i]]``.  # [B, K, V], [B, K] -> [B, K]"""
    B, K, V = rows.shape
    flat = xp.reshape(rows, (B * K * V,))
    base = xp.reshape(xp.arange(B * K, device=_device(rows)), (B, K)) * V
    return xp.reshape(xp.take(flat, xp.reshape(base + tokens, (-1,))), (B, K))


def _verify(p, q, x, k, u_accept, u_final, placeholder, *, xp, exact):
    """The batched chain rule on prepared rows (device or object arrays).  See module docstring."""
    B, K1, V = p.shape
    K = K1 - 1
    dev = _device(p)
    zero = p[0, 0, 0] * 0
    safe_x = xp.where(x == placeholder, xp.zeros_like(x), x)
    n = xp.zeros((B,), dtype=xp.int64, device=dev)  # accepted so far
    alive = xp.ones((B,), dtype=xp.bool, device=dev)
    if K:
        px = _pick(p[:, :K, :], safe_x, xp=xp)  # [B, K]
        ratio = px if q is None else px / _pick(q, safe_x, xp=xp)
        for i in range(K):  # 0-based: paper position i + 1
            alive = xp.logical_and(alive, xp.logical_and(k > i, u_accept[:, i] < ratio[:, i]))
            n = n + xp.astype(alive, xp.int64)
    # the final row: residual at the first rejection (n < k_b), else the bonus row p[k_b]
    p_n = _gather(p, n, xp=xp)  # [B, V]
    if K == 0:
        final = p_n
    else:
        at = xp.where(n < K, n, xp.full_like(n, K - 1))
        if q is None:  # point mass: p_n with the draft token removed
            x_n = xp.take(xp.reshape(safe_x, (-1,)), xp.arange(B, device=dev) * K + at)
            hit = xp.arange(V, device=dev)[None, :] == x_n[:, None]
            diff = xp.where(hit, zero, p_n)
        else:
            diff = residual_weights(p_n, _gather(q, at, xp=xp), xp=xp)  # max(0, p_n - q_n)
        residual = correction_weights(diff, p_n, xp=xp, exact=exact)  # SPEC §3: rounding-only rejections draw p
        final = xp.where((n < k)[:, None], residual, p_n)
    y = categorical(final, u_final, xp=xp)
    cols = []
    pad = xp.full((B,), placeholder, dtype=xp.int64, device=dev)
    for i in range(K1):
        draft_col = x[:, i] if i < K else pad
        cols.append(xp.where(n > i, draft_col, xp.where(n == i, y, pad)))
    return BatchedSteps(tokens=xp.stack(cols, axis=1), n_accepted=n, n_emitted=n + 1)


def _prepare(p_target, q_draft, draft_tokens, num_draft, placeholder):
    p, q, x, k = check_batched_inputs(p_target, q_draft, draft_tokens, num_draft, placeholder=placeholder)
    exact = p.dtype == object
    if exact:
        return np, p, q, x, k, exact
    xp = namespace(p)  # the rows stay on their backend and device
    dev = _device(p)
    return xp, p, q, xp.asarray(x, dtype=xp.int64, device=dev), xp.asarray(k, dtype=xp.int64, device=dev), exact


def _uniforms(rng, shape, *, xp, like):
    host = rng.random(shape)
    if _lazy(rng):
        return host  # object array of lazy uniforms (NumPy rows)
    return xp.asarray(host, dtype=xp.float64, device=_device(like))


def batched_step(p_target, q_draft, draft_tokens, rng, *, num_draft=None,
                 placeholder: int = PLACEHOLDER) -> BatchedSteps:
    """``B`` independent speculative steps at once, ragged K allowed (SPEC §3, Algorithm 1 per row).

    p_target [B, K+1, V], q_draft [B, K, V] or None (point-mass drafts), draft_tokens [B, K]
    (placeholder after row b's ``k_b`` drafts) -> tokens [B, K+1] padded, n_accepted [B], n_emitted [B].

    ``rng``: a ``numpy.random.Generator``, an int seed, or the exact enumerator's generator
    (then rows must be NumPy; Fraction rows make the law exact).  Outputs live on the rows'
    backend (NumPy, torch, CuPy).
    """
    xp, p, q, x, k, exact = _prepare(p_target, q_draft, draft_tokens, num_draft, placeholder)
    rng = _batched_rng(rng)
    B, K1, _ = p.shape
    u_accept = _uniforms(rng, (B, K1 - 1), xp=xp, like=p)
    u_final = _uniforms(rng, (B,), xp=xp, like=p)
    return _verify(p, q, x, k, u_accept, u_final, placeholder, xp=xp, exact=exact)


def sample_drafts(q_draft, rng, *, num_draft=None, placeholder: int = PLACEHOLDER):
    """Draft tokens ``x[b, i] ~ q_draft[b, i]`` for ``i < k_b``, placeholder after.  # [B, K, V] -> [B, K]

    One coin per (b, i) from ``rng.random((B, K))``, located by comparison in the row's CDF.
    """
    rng = _batched_rng(rng)
    if isinstance(q_draft, (list, tuple)):
        q_draft = np.asarray(q_draft)
    shape = tuple(getattr(q_draft, "shape", ()))
    if len(shape) != 3 or 0 in shape:
        raise SpecrefError(f"q_draft must have shape [B, K, V] with B, K, V >= 1, got {list(shape)}")
    B, K, V = (int(n) for n in shape)
    check_placeholder(placeholder, V)
    k = np.full(B, K, dtype=np.int64) if num_draft is None else check_num_draft(num_draft, B, K)
    live = np.arange(K)[None, :] < k[:, None]
    q = _host_rows("q_draft", q_draft, f"[{B}, {K}, {V}]", live)
    if q.dtype != object:
        q = to_host(q)
    u = rng.random((B, K))
    x = categorical(q.reshape(B * K, V), u.reshape(-1), xp=np).reshape(B, K)
    return np.where(live, x, placeholder).astype(np.int64)


def batched_draft_and_verify(p_target, q_draft, rng, *, num_draft=None,
                             placeholder: int = PLACEHOLDER) -> BatchedSteps:
    """Draw the drafts from ``q_draft`` and verify them: the reference of the draft-and-verify level.

    p_target [B, K+1, V], q_draft [B, K, V] -> BatchedSteps.  Coins, in order: draft
    ``[B, K]``, acceptance ``[B, K]``, final ``[B]`` -- three separate streams, none reused.
    """
    rng = _batched_rng(rng)
    x = sample_drafts(q_draft, rng, num_draft=num_draft, placeholder=placeholder)
    steps = batched_step(p_target, q_draft, x, rng, num_draft=num_draft, placeholder=placeholder)
    return steps
