"""The registry of oracle levels: each level says how to call an implementation and
how to judge it.  :func:`specref.verification.oracle.check` looks levels up here.

The step, logits and decoder levels are registered by :mod:`specref.verification.oracle`;
other modules of this floor register their own levels with :func:`register`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specref.core.errors import SpecrefError

__all__ = ["Level", "LEVELS", "register"]


@dataclass(frozen=True)
class Level:
    """One protocol level: how the oracle calls an implementation and what it expects.

    ``run(level, fn, cases, settings) -> Report`` does the work; the step, logits and decoder
    levels share :func:`specref.verification.oracle.run_programs`; other levels bring their own.
    """

    name: str
    signature: str  # the call, for messages and the CLI's help
    cases: Callable[[], list]  # the default cases
    run: Callable  # (level, fn, cases, settings) -> Report
    tables: str | None = None  # the Case tables this level needs: "probs", "logits", or None for either
    program: Callable | None = None  # run_programs: (fn, case, time_limit) -> (program(rng, impl_rng), exact law)


LEVELS: dict[str, Level] = {}
"""Every protocol level the oracle checks, by name (``check(name, fn)``, ``--level name``)."""


def register(level: Level) -> Level:
    """Add a level to :data:`LEVELS` (a name may be registered once)."""
    if level.name in LEVELS:
        raise SpecrefError(f"level {level.name!r} is registered already")
    LEVELS[level.name] = level
    return level
