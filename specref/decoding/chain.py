"""The decoding loops: plain target sampling and speculative decoding (SPEC §4).

A **model** is either

- a callable ``model(tokens) -> logits`` of shape ``[len(tokens), V]``: row ``i`` holds
  the logits of the token that follows ``tokens[:i+1]`` (picoGPT style: every position,
  because verification needs K+1 rows from one call), or
- an object with ``probs(tokens) -> [len(tokens), V]`` probability rows, possibly a NumPy
  object array of ``Fraction`` (an exact model; ``toy_models.ngram`` has one).  When a
  model has ``probs``, it is used.

Both loops apply the same :class:`~specref.core.sampling.SamplingConfig` to draft and target.
When one side is exact and the other float, the exact rows are converted to float64.

Generation ends at ``max_new_tokens`` or right after a stop token (which is emitted).
A speculative iteration always drafts K tokens and then truncates its block at the
first stop token or at the length limit: a prefix of a correctly distributed
sequence is correctly distributed, so truncation keeps the output exact.

Each iteration is also exposed as ``iteration(state, rng) -> (block, next_state)``
(:func:`speculative_transition`, :func:`target_transition`) where ``state`` is the
tuple of tokens generated so far and ``next_state`` is ``None`` once generation has
ended: :func:`specref.verification.laws.enumeration.law_iterated` enumerates decoders one iteration at a time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int, check_tokens
from specref.core.numbers import same_kind
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.core.step import speculative_step

__all__ = [
    "DecodeResult",
    "next_token_probs",
    "model_rows",
    "sample_target",
    "speculative_decode",
    "speculative_block",
    "target_transition",
    "speculative_transition",
    "kept_block",
]


@dataclass
class DecodeResult:
    """Tokens generated (prompt excluded) and the statistics of the run."""

    tokens: list[int]
    iterations: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    accepted_per_iteration: list[int] = field(default_factory=list)  # draft tokens accepted, 0..K
    tested_per_position: list[int] = field(default_factory=list)  # [K]: iterations that reached position i
    accepted_per_position: list[int] = field(default_factory=list)  # [K]: ... and accepted its token
    stopped: bool = False  # True when a stop token ended generation

    @property
    def acceptance_per_position(self) -> list[float]:
        """Empirical P(accept position i | position i reached), i = 1..K (nan if never reached)."""
        return [a / t if t else float("nan") for a, t in zip(self.accepted_per_position, self.tested_per_position)]

    @property
    def tokens_per_iteration(self) -> float:
        return len(self.tokens) / self.iterations if self.iterations else float("nan")


def model_rows(model, tokens, n_rows: int, config: SamplingConfig, *, name: str = "model"):
    """Processed next-token distributions for the last ``n_rows`` prefixes of ``tokens``.

    ``[len(tokens)] -> [n_rows, V]``: row ``j`` is the distribution of the token after
    ``tokens[:len(tokens) - n_rows + j + 1]``.  Float64, or Fraction for exact models.
    """
    tokens = list(tokens)
    exact = hasattr(model, "probs")
    if not exact and not callable(model):
        raise SpecrefTypeError(f"{name} must be a model: callable model(tokens) -> logits, or with "
                               f"probs(tokens); got {type(model).__name__}")
    try:
        rows = model.probs(tokens) if exact else model(tokens)
    except Exception as e:
        e.add_note(f"(raised by the {name} model on {len(tokens)} tokens)")  # which side failed
        raise
    shape = getattr(rows, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != len(tokens) or shape[1] < 1:
        kind = "probs" if exact else "logits"
        raise SpecrefError(
            f"{name} must return {kind} of shape [len(tokens), V] = [{len(tokens)}, V], got {shape}"
        )
    last = rows[len(tokens) - n_rows :]
    try:
        return process_probs(last, config) if exact else process(last, config)
    except SpecrefError as e:
        raise SpecrefError(f"the {name} model's output is not valid: {e}") from None


def next_token_probs(model, tokens, config: SamplingConfig, *, name: str = "model"):
    """The processed distribution of the token after ``tokens``.  ``[n] -> [V]``"""
    return model_rows(model, tokens, 1, config, name=name)[0]


# ---------------------------------------------------------------- target sampling


def target_transition(target, prompt, *, config, max_new_tokens, stop_tokens=(), memo=True):
    """``iteration(generated, rng) -> (block, next_state)`` for plain target sampling."""
    prompt, stops = _check_common(target, prompt, config, max_new_tokens, stop_tokens)
    target_rows = _Rows(target, config, "target", memo)

    def iteration(generated: tuple, rng):
        p = target_rows.last(prompt + list(generated), 1)[0]
        return kept_block(generated, [draw(rng, p)], max_new_tokens, stops)

    return iteration


def sample_target(target, prompt, *, config: SamplingConfig, max_new_tokens: int, stop_tokens=(), rng):
    """Ground truth: repeat ``x ~ p(. | prefix)`` until a stop token or ``max_new_tokens``."""
    stop_tokens = _as_tuple("stop_tokens", stop_tokens)
    iteration = target_transition(
        target, prompt, config=config, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, memo=False
    )
    check_rng(rng)
    result = DecodeResult(tokens=[])
    state = () if max_new_tokens > 0 else None
    while state is not None:
        block, state = iteration(state, rng)
        result.tokens += block
        result.iterations += 1
        result.target_calls += 1
    result.stopped = bool(result.tokens) and result.tokens[-1] in set(stop_tokens)
    return result


def _as_tuple(name, values):
    """An iterable of tokens as a tuple, read once (a generator is not consumed twice)."""
    try:
        return tuple(values.tolist() if hasattr(values, "tolist") else values)
    except TypeError:
        raise SpecrefError(f"{name} must be an iterable of token ids, got {values!r:.80}") from None


# ---------------------------------------------------------------- speculative decoding


@dataclass(frozen=True)
class _Block:
    emitted: list[int]  # what the step emitted, before truncation: 1..K+1 tokens
    accepted: int  # draft tokens accepted (= len(emitted) - 1)


def speculative_block(target, draft, tokens, *, k: int, config: SamplingConfig, rng, step=None) -> list[int]:
    """One iteration on the prefix ``tokens``: draft K, one target call, accept/resample.

    Returns the 1..K+1 emitted tokens (no stop/length truncation).
    """
    target_rows = _Rows(target, config, "target", memo=False)
    draft_rows = _Rows(draft, config, "draft", memo=False)
    k = check_positive_int("k", k)
    check_rng(rng)
    return _speculative_block(target_rows, draft_rows, list(tokens), k, rng, step).emitted


def _speculative_block(target_rows, draft_rows, tokens, k, rng, step, V=None) -> _Block:
    # 1. draft K tokens autoregressively from q
    context = list(tokens)
    q_rows, drafted = [], []
    for _ in range(k):
        q = draft_rows.last(context, 1)[0]
        if V is not None and q.shape[-1] != V:  # before a draft token can reach the target
            raise SpecrefError(f"vocabulary mismatch: the draft model gives V={q.shape[-1]}, the target V={V}")
        x = draw(rng, q)
        q_rows.append(q)
        drafted.append(x)
        context.append(x)
    q_draft = np.stack(q_rows)  # [K, V]
    # 2. one target call scores the K+1 prefixes tokens, tokens+x1, ..., tokens+x1..xK
    p_target = target_rows.last(context, k + 1)  # [K+1, V]
    if p_target.shape[1] != q_draft.shape[1]:
        raise SpecrefError(
            f"vocabulary mismatch: target gives V={p_target.shape[1]}, draft gives V={q_draft.shape[1]}"
        )
    p_target, q_draft = same_kind(p_target, q_draft)
    # 3.-4. accept until the first rejection; then residual or bonus (specref.core.step)
    if step is None:  # the reference; its rows come from specref.core.sampling, valid by construction
        emitted = speculative_step(p_target, q_draft, drafted, rng, check=False)
    else:  # a hook: its output must be a block of 1..K+1 tokens of the vocabulary
        out = step(p_target, q_draft, drafted, rng)
        emitted = check_tokens("the step= hook's output", _as_tuple("the step= hook's output", out),
                               p_target.shape[1])
        if not 1 <= len(emitted) <= k + 1:
            raise SpecrefError(f"the step= hook must return 1 to K+1 = {k + 1} tokens, got {len(emitted)}: "
                               f"{emitted[:k + 3]}")
    return _Block(emitted=emitted, accepted=len(emitted) - 1)


class _Rows:
    """A model's processed next-token rows, optionally memoised per prefix.

    The exact enumerator replays an iteration once per path of its random choices,
    so the same prefixes come back thousands of times: ``memo=True`` computes each
    prefix's row once (models are deterministic functions of the tokens).  Real
    decoding uses ``memo=False``, so every target and draft call really happens.
    """

    def __init__(self, model, config, name, memo):
        self.model, self.config, self.name = model, config, name
        self.cache = {} if memo else None

    def last(self, tokens, n_rows):  # [len(tokens)] -> [n_rows, V]
        if self.cache is None:
            return model_rows(self.model, tokens, n_rows, self.config, name=self.name)
        key = (tuple(tokens), n_rows)
        rows = self.cache.get(key)
        if rows is None:
            rows = self.cache[key] = model_rows(self.model, tokens, n_rows, self.config, name=self.name)
        return rows


def speculative_transition(
    target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), step=None, memo=True
):
    """``iteration(generated, rng) -> (block, next_state)`` for speculative decoding.

    ``step(p_target, q_draft, draft_tokens, rng)`` replaces the reference step when
    given (the oracle lifts an implementation under test into a decoder with it).  ``memo`` caches each
    prefix's rows (see ``_Rows``): right for enumeration, wrong for timing.
    """
    return _transition(target, draft, prompt, k, config, max_new_tokens, stop_tokens, step, memo, stats=None)


def _transition(target, draft, prompt, k, config, max_new_tokens, stop_tokens, step, memo, stats):
    prompt, stops, V = _check_common(target, prompt, config, max_new_tokens, stop_tokens, vocab=True)
    k = check_positive_int("k", k)
    target_rows = _Rows(target, config, "target", memo)
    draft_rows = _Rows(draft, config, "draft", memo)

    def iteration(generated: tuple, rng):
        b = _speculative_block(target_rows, draft_rows, prompt + list(generated), k, rng, step, V)
        if stats is not None:
            _record(stats, b, k)
        return kept_block(generated, b.emitted, max_new_tokens, stops)

    return iteration


def speculative_decode(
    target,
    draft,
    prompt,
    *,
    k: int,
    config: SamplingConfig,
    max_new_tokens: int,
    stop_tokens=(),
    rng,
    step=None,
) -> DecodeResult:
    """Speculative decoding: repeat {draft K; one target call; accept until the first rejection}.

    ``step(p_target, q_draft, draft_tokens, rng)`` replaces the reference
    :func:`specref.core.step.speculative_step` when given.
    """
    k = check_positive_int("k", k)
    check_rng(rng)
    stop_tokens = _as_tuple("stop_tokens", stop_tokens)
    if step is not None and not callable(step):
        raise SpecrefError(f"step must be None or a callable step(p_target, q_draft, draft_tokens, rng), got {step!r:.80}")
    result = DecodeResult(tokens=[], tested_per_position=[0] * k, accepted_per_position=[0] * k)
    iteration = _transition(
        target, draft, prompt, k, config, max_new_tokens, stop_tokens, step, memo=False, stats=result
    )
    state = () if max_new_tokens > 0 else None
    while state is not None:
        block, state = iteration(state, rng)
        result.tokens += block
    result.stopped = bool(result.tokens) and result.tokens[-1] in set(stop_tokens)
    return result


def _record(result: DecodeResult, b: _Block, k: int) -> None:
    result.iterations += 1
    result.target_calls += 1
    result.draft_calls += k
    result.accepted_per_iteration.append(b.accepted)
    for i in range(min(b.accepted + 1, k)):  # positions 1..accepted+1 were tested
        result.tested_per_position[i] += 1
        result.accepted_per_position[i] += i < b.accepted


# ---------------------------------------------------------------- shared pieces


def kept_block(generated: tuple, emitted, max_new_tokens: int, stops) -> tuple:
    """``(block, next state)`` of an iteration that emitted ``emitted`` after ``generated``: the block is
    kept up to the length limit and through the first stop token; the next state is None once the
    decode has ended (the limit reached, or the block ends in a stop token)."""
    kept = []
    for x in emitted[: max_new_tokens - len(generated)]:
        kept.append(x)
        if x in stops:
            break
    block = tuple(kept)
    state = generated + block
    return block, None if len(state) >= max_new_tokens or (block and block[-1] in stops) else state


def _check_common(target, prompt, config, max_new_tokens, stop_tokens, vocab=False):
    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
    check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    prompt_list = check_tokens("prompt", prompt, sys.maxsize)
    if not prompt_list:
        raise SpecrefError("prompt must hold at least one token (models condition on it), got []")
    V = getattr(target, "vocab_size", None)
    if V is None:  # no declared vocabulary: read it off one target row
        V = next_token_probs(target, prompt_list, SamplingConfig(), name="target").shape[-1]
    prompt_list = check_tokens("prompt", prompt_list, V)
    stops = frozenset(check_tokens("stop_tokens", stop_tokens, V))
    return (prompt_list, stops, V) if vocab else (prompt_list, stops)
