"""REST: drafts retrieved from a datastore by suffix match, verified as a tree in one call (SPEC §16.4).

He, Zhong, Cai, Lee & He, *REST: Retrieval-Based Speculative Decoding* (NAACL 2024, arXiv
2311.08252), the method's section (datastore, retrieval, draft construction, verification); the
algorithm as the authors' code runs it (``DraftRetriever/src/lib.rs``:
``Reader.search``; ``rest/model/utils.py``: ``generate_candidates_and_draft_buffer``,
``evaluate_posterior``).  No draft model: one target call per iteration.

1. **Datastore**: a token list (the authors concatenate their documents' tokens with no
   separator) and its suffix array, :class:`RestDatastore`.
2. **Retrieval** (exact match): the longest suffix of the context that occurs in the
   datastore, trying suffix lengths ``max_suffix`` (16 in the code, ``max_token_span``) down to
   ``min_suffix`` (2 in the code); every occurrence (the first ``max_matches`` in suffix-array
   order, 5000 in the code) contributes the ``length`` tokens that follow it (10 in the code), cut
   at the datastore's end.  The first suffix length with a non-empty continuation decides;
   :func:`rest_retrieve`.
3. **Draft construction**: every prefix of every continuation is counted (how many
   continuations start with it) and the ``num_draft`` most frequent prefixes are kept (the
   code's ``choices``, 64): since a prefix is at least as frequent as its extensions, they form
   a trie, the draft tree; :func:`rest_trie`.
4. **Verification**: one target call scores every node (tree attention) and the tree is
   verified.  Greedy: the longest candidate path that is the target's argmax chain, then the
   argmax after it.  Sampling, as the code does it (:func:`rest_verify`): for every root-to-leaf
   path, independently, a token ``y_j ~ p(. | path_<j)`` is drawn at each position and the path is
   accepted up to its first ``y_j != x_j``; the path with the longest acceptance wins (the first
   one on ties), and the token after it is drawn afresh from the target's row there (the code
   draws it at the start of the next call, from the same row).  That is **not lossless**: a
   rejected draft token ``x`` is drawn again from ``p`` itself, not from ``p`` without ``x``, and
   every path that holds ``x`` is another independent try, so drafted tokens come out more often
   than ``p`` says.  ``verify="pointmass"`` is the lossless rule for the same drafts
   (:func:`specref.core.tree_verify.pointmass_verify`, SpecInfer's verification of point-mass
   children), the same tokens under a greedy config.

Where the reference fixes what the code leaves open (each a choice about drafting, so the
lossless rule's law never depends on it; the published rule's law does, as it would in the code):

- ties in the frequency selection: the code keeps its top ``choices`` from a hash map (its order
  random per process) and then trims by a best-effort rule; here ties go to the shorter prefix,
  then the smaller tokens, so exactly ``min(num_draft, prefixes)`` nodes are kept and they form a
  trie;
- node order: depth-first, siblings by count then token; the published rule tries the paths in
  that order (the code's order follows its hash map);
- no continuation for any suffix length: the code drafts one fixed token (id 100); here the call
  drafts nothing and draws its token from the target (a suffix whose occurrences all end the
  datastore, where the code's retriever has no path to build, is passed over for a shorter one);
- the code pads short paths with token 0 judged against the last node's row (its ``-1`` index):
  a bug the reference does not copy (:mod:`specref.verification.zoo.retrieval` has it);
- the code's first call is the prompt's prefill and drafts nothing: here every call drafts,
  the first from the prompt.

The order of the randomness in one call: retrieval and the trie draw nothing; the published rule
draws one ``rng.random()`` per path position tried (path by path, stopping at a path's first
mismatch -- a draw ``y_j`` compared with ``x_j`` is the coin ``u < p(x_j)`` in law, and draws past
a mismatch decide nothing), then one ``rng.choice`` for the last token; ``"pointmass"`` draws its
coins as :func:`~specref.core.tree_verify.pointmass_verify` does.

What was confirmed: retrieval, counting, selection, the parameters and the greedy and sampling rules
against the authors' code; the method's steps against the paper's abstract and the README's
overview.  The paper's own text of the sampling rule was not available to compare.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, check_positive_int, check_tokens
from specref.core.sampling import SamplingConfig
from specref.core.tree import ROOT, DraftTree
from specref.core.tree_verify import VERIFIERS
from specref.decoding.chain import DecodeResult
from specref.decoding.lookahead import PathRows, vocab_of

__all__ = ["RestDatastore", "suffix_array", "rest_retrieve", "rest_trie", "rest_verify", "rest_transition",
           "rest_decode", "RETRIEVAL_DEFAULTS"]

RETRIEVAL_DEFAULTS = {"max_suffix": 16, "min_suffix": 2, "length": 10, "max_matches": 5000, "num_draft": 64}
"""The code's defaults: suffix lengths 16..2 (``max_token_span``), continuations of 10 tokens (``long``),
at most 5000 occurrences (``k``), 64 draft tokens (``num_draft`` / ``choices``)."""


def suffix_array(tokens) -> list[int]:
    """The start positions of ``tokens``' suffixes in lexicographic order (a suffix before its extensions).

    Prefix doubling: sort by the ranks of the first ``2^k`` tokens until every rank differs,
    O(n log^2 n).  ``[n] -> [n]``
    """
    n = len(tokens)
    rank = [int(t) for t in tokens]
    sa = list(range(n))
    k = 1
    while n > 1:
        keys = [(rank[i], rank[i + k] if i + k < n else -1) for i in range(n)]
        sa.sort(key=keys.__getitem__)
        new = [0] * n
        for j in range(1, n):
            new[sa[j]] = new[sa[j - 1]] + (keys[sa[j]] != keys[sa[j - 1]])
        rank = new
        if rank[sa[-1]] == n - 1:
            break
        k *= 2
    return sa


class RestDatastore:
    """REST's datastore: a token list and its suffix array, for exact-match retrieval.

    ``tokens``: non-negative token ids, at least one (the datastore may use a larger vocabulary
    than the target: a retrieved token outside the target's is refused where it is drafted).
    """

    def __init__(self, tokens):
        tokens = check_tokens("datastore tokens", tokens, 2**62)
        if not tokens:
            raise SpecrefError("datastore tokens must hold at least one token, got []")
        self.tokens = tuple(tokens)
        self.suffixes = suffix_array(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def occurrences(self, query) -> list[int]:
        """Every position where ``query`` occurs, in suffix-array order (two binary searches)."""
        q = tuple(int(x) for x in query)
        m, data, sa = len(q), self.tokens, self.suffixes

        def head(i):
            return data[sa[i]: sa[i] + m]

        lo, hi = 0, len(sa)
        while lo < hi:  # the first suffix whose head is >= q
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if head(mid) < q else (lo, mid)
        first, hi = lo, len(sa)
        while lo < hi:  # the first suffix whose head is > q
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if head(mid) <= q else (lo, mid)
        return [sa[i] for i in range(first, lo)]

    def __repr__(self) -> str:
        return f"RestDatastore({len(self.tokens)} tokens)"


def rest_retrieve(datastore: RestDatastore, context, *, max_suffix: int = 16, min_suffix: int = 2, length: int = 10,
                  max_matches: int = 5000) -> tuple[int, list[tuple]]:
    """``(suffix length, continuations)``: the longest suffix of ``context`` (``max_suffix`` down to
    ``min_suffix`` tokens) with a non-empty continuation, and the ``length`` tokens after each of its
    first ``max_matches`` occurrences; ``(0, [])`` when none has one."""
    data = datastore.tokens
    for span in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        positions = datastore.occurrences(context[len(context) - span:])[:max_matches]
        found = [c for c in (data[pos + span: pos + span + length] for pos in positions) if c]
        if found:
            return span, found
    return 0, []


def rest_trie(continuations, num_draft: int) -> tuple[DraftTree, list[tuple]]:
    """``(tree, paths)``: the ``num_draft`` most frequent prefixes of ``continuations`` as a trie.

    A prefix's count is how many continuations start with it; ties go to the shorter prefix, then
    the smaller tokens (so the kept prefixes are closed under taking prefixes).  Nodes depth-first,
    siblings by count (descending) then token; ``paths[i]`` is node ``i``'s tokens (``()`` the root).
    """
    counts: Counter = Counter()
    for c, m in Counter(tuple(c) for c in continuations).items():  # equal continuations counted at once
        for j in range(1, len(c) + 1):
            counts[c[:j]] += m
    kept = set(heapq.nsmallest(num_draft, counts, key=lambda s: (-counts[s], len(s), s)))
    children: dict[tuple, list] = {}
    for s in kept:
        children.setdefault(s[:-1], []).append(s)
    return _preorder(children, counts)


def _preorder(children, counts) -> tuple[DraftTree, list[tuple]]:
    """The kept prefixes as a :class:`~specref.core.tree.DraftTree`, nodes depth-first (parents first)."""
    parents, tokens, paths = [-1], [-1], [()]

    def visit(s, node):
        for child in sorted(children.get(s, []), key=lambda c: (-counts[c], c[-1])):
            parents.append(node)
            tokens.append(child[-1])
            paths.append(child)
            visit(child, len(paths) - 1)

    visit((), ROOT)
    return DraftTree(tuple(parents), tuple(tokens)), paths


# ---------------------------------------------------------------- verification


def rest_verify(tree: DraftTree, p_target, q_draft, rng):
    """REST's sampling verification, as the code does it: ``(path, next_token)`` like the tree verifiers.

    For every root-to-leaf path in node order, independently: at each position ``j`` the path's
    token ``x_j`` passes when a fresh ``y_j ~ p_target[parent]`` equals it (the coin
    ``rng.random() < p(x_j)``), up to the first failure.  The path with the most passes wins (the
    first on ties; none passed: the root); the next token is drawn from the target's row at its
    last passed node.  ``q_draft`` is ignored (the drafts are point masses).  Not lossless (module
    docstring); under a greedy config it is the longest argmax match.
    """
    best: list[int] = []
    for leaf in range(1, tree.size):
        if tree.children(leaf):
            continue
        passed: list[int] = []
        for node in tree.path(leaf):  # y_j == x_j with probability p(x_j), independently per path
            if not rng.random() < p_target[tree.parents[node]][tree.tokens[node]]:
                break
            passed.append(node)
        if len(passed) > len(best):
            best = passed
    return best, draw(rng, p_target[best[-1] if best else ROOT])


def _verifier(verify) -> Callable:
    if verify == "rest":
        return rest_verify
    if isinstance(verify, str) and verify in VERIFIERS:
        return VERIFIERS[verify]
    if callable(verify):
        return verify
    raise SpecrefError(f"verify must be 'rest', one of {sorted(VERIFIERS)} or a callable "
                       f"verify(tree, p_target, q_draft, rng) -> (path, next_token), got {verify!r}")


# ---------------------------------------------------------------- one call


@dataclass(frozen=True)
class _Settings:
    max_suffix: int
    min_suffix: int
    length: int
    max_matches: int
    num_draft: int


def _settings(max_suffix, min_suffix, length, max_matches, num_draft) -> _Settings:
    min_suffix = check_positive_int("min_suffix", min_suffix)
    max_suffix = check_positive_int("max_suffix", max_suffix)
    if max_suffix < min_suffix:
        raise SpecrefError(f"max_suffix must be >= min_suffix = {min_suffix}, got {max_suffix}")
    return _Settings(max_suffix, min_suffix, check_positive_int("length", length),
                     check_positive_int("max_matches", max_matches), check_positive_int("num_draft", num_draft))


class _Calls:
    """One decode's settings and its call: retrieve, build the trie, score it, verify."""

    def __init__(self, target, prompt, datastore, config, max_new_tokens, stop_tokens, settings, verify, hooks):
        if not isinstance(datastore, RestDatastore):
            raise SpecrefError(f"datastore must be a RestDatastore (built from a token list), got {datastore!r:.80}")
        if not isinstance(config, SamplingConfig):
            raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
        self.max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
        prompt = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        if not prompt:
            raise SpecrefError("prompt must hold at least one token (models condition on it), got []")
        self.V = vocab_of(target, prompt)
        self.prompt = check_tokens("prompt", prompt, self.V)
        self.stops = frozenset(check_tokens("stop_tokens", stop_tokens, self.V))
        self.datastore, self.settings, self.verify = datastore, settings, _verifier(verify)
        self.rows = PathRows(target, config)
        self.retrieval_context, self.verification_context, self.layout = hooks

    def draft(self, context) -> tuple[DraftTree, list[tuple]]:
        """The call's draft tree: retrieval on the context's suffix, the most frequent prefixes."""
        s = self.settings
        _, found = rest_retrieve(self.datastore, self.retrieval_context(context), max_suffix=s.max_suffix,
                                 min_suffix=s.min_suffix, length=s.length, max_matches=s.max_matches)
        if not found:
            return DraftTree((-1,), (-1,)), [()]
        tree, paths = rest_trie(found, s.num_draft)
        for node in range(1, tree.size):
            if tree.tokens[node] >= self.V:
                raise SpecrefError(f"datastore: the retrieved candidate {list(paths[node])} holds token "
                                   f"{tree.tokens[node]}, outside the target's vocabulary (V = {self.V})")
        return tree, paths

    def call(self, generated: tuple, rng) -> tuple[list[int], int]:
        """``(emitted tokens, draft tokens accepted)`` of one target call after ``generated``."""
        context = self.prompt + list(generated)
        tree, paths = self.draft(context)
        base = self.verification_context(context)
        for node in range(1, tree.size):  # one call scores every node: a leaf path's rows at once
            if not tree.children(node):
                self.rows.along(base + list(paths[node]), len(paths[node]) + 1)
        p_target = np.stack([self.rows(base + list(path)) for path in paths])
        tree, p_target = self.layout(tree, p_target)
        path, token = self.verify(tree, p_target, None, rng)
        return [tree.tokens[n] for n in path] + [int(token)], len(path)

    def finish(self, generated: tuple, emitted):
        kept = []
        for x in emitted[: self.max_new_tokens - len(generated)]:
            kept.append(int(x))
            if x in self.stops:
                break
        state = generated + tuple(kept)
        done = len(state) >= self.max_new_tokens or (kept and kept[-1] in self.stops)
        return tuple(kept), None if done else state


def _same(context):
    return context


def _unchanged(tree, p_target):
    return tree, p_target


def _calls(target, prompt, datastore, *, max_new_tokens, config, stop_tokens, max_suffix, min_suffix, length,
           max_matches, num_draft, verify, retrieval_context, verification_context, layout) -> _Calls:
    hooks = (retrieval_context or _same, verification_context or _same, layout or _unchanged)
    return _Calls(target, prompt, datastore, config, max_new_tokens, stop_tokens,
                  _settings(max_suffix, min_suffix, length, max_matches, num_draft), verify, hooks)


def rest_transition(target, prompt, datastore: RestDatastore, *, max_new_tokens: int,
                    config: SamplingConfig = SamplingConfig(), stop_tokens=(), max_suffix: int = 16,
                    min_suffix: int = 2, length: int = 10, max_matches: int = 5000, num_draft: int = 64,
                    verify="rest", retrieval_context: Callable | None = None,
                    verification_context: Callable | None = None, layout: Callable | None = None):
    """One target call of REST, as ``iteration(generated, rng) -> (block, next generated)``.

    The state is the tuple of generated tokens (the draft is a function of the context), None once
    the decode has ended.  Parameters as the module docstring; ``verify``: ``"rest"`` (the published
    rule, :func:`rest_verify`), a name in :data:`~specref.core.tree_verify.VERIFIERS` (``"pointmass"``:
    lossless) or a tree verifier.  Hooks for the zoo's variants, each a function of the context
    (prompt + generated): ``retrieval_context`` (the tokens whose suffix is retrieved),
    ``verification_context`` (the context the tree's rows follow) and ``layout(tree, p_target) ->
    (tree, p_target)`` (what the verifier is handed).
    """
    calls = _calls(target, prompt, datastore, max_new_tokens=max_new_tokens, config=config, stop_tokens=stop_tokens,
                   max_suffix=max_suffix, min_suffix=min_suffix, length=length, max_matches=max_matches,
                   num_draft=num_draft, verify=verify, retrieval_context=retrieval_context,
                   verification_context=verification_context, layout=layout)

    def iteration(generated: tuple, rng):
        emitted, _ = calls.call(generated, rng)
        return calls.finish(generated, emitted)

    return iteration


def rest_decode(target, prompt, datastore: RestDatastore, *, max_new_tokens: int, rng,
                config: SamplingConfig = SamplingConfig(), stop_tokens=(), max_suffix: int = 16, min_suffix: int = 2,
                length: int = 10, max_matches: int = 5000, num_draft: int = 64, verify="rest") -> DecodeResult:
    """REST until a stop token or ``max_new_tokens``; ``accepted_per_iteration`` counts draft tokens accepted."""
    check_rng(rng)
    calls = _calls(target, prompt, datastore, max_new_tokens=max_new_tokens, config=config, stop_tokens=stop_tokens,
                   max_suffix=max_suffix, min_suffix=min_suffix, length=length, max_matches=max_matches,
                   num_draft=num_draft, verify=verify, retrieval_context=None, verification_context=None,
                   layout=None)
    result = DecodeResult(tokens=[])
    state: tuple | None = () if max_new_tokens > 0 else None
    while state is not None:
        emitted, accepted = calls.call(state, rng)
        block, state = calls.finish(state, emitted)
        result.tokens += list(block)
        result.iterations += 1
        result.target_calls += 1
        result.accepted_per_iteration.append(accepted)
    result.stopped = bool(result.tokens) and result.tokens[-1] in calls.stops
    return result
