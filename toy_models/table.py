"""Table models: next-token distributions that depend on the last token only.

The smallest context-dependent models there are -- and context dependence is what
exposes bugs like judging later draft positions after a rejection, or a KV cache
that is not rolled back.  ``table[x]`` is the row used after token ``x``; the
oracle's cases and ``specref.strategies`` are built from such tables.

- :class:`LogitTable` is a plain specref model: ``model(tokens) -> logits [len, V]``.
- :class:`ProbTable` is an exact-capable model: ``model.probs(tokens) -> [len, V]``
  rows of probabilities (float64, or ``Fraction`` objects for exact laws).
"""

from __future__ import annotations

import numpy as np

from specref.errors import SpecrefError, check_prob_rows, check_tokens, is_exact

__all__ = ["LogitTable", "ProbTable"]


def _square(name, table):
    if getattr(table, "ndim", None) != 2 or table.shape[0] != table.shape[1] or table.shape[0] < 1:
        raise SpecrefError(f"{name} must be a square [V, V] array, got shape {getattr(table, 'shape', None)}")
    return table


class LogitTable:
    """``logits(. | ..., x) = table[x]``.  ``[V, V]`` float logits (-inf allowed, NaN not)."""

    def __init__(self, table):
        table = _square("table", np.asarray(table, dtype=np.float64))
        if np.isnan(table).any() or np.isposinf(table).any():
            raise SpecrefError("table must not contain NaN or +inf logits")
        self.table = table
        self.vocab_size = table.shape[0]

    def __call__(self, tokens):  # [n] -> [n, V]
        return self.table[check_tokens("tokens", tokens, self.vocab_size)]

    def __repr__(self):
        return f"LogitTable(V={self.vocab_size})"


class ProbTable:
    """``P(. | ..., x) = table[x]``.  ``[V, V]`` probability rows, float or Fraction."""

    def __init__(self, table):
        table = _square("table", table if is_exact(table) else np.asarray(table, dtype=np.float64))
        self.table = check_prob_rows("table", table)
        self.vocab_size = table.shape[0]

    def probs(self, tokens):  # [n] -> [n, V]
        return self.table[check_tokens("tokens", tokens, self.vocab_size)]

    def __repr__(self):
        return f"ProbTable(V={self.vocab_size}, exact={is_exact(self.table)})"
