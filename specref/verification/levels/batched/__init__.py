"""The batched levels and the engines' calls judged by them:

- :mod:`~specref.verification.levels.batched.steps` -- ``batched`` and ``draft_and_verify``:
  batched ragged steps, closed-form row laws, low-dimensional statistics;
- :mod:`~specref.verification.levels.batched.engines` -- ``vllm`` and ``flashinfer``: vLLM V1's
  and FlashInfer's calls;
- :mod:`~specref.verification.levels.batched.mrv2` -- ``mrv2``: vLLM Model Runner V2's call.

``specref.verification.levels.batched`` re-exports
:mod:`~specref.verification.levels.batched.steps`, so 0.2's
``from specref.verification.levels.batched import BatchedCase`` keeps working.
"""

from specref.verification.levels.batched.steps import *  # noqa: F401,F403
from specref.verification.levels.batched.steps import LEVELS, __all__  # noqa: F401
