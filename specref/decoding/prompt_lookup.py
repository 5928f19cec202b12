"""Prompt lookup decoding: an n-gram draft read from the context itself (SPEC §15).

Saxena's prompt lookup decoding (github.com/apoorvumang/prompt-lookup-decoding), which
transformers ships as ``PromptLookupCandidateGenerator``, drafts without a draft model: the last
``n`` tokens of the context (``n`` from ``max_ngram`` down to 1) are looked up earlier in the
context, and the tokens that followed their earliest occurrence are the draft.  A draft has no
probabilities: it is a point mass, so speculative sampling accepts draft ``d`` with probability
``min(1, p(d) / 1) = p(d)`` and resamples a rejection from ``max(0, p - 1[d])``, which is ``p``
without ``d``, renormalised.  Together: sample every position from ``p`` and keep drafts while
they match.  The output law is the target's; what the draft changes is the number of target calls.

- :func:`lookup_draft`: the draft after a context;
- :func:`lookup_transition`: one target call of the decoder, for
  :func:`specref.verification.laws.enumeration.law_iterated` (the exact law of the output and of
  the number of calls: :func:`specref.verification.statistics.efficiency.lookup_iterations`).
"""

from __future__ import annotations

from specref.core.draws import draw
from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.decoding.chain import kept_block, next_token_probs

__all__ = ["lookup_draft", "lookup_transition"]


def _check_sizes(num_tokens, max_ngram):
    for name, value in (("num_tokens", num_tokens), ("max_ngram", max_ngram)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecrefError(f"{name} must be an int >= 1, got {value!r}")


def lookup_draft(tokens, num_tokens: int, max_ngram: int = 2, stop_tokens=()) -> list[int]:
    """The draft after ``tokens``: at most ``num_tokens`` ids, possibly none.

    For ``n`` from ``min(max_ngram, len(tokens) - 1)`` down to 1, the earliest position ``i`` with
    ``tokens[i:i+n] == tokens[-n:]`` and a token after it (``i + n < len(tokens)``) gives
    ``tokens[i+n : i+n+num_tokens]`` (cut at the end of ``tokens``); the first ``n`` with such a
    position decides.  The draft is then cut before its first stop token (a draft that starts with
    one is empty: the search does not go on).  No match: ``[]``.
    """
    _check_sizes(num_tokens, max_ngram)
    tokens = [int(t) for t in tokens]
    stops = {int(t) for t in stop_tokens}
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), 0, -1):
        tail = tokens[L - n:]
        for i in range(L - n):
            if tokens[i:i + n] == tail:
                draft = tokens[i + n: i + n + num_tokens]
                cut = next((j for j, t in enumerate(draft) if t in stops), len(draft))
                return draft[:cut]
    return []


def lookup_transition(target, prompt, *, num_tokens: int, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                      stop_tokens=(), max_ngram: int = 2):
    """One iteration (one target call) of prompt lookup decoding, as ``(state, rng) -> (block, next state)``.

    The state is the tuple of generated tokens (``None`` once the decode has ended).  The draft is
    :func:`lookup_draft` of prompt + generated, at most ``max_new_tokens - generated - 1`` long (an
    iteration never drafts past the budget: the call's own token is the last); each position's
    token is drawn from ``next_token_probs(target, ...)`` and the block ends at the first token that
    is not the draft's, at a stop token, or with the token after the last draft.
    """
    _check_sizes(num_tokens, max_ngram)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SpecrefError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    prompt = [int(t) for t in prompt]
    stops = frozenset(int(t) for t in stop_tokens)

    def iteration(state, rng):
        generated = list(state)
        context = prompt + generated
        drafts = lookup_draft(context, num_tokens, max_ngram, stops)[: max_new_tokens - len(generated) - 1]
        block = []
        for d in drafts + [None]:
            x = draw(rng, next_token_probs(target, context + block, config, name="target"))
            block.append(x)
            if x != d or x in stops:
                break
        return kept_block(state, block, max_new_tokens, stops)

    return iteration
