"""The ``mrv2`` level: a verifier in vLLM Model Runner V2's own call, judged by the batched level.

The call, read from :data:`SOURCE` (vLLM 0.33.0's MRV2 sampler)::

    rejection_sample(target_logits [num_logits, V], draft_logits [max_num_reqs, K, V] | None,
                     draft_sampled [num_logits], cu_num_logits [num_reqs + 1], pos [num_logits],
                     idx_mapping [num_reqs], expanded_idx_mapping [num_logits],
                     expanded_local_pos [num_logits], temperature [max_num_reqs], seed [max_num_reqs],
                     num_speculative_steps, synthetic_conditional_rates=None, use_fp64=False,
                     use_block_verification=False, contexts=None, watermarking=None,
                     watermarking_skip_mask=None, watermark_key=None, fly_window_size=0,
                     fly_entropy_threshold=0.3, fly_entropy_top_k=3)
        -> (sampled [num_reqs, K + 1] int64, num_sampled [num_reqs] int32)

The level calls ``fn`` with the eleven required arguments (:data:`REQUIRED`) as NumPy arrays;
the optional ones stay at their defaults, which is MRV2's strict (lossless) rejection sampler:
no synthetic acceptance rates, no block verification, no watermark, no FLy window.  Its layout,
as MRV2's sampler reads it and as the level builds it from a batch of ``R`` rows:

- request ``r`` owns the logit rows ``cu_num_logits[r] .. cu_num_logits[r + 1] - 1``: its
  ``k_r`` judged positions, then its bonus row (``cu`` is exclusive, ``cu[0] = 0``);
- ``target_logits`` are final (MRV2's caller applies the temperature to them first): the level
  hands ``log p_target`` (``-inf`` where ``p = 0``);
- ``draft_logits[s, i]`` are the draft's logits *before* the temperature, indexed by the request's
  state slot ``s = idx_mapping[r]``; MRV2 divides them by ``temperature[s]``: the level hands
  ``T_r log q_draft`` (None for point-mass drafts: MRV2's one-hot-draft mode, accept with
  probability ``p(x)``, residual ``p`` without ``x``);
- ``draft_sampled[cu[r] + 1 + i]`` is draft ``i`` of request ``r`` (``draft_sampled[cu[r]]``
  holds the committed token); ``expanded_idx_mapping`` and ``expanded_local_pos`` give each
  logit row's state slot and local position;
- the state slots are not the request indices: request ``r`` lives in slot ``R - r`` of
  ``R + 1`` slots (slot 0 is a decoy: zero draft logits, temperature 1), so an implementation
  that indexes ``draft_logits``, ``temperature`` or ``seed`` by ``r`` reads another row's values;
- ``temperature[s] = 0`` is MRV2's greedy mode: accept a draft iff it is the target's argmax,
  emit the argmax at the first mismatch and as the bonus (ties to the lowest id); the law of a
  greedy row is the chain rule on one-hot argmax rows (the case holds the raw target rows,
  whose logits are handed over);
- randomness is keyed by ``(seed[s], pos[t])``, MRV2's counter-based streams: statistical mode
  hands 63-bit ``seed`` per slot and positions ``pos`` from the oracle's integer seed (fresh
  per call); exact mode hands the oracle's enumerating generator as ``seed`` (the reference draws
  its coins from it; the logits are then :class:`ExactLog` object arrays, below).

Every call gets the arrays built afresh and read-only (a write is ``writes into its inputs``); the
level hands all its cases to the one case runner together, so the state check runs a case after
another (SPEC §11.10, §13.5).

``sampled`` may hold anything past ``num_sampled`` (MRV2 leaves it unset); the level writes -1
there and hands ``(sampled, num_sampled)`` to the batched level's output checks and criterion
(:mod:`specref.verification.levels.batched.steps`: per-row chain-rule laws in exact mode, low-dimensional
G-tests in statistical mode).

**Exact logits.**  Logarithms of ``Fraction`` rows are not rational, so in exact mode the logits
are object arrays of :class:`ExactLog` -- the exact logarithm of a rational -- on which ``+``,
``-``, ``*`` and ``/`` by a temperature, comparisons, ``np.max``, ``np.argmax`` and ``np.exp`` (a
``Fraction``) are exact; ``float()`` gives the float64 logarithm, so a kernel that converts its
input runs too, with a float law.  :func:`softmax` works on both kinds.  Exact cases need an
integer temperature (``T log q`` must be the logarithm of a rational).

:func:`mrv2_reference` is specref's reference in this call (NumPy, float64, or exact on
:class:`ExactLog`): probabilities by softmax, then :func:`specref.decoding.batched.batched_step`
on the non-greedy rows, with coins from the enumerating generator (exact mode) or keyed by
``(seed, pos)`` with a counter-based hash (statistical mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache, partial
from numbers import Real

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.decoding.batched import PLACEHOLDER, batched_step
from specref.verification.levels.batched.steps import (BatchedCase, _exact_case, _statistical_case, _validate_case,
                                                      batched_planner, default_batched_cases)
from specref.verification.levels.batched.engines import ExactLog
from specref.verification.levels.runner import run_cases
from specref.verification.running.calling import Misbehaved, foreign
from specref.verification.running.level import Level, fixed_reference
from specref.verification.running.report import Report

__all__ = [
    "SOURCE",
    "PARAMETERS",
    "REQUIRED",
    "ExactLog",
    "softmax",
    "MRV2Case",
    "mrv2_call",
    "mrv2_reference",
    "default_mrv2_cases",
    "run_mrv2",
    "LEVELS",
]

SOURCE = ("vllm", "0.33.0", "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py", "rejection_sample")
"""Where the call was read: distribution, version, file, function."""

PARAMETERS = ("target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping",
              "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed", "num_speculative_steps",
              "synthetic_conditional_rates", "use_fp64", "use_block_verification", "contexts", "watermarking",
              "watermarking_skip_mask", "watermark_key", "fly_window_size", "fly_entropy_threshold",
              "fly_entropy_top_k")
"""MRV2's ``rejection_sample`` parameters, in order, as :data:`SOURCE` defines them."""

REQUIRED = PARAMETERS[:11]
"""The arguments the level passes (the rest keep MRV2's defaults: strict rejection sampling)."""

# ---------------------------------------------------------------- exact logarithms
# ExactLog lives in specref.verification.levels.batched.engines (the vllm level's exact mode uses it too).


def exact_logits(rows) -> np.ndarray:
    """``log(rows)`` as an object array of :class:`ExactLog` (any shape of Fractions or ints)."""
    rows = np.asarray(rows, dtype=object)
    out = np.empty(rows.shape, dtype=object)
    for idx, v in np.ndenumerate(rows):
        out[idx] = ExactLog(v)
    return out


@lru_cache(maxsize=4096)
def _exact_softmax(ratios: tuple) -> tuple:
    total = sum(ratios, Fraction(0))
    return tuple(r / total for r in ratios)


def softmax(logits) -> np.ndarray:
    """Rows ``[..., V]`` of probabilities from logits: float64, or Fractions from :class:`ExactLog`."""
    z = np.asarray(logits)
    if z.dtype == object and all(isinstance(v, ExactLog) for v in z.flat):  # exact rows, memoised (enumeration replays)
        flat = z.reshape(-1, z.shape[-1])
        out = np.empty(flat.shape, dtype=object)
        for i, row in enumerate(flat):
            out[i] = _exact_softmax(tuple(v.ratio for v in row))
        return out.reshape(z.shape)
    if z.dtype != object:
        z = z.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        w = np.exp(z - m)
    return w / w.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- cases


@dataclass(frozen=True, repr=False)
class MRV2Case(BatchedCase):
    """A :class:`~specref.verification.levels.batched.steps.BatchedCase` with each row's temperature.

    ``temperature``: one value for every row, or one per row (a tuple of B).  ``T > 0``: the
    rows are the final distributions and the draft logits are handed as ``T log q``; ``T = 0``:
    the row is greedy, ``p_target`` holds the raw target rows (their logits are handed over)
    and the law is that of their argmax (lowest id on ties).
    """

    temperature: object = 1

    def temperatures(self) -> tuple:
        B = self.shape[0]
        t = self.temperature
        return tuple(t) if isinstance(t, (tuple, list)) else (t,) * B

    def law_case(self) -> BatchedCase:
        """The case the batched criterion judges: greedy rows' targets replaced by one-hot argmax rows."""
        greedy = [b for b, t in enumerate(self.temperatures()) if t == 0]
        if not greedy:
            return self
        p = self.p_target.copy()
        for b in greedy:
            for i in range(p.shape[1]):
                row = p[b, i]
                top = int(np.argmax(np.asarray(row, dtype=np.float64) if p.dtype != object else row))
                p[b, i] = [row[0] * 0 + (1 if j == top else 0) for j in range(p.shape[2])]
        return replace(self, p_target=p)

    def __repr__(self):
        return "MRV2Case" + super().__repr__()[len("BatchedCase"):-1] + f", temperature={self.temperature!r})"


def _validate(case, mode):
    if not isinstance(case, MRV2Case):
        raise SpecrefError(f"cases of the mrv2 level must be MRV2Case objects, got {case!r:.120}")
    temps = case.temperatures()
    if len(temps) != case.shape[0]:
        raise SpecrefError(f"case {case.name!r}: {len(temps)} temperatures for {case.shape[0]} rows")
    for b, t in enumerate(temps):
        if not _finite_temperature(t):
            raise SpecrefError(f"case {case.name!r}: temperature[{b}] (row {b}) must be a finite number >= 0, finite "
                               f"as the float32 it is handed as, got {_shown(t)}")
        if mode == "exact" and case.q_draft is not None and t != 0 and Fraction(t).denominator != 1:
            raise SpecrefError(f"case {case.name!r}: row {b}'s temperature {t!r} is not an integer: in exact mode "
                               "the draft logits T log q must be logarithms of rationals (use statistical mode)")
    if case.array != "numpy":
        raise SpecrefError(f"case {case.name!r}: the mrv2 level hands NumPy arrays (array='numpy'), got {case.array!r}")


def _finite_temperature(t) -> bool:
    """A real number (not a bool), finite, >= 0, and finite in float32 (SPEC §11.10)."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (Real, np.floating, np.integer)):
        return False
    try:
        value = float(t)
    except (OverflowError, ValueError, TypeError):  # an int too large for a float
        return False
    with np.errstate(over="ignore"):
        return 0 <= value < math.inf and bool(np.isfinite(np.float32(value)))


def _shown(value) -> str:
    """``repr(value)``, or for an int too long to print, its number of digits."""
    try:
        return repr(value)
    except ValueError:  # Python refuses to print ints of more than 4300 digits
        return f"an int of about {int(value.bit_length() * math.log10(2)) + 1} digits"


# ---------------------------------------------------------------- the call, built from a batch


def _ragged(draft_tokens):
    x = to_numpy(draft_tokens).astype(np.int64)
    pad = x == PLACEHOLDER
    return x, np.where(pad.any(axis=1), pad.argmax(axis=1), x.shape[1]).astype(np.int64)


def _state_seeds(seed: int, n: int, salt: int) -> np.ndarray:
    return (np.random.SeedSequence([seed, salt]).generate_state(n, dtype=np.uint64) >> np.uint64(1)).astype(np.int64)


def mrv2_call(p_target, q_draft, draft_tokens, seed, temperatures, *, raw_target=None) -> tuple:
    """MRV2's eleven required arguments for a batch of ``R`` rows (see the module doc for the layout).

    ``p_target [R, K+1, V]``, ``q_draft [R, K, V] | None`` (Fractions: exact mode, the logits as
    :class:`ExactLog`; floats: float32 logits), ``draft_tokens [R, K]`` (-1 after ``k_r``),
    ``seed``: an int (statistical: ``seed`` and ``pos`` arrays are drawn from it) or the enumerating
    generator (exact: handed over as ``seed``); ``temperatures``: one per row; ``raw_target``: the
    rows whose logits greedy rows hand over (default ``p_target``).
    """
    p = np.asarray(to_numpy(p_target))
    exact = p.dtype == object
    x, k = _ragged(draft_tokens)
    R, K1, V = p.shape
    K = K1 - 1
    raw = p if raw_target is None else np.asarray(raw_target)
    t = [temperatures[r] for r in range(R)]
    greedy = [ti == 0 for ti in t]

    def logits(rows):  # [..., V] -> the level's logits of these rows
        if exact:
            return exact_logits(rows)
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(rows, dtype=np.float64)).astype(np.float32)

    rows = [raw[r, i] if greedy[r] else p[r, i] for r in range(R) for i in range(int(k[r]) + 1)]
    target_logits = logits(np.stack(rows))  # [num_logits, V]
    cu = np.concatenate([[0], np.cumsum(k + 1)]).astype(np.int32)
    local = np.concatenate([np.arange(int(k[r]) + 1) for r in range(R)]).astype(np.int32)
    state = (R - np.arange(R)).astype(np.int32)  # request r lives in slot R - r; slot 0 is a decoy
    expanded = np.repeat(state, k + 1).astype(np.int32)
    draft_sampled = np.zeros(int(cu[-1]), dtype=np.int64)  # the committed token (0) at each request's first row
    for r in range(R):
        draft_sampled[cu[r] + 1: cu[r] + 1 + k[r]] = x[r, :k[r]]
    draft_logits = None
    if q_draft is not None:
        q = np.asarray(to_numpy(q_draft))
        zero = ExactLog(1) if exact else 0.0
        draft_logits = np.full((R + 1, K, V), zero, dtype=object if exact else np.float32)
        for r in range(R):
            if not greedy[r] and k[r]:
                draft_logits[state[r], :k[r]] = logits(q[r, :k[r]]) * (t[r] if exact else np.float32(t[r]))
    temperature = np.ones(R + 1, dtype=np.float32)
    temperature[state] = np.asarray([float(ti) for ti in t], dtype=np.float32)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seeds = _state_seeds(int(seed), R + 1, 1)
        base = (_state_seeds(int(seed), R, 2) % (1 << 20)).astype(np.int64)
    else:  # exact mode: the enumerating generator goes in the seed slot
        seeds, base = seed, 64 * np.arange(R, dtype=np.int64)
    pos = (np.repeat(base, k + 1) + local).astype(np.int64)
    return (target_logits, draft_logits, draft_sampled, cu, pos, state, expanded, local, temperature, seeds, K)


class MalformedOutput:
    """What the adapter hands the batched level's output checks for an output not in MRV2's shape:
    converting it fails with the reason, so the case is an ``invalid output`` that says why."""

    def __init__(self, why: str):
        self.why = why

    def __array__(self, *args, **kwargs):
        raise TypeError(self.why)

    def __repr__(self):
        return "rejection_sample's output"


def _outputs(out, R, K):
    """``(sampled [R, K+1] with -1 past num_sampled, num_sampled [R])`` from the call's output,
    or a :class:`MalformedOutput` saying what is wrong with it.

    Unpacking and converting the output run under :func:`~specref.verification.running.calling.foreign`
    (this runs inside the guarded call): whatever they raise, ``SystemExit`` and ``KeyboardInterrupt``
    included, is ``invalid output`` (SPEC §11.10, §13.3), and a time-out passes through.
    """
    what = (f"rejection_sample returned {type(out).__name__}, which could not be read as (sampled "
            f"[num_reqs, K+1], num_sampled [num_reqs])")
    try:
        with foreign(what):
            sampled, num = out
            sampled, num = np.asarray(to_numpy(sampled)), np.asarray(to_numpy(num)).reshape(-1)
    except Misbehaved as e:
        return MalformedOutput(e.detail)
    if sampled.shape != (R, K + 1) or num.shape != (R,) or sampled.dtype.kind not in "iu" or num.dtype.kind not in "iu":
        return MalformedOutput(f"rejection_sample returned sampled {sampled.dtype} {list(sampled.shape)} and "
                               f"num_sampled {num.dtype} {list(num.shape)}; expected integers [{R}, {K + 1}] and [{R}]")
    tokens = sampled.astype(np.int64).copy()
    n = num.astype(np.int64)
    tokens[np.arange(K + 1)[None, :] >= n[:, None]] = PLACEHOLDER  # MRV2 leaves these entries unset
    return tokens, n


class _MRV2Step:
    """A function in MRV2's call as a ``batched`` step_fn for one case (picklable: shards rebuild it)."""

    def __init__(self, fn, case: MRV2Case):
        self.fn, self.temperatures, self.B = fn, case.temperatures(), case.shape[0]
        self.raw = case.p_target if case.exact else np.asarray(case.p_target, dtype=np.float64)
        self.__name__ = f"mrv2_call({getattr(fn, '__name__', 'fn')})"

    def __call__(self, p_target, q_draft, draft_tokens, seed):
        R = np.asarray(to_numpy(draft_tokens)).shape[0]
        copies = R // self.B  # statistical mode tiles the case's rows: row r is row r % B
        temps = [self.temperatures[r % self.B] for r in range(R)]
        raw = self.raw if copies == 1 else np.tile(self.raw, (copies, 1, 1))
        if np.asarray(to_numpy(p_target)).dtype != object:
            raw = raw.astype(np.float64)
        args = tuple(_sealed(a) for a in mrv2_call(p_target, q_draft, draft_tokens, seed, temps, raw_target=raw))
        return _outputs(self.fn(*args), R, args[-1])


def _sealed(a):
    """An array built for one call, handed read-only: a view of it, so it cannot be made writeable again
    (a write is ``writes into its inputs``); anything else as it is."""
    if not isinstance(a, np.ndarray):
        return a
    a.flags.writeable = False
    return a.view()


# ---------------------------------------------------------------- the reference


class _KeyedCoins:
    """Coins keyed by ``(seed, position, stream)`` with a counter-based hash, as MRV2 keys its own:
    ``random((B, K))`` gives the acceptance coins, then ``random((B,))`` the final coins."""

    def __init__(self, seeds, positions):  # seeds [B], positions [B, K+1] (uint64)
        self.seeds, self.positions, self.calls = seeds, positions, 0

    @staticmethod
    def _mix(z):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    def _uniform(self, seeds, positions, stream):
        with np.errstate(over="ignore"):
            key = positions * np.uint64(2) + np.uint64(stream)
            h = self._mix(self._mix(seeds + np.uint64(0x9E3779B97F4A7C15)) ^ key)
        return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    def random(self, shape):
        self.calls += 1
        if self.calls == 1:  # acceptance coin of position i: (seed, pos of row i, stream 0)
            return self._uniform(self.seeds[:, None], self.positions[:, : shape[1]], 0)
        return self._uniform(self.seeds, self.positions[:, 0], 1)  # final coin: stream 1

    def choice(self, *args, **kwargs):
        raise SpecrefError("the keyed coins serve batched_step's uniforms only")


def _check_layout(cu, local, expanded, idx_mapping, draft_sampled, K):
    R = cu.shape[0] - 1
    if cu[0] != 0 or (np.diff(cu) < 1).any():
        raise SpecrefError(f"cu_num_logits must start at 0 and grow by at least 1 per request, got {cu.tolist()}")
    n = int(cu[-1])
    for name, a in (("expanded_local_pos", local), ("expanded_idx_mapping", expanded),
                    ("draft_sampled", draft_sampled)):
        if a.shape != (n,):
            raise SpecrefError(f"{name} must have shape [num_logits] = [{n}], got {list(a.shape)}")
    for r in range(R):
        s, e = int(cu[r]), int(cu[r + 1])
        if e - s - 1 > K:
            raise SpecrefError(f"request {r} has {e - s - 1} drafts, over num_speculative_steps = {K}")
        if (local[s:e] != np.arange(e - s)).any() or (expanded[s:e] != idx_mapping[r]).any():
            raise SpecrefError(f"request {r}: expanded_local_pos / expanded_idx_mapping of its rows {s}..{e - 1} are "
                               f"{local[s:e].tolist()} / {expanded[s:e].tolist()}; expected 0..{e - s - 1} / "
                               f"{int(idx_mapping[r])}")


def mrv2_reference(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                   expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None,
                   use_fp64=False, use_block_verification=False, contexts=None, watermarking=None,
                   watermarking_skip_mask=None, watermark_key=None, fly_window_size=0, fly_entropy_threshold=0.3,
                   fly_entropy_top_k=3):
    """specref's reference in MRV2's call: strict rejection sampling (SPEC §3) per request.

    Over 60 lines because the signature alone is MRV2's 21 parameters, each refused when set
    to an option specref does not model (block verification, FLy, synthetic rates, watermarks).

    Request ``r`` (state slot ``s = idx_mapping[r]``, temperature ``T = temperature[s]``): its
    drafts are ``draft_sampled[cu[r] + 1 .. cu[r + 1] - 1]``, cut at the first -1 (a placeholder
    ends verification there, and that position's row is the bonus row, as in MRV2);
    ``p = softmax(target_logits)`` of its rows, ``q = softmax(draft_logits[s, i] / T)`` (or
    point-mass drafts when ``draft_logits`` is None).  ``T = 0``: greedy (accept while the draft
    is the argmax, lowest id on ties; emit the argmax).  Otherwise
    :func:`specref.decoding.batched.batched_step` on all non-greedy requests at once, its coins
    from ``seed`` when it is the enumerating generator, else keyed by ``(seed[s], pos)``.
    ``use_fp64`` changes nothing (float64 throughout); the other options are MRV2's lenient or
    block modes, outside this level: SpecrefError.  Returns ``(sampled [R, K+1] int64 with -1
    after the emitted tokens, num_sampled [R] int32)``.
    """
    given = dict(synthetic_conditional_rates=synthetic_conditional_rates, use_block_verification=use_block_verification,
                 contexts=contexts, watermarking=watermarking, watermarking_skip_mask=watermarking_skip_mask,
                 watermark_key=watermark_key, fly_window_size=fly_window_size)
    on = [name for name, v in given.items() if (v is not None and v is not False and v != 0)]
    if on:
        raise SpecrefError(f"mrv2_reference implements strict rejection sampling only; got {', '.join(on)}")
    z = np.asarray(target_logits)
    cu = np.asarray(cu_num_logits).astype(np.int64)
    x_flat = np.asarray(draft_sampled).astype(np.int64)
    states = np.asarray(idx_mapping).astype(np.int64)
    K, R, V = int(num_speculative_steps), cu.shape[0] - 1, z.shape[1]
    _check_layout(cu, np.asarray(expanded_local_pos), np.asarray(expanded_idx_mapping), states, x_flat, K)
    temps = np.asarray(temperature)[states]
    out = np.full((R, K + 1), PLACEHOLDER, dtype=np.int64)
    num = np.zeros(R, dtype=np.int32)
    rows = z.dtype == object
    p = np.empty((R, K + 1, V), dtype=object if rows else np.float64)
    q = None if draft_logits is None else np.empty((R, K, V), dtype=p.dtype)
    x = np.full((R, K), PLACEHOLDER, dtype=np.int64)
    k = np.zeros(R, dtype=np.int64)
    for r in range(R):
        s, e = int(cu[r]), int(cu[r + 1])
        drafts = x_flat[s + 1:e]
        k[r] = int(np.argmax(drafts < 0)) if (drafts < 0).any() else e - s - 1
        x[r, :k[r]] = drafts[:k[r]]
        p[r] = softmax(z[s:s + 1])[0]  # unused rows: any distribution
        p[r, :k[r] + 1] = softmax(z[s:s + k[r] + 1])
        if temps[r] == 0:  # greedy: the argmax path (np.argmax: the lowest id on ties)
            top = [int(np.argmax(z[s + i])) for i in range(k[r] + 1)]
            n = next((i for i in range(k[r]) if x[r, i] != top[i]), k[r])
            out[r, :n + 1] = list(x[r, :n]) + [top[n]]
            num[r] = n + 1
        elif q is not None:
            d = np.asarray(draft_logits)[int(states[r])]
            q[r] = softmax(d[:1] / temps[r])[0]
            if k[r]:
                q[r, :k[r]] = softmax(d[:k[r]] / temps[r])
    live = np.flatnonzero(temps != 0)
    if live.size:
        if isinstance(seed, np.ndarray) or isinstance(seed, (list, tuple)):
            first = cu[:-1][live]
            positions = (np.asarray(pos).astype(np.int64)[np.minimum(first[:, None] + np.arange(K + 1), cu[-1] - 1)])
            rng = _KeyedCoins(np.asarray(seed).astype(np.int64)[states[live]].astype(np.uint64),
                              positions.astype(np.uint64))
        else:
            rng = seed  # the enumerating generator (exact mode), or a numpy Generator
        steps = batched_step(p[live], None if q is None else q[live], x[live], rng, num_draft=k[live])
        out[live] = np.asarray(steps.tokens)
        num[live] = np.asarray(steps.n_emitted)
    return out, num


# ---------------------------------------------------------------- cases and the level


def default_mrv2_cases() -> list:
    """Small exact cases (B = 2, K = 2, V = 3): the batched level's rows at temperatures 1 and 2,
    ragged rows, a zero-draft row, one-hot drafts, float32-grid coins, and greedy rows (with a
    three-way tie at a bonus position and a two-way tie at a judged one) beside sampled ones."""
    by_name = {c.name: c for c in default_batched_cases("batched")}

    def mrv2(name, base, temperature, **changes):
        c = by_name[base]
        case = MRV2Case(name, c.p_target, c.q_draft, c.proposal, c.num_draft, c.grid, temperature=temperature)
        return replace(case, **changes)

    return [
        mrv2("probabilistic-T1", "two-rows", 1),
        mrv2("probabilistic-T2-ragged", "ragged-rows", 2),
        mrv2("zero-draft-row-T2", "zero-draft-row", 2),
        mrv2("p-equals-q-T2-grid", "p-equals-q-row", 2),
        mrv2("zeros-in-p-grid", "zeros-in-p-grid", 1),
        mrv2("one-hot-drafts-ragged", "point-mass-ragged", 1),
        mrv2("greedy-and-sampled", "two-rows", (0, 2)),
        mrv2("greedy-one-hot-drafts", "point-mass-drafts", (0, 2), p_target=by_name["two-rows"].p_target[::-1].copy()),
    ]


def run_mrv2(level: Level, fn, cases, settings) -> Report:
    """Every case through the one runner together (SPEC §11.10, §13.5), so the state check runs a case
    after another: each judged by the batched level's bodies with ``fn`` adapted to its rows and the
    criterion on its law case (case ``i``'s statistical body seeded ``settings.seed + i``, an int read
    only through ``SeedSequence`` and a hash).  Verdicts name the MRV2 case (raw greedy rows,
    temperatures)."""
    def validate(case):
        _validate(case, settings.mode)
        _validate_case("batched", case.law_case(), settings)

    def exact(case):
        return partial(_exact_case, "batched", _MRV2Step(fn, case), case.law_case(), settings)

    def statistical(case, seed):
        return partial(_statistical_case, "batched", _MRV2Step(fn, case), case.law_case(), settings, seed)

    return run_cases(level, cases, settings, validate=validate, exact=exact, statistical=statistical, fn=fn)


SIGNATURE = ("fn(target_logits [num_logits, V], draft_logits [max_num_reqs, K, V] | None, draft_sampled [num_logits], "
             "cu_num_logits [num_reqs + 1], pos [num_logits], idx_mapping [num_reqs], expanded_idx_mapping "
             "[num_logits], expanded_local_pos [num_logits], temperature [max_num_reqs], seed [max_num_reqs], "
             "num_speculative_steps) -> (sampled [num_reqs, K + 1], num_sampled [num_reqs])")

LEVELS = (Level("mrv2", SIGNATURE, default_mrv2_cases, run_mrv2,
                validate=lambda level, case, settings: _validate(case, settings.mode),
                reference=fixed_reference(mrv2_reference),
                planner=batched_planner("batched", lambda fn, case: (_MRV2Step(fn, case), case.law_case()))),)
"""vLLM Model Runner V2's call (:data:`SOURCE`), judged by the batched level's criterion."""
