"""The oracle's models as PyTorch modules and Hugging Face models (the ``hf`` extra).

A decoder written against Hugging Face-style models (``model(input_ids).logits``,
``past_key_values``, ``model.config.vocab_size``) cannot take the oracle's
``(p, q, draft_tokens)`` rows: its speculative step sits inside a loop over models.  This
module turns any :class:`~specref.verification.cases.chain.Case` side, and any specref model
(the n-gram and transformer toy models, the table models), into models such a decoder calls as
it is:

- :class:`TableModule` (``torch.nn.Module``): ``model(input_ids [B, n], past_key_values=None,
  use_cache=None) -> out`` with ``out.logits [B, n, V]`` (float32) and
  ``out.past_key_values`` (also ``out.cache``); ``model.config`` holds ``vocab_size``,
  ``use_cache``, ``eos_token_id``, ``pad_token_id``, ``bos_token_id`` (a
  :class:`SpecrefTableConfig`, a ``transformers.PretrainedConfig`` when transformers is
  installed) and ``model.generation_config`` the case's sampling settings.
- :class:`HFTableModel` (a ``transformers.PreTrainedModel``): the same rows behind the
  interface ``generate()`` drives, with or without ``assistant_model=``.

Both names import from this module (``from specref.adapters.hf_models import TableModule``);
the classes are built on first use, so importing the module needs neither torch nor
transformers.

Both compute row ``j`` of the logits from the *whole* context the model holds: the
tokens in its cache followed by ``input_ids[:, :j + 1]``.  The cache holds **token
ids** (as float keys and values ``[B, 1, L, 1]``), not attention states, so a decoder
that re-feeds a prefix on top of the cache, forgets to crop it after a rejection, or
shifts it, gives the model a different context -- and with a position-aware case
(``Case(..., context="position")``) a different row.  The oracle then sees the bug.
``model.calls`` records each forward call's full context and number of new tokens
(iterations of a decoder: count the target's calls).

The cache, as a ``transformers`` model's: ``use_cache`` defaults to ``config.use_cache``
(True), so the first call (``past_key_values=None``) starts a cache and returns it -- the
installed transformers' ``DynamicCache`` (updated in place on later calls; ``crop`` and
``get_seq_length`` work), or, without transformers, the legacy ``((keys, values),)`` tuple.
A cache handed in comes back in its own form: any ``transformers`` ``Cache`` updated in
place, a legacy tuple (slicing ``k[:, :, :n]`` crops it) as a new tuple.  ``use_cache=False``
with no cache returns none.  Only the public cache API is used (``update``,
``get_seq_length``), never ``key_cache``/``value_cache``, which transformers 5 removed.

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.  torch and
transformers are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

import functools

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.verification.cases.models import logits_fn

__all__ = [
    "TableOutput",
    "torch_module",
    "torch_models",
    "case_torch_models",
    "hf_model",
    "hf_models",
    "case_hf_models",
    "generation_config",
    "torch_seeded",
]


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"specref.adapters.hf_models needs torch ({e}): pip install 'specref[hf]'") from e
    return torch


# ---------------------------------------------------------------- rows from the whole context


def _rows(fn, cached, input_ids):
    """Logits ``[B, n, V]`` (float32) for the new tokens, each row over cache + new tokens before it."""
    torch = _torch()
    out = []
    for b in range(input_ids.shape[0]):
        context = cached[b] + input_ids[b].tolist()  # the whole context the model holds
        out.append(fn(context)[-input_ids.shape[1]:])  # [n, V]: rows of the new positions
    return torch.from_numpy(np.stack(out).astype(np.float32))


def _as_ids(keys):  # [B, 1, L, 1] float keys -> B lists of token ids
    return [[int(t) for t in row] for row in keys[:, 0, :, 0].round().long().tolist()]


def _new_cache():
    """An empty cache of the installed transformers' own class (``DynamicCache``), or None without it."""
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:
        return None
    return DynamicCache()


def _update(cache, input_ids):
    """Append ``input_ids`` to ``cache`` (None: a new one; a legacy tuple; or a transformers Cache).

    Returns ``(tokens already cached per row, the cache to hand back)``.
    """
    torch = _torch()
    new = input_ids.to(torch.float32)[:, None, :, None]  # [B, n] -> [B, 1, n, 1]: token ids as keys
    if cache is None:
        cache = _new_cache()
    if cache is None or (isinstance(cache, (tuple, list)) and len(cache) == 0):
        return [[] for _ in range(input_ids.shape[0])], ((new, new.clone()),)
    if isinstance(cache, (tuple, list)):  # the legacy format: ((keys, values),)
        keys = cache[0][0]
        full = torch.cat([keys, new], dim=2)
        return _as_ids(keys), ((full, full.clone()),)
    if hasattr(cache, "update") and hasattr(cache, "get_seq_length"):  # a transformers Cache, updated in place
        before = cache.get_seq_length()
        keys, _ = cache.update(new, new.clone(), 0)
        cached = _as_ids(keys[:, :, : keys.shape[2] - input_ids.shape[1]])
        if len(cached[0]) != before:
            raise SpecrefError(f"the cache reported {before} tokens but holds {len(cached[0])}")
        return cached, cache
    raise SpecrefError(f"past_key_values must be None, a ((keys, values),) tuple or a transformers Cache, "
                       f"got {type(cache).__name__}")


def _check_input_ids(input_ids, V):
    torch = _torch()
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim == 1:
        input_ids = input_ids[None]  # [n] -> [1, n]
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise SpecrefError(f"input_ids must have shape [B, n] with n >= 1, got {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.min() < 0 or input_ids.max() >= V:
        raise SpecrefError(f"input_ids must be token ids in 0..{V - 1}, got {input_ids.tolist()}")
    return input_ids.long()


class TableOutput(dict):
    """What a forward call returns: ``.logits [B, n, V]``, ``.past_key_values`` (also ``.cache``);
    ``out[0]`` is the logits and ``out[1]`` the cache, as with a Hugging Face ``ModelOutput``."""

    __getattr__ = dict.get

    def __getitem__(self, key):
        if isinstance(key, int):
            return (self["logits"], self["past_key_values"])[key]
        return dict.__getitem__(self, key)


def generation_config(config: SamplingConfig = SamplingConfig(), *, stop_tokens=(), max_new_tokens=None, k=None):
    """A ``transformers.GenerationConfig`` with a case's sampling settings.

    Temperature 0 becomes ``do_sample=False`` (greedy); top-k, top-p and min-p map
    one to one; the first stop token is ``eos_token_id`` (all of them when several).
    ``k`` sets a fixed ``num_assistant_tokens`` and switches off the adaptive schedule
    and the assistant's confidence threshold (older releases, 4.40 among them, have no such
    threshold and store the field unread), so that every draft block has K tokens.
    A ``min_p > 0`` where the installed ``GenerationConfig`` has no ``min_p`` field (4.40)
    is refused: it would be stored and never applied.
    """
    from transformers import GenerationConfig

    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
    if config.min_p > 0 and "min_p" not in vars(GenerationConfig()):
        raise SpecrefError(f"config.min_p is {config.min_p} but the installed transformers' GenerationConfig "
                           "has no min_p (it would be ignored): use transformers >= 4.41 or min_p=0")
    stops = [int(t) for t in stop_tokens]
    kwargs: dict[str, object] = dict(do_sample=not config.greedy, pad_token_id=stops[0] if stops else 0,
                  eos_token_id=(stops[0] if len(stops) == 1 else stops) if stops else None)
    if not config.greedy:
        kwargs.update(temperature=float(config.temperature), top_k=config.top_k or 0, top_p=float(config.top_p))
        if config.min_p > 0:
            kwargs["min_p"] = float(config.min_p)
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = int(max_new_tokens)
    if k is not None:
        kwargs.update(num_assistant_tokens=int(k), num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    return GenerationConfig(**kwargs)


# ---------------------------------------------------------------- the config both classes carry


def _named(cls, name):
    """``cls`` findable as ``specref.adapters.hf_models.<name>`` (pickle, repr, the module's ``__getattr__``)."""
    cls.__module__, cls.__qualname__, cls.__name__ = __name__, name, name
    return cls


class _PlainTableConfig:
    """A table model's config without transformers: the fields decoders read from ``model.config``."""

    model_type = "specref-table"
    is_encoder_decoder = False

    def __init__(self, vocab_size=2, use_cache=True, pad_token_id=None, eos_token_id=None, bos_token_id=None,
                 **kwargs):
        self.vocab_size, self.use_cache = vocab_size, use_cache
        self.pad_token_id, self.eos_token_id, self.bos_token_id = pad_token_id, eos_token_id, bos_token_id
        self.num_hidden_layers = 1  # one cache layer: the token ids
        self.__dict__.update(kwargs)

    def to_dict(self):
        return dict(vars(self), model_type=self.model_type)

    def __repr__(self):
        return f"SpecrefTableConfig({self.to_dict()})"


@functools.cache
def _config_class():
    """:class:`SpecrefTableConfig`: a ``transformers.PretrainedConfig`` when transformers is installed."""
    try:
        from transformers import PretrainedConfig
    except ImportError:
        return _named(_PlainTableConfig, "SpecrefTableConfig")

    class SpecrefTableConfig(PretrainedConfig):
        """``vocab_size``, ``use_cache`` (True, as transformers' causal LMs) and the token ids of a table model."""

        model_type = "specref-table"

        def __init__(self, vocab_size=2, use_cache=True, **kwargs):
            super().__init__(**kwargs)
            self.vocab_size, self.use_cache = vocab_size, use_cache
            self.num_hidden_layers = 1  # one cache layer: the token ids

    return _named(SpecrefTableConfig, "SpecrefTableConfig")


def _config_for(vocab_size, stop_tokens=()):
    stops = [int(t) for t in stop_tokens]
    return _config_class()(vocab_size=vocab_size, use_cache=True, pad_token_id=stops[0] if stops else 0,
                           eos_token_id=stops[0] if len(stops) == 1 else (stops or None))


def _check_vocab(config, V):
    """``config.vocab_size`` must be the logits' width (a decoder sizes its tensors by it)."""
    size = getattr(config, "vocab_size", None)
    if size != V:
        raise SpecrefError(f"config.vocab_size is {size!r} but the model's logits have V = {V} entries per row")


def _forward(model, input_ids, cache, use_cache):
    """What both classes do: ``(logits [B, n, V], the cache to return or None)``."""
    _check_vocab(model.config, model.rows.vocab_size)
    input_ids = _check_input_ids(input_ids, model.rows.vocab_size)
    use_cache = getattr(model.config, "use_cache", True) if use_cache is None else use_cache
    if cache is None and not use_cache:  # as transformers: no cache asked for, none made
        cached, updated = [[] for _ in range(input_ids.shape[0])], None
    else:
        cached, updated = _update(cache, input_ids)
    model.calls.append((cached[0] + input_ids[0].tolist(), input_ids.shape[1]))
    return _rows(model.rows, cached, input_ids), updated


# ---------------------------------------------------------------- (b) a plain torch module


@functools.cache
def _module_class():
    torch = _torch()

    class TableModule(torch.nn.Module):
        """``model(input_ids [B, n], past_key_values=None, use_cache=None) -> TableOutput``; ``model.config``
        (:class:`SpecrefTableConfig`) and ``model.generation_config`` as a Hugging Face model has them."""

        def __init__(self, model, gen_config=None, *, stop_tokens=()):
            super().__init__()
            self.rows = logits_fn(model)
            self.vocab_size = self.rows.vocab_size
            self.config = _config_for(self.vocab_size, stop_tokens)
            self.generation_config = gen_config
            self.calls = []  # (whole context, number of new tokens) per forward call
            self.register_buffer("_device_anchor", torch.zeros(()), persistent=False)

        @property
        def device(self):
            return self._device_anchor.device

        def forward(self, input_ids=None, past_key_values=None, use_cache=None, attention_mask=None, **kwargs):
            logits, updated = _forward(self, input_ids, kwargs.get("cache", past_key_values), use_cache)
            return TableOutput(logits=logits, past_key_values=updated, cache=updated)

        def __repr__(self):
            return f"TableModule({self.rows.model!r})"

    return _named(TableModule, "TableModule")


def torch_module(model, *, config: SamplingConfig = SamplingConfig(), stop_tokens=(), max_new_tokens=None, k=None):
    """Any specref model (or a case's table model) as a :class:`TableModule` (``torch.nn.Module``)."""
    gen = _generation_config_or_none(config, stop_tokens, max_new_tokens, k)
    return _module_class()(model, gen, stop_tokens=stop_tokens)


def torch_models(target, draft, **settings):
    """``(target, draft)`` specref models -> two :class:`TableModule` s (``settings`` as :func:`torch_module`)."""
    return torch_module(target, **settings), torch_module(draft, **settings)


def case_torch_models(case):
    """A case's target and draft as :class:`TableModule` s carrying its settings."""
    target, draft = case.models()
    settings = dict(config=case.config, stop_tokens=case.stop_tokens, max_new_tokens=case.max_new_tokens, k=case.k)
    return torch_models(target, draft, **settings)


def _generation_config_or_none(config, stop_tokens, max_new_tokens, k):
    try:
        return generation_config(config, stop_tokens=stop_tokens, max_new_tokens=max_new_tokens, k=k)
    except ImportError:  # a plain torch module needs no transformers; it then has no generation_config
        return None


# ---------------------------------------------------------------- (c) a transformers model


@functools.cache
def _hf_classes():
    torch = _torch()
    try:
        from transformers import PreTrainedModel
        from transformers.generation import GenerationMixin
        from transformers.modeling_outputs import CausalLMOutputWithPast
    except ImportError as e:
        raise ImportError(f"specref.adapters.hf_models.hf_model needs transformers ({e}): "
                          "pip install 'specref[hf]'") from e
    cache_field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    config_class = _config_class()

    class HFTableModel(PreTrainedModel, GenerationMixin):
        """A ``PreTrainedModel`` whose logits are a specref model's rows over the whole context."""

        config_class = _config_class()
        main_input_name = "input_ids"
        _supports_cache_class = True

        def __init__(self, config, model=None):
            super().__init__(config)
            self.rows = logits_fn(model)
            self.calls = []
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # device and dtype for generate

        def forward(self, input_ids=None, past_key_values=None, attention_mask=None, use_cache=None, **kwargs):
            logits, updated = _forward(self, input_ids, kwargs.get("cache", past_key_values), use_cache)
            out = CausalLMOutputWithPast(logits=logits)
            if updated is not None:
                out[cache_field] = updated
            return out

    if not HFTableModel.can_generate():  # a GenerationMixin that leaves the model inputs to the model (4.40-4.44)
        HFTableModel.prepare_inputs_for_generation = _inputs_for_generation
    return config_class, _named(HFTableModel, "HFTableModel")


def _inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=None, **kwargs):
    """What ``generate()`` feeds the model where transformers asks the model for it: the tokens
    ``input_ids [B, n]`` holds beyond those already in ``past_key_values`` (a Cache or a legacy tuple)."""
    if past_key_values is not None and len(past_key_values) > 0:
        seen = (past_key_values.get_seq_length() if hasattr(past_key_values, "get_seq_length")
                else past_key_values[0][0].shape[2])
        input_ids = input_ids[:, seen:]  # [B, n] -> [B, n - seen]
    return dict(input_ids=input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                use_cache=use_cache)


def hf_model(model, *, config: SamplingConfig = SamplingConfig(), stop_tokens=(), max_new_tokens=None, k=None):
    """Any specref model as an :class:`HFTableModel` (a ``transformers.PreTrainedModel``) that
    ``generate()`` accepts; its ``generation_config`` carries the settings (:func:`generation_config`)."""
    _, model_class = _hf_classes()
    rows = logits_fn(model)
    hf = model_class(_config_for(rows.vocab_size, stop_tokens), model)
    hf.generation_config = generation_config(config, stop_tokens=stop_tokens, max_new_tokens=max_new_tokens, k=k)
    hf.eval()
    return hf


def hf_models(target, draft, **settings):
    """``(target, draft)`` specref models -> two :class:`HFTableModel` s (``settings`` as :func:`hf_model`)."""
    return hf_model(target, **settings), hf_model(draft, **settings)


def case_hf_models(case):
    """A case's target and draft as :class:`HFTableModel` s; the draft's config fixes K = ``case.k``."""
    target, draft = case.models()
    settings = dict(config=case.config, stop_tokens=case.stop_tokens, max_new_tokens=case.max_new_tokens, k=case.k)
    return hf_models(target, draft, **settings)


def __getattr__(name):
    """``TableModule``, ``HFTableModel`` and ``SpecrefTableConfig`` by name, built on first use."""
    if name == "TableModule":
        return _module_class()
    if name == "HFTableModel":
        return _hf_classes()[1]
    if name == "SpecrefTableConfig":
        return _config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- seeds


def torch_seeded(fn):
    """``fn`` with torch's global CPU generator seeded from the oracle's integer ``rng``.

    In statistical mode the oracle hands every call a fresh seed, an int in
    ``[0, 2**63)`` (``rng=`` at decoder level, the last positional argument at step and
    logits level).  Code that draws from torch's global generator (``torch.rand``,
    ``torch.multinomial`` without ``generator=``) cannot take it; the wrapper seeds the
    global generator with it inside ``torch.random.fork_rng`` -- the caller's state comes
    back afterwards -- and then calls ``fn`` with the same arguments.  (``torch.manual_seed``
    accepts the whole range; NumPy's legacy ``RandomState`` needs ``seed % 2**32``,
    ``numpy.random.default_rng`` takes it as it is.)
    """
    @functools.wraps(fn)
    def seeded(*args, **kwargs):
        torch = _torch()
        seed = kwargs["rng"] if "rng" in kwargs else args[-1]
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"torch_seeded needs an integer seed as rng (statistical mode), got {seed!r}")
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(int(seed))
            return fn(*args, **kwargs)

    return seeded
