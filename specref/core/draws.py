"""Randomness: the caller's ``rng`` checked or coerced, and every categorical draw.

Two ways to draw a token, each written once:

- :func:`draw` hands a row to ``rng.choice(V, p=row)``.  The host loops use it
  (:mod:`specref.core.step`, :mod:`specref.core.tree_verify`, the chain and tree
  loops): the exact enumerator's ``choice`` branches over every positive entry, so
  the law of a whole loop can be enumerated.
- :func:`categorical` locates uniform coins in a row's cumulative sum (inverse-CDF
  sampling), vectorised over many rows or coins on any array-API namespace.  The
  batched and vectorised samplers use it (:mod:`specref.decoding.batched`,
  :mod:`specref.decoding.vectorized`): coins are drawn in bulk on the host, and in
  its comparison form the exact enumerator's lazy uniforms work too.

``rng`` itself: :func:`check_rng` refuses what is not a generator instance (the
step and the chain loops), :func:`coerce_rng` turns an integer seed into
``numpy.random.default_rng(seed)`` (the batched loops, and the zoo's implementations
that take a seed in statistical mode).
"""

from __future__ import annotations

import types

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.core.numbers import is_exact

__all__ = ["check_rng", "coerce_rng", "draw", "categorical"]


def check_rng(rng, name: str = "rng"):
    """``rng`` is a generator *instance*: a ``numpy.random.Generator``, or an object with
    ``random()`` and ``choice(n, p=...)`` such as the exact enumerator's generator.

    Refused with SpecrefError naming ``name``: None, a class (``np.random.Generator``
    itself), a module (``np.random``), and the legacy ``np.random.RandomState``, whose
    ``choice`` cannot take exact (``Fraction``) rows and whose streams differ.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    hint = "pass a generator instance such as numpy.random.default_rng(seed)"
    if rng is None:
        raise SpecrefTypeError(f"{name} must be a generator instance, got None; {hint}")
    if isinstance(rng, type):
        raise SpecrefTypeError(f"{name} must be a generator instance, got the class {rng.__name__}; {hint}")
    if isinstance(rng, types.ModuleType):
        raise SpecrefTypeError(f"{name} must be a generator instance, got the module {rng.__name__}; {hint}")
    if isinstance(rng, np.random.RandomState):
        raise SpecrefTypeError(f"{name} must be a numpy.random.Generator, got the legacy RandomState; {hint}")
    if not (callable(getattr(rng, "random", None)) and callable(getattr(rng, "choice", None))):
        raise SpecrefTypeError(f"{name} must be a generator with random() and choice(n, p=...), got "
                           f"{type(rng).__name__}; {hint}")
    return rng


def coerce_rng(rng, *, check: bool = False):
    """The generator to draw from: an integer seed (not a bool) becomes ``numpy.random.default_rng(seed)``.

    Anything else comes back unchanged -- with ``check=True`` only when it has a
    callable ``random()`` (a Generator or the exact enumerator's generator), else
    SpecrefError.  A seed, not a stream, is what statistical mode hands an
    implementation, so the same seed always replays the same coins.
    """
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    if check and not callable(getattr(rng, "random", None)):
        raise SpecrefError(f"rng must be a numpy.random.Generator, an int seed or the enumerator, got {rng!r}")
    return rng


def draw(rng, probs) -> int:
    """One token ``~ probs`` through ``rng.choice(V, p=probs)``.  ``[V] -> int``

    A ``numpy.random.Generator`` only takes float weights, so exact rows are handed
    to it as float64; any other generator (the exact enumerator's) gets the
    ``Fraction`` row itself, which keeps its law exact.
    """
    if isinstance(rng, np.random.Generator) and is_exact(probs):
        probs = probs.astype(np.float64)
    return int(rng.choice(probs.shape[0], p=probs))


def categorical(weights, u, *, xp, scaled_coin: bool = False):
    """Inverse-CDF draws: each coin ``u`` in [0, 1) picks the token where the cumulative weight passes it.

    Weights need not sum to 1 (only their total must be positive), and a zero-weight
    token is never returned.  Two forms, each the numerics one kind of caller needs:

    - ``scaled_coin=False``: ``weights [B, V]``, one coin per row ``u [B]`` -> ``[B]`` int64,
      ``#{j : cdf_j / total <= u}``.  Only comparisons touch the coin, so the exact
      enumerator's lazy uniforms work (NumPy object rows); ``cdf / total`` is exactly 1
      at the last positive entry, so with ``u < 1`` the index is a positive-weight token.
      ``weights [V]`` shared by float coins ``u [n]`` -> ``[n]``: the same count, found
      by ``searchsorted`` on ``cdf / total`` (sorted, so the two agree bit for bit)
      without an ``[n, V]`` temporary.
    - ``scaled_coin=True``: one row ``weights [V]`` shared by every coin ``u [n]`` -> ``[n]``
      int64, ``searchsorted(cdf, u * total, side="right")``.  O(V + n log V) with no
      ``[n, V]`` temporary, and the row is never divided by its total (which may be
      tiny); the clip to the last positive token only matters when rounding makes
      ``u * total == total``.  Float coins only.
    """
    if scaled_coin:
        cdf = xp.cumulative_sum(weights)
        idx = xp.searchsorted(cdf, u * cdf[-1], side="right")
        positive = xp.concat([cdf[:1] > 0, cdf[1:] > cdf[:-1]])
        last = cdf.shape[0] - 1 - int(xp.argmax(xp.astype(xp.flip(positive), xp.int8)))
        return xp.astype(xp.clip(idx, max=last), xp.int64)
    if weights.ndim == 1:
        cdf = xp.cumulative_sum(weights)
        return xp.astype(xp.searchsorted(cdf / cdf[-1], u, side="right"), xp.int64)
    cdf = xp.cumulative_sum(weights, axis=1)
    norm = cdf / cdf[:, -1:]
    return xp.sum(xp.astype(norm <= u[:, None], xp.int64), axis=1)
