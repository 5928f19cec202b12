"""Real engines' verifiers in the calls of the engine-shaped levels (:mod:`specref.verification.levels.engines`).

``flashinfer_engine()`` wraps FlashInfer's CUDA kernel in the ``flashinfer`` level's call; a test
checks it where it imports (a CUDA machine) and is skipped elsewhere.  The engine-shaped adapters
and references themselves (``vllm_style``, ``vllm_reference``, ...) live on the verification floor
and are re-exported here for 0.2's import path.
"""

from __future__ import annotations

from specref.core.backend import to_numpy
from specref.verification.levels.engines import (  # noqa: F401  0.2's import path
    check_ragged_layout,
    flashinfer_reference,
    flashinfer_style,
    vllm_reference,
    vllm_style,
)

__all__ = [
    "vllm_style",
    "flashinfer_style",
    "vllm_reference",
    "flashinfer_reference",
    "check_ragged_layout",
    "flashinfer_engine",
]


def flashinfer_engine(device: str = "cuda"):
    """FlashInfer's real kernel in the adapter's call (imports flashinfer and torch; CUDA only)."""
    import flashinfer  # noqa: F401 - optional: present on CUDA machines with FlashInfer installed
    import torch

    def kernel(draft_probs, draft_token_ids, target_probs, seed):
        t = lambda a, dt: torch.as_tensor(to_numpy(a)).to(device=device, dtype=dt)  # noqa: E731
        ids, acc, emitted = flashinfer.sampling.chain_speculative_sampling(
            t(draft_probs, torch.float32), t(draft_token_ids, torch.int32), t(target_probs, torch.float32),
            seed=int(seed) % (1 << 62), offset=0)
        return ids.cpu(), acc.cpu(), emitted.cpu()

    return kernel
