"""The levels: each says how the oracle calls an implementation, which cases it runs, and how
it judges them -- chain (step, logits, decoder), batched, tree, and the engines' calls.

:data:`LEVELS` is the one registry, built here explicitly from each level module's own
``LEVELS`` tuple: every level is known once :mod:`specref.verification.oracle` (or this
package) is imported, with no import side effects.  :func:`register` adds a user's level.
"""

from __future__ import annotations

from specref.core.errors import SpecrefError
from specref.verification.levels import batched, chain, coins, engine_coins, engines, greedy, mrv2, trees
from specref.verification.running.level import Level

__all__ = ["Level", "LEVELS", "register"]

LEVELS: dict[str, Level] = {}
"""Every protocol level the oracle checks, by name (``check(name, fn)``, ``--level name``)."""


def register(level: Level) -> Level:
    """Add a level to :data:`LEVELS` (a name may be registered once)."""
    if not isinstance(level, Level):
        raise SpecrefError(f"level must be a specref.verification.levels.Level, got {level!r:.80}")
    if level.name in LEVELS:
        raise SpecrefError(f"level {level.name!r} is registered already")
    LEVELS[level.name] = level
    return level


for _level in chain.LEVELS + batched.LEVELS + trees.LEVELS + engines.LEVELS + coins.LEVELS + engine_coins.LEVELS + mrv2.LEVELS + greedy.LEVELS:
    register(_level)
del _level
