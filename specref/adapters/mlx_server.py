"""mlx-lm's OpenAI-compatible server (Linux CPU), with and without its draft model, under specref's statistical oracle.

:class:`MLXServer` starts ``python -m mlx_lm server`` (mlx-lm 0.32.2 on ``mlx[cpu]`` 0.32.4, in the
environment ``scripts/make_mlx_env.py`` makes) on 127.0.0.1 at a free port, on a local model
directory (for instance the tiny Llama target of :func:`specref.adapters.vllm_e2e.build_models`,
which mlx-lm loads as it is: ``model_type`` llama, vocabulary 256, hidden size 128, head size 32;
its logits agree with transformers' to about 1e-5), optionally with ``--draft-model`` and
``--num-draft-tokens``.  It waits for ``GET /health`` and then for one greedy completion of one
token (the model is loaded by the server's generation thread after ``/health`` already answers;
a model that fails to load turns ``/health`` into 503 while the process lives on), and it stops
the server and everything it started on :meth:`MLXServer.close`, on leaving a ``with`` block and
at interpreter exit.  Nothing comes from a hub (``HF_HUB_OFFLINE=1``).

:class:`MLXClient` is an :class:`~specref.adapters.openai_server.OpenAIServer` fitted to what
mlx-lm 0.32.2's ``POST /v1/completions`` (``mlx_lm/server.py``, ``APIHandler``) really does:

- the prompt must be text (``tokenizer.encode(prompt)``; a list of ids is refused with the
  tokenizer's ``text input must be of type `str` ...``): the ids go as their words (``t7 t8``
  for the word-level tokenizer of ``build_models``, which encodes them back exactly; the
  answer's ``usage.prompt_tokens`` is checked against the prompt's length);
- no token ids in the answer, but ``logprobs: true`` gives ``choices[0].logprobs.content`` as
  ``[{"id": token id, "logprob": ...}]`` for every generated token: the ids are read from there,
  exactly (no decoding of text);
- ``n`` is ignored (one choice always): ``n`` samples go as ``n`` requests of one, concurrently;
- ``seed`` re-seeds MLX's global generator (``mx.random.seed``) before the request: the same seed
  gives the same sample, so sample ``i`` of a seeded request goes with ``seed + i``; a seeded
  request is served alone, not batched;
- ``temperature`` (0 exactly is greedy), ``top_p``, ``top_k`` (0: off) and ``min_p`` are honoured,
  through ``mlx_lm.sample_utils.make_sampler``, whose order differs from vLLM's (:func:`mlx_rules`);
- stop tokens are not ids but text (``stop``): requests with ``stop_tokens`` are refused here;
- an error answers ``{"error": "<message>"}`` (HTTP 400, or 404 when generation raised).

The law of a request is :func:`mlx_law`: the target's own rows (:func:`~specref.adapters.vllm_e2e.target_rows`,
transformers, no cache) through :func:`mlx_rules`, enumerated by specref's ``target_law``.

FINDING (mlx-lm 0.32.2, ``--draft-model``): the server's prompt cache hands a later request a
target KV cache one token short of its key.  ``speculative_generate_step`` (``mlx_lm/generate.py``)
does not feed the last emitted token to the target when that token is the target's own (a
correction or the bonus token, ``from_draft`` False): its ``finally: _rewind_cache(...)`` leaves
the target cache at prompt + generated - 1 tokens, while ``ResponseGenerator._serve_single``
(``mlx_lm/server.py``) stores it in ``LRUPromptCache`` under the key prompt + generated.  The next
request with the same prompt gets it from ``LRUPromptCache.fetch_nearest_cache``
(``mlx_lm/models/cache.py``), trimmed to ``len(prompt) - 1`` by the key's length, so one token
short: the second-to-last prompt token is missing from the target's context, and the errors
compound from request to request.  Greedy requests then differ from the argmax chain from the
second request on, and sampled requests depart grossly from the target law.  Without the draft
model the cache's length matches its key (``generate_step`` runs one token ahead), and with
``--prompt-cache-size 0`` (no reuse) the speculative server follows the law: mlx-lm's
verification itself (accept while the draft's token equals the target's own sample at that
position, else emit the target's sample) is exact.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from specref.adapters.openai_server import OpenAIServer, ServerProcess, free_port
from specref.adapters.vllm_e2e import VLLMRequest, Verdict, environment_python, judge, target_rows
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig

__all__ = ["MLX_VERSION", "MLX_LM_VERSION", "MAKE_SCRIPT", "VENV_VARIABLE", "MODEL_NAME", "mlx_venv", "mlx_python",
           "mlx_rules", "mlx_law", "MLXClient", "MLXServer"]

MLX_VERSION = "0.32.4"
MLX_LM_VERSION = "0.32.2"
MAKE_SCRIPT = "scripts/make_mlx_env.py"
VENV_VARIABLE = "SPECREF_MLX_VENV"
MODEL_NAME = "default_model"  # the server's name for its --model (another name would make it load that path)


def mlx_venv() -> Path:
    """Where ``scripts/make_mlx_env.py`` puts the environment: ``$SPECREF_MLX_VENV``, else
    ``~/.cache/specref/venvs/mlx-lm-0.32.2``."""
    return Path(os.environ.get(VENV_VARIABLE) or Path.home() / ".cache" / "specref" / "venvs"
                / f"mlx-lm-{MLX_LM_VERSION}").expanduser()


def mlx_python(venv=None) -> Path:
    """The environment's interpreter; a ``SpecrefError`` naming the script when it is not made (or broken)."""
    return environment_python(Path(venv).expanduser() if venv is not None else mlx_venv(), "mlx-lm", MAKE_SCRIPT,
                              VENV_VARIABLE)


# ---------------------------------------------------------------- mlx-lm's sampler, written out


def mlx_rules(logits, config: SamplingConfig):
    """mlx-lm 0.32.2's sampler: logits ``[n, V]`` -> probabilities ``[n, V]`` (float64 of float32 values).

    As read in ``mlx_lm/sample_utils.py`` (``make_sampler``) and ``mlx_lm/generate.py``: the
    log-probabilities ``logits - logsumexp(logits)`` at temperature 1; temperature 0 exactly is
    greedy (``argmax``); else top-p (``apply_top_p``: sorted ascending, a token is dropped when
    the mass of the tokens above it is ``>= top_p``; ties with the threshold kept), then min-p
    (``apply_min_p``: dropped when ``logprob < max + log(min_p)``), then top-k (``apply_top_k``:
    exactly ``k`` kept), all before the temperature, then ``categorical(logprobs / T)``.  vLLM
    divides by the temperature first, so top-p and min-p mean other sets there.
    """
    x = np.asarray(logits, dtype=np.float32)
    x = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
    if config.temperature == 0:
        return np.eye(x.shape[-1])[x.argmax(-1)]
    x = x.copy()
    if 0 < config.top_p < 1:
        ascending = np.sort(x, -1)
        probs = np.exp(ascending)
        above = np.cumsum(probs[:, ::-1], -1)[:, ::-1] - probs  # mass strictly above each entry
        dropped = (above >= np.float32(config.top_p) * (above[:, :1] + probs[:, :1])).sum(-1)
        threshold = np.take_along_axis(ascending, dropped[:, None], -1)
        x[x < threshold] = -np.inf
    if config.min_p > 0:
        x[x < x.max(-1, keepdims=True) + np.float32(math.log(config.min_p))] = -np.inf
    if config.top_k is not None and 0 < config.top_k < x.shape[-1]:
        order = np.argsort(-x, -1, kind="stable")[:, int(config.top_k):]
        np.put_along_axis(x, order, -np.inf, -1)
    y = x.astype(np.float64) / float(config.temperature)
    y = np.exp(y - y.max(-1, keepdims=True))
    return y / y.sum(-1, keepdims=True)


_LAWS: dict = {}


def mlx_law(model_dir, request: VLLMRequest) -> dict:
    """The law of one sample of ``request`` from the target at ``model_dir`` under :func:`mlx_rules`:
    ``{token tuple: probability}`` (kept per model, prompt, settings and length)."""
    from specref.verification.cases.rules import RuledModel
    from specref.verification.laws.enumeration import target_law

    if request.stop_tokens:
        raise SpecrefError("mlx-lm's server stops on text, not on token ids: no stop_tokens here")
    key = (str(Path(model_dir).resolve()), tuple(request.prompt), request.config, request.max_tokens)
    if key not in _LAWS:
        rows = target_rows(model_dir)
        V = rows.vocab_size
        if not request.prompt or min(request.prompt) < 0 or max(request.prompt) >= V:
            raise SpecrefError(f"prompt must be token ids in 0..{V - 1}, got {list(request.prompt)}")
        law = target_law(RuledModel(rows, mlx_rules, request.config), list(request.prompt), SamplingConfig(),
                         request.max_tokens, max_paths=1 + V + V * V)
        _LAWS[key] = {tuple(k): float(v) for k, v in law.items()}
    return _LAWS[key]


# ---------------------------------------------------------------- the client


def words(tokens) -> str:
    """The prompt text of ``build_models``' word-level tokenizer: ids ``[7, 8]`` -> ``"t7 t8"``."""
    return " ".join(f"t{int(t)}" for t in tokens)


class MLXClient(OpenAIServer):
    """:class:`~specref.adapters.openai_server.OpenAIServer` as mlx-lm's server wants it: a text prompt
    (``prompt_text``, default :func:`words`), one sample per request, the ids from ``logprobs``."""

    def __init__(self, base_url: str, target_dir, *, model: str = MODEL_NAME, prompt_text=words,
                 concurrency: int = 4, **kwargs):
        super().__init__(base_url, model, target_dir, concurrency=concurrency, **kwargs)
        self.prompt_text = prompt_text

    def body(self, request: VLLMRequest, n: int = 1, *, index: int = 0) -> dict:
        """The completions request for sample ``index`` of ``request`` (mlx-lm answers one sample per request)."""
        if n != 1:
            raise SpecrefError(f"mlx-lm's server answers one sample per request (it ignores n), asked for {n}")
        if request.stop_tokens:
            raise SpecrefError(f"{request.name or request.prompt!r}: mlx-lm's server stops on text (stop), "
                               f"not on token ids; stop_tokens are not supported here")
        c = request.config
        body: dict = dict(model=self.model, prompt=self.prompt_text(request.prompt), max_tokens=int(request.max_tokens),
                          temperature=float(c.temperature), top_p=float(c.top_p), logprobs=True)
        if c.top_k is not None and c.top_k < self.vocab:  # mlx-lm refuses top_k >= V; it is off there anyway
            body["top_k"] = int(c.top_k)
        if c.min_p > 0:
            body["min_p"] = float(c.min_p)
        if request.seed is not None:  # mx.random.seed(seed) per request: sample i gets seed + i
            body["seed"] = int(request.seed) + int(index)
        return body

    def _sample(self, request: VLLMRequest, index: int) -> tuple:
        answer = self._post("/v1/completions", self.body(request, 1, index=index))
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise SpecrefError(f"the server at {self.base_url} answered {request.name or request.prompt!r} with "
                               f"{len(choices) if isinstance(choices, list) else 'no'} choices, not 1")
        usage = answer.get("usage") or {}
        if usage.get("prompt_tokens") != len(request.prompt):
            raise SpecrefError(f"the server at {self.base_url} read the prompt {self.prompt_text(request.prompt)!r} as "
                               f"{usage.get('prompt_tokens')} tokens, not {len(request.prompt)}: its tokenizer is "
                               f"not the word-level one of build_models (give prompt_text=)")
        content = (choices[0].get("logprobs") or {}).get("content")
        ids = [e.get("id") for e in content] if isinstance(content, list) and \
            all(isinstance(e, dict) for e in content) else None
        return self._tokens({"token_ids": ids, "text": choices[0].get("text")}, request)

    def complete(self, request: VLLMRequest) -> list:
        """``request.n`` samples, each a tuple of token ids: ``n`` requests of one sample, concurrently."""
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, request.n))) as pool:
            return list(pool.map(lambda i: self._sample(request, i), range(request.n)))

    def check(self, requests, *, alpha: float = 1e-3) -> dict:
        """``{request name: Verdict}`` for the sampled requests, against :func:`mlx_law`; greedy requests
        (temperature 0) give their outputs instead (``{name: [tokens, ...]}``)."""
        out: dict[str, Verdict | list] = {}
        for r in requests:
            samples = self.complete(r)
            if r.config.temperature == 0:
                out[r.name] = samples
            else:
                out[r.name] = judge(samples, mlx_law(self.target_dir, r), alpha=alpha, name=r.name)
        return out

    def metrics(self) -> dict:
        """mlx-lm's server has no ``/metrics``: {}."""
        return {}


# ---------------------------------------------------------------- the server


class MLXServer(ServerProcess):
    """mlx-lm's OpenAI-compatible server on 127.0.0.1, in the mlx-lm environment, for one model (and draft)."""

    def __init__(self, model_dir, *, draft_model_dir=None, num_draft_tokens: int = 2, venv=None,
                 start_timeout: float = 120.0, extra_args=()):
        self.python = mlx_python(venv)
        self.model = str(model_dir)
        self.draft_model = None if draft_model_dir is None else str(draft_model_dir)
        self.num_draft_tokens = int(num_draft_tokens)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = ["--model", self.model, "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
        if self.draft_model is not None:
            args += ["--draft-model", self.draft_model, "--num-draft-tokens", str(self.num_draft_tokens)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   DO_NOT_TRACK="1")
        env.pop("PYTHONPATH", None)
        self._start([self.python, "-u", "-m", "mlx_lm", "server", *args], env, "specref-mlx-server-")
        self.start_seconds = self._wait(float(start_timeout))

    def _fail(self, why: str):
        tail = self._log_tail()
        self.close()
        raise SpecrefError(f"mlx-lm's server {why}; the log's tail:\n{tail}")

    def _wait(self, timeout: float) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.process.poll() is not None:
                self._fail(f"exited with status {self.process.returncode} while starting")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except urllib.error.HTTPError as e:  # 503: its generation thread died (the model did not load)
                self._fail(f"answered /health with HTTP {e.code} (its generation thread is dead)")
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        else:
            self._fail(f"did not answer /health within {timeout:.0f} s")
        # the model loads in the generation thread: one greedy token says it is loaded (and warm)
        body = json.dumps(dict(model=MODEL_NAME, prompt="t0", max_tokens=1, temperature=0.0)).encode()
        request = urllib.request.Request(self.base_url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=max(5.0, timeout - (time.perf_counter() - start))) as r:
                json.loads(r.read())
        except urllib.error.HTTPError as e:
            self._fail(f"refused a first completion with HTTP {e.code}: {e.read().decode(errors='replace')[:500]}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            self._fail(f"did not complete a first request: {e}")
        return time.perf_counter() - start

    def client(self, target_dir=None, **kwargs) -> MLXClient:
        """An :class:`MLXClient` on this server (the target's weights: ``target_dir``, default the served model)."""
        return MLXClient(self.base_url, target_dir or self.model, **kwargs)
