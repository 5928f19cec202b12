"""The idealized cost model of speculative decoding (SPEC §8, §10).

Leviathan, Kalman & Matias, *Fast Inference from Transformers via Speculative
Decoding* (2022), §3, with their assumptions: every draft token is accepted
independently with the same probability ``alpha`` (``α = Σ_x min(p(x), q(x))``,
one minus the total variation between target and draft); one target call costs 1;
one draft token costs ``c`` in walltime (``ĉ`` in arithmetic operations).

- expected tokens per iteration, their eq. (1):
  ``E[L] = Σ_{i=0}^{K} α^i = (1 - α^{K+1}) / (1 - α)``;
- walltime improvement, their Thm 3.8: ``S = E[L] / (1 + K·c)``;
- with ``α > c`` some ``K`` gives ``S ≥ (1 + α)/(1 + c)`` (their Cor 3.9: ``K = 1``);
- arithmetic-operations factor, their Thm 3.11: ``(1 - α)(K·ĉ + K + 1) / (1 - α^{K+1})``.

``K`` is their ``γ``.  This is a model, not a measurement: measured speedups are
reported beside it, never replaced by it (SPEC §8).

Every function takes plain numbers.  Exact inputs (``int``, ``fractions.Fraction``)
give exact ``Fraction`` results; a ``float`` anywhere gives a ``float``.  NumPy is not
needed; loop over a grid to draw a curve.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from specref.core.errors import SpecrefError, check_positive_int

__all__ = [
    "expected_tokens",
    "speed_ratio",
    "ops_factor",
    "best_k",
    "best_k_table",
    "DEFAULT_K_MAX",
]

DEFAULT_K_MAX = 128  # largest K best_k searches unless told otherwise


def _number(name: str, value, *, upper=None):
    """A real number ``0 <= value (<= upper)``: a Fraction if exact, else a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpecrefError(f"{name} must be a real number, got {value!r}")
    if isinstance(value, numbers.Rational):
        value = Fraction(int(value.numerator), int(value.denominator))
    else:
        value = float(value)
        if not math.isfinite(value):
            raise SpecrefError(f"{name} must be finite, got {value!r}")
    if value < 0 or (upper is not None and value > upper):
        bounds = f"in [0, {upper}]" if upper is not None else ">= 0"
        raise SpecrefError(f"{name} must be {bounds}, got {value!r}")
    return value


def _alpha(alpha):
    return _number("alpha", alpha, upper=1)


def expected_tokens(alpha, k):
    """Expected tokens one iteration emits, ``Σ_{i=0}^{k} α^i`` (Leviathan eq. 1).

    Equal to ``(1 - α^{k+1}) / (1 - α)``; summed term by term instead, which has no
    0/0 at ``α = 1`` (where it is ``k + 1``) and no cancellation near it.
    """
    alpha, k = _alpha(alpha), check_positive_int("k", k)
    return sum(alpha**i for i in range(k + 1))  # a Fraction stays exact, a float stays float


def speed_ratio(alpha, k, c):
    """Walltime improvement over plain decoding, ``E[L] / (1 + k·c)`` (Leviathan Thm 3.8).

    One iteration costs one target call (1) and ``k`` draft tokens (``c`` each).
    """
    c = _number("c", c)
    return expected_tokens(alpha, k) / (1 + k * c)


def ops_factor(alpha, k, c_hat):
    """Arithmetic-operations factor, ``(1 - α)(k·ĉ + k + 1) / (1 - α^{k+1})`` (Thm 3.11).

    Written ``(k·ĉ + k + 1) / E[L]``: each iteration runs the target on ``k + 1``
    positions and the draft ``k`` times (``ĉ`` each), and yields ``E[L]`` tokens.
    """
    c_hat = _number("c_hat", c_hat)
    return (k * c_hat + k + 1) / expected_tokens(alpha, k)


def best_k(alpha, c, *, k_max: int = DEFAULT_K_MAX):
    """The ``k`` in ``1..k_max`` with the largest ``speed_ratio``, and that ratio.

    Returns ``(k, S)``; ties go to the smaller ``k``.  For ``α < 1``,
    ``S(k) <= 1 / ((1 - α)(1 + k·c))`` (as ``1 - α^{k+1} <= 1``), a bound that does not
    grow with ``k``: once it is at or below the best ratio found, no larger ``k`` can
    win and the search stops.  When it stops before ``k_max`` (always, for ``c > 0``
    and ``k_max`` large enough) the answer is the best over *all* ``k``.  With
    ``c = 0`` or ``α = 1`` the ratio can keep rising with ``k``; then ``k_max`` caps it.
    """
    alpha, c = _alpha(alpha), _number("c", c)
    k_max = check_positive_int("k_max", k_max)
    best = (1, speed_ratio(alpha, 1, c))
    for k in range(2, k_max + 1):
        if alpha < 1 and 1 / ((1 - alpha) * (1 + k * c)) <= best[1]:
            break  # S(k') <= bound(k') <= bound(k) <= best for every k' >= k
        ratio = speed_ratio(alpha, k, c)
        if ratio > best[1]:
            best = (k, ratio)
    return best


def best_k_table(alphas, costs, *, k_max: int = DEFAULT_K_MAX) -> dict:
    """``best_k`` over a grid  # -> {(alpha, c): (k, S)}"""
    return {(a, c): best_k(a, c, k_max=k_max) for a in alphas for c in costs}
