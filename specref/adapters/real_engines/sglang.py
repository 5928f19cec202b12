"""SGLang's verifier kernels, run from the wheel: the chain kernel as a ``batched`` step (and in the
``batched_coins`` level's call), the greedy tree kernel in a dense-batch call.  Follows sglang
0.5.23 (Triton kernels, in Triton's interpreter); the chain kernel of any release from 0.5.14 in
the cache with ``release=`` (or ``$SPECREF_SGLANG_RELEASE``), its module and call read from its
files (:func:`~specref.adapters.real_engines.releases.sglang_release`).

The shim stubs SGLang's utilities and platform layer (:data:`SGLANG_STUBS`).  The chain kernel
takes probabilities as float32 rows and its coins as tensors, drawn with a torch generator
seeded from the oracle's seed.
"""

from __future__ import annotations

import numpy as np

from specref.adapters.real_engines.conversions import _f32, _seeds, _statistical_seed
from specref.adapters.real_engines.releases import sglang_release
from specref.adapters.real_engines.shim import EngineShim, _attrs, _Platform
from specref.adapters.real_engines.triton_interpreter import (
    _interpreter_as_compiled,
    _interpreter_patch_once,
    _quiet_numpy,
    _triton,
)
from specref.adapters.real_engines.wheels import _LOADED, PINNED, _check_signature, _tree, selected_release
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.verification.levels.batched.coin_route import CoinRoute

SGLANG_STUBS = {
    "sglang.srt.utils": ("replaces SGLang's utilities (imports the runtime); the platform probes is_cuda, is_hip, "
                         "is_musa, is_npu, is_xpu, is_cpu all answer False, so spec_tree.py's module body takes the "
                         "branch that imports no native kernel; verify_tree_greedy_triton reads none of them",
                         lambda: {n: (lambda: False) for n in ("is_cpu", "is_cuda", "is_hip", "is_musa", "is_npu",
                                                                "is_xpu")}),
    "sglang.srt.platforms": ("replaces platform detection; current_platform is read only by tree-building fallbacks",
                             lambda: {"current_platform": _Platform()}),
    "sglang.srt.platforms.interface": ("replaces the platform interface; reject_out_of_tree_path is called only by "
                                       "the tree-building and greedy-dispatch fallbacks, not by verify_tree_greedy_triton",
                                       _attrs("sglang.srt.platforms.interface", ["reject_out_of_tree_path"])),
}


_SGLANG_CHAIN = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
                 "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
                 "draft_probs", "threshold_single", "threshold_acc", "deterministic", "block_verification")
_SGLANG_GREEDY = ("predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
                  "retrieve_next_sibling", "target_predict")


_READ_IN = "0.5.23"  # where _SGLANG_CHAIN and _SGLANG_GREEDY were read


def _sglang(what: str, cache=None, release: str | None = None):
    """``(kernel, shim)``: ``what`` = "chain" or "greedy" of the pinned release; ``release`` (else
    ``$SPECREF_SGLANG_RELEASE``): the chain kernel of another release in the cache, its module and
    call read from its files (:func:`~specref.adapters.real_engines.releases.sglang_release`)."""
    version = selected_release("sglang", release)
    if version != PINNED["sglang"] or version != _READ_IN:
        if what != "chain":
            raise SpecrefError(f"sglang {version}: the release adapters load the chain kernel only; "
                               f"verify_tree_greedy_triton follows sglang {_READ_IN}")
        fn, shim, _ = sglang_release(version, cache)
        return fn, shim
    root = _tree("sglang", cache)
    key = ("sglang", what, str(root))
    if key not in _LOADED:
        _triton(cache)
        if ("sglang-shim", str(root)) not in _LOADED:
            real = ("sglang.kernels.ops.speculative.reject_sampling", "sglang.kernels.ops.speculative.spec_tree")
            _LOADED[("sglang-shim", str(root))] = EngineShim(f"sglang {PINNED['sglang']}", root, ["sglang"], real,
                                                             SGLANG_STUBS, env={"TRITON_INTERPRET": "1"},
                                                             hooks=(_interpreter_patch_once, _interpreter_as_compiled, _quiet_numpy))
        shim = _LOADED[("sglang-shim", str(root))]
        if what == "chain":
            fn = shim.load("sglang.kernels.ops.speculative.reject_sampling").chain_speculative_sampling_triton
            _check_signature(fn, _SGLANG_CHAIN, "sglang", root,
                             "sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton", _READ_IN)
        else:
            fn = shim.load("sglang.kernels.ops.speculative.spec_tree").verify_tree_greedy_triton
            _check_signature(fn, _SGLANG_GREEDY, "sglang", root,
                             "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton", _READ_IN)
        _LOADED[key] = (fn, shim)
    return _LOADED[key]


def sglang_chain_engine(cache=None, release: str | None = None):
    """SGLang 0.5.23's ``chain_speculative_sampling_triton`` as a ``batched`` step_fn (dense rows).

    ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)
    -> (tokens [B, K+1] padded with -1, n_accepted [B], n_emitted [B])``.  The kernel takes
    probabilities: ``target_probs [B, K+1, V]`` and ``draft_probs [B, K, V]`` float32 (one-hot
    rows for point-mass drafts, as FlashInfer's adapter does); ``candidates [B, K+1]`` int64
    with the committed token (0) in slot 0 and the drafts after it; ``retrive_index[b, j] =
    b (K+1) + j``; chain links; coins ``uniform_samples [B, K+1]`` and
    ``uniform_samples_for_final_sampling [B]`` from ``torch.rand`` with a generator seeded from
    ``seed``, as SGLang's unseeded verify path draws them (float32 in [0, 1)), which its coin route
    (``specref_coin_route``, ``check("batched", fn, mode="statistical", route="coins")``, SPEC
    §11.14) records and draws alone; thresholds 1
    (ignored by the chain kernel), ``block_verification=False``.  The emitted tokens are
    ``predicts[accept_index[b, :accept_token_num[b] + 1]]``.  Ragged rows are refused
    (SGLang's call is dense).  ``release``: another release from the cache (0.5.14 on; the same
    positional call, ``block_verification`` left at its default where it exists).
    """
    call = _sglang_chain_call(cache, release)
    import torch  # noqa: PLC0415

    def coins(draft_tokens, seed):
        seed = _statistical_seed(seed, "SGLang's chain_speculative_sampling_triton")
        B, K1 = np.shape(draft_tokens)[0], np.shape(draft_tokens)[1] + 1
        g = torch.Generator().manual_seed(int(_seeds(seed, 1, 3)[0]))
        return torch.rand((B, K1), dtype=torch.float32, generator=g), torch.rand((B,), dtype=torch.float32, generator=g)

    def step_fn(p_target, q_draft, draft_tokens, seed):
        return call(p_target, q_draft, draft_tokens, *coins(draft_tokens, seed))

    def draw(p_target, q_draft, draft_tokens, seed):
        uniform, final = coins(draft_tokens, seed)
        return uniform[:, :-1].numpy(), final.numpy()  # the chain kernel reads column i for draft i

    def record(p_target, q_draft, draft_tokens, seed):
        uniform, final = coins(draft_tokens, seed)
        return call(p_target, q_draft, draft_tokens, uniform, final), uniform[:, :-1].numpy(), final.numpy()

    step_fn.__name__ = "sglang_chain_speculative_sampling_triton"
    step_fn.specref_coin_route = CoinRoute(record=record, draw=draw)  # type: ignore[attr-defined]
    return step_fn


def _sglang_chain_call(cache=None, release: str | None = None):
    """``call(p_target, q_draft, draft_tokens, coins [B, K+1], final [B]) -> (tokens, n_accepted,
    n_emitted)``: SGLang's chain kernel on the given float32 coins (:func:`sglang_chain_engine`)."""
    chain, shim = _sglang("chain", cache, release)
    import torch  # noqa: PLC0415

    def call(p_target, q_draft, draft_tokens, coins, final):
        p = _f32(p_target, torch)
        x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
        B, K1, V = p.shape
        K = K1 - 1
        if (x == -1).any():
            raise SpecrefError("chain_speculative_sampling_triton takes dense rows: ragged K is not part of its call")
        if q_draft is None:
            q = torch.zeros((B, K, V), dtype=torch.float32)
            q.scatter_(2, torch.from_numpy(x)[..., None], 1.0)
        else:
            q = _f32(q_draft, torch)
        candidates = torch.zeros((B, K1), dtype=torch.int64)
        candidates[:, 1:] = torch.from_numpy(x)
        index = torch.arange(B * K1, dtype=torch.int64).reshape(B, K1)
        next_token = torch.full((B, K1), -1, dtype=torch.int64)
        next_token[:, :-1] = torch.arange(1, K1)
        next_sibling = torch.full((B, K1), -1, dtype=torch.int64)
        predicts = torch.zeros(B * K1, dtype=torch.int32)
        accept_index = torch.full((B, K1), -1, dtype=torch.int32)
        accept_num = torch.zeros(B, dtype=torch.int32)
        with shim.active():
            chain(predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, coins, final, p,
                  q.contiguous(), 1.0, 1.0, True)
        n = accept_num.numpy().astype(np.int64)
        ai = accept_index.numpy().astype(np.int64)
        pr = predicts.numpy().astype(np.int64)
        tokens = np.full((B, K1), -1, dtype=np.int64)
        for b in range(B):
            tokens[b, :n[b] + 1] = pr[ai[b, :n[b] + 1]]
        return tokens, n, n + 1

    return call


def sglang_chain_coin_kernel(cache=None, release: str | None = None):
    """SGLang 0.5.23's ``chain_speculative_sampling_triton`` in the ``batched_coins`` level's call
    (exact): ``kernel(p_target, q_draft, draft_tokens, uniform_coins [B, K], final_coins [B])``.

    The kernel takes its coins as tensors, so no seam is needed: ``uniform_samples[b, i] =
    uniform_coins[b, i]`` tests draft ``i`` (the kernel reads column ``step - 1`` at step
    ``step``; its last column is never read and holds 1/2), and
    ``uniform_samples_for_final_sampling = final_coins``, all float32 (what SGLang draws).
    Otherwise the call is :func:`sglang_chain_engine`'s (``release`` as there)."""
    call = _sglang_chain_call(cache, release)
    import torch  # noqa: PLC0415

    def kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
        u = np.asarray(uniform_coins, dtype=np.float32)
        coins = torch.full((u.shape[0], u.shape[1] + 1), 0.5, dtype=torch.float32)
        coins[:, :-1] = torch.from_numpy(np.ascontiguousarray(u))
        final = torch.from_numpy(np.ascontiguousarray(np.asarray(final_coins, dtype=np.float32)))
        return call(p_target, q_draft, draft_tokens, coins, final)

    kernel.__name__ = "sglang_chain_speculative_sampling_triton_coins"
    return kernel


def sglang_greedy_tree_engine(cache=None):
    """SGLang 0.5.23's ``verify_tree_greedy_triton`` in a dense-batch call.

    ``kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N],
    target_predict [B, N], depth) -> (accept_index [B, depth + 1], accept_token_num [B],
    predicts [B N])``, all int64 NumPy.  ``candidates[b, 0]`` is the committed token; node
    ``i``'s row in ``target_predict`` is the target's argmax after node i's path (SGLang's
    caller computes it as ``torch.argmax(logits, -1)``); ``retrive_index[b, i] = b N + i``;
    ``accept_index`` starts as -1 and ``predicts`` as 0, as SGLang's caller allocates them.
    """
    verify, shim = _sglang("greedy", cache)
    import torch  # noqa: PLC0415

    def kernel(candidates, retrive_next_token, retrive_next_sibling, target_predict, depth):
        cand = torch.as_tensor(np.asarray(candidates, dtype=np.int64))
        B, N = cand.shape
        predicts = torch.zeros(B * N, dtype=torch.int32)
        accept_index = torch.full((B, int(depth) + 1), -1, dtype=torch.int32)
        accept_num = torch.zeros(B, dtype=torch.int32)
        with shim.active():
            verify(predicts, accept_index, accept_num, cand, torch.arange(B * N, dtype=torch.int64).reshape(B, N),
                   torch.as_tensor(np.asarray(retrive_next_token, dtype=np.int64)),
                   torch.as_tensor(np.asarray(retrive_next_sibling, dtype=np.int64)),
                   torch.as_tensor(np.asarray(target_predict, dtype=np.int64)))
        return accept_index.numpy().astype(np.int64), accept_num.numpy().astype(np.int64), predicts.numpy().astype(np.int64)

    kernel.__name__ = "sglang_verify_tree_greedy_triton"
    return kernel
