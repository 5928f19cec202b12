"""The batched oracle levels: batched ragged steps and drafts sampled inside the implementation.

SPEC §3 and §6, row by row.  Two levels, listed in :data:`specref.verification.levels.LEVELS`:

- ``"batched"``: ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)
  -> [B, K+1]`` padded with -1 (or ``(tokens, n_emitted)``, or ``(tokens, n_accepted, n_emitted)``).
  The oracle draws the drafts (from ``q_draft``, or from the case's hidden ``proposal`` when it
  passes ``q_draft = None``: point-mass drafts); ragged rows carry -1 after their ``k_b`` drafts.
- ``"draft_and_verify"``: ``step_fn(p_target [B, K+1, V], q_draft [B, K, V], seed) -> [B, K+1]``;
  the implementation samples its drafts itself, so coupling between draft noise, acceptance
  coins and recovery noise is in scope.

The criterion is the chain rule of Leviathan et al. (2022, Algorithm 1), per row and with rows
independent: row ``b`` emits ``(x_1..x_n, y)`` with probability
``prod_{i<n} a_i(x_i) * (1 - a_n(x_n)) * r_n(y)`` given its drafts (``a = min(1, p/q)``, or ``p``
for point-mass drafts; ``r`` the residual), ``p_{k_b}(y)`` for the bonus.  Rows here are fixed
per position (they do not depend on the drafted prefix), so the law of every row is in closed
form (:func:`row_law`, independent of :mod:`specref.decoding.batched`).  A lossless verifier
with another block law (block verification) is a different contract and differs here.

Modes:

- exact: ``seed`` is the enumerating generator (:mod:`specref.verification.laws.enumeration`), rows are the
  case's ``Fraction`` arrays; the joint law of (drafts, output) of every row is compared with the
  product of the rows' closed forms.  ``BatchedCase.grid = 24`` puts the coins on the float32 grid,
  so an inclusive ``u <= t`` test is an exact, nonzero TV.
- statistical: ``seed`` is an int; one call yields B samples.  The case's rows are tiled into
  calls of at most ``memory_budget`` bytes and at most one block of
  :data:`specref.verification.statistics.shards.BLOCK` copies, handed over as float32 NumPy or torch arrays
  (``BatchedCase.array``).  Block ``j`` draws from its own ``SeedSequence`` child and blocks run in
  shards on any executor (``Settings.executor``), so a verdict and its numbers do not depend on the
  worker count or the shard size; the outputs are reduced to low-dimensional statistics whose exact
  laws are computed per case (:func:`statistics_nulls`): the accepted length; length x final-token
  bucket; rejected draft x residual draw (batched level); the residual draw by the residual's own
  quantiles, with a category for tokens outside its support; the emitted token per position bucketed
  by target-probability quantiles; seeded random hash buckets of (position, token); and the
  accepted lengths of disjoint row pairs at batch distance 1 and 2 (rows must be independent).
  Each is G-tested at ``alpha / m`` (Bonferroni over the ``m`` statistics of the case); N per row
  is the largest that any statistic needs to detect ``detect_tv`` with power 0.9 at that level,
  and the report states the TV each statistic can detect at N.

Inputs: every call gets its own read-only copies of the rows and drafts (torch tensors: clones,
whose version counters show a write); a write is the status ``writes into its inputs``, and the
oracle counts its own drafts, never what it handed over.  The output is parsed
(:func:`parse_output`) inside the guarded call, so ``.cpu()``, ``__array__`` or iteration that
raise (``SystemExit`` included) or never end are ``invalid output`` or a time-out.  Cases are
validated on construction (:class:`BatchedCase`); an exact case whose law has more than
``max_paths`` outcomes is ``over budget`` before it runs.

Malformed outputs get a status naming the row: ``emits an invalid id`` for an id no engine may
emit -- a placeholder before a real token, an id outside ``0..V-1``, an accepted position whose
draft is a placeholder; ``invalid output`` for the rest -- a count that disagrees with the tokens,
a row longer than ``k_b + 1``, an accepted position that is not the draft token, no token, a wrong
dtype or shape.

Per-request fields (SPEC §11.8, the ``vllm`` level's callers): a case may say which requests are
greedy (``BatchedCase.greedy``: their law is the chain rule on one-hot rows at the target's argmax,
while the implementation is handed the real rows), which are seeded (``seeded``: drawn from a
generator of their own), and which carry placeholder drafts (``padded``: -1 in the last of their
``k_b`` draft positions; the law cuts the row at its first placeholder, the token there drawn from
the target row there).  :func:`law_case` is the plain case with that law.  Such a case is run only
with a step_fn that declares ``specref_requests = True``: it is called with the keyword
``requests=`` (:class:`Requests`), which carries the flags explicitly -- never guessed from the rows.
In statistical mode a case with seeded requests is first probed for seeded reproducibility (the
same call with the global generator seeded otherwise must give every seeded request the same
tokens, else ``bad rng use``).  ``BatchedCase.statistical_only`` cases (float rows at a real
vocabulary, beyond enumeration) are left out of exact checks; ``BatchedCase.samples`` fixes N.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, replace
from functools import partial
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.backend import to_host
from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.core.step import residual_weights
from specref.decoding.batched import PLACEHOLDER, batched_draft_and_verify, batched_step, check_placeholder, row_tolerance
from specref.verification.running.calling import (Misbehaved, call, can_isolate, foreign, guarded,
                                                  short_repr)
from specref.verification.laws.enumeration import compare, law
from specref.verification.levels.runner import PILOT, run_cases, samples_in_budget
from specref.verification.levels.batched.coin_route import BATCHED, ROUTE, routed_planner, routed_run
from specref.verification.running.level import CasePlan, Level, Option, fixed_reference
from specref.verification.running.progress import progress_bar
from specref.verification.running.report import (DIFFERS, EMITS_INVALID, INVALID, OK, RNG_MISUSE, WRITES, CaseResult,
                                                 Report, Settings, law_verdict)
from specref.verification.statistics.shards import BLOCK, Sampler, calls_for, tally, tally_blocks, timed_calls
from specref.verification.statistics.counts import PLAN_POWER, compare_counts, planned_n, planned_power

__all__ = [
    "BatchedCase",
    "Requests",
    "law_case",
    "takes_requests",
    "row_law",
    "parse_output",
    "statistics_nulls",
    "default_batched_cases",
    "large_vocab_case",
    "run_batched",
]

MEMORY_BUDGET = 1 << 26  # bytes of input rows per call in statistical mode (64 MiB; the reference holds ~6x that)
_BUCKETS = 8  # target-probability quantile buckets per position
_PAIR_BUCKETS = 4  # buckets of the rejected draft and of the residual draw
_HASH_BUCKETS = 16  # seeded hash buckets of (position, token)
_OUTSIDE = 1e-9  # residual mass at most this times the row's largest counts as outside its support
MAX_SAMPLES = 2_000_000  # statistical mode: N per row is capped here
SEEDED_PROBE_COPIES = 64  # statistical mode: copies of a case's rows in each call of the seeded-reproducibility probe


@dataclass(frozen=True)
class BatchedCase:
    """One batch: plain data that reproduces a verdict.

    ``p_target`` [B, K+1, V] and ``q_draft`` [B, K, V] hold Fractions (exact) or floats.
    ``q_draft = None`` hands the implementation point-mass drafts drawn from ``proposal``.
    ``num_draft`` (per-row ``k_b``) makes rows ragged.

    Per-request fields (SPEC §11.8; run only with a step_fn that declares ``specref_requests``,
    :class:`Requests`): ``greedy`` (B bools: True for a greedy request, whose law is the chain
    rule on one-hot rows at the target's argmax -- :func:`law_case`; its rows 0..k_b must have a
    unique argmax, in float32 too), ``seeded`` (B bools: True for a request with a generator of
    its own) and ``padded`` (B counts: row ``b``'s last ``padded[b]`` of its ``k_b`` drafts are
    placeholders -1, with point-mass drafts only).  ``samples``: statistical mode's N per row
    when the check sets none.  ``statistical_only``: an exact check leaves the case out (float
    rows at a vocabulary no enumeration covers).

    Validated on construction, each error a SpecrefError naming the field and the value: every
    row a distribution (Fraction rows summing to exactly 1, float rows finite, non-negative and
    summing to 1 within ``row_tolerance(float32, V)``), the shapes, ``num_draft`` (B counts in
    ``0..K``), ``grid`` (None or an int in 1..64), ``array``, ``dtype``, ``memory_budget`` (a
    positive int) and ``device`` (a torch device name, with ``array="torch"``; whether it exists
    is checked when a statistical check starts), and the per-request fields above.
    """

    name: str
    p_target: np.ndarray  # [B, K+1, V]
    q_draft: np.ndarray | None  # [B, K, V] or None (point-mass drafts)
    proposal: np.ndarray | None = None  # [B, K, V]: the drafts' law when q_draft is None
    num_draft: tuple | None = None  # k_b per row (None: K for every row)
    grid: int | None = None  # exact mode: coins on the grid k 2^-grid (24: float32 coins)
    array: str = "numpy"  # statistical mode: "numpy" or "torch" arrays for the implementation
    dtype: str = "float32"  # statistical mode: the rows' dtype ("float32" or "float64")
    memory_budget: int = MEMORY_BUDGET  # statistical mode: bytes of input rows per call
    device: str | None = None  # statistical mode, torch arrays: the device they are put on ("cuda")
    greedy: tuple | None = None  # per request: True -> greedy (law: one-hot rows at the argmax)
    seeded: tuple | None = None  # per request: True -> drawn from a generator of its own
    padded: tuple | None = None  # per request: its last padded[b] of k_b drafts are placeholders (-1)
    samples: int | None = None  # statistical mode: N per row when the check sets no samples
    statistical_only: bool = False  # an exact check leaves the case out (float rows beyond enumeration)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise SpecrefTypeError(f"BatchedCase name must be a string, got {self.name!r:.80}")
        where = f"BatchedCase {self.name!r}"
        p = _case_rows(where, "p_target", self.p_target)
        B, K1, V = p.shape
        q = None if self.q_draft is None else _case_rows(where, "q_draft", self.q_draft, (B, K1 - 1, V), like=p)
        d = None if self.proposal is None else _case_rows(where, "proposal", self.proposal, (B, K1 - 1, V), like=p)
        for name, value in (("p_target", p), ("q_draft", q), ("proposal", d)):
            object.__setattr__(self, name, value)
        if self.num_draft is not None:
            object.__setattr__(self, "num_draft", _case_num_draft(where, self.num_draft, B, K1 - 1))
        g = self.grid
        if g is not None and (isinstance(g, (bool, np.bool_)) or not isinstance(g, (int, np.integer)) or not 1 <= g <= 64):
            raise SpecrefError(f"{where}: grid must be None or an int in 1..64 (coins k 2^-grid; 24: float32), got {g!r:.80}")
        if not isinstance(self.array, str) or self.array not in ("numpy", "torch"):
            raise SpecrefError(f"{where}: array must be 'numpy' or 'torch', got {self.array!r:.80}")
        if not isinstance(self.dtype, str) or self.dtype not in ("float32", "float64"):
            raise SpecrefError(f"{where}: dtype must be 'float32' or 'float64', got {self.dtype!r:.80}")
        m = self.memory_budget
        if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)) or m < 1:
            raise SpecrefError(f"{where}: memory_budget must be a positive int (bytes of rows per call), got {m!r:.80}")
        if self.device is not None and (not isinstance(self.device, str) or not self.device or self.array != "torch"):
            raise SpecrefError(f"{where}: device is a torch device name (with array='torch'), got {self.device!r:.80} "
                               f"with array={self.array!r}")
        _case_requests(self, where)

    @property
    def shape(self):
        return tuple(self.p_target.shape)

    @property
    def vocab_size(self) -> int:
        return self.p_target.shape[2]

    @property
    def k(self) -> np.ndarray:
        B, K1, _ = self.p_target.shape
        return np.full(B, K1 - 1, dtype=np.int64) if self.num_draft is None else np.array(self.num_draft, dtype=np.int64)

    @property
    def drafts_from(self) -> np.ndarray | None:
        return self.q_draft if self.q_draft is not None else self.proposal

    @property
    def exact(self) -> bool:
        return self.p_target.dtype == object

    def as_float(self) -> "BatchedCase":
        f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
        return replace(self, p_target=np.asarray(self.p_target, dtype=np.float64), q_draft=f(self.q_draft),
                       proposal=f(self.proposal))

    def __repr__(self):
        B, K1, V = self.shape
        more = "".join(f", {name}={getattr(self, name)}" for name in ("greedy", "seeded", "padded", "samples")
                       if getattr(self, name) is not None) + (", statistical_only=True" if self.statistical_only else "")
        return (f"BatchedCase({self.name!r}, B={B}, K={K1 - 1}, V={V}, point_mass={self.q_draft is None}, "
                f"num_draft={self.num_draft}, grid={self.grid}{more})")


def _case_rows(where, name, rows, shape=None, *, like=None):
    """A case's probability rows ``[B, R, V]``, validated: Fraction (object) rows summing to exactly 1,
    or float rows (returned as they are) finite, non-negative and summing to 1 within
    ``row_tolerance(float32, V)``; ``shape`` and ``like`` (the same kind as ``p_target``) when given."""
    if isinstance(rows, (list, tuple)):
        try:
            obj = np.asarray(rows, dtype=object)
            rows = obj if any(isinstance(v, Fraction) for v in obj.ravel()) else np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise SpecrefError(f"{where}: {name} is not a [B, R, V] table of probabilities ({e})") from None
    if not isinstance(rows, np.ndarray):
        raise SpecrefTypeError(f"{where}: {name} must be a NumPy array [B, R, V], got {type(rows).__name__}")
    if rows.ndim != 3 or 0 in rows.shape:
        raise SpecrefError(f"{where}: {name} must have shape [B, K+1, V] (3-D, no empty axis), got {rows.shape}")
    if shape is not None and rows.shape != shape:
        raise SpecrefError(f"{where}: {name} must have shape [B, K, V] = {list(shape)} (from p_target), "
                           f"got {list(rows.shape)}")
    if rows.dtype.kind in "iub":
        rows = rows.astype(np.float64)
    exact = rows.dtype == object
    if like is not None and exact != (like.dtype == object):
        raise SpecrefError(f"{where}: {name} and p_target must both hold Fractions (object) or both floats")
    B, R, V = rows.shape
    if exact:
        for b, i in np.ndindex(B, R):
            row = rows[b, i]
            if not all(type(v) in (Fraction, int) for v in row):
                raise SpecrefTypeError(f"{where}: {name}[{b}, {i}] must hold Fractions, got {list(row)!r:.120}")
            if min(row) < 0:
                raise SpecrefError(f"{where}: {name}[{b}, {i}] has a negative entry: {list(map(str, row))}")
            if sum(row) != 1:
                raise SpecrefError(f"{where}: {name}[{b}, {i}] sums to {sum(row)}, not exactly 1")
        return rows
    if rows.dtype.kind != "f" or rows.dtype.itemsize < 4:
        raise SpecrefError(f"{where}: {name} must hold Fractions or float32/float64 probabilities, got dtype {rows.dtype}")
    r64 = rows.astype(np.float64)
    bad = ~np.isfinite(r64).all(axis=2)
    if bad.any():
        b, i = map(int, np.argwhere(bad)[0])
        raise SpecrefError(f"{where}: {name}[{b}, {i}] is not finite (NaN or inf)")
    neg = (r64 < 0).any(axis=2)
    if neg.any():
        b, i = map(int, np.argwhere(neg)[0])
        raise SpecrefError(f"{where}: {name}[{b}, {i}] has a negative entry")
    sums, tol = r64.sum(axis=2), row_tolerance(np.float32, V)
    off = np.abs(sums - 1) > tol
    if off.any():
        b, i = map(int, np.argwhere(off)[0])
        raise SpecrefError(f"{where}: {name}[{b}, {i}] sums to {sums[b, i]!r}, not 1 within {tol:.3g}")
    return rows


def _case_num_draft(where, num_draft, B, K) -> tuple:
    if isinstance(num_draft, (str, bytes)) or not hasattr(num_draft, "__iter__"):
        raise SpecrefTypeError(f"{where}: num_draft must be None or B = {B} counts in 0..{K}, got {num_draft!r:.80}")
    counts = tuple(num_draft.tolist() if hasattr(num_draft, "tolist") else num_draft)
    if len(counts) != B or any(isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or not 0 <= c <= K
                               for c in counts):
        raise SpecrefError(f"{where}: num_draft must be None or B = {B} counts in 0..{K}, got {num_draft!r:.80}")
    return tuple(int(c) for c in counts)


def _case_flags(where, name, flags, B) -> tuple | None:
    """``greedy`` or ``seeded``: None, or B bools (a tuple, list or 1-D array), one per request."""
    if flags is None:
        return None
    if isinstance(flags, np.ndarray):
        flags = flags.tolist() if flags.ndim == 1 else flags
    if not isinstance(flags, (tuple, list)) or len(flags) != B:
        raise SpecrefError(f"{where}: {name} must be None or B = {B} bools, one per request, got {flags!r:.80}")
    for b, v in enumerate(flags):
        if not isinstance(v, (bool, np.bool_)):
            raise SpecrefError(f"{where}: {name}[{b}] = {v!r:.40} is not a bool (a {type(v).__name__}); {name} holds "
                               f"B = {B} bools, one per request")
    return tuple(bool(v) for v in flags)


def _case_requests(case, where):
    """Validate (and normalise) a case's per-request fields, ``samples`` and ``statistical_only``."""
    B, K1, V = case.p_target.shape
    for name in ("greedy", "seeded"):
        object.__setattr__(case, name, _case_flags(where, name, getattr(case, name), B))
    k = case.k
    if case.padded is not None:
        pad = case.padded
        items = pad.tolist() if isinstance(pad, np.ndarray) else pad
        if not isinstance(items, (tuple, list)) or len(items) != B or any(
                isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or not 0 <= c <= k[b]
                for b, c in enumerate(items)):
            raise SpecrefError(f"{where}: padded must be None or B = {B} counts, padded[b] in 0..k_b "
                               f"(k = {k.tolist()}), got {pad!r:.80}")
        if case.q_draft is not None:
            raise SpecrefError(f"{where}: padded = {tuple(items)} needs point-mass drafts (q_draft = None): "
                               "placeholder drafts come without draft probabilities, as vLLM's padded drafter lays "
                               "them out")
        object.__setattr__(case, "padded", tuple(int(c) for c in items))
    n = case.samples
    if n is not None and (isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1):
        raise SpecrefError(f"{where}: samples must be None or a positive int (N per row), got {n!r:.80}")
    if not isinstance(case.statistical_only, (bool, np.bool_)):
        raise SpecrefError(f"{where}: statistical_only must be a bool, got {case.statistical_only!r:.80}")
    object.__setattr__(case, "statistical_only", bool(case.statistical_only))
    if case.greedy is not None:
        cut = k - (0 if case.padded is None else np.array(case.padded))
        for b in np.flatnonzero(case.greedy):
            for i in range(int(cut[b]) + 1):
                _unique_argmax(where, case.p_target[b, i], b, i)


def _unique_argmax(where, row, b, i) -> int:
    """The argmax of a greedy request's row; SpecrefError on a tie (exact, float64 or float32 log)."""
    if row.dtype == object:
        top = max(row)
        ties = [j for j, v in enumerate(row) if v == top]
        shown = str(top)
    else:
        r64 = row.astype(np.float64)
        with np.errstate(divide="ignore"):
            z32 = np.log(row.astype(np.float32))
        order = np.argsort(-r64, kind="stable")
        ties = [int(order[0])] + [int(j) for j in order[1:2] if r64[j] == r64[order[0]] or z32[j] == z32[order[0]]]
        shown = repr(float(r64[order[0]]))
    if len(ties) > 1:
        raise SpecrefError(f"{where}: greedy[{b}] is True, but p_target[{b}, {i}] has a tied argmax (tokens "
                           f"{ties[0]} and {ties[1]}, each {shown}): a greedy request needs a unique argmax (an engine "
                           "breaks ties its own way, so the law would be a guess)")
    return ties[0]


def law_case(case: BatchedCase) -> BatchedCase:
    """The plain batched case whose law (§11.7) is ``case``'s (SPEC §11.8); ``case`` itself without
    greedy or padded requests.

    A padded request is cut at its first placeholder: ``k_b - padded_b`` drafts, and the target
    row at the placeholder as its last row (the token there is drawn from it: vLLM rejects a
    placeholder draft and draws from the target row, nothing to remove).  A greedy request's rows
    ``0..k_b`` (after the cut) are one-hot at their argmax: the chain rule on them accepts a
    draft exactly when it is the argmax and emits the argmax at the first mismatch, or the bonus
    (the bonus row's argmax).  ``seeded`` does not change the law.
    """
    if case.greedy is None and case.padded is None:
        return case
    k = case.k - (0 if case.padded is None else np.array(case.padded, dtype=np.int64))
    p = case.p_target.copy()
    zero, one = (Fraction(0), Fraction(1)) if case.exact else (0.0, 1.0)
    for b in np.flatnonzero(case.greedy or ()):
        for i in range(int(k[b]) + 1):
            top = _unique_argmax(f"BatchedCase {case.name!r}", p[b, i], b, i)
            p[b, i] = zero
            p[b, i, top] = one
    return replace(case, p_target=p, num_draft=tuple(int(n) for n in k), greedy=None, seeded=None, padded=None)


def takes_requests(fn) -> bool:
    """Whether ``fn`` declares ``specref_requests = True``: it is then called with ``requests=``
    (:class:`Requests`).  An attribute that cannot be read declares nothing."""
    try:
        return getattr(fn, "specref_requests", False) is True
    except Exception:  # noqa: BLE001 - a hostile __getattr__ declares nothing
        return False


@dataclass(frozen=True)
class Requests:
    """A call's per-request fields, handed as the keyword ``requests=`` to a step_fn that declares
    ``specref_requests = True`` (SPEC §11.8; the ``vllm`` level's adapter does), one entry per row.

    ``num_draft``: each row's ``k_b`` with its placeholder drafts counted (``draft_tokens`` holds -1
    from a row's first placeholder on, so the counts cannot be read off it); ``greedy``; ``seeded``
    (None where the case says nothing); ``global_draw``: which seed the call's global generator
    gets -- 0, and 1 in the seeded-reproducibility probe's second call.
    """

    num_draft: tuple
    greedy: tuple
    seeded: tuple | None = None
    global_draw: int = 0


def _requests(case: BatchedCase, copies: int, global_draw: int = 0) -> Requests:
    """The case's per-request fields for a call on ``copies`` tiled copies of its rows."""
    B = case.shape[0]
    greedy = case.greedy or (False,) * B
    return Requests(tuple(int(n) for n in np.tile(case.k, copies)), greedy * copies,
                    None if case.seeded is None else case.seeded * copies, global_draw)


def _has_requests(case) -> bool:
    return any(getattr(case, name, None) is not None for name in ("greedy", "seeded", "padded"))


def _validate_case(level: str, case, settings=None, takes: bool | None = None):
    if not isinstance(case, BatchedCase):
        raise SpecrefError(f"cases of the {level} level must be BatchedCase objects, got {case!r:.200}")
    B, K1, V = case.shape
    if case.q_draft is None:
        if level == "draft_and_verify":
            raise SpecrefError(f"case {case.name!r}: the draft_and_verify level needs q_draft (it samples from it)")
        if case.proposal is None:
            raise SpecrefError(f"case {case.name!r}: q_draft is None (point-mass drafts), so a proposal "
                               f"[B, K, V] = [{B}, {K1 - 1}, {V}] is needed")
    if _has_requests(case) and (level == "draft_and_verify" or takes is False):
        why = ("the draft_and_verify level takes none" if level == "draft_and_verify" else
               "only a step_fn that declares specref_requests = True is handed them (the vllm level's adapter does); "
               "judged without them it would be held to a law it was not told")
        raise SpecrefError(f"case {case.name!r} sets per-request fields (greedy={case.greedy}, seeded={case.seeded}, "
                           f"padded={case.padded}): {why}")
    if settings is not None and settings.mode == "exact" and not case.exact and not case.statistical_only:
        raise SpecrefError(f"case {case.name!r}: exact mode needs Fraction rows (object arrays)")
    if settings is not None and settings.mode == "statistical" and case.array == "torch":
        _check_torch_device(case)


def _check_torch_device(case):
    """SpecrefError unless torch imports and ``case.device`` (when set) holds a tensor.  Where CUDA is
    not yet started here, the device is tried in a forked worker: a process that has started CUDA
    cannot fork workers that use it, and isolated cases run in forked workers."""
    try:
        import torch  # the torch path is optional: imported where it is used
    except ImportError as e:
        raise SpecrefError(f"case {case.name!r}: array='torch' needs torch ({e})") from None
    if case.device is None:
        return
    try:
        device = torch.device(case.device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise SpecrefError(f"case {case.name!r}: device {case.device!r} is not a torch device ({e})") from None
    probe = partial(_device_works, case.device)
    if device.type == "cpu" or torch.cuda.is_initialized() or not can_isolate():
        problem = probe()
    else:
        status, problem = guarded(probe, isolate=True, time_limit=120, case_time_limit=120)
        if status != "result":
            problem = f"{status}: {problem}"
    if problem:
        raise SpecrefError(f"case {case.name!r}: device {case.device!r} is not available here: {problem}")


def _device_works(device):
    """None when a tensor can be put on ``device``, else why not."""
    import torch

    try:
        torch.empty(1, device=device).cpu()
    except Exception as e:  # noqa: BLE001 - reported as a usage error
        return f"{type(e).__name__}: {e}"
    return None


# ---------------------------------------------------------------- exact laws (closed form)


def _row_parts(case, b):
    """Row ``b``'s rows: ``(p [K+1, V], q [K, V] or None, d [K, V])`` -- the target, the draft
    the acceptance test divides by (None: point-mass drafts) and the law the drafts are drawn
    from (``q_draft``, or ``proposal`` for point-mass drafts)."""
    p, d = case.p_target[b], case.drafts_from[b]
    q = None if case.q_draft is None else case.q_draft[b]
    return p, q, d


def _accept(p_i, q_i, x):
    if q_i is None:
        return p_i[x]
    r = p_i[x] / q_i[x]
    return r if r < 1 else r * 0 + 1


def _residual(p_i, q_i, x):
    """The correction's law after rejecting draft ``x`` at this position.  # [V]"""
    if q_i is None:
        w = np.array([v if j != x else v * 0 for j, v in enumerate(p_i)], dtype=p_i.dtype)
    else:
        w = np.array([a - b if a > b else a * 0 for a, b in zip(p_i, q_i)], dtype=p_i.dtype)
    total = w.sum()
    return w / total if total > 0 else p_i


def row_law(case: BatchedCase, b: int, *, with_drafts: bool = True) -> dict:
    """Exact law of row ``b``: ``{(drafts, emitted): P}`` (or ``{emitted: P}``), by the chain rule.

    Enumerates the ``V^k_b`` draft tuples; for small cases only (exact mode).  A case with greedy or
    padded requests is judged by :func:`law_case`'s rows (its draft tuples stop at the first placeholder).
    """
    case = law_case(case)
    p, q, d = _row_parts(case, b)
    k, V = int(case.k[b]), case.vocab_size
    out: dict = {}

    def add(key, w):
        if w > 0:
            out[key] = out.get(key, 0) + w

    for drafts in np.ndindex(*([V] * k)) if k else [()]:
        pd = 1
        for i, x in enumerate(drafts):
            pd = pd * d[i][x]
        if not pd > 0:
            continue
        reach = pd
        for n in range(k + 1):
            if n == k:
                for y in range(V):
                    key = (drafts, drafts + (y,)) if with_drafts else drafts + (y,)
                    add(key, reach * p[k][y])
                break
            a = _accept(p[n], None if q is None else q[n], drafts[n])
            reject = reach * (1 - a)
            if reject > 0:
                r = _residual(p[n], None if q is None else q[n], drafts[n])
                for y in range(V):
                    key = (drafts, drafts[:n] + (y,)) if with_drafts else drafts[:n] + (y,)
                    add(key, reject * r[y])
            reach = reach * a
            if not reach > 0:
                break
    return out


# ---------------------------------------------------------------- output checks


def parse_output(out, B, K, V, k, drafts=None, *, placeholder=PLACEHOLDER, what="step_fn"):
    """Validate a batched output; host ``(tokens [B, K+1] int64, n_emitted [B])`` or ``Misbehaved``.

    ``out``: ``[B, K+1]`` ids, or ``(tokens, n_emitted)``, or ``(tokens, n_accepted, n_emitted)``,
    any array backend.  ``drafts`` [B, K]: the accepted positions must hold them; ``k`` [B]: each
    row's drafts, placeholder drafts counted.  An id no engine may emit is ``emits an invalid id``
    (SPEC §13.3): the placeholder before a real token, an id outside ``0..V-1``, or an accepted
    position whose draft is the placeholder (a padded position taken as a draft); every other
    malformation (dtype, shape, no token, too many tokens, an accepted position that is not its
    draft, counts) is ``invalid output``.  Everything that
    touches ``out`` (``.cpu()``, ``__array__``, ``len``, indexing) runs under
    :func:`~specref.verification.running.calling.foreign`: whatever it raises, ``SystemExit``
    included, is ``invalid output``; the levels run this parser inside the guarded call (``convert``),
    so that a conversion that never ends is a time-out.  The checks then run on host copies.
    """
    placeholder = check_placeholder(placeholder, V)
    with foreign(f"{what} returned {short_repr(out)}, not [B, K+1] ids"):
        tokens, counts, dtype = _host_output(out)
    if tokens.dtype.kind not in "iu":
        raise Misbehaved(INVALID, f"{what} returned ids of dtype {dtype or tokens.dtype}; ids must be integers")
    if tokens.shape != (B, K + 1):
        raise Misbehaved(INVALID, f"{what} returned shape {tuple(tokens.shape)}; expected [B, K+1] = [{B}, {K + 1}]")
    tokens = tokens.astype(np.int64)
    n = _checked_tokens(tokens, K, V, k, drafts, placeholder)
    names = ("n_emitted",) if len(counts) == 1 else ("n_accepted", "n_emitted")
    for name, c in zip(names, counts):
        if c.dtype.kind not in "iuf":
            raise Misbehaved(INVALID, f"{what} returned {name} of dtype {c.dtype}; counts must be integers")
        if c.dtype.kind == "f" and not (np.isfinite(c) & (c == np.round(c))).all():  # NaN, inf, 2.5: no count
            raise Misbehaved(INVALID, f"{what} returned {name} = {c.tolist()[:8]}; counts must be whole numbers")
        want = n - 1 if name == "n_accepted" else n
        if c.shape != (B,) or (c.astype(np.int64) != want).any():
            b = 0 if c.shape != (B,) else int(np.argmax(c.astype(np.int64) != want))
            got = c.tolist() if c.shape != (B,) else int(c[b])
            raise Misbehaved(INVALID, f"row {b}: {name} = {got} disagrees with the tokens "
                                      f"({int(want[b])}): {tokens[b].tolist()}")
    return tokens, n


def _checked_tokens(tokens, K, V, k, drafts, placeholder) -> np.ndarray:
    """``parse_output``'s checks of the ids (``emits an invalid id``, then ``invalid output``): the tokens
    each row emits.  # [B, K+1] int64 -> [B]"""
    real = tokens != placeholder
    gap = real[:, 1:] & ~real[:, :-1]
    if gap.any():
        b, j = map(int, np.argwhere(gap)[0])
        raise Misbehaved(EMITS_INVALID, f"row {b}: placeholder at position {j} before the real token "
                                        f"{tokens[b, j + 1]} at position {j + 1}: {tokens[b].tolist()}")
    bad = real & ((tokens < 0) | (tokens >= V))
    if bad.any():
        b, j = map(int, np.argwhere(bad)[0])
        raise Misbehaved(EMITS_INVALID, f"row {b}: id {tokens[b, j]} at position {j} is outside the vocabulary "
                                        f"0..{V - 1}: {tokens[b].tolist()}")
    n = real.sum(axis=1)
    if (n == 0).any():
        b = int(np.argmax(n == 0))
        raise Misbehaved(INVALID, f"row {b}: no token emitted (every step emits at least one)")
    long = n > k + 1
    if long.any():
        b = int(np.argmax(long))
        raise Misbehaved(INVALID, f"row {b}: {n[b]} tokens emitted, but the row has {k[b]} drafts "
                                  f"(at most {k[b] + 1}): {tokens[b].tolist()}")
    if drafts is not None and K:
        accepted = np.arange(K)[None, :] < (n - 1)[:, None]
        padded = accepted & (drafts == placeholder)
        if padded.any():
            b, j = map(int, np.argwhere(padded)[0])
            raise Misbehaved(EMITS_INVALID, f"row {b}: accepted position {j}, whose draft is the placeholder "
                                            f"{placeholder} (a padded position, rejected by rule), and emitted "
                                            f"{tokens[b, j]} there: {tokens[b].tolist()}")
        wrong = accepted & (tokens[:, :K] != drafts)
        if wrong.any():
            b, j = map(int, np.argwhere(wrong)[0])
            raise Misbehaved(INVALID, f"row {b}: accepted position {j} holds {tokens[b, j]}, not the draft "
                                      f"token {drafts[b, j]}")
    return n


def _host_output(out):
    """``(tokens, counts, dtype name)``: host NumPy copies of an implementation's output (foreign code)."""
    counts = ()
    if isinstance(out, tuple) and len(out) in (2, 3) and getattr(out[0], "ndim", None) == 2:
        out, counts = out[0], tuple(out[1:])
    dtype = str(getattr(out, "dtype", ""))
    return _host(out), tuple(_host(c).reshape(-1) for c in counts), dtype


def _host(x) -> np.ndarray:
    """A host NumPy copy (base class, its own memory) of an array of any backend, or of a list."""
    h = to_host(x) if hasattr(x, "shape") else np.asarray(x)
    return np.array(h, copy=True, subok=False)


# ---------------------------------------------------------------- exact mode


def _draw_drafts_exact(rng, case):
    d, k = case.drafts_from, case.k
    B, K, V = d.shape
    x = np.full((B, K), PLACEHOLDER, dtype=np.int64)
    for b in range(B):
        for i in range(int(k[b])):
            x[b, i] = rng.choice(V, p=d[b, i])
    return x


def _read_only(a):
    """A read-only copy of the oracle's array for one call (None stays None): the implementation's own,
    and a write into it is NumPy's "read-only" error, reported as ``writes into its inputs``."""
    if a is None:
        return None
    out = np.array(a, copy=True)
    out.flags.writeable = False
    return out


def _expected_law(case, with_drafts, max_paths):
    """The product of the rows' exact laws, each within ``max_paths`` (SpecrefError over it: ``over budget``)."""
    B, K1, V = case.shape
    laws = []
    for b in range(B):
        tuples = V ** int(case.k[b])
        if tuples > max_paths:
            raise SpecrefError(f"case {case.name!r}: row {b} has {tuples} draft tuples (V={V}, k={int(case.k[b])}), "
                               f"over max_paths={max_paths}; shrink the case or raise max_paths")
        laws.append(row_law(case, b, with_drafts=with_drafts) if case.grid is None
                    else _grid_row_law(case, b, with_drafts, max_paths))
    size = math.prod(len(rl) for rl in laws)
    if size > max_paths:
        raise SpecrefError(f"case {case.name!r}: the joint law of its {B} rows has {size} outcomes, over "
                           f"max_paths={max_paths}; shrink the case or raise max_paths")
    expected = {(): Fraction(1) if case.exact else 1.0}
    for rl in laws:  # rows independent: the product of the rows' laws
        expected = {key + (o,): w * v for key, w in expected.items() for o, v in rl.items()}
    return expected


def _exact_case(level, fn, case, settings):
    """Every path of the case enumerated: each call gets read-only copies of the rows and the drafts,
    and its output is parsed inside the guarded call against the oracle's own drafts.  The expected
    law is :func:`law_case`'s; the implementation gets the case's own rows (and ``requests=`` when it
    takes them), its placeholder drafts as -1."""
    B, K1, V = case.shape
    K, k = K1 - 1, case.k
    lc = law_case(case)
    lk = lc.k  # drafts the oracle draws: up to each row's first placeholder
    with_drafts = level == "batched"
    expected = _expected_law(lc, with_drafts, settings.max_paths)
    p_in, q_in = _read_only(case.p_target), _read_only(case.q_draft)  # the same every call: read-only
    kwargs = {"requests": _requests(case, 1)} if takes_requests(fn) else {}

    def program(rng):
        if with_drafts:
            x = _draft_input(_draw_drafts_exact(rng, lc), lk)
            args = (p_in, q_in, _read_only(x), rng)
        else:
            x = None
            args = (p_in, q_in, rng)
        tokens, n = call(fn, args, kwargs, settings.time_limit, read_only=True,
                         convert=lambda out: parse_output(out, B, K, V, k, x))
        rows = tuple(tuple(int(t) for t in tokens[b, :n[b]]) for b in range(B))
        if with_drafts:
            rows = tuple((tuple(int(t) for t in x[b, :lk[b]]), rows[b]) for b in range(B))
        return rows

    got = law(program, grid=case.grid, max_paths=settings.max_paths)
    return law_verdict(case, compare(got, expected), settings.tolerance, label="rows, got, expected", top=2)


def _grid_row_law(case, b, with_drafts, max_paths=10**6):
    """Row ``b``'s law when every coin lies on the grid ``k 2^-grid``: the reference enumerated.

    On the grid ``P(u < t)`` is ``t`` rounded up to the grid, so the closed form no longer holds
    exactly; the reference (:func:`specref.decoding.batched.batched_step`, strict ``u < p/q`` and
    inverse-CDF draws ``cdf / total <= u``) enumerated under the same grid is the expected law.
    """
    p = case.p_target[b:b + 1]
    q = None if case.q_draft is None else case.q_draft[b:b + 1]
    d, k = case.drafts_from[b:b + 1], case.k[b:b + 1]

    def program(rng):
        if not with_drafts:  # the draft-and-verify reference draws its drafts with grid coins too
            steps = batched_draft_and_verify(p, q, rng)
            return tuple(int(t) for t in steps.tokens[0, :int(steps.n_emitted[0])])
        x = np.full((1, d.shape[1]), PLACEHOLDER, dtype=np.int64)
        for i in range(int(k[0])):
            x[0, i] = rng.choice(d.shape[2], p=d[0, i])
        steps = batched_step(p, q, x, rng, num_draft=k)
        out = tuple(int(t) for t in steps.tokens[0, :int(steps.n_emitted[0])])
        return tuple(int(t) for t in x[0, :int(k[0])]), out

    return law(program, grid=case.grid, max_paths=max_paths)


def _draft_input(x, k):
    return np.where(np.arange(x.shape[1])[None, :] < k[:, None], x, PLACEHOLDER)


# ---------------------------------------------------------------- statistics and their exact laws


def _mass_buckets(w, n_buckets):
    """Contiguous index ranges of about equal mass under ``w``.  # [V] -> [V] bucket ids"""
    total = w.sum()
    if not total > 0:
        return np.zeros(w.shape[0], dtype=np.int64)
    cdf = np.cumsum(w) / total
    prev = np.concatenate([[0.0], cdf[:-1]])
    return np.minimum((prev * n_buckets).astype(np.int64), n_buckets - 1)  # bucket of each token's left edge


def _quantile_buckets(p, n_buckets):
    """Tokens sorted by target probability, cut into ``n_buckets`` groups of about equal mass.  # [V] -> [V]"""
    order = np.argsort(-p, kind="stable")
    ids = np.empty(p.shape[0], dtype=np.int64)
    ids[order] = _mass_buckets(p[order], n_buckets)
    return ids


def _hash_buckets(V, position, n_buckets, salt):
    """Seeded random bucket of every (position, token): blake2b of (salt, position).  # -> [V]"""
    seed = int.from_bytes(hashlib.blake2b(f"{salt}:{position}".encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(n_buckets, size=V)


@dataclass
class _Stat:
    name: str  # what it measures, with the row(s)
    null: np.ndarray  # [categories] exact law
    code: object  # (tokens, n, drafts, rows) -> category per sample of its rows
    rows: tuple  # row types it reads (b,) or (a, b) for a pair at distance `distance`
    distance: int = 0


def statistics_nulls(case: BatchedCase, level: str, *, salt: int = 0) -> list:
    """The low-dimensional statistics of a case and their exact laws (float64, from the closed form of
    :func:`law_case`'s rows)."""
    f = law_case(case).as_float()
    B, K1, V = f.shape
    stats = []
    lengths = []
    for b in range(B):
        r = _row_chain(f, b)
        lengths.append(r.length)
        stats.append(_Stat(f"accepted length [row {b}]", r.length, lambda t, n, x: n - 1, (b,)))
        stats.append(_length_by_final_bucket(r, b))
        if level == "batched" and r.k:  # the drafts are the oracle's: batched level
            stats.append(_rejected_draft_by_residual_draw(r, b))
        if r.k:
            stats.append(_residual_support(r, b))
        stats.extend(_token_by_target_quantile(r, b))
        stats.append(_hash_of_final_token(r, b, V, salt))
    return stats + _row_pair_lengths(lengths, B)


@dataclass
class _RowChain:
    """Row ``b``'s chain rule, per position, as the statistics' nulls need it (float64)."""

    k: int  # drafts of the row
    p: np.ndarray  # [K+1, V] target rows
    q: np.ndarray | None  # [K, V] draft rows (None: point-mass drafts)
    d: np.ndarray  # [K, V] the drafts' law
    alpha: list  # [k] acceptance probability per position
    w: list  # [k+1] x [V]: P(reject at n & y) per position n < k, then the bonus row p[k]
    e: list  # [k] x [V]: P(draft z & reject) per position
    reach: np.ndarray  # [k+1]: A_n = P(L >= n)
    length: np.ndarray  # [k+1]: the law of the accepted length L


def _row_chain(f: BatchedCase, b: int) -> _RowChain:
    k = int(f.k[b])
    p, q, d = _row_parts(f, b)
    alpha, w, e = [], [], []  # per position: acceptance, P(reject & y) [V], P(draft z & reject) [V]
    for i in range(k):
        if q is None:
            acc = d[i] * p[i]
            w.append(p[i] * (1 - d[i]))
            e.append(d[i] * (1 - p[i]))
        else:
            acc = np.minimum(p[i], q[i])
            w.append(residual_weights(p[i], q[i]))  # the residual's weights
            e.append(residual_weights(q[i], p[i]))  # the rejection mass's weights
        alpha.append(acc.sum())
    reach = np.cumprod([1.0] + alpha)  # A_n = P(L >= n), n = 0..k
    w.append(p[k])
    length = np.array([reach[n] * (1 - alpha[n]) if n < k else reach[k] for n in range(k + 1)])
    return _RowChain(k, p, q, d, alpha, w, e, reach, length / length.sum())


def _length_by_final_bucket(r: _RowChain, b: int) -> _Stat:
    """Length x final-token bucket (contiguous equal-mass ranges of the final law at each length)."""
    fb = [_mass_buckets(r.w[n], _BUCKETS) for n in range(r.k + 1)]
    null = np.concatenate([[r.reach[n] * r.w[n][fb[n] == c].sum() for c in range(_BUCKETS)] for n in range(r.k + 1)])
    table = np.stack(fb)  # [k+1, V]
    return _Stat(f"length x final-token bucket [row {b}]", null / null.sum(),
                 lambda t, n, x, table=table: (n - 1) * _BUCKETS + table[n - 1, t[np.arange(len(n)), n - 1]], (b,))


def _rejected_draft_by_residual_draw(r: _RowChain, b: int) -> _Stat:
    """Rejected draft bucket x residual-draw bucket at the rejected position; one category for none."""
    k, p, d, e, w, reach, alpha = r.k, r.p, r.d, r.e, r.w, r.reach, r.alpha
    zb = [_mass_buckets(e[n], _PAIR_BUCKETS) for n in range(k)]
    yb = [_mass_buckets(w[n], _PAIR_BUCKETS) for n in range(k)]
    cells = []
    for n in range(k):
        for cz in range(_PAIR_BUCKETS):
            for cy in range(_PAIR_BUCKETS):
                Z, Y = zb[n] == cz, yb[n] == cy
                if r.q is None:  # the residual excludes the rejected draft itself
                    cell = d[n][Z].sum() * p[n][Y].sum() - (d[n] * p[n])[Z & Y].sum()
                else:
                    cell = e[n][Z].sum() * w[n][Y].sum() / max(1 - alpha[n], 1e-300)
                cells.append(reach[n] * max(cell, 0.0))
    cells.append(reach[k])
    null = np.array(cells)
    zt, yt = np.stack(zb), np.stack(yb)

    def pair_code(t, n, x, k=k, zt=zt, yt=yt):
        m = n - 1  # accepted
        rej = m < k
        mm = np.minimum(m, k - 1)
        z = x[np.arange(len(n)), mm]
        y = t[np.arange(len(n)), m]
        code = (mm * _PAIR_BUCKETS + zt[mm, np.maximum(z, 0)]) * _PAIR_BUCKETS + yt[mm, y]
        return np.where(rej, code, k * _PAIR_BUCKETS * _PAIR_BUCKETS)

    return _Stat(f"rejected draft x residual draw [row {b}]", null / null.sum(), pair_code, (b,))


def _residual_support(r: _RowChain, b: int) -> _Stat:
    """The residual draw by the residual's own quantiles, with one more category for the tokens the
    residual excludes (w = 0: a correct residual never draws them; a residual built from the wrong
    rows does, however little its draws move the other statistics)."""
    k, w, reach = r.k, r.w, r.reach
    rb = []
    for n in range(k):
        outside = w[n] <= _OUTSIDE * w[n].max()
        if r.q is not None:  # and outside in float32 too: rows engines get rounded may not flip a sign
            p32, q32 = (a.astype(np.float32).astype(np.float64) for a in (r.p[n], r.q[n]))
            w32 = residual_weights(p32 / p32.sum(), q32 / q32.sum())
            outside &= w32 <= _OUTSIDE * w32.max()
        ids = _quantile_buckets(np.where(outside, 0.0, w[n]), _BUCKETS)
        rb.append(np.where(outside, _BUCKETS, ids))  # [V]: 0.._BUCKETS-1 inside, _BUCKETS outside
    rt = np.stack(rb)  # [k, V]
    null = np.concatenate([[reach[n] * w[n][rt[n] == c].sum() for c in range(_BUCKETS + 1)] for n in range(k)]
                          + [[reach[k]]])

    def support_code(t, n, x, k=k, rt=rt):
        m = n - 1  # accepted; m < k: rejected at position m, t[m] is the residual draw
        mm = np.minimum(m, k - 1)
        code = mm * (_BUCKETS + 1) + rt[mm, t[np.arange(len(n)), mm]]
        return np.where(m < k, code, k * (_BUCKETS + 1))

    return _Stat(f"residual draw by residual quantile, outside-support category [row {b}]",
                 np.maximum(null, 0) / np.maximum(null, 0).sum(), support_code, (b,))


def _token_by_target_quantile(r: _RowChain, b: int) -> list:
    """The emitted token per position, bucketed by target-probability quantiles; category 0: not reached."""
    stats = []
    for j in range(r.k + 1):
        qb = _quantile_buckets(r.p[j], _BUCKETS)
        null = np.concatenate([[1 - r.reach[j]], [r.reach[j] * r.p[j][qb == c].sum() for c in range(_BUCKETS)]])
        stats.append(_Stat(f"token at position {j} by target quantile [row {b}]",
                           np.maximum(null, 0) / np.maximum(null, 0).sum(),
                           lambda t, n, x, j=j, qb=qb: np.where(n > j, 1 + qb[np.maximum(t[:, j], 0)], 0), (b,)))
    return stats


def _hash_of_final_token(r: _RowChain, b: int, V: int, salt: int) -> _Stat:
    """Seeded hash buckets of (position, final token)."""
    hb = np.stack([_hash_buckets(V, n, _HASH_BUCKETS, salt) for n in range(r.k + 1)])
    null = np.concatenate([[r.reach[n] * r.w[n][hb[n] == c].sum() for c in range(_HASH_BUCKETS)]
                           for n in range(r.k + 1)])
    return _Stat(f"hash of (position, final token) [row {b}]", null / null.sum(),
                 lambda t, n, x, hb=hb: (n - 1) * _HASH_BUCKETS + hb[n - 1, t[np.arange(len(n)), n - 1]], (b,))


def _row_pair_lengths(lengths: list, B: int) -> list:
    """Accepted lengths of disjoint row pairs in the tiled batch (row i and i + distance, distance 1 and 2)."""
    stats = []
    for dist in (1, 2):
        seen = set()
        for i in range(2 * dist * B):  # the pattern of row types repeats every lcm(B, 2 dist) rows
            a, c = i % B, (i + dist) % B
            if (i // dist) % 2 or (a, c) in seen:
                continue
            seen.add((a, c))
            null = np.outer(lengths[a], lengths[c]).reshape(-1)
            n_c = len(lengths[c])
            stats.append(_Stat(f"accepted lengths of rows {a} and {c} at batch distance {dist}", null,
                               lambda la, lb, ka=n_c: la * ka + lb, (a, c), dist))
    return stats


def _pair_indices(total_rows, B, dist, a, c):
    """Disjoint pairs (i, i + dist) with i // dist even, row types (a, c).  # -> [pairs], [pairs]"""
    i = np.arange(total_rows - dist)
    keep = ((i // dist) % 2 == 0) & (i % B == a) & ((i + dist) % B == c)
    return i[keep], i[keep] + dist


# ---------------------------------------------------------------- statistical mode


def _as_array(a, kind, dtype, device=None):
    if a is None:
        return None
    if kind == "torch":
        import torch  # the torch path is optional: imported where it is used

        t = torch.from_numpy(np.ascontiguousarray(a.astype(dtype)))
        return t if device is None else t.to(device)
    return np.ascontiguousarray(a.astype(dtype))


def _statistical_case(level, fn, case, settings, seed):
    """N batch draws in shards (:mod:`specref.verification.statistics.shards`: any executor, same numbers),
    each statistic's counts merged exactly, then G-tests at ``alpha / m`` (SPEC §6)."""
    started = time.perf_counter()
    f = case.as_float()
    stats = statistics_nulls(f, level, salt=seed)
    m = len(stats)
    level_alpha = settings.alpha / m
    outcomes = tuple((j, c) for j, s in enumerate(stats) for c in range(len(s.null)))  # each statistic's bins in turn
    if settings.samples or case.samples:
        n_rows = settings.samples or case.samples
    elif settings.budget_s is not None:  # a timed pilot of one call of PILOT copies, then what the budget buys
        pilot = _Recipe(level, fn, case, settings.time_limit, seed, _copies_per_call(case, PILOT))
        n_rows = samples_in_budget(lambda m: tally(pilot, outcomes, m, seed),
                                   settings, started, most=MAX_SAMPLES)
    else:
        n_rows = planned_rows(stats, settings)
    recipe = _Recipe(level, fn, case, settings.time_limit, seed, _copies_per_call(case, n_rows))
    recipe().seeded_probe(seed)  # a Misbehaved here is the case's status
    here = time.perf_counter() - started
    with progress_bar(n_rows, case.name, enabled=settings.progress) as bar:
        t = tally(recipe, outcomes, n_rows, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
                  progress=bar, store=settings.shard_store)
    if t.misbehaved:
        return CaseResult(case, t.misbehaved[1], detail=t.misbehaved[2])
    t0 = time.perf_counter()
    counts = np.split(t.counts[:-1], np.cumsum([len(s.null) for s in stats])[:-1])  # [m] arrays; the last bin stays 0
    # a statistic with no samples (row pairs in a one-row call) is not tested; m stays the planned count
    tested = [j for j in range(m) if counts[j].sum() > 0]
    results = {j: compare_counts(counts[j], stats[j].null, alpha=level_alpha) for j in tested}
    worst = min(tested, key=lambda j: results[j].g.p_value)
    r, s = results[worst], stats[worst]
    adjusted = min(1.0, r.g.p_value * m)
    detectable = _detectable(stats, counts, level_alpha)
    fn_time = t.seconds.get("implementation", 0.0)
    # summed over the shards; the implementation's counted seconds have been seen above its shards' wall time
    # (a counting inconsistency not yet localised: a negative overhead, -0.25 s), so the shards' share is
    # clamped at 0 rather than printed below it
    overhead = here + time.perf_counter() - t0 + max(0.0, t.seconds.get("shards", 0.0) - fn_time)
    calls = calls_for(n_rows, recipe.copies)
    detail = (f"{m} statistics, Bonferroni alpha/{m}; most significant: {s.name}: {r.g}; "
              f"adjusted p = {adjusted:.3g}; TV detectable at N (power {PLAN_POWER}): {detectable}; "
              f"{calls} calls of up to {recipe.copies * f.shape[0]} rows; oracle overhead {overhead:.2f} s, "
              f"implementation {fn_time:.2f} s")
    rejected = any(x.rejected for x in results.values())
    seconds = {"implementation": fn_time / n_rows, "oracle": max(0.0, overhead) / n_rows}
    return CaseResult(case, DIFFERS if rejected else OK, tv=r.tv.estimate, detail=detail, n_samples=n_rows,
                      p_value=adjusted, tv_interval=(r.tv.lower, r.tv.upper),
                      detectable_tv=_detectable_tvs(stats, counts, level_alpha)[0], seconds_per_sample=seconds)


def _copies_per_call(case, n_rows):
    """Copies of the case's B rows per call: at most ``memory_budget`` bytes of rows and at most one
    block, so that a call never spans two blocks (a shard is whole blocks, whatever its size)."""
    B, K1, V = case.shape
    bytes_per_copy = B * (2 * K1 - 1) * V * np.dtype(case.dtype).itemsize
    return int(max(1, min(BLOCK, n_rows, case.memory_budget // max(bytes_per_copy, 1))))


def planned_rows(stats, settings: Settings, samples: int | None = None) -> int:
    """N rows a statistical check of a case plans: ``settings.samples`` when given, else the case's
    own ``samples``, else the largest N any statistic with two or more possible categories needs at
    ``alpha / len(stats)`` (at most :data:`MAX_SAMPLES`)."""
    if settings.samples:
        return settings.samples
    if samples:
        return int(samples)
    alpha = settings.alpha / len(stats)
    return min(MAX_SAMPLES, max(planned_n(settings, _plan_null(s.null), alpha=alpha)
                                for s in stats if (s.null > 0).sum() >= 2))


class _Recipe:
    """What a shard needs to draw a case's batches, built where the shard runs: plain data
    and the implementation travel (pickle or cloudpickle); the tiled arrays and the
    statistics (closures) are built there, once per process, and never sent."""

    def __init__(self, level, fn, case, time_limit, salt, copies):
        self.level, self.fn, self.case, self.time_limit, self.salt, self.copies = (
            level, fn, case, time_limit, salt, copies)
        self._runner = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_runner"}

    def __setstate__(self, state):
        self.__dict__.update(state, _runner=None)

    def __call__(self) -> "_Runner":
        if self._runner is None:
            self._runner = _Runner(self)
        return self._runner


class _Runner(Sampler):
    """One case's batches (a :class:`~specref.verification.statistics.shards.Sampler`): each call
    on up to ``copies`` tiled copies of the rows, its output counted by every statistic."""

    def __init__(self, recipe: _Recipe):
        case, self.level, self.fn, self.time_limit = recipe.case, recipe.level, recipe.fn, recipe.time_limit
        f = case.as_float()
        self.B, K1, self.V = f.shape
        self.K, self.k, self.case, self.copies = K1 - 1, f.k, case, recipe.copies
        self.lk = law_case(case).k  # drafts the oracle draws: up to each row's first placeholder
        self.requests = _requests(case, recipe.copies) if takes_requests(self.fn) else None
        self.per_call = recipe.copies
        self.stats = statistics_nulls(f, self.level, salt=recipe.salt)
        tile = lambda a: _as_array(np.tile(a, (self.copies, 1, 1)), case.array, case.dtype, case.device)  # noqa: E731
        self.p_in = tile(f.p_target)  # [copies B, K+1, V]
        self.q_in = None if f.q_draft is None else tile(f.q_draft)  # [copies B, K, V]
        self.draft_cdf: np.ndarray | None = None
        if self.level == "batched":
            cdf = np.cumsum(f.drafts_from, axis=2)  # [B, K, V]
            self.draft_cdf = cdf / cdf[:, :, -1:]

    def counter(self, outcomes) -> "_StatisticsCounter":
        return _StatisticsCounter(self.stats)

    def call(self, gen, a: int, b: int) -> list:
        """One call on ``b - a`` copies, drawn from the block's ``gen`` (call seed, then drafts):
        the counts it adds to each statistic."""
        tokens, n, x = self.outputs(gen, b - a)
        return _count(self.stats, tokens, n, x, self.B)

    def outputs(self, gen, size: int, global_draw: int = 0) -> tuple:
        """One call on ``size`` copies, drawn from ``gen``: ``(tokens, n_emitted, drafts)``, parsed.

        The call gets its own copies of the rows and drafts (NumPy: read-only, so a write is the
        status ``writes into its inputs``; torch: a write shows in the tensors' version counters);
        the oracle counts its own drafts, never what it handed over.  A step_fn that takes
        ``requests`` gets them (``global_draw``: the seed of the call's global generator)."""
        B, K, V, k = self.B, self.K, self.V, self.lk
        rows = B * size
        p_in = _fresh(self.p_in if size == self.copies else self.p_in[:rows])
        q_in = None if self.q_in is None else _fresh(self.q_in if size == self.copies else self.q_in[:rows])
        call_seed = int(gen.integers(2 ** 63))
        args: tuple
        if self.level == "batched":
            cdf = self.draft_cdf
            assert cdf is not None  # made in __init__ for the batched level
            x = np.full((rows, K), PLACEHOLDER, dtype=np.int64)  # [B size, K]
            u = gen.random((size, B, K))
            for b in range(B):
                for i in range(int(k[b])):
                    x[b::B, i] = np.minimum(np.searchsorted(cdf[b, i], u[:, b, i], side="right"), V - 1)
            x_in = _fresh(x) if self.case.array == "numpy" else _as_array(x, "torch", np.int64, self.case.device)
            args = (p_in, q_in, x_in, call_seed)
        else:
            x = None
            args = (p_in, q_in, call_seed)
        handed = [a for a in args[:-1] if a is not None]
        versions = [_version(a) for a in handed]

        def convert(out):
            _untouched(handed, versions)
            return parse_output(out, rows, K, V, np.tile(self.k, size), x)

        kwargs = {}
        if self.requests is not None:
            kwargs["requests"] = (self.requests if size == self.copies and not global_draw
                                  else _requests(self.case, size, global_draw))
        tokens, n = call(self.fn, args, kwargs, self.time_limit, convert=convert, read_only=True)
        return tokens, n, x

    def seeded_probe(self, seed: int) -> None:
        """Seeded reproducibility (SPEC §11.8): one call on up to :data:`SEEDED_PROBE_COPIES` copies
        of the rows, made twice with the same drafts and call seed but the global generator seeded
        otherwise (``Requests.global_draw`` 0, then 1); every seeded request must emit the same
        tokens both times (it draws from its own generator only), else ``Misbehaved(bad rng use)``.
        Nothing to probe without seeded requests or ``requests``."""
        seeded = self.case.seeded
        if self.requests is None or not seeded or not any(seeded):
            return
        size = min(self.copies, SEEDED_PROBE_COPIES)
        (t0, n0, _), (t1, n1, _) = (self.outputs(np.random.default_rng([seed, 5]), size, g) for g in (0, 1))
        rows = np.flatnonzero(np.tile(seeded, size))
        moved = rows[(t0[rows] != t1[rows]).any(axis=1)]
        if moved.size:
            r = int(moved[0])
            raise Misbehaved(RNG_MISUSE, f"seeded request {r % self.B} (row {r} of a call on {size} copies) emitted "
                                         f"{t0[r, :n0[r]].tolist()}, and {t1[r, :n1[r]].tolist()} when called again "
                                         "with the same inputs, drafts and seeds but the global generator seeded "
                                         "otherwise: a seeded request must draw from its own generator only "
                                         f"({len(moved)} of {rows.size} seeded rows moved)")


class _StatisticsCounter:
    """Each statistic's counts; as a tally, the statistics' categories in turn (and an empty last bin)."""

    def __init__(self, stats):
        self.counts = [np.zeros(len(s.null), dtype=np.int64) for s in stats]

    def add(self, per_statistic: list) -> None:
        for c, more in zip(self.counts, per_statistic):
            c += more

    def result(self) -> tuple[np.ndarray, dict]:
        return np.concatenate(self.counts + [np.zeros(1, dtype=np.int64)]), {}


def _fresh(a):
    """One call's own copy of a handed-over array: NumPy read-only, torch a clone on its device."""
    if isinstance(a, np.ndarray):
        out = np.array(a, copy=True)
        out.flags.writeable = False
        return out
    return a.clone()


def _version(a):
    """A torch tensor's version counter (bumped by every in-place write), None for NumPy arrays."""
    return None if isinstance(a, np.ndarray) else a._version


def _untouched(arrays, versions):
    """``Misbehaved(WRITES)`` when the implementation wrote into a torch tensor it was handed."""
    for a, v in zip(arrays, versions):
        if v is not None and a._version != v:
            raise Misbehaved(WRITES, "the implementation wrote into a tensor it was handed (its version counter "
                                     "moved); inputs are the oracle's, copy them before writing")


_count_blocks = tally_blocks  # a case's batches are counted by the one block tally (0.2 name)


def _plan_null(null):
    null = np.asarray(null, dtype=np.float64)
    return null / null.sum()


def _detectable_tvs(stats, counts, level_alpha):
    """``(smallest, largest)`` TV the statistics detect at their N (power 0.9); ``(inf, inf)`` if none can."""
    tvs = [_detectable_tv(int(c.sum()), level_alpha, len(s.null), _plan_null(s.null))
           for s, c in zip(stats, counts) if (s.null > 0).sum() >= 2 and c.sum() > 0]
    return (min(tvs), max(tvs)) if tvs else (math.inf, math.inf)


def _detectable(stats, counts, level_alpha):
    """The smallest and largest TV the statistics detect at their N (power 0.9), as words."""
    lo, hi = _detectable_tvs(stats, counts, level_alpha)
    return "none" if lo == math.inf else f"{lo:.3g} (best statistic) to {hi:.3g} (worst)"


def _detectable_tv(n, alpha, k, null, power=PLAN_POWER):
    """The TV ``n`` samples detect with ``power``, within 1%: ten geometric bisections of
    :func:`specref.verification.statistics.counts.planned_power` over [1e-4, 1] (``detectable_tv`` bisects
    to 1e-9, which costs about 40 power evaluations per statistic)."""
    if planned_power(n, 1.0, alpha, k, null=null) < power:
        return math.inf
    lo, hi = 1e-4, 1.0
    if planned_power(n, lo, alpha, k, null=null) >= power:
        return lo
    for _ in range(10):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if planned_power(n, mid, alpha, k, null=null) >= power else (mid, hi)
    return hi


def _count(stats, tokens, n, x, B) -> list:
    """The counts one call's output adds to each statistic."""
    rows = tokens.shape[0]
    L = n - 1
    # row i of a call is copy i // B of row type i % B: each type is a strided view, no copy
    per_type = [(tokens[b::B], n[b::B], None if x is None else x[b::B]) for b in range(B)]
    counts = []
    for s in stats:
        if s.distance:
            a, b = s.rows
            i, j = _pair_indices(rows, B, s.distance, a, b)
            codes = s.code(L[i], L[j])
        else:
            codes = s.code(*per_type[s.rows[0]])
        counts.append(np.bincount(np.asarray(codes, dtype=np.int64), minlength=len(s.null))[: len(s.null)])
    return counts


# ---------------------------------------------------------------- the levels


def run_batched(level: Level, fn, cases, settings: Settings) -> Report:
    """Run a batched level on its cases (exact or statistical), through the one runner.  In exact mode
    the ``statistical_only`` cases are left out (SpecrefError when no case is left)."""
    if settings.mode == "exact":
        kept = [c for c in cases if getattr(c, "statistical_only", False) is not True]
        if cases and not kept:
            raise SpecrefError(f"every case is statistical only ({', '.join(repr(c.name) for c in cases)}: float rows "
                               "beyond enumeration): check them with mode='statistical'")
        cases = kept
    takes = takes_requests(fn)
    return run_cases(level, cases, settings, validate=lambda case: _validate_case(level.name, case, settings, takes),
                     fn=fn,
                     exact=lambda case: partial(_exact_case, level.name, fn, case, settings),
                     statistical=lambda case, seed: partial(_statistical_case, level.name, fn, case, settings, seed))


def _frac(rows):
    return np.array([[[Fraction(v) for v in r] for r in pos] for pos in rows], dtype=object)


def default_batched_cases(level: str = "batched") -> list:
    """Small exact cases: B = 2, V = 3, ragged rows, p = q, zeros in p, point-mass drafts."""
    p = [["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]]
    q = [["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"]]
    p2 = [["1/2", "1/2", "0"], ["0", "1/4", "3/4"], ["1/4", "1/4", "1/2"]]
    q2 = [["1/4", "1/4", "1/2"], ["1/3", "1/3", "1/3"]]
    cases = [
        BatchedCase("two-rows", _frac([p, p2]), _frac([q, q2])),
        BatchedCase("ragged-rows", _frac([p, p2]), _frac([q, q2]), num_draft=(1, 2)),
        BatchedCase("p-equals-q-row", _frac([p, p]), _frac([q, [p[0], p[1]]]), grid=24),
        BatchedCase("zero-draft-row", _frac([p, p2]), _frac([q, q2]), num_draft=(0, 2)),
        # the draft proposes a token with p = 0 (row 0, position 0): on float32 grid coins u = 0 has mass 2^-24
        BatchedCase("zeros-in-p-grid", _frac([p2, p]), _frac([q2, q]), grid=24),
    ]
    if level == "draft_and_verify":  # the call carries no per-row K: no ragged rows at this level
        return [c for c in cases if c.num_draft is None]
    if level == "batched":
        cases.append(BatchedCase("point-mass-drafts", _frac([p, p2]), None, proposal=_frac([q, q2])))
        cases.append(BatchedCase("point-mass-ragged", _frac([p, p2]), None, proposal=_frac([q, q2]), num_draft=(2, 1)))
    return cases


def large_vocab_case(V: int = 32_000, K: int = 5, B: int = 2, *, seed: int = 0, point_mass: bool = False,
                     array: str = "numpy") -> BatchedCase:
    """A statistical case at a real vocabulary size: peaked rows over a long tail.

    Each row puts most mass on 8 tokens (target and draft in opposite order, the shape of
    vLLM's coupling test) and spreads the rest over a Dirichlet tail of V tokens.
    """
    rng = np.random.default_rng(seed)

    def rows(n, reverse):
        head = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02])
        out = np.empty((B, n, V))
        for b in range(B):
            for i in range(n):
                tail = rng.dirichlet(np.full(V, 0.5)) * (1 - head.sum())
                tail[:8] += head[::-1] if reverse else head
                out[b, i] = tail / tail.sum()
        return out

    p, q = rows(K + 1, False), rows(K, True)
    if point_mass:
        return BatchedCase(f"V={V}-K={K}-point-mass", p, None, proposal=q, array=array)
    return BatchedCase(f"V={V}-K={K}", p, q, array=array)


def batched_planner(statistics: str, adapted: Callable | None = None) -> Callable:
    """The planner of a level judged by the ``statistics`` level's statistics (batched or
    draft_and_verify): N rows over the statistics of the case, in calls of as many copies of its
    rows as the check hands over at once, timed as the check makes them.  ``adapted(fn, case) ->
    (fn, case)``: the implementation and case as the batched level sees them (an engine's call)."""
    def planner(level: Level, fn, case, settings: Settings, seed: int) -> CasePlan:
        if adapted is not None:
            fn, case = adapted(fn, case)
        n = planned_rows(statistics_nulls(case.as_float(), statistics, salt=seed), settings, case.samples)
        copies = _copies_per_call(case, n)
        recipe = _Recipe(statistics, fn, case, settings.time_limit, seed, copies)
        return CasePlan(None, n, copies, calls_for(n, copies), timer=timed_calls(recipe, seed, copies))

    return planner


def _validate(level: Level, case, settings: Settings) -> None:
    _validate_case(level.name, case, settings)


ARRAY = Option("array", "what the rows are handed as in statistical mode: 'numpy' or 'torch'",
               for_cases=lambda cases, array: [replace(c, array=array) for c in cases])
"""``array="torch"`` hands the implementation torch tensors in statistical mode."""

# The default cases are looked up when asked for (a lambda, not a partial): a test or a user that
# replaces default_batched_cases in this module changes what the levels run.
LEVELS = (
    Level("batched", "step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed) "
                     "-> [B, K+1] padded with -1", lambda: default_batched_cases("batched"), routed_run(run_batched),
          validate=_validate, reference=fixed_reference(batched_step),
          planner=routed_planner(batched_planner("batched"), BATCHED), options=(ARRAY, ROUTE),
          shorthand="check_batched_step"),
    Level("draft_and_verify", "step_fn(p_target [B, K+1, V], q_draft [B, K, V], seed) -> [B, K+1] padded with -1",
          lambda: default_batched_cases("draft_and_verify"), run_batched, validate=_validate,
          reference=fixed_reference(batched_draft_and_verify), planner=batched_planner("draft_and_verify"),
          options=(ARRAY,), shorthand="check_draft_and_verify"),
)
"""The batched and draft-and-verify levels."""
