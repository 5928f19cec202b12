"""Sampling rules: the distribution that is actually sampled from (SPEC §2).

One documented order, applied identically to the draft and the target::

    logits -> divide by temperature -> top-k mask -> top-p mask -> min-p mask -> softmax

``process(logits, config)`` turns logits ``[..., V]`` into float64 probabilities;
``process_probs(probs, config)`` applies the same rules to probability rows, and is
exact on NumPy object arrays of ``Fraction`` (n-gram models give them).  Both share
one truncation routine, so they cannot drift apart.

Rules, with their boundary cases (the tests pin every one):

- ``temperature == 0`` is greedy: a one-hot on the argmax, ties to the lowest id.
  The other rules are then moot: each of them keeps the most probable token.
- temperature ``T > 0``: ``softmax(logits / T)``, i.e. ``p ** (1/T)`` renormalised.
  In exact mode ``1/T`` must be an integer so that the power stays rational.
- top-k keeps every token whose probability is >= the k-th largest, so ties at the
  boundary are all kept (the kept set can exceed k; it never depends on token order).
- top-p sorts by probability (after top-k, renormalised) and keeps the smallest
  prefix whose mass reaches ``top_p``: the token that crosses ``top_p`` is kept, and
  so is every token tied with it.
- min-p keeps tokens with probability >= ``min_p`` x the largest probability.
- Every rule keeps the most probable token, so a valid row never loses all tokens.
  NaN or +inf logits, or a row with no finite logit, are errors, never a silent
  uniform distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

import numpy as np

from specref.core.backend import namespace, to_numpy
from specref.core.errors import SpecrefError, SpecrefTypeError, check_prob_rows
from specref.core.numbers import is_exact

__all__ = ["SamplingConfig", "process", "process_probs", "GREEDY"]


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings shared by draft and target (SPEC §2)."""

    temperature: float | Fraction = 1.0  # T > 0 divides the logits; 0 means greedy (argmax, lowest id on ties)
    top_k: int | None = None  # keep the k most probable tokens (ties kept); None: off
    top_p: float | Fraction = 1.0  # nucleus: smallest prefix reaching this mass; 1.0: off
    min_p: float | Fraction = 0.0  # keep p >= min_p * max(p); 0.0: off

    def __post_init__(self):
        for name, allowed in (("temperature", Real), ("top_p", Real), ("min_p", Real)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, allowed):
                raise SpecrefTypeError(f"{name} must be a real number, got {type(v).__name__} {v!r:.60}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer))):
            raise SpecrefTypeError(f"top_k must be None or an integer >= 1, got {type(self.top_k).__name__}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, Real) or not (isinstance(t, Fraction) or math.isfinite(t)) or t < 0:
            raise SpecrefError(f"temperature must be a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
            raise SpecrefError(f"top_k must be None or an integer >= 1, got {k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, Real) or not (0 < p <= 1):
            raise SpecrefError(f"top_p must be in (0, 1], got {p!r}")
        m = self.min_p
        if isinstance(m, bool) or not isinstance(m, Real) or not (0 <= m < 1):
            raise SpecrefError(f"min_p must be in [0, 1), got {m!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingConfig(temperature=0)


def process(logits, config: SamplingConfig):
    """Logits ``[..., V]`` -> probabilities ``[..., V]`` (float64) under ``config``.

    Runs on the array library of ``logits`` (NumPy, CuPy, array_api_strict).
    """
    _check_config(config)
    if not hasattr(logits, "shape") or not hasattr(logits, "ndim"):
        raise SpecrefTypeError(f"logits must be an array of shape [..., V], got {type(logits).__name__}")
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise SpecrefError(f"logits must have shape [..., V] with V >= 1, got {getattr(logits, 'shape', logits)!r}")
    if getattr(getattr(logits, "dtype", None), "kind", "f") not in "fiu":
        raise SpecrefTypeError(f"logits must hold real numbers, got dtype {logits.dtype}")
    xp = namespace(logits)
    shape = logits.shape
    z = xp.reshape(xp.astype(logits, xp.float64), (-1, shape[-1]))  # [n, V]
    _check_logits(z, xp)
    if config.greedy:
        return xp.reshape(_one_hot_argmax(z, xp), shape)
    # subtract the row max before dividing by T and exponentiating: never overflows
    d = _scaled(z - xp.max(z, axis=-1, keepdims=True), config.temperature, xp)
    w = xp.exp(d)
    w = w / xp.sum(w, axis=-1, keepdims=True)
    return xp.reshape(_apply_masks(w, config, xp), shape)


def process_probs(probs, config: SamplingConfig):
    """Probability rows ``[..., V]`` -> the processed rows, same rules as :func:`process`.

    On object arrays of ``Fraction`` every operation is exact; the temperature is
    then applied as ``p ** (1/T)`` and must have ``1/T`` integral (T = 1, 1/2, ...).
    """
    _check_config(config)
    probs = check_prob_rows("probs", probs)  # float32/16 rows: renormalised float64
    shape = probs.shape
    if is_exact(probs):
        w = probs.reshape(-1, shape[-1])
        if config.greedy:
            out = np.full(w.shape, Fraction(0), dtype=object)
            for i, row in enumerate(w):
                out[i, max(range(len(row)), key=lambda j: (row[j], -j))] = Fraction(1)
            return out.reshape(shape)
        power = 1 / Fraction(config.temperature)
        if power.denominator != 1:
            raise SpecrefError(
                f"temperature={config.temperature!r} is not exact on Fraction probabilities: "
                "1/temperature must be an integer (use float rows for other temperatures)"
            )
        if power != 1:
            w = w ** int(power)
            w = w / w.sum(axis=-1, keepdims=True)
        return _apply_masks(w, config, namespace(w)).reshape(shape)
    xp = namespace(probs)
    w = xp.reshape(xp.astype(probs, xp.float64), (-1, shape[-1]))
    if config.greedy:
        return xp.reshape(_one_hot_argmax(w, xp), shape)
    if config.temperature != 1:  # p ** (1/T) in log space: the power underflows to 0/0 at low T
        with np.errstate(divide="ignore"):
            logw = xp.log(w)  # zeros -> -inf
        w = xp.exp(_scaled(logw - xp.max(logw, axis=-1, keepdims=True), config.temperature, xp))
        w = w / xp.sum(w, axis=-1, keepdims=True)
    return xp.reshape(_apply_masks(w, config, xp), shape)


def _scaled(diff, temperature, xp):
    """``diff / T`` for ``diff = z - max(z) <= 0`` (``-inf`` for excluded tokens), with no NaN
    at any representable ``T > 0``: a ``T`` that underflows to 0.0 as a float (a tiny
    ``Fraction``) keeps only the maxima, one that overflows keeps every finite token."""
    try:
        t = float(temperature)
    except OverflowError:  # a Fraction beyond the float range
        t = math.inf
    finite = xp.isfinite(diff)
    safe = xp.where(finite, diff, 0 * xp.zeros_like(diff))
    if t == 0:
        scaled = xp.where(safe == 0, safe, xp.full_like(diff, -math.inf))
    elif t == math.inf:
        scaled = 0 * safe
    else:
        with np.errstate(over="ignore"):
            scaled = safe / t
    return xp.where(finite, scaled, xp.full_like(diff, -math.inf))


def _check_config(config):
    if not isinstance(config, SamplingConfig):
        raise SpecrefTypeError(f"config must be a SamplingConfig, got {config!r:.80}")


def _check_logits(z, xp):
    """No NaN, no +inf, at least one finite logit per row."""
    host = to_numpy(z)
    if np.isnan(host).any():
        i, j = map(int, np.argwhere(np.isnan(host))[0])
        raise SpecrefError(f"logits contain NaN (row {i}, token {j})")
    if np.isposinf(host).any():
        i, j = map(int, np.argwhere(np.isposinf(host))[0])
        raise SpecrefError(f"logits contain +inf (row {i}, token {j}); no distribution is defined")
    empty = ~np.isfinite(host).any(axis=-1)
    if empty.any():
        raise SpecrefError(f"logits row {int(np.argmax(empty))} is all -inf: no token can be sampled")


def _one_hot_argmax(w, xp):  # [n, V] -> [n, V] one-hot, ties to the lowest id
    idx = xp.argmax(w, axis=-1)  # the array API returns the first occurrence
    return xp.astype(xp.arange(w.shape[-1])[None, :] == idx[:, None], xp.float64)


def _apply_masks(w, config, xp):
    """Apply top-k, top-p, min-p (in that order) to rows ``w`` [n, V] that sum to 1."""
    V = w.shape[-1]
    if config.top_k is not None and config.top_k < V:
        kth = xp.sort(w, axis=-1, descending=True)[:, config.top_k - 1 : config.top_k]
        w = xp.where(w >= kth, w, 0 * w)
        w = w / xp.sum(w, axis=-1, keepdims=True)
    if config.top_p < 1:
        s = xp.sort(w, axis=-1, descending=True)
        # mass strictly before each sorted token; a token is kept while that is < top_p,
        # which keeps the token that crosses top_p
        before = xp.concat([0 * s[:, :1], xp.cumulative_sum(s, axis=-1)[:, :-1]], axis=-1)
        threshold = xp.min(xp.where(before < config.top_p, s, 0 * s + 2), axis=-1, keepdims=True)
        w = xp.where(w >= threshold, w, 0 * w)
        w = w / xp.sum(w, axis=-1, keepdims=True)
    if config.min_p > 0:
        floor = config.min_p * xp.max(w, axis=-1, keepdims=True)
        w = xp.where(w >= floor, w, 0 * w)
        w = w / xp.sum(w, axis=-1, keepdims=True)
    return w
