"""vLLM Model Runner V2's ``rejection_sample``, run from the wheel, as a ``batched`` step.  Follows
vllm 0.33.0 (Triton kernels, in Triton's interpreter).

Probability rows become logits as ``log(p)`` in float32 (its target and draft logits); its coins
and Gumbel noise are keyed by (request seed, position), the seeds drawn from the oracle's.
:func:`mrv2_coin_engine` runs it in the ``vllm_coins`` level's call with the level's coins put
where MRV2 draws them (``tl.rand`` and ``murmur3_uniform32``, Python functions in the interpreter).
:func:`mrv2_engine`'s step carries the coin route (``route="coins"``, SPEC §11.14), whose seams are
in :mod:`~specref.adapters.real_engines.mrv2_route`.
"""

from __future__ import annotations

import numpy as np

from specref.adapters.real_engines.conversions import _logits, _seeds, _statistical_seed
from specref.adapters.real_engines.mrv2_route import drawn, mrv2_on_coins, recording
from specref.adapters.real_engines.vllm_tree import _vllm_shim
from specref.adapters.real_engines.wheels import _LOADED, _check_signature
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.verification.levels.batched.coin_route import CoinRoute

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


_POS0 = 1000  # a logit row's position is _POS0 + its local index


def _layout(drafts: list) -> tuple:
    """MRV2's request layout for ``drafts`` (request b's ``k_b`` draft ids): each request owns ``k_b + 1``
    logit rows.  ``(k, local, req, cu, draft_sampled)``: drafts per request, each row's local index and
    request, ``cu_num_logits`` (exclusive) and ``draft_sampled`` (row i's draft at i + 1; 0, the committed
    token, at each request's first row)."""
    k = np.array([len(d) for d in drafts], dtype=np.int64)
    local = np.concatenate([np.arange(n + 1) for n in k])
    req = np.repeat(np.arange(len(k)), k + 1)
    cu = np.concatenate([[0], np.cumsum(k + 1)])
    draft_sampled = np.zeros(int(cu[-1]), dtype=np.int64)
    for b, d in enumerate(drafts):
        draft_sampled[cu[b] + 1: cu[b] + 1 + k[b]] = d
    return k, local, req, cu, draft_sampled


def _requests(draft_tokens, seed) -> tuple:
    """``(k [B], drafts [B, K], seeds [B])``: each request's drafts before its first -1, and its 63-bit seed
    from the oracle's ``seed`` (MRV2 keys its coins and Gumbel noise by request seed and position)."""
    seed = _statistical_seed(seed, "MRV2's rejection_sample")
    x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
    pad = x == -1
    return np.where(pad.any(axis=1), pad.argmax(axis=1), x.shape[1]), x, _seeds(seed, len(x), 2).astype(np.int64)


def _padded(sampled, num_sampled) -> tuple:
    """MRV2's ``(sampled, num_sampled)`` as NumPy, the undefined entries past ``num_sampled`` set to -1."""
    tokens = sampled.numpy().astype(np.int64)
    n = num_sampled.numpy().astype(np.int64)
    tokens[np.arange(tokens.shape[1])[None, :] >= n[:, None]] = -1
    return tokens, n


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
    ``idx_mapping`` the identity, ``pos`` = ``_POS0`` (1000) + local position, ``seed [B]`` = 63-bit seeds
    from (seed, b): MRV2 keys its coins and Gumbel noise by (request seed, position).
    MRV2 returns ``(sampled, num_sampled)`` with undefined entries past ``num_sampled``; the
    wrapper writes -1 there.  With ``use_fp64=False`` the step carries the coin route
    (``step_fn.specref_coin_route``: ``check("batched", step_fn, mode="statistical", route="coins")``).
    """
    temperature = float(temperature)
    if not 0 < temperature < float("inf"):
        raise SpecrefError(f"temperature must be positive and finite (0 is MRV2's greedy mode), got {temperature!r}")
    rejection_sample, shim = _mrv2(cache)
    import torch  # noqa: PLC0415

    def inputs(p_target, q_draft, draft_tokens, seed) -> tuple:
        """``(target_logits [B, K+1, V], draft_logits | None, k [B], drafts [B, K], seeds [B])``."""
        requests = _requests(draft_tokens, seed)  # the seed is checked first
        draft_logits = None if q_draft is None else temperature * _logits(q_draft, torch)
        return (_logits(np.asarray(to_numpy(p_target), dtype=np.float32), torch), draft_logits, *requests)

    def step_fn(p_target, q_draft, draft_tokens, seed):
        target, draft_logits, k, x, seeds = inputs(p_target, q_draft, draft_tokens, seed)
        B, K1, V = target.shape
        _, local, req, cu, draft_sampled = _layout([x[b, :n] for b, n in enumerate(k)])
        rows = np.concatenate([np.arange(k[b] + 1) + b * K1 for b in range(B)])  # [num_logits] into [B*(K+1)]
        with shim.active():
            sampled, num_sampled = rejection_sample(
                target.reshape(B * K1, V)[torch.from_numpy(rows)].contiguous(), draft_logits,
                torch.from_numpy(draft_sampled), torch.from_numpy(cu.astype(np.int32)),
                torch.from_numpy(_POS0 + local), torch.arange(B, dtype=torch.int32),
                torch.from_numpy(req.astype(np.int32)), torch.from_numpy(local.astype(np.int32)),
                torch.full((B,), temperature, dtype=torch.float32), torch.from_numpy(seeds), K1 - 1, use_fp64=use_fp64)
        return _padded(sampled, num_sampled)

    if not use_fp64:  # the route's arithmetic is MRV2's float32 Gumbel draw
        step_fn.specref_coin_route = _coin_route(step_fn, inputs, temperature, shim, torch)  # type: ignore[attr-defined]
    step_fn.__name__ = "mrv2_rejection_sample"
    return step_fn


def _coin_route(step_fn, inputs, temperature: float, shim, torch) -> CoinRoute:
    """The coin route of :func:`mrv2_engine`'s ``step_fn`` (:mod:`~specref.adapters.real_engines.mrv2_route`):
    its call with MRV2's draws recorded, the same draws made alone, and MRV2's arithmetic on coins."""

    def gumbel():
        return shim.load("vllm.v1.worker.gpu.sample.gumbel")

    def record(*call):
        _, x, seeds = _requests(*call[2:])
        with shim.active(), recording(gumbel(), seeds, _POS0, x.shape[1], np.shape(call[0])[-1]) as coins:
            out = step_fn(*call)
        return (out, *coins)

    def draw(*call):
        _, x, seeds = _requests(*call[2:])
        with shim.active():
            return drawn(gumbel(), seeds, _POS0, x.shape[1], np.shape(call[0])[-1], torch)

    def on_coins(*call_and_coins):
        target, draft_logits, k, x, _ = inputs(*call_and_coins[:4])
        return mrv2_on_coins(target.numpy(), None if draft_logits is None else draft_logits.numpy(), temperature, k, x,
                             *call_and_coins[4:])

    return CoinRoute(record=record, draw=draw, on_coins=on_coins)


# ---------------------------------------------------------------- coins in (the vllm_coins level)

_SEED0 = 1_000_003  # request b's seed is _SEED0 + b: the seam reads the request back from the seed MRV2 hands over


def _coin_draws(uniform: dict, exponentials: np.ndarray):
    """Stand-ins for MRV2's two draws, in Triton's interpreter: ``tl.rand(seed, offset)`` (the acceptance
    coin, called by ``tl_rand32``) returns ``uniform[(request, local position)]`` as float32, MRV2's own
    coin dtype; ``murmur3_uniform32(seed, pos, keys)`` (the Gumbel noise's uniform) returns
    ``1 - exp(-E[request, key])``, so that MRV2's ``-log(-log(1 - u))`` is ``-log E`` and its Gumbel
    argmax is the race ``argmax residual / E`` (keys past V: 1/2, masked by the kernel)."""
    import triton.language as tl  # noqa: PLC0415
    from triton.runtime.interpreter import TensorHandle  # noqa: PLC0415

    B, V = exponentials.shape
    E = exponentials.astype(np.float64)
    # a race is the same under any scale of a row's E; MRV2's float32 uniforms reach E = -log(2^-24) ~ 16.6
    # at most, so a row whose largest E is above 8 is scaled down to 8 (exact for the race, in range for MRV2)
    E = E * np.minimum(1.0, 8.0 / np.maximum(E.max(axis=1, keepdims=True), 1e-300))
    from_E = (-np.expm1(-E)).astype(np.float32)

    def as_tensor(values: np.ndarray, like):  # float32, scalar or block as ``like`` (the offset) is
        ty = tl.block_type(tl.float32, like.type.shape) if like.type.is_block() else tl.float32
        return tl.tensor(TensorHandle(np.ascontiguousarray(values, dtype=np.float32), tl.float32), ty)

    def request(seed) -> int:
        b = int(np.asarray(seed.handle.data).reshape(-1)[0]) - _SEED0
        if not 0 <= b < B:
            raise SpecrefError(f"MRV2's coin seam: a draw keyed by seed {b + _SEED0}, not a request's ({B} requests)")
        return b

    def rand(seed, offset, n_rounds=None, _semantic=None):
        b, pos = request(seed), np.asarray(offset.handle.data)
        got = np.vectorize(lambda j: uniform.get((b, int(j) - _POS0), np.float32(0.5)), otypes=[np.float32])(pos)
        return as_tensor(got, offset)

    def murmur3_uniform32(seed, pos, offset, _semantic=None):
        b, keys = request(seed), np.asarray(offset.handle.data).astype(np.int64)
        got = np.where((keys >= 0) & (keys < V), from_E[b, np.clip(keys, 0, V - 1)], np.float32(0.5))
        return as_tensor(got.astype(np.float32), offset)

    return rand, murmur3_uniform32


def _coin_call_args(x, k, logits, bonus, draft_probs, K: int, torch) -> tuple:
    """MRV2's positional arguments for vLLM V1's call: request b's ``k_b`` judged rows as given, then a
    point-mass bonus row at its bonus token; draft logits ``log q`` per request and step; seeds
    ``_SEED0 + b``; positions ``_POS0 + j``; temperature 1; ``max(K, 1)`` speculative steps."""
    B, V = len(k), logits.shape[1]
    start = np.concatenate([[0], np.cumsum(k)])
    point = np.full((B, V), -np.inf, dtype=np.float32)
    point[np.arange(B), bonus] = 0
    rows = [np.concatenate([logits[start[b]:start[b + 1]], point[b:b + 1]]) for b in range(B)]
    k, local, req, cu, draft_sampled = _layout([x[start[b]:start[b + 1]] for b in range(B)])
    draft_logits = torch.full((B, max(K, 1), V), -float("inf"))
    q = None if draft_probs is None else np.asarray(draft_probs, dtype=np.float32)
    for b in range(B):
        if q is not None and k[b]:
            draft_logits[b, :k[b]] = _logits(q[start[b]:start[b + 1]], torch)
    return (torch.from_numpy(np.concatenate(rows)), None if q is None else draft_logits, torch.from_numpy(draft_sampled),
            torch.from_numpy(cu.astype(np.int32)), torch.from_numpy(_POS0 + local), torch.arange(B, dtype=torch.int32),
            torch.from_numpy(req.astype(np.int32)), torch.from_numpy(local.astype(np.int32)),
            torch.ones(B, dtype=torch.float32), torch.from_numpy(_SEED0 + np.arange(B, dtype=np.int64)), max(K, 1))


def mrv2_coin_engine(cache=None):
    """vLLM 0.33.0 Model Runner V2's ``rejection_sample`` in the ``vllm_coins`` level's call, its coins fed in.

    ``fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs [T, V] |
    None, target_logits [T, V], bonus_token_ids [B, 1], sampling_metadata)`` with the level's
    ``uniform_probs [T]`` and ``exponentials [B, V]``.  MRV2 draws its acceptance coin with
    ``tl.rand(seed, pos)`` (inside ``tl_rand32``, which clamps it to at least 4.66e-10) and its resample
    as a Gumbel argmax whose uniforms come from ``murmur3_uniform32(seed, pos, token)``; in Triton's
    interpreter both are Python functions read from their modules at each call, and the seam puts
    the level's coins there (:func:`_coin_draws`) while MRV2 runs.  The request's rows become MRV2's
    layout as in :func:`mrv2_engine` -- its target logits as given, its bonus row a point mass at the
    caller's bonus token (MRV2 samples its bonus; vLLM V1's caller hands it over) -- with seeds
    ``_SEED0 + b`` and positions ``_POS0 + j``.  Returns ``[B, max_spec_len + 1]`` padded with -1.
    Coins are float32 (``tl.rand``'s dtype): check it with ``coins="float32"``.
    """
    rejection_sample, shim = _mrv2(cache)
    import torch  # noqa: PLC0415

    def fn(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
           bonus_token_ids, sampling_metadata):
        x = np.asarray(to_numpy(draft_token_ids), dtype=np.int64)
        k = np.asarray(num_draft_tokens, dtype=np.int64)
        logits = np.asarray(to_numpy(target_logits), dtype=np.float32)
        bonus = np.asarray(to_numpy(bonus_token_ids), dtype=np.int64).reshape(-1)
        E = np.asarray(sampling_metadata.exponentials, dtype=np.float32)
        u = np.asarray(sampling_metadata.uniform_probs, dtype=np.float64)
        B, K = len(k), int(max_spec_len)
        start = np.concatenate([[0], np.cumsum(k)])
        uniform = {(b, j): np.float32(u[start[b] + j]) for b in range(B) for j in range(int(k[b]))}
        args = _coin_call_args(x, k, logits, bonus, None if draft_probs is None else to_numpy(draft_probs), K, torch)
        rand, murmur = _coin_draws(uniform, E)
        import triton.language as tl  # noqa: PLC0415

        with shim.active():
            gumbel = shim.load("vllm.v1.worker.gpu.sample.gumbel")
            saved = tl.rand, gumbel.murmur3_uniform32
            tl.rand, gumbel.murmur3_uniform32 = rand, murmur
            try:
                sampled, num_sampled = rejection_sample(*args)
            finally:
                tl.rand, gumbel.murmur3_uniform32 = saved
        return _padded(sampled, num_sampled)[0][:, :K + 1]

    fn.__name__ = "mrv2_rejection_sample_coins"
    return fn
