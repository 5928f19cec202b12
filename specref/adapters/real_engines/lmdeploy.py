"""LMDeploy's portable rejection sampler, run from the wheel: as a ``batched`` step (statistical) and in
the ``batched_coins`` level's call with its coins handed in (exact).  Follows lmdeploy 0.18.0,
``lmdeploy/pytorch/backends/default/rejection_sampling.py`` (pure torch: the sampler LMDeploy builds
for devices without a kernel of their own).

``DefaultRejectionSamplingImpl.forward(target_logits [B, K, V], draft_token_ids [B, K], bonus_token_ids [B],
*, is_greedy, draft_probs [B, K, V] | None) -> (output_token_ids [B, K+1] with -1, num_rejected_tokens [B],
last_token_ids [B])``, as read in 0.18.0 (SPEC §3, Leviathan et al. notation: ``p`` target, ``q`` draft):

- ``target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)``: logits of the judged positions
  only; the bonus token is drawn by the caller (``RejectionSampler.forward`` samples it from the last
  logit row with its logits processor) and passed in;
- coins ``torch.rand((B, K), dtype=torch.float64)`` from torch's global generator; accept draft ``i`` iff
  ``draft_probs[x] > 0 and target_probs[x] / draft_probs[x] >= uniform`` -- **inclusive**; point-mass
  drafts (``draft_probs = None``): ``target_probs[x] >= uniform``;
- the recovered token: an exponential race, ``q = torch.empty((B, V)); q.exponential_()`` (float32, one
  vector per request shared by its K positions; only the first rejection's is read) and
  ``argmax(max(p - q_draft, 0) / q)`` (point mass: ``p`` with the draft zeroed);
- ``is_greedy = None`` for an all-random batch, as the oracle's rows are (temperature 1, no top-k).

The file imports nothing when called (its module body took ``torch`` and two names of
``..rejection_sampling``), so the shim serves it at load time only and the calls run outside it, on one
torch intra-op thread (rows of a few tokens).

LMDeploy's call has one K per batch (``num_spec_tokens``).  The adapters take ragged rows by calling it
once per group of rows with the same ``k_b`` (each a dense call of its own); nothing of one row reaches
another's arithmetic, so each row's law is the one a dense batch of its K would give.

Why the ``batched`` level for the statistical check: it is the chain rule's contract on dense rows, which
``forward`` takes (per group of ``k_b``) with the bonus drawn by the adapter as LMDeploy's caller draws it.
The ``vllm`` level's call would fit the arrays too (logits of the judged positions, a bonus drawn by the
caller), but its cases carry vLLM's per-request contract -- seeded requests drawing from generators of
their own, placeholder drafts -- which LMDeploy's function does not offer: it draws every request's
coins from torch's global generator and gathers at each draft id.
"""

from __future__ import annotations

import inspect
import typing

import numpy as np

from specref.adapters.hf import _seam_class, check_seam, exact_logits, inverse_cdf
from specref.adapters.real_engines.conversions import _logits, _seeds, _statistical_seed
from specref.adapters.real_engines.shim import EngineShim, _one_torch_thread
from specref.adapters.real_engines.wheels import _LOADED, PINNED, _check_signature, _found_version, _tree
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError

__all__ = ["LMDEPLOY_FORWARD", "LMDEPLOY_SEAM", "LMDEPLOY_STUBS", "lmdeploy_engine", "lmdeploy_coin_kernel"]

_MODULE = "lmdeploy.pytorch.backends.default.rejection_sampling"
LMDEPLOY_FORWARD = ("self", "target_logits", "draft_token_ids", "bonus_token_ids", "is_greedy", "draft_probs")
"""``DefaultRejectionSamplingImpl.forward``'s parameters as read in lmdeploy 0.18.0."""

LMDEPLOY_SEAM = (("torch", "rand"), ("q", "exponential_"))
"""The random draws of ``forward`` in 0.18.0, in source order: the acceptance coins, then the race's
exponentials (read off by ``recovered_scores.argmax(dim=-1)``)."""

_T = typing.TypeVar("_T")


class _BuildSpec(typing.Generic[_T]):
    """Stands for ``lmdeploy.pytorch.backends.base.BuildSpec``: a typing marker the sampler subclasses."""

    def __new__(cls, *args, **kwargs):
        raise SpecrefError(f"{cls.__name__} is built on a specref stub of lmdeploy's BuildSpec: the verification "
                           "path was not expected to build an operator")


LMDEPLOY_STUBS = {
    "lmdeploy.pytorch.backends.base": ("replaces the backend base (imports LMDeploy's config and cache layers); "
                                       "rejection_sampling.py takes only BuildSpec from it, the generic marker its "
                                       "build request subclasses, which the sampler never builds",
                                       lambda: {"BuildSpec": _BuildSpec}),
}


def _lmdeploy(cache=None):
    """``(forward, the impl class, the shim)`` from the cached tree, the signature checked once."""
    root = _tree("lmdeploy", cache)
    key = ("lmdeploy", str(root))
    if key not in _LOADED:
        real = (_MODULE, "lmdeploy.pytorch.backends.rejection_sampling")
        shim = EngineShim(f"lmdeploy {PINNED['lmdeploy']}", root, ["lmdeploy"], real, LMDEPLOY_STUBS)
        cls = shim.load(_MODULE).DefaultRejectionSamplingImpl
        _check_signature(cls.forward, LMDEPLOY_FORWARD, "lmdeploy", root, f"{_MODULE}.DefaultRejectionSamplingImpl.forward")
        _LOADED[key] = (cls.forward, cls, shim)
    return _LOADED[key]


def _groups(k):
    """``[(k_b, rows)]``: the rows of each draft count, in order of first appearance."""
    k = np.asarray(k, dtype=np.int64)
    return [(int(n), np.flatnonzero(k == n)) for n in dict.fromkeys(k.tolist())]


def lmdeploy_engine(cache=None):
    """LMDeploy 0.18.0's ``forward`` as a ``batched`` step_fn (statistical mode).

    ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed) -> [B, K+1]``
    int64, -1 after the emitted tokens.  Per group of rows with the same ``k_b`` (module docstring), one
    dense call: ``target_logits = log p[b, :k_b]`` float32 (``-inf`` at zeros; LMDeploy's softmax gives
    ``p`` back to float32 rounding), ``draft_probs = q[b, :k_b]`` float32 (None for point-mass drafts),
    and ``bonus_token_ids[b]`` drawn from ``p[b, k_b]`` with ``torch.multinomial``, as LMDeploy's caller
    draws it from the last logit row before calling ``forward``.  Randomness is torch's global generator,
    LMDeploy's own, seeded from the oracle's integer ``seed`` inside ``torch.random.fork_rng`` (the
    caller's state comes back) and shared, in order, by the bonus draws and the calls of one batch.
    """
    forward, cls, _ = _lmdeploy(cache)
    import torch  # noqa: PLC0415

    def step_fn(p_target, q_draft, draft_tokens, seed):
        seed = _statistical_seed(seed, "LMDeploy's rejection sampler")
        p = np.asarray(to_numpy(p_target), dtype=np.float64)
        q = None if q_draft is None else np.asarray(to_numpy(q_draft), dtype=np.float32)
        x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
        B, K1, V = p.shape
        k = np.where((x == -1).any(axis=1), (x == -1).argmax(axis=1), K1 - 1)
        out = np.full((B, K1), -1, dtype=np.int64)
        impl = cls()
        with torch.random.fork_rng(devices=[]), _one_torch_thread():
            torch.default_generator.manual_seed(int(_seeds(seed, 1, 7)[0]))
            for kb, rows in _groups(k):
                bonus = torch.multinomial(torch.from_numpy(p[rows, kb]), 1).reshape(-1)  # [n]
                tokens, _, _ = forward(impl, _logits(p[rows, :kb], torch), torch.from_numpy(x[rows, :kb].copy()), bonus,
                                       is_greedy=None, draft_probs=None if q is None else torch.from_numpy(q[rows, :kb]))
                out[rows, :kb + 1] = tokens.numpy()
        return out

    step_fn.__name__ = f"lmdeploy_engine({PINNED['lmdeploy']})"
    return step_fn


def _coin_handlers(u, final, what):
    """The seam's answers for one dense call: ``torch.rand((n, k), dtype=float64)`` -> the rows' acceptance
    coins; ``q.exponential_()`` -> every exponential 1 (so ``inv_q = 1`` and the race's scores are its
    weights exactly); ``recovered_scores.argmax(dim=-1)`` -> :func:`~specref.adapters.hf.inverse_cdf` of each
    position's weights at its row's final coin (weights all 0, at positions never read: 0, as the argmax)."""
    import torch

    def rand(size, *args, dtype=None, **kwargs):
        if tuple(size) != u.shape:
            raise SpecrefError(f"{what}: torch.rand{tuple(size)}; the seam holds coins {list(u.shape)}")
        return torch.as_tensor(u, dtype=dtype or torch.float32)

    def exponential_(self, *args, **kwargs):
        return self.fill_(1.0)

    def argmax(scores, dim=None, keepdim=False):
        if dim not in (-1, scores.dim() - 1) or keepdim or scores.dim() != 3:
            raise SpecrefError(f"{what}: argmax(dim={dim}) of scores {list(scores.shape)}; the seam reads the race "
                               "over the last axis of [B, K, V]")
        picks = [[inverse_cdf(row, final[b]) if bool((row > 0).any()) else 0 for row in scores[b]]
                 for b in range(scores.shape[0])]
        return torch.tensor(picks, dtype=torch.long).reshape(scores.shape[:2])

    return {torch.rand: rand, torch.Tensor.exponential_: exponential_, torch.Tensor.argmax: argmax}


def _float32_rows(name, rows):
    """``rows`` as float32, refused when that rounds them (LMDeploy computes in float32)."""
    out = np.asarray(rows).astype(np.float32)
    if not np.array_equal(out.astype(np.float64), np.asarray(rows, dtype=np.float64)):
        raise SpecrefError(f"{name}: rows that are not exactly float32 (LMDeploy's probabilities are float32)")
    return out


def lmdeploy_coin_kernel(cache=None):
    """LMDeploy 0.18.0's ``forward`` in the ``batched_coins`` level's call, its randomness the coins (exact).

    ``kernel(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], uniform_coins [B, K],
    final_coins [B]) -> [B, K+1]`` padded with -1.  Per group of rows with the same ``k_b``, one dense call:
    ``target_logits`` float32 logits whose float32 softmax is ``p_target[b, :k_b]`` exactly
    (:func:`~specref.adapters.hf.exact_logits`), ``draft_probs`` = ``q_draft`` in float32, and
    ``bonus_token_ids[b]`` drawn from ``p_target[b, k_b]`` by the inverse CDF of ``final_coins[b]`` (the
    caller's draw, as the level defines the final coin).

    The seam (:func:`~specref.adapters.hf._seam_class`, a torch function mode active for the call only)
    answers, in this order and once each: ``torch.rand`` with ``uniform_coins`` (float64, as LMDeploy
    draws them); ``q.exponential_()`` with ones; and the race's ``argmax`` with the inverse-CDF read of
    ``final_coins[b]`` over the scores at each position -- with every exponential 1 the scores are the
    race's weights (``max(p - q, 0)``; point mass: ``p`` without the draft).  For i.i.d. Exp(1)
    exponentials ``argmax_j w_j / E_j`` is ``j`` with probability ``w_j / sum w``, so this draws the race's
    law over the weights LMDeploy computed: a race on the wrong weights is seen, the float32 rounding of
    real exponentials is not (it moves each token's probability by at most ``2^-21``; the ``vllm_coins``
    level fits races to that resolution).  Any other random draw, or a source whose draws are not
    :data:`LMDEPLOY_SEAM`, raises naming the function and the release.
    """
    forward, cls, _ = _lmdeploy(cache)
    release = _found_version(_tree("lmdeploy", cache), "lmdeploy")  # the wheel's own metadata
    what = f"lmdeploy {release}: {_MODULE}.DefaultRejectionSamplingImpl.forward"
    check_seam(inspect.getsource(forward), LMDEPLOY_SEAM, what)
    seam_class = _seam_class()
    import torch  # noqa: PLC0415

    def kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
        p, x = np.asarray(p_target), np.asarray(draft_tokens, dtype=np.int64)
        u, fin = np.asarray(uniform_coins, dtype=np.float64), np.asarray(final_coins, dtype=np.float64)
        B, K1, V = p.shape
        k = np.where((x == -1).any(axis=1), (x == -1).argmax(axis=1), K1 - 1)
        out = np.full((B, K1), -1, dtype=np.int64)
        impl = cls()
        for kb, rows in _groups(k):
            n = len(rows)
            logits = exact_logits(p[rows, :kb].reshape(n * kb, V), "float32").reshape(n, kb, V)
            probs = None if q_draft is None else torch.from_numpy(_float32_rows("q_draft", np.asarray(q_draft)[rows, :kb]))
            bonus = torch.tensor([inverse_cdf(torch.from_numpy(np.asarray(p[b, kb], dtype=np.float64)), fin[b])
                                  for b in rows], dtype=torch.long)
            seam = seam_class(_coin_handlers(u[rows, :kb], fin[rows], what), ("rand", "exponential_", "argmax"), what)
            with _one_torch_thread(), seam:
                tokens, _, _ = forward(impl, logits, torch.from_numpy(x[rows, :kb].copy()), bonus, is_greedy=None,
                                       draft_probs=probs)
            seam.finished()
            out[rows, :kb + 1] = tokens.numpy()
        return out

    kernel.__name__ = f"lmdeploy_coin_kernel({PINNED['lmdeploy']})"
    return kernel
