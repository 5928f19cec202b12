"""What a level is: how the oracle calls an implementation and how it judges it.

The registry of every level is :data:`specref.verification.levels.LEVELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


__all__ = ["Level"]


@dataclass(frozen=True)
class Level:
    """One protocol level: how the oracle calls an implementation and what it expects.

    ``run(level, fn, cases, settings) -> Report`` does the work; the step, logits and decoder
    levels share :func:`specref.verification.levels.chain.run_programs`; other levels bring their own.
    """

    name: str
    signature: str  # the call, for messages and the CLI's help
    cases: Callable[[], list]  # the default cases
    run: Callable  # (level, fn, cases, settings) -> Report
    tables: str | None = None  # the Case tables this level needs: "probs", "logits", or None for either
    program: Callable | None = None  # run_programs: (fn, case, time_limit) -> (program(rng, impl_rng), exact law)
