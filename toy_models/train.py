"""Train the toy target and draft transformers on the generated corpus; save their weights::

    python -m toy_models.train                     # ~6 minutes on one core; writes toy_models/weights/*.npz
    python -m toy_models.train --only draft_small  # retrain the draft from the saved target (~2 min)
    python -m toy_models.train --report            # only measure the saved weights (α, timings)

Hand-written backward passes in NumPy (no autodiff dependency): a batched float32
forward that keeps what the backward needs, the backward of each layer in reverse
order, and Adam.  The forward is an independent re-implementation of
:func:`toy_models.transformer.gpt` (batched); tests check the two agree and check
the gradients against finite differences.

A pair as speculative decoding meets them (Leviathan et al. 2022, §3):

- ``target``: 128 wide, 8 layers, 1.6M parameters, fitted to the corpus of
  :mod:`toy_models.corpus` (next-token cross-entropy);
- ``draft_small``: 64 wide, 1 layer, 61k parameters (26x fewer, 8 layers fewer),
  fitted to the same corpus and then, for its last steps, distilled from the saved
  target (it fits the target's next-token distributions on corpus windows, as
  trained drafts are in practice), so that it agrees with the target on most tokens.

Why deep and narrow rather than wide: on a CPU with NumPy, a forward over a few
new tokens costs a fixed part per layer (dispatching ~40 array operations) plus a
part that grows with the tokens (the matrix products).  With 128-wide layers the
weights stay in cache and the fixed part dominates, so scoring the K+1
verification rows costs ~1.4x one token, as on an accelerator where decoding is
memory-bound; with 256-wide layers a 6-row product cost ~2x a 1-row one
(OpenBLAS's small-M GEMM), which would hide the point of speculation.  The draft,
one layer, costs ~1/10 of a target token.

All seeds are fixed and BLAS runs one thread, so a rerun on the same machine gives
the same weights; another CPU or BLAS may round differently and give close, not
identical, weights.  The weights are stored as float16 (each file < 5 MB) and loaded
as float64: the saved files, not the training run, define the models.
"""

from __future__ import annotations

import os

# One BLAS thread: the same float rounding on every run (reproducible weights), and
# no thread oversubscription when the 2 cores are shared.  Must precede numpy's import.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from toy_models.corpus import VOCAB, corpus  # noqa: E402
from toy_models.transformer import (  # noqa: E402
    LN_EPS,
    WEIGHTS_DIR,
    TransformerConfig,
    init_params,
    load,
    map_params,
    save,
)

N_CTX = 128
TARGET = TransformerConfig(n_vocab=VOCAB, n_ctx=N_CTX, n_embd=128, n_layer=8, n_head=4)  # 1.6M params
DRAFT_SMALL = TransformerConfig(n_vocab=VOCAB, n_ctx=N_CTX, n_embd=64, n_layer=1, n_head=4)  # 61k params


# ---------------------------------------------------------------------------
# Batched forward that keeps its activations, and its backward


def _ln_fwd(x, g, b):  # [B, T, d] -> [B, T, d], cache
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + LN_EPS)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_bwd(dy, cache):  # [B, T, d] -> [B, T, d], dg, db
    xhat, rstd, g = cache
    dg = (dy * xhat).sum((0, 1))
    db = dy.sum((0, 1))
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


_C = math.sqrt(2.0 / math.pi)


def _gelu_fwd(u):  # [...] -> [...], tanh
    t = np.tanh(_C * (u + 0.044715 * u * u * u))
    return 0.5 * u * (1.0 + t), t


def _gelu_bwd(dy, u, t):
    return dy * (0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * u * u))


def forward(params, idx, n_head, targets=None):  # [B, T] -> [B, T, V] logits, (loss, backward closure)
    """Batched forward; with ``targets`` also the mean cross-entropy and a backward function.

    ``targets`` are next-token ids ``[B, T]`` or, to distill, a teacher's next-token
    probabilities ``[B, T, V]`` (the loss is then the cross-entropy to the teacher).
    """
    B, T = idx.shape
    wte, wpe = params["wte"], params["wpe"]
    x = wte[idx] + wpe[:T]  # [B, T, d]
    d = x.shape[-1]
    H, dh = n_head, d // n_head
    scale = 1.0 / math.sqrt(dh)
    mask = np.triu(np.full((T, T), -1e9, dtype=x.dtype), k=1)  # [T, T] causal
    caches = []
    for blk in params["blocks"]:
        h, ln1 = _ln_fwd(x, **blk["ln_1"])
        qkv = h @ blk["attn"]["c_attn"]["w"] + blk["attn"]["c_attn"]["b"]  # [B, T, 3d]
        q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(B, T, H, dh).transpose(0, 2, 1, 3) for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) * scale + mask  # [B, H, T, T]
        s = np.exp(s - s.max(-1, keepdims=True))
        a = s / s.sum(-1, keepdims=True)
        om = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, d)  # [B, T, d] heads merged
        x1 = x + om @ blk["attn"]["c_proj"]["w"] + blk["attn"]["c_proj"]["b"]
        h2, ln2 = _ln_fwd(x1, **blk["ln_2"])
        u = h2 @ blk["mlp"]["c_fc"]["w"] + blk["mlp"]["c_fc"]["b"]  # [B, T, n_mlp]
        gu, t = _gelu_fwd(u)
        x = x1 + gu @ blk["mlp"]["c_proj"]["w"] + blk["mlp"]["c_proj"]["b"]
        caches.append((h, ln1, q, k, v, a, om, h2, ln2, u, t, gu))
    xf, lnf = _ln_fwd(x, **params["ln_f"])
    logits = xf @ wte.T  # [B, T, V]
    if targets is None:
        return logits, None

    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    n = B * T
    soft = targets.ndim == 3
    if soft:
        loss = -(targets * logp).sum(-1).mean()
    else:
        loss = -np.take_along_axis(logp, targets[..., None], -1).mean()

    def backward():
        grads = {"blocks": []}
        dlogits = np.exp(logp)  # d loss / d logits = (softmax - target) / n
        if soft:
            dlogits -= targets
        else:
            np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], -1) - 1.0, -1)
        dlogits /= n
        dwte = dlogits.reshape(n, -1).T @ xf.reshape(n, d)
        dx, dg, db = _ln_bwd(dlogits @ wte, lnf)
        grads["ln_f"] = {"g": dg, "b": db}
        for blk, (h, ln1, q, k, v, a, om, h2, ln2, u, t, gu) in zip(params["blocks"][::-1], caches[::-1]):
            g = {}
            mlp, attn = blk["mlp"], blk["attn"]
            g_mlp_proj = {"w": gu.reshape(n, -1).T @ dx.reshape(n, d), "b": dx.sum((0, 1))}
            du = _gelu_bwd(dx @ mlp["c_proj"]["w"].T, u, t)
            g_fc = {"w": h2.reshape(n, d).T @ du.reshape(n, -1), "b": du.sum((0, 1))}
            dh2, dg2, db2 = _ln_bwd(du @ mlp["c_fc"]["w"].T, ln2)
            g["mlp"] = {"c_fc": g_fc, "c_proj": g_mlp_proj}
            g["ln_2"] = {"g": dg2, "b": db2}
            dx1 = dx + dh2
            g_attn_proj = {"w": om.reshape(n, d).T @ dx1.reshape(n, d), "b": dx1.sum((0, 1))}
            do = (dx1 @ attn["c_proj"]["w"].T).reshape(B, T, H, dh).transpose(0, 2, 1, 3)  # [B, H, T, dh]
            da = do @ v.transpose(0, 1, 3, 2)  # [B, H, T, T]
            dv = a.transpose(0, 1, 3, 2) @ do
            ds = a * (da - (da * a).sum(-1, keepdims=True)) * scale  # softmax backward
            dq = ds @ k
            dk = ds.transpose(0, 1, 3, 2) @ q
            dqkv = np.concatenate([m.transpose(0, 2, 1, 3).reshape(B, T, d) for m in (dq, dk, dv)], -1)
            g_attn = {"w": h.reshape(n, d).T @ dqkv.reshape(n, 3 * d), "b": dqkv.sum((0, 1))}
            g["attn"] = {"c_attn": g_attn, "c_proj": g_attn_proj}
            dh1, dg1, db1 = _ln_bwd(dqkv @ attn["c_attn"]["w"].T, ln1)
            g["ln_1"] = {"g": dg1, "b": db1}
            dx = dx1 + dh1
            grads["blocks"].insert(0, g)
        onehot = np.zeros((n, wte.shape[0]), dtype=dx.dtype)
        onehot[np.arange(n), idx.reshape(n)] = 1.0
        grads["wte"] = dwte + onehot.T @ dx.reshape(n, d)  # tied embedding: output + input use
        dwpe = np.zeros_like(wpe)
        dwpe[:T] = dx.sum(0)
        grads["wpe"] = dwpe
        return grads

    return logits, (loss, backward)


# ---------------------------------------------------------------------------
# Adam over a params tree


def _leaves(tree):
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from _leaves(tree[k])
    elif isinstance(tree, list):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree


class Adam:
    """Adam with decoupled weight decay on matrices, a warmup and a cosine decay."""

    def __init__(self, params, lr, steps, warmup=50, betas=(0.9, 0.98), weight_decay=0.01, clip=1.0):
        self.p = list(_leaves(params))
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.lr, self.steps, self.warmup = lr, steps, warmup
        self.b1, self.b2 = betas
        self.wd, self.clip, self.t = weight_decay, clip, 0

    def step(self, grads) -> float:
        g = list(_leaves(grads))
        norm = math.sqrt(sum(float((x * x).sum()) for x in g))
        shrink = min(1.0, self.clip / (norm + 1e-12))  # clip the global gradient norm
        self.t += 1
        frac = min(1.0, self.t / self.warmup)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, self.t / self.steps)))
        lr = self.lr * frac * (0.1 + 0.9 * cos)
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for p, gi, m, v in zip(self.p, g, self.m, self.v):
            gi = gi * shrink
            m *= self.b1
            m += (1 - self.b1) * gi
            v *= self.b2
            v += (1 - self.b2) * gi * gi
            if p.ndim == 2:
                p *= 1 - lr * self.wd
            p -= lr * (m / c1) / (np.sqrt(v / c2) + 1e-8)
        return norm


# ---------------------------------------------------------------------------
# Training and evaluation


def batches(tokens: np.ndarray, batch: int, length: int, rng: np.random.Generator):
    """Endless random windows ``(inputs, targets)`` of shape ``[batch, length]``."""
    while True:
        starts = rng.integers(0, len(tokens) - length - 1, size=batch)
        win = tokens[starts[:, None] + np.arange(length + 1)]
        yield win[:, :-1], win[:, 1:]


def train(config, tokens, *, steps, batch, lr, seed, valid, log_every=50, name="model", teacher=None, distill_steps=0):
    """Fit ``config`` to ``tokens`` with Adam; float32 arithmetic, returns float64 params.

    With ``teacher = (params, config)`` the last ``distill_steps`` steps fit the
    teacher's next-token distributions on corpus windows instead of the corpus's
    next tokens (distillation: the draft learns to agree with the target).
    """
    params = map_params(lambda a: a.astype(np.float32), init_params(config, seed))
    opt = Adam(params, lr=lr, steps=steps)
    data = batches(tokens, batch, config.n_ctx, np.random.default_rng(seed + 1))
    if teacher is not None:
        t_params, t_config = map_params(lambda a: a.astype(np.float32), teacher[0]), teacher[1]
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(data)
        if teacher is not None and step > steps - distill_steps:
            y = _softmax(forward(t_params, x, t_config.n_head)[0])  # [B, T, V] teacher probabilities
        _, (loss, backward) = forward(params, x, config.n_head, y)
        norm = opt.step(backward())
        if step % log_every == 0 or step == steps:
            msg = f"{name} step {step:4d}/{steps}  loss {loss:.4f}  |g| {norm:.2f}  {time.perf_counter() - t0:6.1f}s"
            if step % (4 * log_every) == 0 or step == steps:
                msg += f"  valid {evaluate(params, config, valid):.4f}"
            print(msg, flush=True)
    return map_params(lambda a: a.astype(np.float64), params), time.perf_counter() - t0


def _windows(valid, n_ctx):
    n = (len(valid) - 1) // n_ctx
    v = np.asarray(valid[: n * n_ctx + 1])
    return v[:-1].reshape(n, n_ctx), v[1:].reshape(n, n_ctx)


def evaluate(params, config, valid) -> float:
    """Mean next-token cross-entropy (nats) over ``valid`` cut into ``n_ctx`` windows."""
    x, y = _windows(valid, config.n_ctx)
    losses = [forward(params, x[i : i + 16], config.n_head, y[i : i + 16])[1][0] for i in range(0, len(x), 16)]
    return float(np.mean(losses))


def _softmax(z):  # [..., V] -> [..., V]
    z = np.exp(z - z.max(-1, keepdims=True))  # the row max first: exp never overflows
    return z / z.sum(-1, keepdims=True)


def _probs(params, config, x):  # [B, T] -> [B, T, V] float64 softmax at T = 1
    return np.concatenate(
        [_softmax(forward(params, x[i : i + 16], config.n_head)[0].astype(np.float64)) for i in range(0, len(x), 16)]
    )


def acceptance(p_target, q_draft) -> float:
    """Mean per-position α = Σ_x min(p(x), q(x)) (SPEC §8), sampling at T = 1."""
    return float(np.minimum(p_target, q_draft).sum(-1).mean())


def bigram_probs(tokens, x):  # fitted bigram (add-0.01), evaluated on windows x -> [B, T, V]
    counts = np.full((VOCAB, VOCAB), 0.01)
    np.add.at(counts, (np.asarray(tokens[:-1]), np.asarray(tokens[1:])), 1.0)
    return (counts / counts.sum(1, keepdims=True))[x]


def report(valid, train_tokens=None, n_windows=32) -> dict:
    """α between the saved target and draft(s) and the cost ratio c of their cached forwards."""
    from toy_models.transformer import CachedTransformer

    target, tcfg = load("target")
    draft, dcfg = load("draft_small")
    x, y = _windows(valid, tcfg.n_ctx)
    x, y = x[:n_windows], y[:n_windows]
    p = _probs(target, tcfg, x)
    q = _probs(draft, dcfg, x)
    res = {
        "target_valid_nats": float(-np.log(np.take_along_axis(p, y[..., None], -1)).mean()),
        "draft_valid_nats": float(-np.log(np.take_along_axis(q, y[..., None], -1)).mean()),
        "alpha_draft_small": acceptance(p, q),
        "alpha_draft_small_greedy": float((p.argmax(-1) == q.argmax(-1)).mean()),
    }
    if train_tokens is not None:
        b = bigram_probs(train_tokens, x)
        res["alpha_bigram"] = acceptance(p, b)

    def median_ms(model, prefix, new, repeats=300):
        model(prefix)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(prefix + new)
            times.append(time.perf_counter() - t0)
            model(prefix)  # rolls back
        return 1e3 * float(np.median(times))

    prefix = [int(t) for t in x[0, :60]]
    t5 = median_ms(CachedTransformer(target, tcfg), prefix, [int(t) for t in x[0, 60:65]])
    t1 = median_ms(CachedTransformer(target, tcfg), prefix, [int(t) for t in x[0, 60:61]])
    d1 = median_ms(CachedTransformer(draft, dcfg), prefix, [int(t) for t in x[0, 60:61]])
    res.update(target_5tok_ms=t5, target_1tok_ms=t1, draft_1tok_ms=d1, c=d1 / t5)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="only measure the saved weights")
    ap.add_argument("--only", choices=["target", "draft_small"], help="train one model (the draft distills from the saved target)")
    ap.add_argument("--target-steps", type=int, default=1000)
    ap.add_argument("--draft-steps", type=int, default=900)
    ap.add_argument("--distill-steps", type=int, default=300, help="last draft steps fitted to the target's distributions")
    args = ap.parse_args(argv)

    train_tokens = np.asarray(corpus(2_000_000, seed=0))
    valid = corpus(32 * N_CTX + 1, seed=1)
    if not args.report:
        WEIGHTS_DIR.mkdir(exist_ok=True)
        t_all = time.perf_counter()
        if args.only in (None, "target"):
            params, secs = train(TARGET, train_tokens, steps=args.target_steps, batch=8, lr=3e-3, seed=1, valid=valid, name="target")
            save(WEIGHTS_DIR / "target.npz", params, TARGET, dtype=np.float16)
            print(f"target: {secs:.0f}s", flush=True)
        if args.only in (None, "draft_small"):
            params, secs = train(
                DRAFT_SMALL, train_tokens, steps=args.draft_steps, batch=16, lr=3e-3, seed=2, valid=valid,
                name="draft_small", teacher=load("target"), distill_steps=args.distill_steps,
            )  # fmt: skip
            save(WEIGHTS_DIR / "draft_small.npz", params, DRAFT_SMALL, dtype=np.float16)
            print(f"draft_small: {secs:.0f}s", flush=True)
        print(f"training: {time.perf_counter() - t_all:.0f}s", flush=True)
    for k, v in report(valid, train_tokens).items():
        print(f"{k:28s} {v:.4f}")


if __name__ == "__main__":
    main()
