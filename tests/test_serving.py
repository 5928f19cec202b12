"""The batched decoding loops, the batched transformer forward, and the widened (Net2WiderNet) target."""

from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import sample_target
from specref.decoding.serving import batched_speculative_decode, batched_target_decode
from specref.verification.laws.enumeration import compare, law, target_law
from specref.verification.cases.tables import ProbTable
from toy_models.corpus import corpus
from toy_models.transformer import (
    BatchedCachedTransformer,
    CachedTransformer,
    KVCache,
    forward_batched,
    forward_cached,
    init_params,
    load,
    TransformerConfig,
)
from toy_models.widen import extend_context, fidelity, widen

SMALL = TransformerConfig(n_vocab=7, n_ctx=24, n_embd=16, n_layer=2, n_head=2)


# ---------------------------------------------------------------- the batched forward


def test_forward_batched_equals_one_sequence_at_a_time():
    # ragged: three sequences with different cached lengths and different numbers of new tokens
    params = init_params(SMALL, seed=3)
    past = [[1, 2, 3], [4], [5, 6, 0, 1, 2]]
    new = [[4, 5], [6, 6, 1, 0], [3]]
    singles, batched = [], []
    for p in past:
        c1, c2 = KVCache(SMALL), KVCache(SMALL)
        forward_cached(p, c1, **params, n_head=SMALL.n_head)
        forward_cached(p, c2, **params, n_head=SMALL.n_head)
        singles.append(c1), batched.append(c2)
    want = [np.asarray(forward_cached(n, c, **params, n_head=SMALL.n_head)) for n, c in zip(new, singles)]
    got = np.asarray(forward_batched(new, batched, **params, n_head=SMALL.n_head))
    np.testing.assert_allclose(got, np.concatenate(want), rtol=0, atol=1e-12)
    assert [len(c) for c in batched] == [len(p) + len(n) for p, n in zip(past, new)]


def test_batched_model_rolls_each_slot_back_on_its_own():
    params = init_params(SMALL, seed=4)
    model = BatchedCachedTransformer(params, SMALL, batch=2)
    ref = CachedTransformer(params, SMALL)
    a, b = [1, 2, 3, 4], [5, 6]
    model.batch([a, b])
    out = model.batch([[1, 2, 0], None])  # slot 0 rolls back to [1, 2] and appends 0; slot 1 is left alone
    assert out[1] is None
    np.testing.assert_allclose(out[0], ref.full([1, 2, 0]), atol=1e-12)
    out = model.batch([None, b + [1]])
    np.testing.assert_allclose(out[1], ref.full(b + [1]), atol=1e-12)
    assert model.stats.forwards == 3 and model.stats.rollbacks == 1
    with pytest.raises(SpecrefError, match="token_lists must hold 2"):
        model.batch([a])


# ---------------------------------------------------------------- the loops


def test_greedy_batched_speculative_decode_emits_what_greedy_target_sampling_emits():
    target, tcfg = load("target")
    draft, dcfg = load("draft_small")
    prompts = [corpus(12, seed=s) for s in (1, 2, 3)]
    want = [sample_target(CachedTransformer(target, tcfg), p, config=GREEDY, max_new_tokens=20,
                          rng=np.random.default_rng(0)).tokens for p in prompts]
    for k in (1, 3):
        got = batched_speculative_decode(BatchedCachedTransformer(target, tcfg, 3),
                                         BatchedCachedTransformer(draft, dcfg, 3), prompts, k=k, config=GREEDY,
                                         max_new_tokens=20, rng=np.random.default_rng(1))
        assert got.tokens == want
        assert got.slots == sum(len(e) for e in got.emitted) * (k + 1)  # one [A, K+1] block per iteration
        assert got.padded == got.slots - sum(sum(a) + len(a) for a in got.accepted)
    base = batched_target_decode(BatchedCachedTransformer(target, tcfg, 3), prompts, config=GREEDY,
                                 max_new_tokens=20, rng=np.random.default_rng(2))
    assert base.tokens == want and base.iterations == 20


def test_a_draft_equal_to_the_target_is_always_accepted_and_pads_nothing():
    target, tcfg = load("target")
    prompts = [corpus(8, seed=s) for s in (4, 5)]
    k = 3
    res = batched_speculative_decode(BatchedCachedTransformer(target, tcfg, 2), BatchedCachedTransformer(target, tcfg, 2),
                                     prompts, k=k, config=SamplingConfig(), max_new_tokens=2 * (k + 1),
                                     rng=np.random.default_rng(0))
    assert all(a == [k, k] for a in res.accepted) and res.iterations == 2
    assert res.padded == 0 and res.slots == 2 * 2 * (k + 1) and res.padding_fraction == 0.0


def _tables():
    # V = 3 bigram tables (h = 1) in Fractions: target p and a different draft q
    p = np.array([[F(1, 2), F(1, 3), F(1, 6)], [F(1, 5), F(3, 5), F(1, 5)], [F(1, 4), F(1, 4), F(1, 2)]], dtype=object)
    q = np.array([[F(1, 3), F(1, 3), F(1, 3)], [F(1, 2), F(1, 4), F(1, 4)], [F(0), F(1, 2), F(1, 2)]], dtype=object)
    return ProbTable(p), ProbTable(q)


def test_the_batched_loop_has_exactly_the_target_law_per_request_and_independent_requests():
    # Exact: every random choice of the loop enumerated over Fraction rows, with one stop token.
    # Two requests at K = 1, 2 new tokens (304 paths): the joint law must be the product of the
    # target laws; one request at K = 2, 3 new tokens (451 paths) reaches a bonus and a second block.
    target, draft = _tables()
    config, stops = SamplingConfig(), (1,)

    def loop_law(tgt, prompts, k, n):
        return law(lambda rng: tuple(tuple(t) for t in batched_speculative_decode(
            tgt, draft, prompts, k=k, config=config, max_new_tokens=n, rng=rng, stop_tokens=stops).tokens))

    a, b = (target_law(target, pr, config, 2, stops) for pr in ([0], [2]))
    want = {(x, y): pa * pb for x, pa in a.items() for y, pb in b.items()}
    assert compare(loop_law(target, [[0], [2]], 1, 2), want).tv == 0
    deep = {(x,): px for x, px in target_law(target, [0], config, 3, stops).items()}
    assert compare(loop_law(target, [[0]], 2, 3), deep).tv == 0
    # the comparison can fail: the same loop with the draft as its target has another law
    assert compare(loop_law(draft, [[0], [2]], 1, 2), want).tv > F(1, 100)


def test_batched_target_decode_has_the_target_law():
    target, _ = _tables()
    got = law(lambda rng: tuple(tuple(t) for t in batched_target_decode(
        target, [[1], [1]], config=SamplingConfig(), max_new_tokens=2, rng=rng).tokens))
    a = target_law(target, [1], SamplingConfig(), 2)
    assert compare(got, {(x, y): pa * pb for x, pa in a.items() for y, pb in a.items()}).tv == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[]), "prompts must be a non-empty list"),
    (dict(prompts=[[0], [9]]), r"prompts\[1\]"),
    (dict(k=0), "k must be"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(config="greedy"), "config must be a SamplingConfig"),
])
def test_bad_input_names_the_argument(kwargs, match):
    target, draft = _tables()
    args = dict(prompts=[[0]], k=2, config=SamplingConfig(), max_new_tokens=2, rng=np.random.default_rng(0)) | kwargs
    with pytest.raises(SpecrefError, match=match):
        batched_speculative_decode(target, draft, **args)


# ---------------------------------------------------------------- Net2WiderNet


@pytest.mark.parametrize("r, noise", [(2, 0.0), (3, 0.05)])
def test_widening_keeps_the_function(r, noise):
    params, config = load("target")
    wide, wcfg = widen(params, config, r, noise=noise, seed=1)
    assert (wcfg.n_embd, wcfg.n_mlp, wcfg.n_head) == (r * config.n_embd, r * config.n_mlp, config.n_head)
    fid = fidelity(params, config, wide, wcfg, corpus(64, seed=3))
    assert fid["max_abs_logit_diff"] < 1e-10  # float64 rounding only (the logits are O(10))


def test_widening_noise_breaks_the_copies_symmetry_and_is_what_keeps_the_sum():
    params, config = load("target")
    wide, _ = widen(params, config, 2, noise=0.05, seed=1)
    w = wide["blocks"][0]["mlp"]["c_fc"]["w"]  # [2 n_embd, 2 n_mlp]: rows 2i, 2i+1 are copies of input unit i
    assert np.abs(w[0::2] - w[1::2]).max() > 1e-4  # the copies differ ...
    np.testing.assert_allclose(w[0::2] + w[1::2], params["blocks"][0]["mlp"]["c_fc"]["w"][:, np.repeat(np.arange(config.n_mlp), 2)],
                               atol=1e-12)  # ... and sum to the original weight
    # without the 1/sqrt(r) query scale the function changes: the fidelity measure sees it
    broken = {**wide, "blocks": [dict(b, attn=dict(b["attn"], c_attn={
        "w": b["attn"]["c_attn"]["w"] * np.r_[np.full(2 * config.n_embd, np.sqrt(2)), np.ones(4 * config.n_embd)],
        "b": b["attn"]["c_attn"]["b"]})) for b in wide["blocks"]]}
    _, wcfg = widen(params, config, 2)
    assert fidelity(params, config, broken, wcfg, corpus(64, seed=3))["max_tv"] > 1e-3


def test_extend_context_keeps_the_trained_positions_and_refuses_shrinking():
    params, config = load("draft_small")
    longer, lcfg = extend_context(params, config, 300)
    assert lcfg.n_ctx == 300
    np.testing.assert_array_equal(longer["wpe"][: config.n_ctx], params["wpe"])
    np.testing.assert_array_equal(longer["wpe"][config.n_ctx], params["wpe"][config.n_ctx // 2])
    with pytest.raises(SpecrefError, match="n_ctx must be at least"):
        extend_context(params, config, 64)
    with pytest.raises(SpecrefError, match="noise must be"):
        widen(params, config, 2, noise=float("nan"))
