"""The decoding loops of SPEC §4: greedy identity, Monte Carlo laws, stops, limits, statistics."""

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import (
    model_rows,
    next_token_probs,
    sample_target,
    speculative_block,
    speculative_decode,
)
from specref.verification.statistics.counts import g_test
from tests.implementations import resample_from_p
from toy_models.ngram import NGramModel, random_table_corpus

V = 6
CORPUS = random_table_corpus(V, 30, 40, seed=7)
TARGET = NGramModel.fit(CORPUS, order=3, vocab_size=V, add_k=F(1, 2))
DRAFT = NGramModel.fit(CORPUS[:2], order=1, vocab_size=V, add_k=1)  # disagrees often


def product_of_conditionals(model, prompt, config, n):
    """Exact law of the first ``n`` target tokens (no stop tokens), by hand: no enumerator."""
    law = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in law.items():
            row = next_token_probs(model, list(prompt) + list(seq), config)
            for x, px in enumerate(row):
                if px > 0:
                    nxt[seq + (x,)] = pr * float(px)
        law = nxt
    return law


def test_greedy_speculative_equals_greedy_target_on_100_prompts():
    rng = np.random.default_rng(0)
    disagreements = 0
    for trial in range(100):
        prompt = [int(t) for t in rng.integers(V, size=int(rng.integers(1, 5)))]
        want = sample_target(TARGET, prompt, config=GREEDY, max_new_tokens=12, rng=rng).tokens
        for k in (1, 2, 3, 5):
            got = speculative_decode(TARGET, DRAFT, prompt, k=k, config=GREEDY, max_new_tokens=12, rng=rng)
            assert got.tokens == want, (prompt, k)
            disagreements += sum(a < k for a in got.accepted_per_iteration)
    assert disagreements > 100  # the pair really disagrees, so the residual path is exercised


@pytest.mark.parametrize(
    "config", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05)]
)
def test_monte_carlo_law_of_three_tokens(config):
    """N = 6,000 seeded speculative runs (K = 2) against the exact target law of 3 tokens.

    A G-test over the V^3 = 216 outcomes (bins with expected count < 5 pooled) must not
    reject at alpha = 1e-6: a correct sampler fails it once in a million seeds, while
    the "resample from p" bug on this pair is rejected (checked below with the same N).
    """
    rng = np.random.default_rng(99)
    N, prompt = 6_000, [1, 2]
    exact = product_of_conditionals(TARGET, prompt, config, 3)
    counts = Counter(
        tuple(speculative_decode(TARGET, DRAFT, prompt, k=2, config=config, max_new_tokens=3, rng=rng).tokens)
        for _ in range(N)
    )
    assert set(counts) <= set(exact)
    assert not g_test_against(counts, exact).rejects(1e-6)
    # the same test, same N, on the classic bug: the correction drawn from p
    wrong = Counter(
        tuple(speculative_decode(TARGET, DRAFT, prompt, k=2, config=config, max_new_tokens=3, rng=rng,
                                 step=resample_from_p).tokens)
        for _ in range(N)
    )
    assert g_test_against(wrong, exact).rejects(1e-6)


def g_test_against(counts, exact):
    outcomes = sorted(exact)
    return g_test(np.array([counts[s] for s in outcomes]), np.array([exact[s] for s in outcomes]))


def test_sample_target_monte_carlo():
    """N = 20,000 seeded target samples of 2 tokens; G-test (pooled bins) at alpha = 1e-6."""
    rng = np.random.default_rng(5)
    N = 20_000
    exact = product_of_conditionals(TARGET, [0], SamplingConfig(), 2)
    counts = Counter(tuple(sample_target(TARGET, [0], config=SamplingConfig(), max_new_tokens=2, rng=rng).tokens)
                     for _ in range(N))
    assert not g_test_against(counts, exact).rejects(1e-6)


# ---------------------------------------------------------------- stops and limits


def chain_model(vocab_size, successor):
    """A bigram model where token x is always followed by successor[x] (exact, one-hot rows)."""
    from collections import Counter as C

    counts = {(x,): C({successor[x]: 1}) for x in range(vocab_size)}
    counts[()] = C(range(vocab_size))
    return NGramModel(2, vocab_size, counts, add_k=0)


def test_stop_token_inside_an_accepted_block_ends_generation():
    m = chain_model(4, {0: 1, 1: 2, 2: 3, 3: 0})  # 0 -> 1 -> 2 -> 3 -> 0
    rng = np.random.default_rng(0)
    out = speculative_decode(m, m, [0], k=4, config=SamplingConfig(), max_new_tokens=10, stop_tokens=[2], rng=rng)
    assert out.tokens == [1, 2] and out.stopped
    assert out.accepted_per_iteration == [4]  # the whole block was accepted, then cut at the stop
    assert out.iterations == 1


def test_max_new_tokens_in_the_middle_of_a_block_truncates():
    m = chain_model(4, {0: 1, 1: 2, 2: 3, 3: 0})
    out = speculative_decode(m, m, [0], k=4, config=SamplingConfig(), max_new_tokens=3, rng=np.random.default_rng(0))
    assert out.tokens == [1, 2, 3] and not out.stopped
    rng = np.random.default_rng(0)
    target = sample_target(m, [0], config=SamplingConfig(), max_new_tokens=3, stop_tokens=[2], rng=rng)
    assert target.tokens == [1, 2] and target.stopped
    assert speculative_decode(m, m, [0], k=2, config=SamplingConfig(), max_new_tokens=0, rng=rng).tokens == []


def test_statistics_are_consistent():
    rng = np.random.default_rng(3)
    k = 3
    out = speculative_decode(TARGET, DRAFT, [0], k=k, config=SamplingConfig(), max_new_tokens=40, rng=rng)
    assert out.target_calls == out.iterations == len(out.accepted_per_iteration)
    assert out.draft_calls == k * out.iterations
    # each iteration emits accepted + 1 tokens, except that the last one may be truncated
    assert sum(a + 1 for a in out.accepted_per_iteration) >= len(out.tokens) == 40
    assert out.tested_per_position[0] == out.iterations
    assert out.accepted_per_position == [sum(a > i for a in out.accepted_per_iteration) for i in range(k)]
    assert all(0 <= a <= 1 for a in out.acceptance_per_position)


def test_draft_equal_to_target_accepts_everything():
    out = speculative_decode(TARGET, TARGET, [0], k=4, config=SamplingConfig(temperature=0.8),
                             max_new_tokens=20, rng=np.random.default_rng(1))
    assert all(a == 4 for a in out.accepted_per_iteration)


def test_exact_models_run_in_fractions():
    rows = model_rows(TARGET.exact, [0, 1], 2, SamplingConfig(top_k=2))
    assert rows.dtype == object and all(sum(r) == 1 for r in rows)
    block = speculative_block(TARGET.exact, DRAFT.exact, [0, 1], k=2, config=SamplingConfig(),
                              rng=np.random.default_rng(0))
    assert 1 <= len(block) <= 3


# ---------------------------------------------------------------- bad input


def run(**overrides):
    kwargs = dict(target=TARGET, draft=DRAFT, prompt=[0], k=2, config=SamplingConfig(), max_new_tokens=3,
                  stop_tokens=(), rng=np.random.default_rng(0))
    kwargs.update(overrides)
    return speculative_decode(kwargs.pop("target"), kwargs.pop("draft"), kwargs.pop("prompt"), **kwargs)


def nan_model(tokens):
    out = np.zeros((len(tokens), V))
    out[:, 0] = np.nan
    return out


@pytest.mark.parametrize(
    "overrides, word",
    [
        ({"prompt": []}, "prompt must hold at least one token"),
        ({"prompt": [V]}, r"prompt\[0\] = 6 is out of range"),
        ({"prompt": [-1]}, "out of range"),
        ({"k": 0}, "k must be an integer >= 1"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"stop_tokens": [V + 3]}, "stop_tokens"),
        ({"config": {"temperature": 1}}, "config must be a SamplingConfig"),
        ({"draft": NGramModel.fit(CORPUS, order=1, vocab_size=V + 1)}, "vocabulary mismatch"),
        ({"draft": lambda tokens: np.zeros((1, V))}, r"draft must return logits of shape \[len\(tokens\), V\]"),
        ({"draft": nan_model}, "NaN"),
        ({"rng": None}, "rng must be a generator"),
        ({"rng": 42}, "rng must be a generator"),
    ],
)
def test_bad_decoder_input_is_named(overrides, word):
    with pytest.raises(SpecrefError, match=word):
        run(**overrides)


def test_bad_target_sampling_input_is_named():
    rng = np.random.default_rng(0)
    with pytest.raises(SpecrefError, match="max_new_tokens"):
        sample_target(TARGET, [0], config=SamplingConfig(), max_new_tokens=2.5, rng=rng)
    with pytest.raises(SpecrefError, match="target must return logits"):
        sample_target(lambda t: np.zeros(V), [0], config=SamplingConfig(), max_new_tokens=2, rng=rng)
    with pytest.raises(SpecrefError, match="rng"):
        sample_target(TARGET, [0], config=SamplingConfig(), max_new_tokens=2, rng=None)
