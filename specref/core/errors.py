"""One exception family for bad input, and the checks that raise it.

Every public function of specref validates what it is handed and raises
:class:`SpecrefError` (a ``ValueError``) with a message that names the argument
and the offending value -- never a silent fallback, never a crash deep inside
NumPy.  The checks here are shared by the sampling rules, the step and the loops.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np

from specref.core.backend import to_numpy
from specref.core.numbers import is_exact

__all__ = [
    "SpecrefError",
    "SpecrefTypeError",
    "FLOAT_ROW_TOL",
    "LOW_PRECISION_FACTOR",
    "LowPrecisionRows",
    "row_tolerance",
    "check_prob_rows",
    "check_tokens",
    "check_positive_int",
]

FLOAT_ROW_TOL = 1e-9  # a float64 probability row must sum to 1 within this
LOW_PRECISION_FACTOR = 8  # float32/float16 rows: tolerance = max(FLOAT_ROW_TOL, this x eps x sqrt(V))
_LOW_PRECISION_CAP = 1e-2  # ... and never looser than this


def row_tolerance(dtype, V: int, *, cap: float | None = _LOW_PRECISION_CAP, scale_float64: bool = False) -> float:
    """How far from 1 a row of ``dtype`` over ``V`` tokens may sum.  ``(dtype, V) -> float``

    Lower-precision floats (float32, float16, bfloat16-like):
    ``LOW_PRECISION_FACTOR * eps(dtype) * sqrt(V)``, at least ``FLOAT_ROW_TOL`` (1e-9)
    and at most ``cap`` (1e-2; None: no cap) -- a softmax computed in that precision
    is off by a few eps times a factor that grows with the length of the sum (float32,
    V = 50,000: 2.1e-4; real rows miss by 3e-8 to 1e-7).  float64 (and wider) rows:
    ``FLOAT_ROW_TOL``, or with ``scale_float64=True`` the same eps formula (it passes
    1e-9 only for V > 3.2e11).  Integer rows: ``FLOAT_ROW_TOL``.

    The defaults are what :func:`check_prob_rows` accepts;
    :func:`specref.decoding.batched.row_tolerance` is ``cap=None, scale_float64=True``.
    """
    dt = np.dtype(dtype)
    if dt.kind != "f" or (dt.itemsize >= 8 and not scale_float64):
        return FLOAT_ROW_TOL
    tol = max(FLOAT_ROW_TOL, LOW_PRECISION_FACTOR * float(np.finfo(dt).eps) * math.sqrt(V))
    return tol if cap is None else min(tol, cap)


class LowPrecisionRows(UserWarning):
    """Issued when float32/float16 probability rows were renormalised in float64 before use."""


class SpecrefError(ValueError):
    """Bad input to a specref function; the message names the argument and value."""


class SpecrefTypeError(SpecrefError, TypeError):
    """An argument of the wrong type: both a SpecrefError and a TypeError; the message names it."""


def _show(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """An int >= ``minimum`` (bools refused), else SpecrefError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SpecrefTypeError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    if value < minimum:
        raise SpecrefError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    return int(value)


def check_prob_rows(name: str, rows, *, shape: tuple | None = None):
    """Validate probability rows (``[..., V]``): finite, non-negative, each summing to 1.

    Float64 rows must sum to 1 within ``FLOAT_ROW_TOL``; object rows (``Fraction``)
    must hold only rationals and sum to exactly 1.  ``shape`` entries that are not
    None must match.  Returns the rows unchanged -- except lower-precision float rows
    (float32, float16), which are accepted within :func:`row_tolerance` and come back
    as host float64 rows renormalised to sum to 1; that this was done is recorded by
    a :class:`LowPrecisionRows` warning (shown once per call site, as warnings are).
    """
    ndim = getattr(rows, "ndim", None)
    if ndim is None or not hasattr(rows, "shape"):
        raise SpecrefTypeError(f"{name} must be an array of probabilities, got {type(rows).__name__}")
    if shape is not None:
        if ndim != len(shape) or any(
            want is not None and got != want for got, want in zip(rows.shape, shape)
        ):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise SpecrefError(f"{name} must have shape {want}, got {tuple(rows.shape)}")
    if ndim == 0 or rows.shape[-1] == 0:
        raise SpecrefError(f"{name} must have a non-empty last (vocabulary) axis, got shape {tuple(rows.shape)}")
    if is_exact(rows):
        flat = rows.reshape(-1, rows.shape[-1])
        if not {type(v) for v in rows.flat} <= {Fraction, int}:
            i, j = next((i, j) for i, row in enumerate(flat) for j, v in enumerate(row)
                        if type(v) not in (Fraction, int))
            raise SpecrefTypeError(f"{name}[{i}][{j}] must be a Fraction, got {_show(flat[i][j])}")
        for i, row in enumerate(flat):
            lowest = min(row)
            if lowest < 0:
                raise SpecrefError(f"{name}[{i}][{list(row).index(lowest)}] is negative: {lowest}")
            total = sum(row)
            if total != 1:
                raise SpecrefError(f"{name} row {i} sums to {total}, not exactly 1")
        return rows
    host = to_numpy(rows)
    if host.dtype.kind not in "fiu":
        raise SpecrefTypeError(f"{name} must hold real numbers, got dtype {host.dtype}")
    flat = host.reshape(-1, host.shape[-1]).astype(np.float64)
    bad = ~np.isfinite(flat)
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        raise SpecrefError(f"{name}[{i}][{j}] is not finite: {flat[i, j]}")
    neg = flat < 0
    if neg.any():
        i, j = map(int, np.argwhere(neg)[0])
        raise SpecrefError(f"{name}[{i}][{j}] is negative: {flat[i, j]}")
    sums = flat.sum(axis=-1)
    tol = row_tolerance(host.dtype, host.shape[-1])
    off = ~(np.abs(sums - 1.0) <= tol)
    if off.any():
        i = int(np.argmax(off))
        raise SpecrefError(f"{name} row {i} sums to {sums[i]!r}, not 1 (tolerance {tol:.3g} for "
                           f"{host.dtype} rows of V={host.shape[-1]})")
    if tol != FLOAT_ROW_TOL or (host.dtype.kind == "f" and host.dtype.itemsize < 8):
        warnings.warn(f"{name}: {host.dtype} probability rows accepted within row_tolerance and renormalised "
                      f"in float64", LowPrecisionRows, stacklevel=2)
        return (flat / sums[:, None]).reshape(host.shape)
    return rows


def check_tokens(name: str, tokens, vocab_size: int, *, length: int | None = None) -> list[int]:
    """Tokens as a list of ints in ``0..vocab_size-1`` (optionally of a given length)."""
    try:
        seq = list(tokens.tolist() if hasattr(tokens, "tolist") else tokens)
    except TypeError:
        raise SpecrefTypeError(f"{name} must be a sequence of token ids, got {_show(tokens)}") from None
    if length is not None and len(seq) != length:
        raise SpecrefError(f"{name} must hold {length} tokens, got {len(seq)}: {_show(seq)}")
    out = []
    for i, t in enumerate(seq):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise SpecrefTypeError(f"{name}[{i}] must be an integer token id, got {_show(t)}")
        if not 0 <= t < vocab_size:
            raise SpecrefError(f"{name}[{i}] = {t} is out of range for vocabulary size {vocab_size}")
        out.append(int(t))
    return out
