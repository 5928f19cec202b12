"""The coin-fed levels, exact on every coin of its dtype's grid:

- :mod:`~specref.verification.levels.coins.kernels` -- ``batched_coins`` and ``tree_coins``:
  kernels handed their coins;
- :mod:`~specref.verification.levels.coins.vllm_coins` -- ``vllm_coins``: vLLM V1's own call with
  its coins handed in through ``sampling_metadata``.

``specref.verification.levels.coins`` re-exports
:mod:`~specref.verification.levels.coins.kernels`, so 0.2's
``from specref.verification.levels.coins import CoinCase`` keeps working.
"""

from specref.verification.levels.coins.kernels import *  # noqa: F401,F403
from specref.verification.levels.coins.kernels import __all__  # noqa: F401
