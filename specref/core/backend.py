"""Array-backend dispatch: the numerical core runs on the library its inputs come from.

Public numerics start with ``xp = namespace(x, ...)`` (array-api-compat's
``array_namespace``), so the same code runs on NumPy, on ``array_api_strict``
(which CPU-only CI uses to catch code that would not run on CuPy) and on CuPy.
Random numbers are always drawn on the host from the caller's ``rng``, so values
that feed a random choice come back to NumPy through :func:`to_numpy`.

Host copies, each written once: :func:`to_numpy` (NumPy, CuPy, DLPack producers),
:func:`to_host` (that, plus torch tensors on any device), :func:`host_rows` (host
probability rows renormalised in float64, as an engine emulation reads them).
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace, is_cupy_array, is_numpy_array

__all__ = ["namespace", "to_numpy", "to_host", "host_rows", "is_numpy_array"]


def namespace(*arrays):
    """The array-API namespace of ``arrays`` (NumPy's compat namespace for ndarrays)."""
    return array_namespace(*arrays)


def to_numpy(x) -> np.ndarray:
    """Copy ``x`` to a host NumPy array (no copy when it already is one)."""
    if isinstance(x, np.ndarray):
        return x
    if is_cupy_array(x):
        return x.get()
    if isinstance(x, (list, tuple, int, float)):
        return np.asarray(x)
    try:
        return np.from_dlpack(x)
    except (TypeError, AttributeError, RuntimeError, BufferError):
        return np.asarray(x)


def to_host(x) -> np.ndarray:
    """Copy ``x`` to a host NumPy array from any backend and device.  ``[...] -> [...]``, values unchanged

    :func:`to_numpy`, after ``x.cpu()`` for objects that have it (torch tensors: a
    CUDA tensor exports no host buffer, so ``to_numpy`` alone refuses it).
    """
    if not isinstance(x, np.ndarray) and hasattr(x, "cpu"):
        x = x.cpu()
    return to_numpy(x)


def host_rows(rows) -> np.ndarray:
    """Host probability rows, float ones renormalised in float64.  ``[..., V] -> [..., V]``

    Object (``Fraction``) rows come back as they are -- exact, already summing to 1;
    real rows as float64, each divided by its own sum, so float32 rows that sum to
    1 only within their rounding become rows whose sums are 1 to float64 rounding.
    """
    h = to_host(rows)
    if h.dtype == object:
        return h
    h = h.astype(np.float64)
    return h / h.sum(axis=-1, keepdims=True)
