"""The oracle's models as torch modules and Hugging Face models; a decoder written against them, checked.

Statistical checks (a decoder in PyTorch draws from torch's global generator, seeded
per call by ``torch_seeded``): ``N = 800`` samples per check at the oracle's
``alpha = 1e-6``, on the position-aware decoder case (V = 3, K = 2, 3 new tokens,
18 outcomes with positive probability, plus the oracle's bin for impossible ones).
``detectable_tv(800, 1e-6, 0.9, 19)`` is about 0.26: the correct decoder must pass.
The decoder that re-feeds its prefix on top of the cache makes the same mistake as
``zoo.kv_cache_refeeds_prefix``, whose exact law on this case is computed below: TV
0.242, and mass ``m`` on outputs the target never makes, which the G-test rejects
outright -- it is missed only when none of the N samples lands there, probability
``(1 - m) ** N < 1e-6`` (asserted).  About 8 s (~4.5 ms per decode with one torch thread).
"""

import numpy as np
import pytest

from specref.verification.zoo import chain as zoo
from specref.verification.cases.chain import default_cases, extra_cases
from specref.verification.laws.enumeration import law, target_law
from specref.verification.oracle import check_decoder
from specref.verification.statistics.counts import detectable_tv

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specref.adapters.hf_models import (  # noqa: E402
    case_hf_models,
    case_torch_models,
    generation_config,
    hf_model,
    torch_models,
    torch_seeded,
)
from specref.core.sampling import SamplingConfig  # noqa: E402

N = 800  # samples per statistical check (module docstring)
POSITION = next(c for c in extra_cases("decoder") if c.name == "position-aware")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # [1, n, 3] tensors: the intra-op pool only adds overhead
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- (b) torch modules


def test_module_logits_are_the_case_rows_for_every_position():
    case = default_cases("decoder")[0]
    target, _ = case_torch_models(case)
    out = target(torch.tensor([[0, 1, 2]]))
    rows = np.array(case.models()[0].probs([0, 1, 2]), dtype=float)  # [3, V]
    np.testing.assert_allclose(torch.softmax(out.logits[0].double(), -1).numpy(), rows, atol=1e-6)
    assert out.logits.shape == (1, 3, 3) and out.logits.dtype == torch.float32 and out[0] is out.logits
    assert out.past_key_values.get_seq_length() == 3  # use_cache defaults to config.use_cache, as transformers
    assert target(torch.tensor([[0]]), use_cache=False).past_key_values is None  # none asked for, none made
    gen = target.generation_config
    assert gen.do_sample and gen.num_assistant_tokens == case.k and gen.max_new_tokens == case.max_new_tokens


def test_cache_holds_token_ids_and_a_refed_prefix_changes_position_aware_rows():
    t, _ = case_torch_models(POSITION)
    full = t(torch.tensor([[0, 1, 2, 0]])).logits[0, -1]
    first = t(torch.tensor([[0, 1]]), past_key_values=())  # an empty legacy tuple: the legacy form comes back
    keys = first.past_key_values[0][0]  # [B, 1, L, 1]: token ids, not attention states
    assert keys[0, 0, :, 0].tolist() == [0.0, 1.0]
    right = t(torch.tensor([[2, 0]]), past_key_values=first.past_key_values, use_cache=True)
    torch.testing.assert_close(right.logits[0, -1], full)  # the cache path equals the full recompute
    refed = t(torch.tensor([[0, 1, 2, 0]]), past_key_values=first.past_key_values, use_cache=True)
    assert t.calls[-1][0] == [0, 1, 0, 1, 2, 0]  # what the model saw: the prefix twice
    assert not torch.equal(refed.logits[0, -1], full)
    cropped = tuple((k[:, :, :1], v[:, :, :1]) for k, v in right.past_key_values)  # the legacy slicing idiom
    again = t(torch.tensor([[1, 2, 0]]), past_key_values=cropped)
    torch.testing.assert_close(again.logits[0, -1], full)


def test_transformers_cache_is_updated_in_place_and_crops():
    from transformers.cache_utils import DynamicCache

    t, _ = case_torch_models(POSITION)
    cache = DynamicCache()
    t(torch.tensor([[0, 1, 2]]), past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 3
    cache = crop(cache, 1)
    assert cache.get_seq_length() == 2
    out = t(torch.tensor([[1]]), past_key_values=cache)
    assert t.calls[-1][0] == [0, 1, 1]
    torch.testing.assert_close(out.logits[0, -1], t(torch.tensor([[0, 1, 1]])).logits[0, -1])


def test_bad_input_ids_name_the_argument():
    from specref.core.errors import SpecrefError

    t, _ = case_torch_models(POSITION)
    with pytest.raises(SpecrefError, match="input_ids"):
        t(torch.tensor([[0, 3]]))
    with pytest.raises(SpecrefError, match="input_ids"):
        t(torch.zeros((1, 0), dtype=torch.long))


def test_generation_config_maps_the_sampling_settings():
    g = generation_config(SamplingConfig(temperature=0.5, top_k=2, top_p=0.9), stop_tokens=(2,), k=3)
    assert (g.do_sample, g.temperature, g.top_k, g.top_p, g.eos_token_id) == (True, 0.5, 2, 0.9, 2)
    assert g.num_assistant_tokens == 3 and g.num_assistant_tokens_schedule == "constant"
    assert g.assistant_confidence_threshold == 0.0
    assert generation_config(SamplingConfig(temperature=0)).do_sample is False


def test_min_p_maps_or_is_refused_where_transformers_has_no_min_p():
    from transformers import GenerationConfig

    from specref.core.errors import SpecrefError

    min_p = SamplingConfig(min_p=0.1)
    if "min_p" in vars(GenerationConfig()):  # transformers 4.41 on
        assert generation_config(min_p).min_p == 0.1
    else:  # 4.40: the field would be stored and never applied
        with pytest.raises(SpecrefError, match=r"config.min_p is 0.1 .* no min_p"):
            generation_config(min_p)


# ---------------------------------------------------------------- (c) PreTrainedModel


def test_hf_model_generates_greedily_along_the_case_rows():
    from transformers import PreTrainedModel

    case = next(c for c in extra_cases("decoder") if c.name == "greedy-logits")
    target, draft = case_hf_models(case)
    assert isinstance(target, PreTrainedModel)
    out = target.generate(torch.tensor([[0]]), max_new_tokens=3)
    table = case.target  # [V, V] logits, a bigram: the greedy chain is argmax after argmax
    chain, x = [], 0
    for _ in range(3):
        x = int(np.argmax(table[x]))
        chain.append(x)
    assert out[0, 1:].tolist() == chain
    assisted = target.generate(torch.tensor([[0]]), assistant_model=draft, max_new_tokens=3)
    assert assisted[0, 1:].tolist() == chain  # assisted greedy: the same tokens
    assert max(n for _, n in target.calls) >= 2  # the target scored a draft block in one call


def test_toy_models_become_hf_models():
    from toy_models.ngram import NGramModel

    ngram = NGramModel.random(order=2, vocab_size=4, seed=3)
    hf = hf_model(ngram, config=SamplingConfig(temperature=0))
    torch.testing.assert_close(hf(torch.tensor([[0, 2]])).logits[0].double(), torch.from_numpy(ngram([0, 2])))


# ---------------------------------------------------------------- a decoder written against HF-style models


def _sample(p):
    return int(torch.multinomial(p, 1))


def crop(cache, drop):
    """``cache`` without its last ``drop >= 1`` tokens: ``Cache.crop(-drop)`` where the installed transformers
    has it (4.42 on; 5.x takes only the negative count); a 4.40 or 4.41 ``DynamicCache`` has none, so its
    ``(keys, values)`` layers are sliced into a new one, the legacy idiom."""
    assert drop >= 1  # crop(0) would empty a 4.x cache
    if hasattr(cache, "crop"):
        cache.crop(-drop)
        return cache
    keep = cache.get_seq_length() - drop
    return type(cache).from_legacy_cache(tuple((k[:, :, :keep], v[:, :, :keep]) for k, v in cache))


def hf_style_decode(target, draft, input_ids, *, gamma, max_new_tokens, temperature=1.0, refeed=False):
    """Speculative sampling as public PyTorch repositories write it for transformers: HF-style models,
    sizes from ``model.config``, the target's cache as the first call returns it, cropped after a rejection."""
    V = target.config.vocab_size
    assert draft.config.vocab_size == V
    seq, n0, past = input_ids[0].tolist(), input_ids.shape[1], None
    while len(seq) - n0 < max_new_tokens:
        drafted, qs = [], torch.zeros((gamma, V))
        for i in range(gamma):  # 1. draft (no cache)
            qs[i] = torch.softmax(draft(torch.tensor([seq + drafted]), use_cache=False).logits[0, -1] / temperature, -1)
            drafted.append(_sample(qs[i]))
        # 2. one target call on top of the cache; refeed=True is the bug: the whole prefix again
        feed = seq + drafted if past is None or refeed else seq[past.get_seq_length():] + drafted
        out = target(torch.tensor([feed]), past_key_values=past)  # the first call starts the cache
        past = out.past_key_values
        ps = torch.softmax(out.logits[0, -(gamma + 1):] / temperature, -1)
        n = 0  # 3. accept until the first rejection
        while n < gamma and torch.rand(()) < ps[n, drafted[n]] / qs[n][drafted[n]]:
            n += 1
        if n < gamma:  # 4. residual or bonus
            r = torch.clamp(ps[n] - qs[n], min=0)
            nxt = _sample(r / r.sum())
        else:
            nxt = _sample(ps[gamma])
        if n < gamma:
            past = crop(past, gamma - n)  # drop the rejected draft tokens
        seq += drafted[:n] + [nxt]
    return seq[n0:n0 + max_new_tokens]


def decoder(refeed):
    @torch_seeded
    def decode(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        t, d = torch_models(target, draft)
        return hf_style_decode(t, d, torch.tensor([prompt]), gamma=k, max_new_tokens=max_new_tokens,
                               temperature=config.temperature, refeed=refeed)

    return decode


def test_a_decoder_written_against_hf_models_is_checked_without_patching():
    assert detectable_tv(N, 1e-6, 0.9, 19) < 0.27
    target, draft = POSITION.models()
    bug = law(lambda rng: tuple(zoo.kv_cache_refeeds_prefix(target, draft, list(POSITION.prompt), k=POSITION.k,
                                                            config=POSITION.config, max_new_tokens=3, rng=rng)))
    truth = target_law(target, list(POSITION.prompt), POSITION.config, 3)
    stray = sum(w for out, w in bug.items() if out not in truth)  # mass on outputs the target never makes
    assert (1 - float(stray)) ** N < 1e-6
    good = check_decoder(decoder(refeed=False), cases=[POSITION], mode="statistical", samples=N)
    assert good.ok, good
    bad = check_decoder(decoder(refeed=True), cases=[POSITION], mode="statistical", samples=N)
    assert not bad.ok and bad.results[0].p_value < 1e-6, bad


def test_torch_seeded_is_reproducible_and_restores_the_callers_generator():
    def draw(rng):
        return torch.rand(3).tolist()

    seeded = torch_seeded(draw)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = seeded(2 ** 63 - 1), seeded(rng=2 ** 63 - 1)  # the oracle's largest seed
    assert a == b and seeded(5) != a
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(TypeError, match="integer seed"):
        seeded(np.random.default_rng(0))


# ---------------------------------------------------------------- models that behave like HF models


def test_both_classes_import_by_name_and_carry_a_config():
    from transformers import PretrainedConfig
    from transformers.cache_utils import DynamicCache

    from specref.adapters.hf_models import HFTableModel, SpecrefTableConfig, TableModule

    case = next(c for c in default_cases("decoder") if c.name == "stop-token")
    t, _ = case_torch_models(case)
    h, _ = case_hf_models(case)
    assert isinstance(t, TableModule) and isinstance(h, HFTableModel)
    for model in (t, h):
        config = model.config
        assert isinstance(config, SpecrefTableConfig) and isinstance(config, PretrainedConfig)
        assert (config.vocab_size, config.use_cache, config.eos_token_id, config.pad_token_id) == (3, True, 1, 1)
        out = model(torch.tensor([[0, 1]]))  # the first call returns the installed transformers' cache
        assert isinstance(out.past_key_values, DynamicCache) and out.past_key_values.get_seq_length() == 2
    assert TableModule(case.models()[0]).config.vocab_size == 3  # built by hand, too


def test_a_config_that_disagrees_with_the_logits_is_named():
    from specref.core.errors import SpecrefError

    t, _ = case_torch_models(POSITION)
    t.config.vocab_size = 5
    with pytest.raises(SpecrefError, match=r"config.vocab_size is 5 .* V = 3"):
        t(torch.tensor([[0]]))


def test_a_transformers_cache_handed_in_comes_back_updated():
    from transformers.cache_utils import DynamicCache

    h, _ = case_hf_models(POSITION)
    cache = DynamicCache()
    out = h(torch.tensor([[0, 1]]), past_key_values=cache, use_cache=True)
    assert (out.past_key_values if out.get("past_key_values") is not None else out.cache) is cache
    assert cache.get_seq_length() == 2
    assert h(torch.tensor([[0]]), use_cache=False).get("past_key_values") is None


def test_the_hand_written_loop_reads_config_and_cache_exactly():
    """The hand-written loop above, with the draft always accepted (p = q), gives target samples."""
    case = next(c for c in default_cases("decoder") if c.name == "p-equals-q")
    t, d = case_torch_models(case)
    torch.manual_seed(0)
    out = hf_style_decode(t, d, torch.tensor([list(case.prompt)]), gamma=2, max_new_tokens=3)
    assert len(out) == 3 and all(0 <= x < 3 for x in out)
    assert [n for _, n in t.calls] == [len(case.prompt) + 2, 3][: len(t.calls)]  # prompt + drafts, then 1 + drafts


def test_a_disagreeing_config_is_named_by_both_classes_and_at_the_decoder_level():
    from specref.core.errors import SpecrefError

    h, _ = case_hf_models(POSITION)
    h.config.vocab_size = 4
    with pytest.raises(SpecrefError, match=r"config.vocab_size is 4 but the model's logits have V = 3"):
        h(torch.tensor([[0]]))

    @torch_seeded
    def decode(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        t, d = torch_models(target, draft)
        t.config.vocab_size = d.config.vocab_size = 7  # models whose config is not their logits' width
        return hf_style_decode(t, d, torch.tensor([prompt]), gamma=k, max_new_tokens=max_new_tokens)

    r = check_decoder(decode, cases=[POSITION], mode="statistical", samples=20, isolate=False).results[0]
    assert r.status == "raised" and "config.vocab_size is 7 but the model's logits have V = 3" in r.detail, r
