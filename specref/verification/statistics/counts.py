"""The statistical verifier (SPEC §6): black-box samples against an exact law.

When an implementation draws its own random numbers, specref cannot enumerate it;
it draws ``N`` outputs and compares their counts with the exact distribution ``p``
(the *null*).  Three tools, each reporting ``N`` and its statistical error:

- :func:`g_test` -- the likelihood-ratio (G) goodness-of-fit test, with the bins
  whose expected count is below ``min_expected`` pooled into one bin;
- :func:`tv_estimate` -- the plug-in total variation ``1/2 sum |p_hat - p|`` with a
  distribution-free confidence interval;
- :func:`samples_needed` -- the planner: how many samples make the G-test at level
  ``alpha`` reject, with probability ``power``, any law at TV >= ``tv`` from ``p``
  (``planned_power`` and ``detectable_tv`` are its other two directions).

:func:`compare_counts` runs the first two and states the verdict.

Counts and probabilities are small host vectors and the tests use ``scipy.stats``,
so everything here works on host NumPy copies (:func:`specref.core.backend.to_numpy`);
the arrays may come from any backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special as _special
from scipy import stats as _sps

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError, check_positive_int, check_prob_rows
from specref.core.numbers import is_exact

__all__ = [
    "PLAN_POWER",
    "planned_n",
    "GTestResult",
    "TVEstimate",
    "CountComparison",
    "g_test",
    "tv_estimate",
    "samples_needed",
    "planned_power",
    "detectable_tv",
    "compare_counts",
]


# ----------------------------------------------------------------------------- input checks


def _check_counts_probs(counts, probs) -> tuple[np.ndarray, np.ndarray]:
    """Host copies: counts [V] of non-negative integers (N >= 1), probs [V] a probability row."""
    c = to_numpy(counts)
    if c.ndim != 1 or c.shape[0] == 0:
        raise SpecrefError(f"counts must be a non-empty 1-D array, got shape {tuple(c.shape)}")
    if c.dtype.kind == "f":
        if not np.all(np.isfinite(c)) or np.any(c != np.round(c)):
            raise SpecrefError(f"counts must hold whole numbers, got {c[:8]!r}")
    elif c.dtype.kind not in "iu":
        raise SpecrefError(f"counts must hold integers, got dtype {c.dtype}")
    if np.any(c < 0):
        raise SpecrefError(f"counts[{int(np.argmax(c < 0))}] is negative: {c[np.argmax(c < 0)]}")
    n = sum(int(x) for x in c.tolist())  # exact: Python integers cannot overflow
    if n == 0:
        raise SpecrefError("counts are all zero: no samples (N = 0)")
    if n > MAX_COUNT_TOTAL:  # beyond it float64 (the statistic's arithmetic) no longer holds counts exactly
        raise SpecrefError(f"counts total N = {n}, over {MAX_COUNT_TOTAL} (2**53): too large to test in float64")
    c = c.astype(np.int64)
    p = check_prob_rows("probs", to_numpy(probs), shape=(c.shape[0],))
    p = p.astype(np.float64) if is_exact(p) else np.asarray(p, dtype=np.float64)
    return c, p


def _check_open_unit(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value < 1:
        raise SpecrefError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


MAX_COUNT_TOTAL = 2**53  # counts (and N) up to this are exact in float64


def _check_min_expected(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value < math.inf:
        raise SpecrefError(f"min_expected must be a positive finite number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- G-test


@dataclass(frozen=True)
class GTestResult:
    """A pooled G-test of observed counts against an exact law."""

    statistic: float  # G = 2 sum O ln(O / E) over the pooled bins (inf: a probability-0 outcome was observed)
    dof: int  # pooled bins - 1
    p_value: float  # chi-square(dof) survival function at G; 0.0 when impossible > 0
    n: int  # N, the number of samples
    n_bins: int  # bins after pooling (zero-probability outcomes excluded)
    n_pooled: int  # outcomes merged into the pooled bin (expected count < min_expected); 0: no pool
    pooled_expected: float  # expected count of the pooled bin (0.0 when there is none)
    impossible: int  # samples that fell on outcomes of probability 0 (any > 0 rejects outright)
    min_expected: float  # the pooling threshold used

    def rejects(self, alpha: float) -> bool:
        """True when the law is rejected at level ``alpha`` (``p_value <= alpha``)."""
        return self.p_value <= _check_open_unit("alpha", alpha)

    def __str__(self) -> str:
        if self.impossible:
            return (
                f"G-test: N = {self.n}, {self.impossible} sample(s) on probability-0 outcomes -> "
                "p = 0 (rejected outright)"
            )
        pool = f", {self.n_pooled} rare outcomes pooled (E = {self.pooled_expected:.3g})" if self.n_pooled else ""
        return f"G-test: N = {self.n}, G = {self.statistic:.4g}, dof = {self.dof}, p = {self.p_value:.3g}{pool}"


def g_test(counts, probs, *, min_expected: float = 5) -> GTestResult:
    """Likelihood-ratio (G) goodness-of-fit test of ``counts`` against the law ``probs``.

    counts [V] (integers), probs [V] (the exact law, the null) -> GTestResult

    Bins: outcomes with ``probs == 0`` are left out; a sample on one of them is
    impossible under the null, so the result is ``p_value = 0`` (``statistic = inf``)
    with the number of such samples in ``impossible``.  Outcomes whose expected count
    ``N * p`` is below ``min_expected`` are pooled into a single bin, so the
    chi-square approximation is not asked to cover tiny expected counts.  The pool is
    kept as its own bin even when its own expected count is below ``min_expected``:
    merging it into an ordinary bin would let an alternative move that bin's mass into
    the pool unseen, which would break the planner's bound (see :func:`samples_needed`).
    With a single bin left there is nothing to test: ``dof = 0``, ``p_value = 1``.

    ``G = 2 sum O ln(O/E)`` (what ``scipy.stats.power_divergence`` computes with
    ``lambda_="log-likelihood"``; written out here because that wrapper costs ~3 ms a
    call), referred to chi-square with ``bins - 1`` dof (``scipy.stats.chi2.sf``).
    """
    c, p = _check_counts_probs(counts, probs)
    m = _check_min_expected(min_expected)
    n = int(c.sum())
    support = p > 0
    impossible = int(c[~support].sum())
    p_pos = p[support] / p[support].sum()  # renormalize away the row's rounding so sum(E) == N
    c_pos = c[support]
    expected = n * p_pos
    rare = expected < m
    obs_bins = [c_pos[~rare]]
    exp_bins = [expected[~rare]]
    pooled_expected = 0.0
    if rare.any():
        pooled_expected = float(expected[rare].sum())
        obs_bins.append(np.array([c_pos[rare].sum()]))
        exp_bins.append(np.array([pooled_expected]))
    obs = np.concatenate(obs_bins)
    exp = np.concatenate(exp_bins)
    n_bins = int(obs.shape[0])
    dof = n_bins - 1
    common: dict[str, Any] = dict(
        dof=dof,
        n=n,
        n_bins=n_bins,
        n_pooled=int(rare.sum()),
        pooled_expected=pooled_expected,
        impossible=impossible,
        min_expected=m,
    )
    if impossible:
        return GTestResult(statistic=math.inf, p_value=0.0, **common)
    if dof == 0:
        return GTestResult(statistic=0.0, p_value=1.0, **common)
    # G = 2 sum O ln(O/E), with 0 ln 0 = 0; since sum O == sum E it equals 2 sum [O ln(O/E) - (O - E)] >= 0
    g = max(0.0, 2.0 * float(np.sum(_special.xlogy(obs, obs / exp))))
    return GTestResult(statistic=g, p_value=float(_sps.chi2.sf(g, dof)), **common)


# ----------------------------------------------------------------------------- TV estimate


@dataclass(frozen=True)
class TVEstimate:
    """Plug-in total variation between the sampled law and the exact one, with an interval."""

    estimate: float  # 1/2 sum |p_hat - p|, p_hat = counts / N
    lower: float  # the interval holds the true TV with probability >= confidence
    upper: float
    half_width: float  # the statistical error: estimate -/+ half_width, clipped to [0, 1]
    n: int  # N, the number of samples
    n_outcomes: int  # k, the number of outcomes (len(counts))
    confidence: float
    null_mean: float  # about what `estimate` averages when the sampler is exactly right (its bias)

    def __str__(self) -> str:
        return (
            f"TV = {self.estimate:.4g} +/- {self.half_width:.3g} "
            f"({100 * self.confidence:g}% interval [{self.lower:.4g}, {self.upper:.4g}], N = {self.n}; "
            f"a correct sampler gives about {self.null_mean:.2g})"
        )


def _l1_deviation_bound(k: int, n: int, delta: float) -> float:
    """eps with P(||p_hat - a||_1 >= eps) <= delta for N samples of any law a on k outcomes.

    The smaller of two distribution-free bounds (both depend on k, N, delta only, not
    on the data, so taking the smaller keeps the level):
    - Bretagnolle-Huber-Carol: P(||p_hat - a||_1 >= eps) <= (2^k - 2) exp(-N eps^2 / 2);
    - McDiarmid: ||p_hat - a||_1 moves by <= 2/N when one sample changes and
      E||p_hat - a||_1 <= sqrt((k - 1) / N), so eps = sqrt((k-1)/N) + sqrt(2 ln(1/delta) / N).
    """
    if k == 1:
        return 0.0
    log_sets = k * math.log(2.0) + math.log1p(-(2.0 ** (1 - k)))  # ln(2^k - 2) without overflow
    bhc = math.sqrt(2.0 * (log_sets + math.log(1.0 / delta)) / n)
    mcd = math.sqrt((k - 1) / n) + math.sqrt(2.0 * math.log(1.0 / delta) / n)
    return min(bhc, mcd)


def tv_estimate(counts, probs, *, confidence: float = 0.99) -> TVEstimate:
    """Total variation between the law that produced ``counts`` and ``probs``, with an interval.

    counts [V] (integers), probs [V] (the exact law) -> TVEstimate

    Point estimate: ``T = 1/2 sum |p_hat - p|`` with ``p_hat = counts / N``.
    Interval: by the triangle inequality ``|T - TV(a, p)| <= 1/2 ||p_hat - a||_1`` for
    the unknown sampled law ``a``, and ``||p_hat - a||_1 < eps`` with probability at
    least ``confidence`` (see :func:`_l1_deviation_bound`: the smaller of the
    Bretagnolle-Huber-Carol and McDiarmid bounds over ``k = len(counts)`` outcomes).
    So ``[T - eps/2, T + eps/2]`` clipped to [0, 1] covers the true TV with probability
    >= ``confidence`` for every N and every law -- no asymptotics, and conservative
    (the half-width shrinks like ``sqrt(k / N)``).

    ``T`` is biased upwards: for a correct sampler it is about
    ``null_mean = 1/2 sum sqrt(2 p (1 - p) / (pi N))`` (normal approximation), not 0.
    """
    c, p = _check_counts_probs(counts, probs)
    conf = _check_open_unit("confidence", confidence)
    n = int(c.sum())
    k = int(c.shape[0])
    est = 0.5 * float(np.abs(c / n - p).sum())
    half = 0.5 * _l1_deviation_bound(k, n, 1.0 - conf)
    null_mean = 0.5 * float(np.sqrt(2.0 * p * (1.0 - p) / (math.pi * n)).sum())
    return TVEstimate(
        estimate=est,
        lower=max(0.0, est - half),
        upper=min(1.0, est + half),
        half_width=half,
        n=n,
        n_outcomes=k,
        confidence=conf,
        null_mean=null_mean,
    )


# ----------------------------------------------------------------------------- planner


def _check_plan_args(tv, alpha, power, n_outcomes, min_expected, null):
    if isinstance(tv, bool) or not isinstance(tv, (int, float, np.floating)) or not 0 < tv <= 1:
        raise SpecrefError(f"tv must be a number in (0, 1], got {tv!r}")
    k = check_positive_int("n_outcomes", n_outcomes, minimum=2)
    if null is not None:
        null = check_prob_rows("null", to_numpy(null), shape=(k,))
        null = null.astype(np.float64) if is_exact(null) else np.asarray(null, dtype=np.float64)
        null = null[null > 0] / null[null > 0].sum()
    return (
        float(tv),
        _check_open_unit("alpha", alpha),
        _check_open_unit("power", power),
        k,
        _check_min_expected(min_expected),
        null,
    )


def _power(n: int, tv: float, alpha: float, k: int, m: float, null) -> float:
    """Planned power with n samples: P(ncx2(dof, 4 n visible^2) > chi2.isf(alpha, dof))."""
    if null is not None and len(null) == 1:
        # one possible outcome: every other outcome is impossible, and one sample on it
        # rejects outright; an alternative at TV >= tv puts mass >= tv there
        return 1.0 - (1.0 - min(tv, 1.0)) ** n  # a TV above 1 (the planner's probe) is a TV of 1
    if null is None:
        hidden = m * k / n  # the pool's null mass is below m k / N, whatever the null
        dof = k - 1  # the most bins pooling can leave
    else:
        rare = n * null < m
        hidden = float(null[rare].sum())
        dof = int((~rare).sum()) + (1 if rare.any() else 0) - 1
    # moves of mass inside the pool are invisible: the pooled test sees TV >= tv - hidden
    visible = tv - hidden
    if visible <= 0 or dof < 1:
        return 0.0
    crit = _sps.chi2.isf(alpha, dof)
    return float(_sps.ncx2.sf(crit, dof, 4.0 * n * visible * visible))


def planned_power(
    n: int, tv: float, alpha: float, n_outcomes: int, *, min_expected: float = 5, null=None
) -> float:
    """The power :func:`samples_needed` promises with ``n`` samples (same assumptions)."""
    n = check_positive_int("n", n)
    tv, alpha, _, k, m, null = _check_plan_args(tv, alpha, 0.5, n_outcomes, min_expected, null)
    return _power(n, tv, alpha, k, m, null)


def samples_needed(
    tv: float, alpha: float, power: float, n_outcomes: int, *, min_expected: float = 5, null=None
) -> int:
    """Smallest N with which the pooled G-test at level ``alpha`` rejects, with probability
    at least ``power``, every law at total variation >= ``tv`` from the null.

    ``n_outcomes`` is the number of outcomes (counting outcomes of null probability 0
    is allowed and only makes the plan more conservative; a sample on one of them
    rejects outright).  ``null`` (optional, [n_outcomes]) is the exact null law; without
    it the plan holds for every null with ``n_outcomes`` outcomes, with it the plan
    uses that null's actual pooling and is tighter.

    Derivation and assumptions:

    1. Under an alternative ``a`` the statistic is approximately noncentral chi-square
       with ``dof`` degrees of freedom and noncentrality ``lam = N chi2(a || p)``,
       ``chi2(a || p) = sum (a - p)^2 / p`` (or ``2 N KL(a || p)`` for G; the two agree
       to first order).  This is the standard local-alternative approximation -- the
       one assumption not proved here; the simulation tests check it.
    2. Least favourable alternative: for every null, ``chi2(a || p) >= 4 tv^2`` by
       Cauchy-Schwarz (``2 tv = sum |a - p|/sqrt(p) sqrt(p)``), and ``2 KL >= 4 tv^2``
       by Pinsker; equality when ``a = p (1 +/- 2 tv)`` on two halves of null mass 1/2.
       So ``lam >= 4 N tv^2`` for *every* alternative, and power grows with ``lam``.
    3. At fixed ``lam`` power falls as ``dof`` grows (Das Gupta & Perlman 1974).  Without
       ``null`` the plan uses the largest ``dof`` pooling can leave, ``n_outcomes - 1``;
       with ``null``, the pooled ``dof`` that :func:`g_test` will use at that N.
    4. Pooling hides moves of mass among the pooled outcomes (at most their null mass:
       ``TV(pooled a, pooled p) >= tv - p(pool)``).  Without ``null``,
       ``p(pool) < min_expected * n_outcomes / N``; with ``null``, ``p(pool)`` is exact.

    Planned power ``= P(ncx2(dof, 4 N (tv - p(pool))^2) > chi2.isf(alpha, dof))``.  It is
    non-decreasing in N without ``null``; with ``null`` it can dip slightly where an
    outcome leaves the pool, so the N returned (found by doubling and bisection) always
    reaches ``power`` but may exceed the smallest such N by a little.  The plan is tight
    for the least favourable alternative and conservative for others (moving mass
    ``tv`` between two of k equally likely outcomes has ``chi2 = 2 k tv^2``).
    """
    tv, alpha, power, k, m, null = _check_plan_args(tv, alpha, power, n_outcomes, min_expected, null)
    hi = 1
    while _power(hi, tv, alpha, k, m, null) < power:
        hi *= 2
        if hi > 2**48:
            raise SpecrefError(f"no sample size reaches power {power} for tv={tv} with n_outcomes={k}")
    lo = hi // 2  # power(lo) < target (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _power(mid, tv, alpha, k, m, null) >= power:
            hi = mid
        else:
            lo = mid
    return hi


PLAN_POWER = 0.9
"""The power with which a statistical check's N detects a total variation of ``detect_tv``."""


def planned_n(settings, null, *, alpha: float | None = None) -> int:
    """N a statistical check plans for a law ``null`` (its last entries may be outcomes the target
    never makes, of probability 0): ``settings.samples`` when given, else the :func:`samples_needed`
    to detect TV >= ``settings.detect_tv`` with power :data:`PLAN_POWER` at ``alpha`` (by default
    ``settings.alpha``).  ``settings`` is a :class:`~specref.verification.running.report.Settings`."""
    if settings.samples:
        return settings.samples
    return samples_needed(settings.detect_tv, settings.alpha if alpha is None else alpha, PLAN_POWER, len(null),
                          null=null)


def detectable_tv(
    n: int, alpha: float, power: float, n_outcomes: int, *, min_expected: float = 5, null=None
) -> float:
    """Smallest TV that ``n`` samples detect at level ``alpha`` with ``power`` (planner inverted).

    Within 1e-9 relative; ``math.inf`` when ``n`` samples leave nothing to test
    (every outcome pooled).
    """
    n = check_positive_int("n", n)
    _, alpha, power, k, m, null = _check_plan_args(0.5, alpha, power, n_outcomes, min_expected, null)
    if _power(n, 1.0 + n, alpha, k, m, null) < power:  # even an absurd TV is not seen
        return math.inf
    lo, hi = 0.0, 1.0
    while _power(n, hi, alpha, k, m, null) < power:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        if _power(n, mid, alpha, k, m, null) >= power:
            hi = mid
        else:
            lo = mid
    return hi


# ----------------------------------------------------------------------------- report


@dataclass(frozen=True)
class CountComparison:
    """Samples against an exact law: the G-test, the TV estimate, and the verdict."""

    g: GTestResult
    tv: TVEstimate
    alpha: float  # level of the G-test

    @property
    def rejected(self) -> bool:
        """True when the G-test rejects the exact law at level ``alpha``."""
        return self.g.rejects(self.alpha)

    def __str__(self) -> str:
        verdict = "DIFFERS from" if self.rejected else "consistent with"
        return f"samples {verdict} the exact law at alpha = {self.alpha:g}\n  {self.g}\n  {self.tv}"


def compare_counts(
    counts, probs, *, alpha: float = 1e-6, min_expected: float = 5, confidence: float = 0.99
) -> CountComparison:
    """:func:`g_test` and :func:`tv_estimate` of ``counts`` against ``probs``, with the verdict."""
    alpha = _check_open_unit("alpha", alpha)
    return CountComparison(
        g=g_test(counts, probs, min_expected=min_expected),
        tv=tv_estimate(counts, probs, confidence=confidence),
        alpha=alpha,
    )
