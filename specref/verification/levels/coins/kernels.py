"""Coin-fed kernels, exactly: the ``batched_coins`` and ``tree_coins`` levels.

Engine kernels are handed their randomness as float coins and do arithmetic on them
(``coin * q < p``, ``u * total``), so they cannot run on lazy uniforms.  These levels call the
kernel on concrete coins and compute its exact law from the breakpoints of its output
(:func:`specref.verification.laws.coins.coin_law`), with every coin on the grid ``k 2^-m`` of
its dtype (``m = 24`` for float32, 53 for float64: the values real RNGs produce, each of mass
``2^-m``).

- ``"batched_coins"``: ``kernel(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K],
  uniform_coins [B, K], final_coins [B]) -> [B, K+1]`` padded with -1 (or ``(tokens, n_emitted)``,
  or ``(tokens, n_accepted, n_emitted)``).  ``uniform_coins[b, i]`` tests draft ``i`` of row ``b``;
  ``final_coins[b]`` draws the residual token after a rejection, or the bonus token.  Rows and coins
  come as NumPy arrays of the case's dtype (the rows hold the case's probabilities exactly).  Per
  draft tuple of :attr:`CoinCase.drafts` the joint law of the B rows' outputs must be the product of
  the rows' laws given their drafts (:func:`specref.verification.levels.batched.steps.row_law`).
- ``"tree_coins"``: ``kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N],
  uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) -> (accept_index [B, S],
  next_tokens [B])`` (SGLang's call; lists for the links, arrays of the case's dtype for coins and
  rows).  The oracle drafts ``batch`` trees as the ``tree_batch`` level does, takes the kernel's exact
  coin law for each tree tuple, and completes each row's emitted tokens to ``depth + 1`` by target
  sampling (a product of conditionals, composed rather than enumerated); the joint law of the blocks
  must be the product of the target laws.  The reference on the grid is
  :func:`~specref.verification.levels.trees.sampled.batched_reference_kernel` on lazy uniforms.

The rule (verdicts).  On grid coins the law of even a perfect kernel can differ from the closed form
by ``2^-m`` per threshold that is not a grid point (``P(u < t)`` is ``t`` rounded up to the grid).
So the expected law is the closed form when the reference's own grid law equals it exactly -- a
*tight* case: every threshold is a grid point, as with dyadic rows -- and otherwise the reference
enumerated on the same grid (:func:`specref.verification.laws.enumeration.law` with ``grid = m``).
Then, on the exact TV between the kernel's law and the expected law:

- ``differs``: TV > ``Settings.tolerance``;
- ``boundary``: TV <= tolerance, and either the kernel has an output that the expected law gives
  probability 0 (a token with p = 0, say: the inclusive ``u <= 0``), or the case is tight and the TV
  is not 0 (``u <= p/q`` at a threshold that is a grid point), or (batched) a row whose own
  thresholds are grid points has a marginal law other than its closed form.  These live on single grid points of
  mass ``2^-m`` (``2^-53 ~ 1e-16`` for float64 coins: far below any tolerance, yet exact here); the
  detail names the coins;
- ``not piecewise constant``: the kernel's output failed the method's checks
  (:class:`~specref.verification.laws.coins.NotPiecewiseConstant`) in every coin order searched;
- ``ok``: otherwise; the TV is reported (exactly 0 on a tight case), and what it covered
  (:func:`coverage`): every breakpoint at the case's thresholds exactly, no piece narrower than
  the probe spacing ``1/probes`` elsewhere (a kernel wrong only on a narrower window away from the
  thresholds is ``ok`` to that stated resolution; a case with more ``probes`` sees it).

Coin order (SPEC §11.9).  The contract names each coin's use, but the coins are i.i.d., so any
order gives the same law: ``batched_coins`` searches the contract's order first and, when it fails
the method's checks, other orders of a row's ``K + 1`` coins (the same in every row, fewest coins
moved first, at most :data:`MAX_COIN_ORDERS`); the first that passes is judged by its law, the
detail saying that the kernel ``uses its coins in another order than the contract``.
``tree_coins`` searches SGLang's order only.  Its output is read as ``tree_batch`` reads it: ids
(never a float or a bool, never truncated), the root 0 first, only trailing -1 padding.

Misbehaviour (``raised``, ``invalid output``, ``timeout``) is reported with the coins it happened at;
``over budget`` when the kernel calls exceed ``Settings.max_paths``.  Exact mode only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int, check_prob_rows
from specref.core.sampling import SamplingConfig
from specref.core.tree import to_sglang
from specref.decoding.batched import PLACEHOLDER, batched_step
from specref.decoding.chain import next_token_probs
from specref.decoding.tree import draft_tree, tree_rows
from specref.verification.laws.coins import (CoinBudgetError, NotPiecewiseConstant, coin_law, describe_cell,
                                             grid_bits, resolution_text)
from specref.verification.laws.enumeration import compare, law, target_law
from specref.verification.levels.batched.steps import BatchedCase, parse_output, row_law
from specref.verification.levels.runner import run_cases
from specref.verification.levels.trees.sampled import (TreeCase, _inner_padding, _unpadded, batched_reference_kernel,
                                                       memo_rows)
from specref.verification.running.calling import Misbehaved, call, foreign, short_repr
from specref.verification.running.level import Level, fixed_reference
from specref.verification.running.report import BOUNDARY, BUDGET, DIFFERS, INVALID, NOT_PIECEWISE, OK, CaseResult

__all__ = [
    "BOUNDARY",
    "NOT_PIECEWISE",
    "CoinCase",
    "TreeCoinCase",
    "MAX_DRAFT_TUPLES",
    "MAX_COIN_ORDERS",
    "engine_coin_kernel",
    "inclusive_zero_kernel",
    "threshold_inclusive_kernel",
    "one_minus_coin_kernel",
    "sglang_coin_kernel",
    "sglang_inclusive_kernel",
    "default_coin_cases",
    "large_coin_case",
    "default_tree_coin_cases",
    "coverage",
    "made_by_grid_points",
    "at_two_grids",
    "COARSER_BITS",
    "run_batched_coins",
    "run_tree_coins",
    "LEVELS",
]

#: CoinCase.drafts = None enumerates at most this many joint draft tuples.
MAX_DRAFT_TUPLES = 64
#: Orders of a row's coins tried after the contract's fails coin_law's checks (every order when K <= 3).
MAX_COIN_ORDERS = 23
_SEVERITY = {OK: 0, BOUNDARY: 1, DIFFERS: 2}
#: A coin case that differs is judged again on a grid this many bits coarser (:func:`at_two_grids`).
COARSER_BITS = 4


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class CoinCase:
    """One batch for the ``batched_coins`` level: plain data that reproduces a verdict.

    ``p_target`` [B, K+1, V] and ``q_draft`` [B, K, V] (None: point-mass drafts) hold Fractions, each
    exactly a float of ``dtype`` (dyadic); the kernel gets them, and its coins, in ``dtype``.
    ``drafts``: the draft tuples checked, each B rows of K ids (-1 after row b's ``k_b``); None: every
    tuple the draft can propose (at most :data:`MAX_DRAFT_TUPLES`).  ``probes``: uniform probe points
    per coin search.  Validated before any case runs (SPEC §11.9), each error a SpecrefError naming the
    field and the value: ``name`` a string, ``dtype`` the string 'float32' or 'float64', ``num_draft``
    None or B ints in 0..K (never converted).
    """

    name: str
    p_target: np.ndarray  # [B, K+1, V]
    q_draft: np.ndarray | None  # [B, K, V] or None
    drafts: tuple | None = None  # ((row 0 ids), (row 1 ids), ...) per tuple
    num_draft: tuple | None = None  # k_b per row (None: K)
    dtype: str = "float32"  # the coins' and the rows' dtype
    probes: int = 16

    @property
    def shape(self):
        return tuple(self.p_target.shape)

    @property
    def k(self) -> np.ndarray:
        B, K1, _ = self.p_target.shape
        return np.full(B, K1 - 1, dtype=np.int64) if self.num_draft is None else np.array(self.num_draft, np.int64)

    @property
    def bits(self) -> int:
        return grid_bits(self.dtype)

    def batched(self) -> BatchedCase:
        """The same rows as a :class:`~specref.verification.levels.batched.steps.BatchedCase` (for ``row_law``)."""
        B, K1, V = self.shape
        proposal = None
        if self.q_draft is None:  # any positive proposal: the law given the drafts does not depend on it
            proposal = np.full((B, K1 - 1, V), Fraction(1, V), dtype=object)
        return BatchedCase(self.name, self.p_target, self.q_draft, proposal=proposal, num_draft=self.num_draft)

    def draft_tuples(self) -> list:
        """The draft tuples checked: ``[B, K]`` int64 arrays, -1 after ``k_b``."""
        B, K1, V = self.shape
        K, k = K1 - 1, self.k
        if self.drafts is not None:
            return [_pad(np.array([list(r) + [PLACEHOLDER] * (K - len(r)) for r in t], dtype=np.int64), k)
                    for t in self.drafts]
        d = self.batched().drafts_from
        assert d is not None  # batched() gives a proposal when q_draft is None
        per_row = []
        for b in range(B):
            per_row.append([x for x in itertools.product(range(V), repeat=int(k[b]))
                            if all(d[b, i, t] > 0 for i, t in enumerate(x))])
        out = []
        for combo in itertools.product(*per_row):
            out.append(np.array([list(x) + [PLACEHOLDER] * (K - len(x)) for x in combo], dtype=np.int64).reshape(B, K))
        return out

    def __repr__(self):
        B, K1, V = self.shape
        return (f"CoinCase({self.name!r}, B={B}, K={K1 - 1}, V={V}, point_mass={self.q_draft is None}, "
                f"dtype={self.dtype!r}, drafts={self.drafts}, num_draft={self.num_draft})")


def _pad(x, k):
    return np.where(np.arange(x.shape[1])[None, :] < k[:, None], x, PLACEHOLDER)


@dataclass(frozen=True)
class TreeCoinCase:
    """One case of the ``tree_coins`` level: a tree case, ``batch`` trees per call, the coins' dtype."""

    name: str
    tree: TreeCase
    batch: int = 2
    dtype: str = "float32"  # the coins' and the rows' dtype
    probes: int = 16

    def __repr__(self):
        return f"TreeCoinCase({self.name!r}, {self.tree!r}, batch={self.batch}, dtype={self.dtype!r})"


def _exact_in(name, rows, dtype):
    """Check that every Fraction of ``rows`` is exactly a float of ``dtype``; the rows as that dtype."""
    flat = np.asarray(rows, dtype=object).reshape(-1)
    vals = np.array([float(v) for v in flat], dtype=np.float64).astype(dtype)
    for i, (v, f) in enumerate(zip(flat, vals)):
        if Fraction(float(f)) != v:
            idx = np.unravel_index(i, np.shape(rows))
            raise SpecrefError(f"{name}[{', '.join(map(str, idx))}] = {v} is not exactly a {dtype} (coin-fed cases "
                               f"hand the kernel their rows in {dtype}: use dyadic probabilities)")
    return vals.reshape(np.shape(rows))


def _check_name(case):
    """A case's name: a string (SPEC §11.9), else a SpecrefError naming the field and the value."""
    if not isinstance(case.name, str):
        raise SpecrefError(f"a {type(case).__name__}'s name must be a string, got name={short_repr(case.name, 80)}")


def _check_dtype(name, dtype):
    """``dtype``: the string 'float32' or 'float64' (an array is refused, never compared)."""
    if not isinstance(dtype, str) or dtype not in ("float32", "float64"):
        raise SpecrefError(f"case {name!r}: dtype must be 'float32' or 'float64', got dtype={short_repr(dtype, 80)}")


def _is_count(c, K) -> bool:
    return not isinstance(c, (bool, np.bool_)) and isinstance(c, (int, np.integer)) and 0 <= c <= K


def _check_num_draft(case, B, K):
    """``num_draft``: None or B ints in 0..K (a tuple, a list or a 1-D array), never converted (SPEC §11.9)."""
    nd = case.num_draft
    if nd is None:
        return
    rows = isinstance(nd, (tuple, list)) or (isinstance(nd, np.ndarray) and nd.ndim == 1)
    if not rows or len(nd) != B or not all(_is_count(c, K) for c in nd):
        raise SpecrefError(f"case {case.name!r}: num_draft must be None or B = {B} ints in 0..{K} (k_b per row), "
                           f"got num_draft={short_repr(nd, 80)}")


def _validate_coin_case(case):
    if not isinstance(case, CoinCase):
        raise SpecrefError(f"cases of the batched_coins level must be CoinCase objects, got {case!r:.200}")
    _check_name(case)
    _check_dtype(case.name, case.dtype)
    check_positive_int("probes", case.probes)
    p = case.p_target
    if not isinstance(p, np.ndarray) or p.ndim != 3 or p.dtype != object:
        raise SpecrefError(f"case {case.name!r}: p_target must be a [B, K+1, V] object array of Fractions, got "
                           f"{type(p).__name__} {getattr(p, 'dtype', '')} {getattr(p, 'shape', '')}")
    B, K1, V = p.shape
    check_prob_rows(f"case {case.name!r}: p_target", p)
    _exact_in(f"case {case.name!r}: p_target", p, case.dtype)
    if case.q_draft is not None:
        q = case.q_draft
        if not isinstance(q, np.ndarray) or q.dtype != object or q.shape != (B, K1 - 1, V):
            raise SpecrefError(f"case {case.name!r}: q_draft must be a [B, K, V] = [{B}, {K1 - 1}, {V}] object array "
                               f"of Fractions, got {getattr(q, 'shape', type(q).__name__)}")
        check_prob_rows(f"case {case.name!r}: q_draft", q)
        _exact_in(f"case {case.name!r}: q_draft", q, case.dtype)
    _check_num_draft(case, B, K1 - 1)
    k = case.k
    if case.drafts is None:
        d = case.batched().drafts_from
        count = math.prod(int(sum(1 for t in range(V) if d[b, i, t] > 0)) for b in range(B) for i in range(int(k[b])))
        if count > MAX_DRAFT_TUPLES:
            raise SpecrefError(f"case {case.name!r}: drafts=None would check {count} draft tuples (more than "
                               f"MAX_DRAFT_TUPLES = {MAX_DRAFT_TUPLES}); name the tuples to check in drafts=(...)")
        return
    if not isinstance(case.drafts, (tuple, list)) or not case.drafts:
        raise SpecrefError(f"case {case.name!r}: drafts must be None or a non-empty tuple of draft tuples, "
                           f"got {case.drafts!r:.200}")
    for j, t in enumerate(case.drafts):
        try:
            rows = [list(r) for r in t]
        except TypeError:
            raise SpecrefError(f"case {case.name!r}: drafts[{j}] must hold B = {B} rows of ids, "
                               f"got {t!r:.200}") from None
        if len(rows) != B:
            raise SpecrefError(f"case {case.name!r}: drafts[{j}] must hold B = {B} rows of ids, got {t!r:.200}")
        for b, r in enumerate(rows):
            real = [x for x in r if x != PLACEHOLDER]
            if len(real) != int(k[b]) or r[:len(real)] != real or len(r) > K1 - 1:
                raise SpecrefError(f"case {case.name!r}: drafts[{j}][{b}] = {r} must hold k_b = {k[b]} ids "
                                   f"(then -1 up to K = {K1 - 1})")
            for i, x in enumerate(real):
                if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < V:
                    raise SpecrefError(f"case {case.name!r}: drafts[{j}][{b}][{i}] = {x!r} is not a token id "
                                       f"in 0..{V - 1}")
                if case.q_draft is not None and not case.q_draft[b, i, x] > 0:
                    raise SpecrefError(f"case {case.name!r}: drafts[{j}][{b}][{i}] = {x} has q_draft = 0: the draft "
                                       f"cannot have proposed it")


def _validate_tree_coin_case(case):
    if not isinstance(case, TreeCoinCase):
        raise SpecrefError(f"cases of the tree_coins level must be TreeCoinCase objects, got {case!r:.200}")
    _check_name(case)
    if not isinstance(case.tree, TreeCase):
        raise SpecrefError(f"case {case.name!r}: tree must be a TreeCase, got {case.tree!r:.200}")
    _check_dtype(case.name, case.dtype)
    check_positive_int("batch", case.batch)
    check_positive_int("probes", case.probes)
    case.tree.models()  # validates the tables
    _exact_in(f"case {case.name!r}: tree.target", case.tree.target, case.dtype)


def _exact_only(level, settings):
    if settings.mode != "exact":
        raise SpecrefError(f"the {level} level is exact only (coins in, exact out): use mode='exact', "
                           f"got mode={settings.mode!r}")


# ---------------------------------------------------------------- the verdict


def _verdict(got, expected, tight, tolerance, exact_rows=()):
    """(status, comparison, impossible outputs) of one exact comparison (module docstring: the rule).

    ``exact_rows``: ``[(b, law)]``: rows whose own thresholds are all grid points, so that the
    kernel's marginal law of row ``b`` must be ``law`` exactly even when the case as a whole is not tight.
    """
    cmp = compare(got, expected)
    impossible = [o for o, w in got.items() if w > 0 and not expected.get(o, 0) > 0]
    off_row = False
    for b, want in exact_rows:
        marginal: dict = {}
        for o, w in got.items():
            marginal[o[b]] = marginal.get(o[b], 0) + w
        off_row = off_row or marginal != want
    if cmp.tv > tolerance:
        status = DIFFERS
    elif impossible or (tight and cmp.tv != 0) or off_row:
        status = BOUNDARY
    else:
        status = OK
    return status, cmp, impossible


def made_by_grid_points(fine_tv, coarse_tv, step: int = COARSER_BITS) -> bool:
    """Whether a deviation of TV ``fine_tv`` on the ``2^-m`` grid, ``coarse_tv`` on the ``2^-(m - step)``
    grid, is made by single grid points (SPEC §11.9): it vanishes on the coarser grid (the coins that
    made it are fine-grid points the coarse grid does not have) or grows with the grid point's mass (by
    at least half of ``2^step``).  A deviation of the law itself -- a window of coins, a wrong residual --
    keeps about the same TV on both grids.

    >>> made_by_grid_points(Fraction(3, 2**24), Fraction(3, 2**20)), made_by_grid_points(0.01, 0.0100002)
    (True, False)
    """
    return coarse_tv == 0 or coarse_tv >= (1 << (step - 1)) * fine_tv


def at_two_grids(judge, bits: int, step: int = COARSER_BITS) -> CaseResult:
    """``judge(bits)``, a coin case's result on the ``2^-bits`` grid; a ``differs`` there is judged again
    on the grid ``step`` bits coarser, and is ``boundary`` when the deviation is made by single grid points
    (:func:`made_by_grid_points`).  So one defect gets one label whatever the coins' width: the inclusive
    ``u <= p/q`` is ``boundary`` with float32 coins (TV ~ 2^-24, above the tolerance) as with float64
    coins (TV ~ 2^-53, below it)."""
    fine = judge(bits)
    if fine.status != DIFFERS or bits <= step:
        return fine
    coarse = judge(bits - step)
    if coarse.status not in (OK, BOUNDARY, DIFFERS):  # misbehaved on the coarse grid: the fine verdict stands
        return fine
    coarse_tv = Fraction(coarse.tv or 0)
    fine_tv = Fraction(fine.tv)
    grids = f"TV {_mass(fine_tv)} on the 2^-{bits} grid, {_mass(coarse_tv)} on the 2^-{bits - step} grid"
    if made_by_grid_points(fine_tv, coarse_tv, step):
        how = "vanishes" if coarse_tv == 0 else "grows with the grid point's mass"
        return dataclasses.replace(fine, status=BOUNDARY, detail=f"a deviation made by single grid points ({grids}: it "
                                   f"{how}; SPEC §11.9): {fine.detail}")
    return dataclasses.replace(fine, detail=f"{fine.detail}; {grids}: the deviation does not shrink with the grid")


def _mass(w) -> str:
    w = Fraction(w)
    if w and w.numerator == 1 and w.denominator & (w.denominator - 1) == 0:
        return f"2^-{w.denominator.bit_length() - 1}"
    return f"{float(w):.4g}"


def _signed(w) -> str:
    return ("+" if w > 0 else "-") + _mass(abs(w))


def _cell_words(cell, bits, names, cands) -> list:
    """The coins of ``cell`` that look like a boundary: a single grid point, or an end one grid point
    off a threshold the reference compares that coin with (``cands``: coin -> thresholds)."""
    size = 1 << bits
    points, words = [], []  # single grid points first
    for d, (lo, hi) in enumerate(cell):
        if hi - lo == 1:
            def name(_, d=d):  # this cell's one coin is coin d
                return names(d)

            points.append(describe_cell(((lo, hi),), bits, name))
            continue
        marks = {math.ceil(t * size): t for t in cands.get(d, ())}
        for end, side in ((lo, ">="), (hi, "<")):
            for off in (-1, 1):
                if end - off in marks and end not in marks and 0 < end < size:
                    t = marks[end - off]
                    words.append(f"{names(d)} {side} {t} {'+' if off > 0 else '-'} 2^-{bits} (one grid point "
                                 f"{'past' if off > 0 else 'short of'} the threshold {t})")
    return points + words


def _where(coin_laws, outputs, limit=2):
    """Where the kernel makes ``outputs``: the boundary-looking coins of their cells, in words
    (``coin_laws``: ``[(coin law, names, thresholds per coin)]``)."""
    parts = []
    for cl, names, cands in coin_laws:
        for o in outputs:
            for cell in cl.cells_for(o):
                words = _cell_words(cell, cl.bits, names, cands)
                if words:
                    parts.append(f"{o} at {', '.join(words)}")
                    break
            if len(parts) >= limit:
                return "; ".join(parts)
    if not parts:  # no output of those: any boundary-looking cell of the kernel
        for cl, names, cands in coin_laws:
            for cell, o in cl.cells:
                words = _cell_words(cell, cl.bits, names, cands)
                if words:
                    parts.append(f"{o} at {', '.join(words)}")
                if len(parts) >= limit:
                    return "; ".join(parts)
    return "; ".join(parts) or "no cell of the kernel looks like a boundary"


def coverage(probes: int) -> str:
    """What an ``ok`` of ``coin_law`` covers (SPEC §11.9): exact at the thresholds, to ``1/probes`` elsewhere."""
    r = resolution_text(probes)
    return (f"ok to resolution {r}: every breakpoint at the case's thresholds found exactly; no piece "
            f"narrower than {r} probed elsewhere")


def _explain(status, cmp, got, impossible, tight, bits, where, exact_rows=None, probes=None):
    what = ("tight case: every threshold a grid point, the expected law is the closed form" if tight
            else f"thresholds off the 2^-{bits} grid: expected = the reference enumerated on the grid")
    if exact_rows and not tight:
        what += f", but rows {[b for b, _ in exact_rows]} are tight (their own laws must hold exactly)"
    if status == OK:
        return f"TV = {cmp.tv} ({what})" + ("" if probes is None else f"; {coverage(probes)}")
    diffs = [(o, a - b) for o, a, b in cmp.worst if a != b][:2]
    text = (f"TV = {_mass(cmp.tv)} ({what}); worst outputs (got - expected): "
            + ", ".join(f"{o}: {_signed(w)}" for o, w in diffs))
    if impossible:
        return (f"output(s) the reference never makes, of mass {_mass(sum(got[o] for o in impossible))}: "
                f"{where(impossible)}; " + text)
    return text + f"; where: {where([o for o, _ in diffs])}"


# ---------------------------------------------------------------- batched_coins


def _row_thresholds(case, b, x):
    """Row ``b``'s thresholds given drafts ``x[b]``: acceptance per position, CDF partial sums of the final rows."""
    p = case.p_target[b]
    q = None if case.q_draft is None else case.q_draft[b]
    kb = int(case.k[b])
    accept, finals = [], []
    for i in range(kb):
        xi = int(x[b, i])
        a = p[i, xi] if q is None else min(Fraction(1), p[i, xi] / q[i, xi])
        accept.append(a)
        if a < 1:
            w = [v if j != xi else Fraction(0) for j, v in enumerate(p[i])] if q is None else \
                [max(Fraction(0), u - v) for u, v in zip(p[i], q[i])]
            total = sum(w, Fraction(0))
            if total > 0:
                finals.extend(itertools.accumulate(v / total for v in w))
    finals.extend(itertools.accumulate(p[kb]))
    return accept, finals


def _grid_reference(case, b, x, bits):
    """Row ``b``'s law given its drafts with coins on the grid: :func:`batched_step` enumerated."""
    p = case.p_target[b:b + 1]
    q = None if case.q_draft is None else case.q_draft[b:b + 1]
    k = case.k[b:b + 1]

    def program(rng):
        steps = batched_step(p, q, x[b:b + 1], rng, num_draft=k)
        return tuple(int(t) for t in steps.tokens[0, :int(steps.n_emitted[0])])

    return law(program, grid=bits)


def _expected_given(case, closed, x, bits):
    """``(expected joint law of the rows given drafts x [B, K], tight, exact rows)``: the closed form
    where the reference's grid law equals it (the tight rows, returned as ``[(b, law)]``), else that grid law."""
    B = case.shape[0]
    d = case.batched().drafts_from
    expected = {(): Fraction(1)}
    exact_rows = []
    for b in range(B):
        kb = int(case.k[b])
        drafts = tuple(int(t) for t in x[b, :kb])
        pd = math.prod((d[b, i, t] for i, t in enumerate(drafts)), start=Fraction(1))
        cond = {out: w / pd for (dr, out), w in closed[b].items() if dr == drafts}
        grid = dict(_grid_reference(case, b, x, bits))
        if grid == cond:
            exact_rows.append((b, cond))
        rl = cond if grid == cond else grid
        expected = {key + (o,): w * v for key, w in expected.items() for o, v in rl.items()}
    return expected, len(exact_rows) == B, exact_rows


def _coin_names(K):
    return lambda d: (f"uniform_coins[{d // (K + 1)}, {d % (K + 1)}]" if d % (K + 1) < K
                      else f"final_coins[{d // (K + 1)}]")


def _row_orders(K1: int, limit: int = MAX_COIN_ORDERS) -> list:
    """Orders of a row's ``K + 1`` coins other than the contract's, those that move fewest coins
    first (every swap of two coins before any cycle of three), at most ``limit``: every order when
    ``K <= 3``.  ``perm[j]`` is the coin that plays part ``j`` (draft ``j``'s test; ``K``: the final draw)."""
    out: list = []
    for moved in range(2, K1 + 1):
        for subset in itertools.combinations(range(K1), moved):
            for image in itertools.permutations(subset):
                if any(a == c for a, c in zip(subset, image)):
                    continue  # only orders that move every coin of the subset
                perm = list(range(K1))
                for a, c in zip(subset, image):
                    perm[a] = c
                out.append(tuple(perm))
                if len(out) == limit:
                    return out
    return out


def _order_words(perm, K) -> str:
    """What a row order means in the contract's words: which coin plays which part."""
    part = lambda i: "final_coins[b]" if i == K else f"uniform_coins[b, {i}]"  # noqa: E731
    role = lambda j: "the final coin" if j == K else f"draft {j}'s coin"  # noqa: E731
    roles = [f"{part(perm[j])} as {role(j)}" for j in range(K + 1) if perm[j] != j]
    return ("uses its coins in another order than the contract (" + ", ".join(roles) + "); the coins are i.i.d., so "
            "the law is judged in that order (SPEC §11.9)")


def _tuple_law(f, case, cands, budget, bits=None):
    """``(coin law, order note, kernel calls)`` of one draft tuple: the contract's coin order first,
    then each other order of a row's coins (the same in every row) until one passes ``coin_law``'s
    checks (SPEC §11.9); the calls of the orders that failed count against ``budget``.  No order
    passing: the contract order's :class:`NotPiecewiseConstant`."""
    B, K1, _ = case.shape
    calls, seen = [0], {}  # one call per coin vector, whatever the order that asks for it

    def counted(coins):
        key = coins.tobytes()
        if key not in seen:
            calls[0] += 1
            seen[key] = f(coins)
        return seen[key]

    def law_of(order):
        return coin_law(counted, B * K1, dtype=case.dtype, bits=bits, probes=case.probes, candidates=lambda d: cands[d],
                        max_evals=max(1, budget - calls[0]), order=order)

    try:
        return law_of(None), "", calls[0]
    except NotPiecewiseConstant as first:
        failure = first
    for perm in _row_orders(K1):
        try:
            return law_of([b * K1 + perm[j] for b in range(B) for j in range(K1)]), _order_words(perm, K1 - 1), calls[0]
        except NotPiecewiseConstant:
            continue
    raise NotPiecewiseConstant(f"{failure} (searched in the contract's coin order; none of the {len(_row_orders(K1))} "
                               f"other orders of a row's coins passes either)")


def _batched_coin_case(kernel, case, settings, bits=None):
    """One case of the ``batched_coins`` level: the coin law per draft tuple, the worst verdict.

    Over 60 lines: the per-tuple kernel wrapper, its law and the running worst verdict share the
    case's inputs and counters, and read best in one place."""
    started = time.perf_counter()
    B, K1, V = case.shape
    K, k, bits, dtype = K1 - 1, case.k, grid_bits(case.dtype, bits), case.dtype
    p_in = _exact_in("p_target", case.p_target, dtype)
    q_in = None if case.q_draft is None else _exact_in("q_draft", case.q_draft, dtype)
    bc = case.batched()
    closed = [row_law(bc, b) for b in range(B)]
    names = _coin_names(K)
    worst, laws, totals, budget = None, [], {"evaluations": 0, "cells": 0}, settings.max_paths
    for x in case.draft_tuples():
        cands = {}
        for b in range(B):
            accept, finals = _row_thresholds(case, b, x)
            for i in range(K):
                cands[b * K1 + i] = accept[i:i + 1]
            cands[b * K1 + K] = finals

        def f(coins, x=x):
            c = coins.reshape(B, K1)
            u, fin = c[:, :K].copy(), c[:, K].copy()
            at = f"uniform_coins = {u.tolist()}, final_coins = {fin.tolist()}, draft_tokens = {x.tolist()}"
            try:  # the output is parsed inside the guarded call: a conversion that raises or hangs is a status
                tokens, n = call(kernel, (p_in.copy(), None if q_in is None else q_in.copy(), x.copy(), u, fin), {},
                                 settings.time_limit, convert=lambda out: parse_output(out, B, K, V, k, x, what="kernel"))
            except Misbehaved as m:
                raise Misbehaved(m.status, f"{m.detail} (at {at})") from None
            return tuple(tuple(int(t) for t in tokens[b, :n[b]]) for b in range(B))

        try:
            got, order_note, calls = _tuple_law(f, case, cands, budget, bits)
        except NotPiecewiseConstant as e:
            return CaseResult(case, NOT_PIECEWISE, detail=f"drafts {x.tolist()}: {e} (coins: "
                                                          f"{', '.join(names(d) for d in range(B * K1))})")
        except CoinBudgetError as e:
            return CaseResult(case, BUDGET,
                              detail=f"drafts {x.tolist()}: {e} (Settings.max_paths = {settings.max_paths})")
        budget -= calls
        totals["evaluations"] += calls
        totals["cells"] += len(got.cells)
        laws.append(got)
        expected, tight, exact_rows = _expected_given(case, closed, x, bits)
        status, cmp, impossible = _verdict(got, expected, tight, settings.tolerance, exact_rows)
        if worst is None or (_SEVERITY[status], cmp.tv) > (_SEVERITY[worst[0]], worst[1].tv):
            where = partial(_where, [(got, names, cands)])
            worst = (status, cmp, f"drafts {x.tolist()}: " + _explain(status, cmp, got, impossible, tight, bits, where,
                                                                     exact_rows, case.probes)
                     + (f"; {order_note}" if order_note else ""))
        elif order_note and order_note not in worst[2]:
            worst = (worst[0], worst[1], f"{worst[2]}; {order_note}")
    status, cmp, detail = worst
    n_tuples = len(laws)
    cost = (f"{n_tuples} draft tuple(s), {totals['evaluations']} kernel calls "
            f"({sum(g.probes for g in laws)} at probe points, {sum(g.bisections for g in laws)} bisecting, "
            f"{sum(g.checks for g in laws)} checks), {totals['cells']} cells, {dtype} coins (2^-{bits} grid), "
            f"{time.perf_counter() - started:.2f} s")
    return CaseResult(case, status, tv=cmp.tv, detail=f"{detail}; {cost}")


def run_batched_coins(level, kernel, cases, settings):
    """The ``batched_coins`` level: each case's coin law per draft tuple, through the one runner."""
    _exact_only(level.name, settings)
    return run_cases(level, cases, settings, validate=_validate_coin_case,
                     exact=lambda case: partial(at_two_grids, partial(_batched_coin_case, kernel, case, settings),
                                                case.bits),
                     statistical=None)


# ---------------------------------------------------------------- engine-style kernels (batched)


def _ragged(x):
    pad = x == PLACEHOLDER
    return np.where(pad.any(axis=1), pad.argmax(axis=1), x.shape[1])


def engine_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins, *, accept_test="strict"):
    """(correct) The chain rule on float coins, written as engines write it.

    Accept draft ``i`` iff ``coin * q < p`` (point mass: ``coin < p``), in the rows' dtype; after
    the first rejection draw from ``max(p - q, 0)`` (point mass: ``p`` without the draft) by inverse
    CDF ``#{j : cdf_j <= u * total}``, or from ``p`` when that residual is empty; the bonus the same
    way from ``p[k_b]``.  ``accept_test``: ``"strict"`` (correct), or a bug: ``"inclusive"``
    (``coin * q <= p``: u = 0 accepts a p = 0 draft), ``"threshold"`` (``p > 0 and coin <= p / q``:
    inclusive at the threshold only), ``"one_minus"`` (``coin > 1 - p / q``: coins taken for (0, 1]).
    """
    p = np.asarray(p_target)
    q = None if q_draft is None else np.asarray(q_draft)
    x = np.asarray(draft_tokens).astype(np.int64)
    u = np.asarray(uniform_coins)
    fin = np.asarray(final_coins)
    B, K1, _ = p.shape
    k = _ragged(x)
    out = np.full((B, K1), PLACEHOLDER, dtype=np.int64)
    for b in range(B):
        n = 0
        while n < k[b]:
            xi = x[b, n]
            px = p[b, n, xi]
            qx = q[b, n, xi] if q is not None else p.dtype.type(1)
            c = u[b, n]
            if q is None:  # point mass: the threshold is p itself
                ok = {"strict": c < px, "inclusive": c <= px, "threshold": px > 0 and c <= px,
                      "one_minus": c > 1 - px}[accept_test]
            elif accept_test == "strict":
                ok = c * qx < px
            elif accept_test == "inclusive":
                ok = c * qx <= px
            elif accept_test == "threshold":
                ok = px > 0 and c <= px / qx
            elif accept_test == "one_minus":
                ok = c > 1 - px / qx
            else:
                raise ValueError(f"accept_test {accept_test!r}")
            if not ok:
                break
            out[b, n] = xi
            n += 1
        row = p[b, n]
        if n < k[b]:  # rejected at n: the residual
            if q is None:
                w = row.copy()
                w[x[b, n]] = 0
            else:
                w = np.maximum(row - q[b, n], 0)
            if not w.sum() > 0:
                w = row
        else:
            w = row
        cdf = np.cumsum(w)
        y = int(np.sum(cdf <= fin[b] * cdf[-1]))
        last = int(np.flatnonzero(w > 0)[-1])
        out[b, n] = min(y, last)  # u * total == total only by rounding
    return out


def inclusive_zero_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """Accept iff ``coin * q <= p``: at u = 0 a draft with p = 0 is accepted (probability 2^-m per coin)."""
    return engine_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins, accept_test="inclusive")


def threshold_inclusive_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """Accept iff ``p > 0 and coin <= p / q``: guarded at 0, inclusive at the threshold (2^-m more per test)."""
    return engine_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins, accept_test="threshold")


def one_minus_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """Accept iff ``coin > 1 - p / q`` (coins taken for (0, 1]): 2^-m less per test, a sure draft rejected at u = 0."""
    return engine_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins, accept_test="one_minus")


# ---------------------------------------------------------------- tree_coins


def _tree_row_thresholds(p_row_sets, tree_links):
    """Per node: running sums of the children's target probabilities; final coin: CDF sums of the
    residual after trying the first j children at any node (the reference's thresholds)."""
    candidates, first, sibling = tree_links
    p = p_row_sets
    node_t, final_t = [], set()
    for node in range(len(candidates)):
        kids, c = [], first[node]
        while c != -1:
            kids.append(candidates[c])
            c = sibling[c]
        node_t.append(list(itertools.accumulate(p[node, t] for t in kids)))
        for j in range(len(kids) + 1):
            w = [v if t not in kids[:j] else Fraction(0) for t, v in enumerate(p[node])]
            total = sum(w, Fraction(0))
            if total > 0:
                final_t.update(itertools.accumulate(v / total for v in w))
    return node_t, sorted(final_t)


def _tree_coin_laws(kernel, case: TreeCoinCase, settings, stats, bits=None):
    """``(the kernel's joint law of the B completed blocks, the expected law, tight)`` for one case.

    Composed rather than enumerated whole: the law of the drafted trees (enumerated), for each tree
    tuple the kernel's coin law of (path, next token) per row, then each row's emitted tokens
    completed to ``depth + 1`` by target sampling (product of conditionals).  The reference is
    :func:`~specref.verification.levels.trees.sampled.batched_reference_kernel` on lazy uniforms on the same grid.

    Over 60 lines on purpose: five small closures (``kernel_law``, ``drafting``,
    ``reference_law``, ``complete``, ``blocks``; the longest 40 lines) share the case's memo of
    target rows and the drafted trees, and read top to bottom as the composition above."""
    tc, batch, dtype = case.tree, case.batch, case.dtype
    bits = grid_bits(dtype, bits)
    target, draft = tc.models()
    prompt, V, depth = list(tc.prompt), tc.vocab_size, tc.depth
    config = SamplingConfig()
    row = memo_rows(prompt, config)

    def kernel_law(trees, p_rows):
        links = [to_sglang(t, root_token=0) for t in trees]
        N = trees[0].size
        p_in = _exact_in("target_probs", np.stack(p_rows), dtype)
        cands = {}
        for b in range(batch):
            node_t, final_t = _tree_row_thresholds(p_rows[b], links[b])
            for node in range(N):
                cands[b * (N + 1) + node] = node_t[node]
            cands[b * (N + 1) + N] = final_t

        def f(coins):
            c = coins.reshape(batch, N + 1)
            u, fin = c[:, :N].copy(), c[:, N].copy()
            at = f"uniform_samples = {u.tolist()}, uniform_final = {fin.tolist()}"
            args = ([list(a) for a, _, _ in links], [list(f_) for _, f_, _ in links], [list(s) for _, _, s in links],
                    u, fin, p_in.copy())
            try:  # the output is parsed inside the guarded call: a conversion that raises or hangs is a status
                return call(kernel, args, {}, settings.time_limit, convert=lambda out: _tree_output(out, trees, V))
            except Misbehaved as m:
                raise Misbehaved(m.status, f"{m.detail} (at {at})") from None

        def names(d):
            return (f"uniform_samples[{d // (N + 1)}, {d % (N + 1)}]" if d % (N + 1) < N
                    else f"uniform_final[{d // (N + 1)}]")

        got = coin_law(f, batch * (N + 1), dtype=dtype, bits=bits, probes=case.probes, candidates=lambda d: cands[d],
                       max_evals=max(1, settings.max_paths - stats["evaluations"]))
        stats["evaluations"] += got.evaluations
        stats["laws"].append((got, names, cands, trees))
        return got

    def drafting(rng):  # the drafted trees only: the kernel and the completion are composed below
        trees, p_rows = [], []
        for _ in range(batch):
            tree, _, paths = draft_tree(tc.widths, lambda path: row(draft, path), tc.drafting, rng)
            trees.append(tree)
            p_rows.append(tree_rows(lambda path: row(target, path), paths))
        key = tuple((t.parents, t.tokens) for t in trees)
        drafted.setdefault(key, (trees, p_rows))
        return key

    def reference_law(trees, p_rows):  # the reference kernel on lazy uniforms, the coins on the grid
        links = [to_sglang(t, root_token=0) for t in trees]
        N = trees[0].size

        def program(rng):
            coins = [[rng.random() for _ in range(N)] for _ in range(batch)]
            finals = [rng.random() for _ in range(batch)]
            accept, tokens = batched_reference_kernel([a for a, _, _ in links], [f_ for _, f_, _ in links],
                                                      [s_ for _, _, s_ in links], coins, finals, np.stack(p_rows))
            return tuple((tuple(i for i in accept[b][1:] if i != -1), int(tokens[b])) for b in range(batch))

        return law(program, grid=bits, max_paths=settings.max_paths)

    def emitted(trees, out):
        return tuple(tuple(trees[b].tokens[n] for n in path) + (token,) for b, (path, token) in enumerate(out))

    completions: dict = {}

    def complete(prefix):  # {block: P} of one row's block completed to depth + 1 tokens by target sampling
        if prefix not in completions:
            if len(prefix) >= depth + 1:
                completions[prefix] = {prefix: Fraction(1)}
            else:
                out = {}
                for y, py in enumerate(row(target, prefix).tolist()):
                    if py > 0:
                        for block, w in complete(prefix + (y,)).items():
                            out[block] = out.get(block, 0) + py * w
                completions[prefix] = out
        return completions[prefix]

    def blocks(prefix_law):  # the joint law of the B completed blocks
        out: dict = {}
        for prefixes, w in prefix_law.items():
            for combo in itertools.product(*(complete(pre).items() for pre in prefixes)):
                key = tuple(block for block, _ in combo)
                out[key] = out.get(key, 0) + w * math.prod((v for _, v in combo), start=Fraction(1))
        return out

    drafted: dict = {}
    got_prefixes: dict = {}
    ref_prefixes: dict = {}
    for key, w in law(drafting, max_paths=settings.max_paths).items():
        trees, p_rows = drafted[key]
        for out, v in kernel_law(trees, p_rows).items():
            e = emitted(trees, out)
            got_prefixes[e] = got_prefixes.get(e, 0) + w * v
        for out, v in reference_law(trees, p_rows).items():
            e = emitted(trees, out)
            ref_prefixes[e] = ref_prefixes.get(e, 0) + w * v
    one = target_law(target, prompt, config, depth + 1)
    closed: dict[tuple, Fraction] = {(): Fraction(1)}
    for _ in range(batch):
        closed = {key + (o,): w * v for key, w in closed.items() for o, v in one.items()}
    grid = blocks(ref_prefixes)
    tight = grid == closed
    return blocks(got_prefixes), closed if tight else grid, tight


_MAX_WIDTH = 64  # entries of an accept_index row read per tree node (-1 padding included), at most


def _tree_id(v) -> int:
    """An id of a tree kernel's output: an int, a NumPy integer or a 0-d integer array; a float
    (``2.75``) or a bool is refused, never truncated (as at ``tree_batch``)."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{v!r} is a bool, not an id")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{v} ({type(v).__name__}) is not an id: ids are never truncated") from None


def _tree_output(out, trees, V) -> tuple:
    """A tree kernel's ``(accept_index [B, S], next_tokens [B])`` as ``((path, next token), ...)`` per row,
    or ``Misbehaved(INVALID)``.  Runs as :func:`call`'s ``convert`` (inside the time limit); everything
    that touches ``out`` runs under :func:`foreign`, so that whatever its methods raise (``SystemExit``
    included) is ``invalid output``.  A row of ``accept_index`` is read to at most ``_MAX_WIDTH``
    entries per node (a path has at most ``N``, the rest is -1 padding): an endless row is refused.
    Each entry is an id (:func:`_tree_id`: floats and bools refused), entry 0 is the root 0, and only
    trailing -1 is padding (SPEC §11.9, as ``tree_batch`` reads it)."""
    batch, N = len(trees), trees[0].size
    most = _MAX_WIDTH * (N + 1)
    with foreign("kernel returned an output that is not (accept_index [B, S], next_tokens [B])"):
        accept_index, tokens = out
        raw = [list(itertools.islice(iter(accept_index[b]), most + 1)) for b in range(batch)]
        raw_tokens = [tokens[b] for b in range(batch)]
    rows = []
    for b, (entries, token) in enumerate(zip(raw, raw_tokens)):
        if len(entries) > most:
            raise Misbehaved(INVALID, f"row {b}: accept_index has more than {most} entries for a tree of {N} nodes")
        with foreign(f"row {b}: accept_index[{b}] and next_tokens[{b}] must hold ids"):
            try:
                index, token = [_tree_id(i) for i in entries], _tree_id(token)
            except TypeError as e:
                raise Misbehaved(INVALID, f"row {b}: accept_index[{b}] or next_tokens[{b}] holds {e}") from None
        if not index or index[0] != 0:
            raise Misbehaved(INVALID, f"row {b}: accept_index[{b}][0] = {index[0] if index else 'nothing'}, not the "
                                      f"root 0 (accept_index holds the root, then the accepted nodes)")
        inner = _inner_padding(index[1:])
        if inner is not None:
            raise Misbehaved(INVALID, f"row {b}: accept_index[{b}][{inner[0] + 1}] = -1 but accepted node {inner[1]} "
                                      f"follows it; only trailing -1 is padding")
        try:
            path = trees[b].check_path(_unpadded(index[1:]))
        except (TypeError, ValueError, IndexError) as e:
            raise Misbehaved(INVALID, f"row {b}: accept_index {index} is not a path of the tree: {e}") from None
        if not 0 <= token < V:
            raise Misbehaved(INVALID, f"row {b}: next token {token} outside the vocabulary 0..{V - 1}")
        rows.append((tuple(path), token))
    return tuple(rows)


def _impossible_kernel_outputs(stats, target_row):
    """Kernel outputs (per coin law) that emit a token of target probability 0 after its prefix."""
    found = []
    for cl, _names, _cands, trees in stats["laws"]:
        for o in cl:
            for b, (path, token) in enumerate(o):
                block = [trees[b].tokens[n] for n in path] + [token]
                if any(not target_row(tuple(block[:i]))[t] > 0 for i, t in enumerate(block)):
                    found.append(o)
                    break
    return found


def _tree_coin_case(kernel, case, settings, bits=None):
    started = time.perf_counter()
    stats: dict = {"evaluations": 0, "laws": []}
    bits = grid_bits(case.dtype, bits)
    try:
        got, expected, tight = _tree_coin_laws(kernel, case, settings, stats, bits)
    except NotPiecewiseConstant as e:
        return CaseResult(case, NOT_PIECEWISE, detail=f"{e} (searched in SGLang's coin order: uniform_samples[b, j] "
                                                      f"for node j, then uniform_final[b]; SPEC §11.9)")
    except CoinBudgetError as e:
        return CaseResult(case, BUDGET, detail=f"{e} (Settings.max_paths = {settings.max_paths})")
    status, cmp, impossible = _verdict(got, expected, tight, settings.tolerance)
    tc = case.tree
    target, _ = tc.models()
    config = SamplingConfig()
    row = lambda path: next_token_probs(target, list(tc.prompt) + list(path), config)  # noqa: E731

    def where(outputs):  # the outputs are blocks; the coins are the kernel's: name its boundary cells
        laws = [(cl, names, cands) for cl, names, cands, _ in stats["laws"]]
        return "kernel output (path, next token) per row " + _where(laws, _impossible_kernel_outputs(stats, row))

    detail = _explain(status, cmp, got, impossible, tight, bits, where, probes=case.probes)
    laws = [cl for cl, _, _, _ in stats["laws"]]
    cost = (f"{len(laws)} tree draw(s), {stats['evaluations']} kernel calls "
            f"({sum(c.probes for c in laws)} at probe points, {sum(c.bisections for c in laws)} bisecting, "
            f"{sum(c.checks for c in laws)} checks), {sum(len(c.cells) for c in laws)} cells, "
            f"{case.dtype} coins (2^-{bits} grid), {time.perf_counter() - started:.2f} s")
    return CaseResult(case, status, tv=cmp.tv, detail=f"{detail}; {cost}")


def run_tree_coins(level, kernel, cases, settings):
    """The ``tree_coins`` level: the kernel's coin law inside the tree program, through the one runner."""
    _exact_only(level.name, settings)
    return run_cases(level, cases, settings, validate=_validate_tree_coin_case,
                     exact=lambda case: partial(at_two_grids, partial(_tree_coin_case, kernel, case, settings),
                                                grid_bits(case.dtype)), statistical=None)


# ---------------------------------------------------------------- engine-style kernels (trees)


def sglang_coin_kernel(candidates, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_final,
                       target_probs, *, inclusive=False):
    """(correct) SGLang's target-only tree sampling on float coins, row by row in NumPy.

    At node ``cur`` with coin ``u``: walk the children keeping a running sum of their target
    probabilities; accept the first child with ``u < running sum`` (``inclusive=True``: ``u <=``,
    the bug: u = 0 accepts a child with p = 0); a tried child's probability goes to a scratch row.
    On stopping, draw the next token from ``max(p[cur] - scratch, 0)`` by ``#{j : cdf_j <= u_final * total}``.
    """
    p = np.asarray(target_probs)
    u_all = np.asarray(uniform_samples)
    fin = np.asarray(uniform_final)
    B, N, V = p.shape
    width = 0
    accepts, tokens = [], []
    for b in range(B):
        scratch = np.zeros((N, V), dtype=p.dtype)
        accept, cur = [0], 0
        while True:
            u = u_all[b, cur]
            runsum = p.dtype.type(0)
            child, chosen = retrive_next_token[b][cur], -1
            while child != -1:
                x = candidates[b][child]
                runsum = runsum + p[b, cur, x]
                if (u <= runsum) if inclusive else (u < runsum):
                    chosen = child
                    break
                scratch[cur, x] = p[b, cur, x]
                child = retrive_next_sibling[b][child]
            if chosen == -1:
                break
            accept.append(chosen)
            cur = chosen
        w = np.maximum(p[b, cur] - scratch[cur], 0)
        cdf = np.cumsum(w)
        y = int(np.sum(cdf <= fin[b] * cdf[-1]))
        tokens.append(min(y, int(np.flatnonzero(w > 0)[-1])))
        accepts.append(accept)
        width = max(width, len(accept))
    return [a + [-1] * (width - len(a)) for a in accepts], tokens


def sglang_inclusive_kernel(candidates, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_final,
                            target_probs):
    """Accept a child iff ``u <= running sum``: u = 0 accepts a first child of target probability 0."""
    return sglang_coin_kernel(candidates, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_final,
                              target_probs, inclusive=True)


# ---------------------------------------------------------------- default cases


def _f(text_rows):
    """Nested lists of "a/b" strings -> an object array of Fractions."""
    def conv(r):
        return [conv(v) for v in r] if isinstance(r, (list, tuple)) else Fraction(r)
    return np.array(conv(text_rows), dtype=object)


def default_coin_cases() -> list:
    """Small tight cases (dyadic rows, power-of-two draft probabilities and residual masses: every
    threshold is a float32 grid point, and the engine-style kernel's arithmetic is exact)."""
    # V = 4, K = 2; q entries powers of two, so coin * q is exact; residual masses 1/2 and 1/4
    p = [["1/4", "0", "1/2", "1/4"], ["1/8", "1/8", "1/4", "1/2"], ["1/4", "1/4", "1/4", "1/4"]]
    q = [["1/2", "1/4", "1/8", "1/8"], ["1/4", "1/4", "1/4", "1/4"]]
    p2 = [["1/2", "1/4", "1/8", "1/8"], ["0", "1/2", "1/4", "1/4"], ["1/8", "3/8", "1/4", "1/4"]]
    q2 = [["1/4", "1/4", "1/4", "1/4"], ["1/2", "1/4", "1/8", "1/8"]]
    rows_p, rows_q = _f([p, p2]), _f([q, q2])
    drafts = (((1, 2), (0, 1)),  # row 0 drafts token 1 with p = 0; row 1 token 0 (p > q: sure)
              ((0, 3), (2, 0)),  # p/q = 1/2 at row 0; row 1's second draft has p = 0
              ((2, 3), (1, 1)))  # sure accepts, then p/q = 2 and 1; row 1: p = q then p/q = 1
    return [
        CoinCase("V4-K2-float32", rows_p, rows_q, drafts=drafts),
        CoinCase("V4-K2-float64", rows_p, rows_q, drafts=drafts, dtype="float64"),
        CoinCase("V4-ragged", rows_p, rows_q, drafts=(((1,), (0, 1)), ((0,), (2, 0))), num_draft=(1, 2)),
        # point mass: each draft has p in {0, 1/2}, so every residual (p without the draft) has mass 1 or 1/2
        CoinCase("V4-point-mass", rows_p, None, drafts=(((1, 3), (0, 1)), ((2, 3), (0, 0)))),
    ]


def large_coin_case(dtype: str = "float32") -> CoinCase:
    """The performance case: B = 2, K = 3, V = 8, three draft tuples; tight (draft probabilities
    powers of two, every residual of mass 1/4: each threshold a float32 grid point)."""
    K = 3
    base_p = ["1/8", "0", "1/4", "1/16", "1/8", "3/16", "1/8", "1/8"]  # p/q: 2, 0, 2, 1/2, 2, 3/4, 1, 1
    base_q = ["1/16", "1/8", "1/8", "1/8", "1/16", "1/4", "1/8", "1/8"]
    p = _f([[base_p[i:] + base_p[:i] for i in range(K + 1)] for _ in range(2)])
    q = _f([[base_q[i:] + base_q[:i] for i in range(K)] for _ in range(2)])
    drafts = (((1, 0, 3), (5, 6, 7)), ((2, 2, 2), (0, 4, 1)), ((0, 7, 6), (3, 3, 4)))
    return CoinCase(f"V8-K3-{dtype}", p, q, drafts=drafts, dtype=dtype)


def default_tree_coin_cases() -> list:
    """Small tree cases: a draft top-2 that holds a token of target probability 0 (V = 4, dyadic)."""
    target = _f([["1/2", "1/4", "0", "1/4"], ["1/4", "1/4", "1/4", "1/4"], ["1/2", "0", "1/4", "1/4"],
                 ["1/8", "1/8", "1/4", "1/2"]])
    draft = _f([["1/8", "1/4", "1/2", "1/8"], ["1/4", "1/2", "1/8", "1/8"], ["1/4", "1/2", "1/8", "1/8"],
                ["1/4", "1/4", "1/4", "1/4"]])
    one = TreeCase("zero-child", target, draft, widths=(2,))
    two = TreeCase("zero-child-depth2", target, draft, widths=(2, 1))
    return [
        TreeCoinCase("zero-child-float32", one, batch=2),
        TreeCoinCase("zero-child-float64", one, batch=2, dtype="float64"),
        TreeCoinCase("depth2-batch1", two, batch=1),
    ]


LEVELS = (
    Level("batched_coins", "kernel(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], "
                           "uniform_coins [B, K], final_coins [B]) -> [B, K+1] padded with -1",
          default_coin_cases, run_batched_coins, validate=lambda level, case, settings: _validate_coin_case(case),
          reference=fixed_reference(engine_coin_kernel), statistical=False),
    Level("tree_coins", "kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N], "
                        "uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) "
                        "-> (accept_index [B, S], next_tokens [B])", default_tree_coin_cases, run_tree_coins,
          validate=lambda level, case, settings: _validate_tree_coin_case(case),
          reference=fixed_reference(sglang_coin_kernel), statistical=False),
)
"""The coin-fed levels: exact laws of kernels handed float coins."""
