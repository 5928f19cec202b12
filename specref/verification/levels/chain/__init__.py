"""The chain levels: ``step``, ``logits`` and ``decoder`` (SPEC §3-§4), programs whose exact law
is enumerated or sampled (:mod:`~specref.verification.levels.chain.programs`).

``specref.verification.levels.chain`` re-exports
:mod:`~specref.verification.levels.chain.programs`, so 0.2's
``from specref.verification.levels.chain import declare_batch`` keeps working.
"""

from specref.verification.levels.chain.programs import *  # noqa: F401,F403
from specref.verification.levels.chain.programs import __all__  # noqa: F401
