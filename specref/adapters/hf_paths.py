"""Hugging Face ``generate``'s other speculative paths under the decoder-level oracle (SPEC §4, §6, §15).

transformers 5.24 picks a candidate generator in ``GenerationMixin._get_candidate_generator``
(``generation/utils.py``); :mod:`specref.adapters.hf_generate` checks the default one,
``AssistedCandidateGenerator``.  This module puts the others that run on a CPU with table
models behind specref's decoder protocol, each as a class in the mould of
:class:`~specref.adapters.hf_generate.HFGenerate` (same seeding, one torch thread, the same
ground truth: plain sampling with HF's processors, :func:`~specref.adapters.hf_generate.hf_rules`):

- :class:`HFPromptLookup` -- ``prompt_lookup_num_tokens=K``: ``PromptLookupCandidateGenerator``
  drafts the continuation of the last n-gram's earlier occurrence in the prompt and output; no
  draft probabilities, so ``generate`` samples every position from ``p`` and keeps candidates
  while they match (its "Case 2").  The case's draft is not used.
- :class:`HFEarlyExit` -- ``assistant_early_exit=1``: ``EarlyExitCandidateGenerator`` drafts
  with the target itself, ``config.num_hidden_layers`` lowered to 1 while it drafts.
  :func:`early_exit_model` is a two-"layer" table model whose forward reads that setting: the
  case's draft table at one layer, its target table at two.
- :class:`HFUniversal` -- ``tokenizer=``, ``assistant_tokenizer=``: a draft of another
  vocabulary.  ``do_sample=True`` selects ``UniversalSpeculativeDecodingGenerator`` (TLI, Timor
  et al. ICML 2025 §4: the assistant's LM head pruned to the shared tokens, its logits mapped to
  the target's ids, then ``_speculative_sampling``); ``do_sample=False``
  ``AssistedCandidateGeneratorDifferentTokenizers`` (SLEM-style greedy matching through text).
  The draft model and the two tokenizers are bound; the case's draft table is not used.
  :func:`embedded_model` gives the assistant an ``nn.Embedding`` and an ``nn.Linear`` LM head
  (identity matrices around the table's rows), which the pruning replaces.
- :class:`HFEnsemble` -- ``assistant_ensemble_weight=w`` on the default path: HF's static
  ensemble verification, documented as not lossless; the oracle must flag it.
  :func:`ensemble_step` is the same rule as a step for specref's loop, so its exact law (and TV)
  is :func:`ensemble_law`.

Paths that need a real architecture's hidden states, not table rows (transformers 5.24's MTP,
DFlash and Gemma 4 assistant generators), are subclasses of :class:`HFArchitecturePath`, which
binds its own target (and assistant), built with random weights in ``torch.random.fork_rng``;
:meth:`HFArchitecturePath.case` turns the target into the oracle's case, a logit table of the
target's own rows after every reachable prefix (:func:`model_table`, recomputed without a cache),
so the ground truth is plain sampling from that very model.  These generators skip drafting on
the first target call (``is_first_iteration``), and their draft rows come from the target's
hidden states (some also from where the round began: the assistant's own hidden state; one
forward for the whole block), so the chain reference's call count is not theirs:
:meth:`HFArchitecturePath.reference_calls` is Algorithm 1 with the path's own rows as
:func:`observed_drafts` reads them, the first call drafting nothing.  A configuration
transformers refuses and a case whose target is not the path's model raise ``SpecrefError``,
status ``raised`` under the oracle.  The tiny random-weight experiments built on it (MTP on
Mellum, DFlash on Llama, Gemma 4's assistant; V = 3, hidden size 16) and the same-vocabulary
cases the paths are run on live with the benchmark that runs them, ``benchmarks/hf_experiments.py``.

torch and transformers are imported inside the functions, as in :mod:`specref.adapters.hf_models`.
"""

from __future__ import annotations

import contextlib
import functools

from typing import Any, cast

import numpy as np

from specref.adapters.hf_generate import hf_rules
from specref.adapters.hf_models import hf_model, torch_seeded
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.verification.cases.models import logits_fn

__all__ = ["HFPath", "HFPromptLookup", "HFEarlyExit", "HFUniversal", "HFEnsemble", "HFArchitecturePath",
           "model_table", "prefix_logits", "early_exit_model",
           "embedded_model", "hf_tokenizer", "target_logit_columns", "repaired_translator", "seeded_vocab_order",
           "ensemble_step",
           "ensemble_law", "observed_drafts", "NEG_LOGIT", "DRAFT_ROW_TOL"]

NEG_LOGIT = -1e4  # a -inf logit as the embedded model's hidden state: exp underflows to 0 in float32


def _hf():
    import torch
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.generation import GenerationMixin
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return torch, PretrainedConfig, PreTrainedModel, GenerationMixin, CausalLMOutputWithPast


def _output(logits, cache):
    CausalLMOutputWithPast = _hf()[4]
    field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    out = CausalLMOutputWithPast(logits=logits)
    if cache is not None:
        out[field] = cache
    return out


def _input_ids(input_ids, V):
    torch = _hf()[0]
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.ndim != 2 or input_ids.shape[1] == 0 or input_ids.dtype.is_floating_point \
            or input_ids.min() < 0 or input_ids.max() >= V:
        raise SpecrefError(f"input_ids must be token ids in 0..{V - 1} of shape [B, n], got {input_ids.tolist()}")
    return input_ids.long()


def _context_rows(fn, cache, ids, use_cache):
    """``(logits [B, n, V] float32 for the new tokens, contexts, cache)``: row ``j`` from the cached
    token ids followed by ``ids[:, :j + 1]``.  The cache (a transformers ``Cache``, started here for
    ``use_cache``) holds the token ids as keys ``[B, 1, L, 1]`` and is updated in place."""
    torch = _hf()[0]
    if cache is None and use_cache:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
    n = ids.shape[1]
    if cache is None:
        cached = [[] for _ in range(ids.shape[0])]
    else:
        new = ids.to(torch.float32)[:, None, :, None]
        keys, _ = cache.update(new, new.clone(), 0)
        cached = [[int(t) for t in row] for row in keys[:, 0, : keys.shape[2] - n, 0].round().long().tolist()]
    contexts = [cached[b] + ids[b].tolist() for b in range(ids.shape[0])]
    rows = np.stack([fn(context)[-n:] for context in contexts]).astype(np.float32)
    return torch.from_numpy(rows), contexts, cache


# ---------------------------------------------------------------- models


@functools.cache
def _layers_config():
    PretrainedConfig = _hf()[1]

    class SpecrefLayersConfig(PretrainedConfig):
        model_type = "specref-table-layers"

        def __init__(self, vocab_size=2, num_hidden_layers=1, **kwargs):
            super().__init__(**kwargs)
            self.vocab_size, self.num_hidden_layers = vocab_size, num_hidden_layers

    return SpecrefLayersConfig


@functools.cache
def _early_exit_class():
    torch, _, PreTrainedModel, GenerationMixin, _ = _hf()
    SpecrefLayersConfig = _layers_config()

    class _Stack(torch.nn.Module):  # the "base model" early exit reads num_hidden_layers from
        def __init__(self, config):
            super().__init__()
            self.config = config

    class EarlyExitTableModel(PreTrainedModel, GenerationMixin):
        """Table rows by depth: the draft's at fewer than ``config.num_hidden_layers`` layers."""

        config_class = SpecrefLayersConfig
        base_model_prefix = "model"
        main_input_name = "input_ids"
        _supports_cache_class = True

        def __init__(self, config, target=None, draft=None):
            super().__init__(config)
            self.model = _Stack(config)
            self.full_layers = config.num_hidden_layers
            self.target_rows, self.draft_rows = logits_fn(target), logits_fn(draft)
            self.calls = []  # (context, new tokens, layers) per forward call
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

        def forward(self, input_ids=None, past_key_values=None, attention_mask=None, use_cache=None, **kwargs):
            input_ids = _input_ids(input_ids, self.config.vocab_size)
            layers = self.model.config.num_hidden_layers
            rows = self.target_rows if layers >= self.full_layers else self.draft_rows
            logits, contexts, cache = _context_rows(rows, kwargs.get("cache", past_key_values), input_ids, use_cache)
            self.calls.append((contexts[0], input_ids.shape[1], layers))
            return _output(logits, cache)

    return EarlyExitTableModel


@functools.cache
def _embedded_class():
    torch, _, PreTrainedModel, GenerationMixin, _ = _hf()
    SpecrefLayersConfig = _layers_config()

    class EmbeddedTableModel(PreTrainedModel, GenerationMixin):
        """Table rows behind an identity ``nn.Embedding`` and an identity ``nn.Linear`` LM head.

        The forward reads the token ids back from the embeddings (one-hot rows), so a wrapped
        embedding (``_MapInputEmbedding``) decides which tokens the model sees; the table's logits
        are the hidden state (``-inf`` as :data:`NEG_LOGIT`) and the head (pruned or not) maps them.
        """

        config_class = SpecrefLayersConfig
        main_input_name = "input_ids"
        _supports_cache_class = True

        def __init__(self, config, model=None):
            super().__init__(config)
            V = config.vocab_size
            self.rows = logits_fn(model)
            self.embed_tokens = torch.nn.Embedding(V, V)
            self.lm_head = torch.nn.Linear(V, V, bias=False)
            with torch.no_grad():
                self.embed_tokens.weight.copy_(torch.eye(V))
                self.lm_head.weight.copy_(torch.eye(V))
            self.calls = []  # (context it saw, new tokens) per forward call

        def get_input_embeddings(self):
            return self.embed_tokens

        def set_input_embeddings(self, value):
            self.embed_tokens = value

        def get_output_embeddings(self):
            return self.lm_head

        def set_output_embeddings(self, value):
            self.lm_head = value

        def forward(self, input_ids=None, past_key_values=None, attention_mask=None, use_cache=None,
                    inputs_embeds=None, **kwargs):
            if inputs_embeds is None:
                inputs_embeds = self.get_input_embeddings()(_input_ids(input_ids, self.config.vocab_size))
            ids = inputs_embeds.argmax(dim=-1)  # [B, n]: the tokens the embedding layer handed over
            logits, contexts, cache = _context_rows(self.rows, kwargs.get("cache", past_key_values), ids, use_cache)
            self.calls.append((contexts[0], ids.shape[1]))
            hidden = torch.nan_to_num(logits, neginf=NEG_LOGIT)
            return _output(self.get_output_embeddings()(hidden), cache)

    return EmbeddedTableModel


def _generation_config(model, settings):
    from specref.adapters.hf_models import generation_config

    model.generation_config = generation_config(settings["config"], stop_tokens=settings["stop_tokens"],
                                                max_new_tokens=settings["max_new_tokens"], k=settings["k"])
    model.eval()
    return model


def _special(stop_tokens):
    stops = [int(t) for t in stop_tokens]
    eos = None if not stops else stops[0] if len(stops) == 1 else stops
    return dict(pad_token_id=stops[0] if stops else 0, eos_token_id=eos)


def early_exit_model(target, draft, *, layers: int = 2, config: SamplingConfig = SamplingConfig(), stop_tokens=(),
                     max_new_tokens=None, k=None):
    """A ``PreTrainedModel`` that is ``target`` at ``layers`` hidden layers and ``draft`` below them
    (same vocabulary), for ``assistant_early_exit``."""
    config_class, model_class = _layers_config(), _early_exit_class()
    V = logits_fn(target).vocab_size
    if logits_fn(draft).vocab_size != V:
        raise SpecrefError(f"early exit drafts with the target itself: the draft's V must be the target's ({V})")
    model = model_class(config_class(vocab_size=V, num_hidden_layers=layers, **_special(stop_tokens)), target, draft)
    return _generation_config(model, dict(config=config, stop_tokens=stop_tokens, max_new_tokens=max_new_tokens, k=k))


def embedded_model(model, *, config: SamplingConfig = SamplingConfig(), stop_tokens=(), max_new_tokens=None, k=None):
    """Any specref model as a ``PreTrainedModel`` with input embeddings and an LM head (an assistant
    whose head ``UniversalSpeculativeDecodingGenerator`` can prune)."""
    config_class, model_class = _layers_config(), _embedded_class()
    V = logits_fn(model).vocab_size
    hf = model_class(config_class(vocab_size=V, **_special(stop_tokens)), model)
    return _generation_config(hf, dict(config=config, stop_tokens=stop_tokens, max_new_tokens=max_new_tokens, k=k))


def hf_tokenizer(tokenizer):
    """A tokenizer with a ``tokenizers.Tokenizer`` at ``.tokenizer`` (``toy_models.tokenizers.ToyTokenizer``)
    as a ``transformers.PreTrainedTokenizerFast``, which ``generate(tokenizer=...)`` takes."""
    from transformers import PreTrainedTokenizerFast

    inner = getattr(tokenizer, "tokenizer", tokenizer)
    if not hasattr(inner, "encode") or not hasattr(inner, "get_vocab"):
        raise SpecrefError(f"hf_tokenizer needs a tokenizers.Tokenizer (or an object holding one at .tokenizer), "
                           f"got {type(tokenizer).__name__}")
    return PreTrainedTokenizerFast(tokenizer_object=inner, clean_up_tokenization_spaces=False)


# ---------------------------------------------------------------- the implementations


class HFPath:
    """A decoder-level implementation: ``target.generate(prompt, **kwargs)`` on one of HF's paths.

    Subclasses say what to build (:meth:`prepare`).  ``rng`` is an integer seed (statistical mode),
    handed to torch's global generator inside ``fork_rng``.  Models are built once per case and
    settings and kept; after each call ``last_target_calls`` holds the target's forward calls.  Like
    :class:`~specref.adapters.hf_generate.HFGenerate` it declares ``specref_isolate = False``: a
    statistical check runs it in this process, so that ``target_calls`` fills here.
    """

    specref_rules = staticmethod(hf_rules)  # the ground truth: plain sampling with HF's processors
    specref_isolate = False  # target_calls is read in this process, for the efficiency verdict

    def __init__(self):
        self._built = {}
        self.last_target_calls = None
        self.target_calls = []
        self.__name__ = type(self).__name__

    def __call__(self, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng):
        return torch_seeded(self._generate)(target, draft, prompt, k=k, config=config,
                                            max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, rng=rng)

    def prepare(self, target, draft, settings) -> tuple:
        """``(hf target, generate kwargs, count(hf target) -> target calls)`` for one case and its settings."""
        raise NotImplementedError

    def reference_calls(self, case) -> dict:
        """The exact law of the target calls of this path's reference on ``case``, ``{calls: probability}``,
        for :func:`~specref.verification.statistics.efficiency.efficiency`'s ``reference=``: here
        Algorithm 1 with the case's draft, K every round, under HF's rules."""
        from specref.verification.statistics.efficiency import reference_iterations

        return reference_iterations(case, rules=hf_rules)

    def _generate(self, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        import torch

        if max_new_tokens == 0:
            return []
        settings = dict(config=config, stop_tokens=tuple(stop_tokens), max_new_tokens=max_new_tokens, k=k)
        key = (_table_key(target), _table_key(draft), repr(sorted(settings.items())))
        if key not in self._built:
            self._built[key] = self.prepare(target, draft, settings)
        hf_target, kwargs, count = self._built[key]
        for model in {id(m): m for m in [hf_target, *[v for v in kwargs.values() if hasattr(v, "calls")]]}.values():
            model.calls.clear()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                out = hf_target.generate(torch.tensor([list(prompt)]), **kwargs)
        finally:
            torch.set_num_threads(threads)
        self.last_target_calls = count(hf_target)
        self.target_calls.append(self.last_target_calls)
        return out[0, len(prompt):].tolist()

    def __getstate__(self):  # to a shard's worker: the settings travel, the built models do not
        state = dict(self.__dict__)
        state.update(_built={}, last_target_calls=None, target_calls=[])
        if "assistants" in state:
            state["assistants"] = {}
        return state

    def __repr__(self):
        return f"{type(self).__name__}()"


def _table_key(model):
    table = getattr(model, "table", None)
    if table is None:
        return id(model)
    return (type(model).__name__, table.dtype.str, table.shape, table.tobytes())


def _calls(model):
    return len(model.calls)


class HFPromptLookup(HFPath):
    """``generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=n)``; K is the case's unless given."""

    def __init__(self, num_tokens: int | None = None, max_matching_ngram_size: int = 2):
        super().__init__()
        self.num_tokens, self.max_matching_ngram_size = num_tokens, max_matching_ngram_size

    def prepare(self, target, draft, settings):
        kwargs = dict(prompt_lookup_num_tokens=self.num_tokens or settings["k"],
                      max_matching_ngram_size=self.max_matching_ngram_size)
        return hf_model(target, **settings), kwargs, _calls

    def reference_calls(self, case):
        """Prompt lookup decoding's law of calls (:func:`~specref.verification.statistics.efficiency.lookup_iterations`)."""
        from specref.verification.statistics.efficiency import lookup_iterations

        return lookup_iterations(case, num_tokens=self.num_tokens or case.k, max_ngram=self.max_matching_ngram_size,
                                 rules=hf_rules)

    def __repr__(self):
        return f"HFPromptLookup(num_tokens={self.num_tokens}, max_matching_ngram_size={self.max_matching_ngram_size})"


class HFEarlyExit(HFPath):
    """``generate(assistant_early_exit=layer)`` on :func:`early_exit_model` (case target at 2 layers, draft at 1)."""

    def __init__(self, layer: int = 1):
        super().__init__()
        self.layer = layer

    def prepare(self, target, draft, settings):
        model = early_exit_model(target, draft, layers=2, **settings)
        return model, dict(assistant_early_exit=self.layer), \
            lambda m: sum(1 for _, _, layers in m.calls if layers >= m.full_layers)

    def __repr__(self):
        return f"HFEarlyExit(layer={self.layer})"


class HFEnsemble(HFPath):
    """Assisted ``generate`` with ``assistant_ensemble_weight=weight`` (approximate by HF's own account)."""

    def __init__(self, weight: float):
        super().__init__()
        if not 0 < weight < 1:
            raise SpecrefError(f"assistant_ensemble_weight must be in (0, 1), got {weight!r}")
        self.weight = float(weight)

    def prepare(self, target, draft, settings):
        t = hf_model(target, **settings)
        t.generation_config.assistant_ensemble_weight = self.weight
        return t, dict(assistant_model=hf_model(draft, **settings)), _calls

    def __repr__(self):
        return f"HFEnsemble(weight={self.weight})"


class HFUniversal(HFPath):
    """``generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...)``: a draft of another vocabulary.

    ``draft``: a specref model over ``draft_tokenizer``'s ids; the oracle's case gives the
    target (over ``target_tokenizer``'s).  Sampling cases run ``UniversalSpeculativeDecodingGenerator``,
    greedy ones ``AssistedCandidateGeneratorDifferentTokenizers``.  The tokenizers are wrapped by
    :func:`hf_tokenizer`.  The assistant and both wrapped tokenizers are built together once per
    settings: HF caches its vocabulary translator per pair of tokenizer objects and prunes the
    assistant's head when it builds it, so a new assistant needs new tokenizer objects.
    """

    def __init__(self, draft, target_tokenizer, draft_tokenizer, *, repaired: bool = False,
                 seeded_vocab_order: bool = False):
        super().__init__()
        self.draft, self.target_tokenizer, self.draft_tokenizer = draft, target_tokenizer, draft_tokenizer
        self.repaired = repaired
        if not isinstance(seeded_vocab_order, bool):
            raise SpecrefError(f"seeded_vocab_order must be True or False, got {seeded_vocab_order!r}")
        self.seeded_vocab_order = seeded_vocab_order
        self.assistants: dict = {}  # settings -> the embedded assistant (its calls: the contexts it saw)

    def _generate(self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            if self.seeded_vocab_order:
                stack.enter_context(seeded_vocab_order())
            if self.repaired:
                stack.enter_context(repaired_translator())
            return super()._generate(*args, **kwargs)

    def prepare(self, target, draft, settings):
        V_t, V_d = logits_fn(target).vocab_size, logits_fn(self.draft).vocab_size
        if V_t == V_d:
            raise SpecrefError(f"HF takes assistant_tokenizer only when the vocabularies' sizes differ (both {V_t})")
        if len(self.target_tokenizer.pieces) != V_t or len(self.draft_tokenizer.pieces) != V_d:
            raise SpecrefError(f"the models' vocabularies (target {V_t}, draft {V_d}) are not the tokenizers' "
                               f"({len(self.target_tokenizer.pieces)}, {len(self.draft_tokenizer.pieces)})")
        assistant = embedded_model(self.draft, **settings)
        self.assistants[repr(sorted(settings.items()))] = assistant
        kwargs = dict(assistant_model=assistant, tokenizer=hf_tokenizer(self.target_tokenizer),
                      assistant_tokenizer=hf_tokenizer(self.draft_tokenizer))
        return hf_model(target, **settings), kwargs, _calls

    def reference_calls(self, case):
        """The law of calls of Timor et al.'s algorithm with this draft and these tokenizers, under HF's
        rules: TLI with the draft reading the committed tokens one by one (``draft_context="mapped"``,
        as ``UniversalSpeculativeDecodingGenerator`` does) when sampling, SLEM when greedy."""
        from specref.decoding.cross_vocab import slem_transition, tli_transition
        from specref.verification.cases.rules import ruled
        from specref.verification.statistics.efficiency import iterations_law

        (t, config), (d, _) = ruled(case.models()[0], case.config, hf_rules), ruled(self.draft, case.config, hf_rules)
        settings = dict(k=case.k, config=config, max_new_tokens=case.max_new_tokens, stop_tokens=case.stop_tokens)
        args = (t, d, self.target_tokenizer, self.draft_tokenizer, list(case.prompt))
        if case.config.greedy:
            return iterations_law(slem_transition(*args, **settings))
        return iterations_law(tli_transition(*args, **settings, draft_context="mapped"))

    def __repr__(self):
        return (f"HFUniversal({self.target_tokenizer!r} <- {self.draft_tokenizer!r}"
                + (", repaired=True" if self.repaired else "")
                + (", seeded_vocab_order=True" if self.seeded_vocab_order else "") + ")")


@contextlib.contextmanager
def seeded_vocab_order():
    """``PreTrainedTokenizerFast.get_vocab()`` listing the vocabulary in one seeded order, restored on exit.

    A ``tokenizers`` tokenizer lists its vocabulary in a Rust HashMap's order, seeded at random in
    every process, and transformers 5.24's vocabulary translator writes the pruned head's logit
    columns in that order (:func:`target_logit_columns`): how far the shipped different-tokenizer
    path lands from the target law changes from process to process, and from shard to shard of a
    check on an executor.  Here the order is ``numpy.random.default_rng(V).permutation(V)`` of the
    ids (``V`` the vocabulary's size): one such order, the same in every process.
    """
    from transformers import PreTrainedTokenizerFast

    original = PreTrainedTokenizerFast.get_vocab

    def get_vocab(self):
        items = sorted(original(self).items(), key=lambda kv: kv[1])
        order = np.random.default_rng(len(items)).permutation(len(items))
        return {items[i][0]: items[i][1] for i in order}

    PreTrainedTokenizerFast.get_vocab = get_vocab
    try:
        yield
    finally:
        PreTrainedTokenizerFast.get_vocab = original


def target_logit_columns(translator):
    """Where transformers 5.24's ``AssistantToTargetTranslator.get_target_logits`` puts each column of
    the pruned assistant's logits, and where that column's token is: ``(put [n], true [n])``, target ids.

    Column ``j`` of the pruned head is the logit of draft id ``assistant_overlap_token_ids[j]`` (the
    draft's ``get_vocab()`` order); ``get_target_logits`` writes it to the target id of the ``j``-th
    smallest shared draft id.  The two agree only when ``get_vocab()`` lists ids in increasing order.
    """
    import torch

    to_target = translator._assistant_to_target_input_ids
    put = to_target[to_target != translator.SUPPRESS_TOKEN_ID]
    true = to_target[translator.assistant_overlap_token_ids]
    return put.to(torch.long), true.to(torch.long)


@contextlib.contextmanager
def repaired_translator():
    """transformers 5.24's vocabulary translator with two repairs, for the differential check:
    pruned logits written to their own tokens' ids (:func:`target_logit_columns`), and no
    ``assistant_overlap_token_ids`` lookup when nothing was pruned (the draft's vocabulary inside the
    target's: 5.24 raises ``AttributeError`` there).  Restored on exit."""
    import torch
    from transformers.generation.candidate_generator import AssistantToTargetTranslator as Translator

    logits, ids = Translator.get_target_logits, Translator.get_target_ids

    def get_target_logits(self, assistant_logits):
        if not hasattr(self, "assistant_overlap_token_ids"):
            return logits(self, assistant_logits)
        out = torch.full((*assistant_logits.shape[:-1], self.target_vocab_size), self.FILTER_VALUE,
                         device=assistant_logits.device)
        out[..., target_logit_columns(self)[1]] = assistant_logits
        return out

    def get_target_ids(self, assistant_input_ids, target_input_ids, assistant_candidate_ids):
        if hasattr(self, "assistant_overlap_token_ids"):
            return ids(self, assistant_input_ids, target_input_ids, assistant_candidate_ids)
        n = assistant_candidate_ids.shape[1] - assistant_input_ids.shape[1]
        if n == 0:
            return target_input_ids
        new = self._assistant_to_target_input_ids[assistant_candidate_ids[0, -n:]]
        return torch.cat((target_input_ids, new.unsqueeze(0)), dim=1)

    Translator.get_target_logits, Translator.get_target_ids = get_target_logits, get_target_ids
    try:
        yield
    finally:
        Translator.get_target_logits, Translator.get_target_ids = logits, ids


# ---------------------------------------------------------------- real architectures, random weights


DRAFT_ROW_TOL = 1e-4  # one state's draft rows, observed in two rounds, agree within this (float32 softmax)


def observed_drafts(impl, case, *, decodes: int = 200, seed: int = 0) -> dict:
    """The draft rows a path hands ``_speculative_sampling``, by state: ``{(generated, drafted so far): q [V]}``.

    ``decodes`` decodes of ``impl`` on ``case`` (torch seeded ``seed, seed + 1, ...``) with
    transformers' ``generation.utils._speculative_sampling`` wrapped to record, for every drafted
    position, the tokens generated before the round, the tokens drafted before the position, and
    ``softmax(candidate_logits)`` there -- the row the generator drafted from and verifies with.
    Restored on exit.  The same state seen twice with rows further apart than
    :data:`DRAFT_ROW_TOL` is a ``SpecrefError``: the drafts then depend on more than the state.
    """
    import transformers.generation.utils as generation

    if isinstance(decodes, bool) or not isinstance(decodes, int) or decodes < 1:
        raise SpecrefError(f"decodes must be an int >= 1, got {decodes!r}")
    rows: dict  # (generated, drafted prefix) -> the row drafted from there
    rows, start = {}, len(case.prompt)
    original = generation._speculative_sampling

    def spy(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
        ids = candidate_input_ids[0].tolist()
        generated, drafted = tuple(ids[start: len(ids) - candidate_length]), ids[len(ids) - candidate_length:]
        q = candidate_logits[0].double().softmax(-1).numpy()
        for j in range(candidate_length):
            key = (generated, tuple(drafted[:j]))
            if key in rows and not np.allclose(rows[key], q[j], atol=DRAFT_ROW_TOL):
                raise SpecrefError(f"{type(impl).__name__}: two rounds from state {key} drafted from rows "
                                   f"{rows[key].round(5).tolist()} and {q[j].round(5).tolist()}")
            rows.setdefault(key, q[j])
        return original(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)

    target, draft = case.models()
    cast(Any, generation)._speculative_sampling = spy  # the spy takes **kwargs, not the original's signature
    try:
        for s in range(seed, seed + decodes):
            impl(target, draft, list(case.prompt), k=case.k, config=case.config, max_new_tokens=case.max_new_tokens,
                 stop_tokens=case.stop_tokens, rng=s)
    finally:
        generation._speculative_sampling = original
    return rows


@contextlib.contextmanager
def _quiet():
    """transformers' progress bars off and its logging at error level (MTP reloads its layer each call)."""
    from transformers.utils import logging

    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _count_forwards(model):
    """``model.calls``: one entry per forward call of ``model`` (a pre-hook)."""
    model.calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: module.calls.append(1), with_kwargs=True)
    return model


def prefix_logits(model, tokens) -> np.ndarray:
    """The row a transformers model gives after ``tokens``, recomputed from scratch (no cache): ``[V]`` float64."""
    torch = _hf()[0]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
    return out.logits[0, -1].to(torch.float64).numpy()


def model_table(model, prompt, max_new_tokens: int, vocab_size: int) -> np.ndarray:
    """A logit table ``[V] * (h + 1)``, ``h = len(prompt)``, that holds ``model``'s row after every prefix
    a decode of ``max_new_tokens`` tokens from ``prompt`` can reach; other entries are 0.

    The table reads the last ``h`` tokens (the oracle wants a prompt at least as long as the
    context), so the prompt must make those windows differ between reachable prefixes: a prompt
    whose windows collide is refused, naming both prefixes.  ``(1, 2, 1, 1)`` serves three new tokens.
    """
    import itertools

    prompt, V = [int(t) for t in prompt], int(vocab_size)
    if not prompt or min(prompt) < 0 or max(prompt) >= V:
        raise SpecrefError(f"prompt must be token ids in 0..{V - 1}, got {prompt}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= 4:
        raise SpecrefError(f"max_new_tokens must be an int in 1..4 (V^n prefixes), got {max_new_tokens!r}")
    h = len(prompt)
    seen: dict  # window -> the prefix that filled it
    table, seen = np.zeros((V,) * (h + 1)), {}
    for m in range(max_new_tokens):
        for tail in itertools.product(range(V), repeat=m):
            prefix = prompt + list(tail)
            window = tuple(prefix[-h:])
            if window in seen:
                raise SpecrefError(f"prompt {prompt}: prefixes {seen[window]} and {prefix} end in the same "
                                   f"{h} tokens, one table entry; choose a prompt whose windows differ")
            seen[window] = prefix
            table[window] = prefix_logits(model, prefix)
    return table


class HFArchitecturePath(HFPath):
    """A path that needs a real architecture: a random-weight transformers target (and assistant), bound here.

    ``vocab_size`` and ``seed`` fix the models (built in ``torch.random.fork_rng``, so the caller's
    torch state is kept).  The oracle's case must hold this target's own rows: :meth:`case` builds
    it (:func:`model_table`), and a call whose case holds other rows is refused (``SpecrefError``).
    The case's draft and ``k`` are not used where the path fixes its own (MTP: one layer, one token).
    Token 0 is the padding id (``generate`` masks it in a prompt), so prompts avoid it.
    A configuration transformers refuses is a ``SpecrefError`` naming the class and HF's reason.
    """

    target_class = ""  # the transformers class of the target, for messages

    def __init__(self, *, vocab_size: int = 3, seed: int = 0):
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise SpecrefError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SpecrefError(f"seed must be an int, got {seed!r}")
        self.vocab_size, self.seed = vocab_size, seed
        self._checked: set
        self._target, self._checked = None, set()

    def build_target(self):
        """The random-weight target (torch already seeded)."""
        raise NotImplementedError

    def reference_calls(self, case, *, decodes: int = 200, seed: int = 0):
        """The law of calls of Algorithm 1 with this path's own draft, as observed (:func:`observed_drafts`).

        The path's drafts come from the target's hidden states (and DFlash's and Gemma 4's also from
        where the round began), so their law is read off ``decodes`` seeded decodes, not built here.
        The reference: the first call drafts nothing (one token from ``p``), as these generators do;
        then every round drafts ``min(K, max_new_tokens - generated - 1)`` tokens from the observed
        rows, each a function of (generated, drafted so far), and verifies them with Algorithm 1
        (:func:`~specref.core.step.speculative_step`) against the case's rows under HF's rules.  It
        judges the rounds and the verification, not how good the drafter is.  A state the decodes did
        not reach is a ``SpecrefError``.
        """
        from specref.core.draws import draw
        from specref.core.step import speculative_step
        from specref.decoding.chain import kept_block, model_rows, target_transition
        from specref.verification.cases.rules import ruled
        from specref.verification.statistics.efficiency import iterations_law

        rows = observed_drafts(self, case, decodes=decodes, seed=seed)
        t, config = ruled(case.models()[0], case.config, hf_rules)
        prompt, K, N, stops = list(case.prompt), case.k, case.max_new_tokens, frozenset(case.stop_tokens)
        undrafted = target_transition(t, prompt, config=config, max_new_tokens=N, stop_tokens=case.stop_tokens)

        def iteration(generated, rng):
            k = 0 if not generated else min(K, N - len(generated) - 1)
            if k == 0:
                return undrafted(generated, rng)
            drafted, q = [], []
            for _ in range(k):
                key = (generated, tuple(drafted))
                if key not in rows:
                    raise SpecrefError(f"{type(self).__name__}: no draft was observed after {key[0]} with "
                                       f"{list(key[1])} drafted, in {decodes} decodes; observe more")
                q.append(rows[key])
                drafted.append(draw(rng, rows[key]))
            p = model_rows(t, prompt + list(generated) + drafted, k + 1, config, name="target")
            return kept_block(generated, speculative_step(p, np.stack(q), drafted, rng, check=False), N, stops)

        return iterations_law(iteration)

    def build_assistant(self, settings):
        """The assistant for one case's settings, or None (torch already seeded)."""
        return None

    def generate_kwargs(self, settings) -> dict:
        """``generate`` keyword arguments besides ``generation_config`` and the assistant."""
        return {}

    def _seeded(self, build, *args):
        import transformers

        torch = _hf()[0]
        with torch.random.fork_rng(devices=[]), _quiet():
            torch.manual_seed(self.seed)
            try:
                return build(*args)
            except Exception as e:  # noqa: BLE001 - any refusal of transformers' (its config validators' own types too)
                raise SpecrefError(f"{type(self).__name__}: transformers {transformers.__version__} refuses "
                                   f"{self.target_class} with vocab_size={self.vocab_size}: {type(e).__name__}: {e}") \
                    from None

    def target_model(self):
        """The bound target (built on first use), with ``.calls`` counting its forward calls."""
        if self._target is None:
            self._target = _count_forwards(self._seeded(self.build_target).eval())
        return self._target

    def case(self, name: str, *, prompt=(1, 2, 1, 1), config: SamplingConfig = SamplingConfig(), max_new_tokens: int = 3,
             k: int = 2, stop_tokens=()):
        """A decoder case whose target (and unused draft) is this path's target, as a logit table."""
        from specref.verification.cases.chain import Case

        table = model_table(self.target_model(), prompt, max_new_tokens, self.vocab_size)
        return Case(name, table, table, prompt=tuple(prompt), k=k, config=config, max_new_tokens=max_new_tokens,
                    stop_tokens=tuple(stop_tokens), tables="logits")

    def _check_case(self, target, prompt, max_new_tokens):
        key = (_table_key(target), tuple(prompt), max_new_tokens)
        if key in self._checked:
            return
        rows = logits_fn(target)
        V = rows.vocab_size
        if V != self.vocab_size:
            raise SpecrefError(f"{type(self).__name__} has vocab_size={self.vocab_size}, the case's target V={V}")
        ours = model_table(self.target_model(), prompt, max_new_tokens, V)
        theirs = np.stack([rows(list(index))[-1] for index in np.ndindex(*ours.shape[:-1])])
        if not np.allclose(theirs, ours.reshape(theirs.shape), atol=1e-5):
            raise SpecrefError(f"the case's target is not {type(self).__name__}'s model: build the case with .case()")
        self._checked.add(key)

    def _generate(self, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        if max_new_tokens:
            self._check_case(target, prompt, max_new_tokens)
        with _quiet():
            return super()._generate(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                                     stop_tokens=stop_tokens, rng=rng)

    def prepare(self, target, draft, settings):
        from specref.adapters.hf_models import generation_config

        gc = generation_config(settings["config"], stop_tokens=settings["stop_tokens"],
                               max_new_tokens=settings["max_new_tokens"], k=settings["k"])
        kwargs = dict(generation_config=gc, **self.generate_kwargs(settings))
        assistant = self._seeded(self.build_assistant, settings)
        if assistant is not None:
            kwargs["assistant_model"] = assistant.eval()
        return self.target_model(), kwargs, _calls

    def __getstate__(self):
        state = super().__getstate__()
        state.update(_target=None, _checked=set())
        return state

    def __repr__(self):
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, seed={self.seed})"


# ---------------------------------------------------------------- the ensemble rule, exactly


def ensemble_step(weight: float):
    """HF's static ensemble verification as a step ``(p_target, q_draft, draft_tokens, rng) -> tokens``.

    ``_speculative_sampling`` with ``assistant_ensemble_weight = w``: accept ``x_i`` when
    ``u <= 1 - w + w p(x_i)/q(x_i)``; at the first rejection draw from ``norm(max(0, p - q))``
    (HF: ``[v - q]+ = w [p - q]+`` normalises to the same row), or from ``p`` when that residual
    is (numerically) empty; the bonus from ``p_target[K]``.  Lossless only at ``w = 1``.
    """
    from specref.core.step import draw
    from specref.core.step import residual_weights

    w = float(weight)

    def step(p_target, q_draft, draft_tokens, rng):
        out = []
        for i, x in enumerate(int(t) for t in draft_tokens):
            if rng.random() < 1 - w + w * p_target[i, x] / q_draft[i, x]:
                out.append(x)
                continue
            r = residual_weights(p_target[i], q_draft[i])
            total = r.sum()
            out.append(draw(rng, r / total if total > np.finfo(np.float32).tiny else p_target[i]))
            return out
        out.append(draw(rng, p_target[len(out)]))
        return out

    step.__name__ = f"ensemble_step_{w}"
    return step


def ensemble_law(case, weight: float, *, capped: bool = True):
    """The exact law (float) of HF's ensemble rule on ``case``, under HF's rules, and the target law;
    ``(law, target law, TV)``.

    Each iteration drafts ``min(K, max_new_tokens - generated - 1)`` tokens, as transformers'
    assistant does, and applies :func:`ensemble_step`; with no token to draft, the one new token is
    drawn from ``p``.  For a lossless rule the cap changes nothing (the tokens not drafted would
    have been cut), but the ensemble rule bends every drafted position, so the cap changes its law:
    ``capped=False`` drafts K every round and keeps the first tokens (specref's loop,
    :func:`~specref.decoding.chain.speculative_transition`), a different and farther law.  Meant for
    temperature-1 cases without top-k/p: there transformers 5.24's assistant, which applies each
    warper twice, samples what ``hf_rules`` gives.
    """
    from specref.decoding.chain import speculative_transition, target_transition
    from specref.verification.cases.rules import ruled
    from specref.verification.laws.enumeration import compare, law_iterated, target_law

    case = case.as_float()
    target, draft = case.models()
    (t, config), (d, _) = ruled(target, case.config, hf_rules), ruled(draft, case.config, hf_rules)
    prompt, K, N = list(case.prompt), case.k, case.max_new_tokens
    settings = dict(config=config, max_new_tokens=N, stop_tokens=case.stop_tokens)
    steps = {k: speculative_transition(t, d, prompt, k=k, step=ensemble_step(weight), **settings)
             for k in range(1, K + 1)}
    steps[0] = target_transition(t, prompt, **settings)  # nothing to draft: one token from p

    def iteration(generated, rng):
        return steps[K if not capped else min(K, N - len(generated) - 1)](generated, rng)

    got = law_iterated((), iteration)
    truth = target_law(t, prompt, config, N, case.stop_tokens)
    return got, truth, float(compare(got, truth).tv)
