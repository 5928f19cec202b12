"""Widen a trained transformer without changing its function (Net2WiderNet), and lengthen its context.

    python -m toy_models.widen                      # the benchmark's wide target: report its size and fidelity
    python -m toy_models.widen --out wide.npz       # also write it (float32, ~230 MB; the benchmark builds it in memory)

Chen, Goodfellow & Shlens, "Net2Net" (ICLR 2016), §3.1 (Net2WiderNet): a layer gets wider by
*replicating* units; a consumer of a replicated unit divides its weight by the number of
copies, so the next layer's input is unchanged.  Here every width of the GPT-2 block grows
by one factor ``r``, each unit copied ``r`` times:

- the residual stream (``n_embd -> r n_embd``).  Replicating a vector r times keeps its mean
  and variance, so every layer norm sees the same statistics; producers into the stream
  (``wte``, ``wpe``, the two ``c_proj`` outputs, their biases) copy exactly, consumers
  (``c_attn``, ``c_fc``) divide by ``r``;
- each head's width (``d_head -> r d_head``, same ``n_head``).  The query·key product over
  copied dimensions is ``r`` times the original while the scale ``1/sqrt(d_head)`` shrinks
  only by ``sqrt(r)``, so the query part of ``c_attn`` is also scaled by ``1/sqrt(r)``;
- the MLP's hidden layer (``n_mlp -> r n_mlp``): ``c_fc`` copies, ``c_proj`` divides by ``r``;
- the tied output embedding: the logits are ``ln_f(x) @ wte.T`` over r copies of each
  dimension, so ``ln_f``'s gain and bias are divided by ``r``.

Net2Net adds noise to the copies so that further training can break their symmetry.  The
noise here is *zero-sum across the copies of each input unit* (drawn, then centred over
each group of copies), added to the consumer weights only: every consumer still sums its
copies to the original weight, so the function is unchanged in exact arithmetic and moves
by float rounding only (``fidelity`` measures it).  ``noise`` is the noise's standard
deviation relative to the weight matrix's own RMS.

:func:`extend_context` gives a model more positions than it was trained on: positions
beyond ``n_ctx`` reuse the learned embeddings of the second half of the trained window
periodically.  That *does* change what the model computes there (it was never trained at
those positions); the benchmark measures the acceptance rate separately at each output
length, so the change shows in the numbers instead of being assumed away.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from toy_models.transformer import TransformerConfig, flatten_params, gpt, load, map_params, save

__all__ = ["widen", "extend_context", "fidelity", "n_params", "WIDE_FACTOR", "WIDE_NOISE", "WIDE_SEED", "wide_target"]

WIDE_FACTOR = 6  # 128 -> 768 wide, 512 -> 3072 MLP: 56.7M parameters, 227 MB in float32
WIDE_NOISE = 1e-2  # zero-sum noise, relative to each weight matrix's RMS
WIDE_SEED = 0


def n_params(params) -> int:
    """Number of parameters of a params tree."""
    return sum(int(np.size(a)) for a in flatten_params(params).values())


def _copies(n: int, r: int) -> np.ndarray:  # [r n] -> the original unit of each new unit
    return np.repeat(np.arange(n), r)


def _head_copies(n_head: int, d_head: int, r: int) -> np.ndarray:
    # head h's new dimensions are h*r*d_head .. (h+1)*r*d_head - 1, each a copy of one of head h's
    return np.concatenate([h * d_head + np.repeat(np.arange(d_head), r) for h in range(n_head)])


def _consumer(w, rows, cols, r, noise, rng):  # [n_in, n_out] -> [r n_in, |cols|]
    """A weight reading copied inputs: each copy gets 1/r of the weight, plus noise summing to zero over the copies."""
    new = w[rows][:, cols] / r
    if noise and r > 1:
        eta = rng.normal(0.0, noise * float(np.sqrt(np.mean(w * w))) / r, size=new.shape)
        groups = eta.reshape(-1, r, new.shape[1])  # copies of one input unit are adjacent (np.repeat)
        eta = (groups - groups.mean(axis=1, keepdims=True)).reshape(new.shape)
        new = new + eta
    return new


def widen(params: dict, config: TransformerConfig, r: int, *, noise: float = 0.0, seed: int = 0):
    """``(params, config)`` of the same function with every width ``r`` times larger (Net2WiderNet, §3.1 above)."""
    r = check_positive_int("r", r)
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
        raise SpecrefError(f"noise must be a finite float >= 0, got {noise!r}")
    rng = np.random.default_rng(seed)
    d, f, H, dh = config.n_embd, config.n_mlp, config.n_head, config.d_head
    res, mlp, head = _copies(d, r), _copies(f, r), _head_copies(H, dh, r)
    q_scale = 1.0 / math.sqrt(r)
    out = {"wte": params["wte"][:, res], "wpe": params["wpe"][:, res], "blocks": []}
    for block in params["blocks"]:
        ca, cp = block["attn"]["c_attn"], block["attn"]["c_proj"]
        qkv_cols = np.concatenate([head + i * d for i in range(3)])  # [3 r d]: q, k, v parts
        w_attn = _consumer(ca["w"], res, qkv_cols, r, noise, rng)
        b_attn = ca["b"][qkv_cols].copy()
        w_attn[:, : r * d] *= q_scale
        b_attn[: r * d] *= q_scale
        fc, fp = block["mlp"]["c_fc"], block["mlp"]["c_proj"]
        out["blocks"].append({
            "ln_1": {"g": block["ln_1"]["g"][res], "b": block["ln_1"]["b"][res]},
            "attn": {
                "c_attn": {"w": w_attn, "b": b_attn},
                "c_proj": {"w": _consumer(cp["w"], head, res, r, noise, rng), "b": cp["b"][res]},
            },
            "ln_2": {"g": block["ln_2"]["g"][res], "b": block["ln_2"]["b"][res]},
            "mlp": {
                "c_fc": {"w": _consumer(fc["w"], res, mlp, r, noise, rng), "b": fc["b"][mlp]},
                "c_proj": {"w": _consumer(fp["w"], mlp, res, r, noise, rng), "b": fp["b"][res]},
            },
        })
    out["ln_f"] = {"g": params["ln_f"]["g"][res] / r, "b": params["ln_f"]["b"][res] / r}
    wide = TransformerConfig(n_vocab=config.n_vocab, n_ctx=config.n_ctx, n_embd=r * d, n_layer=config.n_layer,
                             n_head=H, n_mlp=r * f)
    return out, wide


def extend_context(params: dict, config: TransformerConfig, n_ctx: int):
    """``(params, config)`` with ``n_ctx`` positions: position ``p >= config.n_ctx`` reuses the
    learned embedding of ``h + (p - h) mod h``, ``h = config.n_ctx // 2`` (the trained window's second half)."""
    n_ctx = check_positive_int("n_ctx", n_ctx)
    if n_ctx < config.n_ctx:
        raise SpecrefError(f"n_ctx must be at least the model's {config.n_ctx}, got {n_ctx}")
    h = config.n_ctx // 2
    pos = np.arange(n_ctx)
    pos = np.where(pos < config.n_ctx, pos, h + (pos - h) % h)
    longer = TransformerConfig(n_vocab=config.n_vocab, n_ctx=n_ctx, n_embd=config.n_embd, n_layer=config.n_layer,
                               n_head=config.n_head, n_mlp=config.n_mlp)
    return {**params, "wpe": params["wpe"][pos]}, longer


def wide_target(n_ctx: int | None = None, *, dtype=np.float32):
    """The benchmark's memory-bound target: the saved ``target`` widened ``WIDE_FACTOR`` times
    (noise ``WIDE_NOISE``, seed ``WIDE_SEED``), as ``dtype``; ``n_ctx`` lengthens its context."""
    params, config = load("target")
    if n_ctx is not None:
        params, config = extend_context(params, config, n_ctx)
    params, config = widen(params, config, WIDE_FACTOR, noise=WIDE_NOISE, seed=WIDE_SEED)
    return map_params(lambda a: a.astype(dtype), params), config


def fidelity(small, small_config, wide, wide_config, tokens) -> dict:
    """How far the wide model's next-token distributions are from the small one's on ``tokens``:
    the largest absolute logit difference and the largest total-variation distance over positions
    (both computed in float64 by the full, uncached forward)."""
    def probs(logits):
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    a = np.asarray(gpt(tokens, **map_params(f64, small), n_head=small_config.n_head))
    b = np.asarray(gpt(tokens, **map_params(f64, wide), n_head=wide_config.n_head))
    tv = 0.5 * np.abs(probs(a) - probs(b)).sum(-1)
    return {"max_abs_logit_diff": float(np.abs(a - b).max()), "max_tv": float(tv.max()), "positions": len(tokens)}


def main(argv=None) -> int:
    from toy_models.corpus import corpus

    ap = argparse.ArgumentParser(prog="python -m toy_models.widen", description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="PATH", help="write the wide target (float32 .npz, uncompressed size ~230 MB)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    small, small_config = load("target")
    wide, config = wide_target()
    size = sum(a.nbytes for a in flatten_params(wide).values())
    print(f"wide target: n_embd {config.n_embd}, n_mlp {config.n_mlp}, {config.n_layer} layers, "
          f"{n_params(wide) / 1e6:.1f}M parameters, {size / 1e6:.0f} MB float32 ({time.perf_counter() - t0:.1f} s)")
    fid = fidelity(small, small_config, wide, config, corpus(small_config.n_ctx, seed=7))
    print(f"against the saved target over {fid['positions']} positions: max |logit diff| "
          f"{fid['max_abs_logit_diff']:.2e}, max TV {fid['max_tv']:.2e}")
    if args.out:
        save(args.out, wide, config, dtype=np.float32)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
