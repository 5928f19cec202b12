"""What a check reports: the settings it ran under, a verdict per case, and the report.

Plain data shared by every oracle level (:mod:`specref.verification.oracle`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from specref.core.errors import SpecrefError, check_positive_int

__all__ = ["Settings", "CaseResult", "Report", "OK", "DIFFERS", "RAISED", "INVALID", "TIMEOUT", "ARITHMETIC"]

OK, DIFFERS, RAISED, INVALID, TIMEOUT, ARITHMETIC = (
    "ok", "differs", "raised", "invalid output", "timeout", "lazy-uniform arithmetic",
)


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """How a check runs; every field is validated here, once."""

    mode: str = "exact"  # "exact" (enumerate the rng) or "statistical" (rng is an int seed)
    samples: int | None = None  # statistical mode: N per case (None: planned for detect_tv)
    seed: int = 0  # statistical mode: case i uses seed + i
    alpha: float = 1e-6  # statistical mode: the G-test's level
    detect_tv: float = 0.01  # statistical mode: the TV that N is planned to detect with power 0.9
    tolerance: float = 1e-9  # exact mode: TV above this differs
    time_limit: float = 10.0  # seconds per call of the implementation

    def __post_init__(self):
        if self.mode not in ("exact", "statistical"):
            raise SpecrefError(f"mode must be 'exact' or 'statistical', got {self.mode!r}")
        if self.samples is not None:
            check_positive_int("samples", self.samples)
        check_positive_int("seed", self.seed, minimum=0)
        for name, upper in (("alpha", 1), ("detect_tv", 1), ("tolerance", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < upper:
                raise SpecrefError(f"{name} must be a number in (0, {upper}), got {value!r}")
        t = self.time_limit
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise SpecrefError(f"time_limit must be a positive finite number of seconds, got {t!r}")


# ---------------------------------------------------------------- results


@dataclass
class CaseResult:
    """The verdict on one case."""

    case: object  # the Case (or a level's own case type) the verdict is about
    status: str  # ok / differs / raised / invalid output / timeout / lazy-uniform arithmetic
    tv: float | Fraction | None = None  # exact TV, or the plug-in estimate in statistical mode
    detail: str = ""  # the error, or the outputs that differ most
    n_samples: int | None = None  # statistical mode: N
    p_value: float | None = None  # statistical mode: the G-test's p-value
    tv_interval: tuple | None = None  # statistical mode: confidence interval of the TV

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class Report:
    """What a check found: the verdict, the worst TV, a counterexample and a table per case."""

    level: str
    mode: str
    results: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def worst_tv(self):
        tvs = [r.tv for r in self.results if r.tv is not None]
        return max(tvs) if tvs else None

    @property
    def counterexample(self):
        """The failing case with the largest TV (errors first), or None when all pass."""
        bad = [r for r in self.results if not r.ok]
        if not bad:
            return None
        return max(bad, key=lambda r: (r.tv is None, r.tv or 0)).case

    def table(self) -> str:
        lines = [f"{'case':<24} {'status':<24} {'TV':>12}  detail"]
        for r in self.results:
            tv = "-" if r.tv is None else f"{float(r.tv):.3g}"
            extra = f"N={r.n_samples}, p={r.p_value:.2g}; " if r.n_samples else ""
            lines.append(f"{r.case.name:<24} {r.status:<24} {tv:>12}  {extra}{r.detail}")
        return "\n".join(lines)

    def __str__(self):
        verdict = "preserves the target distribution" if self.ok else (
            f"DIFFERS from the target distribution (worst TV {float(self.worst_tv or 0):.3g})"
            if self.worst_tv else "FAILS (see statuses)"
        )
        text = f"{self.level}-level check, {self.mode} mode: {verdict}\n{self.table()}"
        if self.counterexample is not None:
            text += f"\ncounterexample: {self.counterexample!r}"
        return text
