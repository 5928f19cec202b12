"""mlx-lm's OpenAI-compatible server (``specref.adapters.mlx_server``), Linux CPU, with and without its
draft model, judged against the target's own law.

1. No engine needed: an absent environment names the script that makes it; the request body is
   what mlx-lm's ``/v1/completions`` reads (a text prompt, ``logprobs`` for the ids, one sample
   per request, ``seed + i`` for sample ``i``), and what it cannot express is refused.
2. mlx-lm 0.32.2 on mlx[cpu] 0.32.4 (the environment ``scripts/make_mlx_env.py`` makes; without
   it these skip and say so), on the tiny target and draft of
   :func:`specref.adapters.vllm_e2e.build_models`, one server per configuration for the module:

   - :func:`~specref.adapters.mlx_server.mlx_rules` masks exactly what mlx-lm's own
     ``apply_top_p`` / ``apply_min_p`` / ``apply_top_k`` mask (run in the environment);
   - no draft model, the control: a sampled request (T 0.9, top-p 0.95; 96 outcomes) follows the
     target law, unseeded (served batched) and seeded (served one by one, as with a draft model);
     a seed gives the same samples again; greedy requests are transformers' argmax chain;
   - ``--draft-model``, as shipped: the same request departs grossly (the FINDING of
     :mod:`specref.adapters.mlx_server`: the prompt cache hands the next request a target KV
     cache one token short), and a greedy request repeated leaves the argmax chain;
   - ``--draft-model --prompt-cache-size 0``: the same request follows the target law again and
     greedy requests are the argmax chain: mlx-lm's speculative verification itself is exact.

Statistics: the G-test at alpha 1e-3; N = 1,500 for the control (the TV it detects with power
0.9, about 0.12, is asserted), 600 seeded (about 0.22), 1,000 without the prompt cache (about
0.15), 300 for the departure (TV about 0.99, nearly every sample on a probability-0 outcome,
p < 1e-20).  About a minute on two busy cores, start-ups (about 2 s each) included.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from specref.adapters.mlx_server import MAKE_SCRIPT, MLXClient, MLXServer, mlx_python, mlx_rules  # noqa: E402
from specref.adapters.vllm_e2e import VLLMRequest, build_models, target_rows  # noqa: E402
from specref.core.errors import SpecrefError  # noqa: E402
from specref.core.sampling import SamplingConfig as C  # noqa: E402

SAMPLED = C(temperature=0.9, top_p=0.95)
PROMPT = (7, 8, 9, 7, 8)
GREEDY_PROMPTS = [(5, 6), (1, 2, 3, 4)]
REPEATED = (1, 2, 3, 4)  # the greedy prompt whose repeat leaves the argmax chain under --draft-model


def sampled(n, **kw):
    return VLLMRequest(PROMPT, SAMPLED, 3, n=n, name=f"{PROMPT}, T 0.9, top-p 0.95", **kw)


try:
    mlx_python()
    NO_ENGINE = ""
except SpecrefError as e:
    NO_ENGINE = f"{e} -- the mlx-lm server tests skip without it"
needs_engine = pytest.mark.skipif(bool(NO_ENGINE), reason=NO_ENGINE)


# ---------------------------------------------------------------- no engine needed


def test_an_absent_environment_names_the_script(tmp_path):
    with pytest.raises(SpecrefError, match=f"not made .*{MAKE_SCRIPT}"):
        mlx_python(tmp_path / "nothing")
    with pytest.raises(SpecrefError, match=MAKE_SCRIPT):
        MLXServer(tmp_path, venv=tmp_path / "nothing")


def test_the_request_is_what_mlx_lm_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 256}))
    client = MLXClient("http://127.0.0.1:1", tmp_path)
    r = VLLMRequest((3, 4), C(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1), 3, n=4, seed=11)
    assert client.body(r, index=2) == dict(model="default_model", prompt="t3 t4", max_tokens=3, temperature=0.7,
                                           top_p=0.9, top_k=5, min_p=0.1, seed=13, logprobs=True)
    plain = client.body(VLLMRequest((3,), C(temperature=0.5, top_k=256), 2))
    assert "seed" not in plain and "top_k" not in plain and "min_p" not in plain and "n" not in plain
    with pytest.raises(SpecrefError, match="one sample per request"):
        client.body(r, 4)
    with pytest.raises(SpecrefError, match="stop_tokens are not supported"):
        client.body(VLLMRequest((3,), C(), 2, stop_tokens=(9,)))


# ---------------------------------------------------------------- mlx-lm's server


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The law's transformers forwards on one thread: two threads on two busy cores stall (0.1-0.3 s a
    forward instead of 2 ms); the caller's setting is restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("mlx-models"))


@pytest.fixture(scope="module")
def plain(models):
    with MLXServer(models["target"]) as server:
        yield server


@pytest.fixture(scope="module")
def drafted(models):
    with MLXServer(models["target"], draft_model_dir=models["draft"], num_draft_tokens=2) as server:
        yield server


@pytest.fixture(scope="module")
def drafted_uncached(models):
    with MLXServer(models["target"], draft_model_dir=models["draft"], num_draft_tokens=2,
                   extra_args=("--prompt-cache-size", "0")) as server:
        yield server


def _argmax_chain(target, prompt, n):
    rows, out = target_rows(target), list(prompt)
    for _ in range(n):
        out.append(int(rows(out)[-1].argmax()))
    return tuple(out[len(prompt):])


def _greedy(server, prompt, n=3):
    """``n`` greedy samples of ``prompt``, one request after another (in the order the server serves them)."""
    return server.client(concurrency=1).complete(VLLMRequest(prompt, C(temperature=0), 3, n=n))


MASKS = """
import json, sys, numpy as np, mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, apply_min_p, apply_top_k
x = mx.array(np.load(sys.argv[1]))
lp = x - mx.logsumexp(x, axis=-1, keepdims=True)
out = {"top_p": apply_top_p(lp, 0.9), "min_p": apply_min_p(lp, 0.1), "top_k": apply_top_k(lp, 4),
       "all": apply_top_k(apply_min_p(apply_top_p(lp, 0.9), 0.05), 3)}
print(json.dumps({k: np.isfinite(np.array(v)).tolist() for k, v in out.items()}))
"""


@needs_engine
def test_the_rules_mask_what_mlx_lms_own_filters_mask(tmp_path):
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.normal(0, 4, (6, 256)), rng.normal(0, 0.5, (2, 256))]).astype(np.float32)
    np.save(tmp_path / "logits.npy", logits)
    out = subprocess.run([str(mlx_python()), "-c", MASKS, str(tmp_path / "logits.npy")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout)
    configs = {"top_p": C(top_p=0.9), "min_p": C(min_p=0.1), "top_k": C(top_k=4),
               "all": C(top_p=0.9, min_p=0.05, top_k=3)}
    for name, config in configs.items():
        assert ((mlx_rules(logits, config) > 0) == np.array(theirs[name])).all(), name


@needs_engine
def test_without_a_draft_model_the_server_samples_the_target_law(plain, models):
    client = plain.client()
    v = client.check([sampled(1500)])[sampled(0).name]
    assert v.ok and v.n == 1500 and v.detectable_tv < 0.13, str(v)
    seeded = client.check([sampled(600, seed=1000)])[sampled(0).name]  # served one by one: fewer samples
    assert seeded.ok and seeded.detectable_tv < 0.23, str(seeded)
    assert client.complete(sampled(20, seed=5)) == client.complete(sampled(20, seed=5))  # mx.random.seed per request
    for prompt in GREEDY_PROMPTS:
        assert set(_greedy(plain, prompt)) == {_argmax_chain(models["target"], prompt, 3)}, prompt


@needs_engine
def test_with_the_draft_model_the_prompt_cache_moves_the_law(drafted, models):
    """FINDING (mlx-lm 0.32.2, ``--draft-model``): a request that ends on the target's own token leaves
    the target's KV cache one token short of the key the server stores it under
    (``speculative_generate_step`` in ``mlx_lm/generate.py``; ``ResponseGenerator._serve_single`` in
    ``mlx_lm/server.py``), and ``LRUPromptCache.fetch_nearest_cache`` hands it, trimmed, to the next
    request with the same prompt: the target then conditions on the prompt less its second-to-last token
    (and the error compounds).  Seen through the server: a repeated greedy request leaves the argmax
    chain after its first answer; a sampled request's law departs grossly."""
    for prompt in GREEDY_PROMPTS:
        chain = _argmax_chain(models["target"], prompt, 3)
        got = _greedy(drafted, prompt)
        assert got[0] == chain, (prompt, got)  # a fresh prompt: the target's context is right
        if prompt == REPEATED:
            assert all(g != chain for g in got[1:]), (prompt, got)  # from the cache: it is not
    v = drafted.client().check([sampled(300)])[sampled(0).name]
    assert not v.ok and v.p_value < 1e-20 and v.tv > 0.5, str(v)


@needs_engine
def test_with_the_draft_model_and_no_prompt_cache_the_server_samples_the_target_law(drafted_uncached, models):
    """mlx-lm's verification (accept while the draft's token equals the target's own sample at that
    position; else emit the target's sample) is exact: with ``--prompt-cache-size 0`` the same request
    follows the target law and greedy requests are the argmax chain, repeats included."""
    for prompt in GREEDY_PROMPTS:
        assert set(_greedy(drafted_uncached, prompt)) == {_argmax_chain(models["target"], prompt, 3)}, prompt
    v = drafted_uncached.client().check([sampled(1000)])[sampled(0).name]
    assert v.ok and v.n == 1000 and v.detectable_tv < 0.16, str(v)
