"""The zoo: named wrong implementations, each changing one thing in the reference (SPEC §7):
chain-level bugs (:mod:`~specref.verification.zoo.chain`), engine-shaped batched bugs
(:mod:`~specref.verification.zoo.engines`), tree bugs (:mod:`~specref.verification.zoo.trees`),
cross-vocabulary mistakes (:mod:`~specref.verification.zoo.cross_vocab`) and implementations that
keep state between calls, each right on every case alone
(:mod:`~specref.verification.zoo.stateful`: ``stateful.entries()``, caught by the runner's state check),
slips of decoders that draft from heads or retrieve their drafts (:mod:`~specref.verification.zoo.drafting`,
:mod:`~specref.verification.zoo.retrieval`, SPEC §16) and schedule bugs of continuous batching
(:mod:`~specref.verification.zoo.schedules`, SPEC §17).

``specref.verification.zoo`` re-exports the chain zoo, so 0.2's ``zoo.entries()`` keeps working.
"""

from specref.verification.zoo.chain import *  # noqa: F401,F403
from specref.verification.zoo.chain import __all__  # noqa: F401
