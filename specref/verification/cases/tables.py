"""Table models: next-token distributions that depend on the last ``h`` tokens only.

The smallest context-dependent models there are -- and context dependence is what
exposes bugs such as judging draft positions after a rejection (needs ``h >= 1``) or
a context that is not rolled back after a rejection (needs ``h >= 2``: with a bigram
the correction token alone fixes the next row).  A table of shape ``[V] * (h + 1)``
holds, at ``table[x_1, ..., x_h]``, the row used after the tokens ``x_1 .. x_h``; a
prefix shorter than ``h`` is left-padded with token 0.  The oracle's cases and
``specref.verification.cases.strategies`` are built from such tables.

- :class:`LogitTable` is a plain specref model: ``model(tokens) -> logits [len, V]``.
- :class:`ProbTable` is an exact-capable model: ``model.probs(tokens) -> [len, V]``
  rows of probabilities (float64, or ``Fraction`` objects for exact laws).
"""

from __future__ import annotations

import numpy as np

from specref.core.errors import SpecrefError, check_prob_rows, check_tokens
from specref.core.numbers import is_exact

__all__ = ["LogitTable", "ProbTable"]


def _cube(name, table):
    shape = getattr(table, "shape", None)
    if shape is None or len(shape) < 2 or len(set(shape)) != 1 or shape[0] < 1:
        raise SpecrefError(f"{name} must have shape [V, V] or [V] * (h + 1), got shape {shape}")
    return table


class _Table:
    def __init__(self, table):
        self.table = table
        self.vocab_size = table.shape[-1]
        self.context = table.ndim - 1  # h: how many previous tokens a row depends on

    def _rows(self, tokens):  # [n] -> [n, V]
        tokens = check_tokens("tokens", tokens, self.vocab_size)
        padded = [0] * (self.context - 1) + tokens
        return np.stack([self.table[tuple(padded[i : i + self.context])] for i in range(len(tokens))]) if tokens \
            else np.empty((0, self.vocab_size), dtype=self.table.dtype)


class LogitTable(_Table):
    """Logits ``table[x_1..x_h]`` after the tokens ``x_1..x_h``.  Float (-inf allowed; NaN, +inf not)."""

    def __init__(self, table):
        table = _cube("table", np.asarray(table, dtype=np.float64))
        if np.isnan(table).any() or np.isposinf(table).any():
            raise SpecrefError("table must not contain NaN or +inf logits")
        if not np.isfinite(table).any(axis=-1).all():
            raise SpecrefError("table has a row of all -inf logits: no token could follow that context")
        super().__init__(table)

    def __call__(self, tokens):  # [n] -> [n, V]
        return self._rows(tokens)

    def __repr__(self):
        return f"LogitTable(V={self.vocab_size}, h={self.context})"


class ProbTable(_Table):
    """Probability rows ``table[x_1..x_h]`` after ``x_1..x_h``: float or Fraction."""

    def __init__(self, table):
        table = _cube("table", table if is_exact(table) else np.asarray(table, dtype=np.float64))
        check_prob_rows("table", table)
        super().__init__(table)

    def probs(self, tokens):  # [n] -> [n, V]
        return self._rows(tokens)

    def __repr__(self):
        return f"ProbTable(V={self.vocab_size}, h={self.context}, exact={is_exact(self.table)})"
