"""Models over cases: position-aware tables, and plain callables with logits for every position.

Two things a decoder written against real models needs from the oracle's cases
(SPEC §3-§4):

- **Position-aware tables** (:class:`PositionLogitTable`, :class:`PositionProbTable`).
  The rows of :mod:`specref.verification.cases.tables` depend on the last ``h`` tokens only,
  so a context that was shifted, duplicated or re-fed on top of a cache looks the
  same to them.  Here a ``[V, V, V]`` table holds at ``table[n % V, s % V]`` the row
  after a prefix of ``n`` tokens whose ids sum to ``s``: every row depends on the
  absolute position *and* on every token of the prefix, so a re-fed prefix changes
  both indices (a ``Case`` with ``context="position"``).
- **Plain callables** (:func:`logits_fn`, :func:`case_logits_fns`): ``fn(tokens [n]) ->
  logits [n, V]`` (float64) for a case's target and draft, or for any specref model
  (an n-gram, the toy transformer, a table): row ``j`` belongs to the prefix
  ``tokens[:j + 1]``.  A probability row becomes ``log p`` (``-inf`` where ``p = 0``),
  whose softmax is the row again.  A ``[B, n]`` batch gives ``[B, n, V]``.  No torch:
  :mod:`specref.adapters.hf_models` builds torch modules and Hugging Face models on them.
"""

from __future__ import annotations

import numpy as np

from specref.core.errors import SpecrefError, check_tokens
from specref.verification.cases.tables import LogitTable, ProbTable

__all__ = ["PositionLogitTable", "PositionProbTable", "logits_fn", "case_logits_fns"]


def _position_rows(table, tokens):  # [n] -> [n, V]: row j after tokens[:j + 1]
    V = table.shape[-1]
    tokens = check_tokens("tokens", tokens, V)
    if table.ndim != 3:
        raise SpecrefError(f"a position table must have shape [V, V, V], got {table.shape}")
    if not tokens:
        return np.empty((0, V), dtype=table.dtype)
    n = np.arange(1, len(tokens) + 1)  # the prefix length: the absolute position of the next token
    s = np.cumsum(tokens)  # the sum of the prefix's ids: every token counts
    return table[n % V, s % V]


class PositionLogitTable(LogitTable):
    """Logits ``table[n % V, sum(prefix) % V]`` after a prefix of ``n`` tokens.  ``[V, V, V]``."""

    def _rows(self, tokens):
        return _position_rows(self.table, tokens)

    def __repr__(self):
        return f"PositionLogitTable(V={self.vocab_size})"


class PositionProbTable(ProbTable):
    """Probability rows ``table[n % V, sum(prefix) % V]`` (float or Fraction).  ``[V, V, V]``."""

    def _rows(self, tokens):
        return _position_rows(self.table, tokens)

    def __repr__(self):
        return f"PositionProbTable(V={self.vocab_size})"


def logits_fn(model):
    """Any specref model -> ``fn(tokens) -> logits`` (float64): ``[n] -> [n, V]``, ``[B, n] -> [B, n, V]``.

    A model with ``probs`` (a :class:`ProbTable`, an n-gram's ``exact`` view) gives
    ``log p``; a callable model (a :class:`LogitTable`, an n-gram, the toy
    transformer) gives its logits.  The row for position ``j`` conditions on
    ``tokens[:j + 1]`` only: nothing is cached, so every call is a full recompute.
    """
    exact = hasattr(model, "probs")
    if not exact and not callable(model):
        raise SpecrefError(f"model must be callable (tokens -> logits) or have .probs, got {model!r}")

    def one(tokens):  # [n] -> [n, V]
        rows = model.probs(tokens) if exact else model(tokens)
        rows = np.asarray(rows, dtype=np.float64)
        if exact:
            with np.errstate(divide="ignore"):  # log 0 = -inf: a token the row never draws
                rows = np.log(rows)
        return rows

    def fn(tokens):
        arr = np.asarray(tokens.tolist() if hasattr(tokens, "tolist") else tokens)
        if arr.ndim == 1:
            return one(arr.tolist())
        if arr.ndim == 2:
            return np.stack([one(row.tolist()) for row in arr])  # [B, n] -> [B, n, V]
        raise SpecrefError(f"tokens must have shape [n] or [B, n], got {arr.shape}")

    fn.vocab_size = _vocab_size(model)
    fn.model = model
    return fn


def case_logits_fns(case):
    """``(target_fn, draft_fn)``: a case's models as :func:`logits_fn` callables."""
    target, draft = case.models()
    return logits_fn(target), logits_fn(draft)


def _vocab_size(model):
    v = getattr(model, "vocab_size", None)
    if v is None and hasattr(model, "model"):
        v = getattr(model.model, "vocab_size", None)
    if v is None:
        raise SpecrefError(f"model {model!r} has no vocab_size")
    return int(v)
