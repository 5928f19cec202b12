"""Array-backend dispatch: the numerical core runs on the library its inputs come from.

Public numerics start with ``xp = namespace(x, ...)`` (array-api-compat's
``array_namespace``), so the same code runs on NumPy, on ``array_api_strict``
(which CPU-only CI uses to catch code that would not run on CuPy) and on CuPy.
Random numbers are always drawn on the host from the caller's ``rng``, so values
that feed a random choice come back to NumPy through :func:`to_numpy`.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace, is_cupy_array, is_numpy_array

__all__ = ["namespace", "to_numpy", "is_numpy_array"]


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
