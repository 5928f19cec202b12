"""The oracle's inputs in the engines' terms: an integer seed as the engines' seeds, probability
rows as float32 logits or probabilities (torch tensors).

Randomness is the engine's own, seeded from the oracle's integer ``seed`` (statistical mode
only): torch generators for SGLang, (seed, position) counters for MRV2, each from its own
``SeedSequence`` child.  Probability rows become logits as ``log(p)`` in float32 (``-inf`` where
``p = 0``); the engines' softmax gives ``p`` back to float32 rounding.  Used by
:mod:`~specref.adapters.real_engines.mrv2` and :mod:`~specref.adapters.real_engines.sglang`
(vLLM V1's call is the ``vllm`` level's own, converted by
:func:`specref.adapters.engines.vllm_engine`); no engine release is named here.
"""

from __future__ import annotations

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError


def _statistical_seed(seed, what: str) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise SpecrefError(f"{what} draws from the engine's own generators: run it in statistical mode "
                           f"(an integer seed), got {type(seed).__name__}")
    return int(seed)


def _seeds(seed: int, n: int, salt: int) -> np.ndarray:
    """``n`` independent 63-bit seeds from the oracle's ``seed`` (a SeedSequence child per use)."""
    return np.random.SeedSequence([seed, salt]).generate_state(n, dtype=np.uint64) >> np.uint64(1)


def _logits(probs, torch):
    """float32 ``log(p)``, ``-inf`` where ``p = 0`` (the engine's softmax gives ``p`` back)."""
    return torch.log(torch.as_tensor(np.ascontiguousarray(to_numpy(probs), dtype=np.float32)))


def _f32(a, torch):
    return torch.as_tensor(np.ascontiguousarray(to_numpy(a), dtype=np.float32))
