"""Engine-shaped verifiers under the batched oracle level: vLLM V1 style and FlashInfer style.

Each adapter turns a verifier written in an engine's call into the ``"batched"`` level's
``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)``
(:mod:`specref.verification.levels.batched`), in a few lines; each comes with specref's own reference
written in that call, with the input checks an engine's caller relies on.

vLLM V1 (``vllm/v1/sample/rejection_sampler.py``, ``rejection_sample``)::

    rejection_sample(draft_token_ids [T], num_draft_tokens list[B], max_spec_len,
                     cu_num_draft_tokens [B] (inclusive: request b owns [cu[b-1], cu[b])),
                     draft_probs [T, V] | None, target_probs [T, V], bonus_token_ids [B, 1],
                     sampling_metadata) -> [B, max_spec_len + 1] int32, -1 after the emitted tokens

  ``target_probs`` holds only the judged positions; the bonus token is drawn by the caller from
  the bonus row and passed in.  The adapter's call replaces ``sampling_metadata`` (the engine's
  generators) with the oracle's ``seed``: ``fn(draft_token_ids, num_draft_tokens, max_spec_len,
  cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, seed)``.

FlashInfer (``flashinfer/sampling.py``, ``chain_speculative_sampling``)::

    chain_speculative_sampling(draft_probs [B, n, V], draft_token_ids [B, n] int32,
                               target_probs [B, n+1, V], ..., generator=None, seed=None, offset=None)
        -> (output_token_ids [B, n+1] int32 with -1, accepted_num [B], emitted_num [B])

  ``emitted_num`` counts the emitted drafts (the bonus excluded); ``accepted_num`` counts drafts
  that would pass on their own (a diagnostic the adapter does not check).  Dense rows only (no
  ragged K) and no point-mass drafts: the adapter hands one-hot draft rows for ``q_draft = None``.
  The adapter's call: ``fn(draft_probs, draft_token_ids, target_probs, seed)``.

Two levels apply the adapters themselves, so an engine-shaped function is checked as it is:
``check("vllm", fn)`` and ``check("flashinfer", fn)``.  The real FlashInfer kernel in this call
is :func:`specref.adapters.engines.flashinfer_engine`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from specref.core.backend import host_rows, namespace, to_numpy
from specref.core.draws import categorical, draw
from specref.core.errors import SpecrefError
from specref.decoding.batched import PLACEHOLDER, batched_step
from specref.verification.levels.batched import default_batched_cases, run_batched
from specref.verification.levels.batched import LEVELS as _BATCHED
from specref.verification.running.level import Level

__all__ = [
    "vllm_style",
    "flashinfer_style",
    "vllm_reference",
    "flashinfer_reference",
    "check_ragged_layout",
    "LEVELS",
]


def _ragged_counts(draft_tokens):
    x = to_numpy(draft_tokens).astype(np.int64)
    pad = x == PLACEHOLDER
    return x, np.where(pad.any(axis=1), pad.argmax(axis=1), x.shape[1]).astype(np.int64)


def _rows(a, idx):
    """``a.reshape(-1, V)[idx]`` on the array's own backend.  # [B, R, V], [T] -> [T, V]"""
    xp = namespace(a)
    flat = xp.reshape(a, (-1, a.shape[-1]))
    return xp.take(flat, xp.asarray(idx, device=getattr(flat, "device", None)), axis=0)


def _bonus(p_target, k, seed):
    """Bonus tokens ``~ p_target[b, k_b]``, drawn on the oracle's side.  # -> [B, 1]"""
    host = to_numpy(p_target)
    rows = host[np.arange(host.shape[0]), k]
    if isinstance(seed, (int, np.integer)):
        rng = np.random.default_rng([int(seed), 1])  # a stream the implementation's own seed does not touch
        return np.array([[draw(rng, r)] for r in host_rows(rows)], dtype=np.int64)
    # exact mode: one coin per row located in the row's CDF by comparison, as the reference draws
    # (so grid coins round the bonus draw the way they round the reference's)
    coins = np.array([seed.random() for _ in rows], dtype=object)
    return np.asarray(categorical(rows, coins, xp=np), dtype=np.int64)[:, None]


def vllm_style(fn):
    """A vLLM-V1-style flattened ragged verifier as a ``"batched"`` step_fn."""

    def step(p_target, q_draft, draft_tokens, seed):
        x, k = _ragged_counts(draft_tokens)
        B, K = x.shape
        live = np.flatnonzero((np.arange(K)[None, :] < k[:, None]).reshape(-1))  # [T] row-major: request-contiguous
        idx = (live // K) * (K + 1) + live % K  # the same positions in p_target [B, K+1, V]
        return fn(x.reshape(-1)[live], k.tolist(), K, np.cumsum(k), None if q_draft is None else _rows(q_draft, live),
                  _rows(p_target, idx), _bonus(p_target, k, seed), seed)

    step.__name__ = f"vllm_style({getattr(fn, '__name__', 'fn')})"
    return step


def flashinfer_style(fn):
    """A FlashInfer-``chain_speculative_sampling``-style verifier as a ``"batched"`` step_fn."""

    def step(p_target, q_draft, draft_tokens, seed):
        x, k = _ragged_counts(draft_tokens)
        if (k < x.shape[1]).any():
            raise SpecrefError("chain_speculative_sampling takes dense rows: ragged K is not part of its call")
        if q_draft is None:  # point-mass drafts as one-hot draft rows
            host = to_numpy(p_target)
            q_draft = np.zeros(x.shape + (host.shape[2],), dtype=host.dtype)
            np.put_along_axis(q_draft, x[..., None], 1, axis=2)
        ids, _, emitted = fn(q_draft, x.astype(np.int32), p_target, seed)
        emitted = to_numpy(emitted).astype(np.int64)
        return ids, emitted, emitted + 1  # (tokens, n_accepted, n_emitted)

    step.__name__ = f"flashinfer_style({getattr(fn, '__name__', 'fn')})"
    return step


# ---------------------------------------------------------------- references in the engines' calls


def check_ragged_layout(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                        draft_probs, target_probs, bonus_token_ids):
    """Validate a vLLM-style flattened batch; host ``(x [T], k [B], V)``.  Messages name argument and row."""
    x = to_numpy(draft_token_ids)
    cu = to_numpy(cu_num_draft_tokens).astype(np.int64).reshape(-1)
    k = np.asarray(list(num_draft_tokens), dtype=np.int64)
    B = cu.shape[0]
    if k.shape != (B,):
        raise SpecrefError(f"num_draft_tokens has {k.shape[0]} entries, cu_num_draft_tokens has {B}")
    steps = np.diff(np.concatenate([[0], cu]))
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise SpecrefError(f"cu_num_draft_tokens must be non-decreasing (inclusive cumulative counts): "
                           f"row {b} has {cu[b]} after {cu[b - 1] if b else 0}")
    if (steps != k).any():
        b = int(np.argmax(steps != k))
        raise SpecrefError(f"cu_num_draft_tokens row {b} gives {steps[b]} drafts, num_draft_tokens[{b}] = {k[b]}")
    if (k > max_spec_len).any():
        b = int(np.argmax(k > max_spec_len))
        raise SpecrefError(f"num_draft_tokens[{b}] = {k[b]} (row {b}) exceeds max_spec_len = {max_spec_len}")
    T = int(cu[-1]) if B else 0
    if x.shape != (T,):
        raise SpecrefError(f"draft_token_ids must have shape [T] = [{T}] (cu_num_draft_tokens[-1]), got {tuple(x.shape)}")
    tshape = tuple(getattr(target_probs, "shape", ()))
    if len(tshape) != 2 or tshape[0] != T:
        raise SpecrefError(f"target_probs must have shape [T, V] = [{T}, V], got {list(tshape)}")
    V = tshape[1]
    if draft_probs is not None and tuple(draft_probs.shape) != (T, V):
        raise SpecrefError(f"draft_probs must have shape [T, V] = [{T}, {V}] like target_probs, got {list(draft_probs.shape)}")
    bonus = to_numpy(bonus_token_ids).astype(np.int64)
    if bonus.shape != (B, 1):
        raise SpecrefError(f"bonus_token_ids must have shape [B, 1] = [{B}, 1], got {tuple(bonus.shape)}")
    if ((bonus < 0) | (bonus >= V)).any():
        b = int(np.argmax(((bonus < 0) | (bonus >= V)).reshape(-1)))
        raise SpecrefError(f"bonus_token_ids[{b}] = {bonus[b, 0]} (row {b}) is out of range for V = {V}")
    return x.astype(np.int64), k, V


def vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                   draft_probs, target_probs, bonus_token_ids, seed):
    """specref's chain rule in vLLM V1's ``rejection_sample`` call (``seed`` for ``sampling_metadata``).

    Unflattens to dense rows (the bonus row is the one-hot of ``bonus_token_ids``) and runs
    :func:`specref.decoding.batched.batched_step`.  Returns ``[B, max_spec_len + 1]`` int32, -1 padded.
    """
    x, k, V = check_ragged_layout(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                  draft_probs, target_probs, bonus_token_ids)
    B, K = k.shape[0], int(max_spec_len)
    t_host = to_numpy(target_probs)
    exact = t_host.dtype == object
    dt, zero = (object, Fraction(0)) if exact else (t_host.dtype, 0.0)  # float32 rows keep their dtype's tolerance
    p = np.full((B, K + 1, V), zero, dtype=dt)
    q = None if draft_probs is None else np.full((B, K, V), zero, dtype=dt)
    p[..., 0] = 1  # unused rows: a point mass (never read for a draw)
    dense_x = np.full((B, K), PLACEHOLDER, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(k)[:-1]]).astype(np.int64)
    d_host = None if draft_probs is None else to_numpy(draft_probs)
    bonus = to_numpy(bonus_token_ids).astype(np.int64)
    for b in range(B):
        s, n = int(starts[b]), int(k[b])
        p[b, :n] = t_host[s:s + n]
        p[b, n] = 0 * p[b, n]
        p[b, n, bonus[b, 0]] = 1
        if q is not None:
            q[b, :n] = d_host[s:s + n]
            q[b, n:] = 0 * q[b, n:]
            q[b, n:, 0] = 1
        dense_x[b, :n] = x[s:s + n]
    steps = batched_step(p, q, dense_x, seed, num_draft=k)
    return to_numpy(steps.tokens).astype(np.int32)


def flashinfer_reference(draft_probs, draft_token_ids, target_probs, seed):
    """specref's chain rule in FlashInfer's ``chain_speculative_sampling`` call.

    Returns ``(ids [B, n+1] int32 with -1, accepted_num [B], emitted_num [B])``; here
    ``accepted_num`` is the accepted-prefix count (FlashInfer's own counts independent passes).
    """
    steps = batched_step(target_probs, draft_probs, draft_token_ids, seed)
    acc = to_numpy(steps.n_accepted)
    return to_numpy(steps.tokens).astype(np.int32), acc, acc


# ---------------------------------------------------------------- the engine-shaped levels


def _engine_level(name, adapt, keep):
    batched = next(level for level in _BATCHED if level.name == "batched")

    def run(level, fn, cases, settings):
        report = run_batched(batched, adapt(fn), cases, settings)
        report.level = name
        return report

    return Level(name, _SIGNATURES[name], lambda: [c for c in default_batched_cases("batched") if keep(c)], run)


_SIGNATURES = {
    "vllm": "fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens [B], "
            "draft_probs [T, V] | None, target_probs [T, V], bonus_token_ids [B, 1], seed) -> [B, K+1]",
    "flashinfer": "fn(draft_probs [B, n, V], draft_token_ids [B, n], target_probs [B, n+1, V], seed) "
                  "-> (ids [B, n+1], accepted_num [B], emitted_num [B])",
}
LEVELS = (_engine_level("vllm", vllm_style, lambda c: True),
          _engine_level("flashinfer", flashinfer_style, lambda c: c.num_draft is None))
"""The engine-shaped levels: specref's batched level through each engine's call."""
