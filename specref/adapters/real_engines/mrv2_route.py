"""The coin route (SPEC §11.14) for vLLM Model Runner V2's ``rejection_sample`` as a ``batched``
step (:func:`specref.adapters.real_engines.mrv2.mrv2_engine`).  Follows vllm 0.33.0 (Triton 3.9.0's
interpreter).

MRV2 draws its coins inside its kernels, as functions of (request seed, position, token): the
acceptance coin ``tl.rand(seed, pos)`` (``tl_rand32``, clamped to at least ``_RAND_MIN``) and the
Gumbel noise's uniform ``murmur3_uniform32(seed, pos, token)`` of
``vllm/v1/worker/gpu/sample/gumbel.py``.  In the interpreter both are Python functions read from
their modules at each call, so

- :func:`recording` wraps them while the engine runs and keeps what they return, keyed by
  (request, position, token): ``uniform [B, K]`` and ``gumbel [B, K+1, V]``, float32, NaN where
  the engine drew nothing;
- :func:`drawn` draws the same coins for every (request, position, token) with the engine's own two
  functions in one interpreted kernel of one program (a block of a few hundred thousand draws takes
  tens of milliseconds, where the engine's kernels take milliseconds a row);
- :func:`mrv2_on_coins` is MRV2's arithmetic on given coins in NumPy, float32 as in its kernels: the
  log-softmax by vocabulary blocks of 8192, the test ``log p(x) > log u + log q(x)``, the residual
  ``log p + log1p(-q / p)`` (or ``p`` without the draft, or the bonus row's logits), and the Gumbel
  argmax with ``-log(-log1p_neg_stable(u))``.  It is the engine's rule on its coins, not specref's
  reference law: the route's replay holds it equal to the engine, call by call, and its second part
  checks the law of its outputs on the engine's draws.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import numpy as np

from specref.core.errors import SpecrefError

__all__ = ["recording", "drawn", "mrv2_on_coins"]

_RAND_MIN = np.float32(4.6566127342e-10)  # gumbel.py's _TL_RAND_MIN, tl_rand32's floor
_VOCAB_BLOCK = 8192  # rejection_sample's VOCAB_BLOCK_SIZE: the log-softmax's blocks
_F = np.float32


def _scalar(t) -> int:
    return int(np.asarray(t.handle.data).reshape(-1)[0])


@contextlib.contextmanager
def recording(gumbel, seeds: np.ndarray, pos0: int, K: int, V: int):
    """While active, ``tl.rand`` and ``gumbel.murmur3_uniform32`` return what they return and keep it:
    yields ``(uniform [B, K], gumbel [B, K+1, V])``, float32, NaN where nothing was drawn.  A draw
    keyed by a seed that is no request's, or a position outside ``pos0 .. pos0 + K``, is a
    ``SpecrefError`` naming it."""
    import triton.language as tl  # noqa: PLC0415

    B = len(seeds)
    request = {int(s): b for b, s in enumerate(seeds)}
    if len(request) != B:
        raise SpecrefError(f"MRV2's coin route: two requests share a seed ({B} requests, {len(request)} seeds)")
    uniform = np.full((B, K), np.nan, dtype=np.float32)
    noise = np.full((B, K + 1, V), np.nan, dtype=np.float32)
    rand0, murmur0 = tl.rand, gumbel.murmur3_uniform32

    def where(seed, pos, last: int) -> tuple:
        s, j = _scalar(seed), _scalar(pos) - pos0
        if s not in request or not 0 <= j <= last:
            raise SpecrefError(f"MRV2's coin route: a draw keyed by seed {s} at position {j + pos0}, not a request's "
                               f"position {pos0} .. {pos0 + last}")
        return request[s], j

    def rand(seed, offset, *args, **kwargs):
        out = rand0(seed, offset, *args, **kwargs)
        b, j = where(seed, offset, K - 1)
        uniform[b, j] = np.asarray(out.handle.data).reshape(-1)[0]
        return out

    def murmur(seed, pos, offset, *args, **kwargs):
        out = murmur0(seed, pos, offset, *args, **kwargs)
        b, j = where(seed, pos, K)
        keys, values = np.asarray(offset.handle.data).reshape(-1), np.asarray(out.handle.data).reshape(-1)
        inside = (keys >= 0) & (keys < V)
        noise[b, j, keys[inside]] = values[inside]
        return out

    tl.rand, gumbel.murmur3_uniform32 = rand, murmur
    try:
        yield uniform, noise
    finally:
        tl.rand, gumbel.murmur3_uniform32 = rand0, murmur0


tl: Any = None  # the names _draw reads: its kernel's own scope gives them values (_draw_kernel)
murmur: Any = None


def _draw(seed_ptr, pos_ptr, key_ptr, rand_ptr, murmur_ptr, n, BLOCK: tl.constexpr):
    """The body of :func:`_draw_kernel`."""
    i = tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    pos = tl.load(pos_ptr + i, mask=mask, other=0)
    key = tl.load(key_ptr + i, mask=mask, other=0)
    tl.store(rand_ptr + i, tl.rand(seed, pos), mask=mask)
    tl.store(murmur_ptr + i, murmur(seed, pos, key), mask=mask)


_KERNEL: dict = {}


def _draw_kernel(gumbel):
    """One program drawing ``tl.rand(seed, pos)`` and ``gumbel.murmur3_uniform32(seed, pos, key)`` for a
    block of (seed, pos, key) triples, with the engine's own functions as they are at the call."""
    if "kernel" not in _KERNEL:
        import triton  # noqa: PLC0415
        import triton.language as tl  # noqa: PLC0415

        # the interpreter reads a kernel's names from its globals: a dict of its own
        _KERNEL["scope"] = scope = {**_draw.__globals__, "tl": tl}
        _KERNEL["kernel"] = triton.jit(types.FunctionType(_draw.__code__, scope, "_draw"))
    _KERNEL["scope"]["murmur"] = gumbel.murmur3_uniform32
    return _KERNEL["kernel"]


def drawn(gumbel, seeds: np.ndarray, pos0: int, K: int, V: int, torch) -> tuple:
    """The coins MRV2 would draw for requests seeded ``seeds`` at positions ``pos0 .. pos0 + K``, every
    one: ``(uniform [B, K], gumbel [B, K+1, V])``, float32 (``tl.rand``'s raw value; MRV2 clamps it),
    drawn by the engine's own functions in one interpreted program (:func:`_draw_kernel`)."""
    import triton  # noqa: PLC0415

    B, kernel = len(seeds), _draw_kernel(gumbel)
    b, j, v = (a.reshape(-1) for a in np.meshgrid(np.arange(B), np.arange(K + 1), np.arange(V), indexing="ij"))
    seed = torch.from_numpy(np.asarray(seeds, dtype=np.int64)[b])
    pos, key = torch.from_numpy((pos0 + j).astype(np.int64)), torch.from_numpy(v.astype(np.int32))
    rand, murmur = torch.empty(b.size, dtype=torch.float32), torch.empty(b.size, dtype=torch.float32)
    for s in range(0, b.size, _DRAWS):  # one program a chunk: its block is the chunk
        n, at = min(_DRAWS, b.size - s), slice(s, s + _DRAWS)
        kernel[(1,)](seed[at], pos[at], key[at], rand[at], murmur[at], n, BLOCK=triton.next_power_of_2(n))
    return rand.numpy().reshape(B, K + 1, V)[:, :K, 0].copy(), murmur.numpy().reshape(B, K + 1, V)


_DRAWS = 1 << 20  # draws a program


def _sum_rows(a: np.ndarray) -> np.ndarray:
    """``np.sum`` of each row of a float32 vocabulary block as the interpreter sums a block of 8192:
    pairwise, so a row padded with zeros to any power of two of at least 128 sums the same."""
    V = a.shape[-1]
    width = min(_VOCAB_BLOCK, max(128, 1 << (V - 1).bit_length()))
    pad = np.zeros(a.shape[:-1] + (width - V,), dtype=np.float32)
    return np.concatenate([a, pad], axis=-1).sum(axis=-1, dtype=np.float32)


def _logsumexp(z: np.ndarray) -> np.ndarray:
    """MRV2's log-softmax normaliser of float32 rows ``z [..., V]``: each 8192-block's max and sum of
    ``exp(z - max)`` (0 for a block whose max is -inf), then ``gmax + log(sum(sumexp * exp(max - gmax)))``."""
    V = z.shape[-1]
    blocks = [z[..., s:s + _VOCAB_BLOCK] for s in range(0, V, _VOCAB_BLOCK)]
    with np.errstate(invalid="ignore"):
        maxes = np.stack([blk.max(axis=-1) for blk in blocks], axis=-1)
        sums = np.stack([np.where(m > -np.inf, _sum_rows(np.exp(blk - m[..., None])), _F(0))
                         for blk, m in zip(blocks, np.moveaxis(maxes, -1, 0))], axis=-1).astype(np.float32)
        g = maxes.max(axis=-1)
        return (g + np.log(np.sum(sums * np.exp(maxes - g[..., None]), axis=-1, dtype=np.float32))).astype(np.float32)


def _log1p_neg_stable(u: np.ndarray) -> np.ndarray:
    """gumbel.py's ``_log1p_neg_stable`` in float32: ``log(1 - u)``, a degree-8 series below 0.25."""
    poly: Any = _F(1.0 / 8.0)
    for c in (1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0):
        poly = _F(c) + u * poly
    series = -u * poly
    direct = np.log(np.maximum(_F(1) - u, _F(5.960464477539063e-08)))
    return np.where(u < _F(0.25), series, direct).astype(np.float32)


def mrv2_on_coins(target_logits, draft_logits, temperature: float, k, draft_tokens, uniform, gumbel) -> np.ndarray:
    """MRV2's step on given coins, every request at once -> tokens ``[B, K+1]`` padded with -1.

    ``target_logits [B, K+1, V]`` and ``draft_logits [B, K, V] | None`` as handed to MRV2 (the draft's
    before its division by ``temperature``), ``k [B]`` drafts per request, ``draft_tokens [B, K]``,
    ``uniform [B, K]`` (``tl.rand``'s values) and ``gumbel [B, K+1, V]`` (``murmur3_uniform32``'s)."""
    t = np.asarray(target_logits, dtype=np.float32)
    B, K1, V = t.shape
    K, rows, cols = K1 - 1, np.arange(B), np.arange(K1 - 1)
    x = np.where(cols[None, :] < np.asarray(k)[:, None], np.asarray(draft_tokens, dtype=np.int64), 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tlp = t[:, :K] - _logsumexp(t[:, :K])[..., None]  # [B, K, V] target log-probs
        d = None if draft_logits is None else np.asarray(draft_logits, dtype=np.float32) / _F(temperature)
        dlp = np.zeros_like(tlp) if d is None else d - _logsumexp(d)[..., None]
        px, qx = np.take_along_axis(tlp, x[..., None], -1)[..., 0], np.take_along_axis(dlp, x[..., None], -1)[..., 0]
        accept = (px > np.log(np.maximum(np.asarray(uniform, dtype=np.float32), _RAND_MIN)) + qx)
    accept &= cols[None, :] < np.asarray(k)[:, None]
    n = np.where((~accept).any(axis=1), (~accept).argmax(axis=1), K)  # the first position not accepted
    out = np.full((B, K1), -1, dtype=np.int64)
    out[:, :K] = np.where(cols[None, :] < n[:, None], x, -1)
    res = t[rows, n].copy()  # the bonus row's logits, as they are
    rej = np.flatnonzero(n < k)
    if d is None:
        res[rej, x[rej, n[rej]]] = -np.inf
    elif len(rej):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.exp(dlp[rej, n[rej]] - tlp[rej, n[rej]])
            res[rej] = np.where(ratio < _F(1), tlp[rej, n[rej]] + np.log1p(-ratio), -np.inf).astype(np.float32)
    u = np.asarray(gumbel, dtype=np.float32)[rows, n]
    with np.errstate(divide="ignore", invalid="ignore"):
        noised = res + -np.log(-_log1p_neg_stable(u))
    out[rows, n] = np.argmax(noised, axis=1)  # MRV2's block argmaxes, then the first block of the largest
    return out
