"""An outside implementation under the oracle: Hugging Face transformers' speculative sampling.

Assisted generation in transformers (``model.generate(..., assistant_model=draft,
do_sample=True)``) accepts and resamples draft tokens in one private function,
``transformers.generation.utils._speculative_sampling`` -- Leviathan et al. 2022,
Algorithm 1 (SPEC §3), written in PyTorch.  :func:`hf_speculative_step` puts that
function behind specref's probability-level protocol, so that
:func:`specref.verification.oracle.check_step` can judge it in statistical mode (SPEC §6)::

    from specref.adapters.hf import hf_speculative_step
    from specref.verification.oracle import check_step
    print(check_step(hf_speculative_step, mode="statistical"))

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.

What the function expects, and how the adapter feeds it (read from its source in
every supported release):

- ``candidate_logits [1, K, V]`` (draft) and ``new_logits [1, K+1, V]`` (target) are
  logits *after* the logits processors: it takes ``softmax`` of them itself and
  applies no sampling rule.  In ``generate`` they are float32 (the target's logits
  are cast with ``.to(torch.float32)`` before the processors run).  The adapter hands
  it ``log p`` and ``log q`` as float32 (``-inf`` where a probability is 0), whose
  softmax is the row again up to float32 rounding.
- ``candidate_input_ids [1, n]`` ends with the K draft tokens (only the last
  ``candidate_length = K`` are read); the adapter passes just those.
- it returns ``(valid_tokens [1, n_matches + 1], n_matches)``; the adapter returns
  ``valid_tokens[0]`` as a list of 1..K+1 ints.

Signature history (``pip download transformers==X`` and ``inspect``):

- < 4.38: no such function;
- 4.38 - 4.39: ``(..., new_logits, last_assistant_token_is_eos, max_matches)`` -- not supported;
- 4.40 - 5.13: ``(..., new_logits, is_done_candidate)``;
- 5.14 - 5.17: ``(..., new_logits, is_done_candidate, assistant_ensemble_weight=None)``;
- 5.18 - 5.24: ``(..., new_logits, assistant_ensemble_weight=None)``.

``is_done_candidate`` (the last draft token is EOS or hits the length limit) is
passed as False: the stop rule belongs to the decoding loop, not to the step.
``assistant_ensemble_weight`` (DIVERSE ensemble verification, an approximate method
that HF documents as biased) is left at None -- the distribution-preserving path --
unless the caller asks for it.  Releases outside :data:`SUPPORTED_TRANSFORMERS` are
refused: the function is private and its signature has changed three times.

One deviation from SPEC §3, read from the source and shown with a found seed in
``tests/test_hf.py``: the accept test is ``r_i <= p_i / q_i`` with ``r_i = torch.rand``
in [0, 1), so a draft token with ``p(x_i) = 0`` is accepted when ``r_i == 0.0`` --
probability 2**-24 per such position in float32 (2**-53 in float64).  In ``generate``
that happens whenever top-k/top-p leave the target a zero where the draft proposed a
token.  It moves the law by at most 2**-24 per position, far below what sampling can see.

Randomness: the function draws ``torch.rand_like`` and ``torch.multinomial`` from
torch's *global* CPU generator and takes no generator argument, so a seed can only
reach it through that global state.  The adapter seeds it with the integer ``rng``
inside :func:`torch.random.fork_rng`, which restores the caller's generator state on
exit -- the global seeding is a necessity of wrapping this function, not a pattern
to copy.  torch's CPU generator (mt19937) uses only the low 32 bits of a seed.

torch and transformers are imported inside the functions, so ``import specref.adapters.hf``
works without them; calling the adapter without them raises ``ImportError`` naming
the ``hf`` extra (``pip install 'specref[hf]'``).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from specref.core.step import check_step_inputs

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "supported_versions",
    "installed_versions",
    "hf_speculative_step",
    "to_hf_logits",
]

SUPPORTED_TRANSFORMERS = (4, 40), (5, 25)
"""``(lowest, first excluded)`` (major, minor) releases of transformers: ``>=4.40,<5.25``."""

_EXTRA = "pip install 'specref[hf]'"


def supported_versions() -> str:
    """The supported transformers releases as a requirement string: ``">=4.40,<5.25"``."""
    (a, b), (c, d) = SUPPORTED_TRANSFORMERS
    return f">={a}.{b},<{c}.{d}"


def installed_versions() -> dict:
    """``{"transformers": ..., "torch": ...}`` as installed, after checking both are usable.

    Raises ``ImportError`` when either cannot be imported or transformers is outside
    :func:`supported_versions`; the message says how to install a supported one.
    """
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError(
            f"specref.adapters.hf needs torch and transformers{supported_versions()} ({e}): {_EXTRA}"
        ) from e
    version = transformers.__version__
    match = re.match(r"(\d+)\.(\d+)", version)
    lowest, excluded = SUPPORTED_TRANSFORMERS
    if match is None or not lowest <= (int(match[1]), int(match[2])) < excluded:
        raise ImportError(
            f"specref.adapters.hf supports transformers{supported_versions()}, found {version}: "
            f"_speculative_sampling is private and its signature changes between releases; {_EXTRA}"
        )
    return {"transformers": version, "torch": torch.__version__}


@functools.cache  # the import and signature checks cost ~15 ms: once per process
def _speculative_sampling():
    """The checked function and the names of its parameters."""
    installed_versions()
    import inspect

    from transformers.generation.utils import _speculative_sampling as fn

    return fn, tuple(inspect.signature(fn).parameters)


def to_hf_logits(rows, dtype="float32"):
    """Probability rows ``[n, V]`` -> a torch tensor ``[1, n, V]`` of log-probabilities.

    ``softmax(log p) = p`` (up to rounding in ``dtype``); a probability of 0 becomes
    ``-inf``, whose softmax weight is exactly 0, as a masking logits processor leaves it.
    """
    import torch

    with np.errstate(divide="ignore"):  # log 0 = -inf is the intended masked logit
        logp = np.log(np.asarray(rows, dtype=np.float64))
    return torch.from_numpy(logp.astype(dtype))[None]  # [n, V] -> [1, n, V]


def hf_speculative_step(p_target, q_draft, draft_tokens, rng, *, dtype="float32",
                        assistant_ensemble_weight=None) -> list[int]:
    """One speculative step by ``transformers.generation.utils._speculative_sampling``.

    - ``p_target``: ``[K+1, V]`` target distributions (after all sampling rules).
    - ``q_draft``: ``[K, V]`` draft distributions ``draft_tokens`` were drawn from.
    - ``draft_tokens``: ``[K]`` ints.
    - ``rng``: an integer seed for torch's global CPU generator (statistical mode; the
      caller's generator state is restored afterwards).
    - ``dtype``: the logits' dtype; ``"float32"`` is what ``generate`` hands it.
    - ``assistant_ensemble_weight``: None (the lossless algorithm) or HF's DIVERSE weight
      ``w`` in (0, 1) -- an approximate method, in transformers >= 5.14.

    Returns the emitted tokens, 1 to K+1 of them.
    """
    fn, params = _speculative_sampling()
    import torch

    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise TypeError(f"rng must be an integer seed (torch draws its own random numbers), got {rng!r}")
    p_target, q_draft, tokens = check_step_inputs(p_target, q_draft, draft_tokens)
    K = q_draft.shape[0]
    kwargs: dict[str, object] = {}
    if "is_done_candidate" in params:  # 4.40 - 5.17: the loop's stop rule, not the step's
        kwargs["is_done_candidate"] = False
    if assistant_ensemble_weight is not None:
        if "assistant_ensemble_weight" not in params:
            raise TypeError("assistant_ensemble_weight needs transformers >= 5.14")
        kwargs["assistant_ensemble_weight"] = float(assistant_ensemble_weight)
    candidate_logits = to_hf_logits(q_draft, dtype)  # [1, K, V]
    new_logits = to_hf_logits(p_target, dtype)  # [1, K+1, V]
    candidate_ids = torch.tensor([list(tokens)], dtype=torch.long)  # [1, K]
    threads = torch.get_num_threads()
    # [1, K+1, V] tensors are too small to share: the intra-op pool only adds overhead (~5x on 2 cores)
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's global generator state comes back on exit
            torch.default_generator.manual_seed(int(rng))  # not torch.manual_seed: that also seeds every device (~0.3 ms)
            valid_tokens, _ = fn(candidate_ids, candidate_logits, K, new_logits, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return [int(t) for t in valid_tokens[0].tolist()]  # [1, n_matches + 1] -> 1..K+1 ints
