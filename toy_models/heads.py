"""Toy heads for blockwise parallel decoding and Medusa (SPEC §16).

A **heads object** is a callable ``heads(tokens) -> [K, V]``: ``K`` probability rows read from one
view of ``tokens``.  Row ``j`` (0-based) is the distribution of the token ``j + 1`` positions after
the target's next token -- with ``n = len(tokens)``, the target's own row gives the token at
position ``n`` and row ``j`` the token at position ``n + 1 + j`` (Stern et al. 2018's proposal
models ``p_2 ..``; Cai et al. 2024's Medusa head ``k = j + 1`` predicts position ``t + k + 1`` from
the hidden state at ``t``).

- :class:`RolledHeads`: for a model whose rows depend on the last ``window`` tokens (n-gram and
  table models): row ``j`` is the exact marginal of that token when the target samples its
  continuation at ``config`` -- the target rolled ``j + 2`` steps, summed over every path (in
  Fractions for exact models).  These are the best heads a context this short allows for sampling;
  for greedy decoding their argmax is often but not always the greedy continuation (the mode of a
  marginal is not the greedy path's token), so acceptance and rejection both occur.
- :class:`TableHeads` / :func:`random_heads`: rows looked up on the last ``window`` tokens, e.g.
  random Dirichlet rows (they accept rarely).
- :func:`hidden_states`, :class:`TransformerHeads`, :func:`fit_transformer_heads`: linear heads on
  the last hidden state of the tiny transformer (:mod:`toy_models.transformer`), fitted by
  least squares on the model's own seeded samples.  The transformer does not expose its hidden
  state; :func:`hidden_states` recomputes it read-only from the same functions as
  :func:`toy_models.transformer.gpt` (its logits are ``hidden_states(...) @ wte.T``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from array_api_compat import device as array_device

from specref.core.backend import namespace, to_numpy
from specref.core.errors import SpecrefError, check_positive_int, check_tokens
from specref.core.numbers import is_exact
from specref.core.sampling import SamplingConfig, process, process_probs
from toy_models.transformer import causal_bias, layer_norm, transformer_block

__all__ = ["RolledHeads", "TableHeads", "random_heads", "hidden_states", "TransformerHeads",
           "fit_transformer_heads"]


def _next_row(model, tokens, config):
    """The model's processed row after ``tokens``: ``[n] -> [V]`` (Fraction for exact models)."""
    if hasattr(model, "probs"):
        return process_probs(model.probs(list(tokens))[-1:], config)[0]
    return process(np.asarray(to_numpy(model(list(tokens))), dtype=np.float64)[-1:], config)[0]


class RolledHeads:
    """Exact-marginal heads of a target whose rows depend on its last ``window`` tokens.

    ``heads(tokens)[j]`` is ``P(x_{n+1+j} = . | tokens)`` when the target samples ``x_n, x_{n+1}, ...``
    at ``config``: a forward pass over the distinct last-``window`` states (at most ``V^window``
    per position).  Exact (Fraction) rows for exact models.
    """

    def __init__(self, model, k: int, *, window: int, config: SamplingConfig = SamplingConfig()):
        self.model, self.config = model, config
        self.k = check_positive_int("k", k)
        self.window = check_positive_int("window", window)
        self._rows: dict = {}
        self._out: dict = {}

    def _key(self, seq):
        return tuple(seq[-self.window:]) if len(seq) >= self.window else ("short",) + tuple(seq)

    def _row(self, seq):
        key = self._key(seq)
        if key not in self._rows:
            self._rows[key] = _next_row(self.model, seq, self.config)
        return self._rows[key]

    def __call__(self, tokens):  # [n] -> [k, V]
        tokens = [int(t) for t in tokens]
        key = self._key(tokens)
        if key not in self._out:
            self._out[key] = self._roll(tokens)
        return self._out[key].copy()

    def _roll(self, tokens):
        states = {self._key(tokens): (tokens, 1)}  # last-window state -> (a sequence with it, probability)
        rows = []
        for step in range(self.k + 1):  # step 0: the target's next token; step j + 1: head row j
            nxt: dict = {}
            marginal = None
            for seq, w in states.values():
                row = self._row(seq)
                marginal = w * row if marginal is None else marginal + w * row
                for y in range(row.shape[0]):
                    if row[y] > 0:
                        s = seq + [y]
                        key = self._key(s)
                        nxt[key] = (nxt[key][0], nxt[key][1] + w * row[y]) if key in nxt else (s, w * row[y])
            if step:
                rows.append(marginal)
            states = nxt
        return np.stack(rows)


class TableHeads:
    """Rows looked up on the last ``window`` tokens: ``table[x_1..x_window]`` is ``[K, V]`` (shorter
    contexts are left-padded with token 0)."""

    def __init__(self, table):
        table = np.asarray(table) if not is_exact(table) else table
        if table.ndim < 3:
            raise SpecrefError(f"table must have shape [V] * window + [K, V], got {table.shape}")
        self.table, self.window = table, table.ndim - 2

    def __call__(self, tokens):  # [n] -> [K, V]
        tokens = [0] * self.window + [int(t) for t in tokens]
        return self.table[tuple(tokens[-self.window:])].copy()


def random_heads(vocab_size: int, k: int, *, window: int = 1, seed: int, concentration: float = 0.5,
                 exact: bool = False) -> TableHeads:
    """Random Dirichlet heads keyed on the last ``window`` tokens (seeded); ``exact``: Fraction rows."""
    rng = np.random.default_rng(seed)
    V, k = check_positive_int("vocab_size", vocab_size), check_positive_int("k", k)
    table = rng.dirichlet(np.full(V, concentration), size=(V,) * window + (k,))
    if exact:  # thousandths, one added so that no entry is 0, renormalised exactly
        counts = np.round(table * 1000).astype(int) + 1
        table = np.vectorize(lambda c: Fraction(int(c)), otypes=[object])(counts)
        table = table / table.sum(axis=-1, keepdims=True)
    return TableHeads(table)


# ---------------------------------------------------------------- the tiny transformer


def hidden_states(params, config, tokens):
    """The last hidden state of every position, after the final layer norm: ``[n] -> [n, n_embd]``.

    The body of :func:`toy_models.transformer.gpt` without the tied output layer, recomputed from
    its own functions (nothing in the model changes): ``gpt(...) == hidden_states(...) @ wte.T``.
    """
    wte = params["wte"]
    xp, device = namespace(wte), array_device(wte)
    tokens = check_tokens("tokens", tokens, config.n_vocab)
    if not 1 <= len(tokens) <= config.n_ctx:
        raise SpecrefError(f"tokens must hold 1 to n_ctx = {config.n_ctx} tokens, got {len(tokens)}")
    x = xp.take(wte, xp.asarray(tokens, dtype=xp.int64, device=device), axis=0) + params["wpe"][: len(tokens), :]
    bias = causal_bias(len(tokens), 0, xp=xp, dtype=x.dtype, device=device)
    for block in params["blocks"]:
        x = transformer_block(x, **block, n_head=config.n_head, bias=bias, xp=xp)
    return np.asarray(to_numpy(layer_norm(x, **params["ln_f"], xp=xp)), dtype=np.float64)


class TransformerHeads:
    """Linear heads on the last hidden state: row ``j = softmax(beta (h W_j + b_j))``.

    ``weights [K, n_embd + 1, V]`` (the last input row is the bias); one forward of ``tokens`` gives
    ``h``, the hidden state of its last position (one view).
    """

    def __init__(self, model, weights, *, beta: float = 8.0):
        self.params, self.config = model.params, model.config
        self.weights, self.beta = np.asarray(weights, dtype=np.float64), float(beta)

    def __call__(self, tokens):  # [n] -> [K, V]
        h = np.append(hidden_states(self.params, self.config, tokens)[-1], 1.0)  # [n_embd + 1]
        scores = self.beta * np.einsum("d,kdv->kv", h, self.weights)
        scores -= scores.max(axis=1, keepdims=True)  # subtract the row max before exp
        w = np.exp(scores)
        return w / w.sum(axis=1, keepdims=True)


def fit_transformer_heads(model, k: int, *, n_seqs: int = 150, length: int = 14, seed: int = 0,
                          ridge: float = 1e-3, beta: float = 8.0) -> TransformerHeads:
    """Heads fitted by ridge least squares to one-hot targets on the model's own samples.

    ``n_seqs`` sequences (a random first token, then temperature-1 samples of ``model``, seeded),
    ``length`` tokens each; head ``j`` regresses the token at ``t + 2 + j`` on ``[h_t, 1]``.
    """
    k, rng = check_positive_int("k", k), np.random.default_rng(seed)
    V, d = model.config.n_vocab, model.config.n_embd
    sampler = model.sibling() if hasattr(model, "sibling") else model
    xs, seqs = [], []
    for _ in range(check_positive_int("n_seqs", n_seqs)):
        seq = [int(rng.integers(V))]
        while len(seq) < length:
            row = process(np.asarray(sampler(seq), dtype=np.float64)[-1:], SamplingConfig())[0]
            seq.append(int(rng.choice(V, p=row)))
        seqs.append(seq)
        xs.append(np.hstack([hidden_states(model.params, model.config, seq), np.ones((length, 1))]))
    weights = np.empty((k, d + 1, V))
    for j in range(k):
        X = np.vstack([x[: length - 2 - j] for x in xs])  # h_t for t with a token at t + 2 + j
        Y = np.eye(V)[np.concatenate([s[2 + j:] for s in seqs])]
        weights[j] = np.linalg.solve(X.T @ X + ridge * np.eye(d + 1), X.T @ Y)
    return TransformerHeads(model, weights, beta=beta)
