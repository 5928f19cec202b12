"""Batched decoding loops: B requests in lockstep, one target call per iteration for all of them.

A serving engine decodes many requests at once.  Each iteration of
:func:`batched_speculative_decode`:

1. drafts K tokens for every unfinished request (K draft calls, each over all of them);
2. scores every request's ``[last token, x_1..x_K]`` with **one** target call;
3. verifies all rows with :func:`specref.decoding.batched.batched_step` (Leviathan et al. 2022,
   Algorithm 1, row by row): request ``b`` keeps ``n_accepted[b]`` drafts and one more token.

Acceptance is ragged, so the ``[B, K+1]`` block of one iteration is padded with the
placeholder after each row's tokens; :class:`BatchResult` counts those padded slots (target
positions scored and then thrown away), the price of lockstep batching.  A request stops at
``max_new_tokens`` or right after a stop token and leaves the batch; the others go on.

:func:`batched_target_decode` is the baseline: one target call per iteration, one new token
per request.

Models, for ``target`` and ``draft``: an object with ``batch(token_lists) -> [logits per
request]`` (one call for all, e.g. :class:`toy_models.transformer.BatchedCachedTransformer`;
``None`` entries are requests that have finished), a list of B per-request models, or one
model shared by every request (any model :func:`specref.decoding.chain.model_rows` accepts).

Randomness, in order per iteration: ``rng.random((A, 1))`` for each draft position (A
requests still running), then the acceptance and final coins of ``batched_step``.  Every draw
compares a coin with thresholds, so the exact enumerator of :mod:`specref.verification.laws.enumeration`
can run the loop over Fraction rows and give its output law.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int, check_tokens
from specref.core.sampling import SamplingConfig, process
from specref.decoding.batched import batched_step, sample_drafts
from specref.decoding.chain import model_rows

__all__ = ["BatchResult", "batched_speculative_decode", "batched_target_decode"]


@dataclass
class BatchResult:
    """What a batched decode emitted and what it cost."""

    tokens: list  # [B] lists: each request's new tokens
    iterations: int = 0  # target calls
    emitted: list = field(default_factory=list)  # [iterations] dicts {request: tokens kept this iteration}
    accepted: list = field(default_factory=list)  # [B] lists: drafts accepted at each of the request's iterations
    slots: int = 0  # slots of the iterations' [A, K+1] blocks (A requests running), summed
    padded: int = 0  # placeholder slots among them (positions scored, then thrown away)
    finished_at: list = field(default_factory=list)  # [B]: the iteration (1-based) whose block finished the request

    @property
    def padding_fraction(self) -> float:
        """Placeholder slots over all slots of the iterations' ``[A, K+1]`` blocks."""
        return self.padded / self.slots if self.slots else 0.0


def _check(prompts, config, max_new_tokens, stop_tokens, V=None):
    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r:.80}")
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise SpecrefError(f"prompts must be a non-empty list of token lists, got {prompts!r:.80}")
    prompts = [check_tokens(f"prompts[{b}]", p, V) for b, p in enumerate(prompts)]
    check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    stops = frozenset(check_tokens("stop_tokens", list(stop_tokens), V))
    return prompts, stops


def _rows(model, token_lists, n_rows, config, name):  # B x [n_b] or None -> B x [n_rows, V] or None
    if hasattr(model, "batch"):
        out = model.batch(token_lists)
        if not isinstance(out, (list, tuple)) or len(out) != len(token_lists):
            raise SpecrefError(f"{name}.batch must return one logits array per request ({len(token_lists)}), got {type(out).__name__}")
        rows = []
        for b, (tokens, logits) in enumerate(zip(token_lists, out)):
            if tokens is None:
                rows.append(None)
                continue
            shape = getattr(logits, "shape", None)
            if shape is None or len(shape) != 2 or shape[0] != len(tokens):
                raise SpecrefError(f"{name}.batch: request {b} must get logits of shape [{len(tokens)}, V], got {shape}")
            rows.append(process(logits[len(tokens) - n_rows :], config))
        return rows
    per = model if isinstance(model, (list, tuple)) else [model] * len(token_lists)
    if len(per) != len(token_lists):
        raise SpecrefError(f"{name}: {len(per)} per-request models for {len(token_lists)} requests")
    return [None if t is None else model_rows(m, t, n_rows, config, name=name) for m, t in zip(per, token_lists)]


def _keep(out, emitted, max_new_tokens, stops) -> int:
    """Append what fits (up to ``max_new_tokens``, through the first stop token); how many were kept."""
    kept = 0
    for t in emitted:
        if len(out) >= max_new_tokens:
            break
        out.append(int(t))
        kept += 1
        if int(t) in stops:
            break
    return kept


def _finished(out, max_new_tokens, stops) -> bool:
    return len(out) >= max_new_tokens or (bool(out) and out[-1] in stops)


def batched_speculative_decode(target, draft, prompts, *, k: int, config: SamplingConfig, max_new_tokens: int,
                               rng, stop_tokens=()) -> BatchResult:
    """Speculative decoding of every prompt at once, one target call per iteration (module docstring)."""
    k = check_positive_int("k", k)
    V = getattr(target, "vocab_size", None)
    prompts, stops = _check(prompts, config, max_new_tokens, stop_tokens, V)
    B = len(prompts)
    res = BatchResult(tokens=[[] for _ in range(B)], accepted=[[] for _ in range(B)], finished_at=[0] * B)
    live = [b for b in range(B) if max_new_tokens > 0]
    while live:
        seqs = {b: prompts[b] + res.tokens[b] for b in live}
        drafts: dict[int, list[int]] = {b: [] for b in live}
        q = []  # K x [A, V]
        for _ in range(k):
            rows = _rows(draft, [seqs[b] + drafts[b] if b in seqs else None for b in range(B)], 1, config, "draft")
            q_j = np.stack([np.asarray(rows[b][0]) for b in live])  # [A, V]
            x_j = sample_drafts(q_j[:, None, :], rng)[:, 0]  # [A]
            for b, x in zip(live, x_j):
                drafts[b].append(int(x))
            q.append(q_j)
        rows = _rows(target, [seqs[b] + drafts[b] if b in seqs else None for b in range(B)], k + 1, config, "target")
        p = np.stack([np.asarray(rows[b]) for b in live])  # [A, K+1, V]
        steps = batched_step(p, np.stack(q, axis=1), np.array([drafts[b] for b in live]), rng)
        res.iterations += 1
        res.slots += len(live) * (k + 1)
        res.padded += int(len(live) * (k + 1) - np.sum(steps.n_emitted))
        kept = {}
        for i, b in enumerate(live):
            n = int(steps.n_emitted[i])
            kept[b] = _keep(res.tokens[b], [int(t) for t in steps.tokens[i, :n]], max_new_tokens, stops)
            res.accepted[b].append(int(steps.n_accepted[i]))
            if _finished(res.tokens[b], max_new_tokens, stops):
                res.finished_at[b] = res.iterations
        res.emitted.append(kept)
        live = [b for b in live if not res.finished_at[b]]
    return res


def batched_target_decode(target, prompts, *, config: SamplingConfig, max_new_tokens: int, rng,
                          stop_tokens=()) -> BatchResult:
    """Plain decoding of every prompt at once: one target call and one new token per request per iteration."""
    V = getattr(target, "vocab_size", None)
    prompts, stops = _check(prompts, config, max_new_tokens, stop_tokens, V)
    B = len(prompts)
    res = BatchResult(tokens=[[] for _ in range(B)], finished_at=[0] * B)
    live = [b for b in range(B) if max_new_tokens > 0]
    while live:
        rows = _rows(target, [prompts[b] + res.tokens[b] if b in live else None for b in range(B)], 1, config, "target")
        p = np.stack([np.asarray(rows[b][0]) for b in live])  # [A, V]
        x = sample_drafts(p[:, None, :], rng)[:, 0]  # one categorical draw per request
        res.iterations += 1
        kept = {}
        for b, t in zip(live, x):
            kept[b] = _keep(res.tokens[b], [int(t)], max_new_tokens, stops)
            if _finished(res.tokens[b], max_new_tokens, stops):
                res.finished_at[b] = res.iterations
        res.emitted.append(kept)
        live = [b for b in live if not res.finished_at[b]]
    return res
