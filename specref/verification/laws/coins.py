"""Coins in, exact out: the exact law of a kernel that is handed its randomness as float coins.

Engine kernels take their randomness as float tensors (uniform coins ``[B, K]``, ``[T]``) and do
arithmetic on them (``coin * q < p``, ``u * total``, ``1 - u``), so the lazy uniforms of
:mod:`specref.verification.laws.enumeration` cannot stand in for them.  :func:`coin_law` runs such
a kernel on concrete coins instead and recovers its law from the breakpoints of its output.

The model.  ``kernel(coins) -> output`` is deterministic; ``coins`` is a float array of ``n``
independent coins, each uniform on the grid ``{k 2^-m : 0 <= k < 2^m}`` -- the values a real RNG
of the coin dtype produces (``m = 24`` for float32: ``torch.rand``, ``curand``; ``m = 53`` for
float64: ``numpy.random.Generator.random``).  Each grid point has mass ``2^-m``, so the law is a
finite sum and the inclusive comparison ``u <= 0`` has probability ``2^-m``, not 0.  ``bits``
sets ``m`` (at most the dtype's: a coarser grid, for brute-force checks of the method).

The method (recursive partition).  Coin ``d`` is searched with the coins before it fixed at the
representatives of their intervals and the coins after it fixed at one generic probe value
(``0.618...``, on no dyadic threshold):

1. probe it at a uniform grid of ``probes`` points, at 0 and at the largest coin below 1, and at
   every candidate threshold ``t`` the caller names (the grid point ``c = ceil(t 2^m)`` -- ``t``
   itself when ``t`` is a grid point -- and the grid points just below and above it, ``c - 1``
   and ``c + 1``);
2. between consecutive probes whose outputs differ, bisect down to adjacent grid points (the
   dtype's resolution; in ``[1/2, 1)`` these are adjacent floats, ``np.nextafter``): each
   adjacent pair with different outputs is a breakpoint;
3. the breakpoints cut ``[0, 1)`` into intervals; recurse into each with coin ``d`` at its
   midpoint (its representative).

A leaf is a cell, a product of one interval per coin; its output is the kernel's output at the
representatives.  An output's probability is the sum over its cells of the product of the
intervals' lengths (grid points in the interval times ``2^-m``): a Fraction, exact given the
breakpoints.

The assumption, and what is checked of it.  The output must be piecewise constant on a tree of
boxes: coin ``d``'s breakpoints may depend on which intervals the earlier coins lie in, but not
on their exact values nor on the later coins.  Speculative-decoding kernels have that shape
(a coin is compared with thresholds that the earlier outcomes choose).  Checked where cheap,
else :class:`NotPiecewiseConstant` names the coin and the cell:

- every interval's two ends agree by construction; its midpoint is evaluated and must agree too
  (a disagreement is a piece the probes missed, or no pieces at all);
- coin ``d`` has at most ``max_pieces`` pieces (a kernel whose output follows the coin's value);
- each cell's low corner (every coin at its interval's first point) and high corner (every coin
  at its last point) give the cell's output (``check=True``).  An exponential race
  (``argmax p / -log u`` over one coin per token) fails this: its regions are not boxes, and it
  is outside the method.

The order.  Coins are searched in index order, or in ``order`` (a permutation: ``order[j]`` is the
coin searched ``j``-th); cells, laws and messages keep the kernel's own indices.  The coins are
i.i.d., so the law does not depend on the order, but the assumption does: a kernel whose
breakpoints in one coin move with a later coin passes only in an order that searches that coin
first.

The bound, honestly (the resolution).  A piece of coin ``d`` narrower than the probe spacing
``1/probes`` with the same output on both sides (``A B A``), and with no candidate inside, can be
missed; the midpoint check finds it only by chance.  :attr:`CoinLaw.spacing` records ``probes`` and
:func:`resolution_text` writes the spacing, so that a verdict can state the resolution it had.
Bisection does not miss pieces between probes whose outputs differ when the output is monotone in
the coin (an inverse-CDF draw: the token index grows with ``u``; an acceptance test: accept below,
reject above).  The candidates close the gap for speculative-decoding kernels: every breakpoint of
a correct kernel, and of the boundary bugs, lies at (a grid neighbour of) 0, the largest coin, an
acceptance threshold ``min(1, p/q)`` or a normalised CDF partial sum of the residual, bonus or
draft row -- the values the reference compares the coin with -- so with those as candidates every
cell's ends are probed.  The cost is reported: :attr:`CoinLaw.evaluations` kernel calls, of which
:attr:`CoinLaw.probes` probe points, :attr:`CoinLaw.bisections` bisection steps and
:attr:`CoinLaw.checks` assumption checks.
"""

from __future__ import annotations

import math
import numbers
import operator
import time
from fractions import Fraction
from typing import Any, Callable, Hashable, Iterable, cast

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int
from specref.verification.laws.enumeration import Law

__all__ = [
    "COIN_BITS",
    "CoinLaw",
    "NotPiecewiseConstant",
    "CoinBudgetError",
    "coin_law",
    "grid_bits",
    "grid_value",
    "describe_cell",
    "resolution_text",
]

COIN_BITS = {"float32": 24, "float64": 53}  # real RNGs' coins: k 2^-24 (float32) and k 2^-53 (float64)
DEFAULT_PROBES = 16  # uniform probe points per coin search
DEFAULT_MAX_PIECES = 1024  # pieces of one coin in one search before the kernel is declared not piecewise constant
DEFAULT_MAX_EVALS = 10**6  # kernel calls before coin_law gives up
_GENERIC = 0.6180339887498949  # later coins are probed here: a value no dyadic threshold sits on


class NotPiecewiseConstant(SpecrefError):
    """The kernel's output is not piecewise constant on boxes of coins (or a piece was missed)."""


class CoinBudgetError(SpecrefError):
    """coin_law ran over ``max_evals`` kernel calls."""


def _show(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def grid_bits(dtype, bits=None) -> int:
    """The grid ``m`` of a coin dtype (24 for float32, 53 for float64), or ``bits`` checked against it."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in COIN_BITS:
        raise SpecrefError(f"dtype must be float32 or float64 (the coins' dtype), got {_show(dtype)}")
    top = COIN_BITS[name]
    if bits is None:
        return top
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= top:
        raise SpecrefError(f"bits must be an integer in 1..{top} for {name} coins (coins k 2^-bits), got {_show(bits)}")
    return int(bits)


def resolution_text(probes: int) -> str:
    """The probe spacing ``1/probes`` in words: ``2^-k`` when ``probes = 2^k``, else ``1/probes``."""
    return f"2^-{probes.bit_length() - 1}" if probes & (probes - 1) == 0 else f"1/{probes}"


def grid_value(k: int, bits: int) -> Fraction:
    """The coin ``k 2^-bits`` as an exact Fraction."""
    return Fraction(k, 1 << bits)


def _coin_text(k: int, bits: int) -> str:
    v = k / (1 << bits)
    if k == 0:
        return "0"
    if k == (1 << bits) - 1:
        return f"1 - 2^-{bits}"
    return repr(v)


def describe_cell(cell, bits: int, names: Callable[[int], str] | None = None, *, full: bool = False) -> str:
    """A cell ``((lo, hi), ...)`` of grid intervals in words; coins on their whole range are left out
    unless ``full``.  A one-point interval reads ``name = value (one grid point)``."""
    names = names or (lambda d: f"coins[{d}]")
    n = 1 << bits
    parts = []
    for d, (lo, hi) in enumerate(cell):
        if (lo, hi) == (0, n) and not full:
            continue
        if hi - lo == 1:
            parts.append(f"{names(d)} = {_coin_text(lo, bits)} (one grid point)")
        else:
            parts.append(f"{names(d)} in [{_coin_text(lo, bits)}, {_coin_text(hi, bits) if hi < n else '1'})")
    return ", ".join(parts) if parts else "every coin anywhere"


class CoinLaw(Law):
    """The exact law of a coin-fed kernel, with the cells it came from and the cost of finding them.

    ``cells``: ``[(((lo, hi), ...) one grid interval per coin, output)]``, the leaves of the partition;
    ``evaluations``: distinct kernel calls, ``probes + bisections + checks``: ``probes`` at probe points
    (the uniform grid, 0, the largest coin and the candidates' neighbours, over every search),
    ``bisections`` bisecting, ``checks`` checking the assumption (midpoints, corners);
    ``searches``: coin searches (nodes of the partition tree); ``bits``, ``dtype``, ``n_coins``;
    ``seconds``: wall time; ``spacing``: the uniform probe points per search (the resolution is
    ``1/spacing``); ``order``: the coins' search order (None: index order).  ``paths`` (of
    :class:`Law`) is ``evaluations``.
    """

    def __init__(self, probs=(), *, cells=(), evaluations=0, probes=0, bisections=0, checks=0, searches=0,
                 bits=53, dtype="float64", n_coins=0, seconds=0.0, spacing=DEFAULT_PROBES, order=None):
        super().__init__(probs, paths=evaluations, states=1)
        self.cells = list(cells)
        self.spacing, self.order = spacing, order
        self.evaluations, self.probes, self.bisections, self.checks = evaluations, probes, bisections, checks
        self.searches, self.bits, self.dtype, self.n_coins, self.seconds = searches, bits, dtype, n_coins, seconds

    def cells_for(self, output) -> list:
        """The cells whose output is ``output``, narrowest first (fewest grid points)."""
        mine = [c for c, o in self.cells if o == output]
        return sorted(mine, key=lambda c: math.prod(hi - lo for lo, hi in c))

    def narrow_cells(self, width: int = 1) -> list:
        """``(cell, output)`` of the cells in which some coin spans at most ``width`` grid points."""
        return [(c, o) for c, o in self.cells if any(hi - lo <= width for lo, hi in c)]

    def cost(self) -> str:
        return (f"{self.evaluations} kernel calls ({self.probes} at probe points, {self.bisections} bisecting, "
                f"{self.checks} checks), {len(self.cells)} cells, {self.searches} coin searches, "
                f"{self.dtype} coins on the 2^-{self.bits} grid, {self.seconds:.2f} s")

    def __repr__(self) -> str:
        return f"CoinLaw({dict.__repr__(self)}, evaluations={self.evaluations}, cells={len(self.cells)})"


def _key(out):
    """The kernel's output as a hashable value (arrays become nested tuples)."""
    if isinstance(out, np.ndarray):
        out = out.tolist()
    if isinstance(out, list):
        return tuple(_key(o) for o in out)
    if isinstance(out, tuple):
        return tuple(_key(o) for o in out)
    if isinstance(out, np.generic):
        return out.item()
    try:
        hash(out)
    except TypeError:
        raise SpecrefTypeError(f"the kernel's output must be hashable (or an array), got "
                               f"{type(out).__name__}: {_show(out)}") from None
    return out


def _thresholds(candidates, d: int) -> list:
    if candidates is None:
        return []
    values = candidates(d) if callable(candidates) else candidates
    try:
        values = list(values)
    except TypeError:
        raise SpecrefTypeError(f"candidates must be None, an iterable of thresholds or a callable(d) returning "
                               f"one, got {_show(values)} for coin {d}") from None
    out = []
    for t in values:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (numbers.Real, np.floating, np.integer)):
            raise SpecrefTypeError(f"candidates for coin {d} must be real numbers, got {_show(t)}")
        if isinstance(t, (float, np.floating)) and not math.isfinite(t):
            raise SpecrefError(f"candidates for coin {d} must be finite, got {_show(t)}")
        out.append(Fraction(cast(Any, t)) if not isinstance(t, Fraction) else t)  # numpy scalars too
    return out


def coin_law(kernel: Callable[[np.ndarray], Hashable], n: int, *, dtype="float64", bits: int | None = None,
             probes: int = DEFAULT_PROBES, candidates: Iterable | Callable | None = None,
             max_pieces: int = DEFAULT_MAX_PIECES, max_evals: int = DEFAULT_MAX_EVALS,
             check: bool = True, order: Iterable[int] | None = None) -> CoinLaw:
    """The exact law of ``kernel(coins) -> output`` over ``n`` independent coins on the grid of ``dtype``.

    ``coins`` is a fresh ``[n]`` array of ``dtype`` (float32 or float64) on every call, each coin
    ``k 2^-m`` with ``m = bits`` (default 24 for float32, 53 for float64).  ``probes``: uniform
    probe points per coin search (G); ``candidates``: thresholds to probe at (and just below and
    above), the same for every coin or a callable ``candidates(d)`` per coin.  ``max_pieces``:
    pieces of one coin per search; ``max_evals``: kernel calls in all (:class:`CoinBudgetError`).
    ``check``: also evaluate every cell's two corners.  ``order``: the coins' search order, a
    permutation of ``range(n)`` (None: index order; module docstring).  A kernel whose output is not piecewise
    constant (as far as the checks see; module docstring) raises :class:`NotPiecewiseConstant`;
    exceptions of the kernel propagate.  The output must be hashable or an array.

    >>> law = coin_law(lambda u: int(u[0] * 4), 1, dtype="float32")
    >>> sorted(law.items())
    [(0, Fraction(1, 4)), (1, Fraction(1, 4)), (2, Fraction(1, 4)), (3, Fraction(1, 4))]
    """
    started = time.perf_counter()
    if not callable(kernel):
        raise SpecrefTypeError(f"kernel must be a callable kernel(coins) -> output, got {_show(kernel)}")
    n = check_positive_int("n", n, minimum=0)
    m = grid_bits(dtype, bits)
    dtype = np.dtype(dtype).name
    probes = check_positive_int("probes", probes)
    max_pieces = check_positive_int("max_pieces", max_pieces)
    max_evals = check_positive_int("max_evals", max_evals)
    if not isinstance(check, bool):
        raise SpecrefTypeError(f"check must be True or False, got {_show(check)}")
    if candidates is not None and not callable(candidates):
        fixed = _thresholds(candidates, 0)  # validated once, shared by every coin
        candidates = lambda d: fixed  # noqa: E731
    perm = _order(order, n)
    run = _CoinSearch(kernel, n, m, dtype, probes, candidates, max_pieces, max_evals, check, perm)
    if n == 0:
        out = run.ev((), "probes")
        run.cells.append(((), out))
        run.totals[out] = 1
    else:
        run.search(0, (), ())
    denom = run.size ** n
    probs = {o: Fraction(c, denom) for o, c in run.totals.items()}
    cells = [(run.own(cell), out) for cell, out in run.cells]  # the kernel's own coin indices
    return CoinLaw(probs, cells=cells, bits=m, dtype=dtype, n_coins=n, seconds=time.perf_counter() - started,
                   spacing=probes, order=None if order is None else perm, **run.counts)


def _order(order, n: int) -> tuple:
    """``order`` checked: a permutation of ``range(n)`` (None: index order)."""
    if order is None:
        return tuple(range(n))
    try:
        perm = tuple(operator.index(d) for d in order)
    except TypeError:
        raise SpecrefTypeError(f"order must be None or a permutation of range({n}), got {_show(order)}") from None
    if sorted(perm) != list(range(n)):
        raise SpecrefError(f"order must be None or a permutation of range({n}), got {_show(order)}")
    return perm


class _CoinSearch:
    """The state of one :func:`coin_law` run: the kernel's outputs by grid point (each point
    evaluated once), the counters, and the cells found so far with their outputs."""

    def __init__(self, kernel, n, m, dtype, probes, candidates, max_pieces, max_evals, check, order):
        self.kernel, self.n, self.m, self.dtype = kernel, n, m, dtype
        self.order = order  # order[j]: the kernel's coin searched j-th
        self.slot = {d: j for j, d in enumerate(order)}  # the kernel's coin d sits at search position slot[d]
        self.probes, self.candidates, self.max_pieces, self.max_evals, self.check = (
            probes, candidates, max_pieces, max_evals, check)
        self.size = 1 << m
        self.scale = 2.0 ** -m
        self.rest = int(_GENERIC * self.size)  # the later coins' probe value
        self.grid = sorted({j * self.size // probes for j in range(probes)} | {0, self.size - 1})
        self.cache: dict = {}
        self.counts = {"evaluations": 0, "probes": 0, "bisections": 0, "checks": 0, "searches": 0}
        self.cand_points: dict = {}
        self.cells: list = []
        self.totals: dict = {}

    def ev(self, ks: tuple, kind: str):
        """The kernel's output at the grid point ``ks`` (integers k: coins k 2^-m)."""
        if ks in self.cache:
            return self.cache[ks]
        if self.counts["evaluations"] >= self.max_evals:
            raise CoinBudgetError(f"coin_law exceeded max_evals={self.max_evals} kernel calls "
                                  f"({self.counts['searches']} coin searches so far); shrink the case, or raise max_evals")
        self.counts["evaluations"] += 1
        self.counts[kind] += 1
        own = [ks[self.slot[d]] for d in range(self.n)]  # search positions -> the kernel's coins
        coins = (np.array(own, dtype=np.float64) * self.scale).astype(self.dtype)
        out = self.cache[ks] = _key(self.kernel(coins))
        return out

    def own(self, cell) -> tuple:
        """A cell in search positions as one interval per coin of the kernel's own order."""
        return tuple(cell[self.slot[d]] for d in range(len(cell))) if len(cell) == self.n else cell

    def name(self, j: int) -> str:
        """Search position ``j`` as the kernel's coin: ``coins[order[j]]``."""
        return f"coins[{self.order[j]}]"

    def words(self, spans) -> str:
        """Intervals of the first ``len(spans)`` search positions, named by the kernel's coins."""
        return describe_cell(spans, self.m, self.name) if spans else "none"

    def points(self, d):
        """Coin ``d``'s probe points: the uniform grid, 0, the last point, and each candidate's
        three nearest grid points."""
        if d not in self.cand_points:
            pts = set(self.grid)
            for t in _thresholds(self.candidates, self.order[d]):
                c = math.ceil(t * self.size)
                pts.update(k for k in (c - 1, c, c + 1) if 0 <= k < self.size)
            self.cand_points[d] = sorted(pts)
        return self.cand_points[d]

    def breakpoints(self, d, f, outs, spans) -> list:
        """Bisection between neighbouring probes whose outputs differ, to adjacent grid points."""
        pts = self.points(d)
        breaks: list = []
        stack = [(a, b) for a, b in zip(pts, pts[1:]) if outs[a] != outs[b]]
        while stack:
            a, b = stack.pop()
            if b - a == 1:
                breaks.append(b)
                if len(breaks) >= self.max_pieces:
                    raise NotPiecewiseConstant(
                        f"{self.name(d)} has more than max_pieces={self.max_pieces} pieces (with the earlier coins at "
                        f"{self.words(spans)}): the output follows the coin's value, it is not piecewise constant")
                continue
            mid = (a + b) // 2
            if mid not in outs:
                outs[mid] = f(mid, "bisections")
            if outs[mid] != outs[a]:
                stack.append((a, mid))
            if outs[mid] != outs[b]:
                stack.append((mid, b))
        return sorted(breaks)

    def search(self, d: int, prefix: tuple, spans: tuple):
        """Coin ``d``'s pieces (earlier coins at ``prefix``, their intervals ``spans``), each
        recursed into, or at the last coin checked and counted as a cell."""
        self.counts["searches"] += 1
        later = (self.rest,) * (self.n - d - 1)
        f = lambda k, kind: self.ev(prefix + (k,) + later, kind)  # noqa: E731
        outs = {k: f(k, "probes") for k in self.points(d)}
        bounds = [0] + self.breakpoints(d, f, outs, spans) + [self.size]
        m, size = self.m, self.size
        for lo, hi in zip(bounds, bounds[1:]):
            rep = (lo + hi - 1) // 2
            if rep not in outs:
                outs[rep] = f(rep, "checks")
            if outs[rep] != outs[lo]:
                raise NotPiecewiseConstant(
                    f"{self.name(d)} on [{_coin_text(lo, m)}, {_coin_text(hi, m) if hi < size else '1'}): the output "
                    f"at the interval's ends is {_show(outs[lo])} but at its midpoint {_coin_text(rep, m)} it is "
                    f"{_show(outs[rep])} -- not piecewise constant, or a piece narrower than the probe spacing "
                    f"1/{self.probes} with no candidate inside (name its threshold in candidates)")
            cell = spans + ((lo, hi),)
            if d + 1 < self.n:
                self.search(d + 1, prefix + (rep,), cell)
            else:
                self.leaf(cell, outs[rep])

    def leaf(self, cell, out):
        """A cell of the last coin: its corners checked (``check``), its mass counted for ``out``."""
        if self.check:
            for corner in (tuple(a for a, _ in cell), tuple(b - 1 for _, b in cell)):
                got = self.ev(corner, "checks")
                if got != out:
                    mine = self.own(cell)
                    raise NotPiecewiseConstant(
                        f"the output is not constant on the cell {describe_cell(mine, self.m, full=True)}: "
                        f"{_show(out)} at its midpoint, {_show(got)} at its corner "
                        f"{[_coin_text(k, self.m) for k in self.own(corner)]} -- its breakpoints in one coin move with "
                        f"another coin's value (an exponential race, or coins searched in another order than the "
                        f"kernel uses them): outside the method")
        self.cells.append((cell, out))
        self.totals[out] = self.totals.get(out, 0) + math.prod(b - a for a, b in cell)
