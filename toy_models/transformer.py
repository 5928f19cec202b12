"""A tiny decoder-only transformer (GPT-2 shaped) with a KV cache that rolls back.

Written as pure functions over a parameter dict in the style of picoGPT: the
dict's keys are the functions' argument names, so the checkpoint tree *is* the
call graph (``gpt(inputs, **params, n_head=n_head)``,
``transformer_block(x, **block, n_head=n_head, ...)``).  Every function returns
logits for **every** position it is given: speculative verification needs all
K+1 rows of one target call (Leviathan et al. 2022, Algorithm 1; SPEC §3-§4).

Shapes are written in one vocabulary: ``n_seq`` tokens in a call, ``n_past``
tokens already in the cache, ``n_kv = n_past + n_seq``, ``n_embd`` model width,
``n_head`` heads of width ``d_head = n_embd // n_head``.

Backends: the numerics take their namespace from the parameters
(``xp = namespace(wte)``) and use only array-API-standard functions, so the
same code runs on NumPy, on ``array_api_strict`` (CPU-only CI's stand-in for a
GPU library) and on CuPy.  :func:`to_backend` moves a NumPy params dict over.

The KV cache (:class:`KVCache`) holds per-layer keys and values in buffers
preallocated to ``n_ctx`` positions.  ``forward_cached(new, cache, **params, n_head=...)``
appends: it scores the new tokens in one call and writes their keys and values
behind the cached ones; ``cache.rollback(length)`` truncates to an absolute
length (the accepted prefix).  :class:`CachedTransformer` wraps it all as
specref's model protocol: ``model(tokens) -> logits [len(tokens), n_vocab]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from array_api_compat import device as array_device

from specref.core.backend import namespace, to_numpy
from specref.core.errors import SpecrefError, check_positive_int, check_tokens

__all__ = [
    "TransformerConfig",
    "init_params",
    "to_backend",
    "gpt",
    "forward_cached",
    "KVCache",
    "CachedTransformer",
    "BatchedCachedTransformer",
    "forward_batched",
    "CacheStats",
    "load",
    "save",
    "map_params",
    "flatten_params",
    "unflatten_params",
    "WEIGHTS_DIR",
]

WEIGHTS_DIR = Path(__file__).parent / "weights"
LN_EPS = 1e-5  # layer-norm epsilon, as in GPT-2


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a model; ``init_params`` and ``load`` produce params of this shape."""

    n_vocab: int  # tokens are 0..n_vocab-1
    n_ctx: int  # positions the model has embeddings for (longest sequence)
    n_embd: int  # model width (d_model)
    n_layer: int  # transformer blocks
    n_head: int  # attention heads; must divide n_embd
    n_mlp: int = 0  # hidden width of the MLP; 0 means 4 * n_embd

    def __post_init__(self):
        for name in ("n_vocab", "n_ctx", "n_embd", "n_layer", "n_head"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("n_mlp", self.n_mlp, minimum=0)
        if self.n_embd % self.n_head:
            raise SpecrefError(f"n_head = {self.n_head} must divide n_embd = {self.n_embd}")
        if self.n_mlp == 0:
            object.__setattr__(self, "n_mlp", 4 * self.n_embd)

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head


# ---------------------------------------------------------------------------
# Initialisation and backends


def init_params(config: TransformerConfig, seed: int) -> dict:
    """Deterministic GPT-2-style initialisation (NumPy float64), from ``seed`` alone.

    Weights ~ N(0, 0.02²); the two residual projections of each block are scaled
    by 1/sqrt(2 n_layer) (GPT-2); biases 0, layer-norm gains 1.
    """
    rng = np.random.default_rng(seed)
    d, f, L = config.n_embd, config.n_mlp, config.n_layer

    def normal(*shape, std=0.02):
        return rng.normal(0.0, std, size=shape)

    def linear(n_in, n_out, std=0.02):
        return {"w": normal(n_in, n_out, std=std), "b": np.zeros(n_out)}

    def ln():
        return {"g": np.ones(d), "b": np.zeros(d)}

    proj_std = 0.02 / math.sqrt(2 * L)
    return {
        "wte": normal(config.n_vocab, d),
        "wpe": normal(config.n_ctx, d, std=0.01),
        "blocks": [
            {
                "ln_1": ln(),
                "attn": {"c_attn": linear(d, 3 * d), "c_proj": linear(d, d, proj_std)},
                "ln_2": ln(),
                "mlp": {"c_fc": linear(d, f), "c_proj": linear(f, d, proj_std)},
            }
            for _ in range(L)
        ],
        "ln_f": ln(),
    }


def to_backend(params, xp, dtype=None):
    """The same params tree with every array moved to namespace ``xp`` (default float64)."""
    return map_params(lambda a: xp.asarray(to_numpy(a).astype(np.float64), dtype=dtype or xp.float64), params)


def map_params(fn, params):
    """Apply ``fn`` to every array of a params tree (same structure back)."""
    if isinstance(params, dict):
        return {k: map_params(fn, v) for k, v in params.items()}
    if isinstance(params, list):
        return [map_params(fn, v) for v in params]
    return fn(params)


def flatten_params(params, prefix: str = "") -> dict:
    """``{"blocks.0.attn.c_attn.w": array, ...}``: the tree as flat dotted keys."""
    if isinstance(params, dict):
        items = params.items()
    elif isinstance(params, list):
        items = ((str(i), v) for i, v in enumerate(params))
    else:
        return {prefix: params}
    out = {}
    for k, v in items:
        out.update(flatten_params(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def unflatten_params(flat: dict) -> dict:
    """Inverse of :func:`flatten_params` (numeric keys become list indices)."""
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def listify(node):
        if not isinstance(node, dict):
            return node
        node = {k: listify(v) for k, v in node.items()}
        if node and all(k.isdigit() for k in node):
            return [node[str(i)] for i in range(len(node))]
        return node

    return listify(tree)


# ---------------------------------------------------------------------------
# The model: pure functions (picoGPT)


def gelu(x, *, xp):  # [...] -> [...]
    # tanh approximation of GELU, as in GPT-2 (no erf in the array API standard)
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def softmax(x, *, xp):  # [..., n] -> [..., n]
    # subtract the row max before exp so that exp never overflows
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def layer_norm(x, g, b, *, xp):  # [n_seq, n_embd] -> [n_seq, n_embd]
    n = x.shape[-1]
    mean = xp.sum(x, axis=-1, keepdims=True) / n
    centred = x - mean
    var = xp.sum(centred * centred, axis=-1, keepdims=True) / n  # biased variance, as in GPT-2
    return g * centred / xp.sqrt(var + LN_EPS) + b


def linear(x, w, b):  # [n_seq, n_in] -> [n_seq, n_out]
    return x @ w + b


def ffn(x, c_fc, c_proj, *, xp):  # [n_seq, n_embd] -> [n_seq, n_embd]
    return linear(gelu(linear(x, **c_fc), xp=xp), **c_proj)  # [n_seq, n_mlp] inside


def attention(q, k, v, bias, *, xp):  # [n_head, n_seq, d_head], [n_head, n_kv, d_head] x2, [n_seq, n_kv] -> [n_head, n_seq, d_head]
    scores = q @ xp.matrix_transpose(k) / math.sqrt(q.shape[-1])  # [n_head, n_seq, n_kv]
    if bias is not None:  # None: one query, the last position, which sees every key
        scores = scores + bias
    return softmax(scores, xp=xp) @ v


def mha(x, c_attn, c_proj, n_head, bias, layer_cache, *, xp):  # [n_seq, n_embd] -> [n_seq, n_embd]
    return linear(_attend(linear(x, **c_attn), n_head, bias, layer_cache, xp=xp), **c_proj)


def _attend(qkv, n_head, bias, layer_cache, *, xp):  # [n_seq, 3 * n_embd] -> [n_seq, n_embd]
    n_seq, n_embd = qkv.shape[0], qkv.shape[1] // 3
    heads = [
        xp.permute_dims(xp.reshape(qkv[:, i * n_embd : (i + 1) * n_embd], (n_seq, n_head, -1)), (1, 0, 2))
        for i in range(3)
    ]  # 3 x [n_head, n_seq, d_head]
    q, k, v = heads
    if layer_cache is not None:
        k, v = layer_cache(k, v)  # [n_head, n_kv, d_head] x2: cached keys/values followed by these
    out = attention(q, k, v, bias, xp=xp)  # [n_head, n_seq, d_head]
    return xp.reshape(xp.permute_dims(out, (1, 0, 2)), (n_seq, n_embd))  # merge heads


def transformer_block(x, mlp, attn, ln_1, ln_2, n_head, bias, layer_cache=None, *, xp):  # [n_seq, n_embd] -> [n_seq, n_embd]
    x = x + mha(layer_norm(x, **ln_1, xp=xp), **attn, n_head=n_head, bias=bias, layer_cache=layer_cache, xp=xp)
    return x + ffn(layer_norm(x, **ln_2, xp=xp), **mlp, xp=xp)


def causal_bias(n_seq: int, n_past: int, *, xp, dtype, device):  # -> [n_seq, n_kv] or None
    """Additive attention mask: query i (at position n_past + i) sees keys 0..n_past + i.

    Masked entries get -1e10, whose exp underflows to exactly 0 after the row max
    is subtracted; every row keeps at least its own key, so no row is all-masked.
    None when there is nothing to mask (a single new token sees the whole cache).
    """
    if n_seq == 1:
        return None
    q_pos = xp.arange(n_past, n_past + n_seq, device=device)
    k_pos = xp.arange(n_past + n_seq, device=device)
    visible = xp.astype(k_pos[None, :] <= q_pos[:, None], dtype)  # [n_seq, n_kv] of 0/1
    return (visible - 1.0) * 1e10


def _embed(inputs, wte, wpe, n_past, *, xp, device):  # [n_seq] -> [n_seq, n_embd]
    n_ctx, n_vocab = wpe.shape[0], wte.shape[0]
    tokens = _check_inputs(inputs, n_vocab, n_ctx, n_past)
    idx = xp.asarray(tokens, dtype=xp.int64, device=device)
    return xp.take(wte, idx, axis=0) + wpe[n_past : n_past + len(tokens), :]


def gpt(inputs, wte, wpe, blocks, ln_f, n_head):  # [n_seq] -> [n_seq, n_vocab]
    """Logits for every position of ``inputs`` (a full recompute, no cache).

    Row i is the logit vector of the token that follows ``inputs[:i+1]``.
    """
    xp, device = namespace(wte), _device(wte)
    x = _embed(inputs, wte, wpe, 0, xp=xp, device=device)  # [n_seq, n_embd]
    bias = causal_bias(x.shape[0], 0, xp=xp, dtype=x.dtype, device=device)
    for block in blocks:
        x = transformer_block(x, **block, n_head=n_head, bias=bias, xp=xp)
    return layer_norm(x, **ln_f, xp=xp) @ xp.matrix_transpose(wte)  # tied output embedding


def forward_cached(inputs, cache, wte, wpe, blocks, ln_f, n_head):  # [n_seq] -> [n_seq, n_vocab]
    """Append ``inputs`` to ``cache`` and return their logits, in one forward call.

    The new tokens sit at positions ``len(cache) .. len(cache) + n_seq - 1`` and
    attend to every cached token and to the new tokens before them.  Called with
    the K+1 tokens ``[last accepted, x_1..x_K]`` it returns the K+1 verification
    rows of SPEC §3.  Same arithmetic as :func:`gpt`: after any sequence of
    appends and rollbacks the rows equal a full recompute of the cached sequence.
    """
    xp, device = namespace(wte), _device(wte)
    n_past = len(cache)
    x = _embed(inputs, wte, wpe, n_past, xp=xp, device=device)  # [n_seq, n_embd]
    if len(blocks) != cache.n_layer:
        raise SpecrefError(f"cache has {cache.n_layer} layers but the model has {len(blocks)}")
    bias = causal_bias(x.shape[0], n_past, xp=xp, dtype=x.dtype, device=device)
    for i, block in enumerate(blocks):
        x = transformer_block(x, **block, n_head=n_head, bias=bias, layer_cache=cache.layer(i), xp=xp)
    cache.commit(x.shape[0])
    return layer_norm(x, **ln_f, xp=xp) @ xp.matrix_transpose(wte)


def forward_batched(inputs, caches, wte, wpe, blocks, ln_f, n_head):  # B x [n_b] -> [sum n_b, n_vocab]
    """Append ``inputs[b]`` to ``caches[b]`` for every sequence ``b`` in **one** forward call.

    The new tokens of all B sequences are stacked into one ``[sum n_b, n_embd]`` activation, so
    every matrix product reads the weights once for the whole batch (what makes batching pay
    when a step is memory-bound); attention runs per sequence over its own cache, so the
    sequences may have different lengths (ragged, no padding).  Rows come back stacked in the
    order of ``inputs``; sequence ``b``'s rows equal ``forward_cached(inputs[b], caches[b], ...)``.
    """
    xp, device = namespace(wte), _device(wte)
    if len(inputs) != len(caches) or not inputs:
        raise SpecrefError(f"inputs and caches must be non-empty lists of the same length, got {len(inputs)} and {len(caches)}")
    sizes = [len(t) for t in inputs]
    x = xp.concat([_embed(t, wte, wpe, len(c), xp=xp, device=device) for t, c in zip(inputs, caches)], axis=0)
    biases = [causal_bias(n, len(c), xp=xp, dtype=x.dtype, device=device) for n, c in zip(sizes, caches)]
    starts = [sum(sizes[:b]) for b in range(len(sizes) + 1)]
    for i, block in enumerate(blocks):
        attn, mlp = block["attn"], block["mlp"]
        qkv = linear(layer_norm(x, **block["ln_1"], xp=xp), **attn["c_attn"])  # [sum n_b, 3 n_embd]
        heads = [_attend(qkv[starts[b] : starts[b + 1], :], n_head, biases[b], caches[b].layer(i), xp=xp)
                 for b in range(len(sizes))]  # B x [n_b, n_embd]
        x = x + linear(xp.concat(heads, axis=0), **attn["c_proj"])
        x = x + ffn(layer_norm(x, **block["ln_2"], xp=xp), **mlp, xp=xp)
    for cache, n in zip(caches, sizes):
        cache.commit(n)
    return layer_norm(x, **ln_f, xp=xp) @ xp.matrix_transpose(wte)


def _device(x):
    return array_device(x)


def _check_inputs(inputs, n_vocab: int, n_ctx: int, n_past: int) -> list[int]:
    tokens = check_tokens("inputs", inputs, n_vocab)
    if not tokens:
        raise SpecrefError("inputs must hold at least one token, got none")
    if n_past + len(tokens) > n_ctx:
        raise SpecrefError(
            f"inputs: {n_past} cached + {len(tokens)} new tokens exceed the context n_ctx = {n_ctx}"
        )
    return tokens


# ---------------------------------------------------------------------------
# KV cache


class KVCache:
    """Keys and values of the tokens seen so far, per layer, in preallocated buffers.

    ``k[l]`` and ``v[l]`` are ``[n_head, n_ctx, d_head]``; positions ``0..len-1`` are
    valid.  A forward call appends through :meth:`layer` (each block writes its new
    keys/values behind the cached ones) and :meth:`commit` (the length grows once,
    after every layer has written).  :meth:`rollback` truncates to an absolute length.
    """

    def __init__(self, config: TransformerConfig, *, xp=None, dtype=None, device=None):
        if xp is None or xp is np:
            from array_api_compat import numpy as xp  # NumPy with the standard's signatures
        shape = (config.n_head, config.n_ctx, config.d_head)
        dtype = dtype or xp.float64
        self.n_layer = config.n_layer
        self.n_ctx = config.n_ctx
        self.k = [xp.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.v = [xp.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self._length = 0

    @classmethod
    def for_params(cls, params: dict, config: TransformerConfig) -> "KVCache":
        """An empty cache on the namespace, dtype and device of ``params``."""
        wte = params["wte"]
        return cls(config, xp=namespace(wte), dtype=wte.dtype, device=_device(wte))

    def __len__(self) -> int:
        return self._length

    def layer(self, i: int):
        """The append function of layer ``i``: ``(k_new, v_new) -> (k_all, v_all)``.

        ``k_new``/``v_new`` are ``[n_head, n_seq, d_head]``; they are written at
        positions ``len .. len + n_seq - 1`` and the returned views cover ``0 .. len + n_seq - 1``.
        """
        start = self._length

        def append(k_new, v_new):  # [n_head, n_seq, d_head] x2 -> [n_head, n_kv, d_head] x2
            stop = start + k_new.shape[1]
            if stop > self.n_ctx:
                raise SpecrefError(f"KV cache is full: {stop} positions > n_ctx = {self.n_ctx}")
            self.k[i][:, start:stop, :] = k_new
            self.v[i][:, start:stop, :] = v_new
            return self.k[i][:, :stop, :], self.v[i][:, :stop, :]

        return append

    def commit(self, n_new: int) -> None:
        """Count ``n_new`` appended positions as cached (called once per forward)."""
        self._length += n_new

    def rollback(self, length: int) -> None:
        """Truncate to the first ``length`` tokens (the accepted prefix); O(1)."""
        self._length = _rollback_length(length, self._length)


# ---------------------------------------------------------------------------
# specref's model protocol


@dataclass
class CacheStats:
    """Counters for the benchmark: what a :class:`CachedTransformer` actually did."""

    calls: int = 0  # times the model was called
    forwards: int = 0  # forward passes run (calls that had uncached tokens)
    tokens: int = 0  # tokens pushed through the network
    rollbacks: int = 0  # rollbacks that dropped at least one cached token
    tokens_rolled_back: int = 0
    forward_seconds: float = 0.0  # wall time inside forward_cached
    rollback_seconds: float = 0.0  # wall time spent rolling back (tiny: O(1) per rollback)


class CachedTransformer:
    """specref's model protocol: ``model(tokens) -> logits [len(tokens), n_vocab]`` (float64 NumPy).

    Row i is the logit vector of the token after ``tokens[:i+1]``.  The model keeps
    a KV cache and the logits of the cached positions.  Each call finds the longest
    common prefix of ``tokens`` and the cached tokens, rolls the cache back to it,
    and runs **one** forward over the rest (so the K+1 verification rows come from
    one call); rows of cached positions are returned from the store.

    ``rollback=False`` simulates bug 12 of SPEC §7 ("KV cache not rolled back
    after a rejection"): when ``tokens`` leaves the cached sequence, the stale
    keys/values stay in the cache and the new tokens are appended behind them (at
    the positions that follow), so the model conditions on discarded tokens.
    """

    def __init__(self, params: dict, config: TransformerConfig, *, xp=None, dtype=None, rollback: bool = True):
        xp = xp or np
        self.config = config
        self.params = to_backend(params, xp, dtype)
        self.n_vocab = config.n_vocab
        self.n_ctx = config.n_ctx
        self.rollback_enabled = bool(rollback)
        self.cache = KVCache.for_params(self.params, config)
        self._tokens: list[int] = []  # the tokens whose logits are stored (the caller's view)
        self._logits = np.zeros((config.n_ctx, config.n_vocab))  # [n_ctx, n_vocab] rows of _tokens
        self.stats = CacheStats()

    def __call__(self, tokens) -> np.ndarray:  # [n_seq] -> [n_seq, n_vocab]
        self.stats.calls += 1
        toks = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        n = len(toks)
        if n > self.n_ctx:
            raise SpecrefError(f"tokens: {n} tokens exceed the context n_ctx = {self.n_ctx}")
        keep = _common_prefix(toks, self._tokens)
        if keep < len(self._tokens):
            self.rollback(keep)
        if keep < n:
            self.append(toks[keep:])
        return self._logits[:n].copy()

    @property
    def vocab_size(self) -> int:
        """The vocabulary size, as specref's decoders read it off a model."""
        return self.n_vocab

    def __len__(self) -> int:
        """Number of tokens whose logits are cached."""
        return len(self._tokens)

    def append(self, new) -> np.ndarray:  # [n_seq] -> [n_seq, n_vocab]
        """Score ``new`` after the cached tokens in one forward call; their rows (a copy)."""
        start = len(self._tokens)
        if start + len(new) > self.n_ctx:
            raise SpecrefError(f"new: {start} cached + {len(new)} new tokens exceed the context n_ctx = {self.n_ctx}")
        t0 = time.perf_counter()
        logits = forward_cached(new, self.cache, **self.params, n_head=self.config.n_head)
        self._logits[start : start + len(new)] = to_numpy(logits)
        self.stats.forward_seconds += time.perf_counter() - t0
        self.stats.forwards += 1
        self.stats.tokens += len(new)
        self._tokens.extend(int(t) for t in new)
        return self._logits[start : start + len(new)].copy()

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cached tokens (the accepted prefix), drop the rest.

        With ``rollback=False`` only the logits store forgets them; the KV cache keeps them (bug 12).
        """
        length = _rollback_length(length, len(self._tokens))
        if length == len(self._tokens):
            return
        t0 = time.perf_counter()
        if self.rollback_enabled:
            self.cache.rollback(length)
        self.stats.rollback_seconds += time.perf_counter() - t0
        self.stats.rollbacks += 1
        self.stats.tokens_rolled_back += len(self._tokens) - length
        del self._tokens[length:]

    @classmethod
    def from_saved(cls, name: str, **kwargs) -> "CachedTransformer":
        """The saved model ``name`` (``"target"``, ``"draft_small"``) ready to call; kwargs as for the class."""
        params, config = load(name)
        return cls(params, config, **kwargs)

    def sibling(self) -> "CachedTransformer":
        """A new, empty model with its own cache that shares these weights (no copy)."""
        other = object.__new__(type(self))
        other.config, other.params, other.n_vocab, other.n_ctx = self.config, self.params, self.n_vocab, self.n_ctx
        other.rollback_enabled = self.rollback_enabled
        other.cache = KVCache.for_params(self.params, self.config)
        other._tokens, other._logits = [], np.zeros((self.n_ctx, self.n_vocab))
        other.stats = CacheStats()
        return other

    def full(self, tokens) -> np.ndarray:  # [n_seq] -> [n_seq, n_vocab]
        """Full recompute without the cache (float64 NumPy); the reference for the cache."""
        return np.asarray(to_numpy(gpt(tokens, **self.params, n_head=self.config.n_head)), dtype=np.float64)

    def reset(self) -> None:
        """Empty the cache, whatever ``rollback`` says (the stats are kept)."""
        self.cache.rollback(0)
        self._tokens.clear()

    def __repr__(self) -> str:
        c = self.config
        bug = "" if self.rollback_enabled else ", rollback=False"
        return f"CachedTransformer(n_embd={c.n_embd}, n_layer={c.n_layer}, n_head={c.n_head}, n_vocab={c.n_vocab}, n_ctx={c.n_ctx}{bug})"


class BatchedCachedTransformer:
    """B sequences of one model, each with its own KV cache, scored together: ``model.batch(token_lists)``.

    ``batch([tokens_0, ..., tokens_{B-1}])`` returns one ``[len(tokens_b), n_vocab]`` logits array
    per sequence (float64 NumPy, as :class:`CachedTransformer`); a ``None`` entry skips that slot
    (a finished request) and returns ``None`` for it.  Each sequence keeps the longest common
    prefix with what its slot has cached, rolls back to it, and all the sequences' new tokens go
    through **one** :func:`forward_batched` call.
    """

    def __init__(self, params: dict, config: TransformerConfig, batch: int, *, xp=None, dtype=None):
        batch = check_positive_int("batch", batch)
        first = CachedTransformer(params, config, xp=xp, dtype=dtype)
        self.slots = [first] + [first.sibling() for _ in range(batch - 1)]  # one copy of the weights
        self.params, self.config, self.n_vocab = first.params, config, config.n_vocab
        self.stats = CacheStats()

    @property
    def vocab_size(self) -> int:
        return self.n_vocab

    def batch(self, token_lists) -> list:  # B x [n_b] -> B x [n_b, n_vocab] (None for skipped slots)
        if len(token_lists) != len(self.slots):
            raise SpecrefError(f"token_lists must hold {len(self.slots)} entries (one per slot), got {len(token_lists)}")
        self.stats.calls += 1
        work = []  # (slot, tokens, first new position)
        for slot, tokens in zip(self.slots, token_lists):
            if tokens is None:
                continue
            toks = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
            if len(toks) > self.config.n_ctx:
                raise SpecrefError(f"tokens: {len(toks)} tokens exceed the context n_ctx = {self.config.n_ctx}")
            keep = _common_prefix(toks, slot._tokens)
            if keep < len(slot._tokens):
                t0 = time.perf_counter()
                slot.rollback(keep)
                self.stats.rollback_seconds += time.perf_counter() - t0
                self.stats.rollbacks += 1
            work.append((slot, toks, keep))
        new = [(slot, toks[keep:], keep) for slot, toks, keep in work if keep < len(toks)]
        if new:
            t0 = time.perf_counter()
            logits = to_numpy(forward_batched([t for _, t, _ in new], [s.cache for s, _, _ in new],
                                              **self.params, n_head=self.config.n_head))
            self.stats.forward_seconds += time.perf_counter() - t0
            self.stats.forwards += 1
            row = 0
            for slot, toks, start in new:
                slot._logits[start : start + len(toks)] = logits[row : row + len(toks)]
                slot._tokens.extend(int(t) for t in toks)
                row += len(toks)
                self.stats.tokens += len(toks)
        out, it = [], iter(work)
        for tokens in token_lists:
            if tokens is None:
                out.append(None)
                continue
            slot, toks, _ = next(it)
            out.append(slot._logits[: len(toks)].copy())
        return out

    def reset(self) -> None:
        """Empty every slot's cache."""
        for slot in self.slots:
            slot.reset()


def _rollback_length(length, cached: int) -> int:
    """``length`` as an int in ``0..cached``, else SpecrefError (the cache and the model share this rule)."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= cached:
        raise SpecrefError(f"rollback length must be an int in 0..{cached}, got {length!r}")
    return int(length)


def _common_prefix(a: list, b: list) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: the caller extends what is cached
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


# ---------------------------------------------------------------------------
# Saved weights


def save(path, params: dict, config: TransformerConfig, dtype=np.float32) -> None:
    """Write params (stored as ``dtype``) and the config to a compressed ``.npz``."""
    flat = {k: np.asarray(to_numpy(v), dtype=dtype) for k, v in flatten_params(params).items()}
    cfg = {f"config.{k}": np.asarray(v) for k, v in asdict(config).items()}
    np.savez_compressed(path, **flat, **cfg)


def load(name: str, *, xp=None) -> tuple[dict, TransformerConfig]:
    """``(params, config)`` of saved weights: ``name`` in ``toy_models/weights`` or a path.

    The params are float64 (on namespace ``xp``, default NumPy) whatever dtype they were stored in.
    """
    path = Path(name)
    if not path.suffix:
        path = WEIGHTS_DIR / f"{name}.npz"
    if not path.exists():
        known = sorted(p.stem for p in WEIGHTS_DIR.glob("*.npz"))
        raise SpecrefError(f"name: no weights {str(name)!r} at {path}; saved ones are {known}. "
                           f"`python -m toy_models.train` writes target and draft_small")
    with np.load(path) as data:
        config = TransformerConfig(**{k[7:]: int(data[k]) for k in data.files if k.startswith("config.")})
        flat = {k: data[k].astype(np.float64) for k in data.files if not k.startswith("config.")}
    params = unflatten_params(flat)
    if xp is not None:
        params = to_backend(params, xp)
    return params, config
