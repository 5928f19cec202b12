"""Wrong cross-vocabulary decoders: SLEM and TLI with one rule off (:mod:`specref.decoding.cross_vocab`).

Leviathan et al. notation (``p`` target, ``q`` draft); Timor et al.'s (ICML 2025) ``T`` and ``D``
for the target's and the draft's vocabularies, ``I = T ∩ D``.  Every entry is a
:class:`CrossVocabEntry`: an iteration factory with the reference transitions' signature,
``transition(target, draft, target_tokenizer, draft_tokenizer, prompt, *, k, config,
max_new_tokens, stop_tokens=(), memo=True) -> iteration`` (for
:func:`~specref.verification.laws.enumeration.law_iterated`), and ``entry.fn``, the same as a
whole decode (target ids; bind it with :func:`specref.decoding.cross_vocab.cross_vocab_decoder`
for the decoder level).  Each wrong entry changes one rule of the reference through its hooks and
is detected in exact mode (TV > 0 exactly, ``tests/test_cross_vocab.py``) on a case where that
rule matters, which ``needs`` names:

========================  =====  ======================================================  =============
name                      algo   what is wrong                                           needs
========================  =====  ======================================================  =============
tli_unnormalised          TLI    draft tokens outside ``I`` dropped from ``q`` after     draft tokens
                                 the softmax, no renormalisation: the draft samples      outside T
                                 ``norm(q|I)`` (a multinomial normalises) but the test
                                 and the residual use ``q|I``
tli_in_draft_vocab        TLI    verification in the draft's vocabulary: ``p`` is read   target tokens
                                 on ``I`` only (renormalised) for the test, the          outside D
                                 residual and the bonus
slem_retokenised_prefix   SLEM   the text is the state: every round the whole text is    non-canonical
                                 re-tokenised, so committed target tokens merge across   target tokens
                                 a piece boundary
slem_string_match         SLEM   strings compared, not tokens: ``y_j`` counts as a       target pieces
                                 match when ``c_j``'s string starts with ``y_j``'s       that prefix
                                                                                         others
slem_candidates_in_text   SLEM   (correct) candidates cut from the re-tokenised whole    -
                                 text: only how many match changes
slem_reference            SLEM   (correct) the reference                                 -
tli_reference             TLI    (correct) the reference                                 -
========================  =====  ======================================================  =============

This room never imports ``toy_models``: the tokenizers and models come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.numbers import is_exact
from specref.core.step import speculative_step
from specref.decoding.cross_vocab import intersection, slem_transition, tli_transition, transition_decode

__all__ = ["CrossVocabEntry", "CROSS_VOCAB_ZOO", "entries", "tli_unnormalised", "tli_in_draft_vocab",
           "slem_retokenised_prefix", "slem_string_match", "slem_candidates_in_text"]

KINDS = ("wrong", "correct")


@dataclass(frozen=True)
class CrossVocabEntry:
    """One named cross-vocabulary decoder and what it is."""

    name: str
    algorithm: str  # "slem" | "tli"
    transition: Callable  # the iteration factory (module docstring)
    kind: str  # "wrong" | "correct"
    description: str  # one line
    needs: str = ""  # what a case must have for the rule to matter ("" for correct entries)

    def __post_init__(self):
        if self.kind not in KINDS or self.algorithm not in ("slem", "tli"):
            raise SpecrefError(f"CrossVocabEntry {self.name!r}: kind in {KINDS}, algorithm 'slem' or 'tli'")
        if not self.description or "\n" in self.description:
            raise SpecrefError(f"CrossVocabEntry {self.name!r}: the description must be one non-empty line")

    @property
    def fn(self) -> Callable:
        """The entry as a whole decode: ``fn(target, draft, target_tokenizer, draft_tokenizer, prompt, *,
        k, config, max_new_tokens, stop_tokens=(), rng) -> tokens``."""
        return transition_decode(self.transition, name=self.name)


# ---------------------------------------------------------------- TLI


def _zeros(n, like):
    return np.array([Fraction(0)] * n, dtype=object) if is_exact(like) else np.zeros(n)


def _unnormalised(q, inter):
    """BUG: the draft's row with the tokens outside ``I`` zeroed and not renormalised; the draft
    still samples ``norm(q|I)`` (a multinomial normalises its weights) but the test sees ``q|I``."""
    w = q[inter.draft_ids]
    total = w.sum()
    if total == 0:
        return None
    sample, verify = _zeros(inter.draft_vocab, q), _zeros(inter.target_vocab, q)
    sample[inter.draft_ids] = w / total
    verify[inter.target_ids] = w  # BUG: no / total
    return sample, verify


def tli_unnormalised(target, draft, target_tokenizer, draft_tokenizer, prompt, **settings):
    """TLI whose verification row is the draft's row masked to ``I`` without renormalising."""
    return tli_transition(target, draft, target_tokenizer, draft_tokenizer, prompt, restrict=_unnormalised,
                          **settings)


def tli_in_draft_vocab(target, draft, target_tokenizer, draft_tokenizer, prompt, **settings):
    """TLI verified in the draft's vocabulary: every target row is ``p`` on ``I``, renormalised."""
    mask = intersection(target_tokenizer, draft_tokenizer).target_mask()

    def step(p_target, q_draft, draft_tokens, rng):
        p = p_target.copy()
        p[:, ~mask] = 0  # BUG: target tokens the draft cannot spell are gone from p
        totals = p.sum(axis=1)
        rows = np.stack([p[i] / totals[i] if totals[i] > 0 else p_target[i] for i in range(p.shape[0])])
        return speculative_step(rows, q_draft, draft_tokens, rng, check=False)

    return tli_transition(target, draft, target_tokenizer, draft_tokenizer, prompt, step=step, **settings)


# ---------------------------------------------------------------- SLEM


def slem_retokenised_prefix(target, draft, target_tokenizer, draft_tokenizer, prompt, *, max_new_tokens,
                            **settings):
    """SLEM whose state is the text: after every block the whole text is tokenized again, so the
    committed target tokens become the canonical tokenization (``"▁t" "he"`` turns into ``"▁the"``).

    Its iterations emit nothing until the last, which emits the whole (re-tokenized) output.
    """
    inner = slem_transition(target, draft, target_tokenizer, draft_tokenizer, prompt,
                            max_new_tokens=max_new_tokens, **settings)
    prompt = list(prompt)

    def iteration(state, rng):
        block, following = inner(state, rng)
        text = target_tokenizer.decode(prompt + list(state) + list(block))
        out = tuple(target_tokenizer.encode(text)[len(prompt):])[:max_new_tokens]  # BUG: re-tokenised
        if following is None or len(out) >= max_new_tokens:
            return out, None
        return (), out

    return iteration


def slem_string_match(target, draft, target_tokenizer, draft_tokenizer, prompt, **settings):
    """SLEM comparing strings: ``y_j`` matches ``c_j`` when ``c_j``'s string starts with ``y_j``'s."""
    pieces = list(target_tokenizer.pieces)
    return slem_transition(target, draft, target_tokenizer, draft_tokenizer, prompt,
                           match=lambda y, c: pieces[c].startswith(pieces[y]), **settings)  # BUG: a prefix passes


def _from_whole_text(target_tokenizer, committed, text):
    """The candidates cut out of the whole text re-tokenized: ``encode(committed text + text)``
    past the committed tokens (the boundary may merge: only how many candidates match changes)."""
    whole = target_tokenizer.encode(target_tokenizer.decode(committed) + text)
    return whole[len(committed):] or target_tokenizer.encode(text)


def slem_candidates_in_text(target, draft, target_tokenizer, draft_tokenizer, prompt, **settings):
    """(correct) SLEM with candidates ``encode(committed text + draft text)[len(committed):]``: the
    re-tokenization crosses the boundary, but committed tokens stay, so the law does not change."""
    return slem_transition(target, draft, target_tokenizer, draft_tokenizer, prompt, candidates=_from_whole_text,
                           **settings)


def _entries():
    E = CrossVocabEntry
    return [
        E("tli_unnormalised", "tli", tli_unnormalised, "wrong",
          "draft tokens outside the intersection dropped after the softmax, q not renormalised",
          "a draft that puts mass on tokens the target lacks"),
        E("tli_in_draft_vocab", "tli", tli_in_draft_vocab, "wrong",
          "verification in the draft's vocabulary: p read on the intersection only",
          "a target that puts mass on tokens the draft lacks"),
        E("slem_retokenised_prefix", "slem", slem_retokenised_prefix, "wrong",
          "the whole text re-tokenised each round: committed tokens merge across a piece boundary",
          "a target that puts mass on non-canonical tokenizations"),
        E("slem_string_match", "slem", slem_string_match, "wrong",
          "strings compared in place of tokens: a target token that is a prefix of the candidate passes",
          "target pieces that are prefixes of others"),
        E("slem_candidates_in_text", "slem", slem_candidates_in_text, "correct",
          "candidates cut from the re-tokenised whole text (committed tokens unchanged)"),
        E("slem_reference", "slem", slem_transition, "correct", "the reference SLEM"),
        E("tli_reference", "tli", tli_transition, "correct", "the reference TLI"),
    ]


CROSS_VOCAB_ZOO: dict[str, CrossVocabEntry] = {e.name: e for e in _entries()}


def entries(kind: str | None = None) -> list[CrossVocabEntry]:
    """The entries, optionally of one kind (``"wrong"`` or ``"correct"``)."""
    if kind is not None and kind not in KINDS:
        raise SpecrefError(f"kind must be one of {KINDS} or None, got {kind!r}")
    return [e for e in CROSS_VOCAB_ZOO.values() if kind is None or e.kind == kind]
