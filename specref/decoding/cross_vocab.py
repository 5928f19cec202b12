"""Speculative decoding with a draft of another vocabulary: SLEM and TLI (Timor et al., ICML 2025).

Timor, Mamou, Korat, Berchansky, Jain, Pereg, Wasserblat & Harel, *Accelerating LLM Inference
with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies* (ICML 2025,
arXiv 2502.05202).  The paper's notation: vocabularies are finite sets of strings, ``T`` the
target's and ``D`` the drafter's; a string is *expressible* in a vocabulary when it is a
concatenation of its tokens (§3, "Notation").  specref's: ``p`` the target, ``q`` the draft.

- **SLEM**, string-level exact match (Algorithm 2, §3, string-level verification): the draft
  proposes K tokens of its own vocabulary; their text is tokenized with the target's tokenizer
  into ``m`` candidates ``c_1..c_m``; one target call gives the ``m + 1`` rows; a target token
  ``y_j ~ p(. | prefix, c_<j)`` is drawn at each position in turn and kept, and drafting
  continues past it only while ``y_j == c_j`` (exact match).  The block is ``y_1..y_n`` with
  ``y_n`` the first mismatch, or the bonus ``y_{m+1}``.  Lossless whatever the candidates are:
  each ``y_j`` is drawn from the target's row for exactly the tokens emitted before it.  (The
  paper samples all ``m + 1`` positions and then finds the first mismatch; drawing them in
  turn has the same law and leaves the enumerator fewer branches.)
- **TLI**, token-level intersection (Algorithm 4, §4, token-level verification): the draft's
  row is restricted to the tokens whose strings are in both vocabularies (``T ∩ D``) and
  renormalised, ``q'(t) = q(t) / sum_{s in T ∩ D} q(s)``; the draft samples from ``q'`` and
  standard speculative sampling (Leviathan et al., Algorithm 1; :func:`specref.core.step.speculative_step`)
  verifies with ``q'`` read as a row over ``T``.  Lossless because ``q'`` is the distribution the
  draft tokens really came from, a row over the target's vocabulary like any other draft.

(Confirmed against the paper's section headings and summaries: §3 "Speculative Decoding for
Heterogeneous Vocabularies with String-Level Verification" holds SLEM (Algorithm 2) and its
rejection-sampling variant SLRS (Algorithm 3, §3.3, not implemented here: its acceptance
probability sums over every tokenization of a string); §4 "... with Token-Level Verification"
holds TLI (Algorithm 4), whose acceptance rate is at least that of Algorithm 1, the draft over
the union of the vocabularies; Algorithm 5 in the appendix is standard speculative decoding.)

What specref fixes where the paper leaves a choice (each is lossless; the exact verifier
checks the laws, ``tests/test_cross_vocab.py``):

- The output is a sequence of **target** tokens; the prompt is target tokens too.  Committed
  tokens never change: the draft reads the text ``target_tokenizer.decode(prompt + generated)``
  re-tokenized with its own tokenizer, a deterministic function of the prefix.
- SLEM's candidates are ``target_tokenizer.encode(draft text)``: the new text alone, from the
  committed boundary (re-tokenizing across it only changes how many candidates match).
- TLI's draft stops early when its row gives ``T ∩ D`` no mass; with no draft token at all the
  iteration draws one token from ``p``.
- Stop tokens (target ids) and ``max_new_tokens`` truncate a block as in :mod:`specref.decoding.chain`.

A **tokenizer** here is any object with ``pieces`` (each token's raw string, by id; tokens of
the two vocabularies with equal strings are the intersection), ``encode(text) -> ids`` and
``decode(ids) -> text`` (``toy_models.tokenizers.ToyTokenizer``).  Models are specref models
(:mod:`specref.decoding.chain`) over each tokenizer's ids, with the same ``SamplingConfig``.
Each algorithm is ``iteration(state, rng) -> (block, next_state)`` for
:func:`specref.verification.laws.enumeration.law_iterated`, and a whole decode; hooks
(``match``, ``candidates``, ``restrict``, ``step``) let a variant change one rule (the zoo's wrong ones,
:mod:`specref.verification.zoo.cross_vocab`).  :func:`cross_vocab_decoder` binds the draft and the
tokenizers so a decode has the decoder level's signature (the oracle's case carries the target).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int, check_tokens
from specref.core.numbers import is_exact, same_kind
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.decoding.chain import DecodeResult, model_rows

__all__ = [
    "Intersection",
    "intersection",
    "restrict_to_intersection",
    "slem_transition",
    "tli_transition",
    "slem_decode",
    "tli_decode",
    "transition_decode",
    "cross_vocab_decoder",
    "ALGORITHMS",
    "DRAFT_CONTEXTS",
]


# ---------------------------------------------------------------- the two vocabularies


@dataclass(frozen=True)
class Intersection:
    """``T ∩ D``: the tokens whose raw strings are in both vocabularies.

    ``draft_ids[i]`` and ``target_ids[i]`` are the same string's ids; ``target_of`` maps a draft id
    to its target id.  ``target_vocab``, ``draft_vocab``: the two sizes.
    """

    draft_ids: np.ndarray
    target_ids: np.ndarray
    target_vocab: int
    draft_vocab: int
    target_of: dict = field(repr=False)

    def target_mask(self) -> np.ndarray:
        """``[V_target]`` booleans: which target tokens are in the intersection."""
        mask = np.zeros(self.target_vocab, dtype=bool)
        mask[self.target_ids] = True
        return mask


def _check_tokenizer(name, tokenizer):
    missing = [a for a in ("pieces", "encode", "decode") if not hasattr(tokenizer, a)]
    if missing:
        raise SpecrefTypeError(f"{name} must have pieces, encode(text) and decode(ids); "
                               f"{type(tokenizer).__name__} lacks {', '.join(missing)}")
    pieces = list(tokenizer.pieces)
    if len(set(pieces)) != len(pieces) or not all(isinstance(s, str) and s for s in pieces):
        raise SpecrefError(f"{name}: pieces must be distinct non-empty strings, one per id")
    return pieces


def intersection(target_tokenizer, draft_tokenizer) -> Intersection:
    """``T ∩ D`` by raw string (the paper's vocabularies are sets of strings, §3)."""
    t_pieces = _check_tokenizer("target_tokenizer", target_tokenizer)
    d_pieces = _check_tokenizer("draft_tokenizer", draft_tokenizer)
    t_id = {s: i for i, s in enumerate(t_pieces)}
    pairs = [(d, t_id[s]) for d, s in enumerate(d_pieces) if s in t_id]
    if not pairs:
        raise SpecrefError("the two vocabularies share no token: TLI has nothing to draft")
    d_ids, t_ids = (np.array(ids, dtype=np.int64) for ids in zip(*pairs))
    return Intersection(d_ids, t_ids, len(t_pieces), len(d_pieces), dict(pairs))


def _zeros(n, exact):
    return np.array([Fraction(0)] * n, dtype=object) if exact else np.zeros(n)


def restrict_to_intersection(q, inter: Intersection):
    """The TLI proposal: ``q`` (``[V_draft]``) restricted to ``T ∩ D`` and renormalised.

    Returns ``(row to sample from [V_draft], the same row over the target's ids [V_target])``,
    or None when ``q`` gives the intersection no mass.
    """
    w = q[inter.draft_ids]
    total = w.sum()
    if total == 0:
        return None
    exact = is_exact(q)
    sample, verify = _zeros(inter.draft_vocab, exact), _zeros(inter.target_vocab, exact)
    sample[inter.draft_ids] = w / total
    verify[inter.target_ids] = w / total
    return sample, verify


# ---------------------------------------------------------------- rows, memoised


class _Rows:
    """Processed next-token rows of one model, memoised per prefix when ``memo`` (as in the chain loops)."""

    def __init__(self, model, config, name, vocab, memo):
        self.model, self.config, self.name, self.vocab = model, config, name, vocab
        self.cache = {} if memo else None

    def last(self, tokens, n_rows):  # [len(tokens)] -> [n_rows, V]
        key = (tuple(tokens), n_rows)
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        rows = model_rows(self.model, list(tokens), n_rows, self.config, name=self.name)
        if rows.shape[-1] != self.vocab:
            raise SpecrefError(f"the {self.name} model gives V={rows.shape[-1]}, its tokenizer has "
                               f"{self.vocab} tokens")
        if self.cache is not None:
            self.cache[key] = rows
        return rows


@dataclass
class _Setting:
    """What every iteration of one decode shares (checked once)."""

    target_rows: _Rows
    draft_rows: _Rows
    target_tokenizer: Any  # anything with encode(text) -> ids and decode(ids) -> text
    draft_tokenizer: Any
    prompt: list
    k: int
    max_new_tokens: int
    stops: frozenset
    context: str = "text"  # how the draft reads the committed tokens (DRAFT_CONTEXTS)
    to_draft: dict = field(default_factory=dict, repr=False)  # target id -> draft id, shared strings ("mapped")

    def draft_context(self, committed) -> list[int]:
        """The draft's own tokens for the committed target tokens.

        ``"text"``: ``draft.encode(target.decode(committed))``.  ``"mapped"``: the prompt's text
        encoded so, then each generated token as the draft token of the same string where there is
        one, else its own text encoded alone (transformers' ``UniversalSpeculativeDecodingGenerator``).
        """
        if self.context == "text":
            ids = self.draft_tokenizer.encode(self.target_tokenizer.decode(committed))
        else:
            ids = list(self.draft_tokenizer.encode(self.target_tokenizer.decode(self.prompt)))
            for t in committed[len(self.prompt):]:
                ids += [self.to_draft[t]] if t in self.to_draft else self.draft_tokenizer.encode(
                    self.target_tokenizer.decode([t]))
        return check_tokens("draft_tokenizer.encode(text)", ids, self.draft_rows.vocab)


DRAFT_CONTEXTS = ("text", "mapped")
"""How a draft of another vocabulary reads the committed target tokens (:meth:`_Setting.draft_context`)."""


def _setting(target, draft, target_tokenizer, draft_tokenizer, prompt, k, config, max_new_tokens, stop_tokens,
             memo) -> _Setting:
    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
    t_pieces = _check_tokenizer("target_tokenizer", target_tokenizer)
    d_pieces = _check_tokenizer("draft_tokenizer", draft_tokenizer)
    check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    prompt = check_tokens("prompt", prompt, len(t_pieces))
    if not prompt:
        raise SpecrefError("prompt must hold at least one target token, got []")
    stops = frozenset(check_tokens("stop_tokens", tuple(stop_tokens), len(t_pieces)))
    return _Setting(_Rows(target, config, "target", len(t_pieces), memo),
                    _Rows(draft, config, "draft", len(d_pieces), memo),
                    target_tokenizer, draft_tokenizer, prompt, check_positive_int("k", k), max_new_tokens, stops)


def _kept(generated: tuple, emitted, s: _Setting):
    """The part of ``emitted`` that is kept (the length limit, the first stop token), and the next state."""
    kept = []
    for x in emitted[: s.max_new_tokens - len(generated)]:
        kept.append(int(x))
        if x in s.stops:
            break
    state = generated + tuple(kept)
    done = len(state) >= s.max_new_tokens or (kept and kept[-1] in s.stops)
    return tuple(kept), None if done else state


# ---------------------------------------------------------------- SLEM (Algorithm 2, §3)


def _same_token(y: int, c: int) -> bool:
    """(reference) SLEM's test: the target's token is the candidate, id for id."""
    return y == c


def _new_text_alone(s: _Setting, committed: list, text: str) -> list[int]:
    """(reference) SLEM's candidates: the draft's new text tokenized alone, from the committed boundary."""
    return s.target_tokenizer.encode(text)


def _slem_block(s: _Setting, committed: list, rng, match, candidates_of, stats):
    context = s.draft_context(committed)
    drafted: list[int] = []
    for _ in range(s.k):  # K draft tokens of the draft's own vocabulary, each ~ q
        drafted.append(draw(rng, s.draft_rows.last(context + drafted, 1)[0]))
    text = s.draft_tokenizer.decode(drafted)
    candidates = check_tokens("the candidates", candidates_of(s, committed, text), s.target_rows.vocab)
    p_rows = s.target_rows.last(committed + candidates, len(candidates) + 1)  # one target call, m + 1 rows
    block = []
    for j in range(len(candidates) + 1):
        y = draw(rng, p_rows[j])  # y_j ~ p(. | committed, c_<j): only reached while y_<j == c_<j
        block.append(y)
        if j == len(candidates) or not match(y, candidates[j]):
            break
    if stats is not None:
        _record(stats, len(block) - 1, s.k)
    return block


def slem_transition(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config, max_new_tokens,
                    stop_tokens=(), memo=True, match=None, candidates=None):
    """SLEM as ``iteration(generated, rng) -> (block, next_state)`` (states: target tokens after the prompt).

    ``match(y, c) -> bool`` replaces the exact-match test (the reference: ``y == c``);
    ``candidates(target_tokenizer, committed, draft_text) -> target ids`` the candidates (the
    reference: ``target_tokenizer.encode(draft_text)``).
    """
    s = _setting(target, draft, target_tokenizer, draft_tokenizer, prompt, k, config, max_new_tokens,
                 stop_tokens, memo)
    match = match or _same_token
    candidates_of = _new_text_alone if candidates is None else (
        lambda s_, committed, text: candidates(s_.target_tokenizer, committed, text))
    return _iteration(s, lambda committed, rng, stats: _slem_block(s, committed, rng, match, candidates_of, stats))


# ---------------------------------------------------------------- TLI (Algorithm 4, §4)


def _reference_step(p_target, q_draft, draft_tokens, rng):
    """(reference) Standard speculative sampling on rows over the target's vocabulary."""
    return speculative_step(p_target, q_draft, draft_tokens, rng, check=False)


def _tli_block(s: _Setting, inter: Intersection, committed: list, rng, restrict, step, stats):
    context = s.draft_context(committed)
    drafted_d: list[int] = []
    drafted_t: list[int] = []
    q_rows: list = []
    for _ in range(s.k):
        proposal = restrict(s.draft_rows.last(context + drafted_d, 1)[0], inter)
        if proposal is None:  # the draft gives T ∩ D no mass here: stop drafting
            break
        sample_row, verify_row = proposal
        x = draw(rng, sample_row)
        drafted_d.append(x)
        drafted_t.append(inter.target_of[x])
        q_rows.append(verify_row)
    if not drafted_t:
        block = [draw(rng, s.target_rows.last(committed, 1)[0])]
    else:
        p_rows = s.target_rows.last(committed + drafted_t, len(drafted_t) + 1)  # one target call
        p_rows, q = same_kind(p_rows, np.stack(q_rows))
        block = [int(x) for x in step(p_rows, q, drafted_t, rng)]
    if stats is not None:
        _record(stats, len(block) - 1, s.k)
    return block


def tli_transition(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config, max_new_tokens,
                   stop_tokens=(), memo=True, restrict=None, step=None, draft_context: str = "text"):
    """TLI as ``iteration(generated, rng) -> (block, next_state)``.

    ``restrict(q [V_draft], intersection) -> (sample row [V_draft], verify row [V_target]) | None``
    replaces the proposal (the reference: :func:`restrict_to_intersection`); ``step(p_target,
    q_draft, draft_tokens, rng)`` the verification (the reference: ``speculative_step``).
    ``draft_context``: how the draft reads the committed tokens, one of :data:`DRAFT_CONTEXTS`
    (``"text"``: re-tokenized text; ``"mapped"``: token by token, as transformers does); both lossless.
    """
    if draft_context not in DRAFT_CONTEXTS:
        raise SpecrefError(f"draft_context must be one of {DRAFT_CONTEXTS}, got {draft_context!r}")
    s = _setting(target, draft, target_tokenizer, draft_tokenizer, prompt, k, config, max_new_tokens,
                 stop_tokens, memo)
    inter = intersection(target_tokenizer, draft_tokenizer)
    s.context, s.to_draft = draft_context, {int(t): int(d) for d, t in zip(inter.draft_ids, inter.target_ids)}
    restrict, step = restrict or restrict_to_intersection, step or _reference_step
    return _iteration(s, lambda committed, rng, stats: _tli_block(s, inter, committed, rng, restrict, step, stats))


# ---------------------------------------------------------------- loops


def _iteration(s: _Setting, block_of):
    def iteration(generated: tuple, rng, stats=None):
        block = block_of(s.prompt + list(generated), rng, stats)
        return _kept(tuple(generated), block, s)

    iteration.setting = s  # type: ignore[attr-defined]  # _decode reads the checked setting back
    return iteration


def _record(result: DecodeResult, accepted: int, k: int) -> None:
    result.iterations += 1
    result.target_calls += 1
    result.draft_calls += k
    result.accepted_per_iteration.append(accepted)


def _decode(transition, rng, **kwargs) -> DecodeResult:
    check_rng(rng)
    iteration = transition(memo=False, **kwargs)
    s = iteration.setting
    result = DecodeResult(tokens=[])
    state = () if s.max_new_tokens > 0 else None
    while state is not None:
        block, state = iteration(state, rng, result)
        result.tokens += block
    result.stopped = bool(result.tokens) and result.tokens[-1] in s.stops
    return result


def slem_decode(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config, max_new_tokens,
                stop_tokens=(), rng, match=None, candidates=None) -> DecodeResult:
    """A whole SLEM decode (target tokens after the prompt, with the run's statistics)."""
    return _decode(slem_transition, rng, target=target, draft=draft, target_tokenizer=target_tokenizer,
                   draft_tokenizer=draft_tokenizer, prompt=prompt, k=k, config=config,
                   max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, match=match, candidates=candidates)


def tli_decode(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config, max_new_tokens,
               stop_tokens=(), rng, restrict=None, step=None) -> DecodeResult:
    """A whole TLI decode (target tokens after the prompt, with the run's statistics)."""
    return _decode(tli_transition, rng, target=target, draft=draft, target_tokenizer=target_tokenizer,
                   draft_tokenizer=draft_tokenizer, prompt=prompt, k=k, config=config,
                   max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, restrict=restrict, step=step)


def transition_decode(transition, *, name: str | None = None):
    """A cross-vocabulary decode from an iteration factory with the transitions' signature.

    ``transition(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config,
    max_new_tokens, stop_tokens, memo) -> iteration``; the decode runs ``iteration`` from the
    empty state until it returns None and concatenates the blocks (what
    :func:`~specref.verification.laws.enumeration.law_iterated` enumerates), as a token list.
    """
    def decode(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config, max_new_tokens,
               stop_tokens=(), rng):
        check_rng(rng)
        iteration = transition(target, draft, target_tokenizer, draft_tokenizer, prompt, k=k, config=config,
                               max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, memo=False)
        out, state = [], () if max_new_tokens > 0 else None
        while state is not None:
            block, state = iteration(state, rng)
            out += [int(x) for x in block]
        return out

    decode.__name__ = name if name else str(getattr(transition, "__name__", "decode"))
    return decode


ALGORITHMS: dict[str, Callable[..., DecodeResult]] = {"slem": slem_decode, "tli": tli_decode}
"""The reference cross-vocabulary decodes by name."""


def cross_vocab_decoder(decode, draft, target_tokenizer, draft_tokenizer, *, name=None):
    """``decode`` (a cross-vocabulary decode, or the name of one) as a decoder-level implementation.

    The result is ``decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens,
    rng) -> tokens``: the oracle's case supplies the target (over the target tokenizer's ids)
    and a same-shape draft table, which is not used -- the bound ``draft`` (over the draft
    tokenizer's ids) drafts.  A decode may return a :class:`DecodeResult` or a token list.
    """
    if isinstance(decode, str):
        if decode not in ALGORITHMS:
            raise SpecrefError(f"decode must be one of {sorted(ALGORITHMS)} or a callable, got {decode!r}")
        decode = ALGORITHMS[decode]

    def decode_fn(target, _draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng):
        out = decode(target, draft, target_tokenizer, draft_tokenizer, prompt, k=k, config=config,
                     max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, rng=rng)
        return list(out.tokens if isinstance(out, DecodeResult) else out)

    decode_fn.__name__ = name or f"cross_vocab[{getattr(decode, '__name__', 'decode')}]"
    return decode_fn
