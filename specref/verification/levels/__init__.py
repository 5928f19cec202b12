"""The levels: each says how the oracle calls an implementation, which cases it runs, and how
it judges them, grouped by kind: :mod:`~specref.verification.levels.chain` (step, logits,
decoder), :mod:`~specref.verification.levels.batched` (batched, draft_and_verify and the engines'
calls), :mod:`~specref.verification.levels.trees` (sampled and greedy trees) and
:mod:`~specref.verification.levels.coins` (coin-fed kernels); :mod:`~specref.verification.levels.runner`
is the one case runner they share.

:data:`LEVELS` is the one registry, built here explicitly from each level module's own
``LEVELS`` tuple: every level is known once :mod:`specref.verification.oracle` (or this
package) is imported, with no import side effects.  :func:`register` adds a user's level: a
:class:`~specref.verification.running.level.Level` carries everything about itself, so a level
registered from outside specref is checked, planned and swept as specref's own are.
"""

from __future__ import annotations

from specref.core.errors import SpecrefError
from specref.verification.levels.batched.engines import LEVELS as _ENGINES
from specref.verification.levels.batched.mrv2 import LEVELS as _MRV2
from specref.verification.levels.batched.schedules import LEVELS as _SCHEDULES
from specref.verification.levels.batched.steps import LEVELS as _BATCHED
from specref.verification.levels.batched.vllm_sampler import LEVELS as _VLLM_SAMPLER
from specref.verification.levels.chain.programs import LEVELS as _CHAIN
from specref.verification.levels.coins.kernels import LEVELS as _COINS
from specref.verification.levels.coins.vllm_coins import LEVELS as _VLLM_COINS
from specref.verification.levels.trees.greedy import LEVELS as _GREEDY
from specref.verification.levels.trees.sampled import LEVELS as _TREES
from specref.verification.running.level import Level, missing_parts

__all__ = ["Level", "LEVELS", "register", "level_named"]

LEVELS: dict[str, Level] = {}
"""Every protocol level the oracle checks, by name (``check(name, fn)``, ``--level name``)."""


def register(level: Level) -> Level:
    """Add ``level`` to :data:`LEVELS`: SpecrefError when it is not a
    :class:`~specref.verification.running.level.Level`, when a part it needs is missing or
    malformed (naming the part), or when its name is registered already."""
    if not isinstance(level, Level):
        raise SpecrefError(f"level must be a specref.verification.levels.Level, got {level!r:.80}")
    bad = missing_parts(level)
    if bad:
        raise SpecrefError(f"level {getattr(level, 'name', None)!r} cannot be registered: missing or malformed "
                           f"part(s): {'; '.join(bad)}")
    if level.name in LEVELS:
        raise SpecrefError(f"level {level.name!r} is registered already")
    LEVELS[level.name] = level
    return level


def level_named(level, *, need: str = "level must be one of the registered levels") -> Level:
    """The registered level called ``level``, or ``level`` itself when it is a
    :class:`~specref.verification.running.level.Level` whose parts are all there; SpecrefError
    listing the registered names otherwise."""
    if isinstance(level, Level):
        bad = missing_parts(level)
        if bad:
            raise SpecrefError(f"level {level.name!r} has missing or malformed part(s): {'; '.join(bad)}")
        return level
    if not isinstance(level, str) or level not in LEVELS:
        raise SpecrefError(f"{need} ({', '.join(map(repr, LEVELS))}, or a Level object), got {level!r:.80}")
    return LEVELS[level]


for _level in _CHAIN + _BATCHED + _TREES + _ENGINES + _VLLM_SAMPLER + _COINS + _VLLM_COINS + _MRV2 + _GREEDY + _SCHEDULES:
    register(_level)
del _level
