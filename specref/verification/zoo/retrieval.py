"""Slips in lookahead decoding and REST, each one rule off the reference (SPEC §16.3, §16.4).

Both methods verify **point-mass** drafts: the candidates of a call are a function of the tokens
committed before it (the n-gram pool; the datastore's continuations).  For a lossless verifier,
what is drafted cannot change the output's law -- any set of candidates fixed before the call's
coins is verified to the target's law -- so a slip in *drafting* alone changes only the cost:
the number of target calls.  A slip is caught by the law only when it changes what is
**verified or emitted**: candidates judged against the target's rows of another context, a
rejected token left in the row that judges the next candidate, rows read one position off.
Each entry says which it is and how it shows:

=========================  =========  ===========  ========  ============================================
name                       method     kind         changes   what it is
=========================  =========  ===========  ========  ============================================
lookahead_reference        lookahead  correct      -         the reference (``lookahead_transition``)
lookahead_bonus            lookahead  correct      emitted   a fully accepted n-gram also emits the token
                                                             after it (fewer calls, same law)
lookahead_resample_from_p  lookahead  wrong        verified  a rejected candidate token is not removed:
                                                             later candidates and the last token are
                                                             judged against / drawn from ``p`` itself
lookahead_rows_shifted     lookahead  wrong        verified  each position judged against the target's
                                                             row one position later (the row after the
                                                             candidate's own token)
lookahead_stale_key        lookahead  correct      drafted   the pool read under the token before the
                                                             last: cost only
rest_published             rest       approximate  -         the authors' sampling rule (``rest_verify``)
rest_pointmass             rest       correct      verified  the same drafts, point-mass verification
rest_stale_tree            rest       wrong        verified  the trie retrieved and scored after the
                                                             context without its newest token, its
                                                             accepted tokens emitted after the whole
                                                             context
rest_stale_query           rest       correct      drafted   only the retrieval reads the stale suffix:
                                                             rows right, cost only
rest_padded_paths          rest       wrong        verified  the code's padding: a short path continued
                                                             with token 0, judged against the last
                                                             node's row (the ``-1`` index)
=========================  =========  ===========  ========  ============================================

``caught_by`` names the checks that catch an entry: ``"law"`` (the exact law differs from the
target's: TV > 0 in exact arithmetic), ``"greedy"`` (a greedy decode differs from plain greedy
decoding on some prompt), ``"efficiency"`` (the law is the reference's, the exact calls per token
differ).  A cost-only slip (``changes == "drafted"``) is ``correct``: it costs calls, never the
law.  ``tests/test_lookahead.py`` and ``tests/test_rest.py`` run each.

Also here, because they need the enumerator (which :mod:`specref.decoding` may not import): the
exact calls per token of either method, and of Algorithm 1 with a draft model on the same pair
(:func:`calls_per_token`, :func:`lookahead_calls_per_token`, :func:`rest_calls_per_token`,
:func:`chain_calls_per_token`).  This room never imports ``toy_models``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.draws import draw
from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree
from specref.decoding.chain import speculative_transition
from specref.decoding.lookahead import lookahead_transition, lookahead_verify
from specref.decoding.rest import rest_transition
from specref.verification.laws.enumeration import law_iterated

__all__ = ["RetrievalEntry", "RETRIEVAL_ZOO", "entries", "KINDS", "CHANGES", "CAUGHT_BY", "CallsPerToken", "calls_per_token",
           "lookahead_calls_per_token", "rest_calls_per_token", "chain_calls_per_token"]

KINDS = ("wrong", "approximate", "correct")
CHANGES = ("verified", "emitted", "drafted", "-")  # what an entry changes from its method's reference
CAUGHT_BY = ("greedy", "law", "efficiency")


@dataclass(frozen=True)
class RetrievalEntry:
    """One named variant of lookahead decoding or REST and what it is (the fields of the zoo of
    decoders that draft from heads, ``DraftingEntry``)."""

    name: str
    method: str  # "lookahead" | "rest"
    transition: Callable  # the reference transition's signature (its method's), -> iteration(state, rng)
    kind: str  # "wrong" | "approximate" | "correct" (a cost-only slip is correct: it changes what is drafted)
    changes: str  # "verified" | "emitted" | "drafted" | "-"
    caught_by: tuple  # ("greedy",): greedy identity breaks; ("law",): the exact law moves; ("efficiency",): calls
    description: str  # one line

    def __post_init__(self):
        if self.kind not in KINDS or self.method not in ("lookahead", "rest") or self.changes not in CHANGES \
                or any(c not in CAUGHT_BY for c in self.caught_by):
            raise SpecrefError(f"RetrievalEntry {self.name!r}: kind in {KINDS}, method 'lookahead' or 'rest', "
                               f"changes in {CHANGES}, caught_by within {CAUGHT_BY}")
        if self.kind == "wrong" and (self.changes == "drafted" or not self.caught_by):
            raise SpecrefError(f"RetrievalEntry {self.name!r}: a wrong entry changes what is verified or emitted, "
                               "and names the check that catches it")
        if not self.description or "\n" in self.description:
            raise SpecrefError(f"RetrievalEntry {self.name!r}: the description must be one non-empty line")

    @property
    def cost_only(self) -> bool:
        """A drafting slip: the law is the reference's, only the calls change."""
        return self.changes == "drafted"


# ---------------------------------------------------------------- lookahead decoding


def lookahead_bonus(target, prompt, **settings):
    """(correct) The token after a fully accepted n-gram is drawn too: same law, fewer calls."""
    return lookahead_transition(target, prompt, **{**settings, "bonus": True})


def _resample_from_p(candidates, row, rng):
    """The published loop with its residual line left out: a rejected token stays in ``p~``."""
    live, prefix = [tuple(c) for c in candidates], ()
    p = row(prefix)
    while any(len(c) > len(prefix) for c in live):
        j, accepted = len(prefix), None
        for c in live:
            if len(c) > j and rng.random() < p[c[j]]:
                accepted = c[j]
                break  # BUG: no p~(x) <- 0 and renormalisation after a rejection
        if accepted is None:
            return list(prefix) + [draw(rng, p)], len(prefix)
        prefix += (accepted,)
        live = [c for c in live if len(c) > j and c[j] == accepted]
        p = row(prefix)
    return list(prefix) + ([] if prefix else [draw(rng, p)]), len(prefix)


def lookahead_resample_from_p(target, prompt, **settings):
    """Point-mass verification without the residual: a rejected candidate token can be accepted again
    (a later candidate with the same token) or drawn as the last token, with ``p``'s own probability."""
    return lookahead_transition(target, prompt, **{**settings, "verify": _resample_from_p})


def _rows_shifted(candidates, row, rng):
    """The published rule, but position ``j`` reads the row one position later: the row after the
    first live candidate's token ``j`` (the logits at the candidate token's own position)."""
    def shifted(prefix):
        ahead = next((c[len(prefix)] for c in candidates
                      if len(c) > len(prefix) and tuple(c[:len(prefix)]) == tuple(prefix)), None)
        return row(tuple(prefix) + (ahead,)) if ahead is not None else row(prefix)  # BUG: one position late

    return lookahead_verify(candidates, shifted, rng)


def lookahead_rows_shifted(target, prompt, **settings):
    """Each candidate position judged against the target's row one position later."""
    return lookahead_transition(target, prompt, **{**settings, "verify": _rows_shifted})


def _stale_key(context):
    return context[-2] if len(context) > 1 else context[-1]  # BUG: the token before the last


def lookahead_stale_key(target, prompt, **settings):
    """The pool read under the token before the last: other candidates, each verified correctly."""
    return lookahead_transition(target, prompt, **{**settings, "pool_key": _stale_key})


# ---------------------------------------------------------------- REST


def rest_pointmass(target, prompt, datastore, **settings):
    """(correct) REST's drafts verified by point-mass tree verification."""
    return rest_transition(target, prompt, datastore, **{**settings, "verify": "pointmass"})


def _without_newest(context):
    return context[:-1]  # BUG: the context before the last emitted token was appended


def rest_stale_tree(target, prompt, datastore, **settings):
    """The trie retrieved on, and scored after, the context without its newest token, its accepted
    tokens emitted after the whole context (point-mass verification otherwise)."""
    return rest_transition(target, prompt, datastore, **{**settings, "verify": settings.get("verify", "pointmass"),
                                                         "retrieval_context": _without_newest,
                                                         "verification_context": _without_newest})


def rest_stale_query(target, prompt, datastore, **settings):
    """Only the retrieval reads the stale suffix; the rows follow the right context."""
    return rest_transition(target, prompt, datastore, **{**settings, "verify": settings.get("verify", "pointmass"),
                                                         "retrieval_context": _without_newest})


def _padded(tree: DraftTree, p_target):
    """The code's cartesian candidates: every path padded to the deepest with token 0, each padding
    position's row the last node's (index -1 of the tree's rows)."""
    depth = tree.depth()
    parents, tokens, rows = list(tree.parents), list(tree.tokens), list(p_target)
    last = p_target[tree.size - 1]
    for leaf in [n for n in range(1, tree.size) if not tree.children(n)]:
        node = leaf
        for _ in range(depth - tree.depth(leaf)):  # BUG: pad token 0, judged by the last node's row
            parents.append(node)
            tokens.append(0)
            rows.append(last)
            node = len(parents) - 1
    return DraftTree(tuple(parents), tuple(tokens)), np.stack(rows)


def rest_padded_paths(target, prompt, datastore, **settings):
    """REST's rule on the code's padded path matrix: a short path goes on with token 0."""
    return rest_transition(target, prompt, datastore, **{**settings, "layout": _padded})


def _entries() -> list[RetrievalEntry]:
    E = RetrievalEntry
    return [
        E("lookahead_reference", "lookahead", lookahead_transition, "correct", "-", (), "the reference"),
        E("lookahead_bonus", "lookahead", lookahead_bonus, "correct", "emitted", ("efficiency",),
          "a fully accepted n-gram also emits the token after it"),
        E("lookahead_resample_from_p", "lookahead", lookahead_resample_from_p, "wrong", "verified", ("law",),
          "a rejected candidate token is not removed from the row that judges the next one"),
        E("lookahead_rows_shifted", "lookahead", lookahead_rows_shifted, "wrong", "verified", ("greedy", "law"),
          "each candidate position judged against the row one position later"),
        E("lookahead_stale_key", "lookahead", lookahead_stale_key, "correct", "drafted", ("efficiency",),
          "the pool read under the token before the last"),
        E("rest_published", "rest", rest_transition, "approximate", "-", (),
          "the authors' rule: independent draws per path, a fresh token after a rejection"),
        E("rest_pointmass", "rest", rest_pointmass, "correct", "verified", (),
          "point-mass verification of REST's trie"),
        E("rest_stale_tree", "rest", rest_stale_tree, "wrong", "verified", ("greedy", "law"),
          "the trie retrieved and scored after the context without its newest token"),
        E("rest_stale_query", "rest", rest_stale_query, "correct", "drafted", ("efficiency",),
          "only the retrieval reads the stale suffix"),
        E("rest_padded_paths", "rest", rest_padded_paths, "wrong", "verified", ("greedy",),
          "short paths padded with token 0 judged against the last node's row"),
    ]


RETRIEVAL_ZOO: dict[str, RetrievalEntry] = {e.name: e for e in _entries()}


def entries(kind: str | None = None, method: str | None = None) -> list[RetrievalEntry]:
    """The entries, optionally of one kind and/or one method."""
    if kind is not None and kind not in KINDS:
        raise SpecrefError(f"kind must be None or one of {KINDS}, got {kind!r}")
    if method is not None and method not in ("lookahead", "rest"):
        raise SpecrefError(f"method must be None, 'lookahead' or 'rest', got {method!r}")
    return [e for e in RETRIEVAL_ZOO.values() if (kind is None or e.kind == kind)
            and (method is None or e.method == method)]


# ---------------------------------------------------------------- exact calls per token


_MARK = -1  # ends each call's block in the enumeration: never a token


@dataclass(frozen=True)
class CallsPerToken:
    """A decoder's exact expected target calls and tokens per decode (Fraction with exact rows)."""

    calls: object  # E[target calls]
    tokens: object  # E[tokens emitted]
    law: dict  # {calls: probability}

    @property
    def per_token(self):
        """E[calls] / E[tokens]: target calls per generated token."""
        return self.calls / self.tokens

    @property
    def tokens_per_call(self):
        """E[tokens] / E[calls]: the mean accepted length (tokens a call contributes)."""
        return self.tokens / self.calls


def calls_per_token(iteration) -> CallsPerToken:
    """The exact law of calls and the expected calls and tokens of ``iteration`` (one target call each),
    from the empty state, by :func:`~specref.verification.laws.enumeration.law_iterated` with each
    block marked (as :func:`~specref.verification.statistics.efficiency.iterations_law` does)."""
    def marked(state, rng):
        block, nxt = iteration(state, rng)
        return tuple(block) + (_MARK,), nxt

    dist: dict = {}
    calls, tokens = Fraction(0), Fraction(0)
    for out, w in law_iterated((), marked).items():
        n = sum(1 for x in out if x == _MARK)
        dist[n] = dist.get(n, 0) + w
        calls, tokens = calls + n * w, tokens + (len(out) - n) * w
    return CallsPerToken(calls, tokens, dist)


def lookahead_calls_per_token(target, prompt, **settings) -> CallsPerToken:
    """Lookahead decoding's exact calls per token (settings as :func:`lookahead_transition`)."""
    return calls_per_token(lookahead_transition(target, prompt, **settings))


def rest_calls_per_token(target, prompt, datastore, **settings) -> CallsPerToken:
    """REST's exact calls per token (settings as :func:`~specref.decoding.rest.rest_transition`)."""
    return calls_per_token(rest_transition(target, prompt, datastore, **settings))


def chain_calls_per_token(target, draft, prompt, *, k: int, **settings) -> CallsPerToken:
    """Algorithm 1 with ``draft`` drafting ``k`` tokens a call (:func:`~specref.decoding.chain.speculative_transition`)."""
    return calls_per_token(speculative_transition(target, draft, prompt, k=k, **settings))

