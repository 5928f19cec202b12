"""Exact or float: the one place that decides which arithmetic a set of rows gets.

Probability rows are either NumPy object arrays of ``Fraction`` (exact: every sum,
ratio and comparison is a rational, so a law can be shown to equal another with
TV == 0) or real arrays (float64 arithmetic, agreement means TV <= 1e-12;
docs/spec.md §5).  When both kinds meet -- an exact n-gram target with a float
transformer draft, say -- they are compared in float64.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_exact", "same_kind"]


def is_exact(rows) -> bool:
    """True for NumPy object arrays (of ``Fraction``): arithmetic on them is exact."""
    return isinstance(rows, np.ndarray) and rows.dtype == object


def same_kind(*rows):
    """The rows unchanged when all are exact or all float; else all as float64."""
    if len({is_exact(r) for r in rows}) == 1:
        return rows
    return tuple(np.asarray(r, dtype=np.float64) if not is_exact(r) else r.astype(np.float64) for r in rows)
