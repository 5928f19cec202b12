"""Hugging Face ``generate``'s speculative paths as experiments: the same-vocabulary cases they run
on, and the three paths that need a real architecture, each on a tiny model with random weights.
Follows transformers 5.24 (the classes, configurations and checkpoint layouts named below).

``benchmarks/hf_paths.py`` and ``tests/test_hf_paths.py`` run them under the decoder-level oracle
through :mod:`specref.adapters.hf_paths`, whose :class:`~specref.adapters.hf_paths.HFArchitecturePath`
each class here subclasses: it binds the target, turns it into the oracle's case and gives the
reference calls.  Each builds locally at the smallest configuration transformers 5.24 takes
(V = 3, hidden size 16, one or two layers; nothing downloaded):

- :class:`HFMTP` -- ``use_mtp=True``: ``MTPCandidateGenerator`` needs ``num_mtp_layers`` in the
  config and calls ``MtpModel.from_pretrained(main_model)`` (``modeling_layers.py``), which reads
  the MTP weights from the checkpoint at ``config.name_or_path`` on every call: a one-layer
  ``MellumForCausalLM`` is saved with random MTP weights to a temporary directory and loaded back.
  (Mellum because its MTP key pattern, ``mtp.`` at the start, names no layer number; DeepSeek-V3's
  and GLM-4-MoE's ``_keys_to_ignore_on_load_unexpected`` name layers 61, 46 and 92 of the released
  checkpoints, so a one-layer model finds no MTP weights.)
- :class:`HFDFlash` -- ``speculation_type="dflash"``: ``DFlashTokenCandidateGenerator`` with a
  ``MuseGlimmerAssistantModel`` (``target_layer_ids``, ``block_size``, ``mask_token_id``) on a
  ``LlamaForCausalLM`` target.
- :class:`HFGemma4` -- ``Gemma4AssistantForCausalLM`` on ``Gemma4ForCausalLM``:
  ``SinglePositionMultiTokenCandidateGenerator`` (chosen by class name).  It drafts the argmax of
  the assistant's logits (``candidate_generator.py``, ``get_candidates``: ``outputs.logits.argmax``)
  and hands those logits on, so with sampling ``_speculative_sampling`` accepts at ``p/q`` with a
  ``q`` the draft was not drawn from: the oracle flags it.  Greedy, it is the argmax chain.

All three skip drafting on the first target call (Gemma 4's and DFlash's draft rows also come from
where the round began: the assistant's own hidden state), so their reference is
:meth:`~specref.adapters.hf_paths.HFArchitecturePath.reference_calls`.  A configuration
transformers refuses (``HFMTP(num_mtp_layers=2)``: Mellum takes one MTP layer) is a
``SpecrefError``, status ``raised`` under the oracle.  :func:`path_cases` gives the cases of the
same-vocabulary paths (prompt lookup, early exit, the ensemble weight).

torch and transformers are imported inside the functions, as in :mod:`specref.adapters.hf_models`.
"""

from __future__ import annotations

import numpy as np

from specref.adapters.hf_paths import HFArchitecturePath
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig

_TINY = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=None, eos_token_id=None)
INIT_RANGE = 0.2  # weights' init std: 0.02 (the default) gives near-uniform rows, 0.5 near point masses


class HFMTP(HFArchitecturePath):
    """``generate(use_mtp=True)``: ``MTPCandidateGenerator`` on a one-layer ``MellumForCausalLM`` with one MTP layer.

    ``MtpModel.from_pretrained(main_model)`` (``modeling_layers.py``) reads the MTP weights from the
    checkpoint at ``config.name_or_path`` on every ``generate`` call.  The target is saved to a
    temporary directory with random MTP weights under ``mtp.`` (Mellum's checkpoint layout, the keys
    its ``_keys_to_ignore_on_load_unexpected`` names) and loaded back from there; nothing is
    downloaded.  Mellum takes at most one MTP layer, so every round drafts one token
    (``num_mtp_layers=2`` is refused by ``MellumConfig``).
    """

    target_class = "MellumForCausalLM"

    def __init__(self, *, num_mtp_layers: int = 1, vocab_size: int = 3, seed: int = 0):
        super().__init__(vocab_size=vocab_size, seed=seed)
        if isinstance(num_mtp_layers, bool) or not isinstance(num_mtp_layers, int) or num_mtp_layers < 1:
            raise SpecrefError(f"num_mtp_layers must be an int >= 1, got {num_mtp_layers!r}")
        self.num_mtp_layers = num_mtp_layers

    def build_target(self):
        import shutil
        import tempfile
        import weakref

        from safetensors.torch import load_file, save_file
        from transformers import MellumConfig, MellumForCausalLM
        from transformers.modeling_layers import MtpModel

        n = self.num_mtp_layers
        config = MellumConfig(vocab_size=self.vocab_size, num_hidden_layers=1, mlp_layer_types=["dense"],
                              num_mtp_layers=n, mtp_layer_types=["full_attention"] * n,
                              mtp_mlp_layer_types=["dense"] * n, sliding_window=None, num_experts=2,
                              num_experts_per_tok=1, moe_intermediate_size=8, initializer_range=INIT_RANGE, **_TINY)
        main = MellumForCausalLM(config)
        where = tempfile.mkdtemp(prefix="specref-mtp-")
        main.save_pretrained(where)
        weights = load_file(f"{where}/model.safetensors")
        for key, value in MtpModel(main, n).state_dict().items():  # random MTP layer weights, Mellum's keys
            if not key.startswith(("embed_tokens.", "shared_head.")):
                weights["mtp." + key] = value.detach().clone().contiguous()
        save_file(weights, f"{where}/model.safetensors", metadata={"format": "pt"})
        model = MellumForCausalLM.from_pretrained(where)
        weakref.finalize(model, shutil.rmtree, where, True)
        return model

    def generate_kwargs(self, settings):
        return dict(use_mtp=True)

    def __repr__(self):
        return f"HFMTP(num_mtp_layers={self.num_mtp_layers}, vocab_size={self.vocab_size}, seed={self.seed})"


class HFDFlash(HFArchitecturePath):
    """``generate(assistant_model=..., speculation_type="dflash")``: ``DFlashTokenCandidateGenerator``.

    Target: a two-layer ``LlamaForCausalLM``; assistant: a one-layer ``MuseGlimmerAssistantModel``
    (the DFlash drafter transformers ships) with ``target_layer_ids=[0, 1]``, ``block_size=K+1``
    (one anchor and K mask positions, so K drafted tokens a round) and ``mask_token_id = V - 1``.
    """

    target_class = "LlamaForCausalLM"

    def build_target(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=self.vocab_size, num_hidden_layers=2,
                                            initializer_range=INIT_RANGE, **_TINY))

    def build_assistant(self, settings):
        from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

        tiny = {key: v for key, v in _TINY.items() if key != "bos_token_id" and key != "eos_token_id"}
        config = MuseGlimmerAssistantConfig(num_hidden_layers=1, sliding_window=8, block_size=settings["k"] + 1,
                                            mask_token_id=self.vocab_size - 1, target_layer_ids=[0, 1],
                                            initializer_range=INIT_RANGE, bos_token_id=None, eos_token_id=None,
                                            **tiny)
        return MuseGlimmerAssistantModel(config)

    def generate_kwargs(self, settings):
        return dict(speculation_type="dflash")


class HFGemma4(HFArchitecturePath):
    """``generate(assistant_model=Gemma4AssistantForCausalLM)``: ``SinglePositionMultiTokenCandidateGenerator``.

    Target: a two-layer ``Gemma4ForCausalLM`` (one sliding-window layer of width 4, one full) that
    returns its ``shared_kv_states``; assistant: a two-layer ``Gemma4AssistantForCausalLM`` reading
    them, ``num_assistant_tokens = K``.  The generator drafts each token as the argmax of the
    assistant's logits and hands those raw logits on as the draft's distribution.
    """

    target_class = "Gemma4ForCausalLM"

    def _text_config(self):
        from transformers import Gemma4TextConfig

        return Gemma4TextConfig(vocab_size=self.vocab_size, num_hidden_layers=2, global_head_dim=8,
                                layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                                vocab_size_per_layer_input=0, hidden_size_per_layer_input=0,
                                initializer_range=INIT_RANGE, **_TINY)

    def build_target(self):
        from transformers import Gemma4ForCausalLM

        return Gemma4ForCausalLM(self._text_config())

    def build_assistant(self, settings):
        from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

        assistant = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=self._text_config(),
                                                                      backbone_hidden_size=_TINY["hidden_size"]))
        assistant.generation_config.num_assistant_tokens = int(settings["k"])
        return assistant


# ---------------------------------------------------------------- cases


def path_cases():
    """Decoder cases for the same-vocabulary paths (V = 3 logit tables, K = 2, 3 new tokens):
    temperature 0.8 and greedy for prompt lookup (a prompt with repeated n-grams), early exit and
    the ensemble weight (temperature 1, no top-k/p, as :func:`ensemble_law` needs)."""
    from specref.verification.cases.chain import Case

    rng = np.random.default_rng(20261215)

    def pair():
        return rng.normal(0, 1.2, (3, 3)), rng.normal(0, 1.2, (3, 3))

    return [
        Case("lookup-temperature", *pair(), prompt=(0, 1, 2, 0, 1), config=SamplingConfig(temperature=0.8),
             tables="logits"),
        Case("lookup-greedy", *pair(), prompt=(0, 1, 2, 0, 1), config=SamplingConfig(temperature=0), tables="logits"),
        Case("early-exit-top-k", *pair(), config=SamplingConfig(top_k=2), tables="logits"),
        Case("ensemble", *pair(), tables="logits"),
    ]
