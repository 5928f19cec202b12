"""The toy transformer: the KV cache against a full recompute, on every array backend.

Each test computes the same logits two independent ways and asserts they agree:
cached appends and rollbacks vs a full recompute (to 1e-10 in float64); the
model file's forward vs the training script's batched re-implementation; the
hand-written gradients vs finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from toy_models import corpus as corpus_mod
from toy_models import train as train_mod
from toy_models.transformer import (
    WEIGHTS_DIR,
    CachedTransformer,
    KVCache,
    TransformerConfig,
    flatten_params,
    forward_cached,
    gpt,
    init_params,
    load,
    map_params,
    to_backend,
)

TOL = 1e-10
SMALL = TransformerConfig(n_vocab=13, n_ctx=24, n_embd=16, n_layer=2, n_head=2)


def rough_params(config: TransformerConfig, seed: int = 0) -> dict:
    """Initialised params with O(1) noise added, so logits differ strongly between positions."""
    rng = np.random.default_rng(seed + 1000)
    return map_params(lambda a: a + rng.normal(0.0, 0.4, a.shape), init_params(config, seed))


PARAMS = rough_params(SMALL)


def _cupy():
    return pytest.importorskip("cupy")


def _strict():
    return pytest.importorskip("array_api_strict")


BACKENDS = {"numpy": lambda: np, "array_api_strict": _strict, "cupy": _cupy}


@pytest.fixture(params=list(BACKENDS))
def xp(request):
    return BACKENDS[request.param]()


def full_logits(params, tokens) -> np.ndarray:  # [n_seq] -> [n_seq, n_vocab] float64 NumPy
    return np.asarray(to_numpy(gpt(tokens, **params, n_head=SMALL.n_head)), dtype=np.float64)


# ---------------------------------------------------------------------------
# The KV cache against a full recompute

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=6)),
        st.tuples(st.just("rollback"), st.floats(0.0, 1.0)),
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("backend", ["numpy", "array_api_strict"])
@settings(max_examples=40, deadline=None)
@given(ops=ops)
def test_appends_and_rollbacks_match_full_recompute(backend, ops):
    xp = BACKENDS[backend]()
    params = to_backend(PARAMS, xp)
    cache = KVCache.for_params(params, SMALL)
    seq: list[int] = []
    for op, arg in ops:
        if op == "rollback":
            keep = int(arg * len(seq))
            cache.rollback(keep)
            del seq[keep:]
        else:
            new = arg[: SMALL.n_ctx - len(seq)]
            if not new:
                continue
            rows = np.asarray(to_numpy(forward_cached(new, cache, **params, n_head=SMALL.n_head)))
            seq += new
            assert rows.shape == (len(new), SMALL.n_vocab)
            np.testing.assert_allclose(rows, full_logits(params, seq)[-len(new) :], rtol=0, atol=TOL)
        assert len(cache) == len(seq)


def test_one_call_scores_k_plus_1_rows_like_token_by_token(xp):
    params = to_backend(PARAMS, xp)
    prefix, block = [3, 1, 4, 1, 5], [9, 2, 6, 5, 3]  # last prefix token + K = 4 drafts -> K+1 rows
    one = KVCache.for_params(params, SMALL)
    forward_cached(prefix, one, **params, n_head=SMALL.n_head)
    rows = to_numpy(forward_cached(block, one, **params, n_head=SMALL.n_head))
    step = KVCache.for_params(params, SMALL)
    forward_cached(prefix, step, **params, n_head=SMALL.n_head)
    by_token = np.concatenate([to_numpy(forward_cached([t], step, **params, n_head=SMALL.n_head)) for t in block])
    np.testing.assert_allclose(rows, by_token, rtol=0, atol=TOL)
    np.testing.assert_allclose(rows, full_logits(params, prefix + block)[len(prefix) :], rtol=0, atol=TOL)


def test_backends_agree_with_numpy(xp):
    tokens = [0, 5, 12, 7, 7, 3, 1]
    ref = full_logits(PARAMS, tokens)
    got = gpt(tokens, **to_backend(PARAMS, xp), n_head=SMALL.n_head)
    assert not isinstance(got, np.ndarray) or xp is np  # the result stays on the backend
    np.testing.assert_allclose(to_numpy(got), ref, rtol=0, atol=TOL)


# ---------------------------------------------------------------------------
# The model protocol wrapper


# call patterns of a speculative decoder: (draft block, how many of its tokens are accepted, correction)
spec_calls = st.lists(
    st.tuples(
        st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=5),
        st.integers(0, 5),
        st.integers(0, SMALL.n_vocab - 1),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(prompt=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=4), calls=spec_calls)
def test_cached_transformer_equals_full_recompute(prompt, calls):
    model = CachedTransformer(PARAMS, SMALL)
    seq = list(prompt)
    for block, accepted, correction in calls:
        tokens = (seq + block)[: SMALL.n_ctx]  # one target call scores the prefix + the block
        before = model.stats.forwards
        out = model(tokens)
        assert out.dtype == np.float64 and out.shape == (len(tokens), SMALL.n_vocab)
        np.testing.assert_allclose(out, model.full(tokens), rtol=0, atol=TOL)
        assert model.stats.forwards - before <= 1  # the new rows come from one forward call
        seq = tokens[: min(len(seq) + accepted, len(tokens))]  # the rejected drafts are dropped
        if len(seq) < SMALL.n_ctx:
            seq.append(correction)  # the residual's token
        np.testing.assert_allclose(model(seq), model.full(seq), rtol=0, atol=TOL)


def test_cached_transformer_counts_and_rolls_back(xp):
    model = CachedTransformer(PARAMS, SMALL, xp=xp)
    model([1, 2, 3])
    out = model([1, 2, 3, 4, 5, 6])  # K+1 = 3 new rows, one forward
    assert (model.stats.calls, model.stats.forwards, model.stats.tokens) == (2, 2, 6)
    again = model([1, 2, 3, 4, 5, 6])  # fully cached: no forward
    assert model.stats.forwards == 2
    np.testing.assert_array_equal(out, again)
    out = model([1, 2, 3, 4, 9])  # reject at 5: roll back to 4 tokens, append 9
    assert len(model.cache) == 5 and model.stats.rollbacks == 1 and model.stats.tokens_rolled_back == 2
    np.testing.assert_allclose(out, full_logits(PARAMS, [1, 2, 3, 4, 9]), rtol=0, atol=TOL)
    out[:] = 0  # returned rows are a copy, not the model's store
    assert np.abs(model([1, 2, 3, 4, 9])).max() > 0
    assert model.stats.rollback_seconds >= 0
    # the same through the explicit methods: rollback to an absolute length, append a block
    model.rollback(2)
    assert len(model) == len(model.cache) == 2
    rows = model.append([7, 8])
    np.testing.assert_allclose(rows, full_logits(PARAMS, [1, 2, 7, 8])[2:], rtol=0, atol=TOL)
    with pytest.raises(SpecrefError, match="rollback"):
        model.rollback(5)


def test_rollback_false_simulates_the_stale_cache_bug():
    good, bad = CachedTransformer(PARAMS, SMALL), CachedTransformer(PARAMS, SMALL, rollback=False)
    for m in (good, bad):
        m([1, 2, 3, 4, 5, 6])
    tokens = [1, 2, 3, 4, 9]  # drafts 5, 6 rejected
    assert np.abs(good(tokens) - full_logits(PARAMS, tokens)).max() < TOL
    stale = bad(tokens)
    np.testing.assert_allclose(stale[:4], good(tokens)[:4], rtol=0, atol=TOL)  # rows before the rejection agree
    assert np.abs(stale[4] - good(tokens)[4]).max() > 1e-3  # the new row saw the discarded tokens
    assert len(bad.cache) == 7


# ---------------------------------------------------------------------------
# Initialisation, errors, saved weights


def test_init_is_deterministic():
    a, b, c = (flatten_params(init_params(SMALL, s)) for s in (7, 7, 8))
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a if k.endswith(".w"))
    assert a["wte"].shape == (13, 16) and a["blocks.1.mlp.c_fc.w"].shape == (16, 64)


def test_bad_input_raises_named_errors():
    model = CachedTransformer(PARAMS, SMALL)
    with pytest.raises(SpecrefError, match="out of range"):
        model([1, 13])
    with pytest.raises(SpecrefError, match="inputs"):
        gpt([-1], **PARAMS, n_head=2)
    with pytest.raises(SpecrefError, match="n_ctx"):
        model(list(range(10)) * 3)
    with pytest.raises(SpecrefError, match="integer"):
        model([1, 2.5])
    with pytest.raises(SpecrefError, match="at least one"):
        gpt([], **PARAMS, n_head=2)
    assert model([]).shape == (0, SMALL.n_vocab)  # logits for every position of no tokens
    cache = KVCache(SMALL)
    forward_cached([1, 2], cache, **PARAMS, n_head=2)
    with pytest.raises(SpecrefError, match="rollback"):
        cache.rollback(3)
    with pytest.raises(SpecrefError, match="n_ctx"):
        forward_cached([1] * 23, cache, **PARAMS, n_head=2)
    assert len(cache) == 2  # a refused call leaves the cache as it was
    with pytest.raises(SpecrefError, match="n_head"):
        TransformerConfig(n_vocab=5, n_ctx=8, n_embd=10, n_layer=1, n_head=3)
    with pytest.raises(SpecrefError, match="name"):
        load("no_such_model")


@pytest.mark.parametrize("name", ["target", "draft_small"])
def test_saved_weights_load_and_give_finite_logits(name):
    path = WEIGHTS_DIR / f"{name}.npz"
    assert path.stat().st_size < 5_000_000
    params, config = load(name)
    assert config.n_vocab == corpus_mod.VOCAB
    assert params["wte"].dtype == np.float64
    tokens = corpus_mod.corpus(40, seed=123)
    model = CachedTransformer(params, config)
    logits = model(tokens)
    assert logits.shape == (40, config.n_vocab) and np.isfinite(logits).all()
    np.testing.assert_allclose(logits[-5:], model.full(tokens)[-5:], rtol=0, atol=1e-9)


def test_saved_target_and_draft_are_a_pair():
    target, tcfg = load("target")
    draft, dcfg = load("draft_small")
    n_params = lambda p: sum(a.size for a in flatten_params(p).values())  # noqa: E731
    assert n_params(target) > 10 * n_params(draft)
    tokens = corpus_mod.corpus(100, seed=7)
    p = _softmax(CachedTransformer(target, tcfg)(tokens))
    q = _softmax(CachedTransformer(draft, dcfg)(tokens))
    assert train_mod.acceptance(p, q) > 0.6  # the trained draft agrees with the target on most tokens


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------
# The training script: an independent forward, and its gradients


def test_training_forward_matches_the_model():
    x = np.array([[1, 2, 3, 4, 5, 6, 7], [0, 12, 0, 12, 3, 3, 3]])
    logits, _ = train_mod.forward(PARAMS, x, SMALL.n_head)
    for b in range(len(x)):
        np.testing.assert_allclose(logits[b], full_logits(PARAMS, list(x[b])), rtol=0, atol=1e-10)


def test_training_gradients_match_finite_differences():
    cfg = TransformerConfig(n_vocab=7, n_ctx=6, n_embd=8, n_layer=2, n_head=2)
    params = rough_params(cfg, 3)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    grads = flatten_params(train_mod.forward(params, x, cfg.n_head, y)[1][1]())
    flat = flatten_params(params)  # views into params: perturbing them perturbs the model
    assert grads.keys() == flat.keys()
    eps = 1e-6
    for key, leaf in flat.items():
        for j in rng.choice(leaf.size, min(3, leaf.size), replace=False):
            old = leaf.flat[j]
            leaf.flat[j] = old + eps
            up = train_mod.forward(params, x, cfg.n_head, y)[1][0]
            leaf.flat[j] = old - eps
            down = train_mod.forward(params, x, cfg.n_head, y)[1][0]
            leaf.flat[j] = old
            assert abs((up - down) / (2 * eps) - grads[key].flat[j]) < 1e-7, key


# ---------------------------------------------------------------------------
# The corpus


def test_corpus_is_deterministic_and_in_vocabulary():
    a, b = corpus_mod.corpus(500, seed=3), corpus_mod.corpus(500, seed=3)
    assert a == b and len(a) == 500 and a != corpus_mod.corpus(500, seed=4)
    assert all(isinstance(t, int) and 0 <= t < corpus_mod.VOCAB for t in a)
    assert corpus_mod.WORDS[a[0]] in corpus_mod.TOPICS
    text = corpus_mod.decode(a[:200])
    assert corpus_mod.encode(text) == a[:200]
