"""Verification, built on the loops and the numerics.  Its rooms, from the bottom up (each
imports only the rooms below it; ``pyproject.toml`` states the contract):

- :mod:`~specref.verification.laws` -- exact laws by enumeration, exact comparison, the optimum;
- :mod:`~specref.verification.running` -- calling implementations, the case runner, reports;
- :mod:`~specref.verification.cases` -- the oracle's inputs as plain data, rules, strategies;
- :mod:`~specref.verification.statistics` -- tests, the planner, shards, efficiency;
- :mod:`~specref.verification.levels` -- every level and the one registry of them;
- :mod:`~specref.verification.oracle` -- ``check`` and one shorthand per level;
- :mod:`~specref.verification.campaigns`, :mod:`~specref.verification.zoo` -- plans and sweeps;
  the known bugs.

0.2's flat module paths (``specref.verification.stats``, ``...batched``, ...) still import, with a
``DeprecationWarning`` that names the new path (:mod:`specref.verification._moved`).
"""

from specref.verification import _moved

_moved.install()
