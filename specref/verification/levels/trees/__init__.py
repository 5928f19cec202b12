"""The tree levels:

- :mod:`~specref.verification.levels.trees.sampled` -- ``tree`` and ``tree_batch``: sampled tree
  verification, exactly or statistically, and dense ``[B, N]`` batches of trees;
- :mod:`~specref.verification.levels.trees.greedy` -- ``greedy_tree`` and ``greedy_tree_step``:
  the argmax path, exactly, with declared ties.

``specref.verification.levels.trees`` re-exports
:mod:`~specref.verification.levels.trees.sampled`, so 0.2's
``from specref.verification.levels.trees import TreeCase`` keeps working.
"""

from specref.verification.levels.trees.sampled import *  # noqa: F401,F403
from specref.verification.levels.trees.sampled import LEVELS, __all__  # noqa: F401
