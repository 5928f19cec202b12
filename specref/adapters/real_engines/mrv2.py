"""vLLM Model Runner V2's ``rejection_sample``, run from the wheel, as a ``batched`` step.  Follows
vllm 0.33.0 (Triton kernels, in Triton's interpreter).

Probability rows become logits as ``log(p)`` in float32 (its target and draft logits); its coins
and Gumbel noise are keyed by (request seed, position), the seeds drawn from the oracle's.
"""

from __future__ import annotations

import numpy as np

from specref.adapters.real_engines.conversions import _logits, _seeds, _statistical_seed
from specref.adapters.real_engines.vllm_tree import _vllm_shim
from specref.adapters.real_engines.wheels import _LOADED, _check_signature
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError

_MRV2 = ("target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping", "expanded_idx_mapping",
         "expanded_local_pos", "temperature", "seed", "num_speculative_steps", "synthetic_conditional_rates", "use_fp64",
         "use_block_verification", "contexts", "watermarking", "watermarking_skip_mask", "watermark_key",
         "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")


def _mrv2(cache=None):
    shim, root = _vllm_shim("vllm", cache)
    key = ("mrv2", str(root))
    if key not in _LOADED:
        mod = shim.load("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
        _check_signature(mod.rejection_sample, _MRV2, "vllm", root,
                         "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample")
        _LOADED[key] = (mod.rejection_sample, shim)
    return _LOADED[key]


def mrv2_engine(cache=None, *, temperature: float = 1.0, use_fp64: bool = False):
    """vLLM 0.33.0 Model Runner V2's ``rejection_sample`` as a ``batched`` step_fn (statistical mode).

    ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)
    -> (tokens [B, K+1] padded with -1, n_emitted [B])``.  With ``q_draft`` the sampler runs in
    its probabilistic mode (``draft_logits``); with ``q_draft = None`` in its one-hot-draft mode
    (``draft_logits = None``: accept with probability p(x), residual p without x).

    Layout: request b owns ``k_b + 1`` logit rows (its judged rows, then its bonus row
    ``p_target[b, k_b]``); ``target_logits = log(p)`` in float32 (-inf at zeros; MRV2 takes
    target logits with the temperature already applied, so these are final);
    ``draft_logits [B, K, V] = temperature * log(q)`` (MRV2 stores draft logits before the
    temperature and divides by it); ``draft_sampled`` holds the draft for row i at i + 1 (the
    committed token, 0 here, at each request's first row); ``cu_num_logits`` exclusive,
    ``idx_mapping`` the identity, ``pos`` = 1000 + local position, ``seed [B]`` = 63-bit seeds
    from (seed, b): MRV2 keys its coins and Gumbel noise by (request seed, position).
    MRV2 returns ``(sampled, num_sampled)`` with undefined entries past ``num_sampled``; the
    wrapper writes -1 there.
    """
    temperature = float(temperature)
    if not 0 < temperature < float("inf"):
        raise SpecrefError(f"temperature must be positive and finite (0 is MRV2's greedy mode), got {temperature!r}")
    rejection_sample, shim = _mrv2(cache)
    import torch  # noqa: PLC0415

    def step_fn(p_target, q_draft, draft_tokens, seed):
        seed = _statistical_seed(seed, "MRV2's rejection_sample")
        p = np.asarray(to_numpy(p_target), dtype=np.float32)
        x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
        B, K1, V = p.shape
        K = K1 - 1
        pad = x == -1
        k = np.where(pad.any(axis=1), pad.argmax(axis=1), K).astype(np.int64)
        rows = np.concatenate([np.arange(k[b] + 1) + b * K1 for b in range(B)])  # [num_logits] into [B*(K+1)]
        local = np.concatenate([np.arange(k[b] + 1) for b in range(B)])
        req = np.repeat(np.arange(B), k + 1)
        cu = np.concatenate([[0], np.cumsum(k + 1)])
        draft_sampled = np.zeros(rows.shape[0], dtype=np.int64)
        for b in range(B):
            draft_sampled[cu[b] + 1: cu[b] + 1 + k[b]] = x[b, :k[b]]
        target_logits = _logits(p.reshape(B * K1, V)[rows], torch)
        draft_logits = None if q_draft is None else temperature * _logits(q_draft, torch)
        with shim.active():
            sampled, num_sampled = rejection_sample(
                target_logits, draft_logits, torch.from_numpy(draft_sampled), torch.from_numpy(cu.astype(np.int32)),
                torch.from_numpy(1000 + local), torch.arange(B, dtype=torch.int32),
                torch.from_numpy(req.astype(np.int32)), torch.from_numpy(local.astype(np.int32)),
                torch.full((B,), temperature, dtype=torch.float32),
                torch.from_numpy(_seeds(seed, B, 2).astype(np.int64)), K, use_fp64=use_fp64)
        tokens = sampled.numpy().astype(np.int64)
        n = num_sampled.numpy().astype(np.int64)
        tokens[np.arange(K1)[None, :] >= n[:, None]] = -1
        return tokens, n

    step_fn.__name__ = "mrv2_rejection_sample"
    return step_fn
