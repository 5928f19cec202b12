"""Hugging Face ``generate`` with an assistant, end to end under the decoder-level oracle (SPEC §4, §6).

``target.generate(input_ids, assistant_model=draft, do_sample=True, ...)`` is
assisted generation as most people run it: the draft proposes
``num_assistant_tokens`` tokens, the target scores them in one call, and
``_speculative_sampling`` (Leviathan et al. 2022, Algorithm 1; :mod:`specref.adapters.hf`)
accepts them or draws the residual.  :class:`HFGenerate` puts the whole loop --
HF's own logits processors, its cache cropping, EOS inside a block,
``max_new_tokens`` reached mid-block -- behind specref's decoder protocol, on the
case's models as real ``PreTrainedModel`` s (:mod:`specref.adapters.hf_models`)::

    from specref.adapters.hf_generate import HFGenerate, hf_cases
    from specref.verification.oracle import check_decoder
    print(check_decoder(HFGenerate(), cases=hf_cases(), mode="statistical"))

The ground truth is the exact law of plain target sampling *with the same
processors*: :func:`hf_rules` applies transformers' ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` in the order
``generate`` builds them (temperature, top-k, top-p, min-p) to float32 logits, and
:class:`HFGenerate` declares them as its rules (:mod:`specref.verification.cases.rules`).  HF's
top-k keeps exactly k tokens where specref keeps ties, so the two rule sets differ
on tied rows; checking against HF's own is what makes a tie a non-event.  The
control, ``HFGenerate(assisted=False)`` (plain ``generate(do_sample=True)``), must
pass against the same law: it shows that :func:`hf_rules` is what ``generate`` samples.

Greedy cases (temperature 0) run ``do_sample=False``: assisted greedy decoding keeps
the longest prefix of draft tokens that match the target's argmax.

Randomness: ``generate`` draws from torch's global CPU generator; each call seeds it
from the oracle's integer seed inside ``torch.random.fork_rng``
(:func:`specref.adapters.hf_models.torch_seeded`).  Every call runs with one torch
thread (rows of 3 tokens are too small to share; the intra-op pool only adds overhead).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from specref.adapters.hf_models import hf_model, torch_seeded
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig

__all__ = ["hf_rules", "hf_rules_twice", "hf_processors", "HFGenerate", "hf_cases", "assistant_processors"]


def hf_processors(config: SamplingConfig):
    """transformers' warpers for ``config``, in the order ``generate`` appends them (sampling only)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = LogitsProcessorList()
    if config.temperature != 1:
        procs.append(TemperatureLogitsWarper(float(config.temperature)))
    if config.top_k is not None:
        procs.append(TopKLogitsWarper(top_k=int(config.top_k)))
    if config.top_p < 1:
        procs.append(TopPLogitsWarper(top_p=float(config.top_p)))
    if config.min_p > 0:
        from transformers.generation.logits_process import MinPLogitsWarper  # transformers 4.41 on

        procs.append(MinPLogitsWarper(min_p=float(config.min_p)))
    return procs


def hf_rules(logits, config: SamplingConfig, *, passes: int = 1):
    """HF's plain sampler: float32 logits ``[n, V]`` -> probabilities ``[n, V]`` (float64).

    Temperature 0 is ``do_sample=False``: a one-hot on ``torch.argmax`` (the lowest id
    on ties, as specref).  Otherwise :func:`hf_processors` then ``softmax``, in float32
    as ``generate`` computes them.  ``passes=2`` applies the processor list twice, as the
    assistant does in transformers 5.24 (:func:`assistant_processors`; :func:`hf_rules_twice`).
    """
    import torch

    scores = torch.from_numpy(np.asarray(logits, dtype=np.float32))  # [n, V], what the model returns
    if config.greedy:
        out = np.zeros(scores.shape)
        out[np.arange(scores.shape[0]), scores.argmax(dim=-1).numpy()] = 1.0
        return out
    procs = hf_processors(config)
    dummy_ids = torch.zeros((1, 1), dtype=torch.long)  # these warpers do not read the ids
    rows = []
    for i in range(scores.shape[0]):
        row = scores[i: i + 1].clone()  # [1, V]
        for _ in range(passes):
            row = procs(dummy_ids, row)
        rows.append(torch.softmax(row, dim=-1)[0])
    return torch.stack(rows).double().numpy()


def hf_rules_twice(logits, config: SamplingConfig):
    """The assistant's rows in transformers 5.24 assisted generation: every warper applied twice."""
    return hf_rules(logits, config, passes=2)


class HFGenerate:
    """A decoder-level implementation: Hugging Face ``generate`` on the oracle's models.

    ``assisted=True``: ``target.generate(..., assistant_model=draft)`` with a fixed
    ``num_assistant_tokens = k`` (schedule ``"constant"``, confidence threshold off);
    ``assisted=False``: plain ``target.generate`` (the control).  ``rng`` is an integer
    seed (statistical mode).  After each call ``last_target_calls`` holds the number of
    forward calls of the target -- the iterations, for the efficiency verdict
    (:mod:`specref.verification.statistics.efficiency`) -- and ``target_calls`` lists them all.

    It declares ``specref_isolate = False``: under the default ``Settings.isolate`` a statistical
    check runs it in this process, so that ``target_calls`` fills here (in a forked worker the
    records stay in the worker, and the efficiency verdict would read an empty list).  Isolation
    itself works (``isolate=True``; torch runs one thread in the worker) and costs nothing
    measurable: ``hf-temperature`` at N = 600, 2.5-3.4 s in-process and 2.6-2.7 s isolated, three
    runs each, the same verdict and TV.
    """

    specref_rules = staticmethod(hf_rules)  # the ground truth: plain sampling with HF's processors
    specref_isolate = False  # target_calls is read in this process (see above)

    def __init__(self, *, assisted: bool = True):
        self.assisted = assisted
        self.last_target_calls = None
        self.target_calls: list = []  # per call, in this process: iterations, for the efficiency verdict
        self._models: dict = {}
        self.__name__ = "hf_assisted_generate" if assisted else "hf_generate"

    def __call__(self, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng):
        return torch_seeded(self._generate)(target, draft, prompt, k=k, config=config,
                                            max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, rng=rng)

    def _generate(self, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        import torch

        if max_new_tokens == 0:
            return []
        settings = dict(config=config, stop_tokens=tuple(stop_tokens), max_new_tokens=max_new_tokens, k=k)
        t = self._model(target, settings)
        kwargs = {}
        if self.assisted:
            kwargs["assistant_model"] = self._model(draft, settings)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # [1, n, 3] tensors: the intra-op pool only adds overhead
        try:
            with torch.no_grad():
                out = t.generate(torch.tensor([list(prompt)]), **kwargs)  # settings: t.generation_config
        finally:
            torch.set_num_threads(threads)
        self.last_target_calls = len(t.calls)
        self.target_calls.append(len(t.calls))
        return out[0, len(prompt):].tolist()

    def __getstate__(self):  # to a shard's worker process: the settings travel, the built models do not
        return {"assisted": self.assisted, "last_target_calls": None, "target_calls": [], "_models": {},
                "__name__": self.__name__}

    def _model(self, model, settings):
        """One HF model per (table, settings), built once: the oracle hands fresh copies every call."""
        table = getattr(model, "table", None)
        if table is None:
            return hf_model(model, **settings)
        key = (type(model).__name__, table.dtype.str, table.shape, table.tobytes(), repr(sorted(settings.items())))
        if key not in self._models:
            self._models[key] = hf_model(model, **settings)
        hf = self._models[key]
        hf.calls.clear()
        return hf

    def __repr__(self):
        return f"HFGenerate(assisted={self.assisted})"


def assistant_processors(config: SamplingConfig, *, k: int = 2, vocab_size: int = 3):
    """The logits processors the assistant applies inside assisted ``generate``, by class name.

    Runs one assisted ``generate`` on table models and records the processor list the
    assistant's own ``generate`` call builds (``_get_logits_processor``).  In transformers
    5.24 each warper appears twice: the target's prepared list (warpers included) is
    handed to the assistant as ``logits_processor`` and merged in *before* the
    assistant's ``generate`` appends its own warpers for ``do_sample``.
    """
    import torch
    from transformers import GenerationMixin

    from specref.verification.cases.tables import LogitTable

    rng = np.random.default_rng(0)
    t = hf_model(LogitTable(rng.normal(size=(vocab_size, vocab_size))), config=config, max_new_tokens=k + 1, k=k)
    d = hf_model(LogitTable(rng.normal(size=(vocab_size, vocab_size))), config=config, max_new_tokens=k + 1, k=k)
    seen = []
    original = GenerationMixin._get_logits_processor

    def spy(self, *args, **kwargs):
        procs = original(self, *args, **kwargs)
        seen.append((self is d, [type(p).__name__ for p in procs]))
        return procs

    cast(Any, GenerationMixin)._get_logits_processor = spy  # a spy for this one generate call
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.default_generator.manual_seed(0)
            t.generate(torch.tensor([[0]]), assistant_model=d)
    finally:
        cast(Any, GenerationMixin)._get_logits_processor = original
    for is_draft, names in seen:
        if is_draft:
            return names
    raise SpecrefError("the assistant never built a processor list")


def hf_cases():
    """Decoder cases for ``generate``: temperature, top-k, top-p, min-p, EOS inside a block,
    ``max_new_tokens`` reached mid-block (K = 3, 4 new tokens), greedy.  V = 3, logits tables."""
    from specref.verification.cases.chain import Case

    rng = np.random.default_rng(20261201)

    def pair(shape=(3, 3)):
        return rng.normal(0, 1.2, shape), rng.normal(0, 1.2, shape)

    t, d = pair()
    cases = [
        Case("hf-temperature", *pair(), config=SamplingConfig(temperature=0.7), tables="logits"),
        Case("hf-top-k", *pair(), config=SamplingConfig(top_k=2), tables="logits"),
        Case("hf-top-p", *pair(), config=SamplingConfig(temperature=0.9, top_p=0.8), tables="logits"),
        Case("hf-min-p", *pair(), config=SamplingConfig(min_p=0.3), tables="logits"),
        Case("hf-eos-mid-block", t, d, stop_tokens=(2,), max_new_tokens=4, k=3, tables="logits"),
        Case("hf-max-new-mid-block", t, d, k=3, max_new_tokens=4, tables="logits"),
        Case("hf-greedy", *pair(), config=SamplingConfig(temperature=0), tables="logits"),
    ]
    return cases
