"""Lookahead decoding: Jacobi n-grams from the target itself, verified in the same call (SPEC §16.3).

Fu, Bailis, Stoica & Zhang, *Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding* (ICML 2024, arXiv 2402.02057), §3 "Lookahead Decoding"; the algorithm as the authors' code runs it
(``lade/decoding.py``: ``jacobi_greedy_search_multilevel``, ``jacobi_sample_multilevel``,
``update_token_map``).  No draft model: one target call per iteration does three things.

1. **Lookahead branch**.  A 2D window of ``N - 1`` levels (the last ``N - 1`` Jacobi
   iterations) over ``W`` columns.  Positions count from the last committed token (position 0):
   the token at level ``l``, column ``i`` stands at position ``i + l``; level 0's column 0 *is* the
   last committed token and its columns ``1..W-1`` are guesses.  One Jacobi step gives every
   column the target's argmax after the column's own diagonal,
   ``o_i = argmax p(. | context, level0[1..i], level1[i], .., level_{N-2}[i])`` (the token at
   position ``i + N - 1``): the attention mask drawn in the authors' README (4-grams, ``W = 5``).
2. **n-gram pool**.  Column ``i`` yields the n-gram ``(level0[i], level1[i], .., level_{N-2}[i], o_i)``:
   each of its tokens was predicted right after the one before it.  The pool maps an n-gram's
   first token to at most ``G`` continuations (``N - 1`` tokens each), least recently added
   first: a continuation seen again moves to the end, one over ``G`` drops the oldest
   (the code's ``GUESS_SET_SIZE``; ``pool_from_prompt`` also adds the prompt's n-grams and, as
   tokens are generated, the last ``N`` of them: the code's ``POOL_FROM_PROMPT``).
3. **Verification branch**.  The continuations keyed on the last committed token (``G`` at
   most) are scored in the same call, and verified.

Then the window moves one column forward whatever was accepted (the code's default
``ALWAYS_FWD_ONE``): level 0 becomes level 1 without its first column (the new last token takes
column 0), level ``l + 1`` becomes level ``l``, and the outputs ``o`` become the newest level.
The first ``N - 2`` calls fill the levels (no pool, no verification): level 0 starts with
``W + N - 3`` guesses and each filling call drops every level's first column (level 0: its
first guess) and adds
``o[1:]`` on top, so that ``W`` columns are left when the window is full.

Verification (:func:`lookahead_verify`, the code's sampling rule "modified from SpecInfer"):
candidates are point masses, so at each position the candidates still alive are tried in pool
order, candidate token ``x`` accepted with probability ``min(1, p~(x) / 1) = p~(x)``; on rejection
``p~(x) <- 0`` and ``p~`` is renormalised (a repeated token is never accepted again); an
acceptance keeps the candidates that share the accepted prefix and moves to the target's row
after it; when every candidate is rejected the next token is drawn from ``p~``.  In law this is
"draw ``y ~ p`` at each position and keep going while ``y`` continues some candidate":
:func:`specref.core.tree_verify.pointmass_verify` on the candidates' trie, lossless.  With a
greedy config the rows are one-hot and the rule is the code's greedy one (the longest candidate
prefix equal to the target's argmax chain, then the argmax after it).  **At most ``N - 1`` tokens
per call**: as in the code, a candidate accepted to its end emits its ``N - 1`` tokens and no
token after it (the row after it was computed, but is not sampled); ``bonus=True`` draws that
token too (same law, fewer calls).

The order of the randomness in one call: the lookahead branch draws nothing (argmax of the
processed target rows, lowest id on ties; the code asserts ``TEMP_FOR_GUESS == 0``); the window
starts from the prompt's tokens in order (the code's ``order_copy_from``; its default copies
random prompt tokens with Python's global ``random``); verification then uses one
``rng.random()`` per candidate token tried, in pool order, position by position, and one
``rng.choice`` for the last token.  So the candidates of a call are a function of the tokens
committed before it -- drawn before this call's coins -- which is what makes point-mass
verification lossless here; a lookahead branch that sampled its window from the same ``rng``
would still be lossless (its tokens reach the pool only for later calls) but would multiply the
enumerator's branches.

What the reference leaves out: the code replaces stop tokens in the newest level by random
prompt tokens (``filter_window``), a drafting heuristic; lookahead parallelism over several GPUs.
What was confirmed: every rule above, the defaults and the at-most-``N - 1`` emission against the
authors' code; the paper's outline (§3 the method, §4 its scaling law) and abstract, the
README's description of the two branches and of ``W``, ``N``, ``G``.  The paper's own pseudocode
was not available to compare line by line.  The code needs ``N >= 3``; the
reference also runs ``N = 2`` (Jacobi decoding's 2-grams, the README's animation: without the
bonus such a call emits one token, so only ``bonus=True`` saves calls), and neither the code nor
the paper's configurations bound ``N`` by ``W``.

- :func:`lookahead_verify`: the published verification of one call's candidates;
- :func:`lookahead_transition`: one target call, ``iteration(state, rng) -> (block, next state)``
  for :func:`~specref.verification.laws.enumeration.law_iterated` (the state, a
  :class:`LookaheadState`, holds the generated tokens, the window and the pool);
- :func:`lookahead_decode`: a whole decode, a :class:`~specref.decoding.chain.DecodeResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, check_positive_int, check_tokens
from specref.core.sampling import SamplingConfig
from specref.core.tree import DraftTree
from specref.core.tree_verify import pointmass_verify
from specref.decoding.chain import DecodeResult, model_rows, next_token_probs

__all__ = ["LookaheadState", "PathRows", "lookahead_verify", "pointmass_candidates_verify", "candidate_trie",
           "lookahead_transition", "lookahead_decode", "check_sizes", "vocab_of"]


@dataclass(frozen=True)
class LookaheadState:
    """Everything the next call depends on (hashable: the enumerator memoises on it).

    ``generated``: the tokens emitted so far; ``window``: the levels, oldest first, level 0
    without its column 0 (the last committed token); ``pool``: ``((key, (continuation, ...)), ...)``
    sorted by key, each key's continuations least recently added first.
    """

    generated: tuple
    window: tuple
    pool: tuple


def check_sizes(window, ngram, guesses) -> tuple[int, int, int]:
    """``(W, N, G)`` checked: ints with ``W >= 1``, ``N >= 2``, ``G >= 1``; else SpecrefError naming the argument."""
    return (check_positive_int("window (W)", window), check_positive_int("ngram (N)", ngram, minimum=2),
            check_positive_int("guesses (G)", guesses))


def vocab_of(target, prompt) -> int:
    """The target's vocabulary size: its ``vocab_size``, else the width of its row after ``prompt``."""
    V = getattr(target, "vocab_size", None)
    if V is None:
        V = next_token_probs(target, check_tokens("prompt", prompt, 2**62), SamplingConfig(), name="target").shape[0]
    return int(V)


def _argmax(row) -> int:
    """The most likely token, lowest id on ties (Fraction rows compare exactly)."""
    values = row.tolist()
    best = max(values)
    return values.index(best)


# ---------------------------------------------------------------- verification


def lookahead_verify(candidates, row: Callable, rng, *, bonus: bool = False) -> tuple[list[int], int]:
    """The published verification of point-mass candidates: ``(emitted tokens, candidate tokens accepted)``.

    ``candidates``: continuations (tuples of token ids), tried in this order; ``row(prefix) -> [V]``
    the processed target row after ``context + prefix``.  Position by position: each live candidate's
    token ``x`` is accepted with probability ``p~(x)`` (``rng.random() < p~(x)``); a rejected ``x``
    is zeroed and ``p~`` renormalised; after an acceptance only the candidates with the accepted
    prefix stay live and ``p~`` is the fresh row after it.  All rejected: the last token is drawn
    from ``p~``.  A candidate accepted to its end emits no token after it unless ``bonus``.
    """
    live = [tuple(int(x) for x in c) for c in candidates]
    prefix: tuple = ()
    p = row(prefix).copy()
    while any(len(c) > len(prefix) for c in live):
        j, accepted = len(prefix), None
        for c in live:
            if len(c) <= j:
                continue
            x = c[j]
            if rng.random() < p[x]:  # min(1, p~(x) / 1): a point mass
                accepted = x
                break
            p[x] = 0 * p[x]  # rejected: remove x (a repeat of it is never accepted) and renormalise
            p = p / p.sum()
        if accepted is None:
            return list(prefix) + [draw(rng, p)], len(prefix)
        prefix += (accepted,)
        live = [c for c in live if len(c) > j and c[j] == accepted]
        p = row(prefix).copy()
    if bonus or not prefix:
        return list(prefix) + [draw(rng, p)], len(prefix)
    return list(prefix), len(prefix)  # the code: a fully accepted n-gram ends the call


def candidate_trie(candidates) -> tuple[DraftTree, list[tuple]]:
    """``(tree, paths)``: the trie of ``candidates`` (shared prefixes merged, siblings in order of first
    appearance) and each node's token path from the root."""
    paths: list[tuple] = [()]
    index: dict[tuple, int] = {(): 0}
    parents, tokens = [-1], [-1]
    for c in candidates:
        for j in range(len(c)):
            prefix = tuple(int(x) for x in c[: j + 1])
            if prefix not in index:
                index[prefix] = len(paths)
                parents.append(index[prefix[:-1]])
                tokens.append(prefix[-1])
                paths.append(prefix)
    return DraftTree(tuple(parents), tuple(tokens)), paths


def pointmass_candidates_verify(candidates, row: Callable, rng) -> tuple[list[int], int]:
    """The candidates' trie verified by :func:`specref.core.tree_verify.pointmass_verify`: the tree route
    (an accepted leaf draws its next token, as ``bonus=True``), the second route the tests compare with."""
    tree, paths = candidate_trie(candidates)
    p_target = np.stack([row(path) for path in paths])
    path, token = pointmass_verify(tree, p_target, None, rng)
    return [tree.tokens[n] for n in path] + [int(token)], len(path)


# ---------------------------------------------------------------- the pool and the window


def _pool_add(pool: dict, key: int, continuation: tuple, cap: int) -> None:
    """Least recently added first: a continuation seen again moves to the end; over ``cap`` drops the oldest."""
    entries = list(pool.get(key, ()))
    if continuation in entries:
        entries.remove(continuation)
    elif len(entries) >= cap:
        entries = entries[1:]
    pool[key] = tuple(entries + [continuation])


def _frozen(pool: dict) -> tuple:
    return tuple(sorted(pool.items()))


def _initial_state(prompt, W, N, G, pool_from_prompt) -> LookaheadState:
    """Level 0 holds ``W + N - 3`` guesses copied from the prompt in order, cycling; the pool is empty,
    or holds the prompt's n-grams."""
    guesses = tuple(prompt[i % len(prompt)] for i in range(W + N - 3))
    pool: dict = {}
    if pool_from_prompt:
        for s in range(len(prompt) - N + 1):
            _pool_add(pool, prompt[s], tuple(prompt[s + 1: s + N]), G)
    return LookaheadState((), (guesses,), _frozen(pool))


def _jacobi_step(window, context, row) -> list[int]:
    """One Jacobi step: column ``i``'s output is the argmax after its diagonal (module docstring, 1.)."""
    level0 = (context[-1],) + tuple(window[0])  # column 0 is the last committed token
    outputs = []
    for i in range(len(level0)):
        stack = tuple(level[i] for level in window[1:])
        outputs.append(_argmax(row(tuple(level0[1: i + 1]) + stack)))
    return outputs


def _moved(window, outputs, N) -> tuple:
    """The window one column forward: filling while fewer than ``N - 1`` levels, else shifting levels."""
    outputs = tuple(outputs)
    if len(window) < N - 1:  # filling: every level drops its first column, o[1:] goes on top
        return (tuple(window[0][1:]),) + tuple(tuple(level[1:]) for level in window[1:]) + (outputs[1:],)
    upper = tuple(window[1:]) + (outputs,)  # levels 1..N-2 and the outputs
    return (upper[0][1:],) + upper[1:]


def _ngrams(window, context, outputs):
    """The window's n-grams: column ``i`` gives ``(level0[i], level1[i], .., o_i)`` as (key, continuation)."""
    level0 = (context[-1],) + tuple(window[0])
    for i, o in enumerate(outputs):
        yield level0[i], tuple(level[i] for level in window[1:]) + (o,)


# ---------------------------------------------------------------- one call


class PathRows:
    """Processed target rows per prefix, memoised (a model is a function of its tokens); :meth:`along`
    fills a whole path's rows from one model call.  ``rows(tokens) -> [V]``"""

    def __init__(self, target, config):
        self.target, self.config = target, config
        self.cache: dict = {}

    def __call__(self, tokens) -> np.ndarray:
        key = tuple(tokens)
        if key not in self.cache:
            self.cache[key] = next_token_probs(self.target, list(key), self.config, name="target")
        return self.cache[key]

    def along(self, tokens, n: int) -> None:
        """Fill the rows of the last ``n`` prefixes of ``tokens`` with one model call."""
        key = tuple(tokens)
        if key in self.cache:
            return
        rows = model_rows(self.target, list(key), n, self.config, name="target")
        for j in range(n):
            self.cache.setdefault(key[: len(key) - n + j + 1], rows[j])


def _verifier(verify, bonus):
    if verify is None or verify == "published":
        return lambda candidates, row, rng: lookahead_verify(candidates, row, rng, bonus=bonus)
    if verify == "pointmass":
        return pointmass_candidates_verify
    if callable(verify):
        return verify
    raise SpecrefError(f"verify must be 'published', 'pointmass' or a callable verify(candidates, row, rng), "
                       f"got {verify!r}")


@dataclass(frozen=True)
class _Call:
    emitted: list  # the tokens the call emitted, before truncation
    accepted: int  # candidate tokens among them
    state: LookaheadState  # the state after the call, before truncation decides whether the decode ended


def lookahead_transition(target, prompt, *, window: int, ngram: int, guesses: int, max_new_tokens: int,
                         config: SamplingConfig = SamplingConfig(), stop_tokens=(), pool_from_prompt: bool = False,
                         bonus: bool = False, verify=None, pool_key: Callable | None = None):
    """One target call of lookahead decoding, as ``iteration(state, rng) -> (block, next state)``.

    ``window``, ``ngram``, ``guesses`` are the paper's ``W``, ``N``, ``G``.  The start state is ``()``
    (what :func:`~specref.verification.statistics.efficiency.iterations_law` hands in); later
    states are :class:`LookaheadState`, None once the decode has ended (``max_new_tokens``
    reached, or a stop token emitted: blocks are cut as in :mod:`specref.decoding.chain`).
    ``verify``: ``"published"`` (default, :func:`lookahead_verify` with ``bonus``), ``"pointmass"``
    (the candidates' trie through :func:`~specref.core.tree_verify.pointmass_verify`) or a callable
    ``verify(candidates, row, rng) -> (emitted, accepted)`` (which decides about the bonus itself);
    ``pool_key(context) -> token`` picks the
    pool entry to verify (default the last token): both are hooks for the zoo's variants.
    """
    step = _call_factory(target, prompt, window, ngram, guesses, config, max_new_tokens, stop_tokens,
                         pool_from_prompt, _verifier(verify, bonus), pool_key)
    return step.iteration


def _call_factory(target, prompt, window, ngram, guesses, config, max_new_tokens, stop_tokens, pool_from_prompt,
                  verify, pool_key):
    W, N, G = check_sizes(window, ngram, guesses)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
    prompt = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
    if not prompt:
        raise SpecrefError("prompt must hold at least one token (the window is filled from it), got []")
    V = vocab_of(target, prompt)
    prompt = check_tokens("prompt", prompt, V)
    stops = frozenset(check_tokens("stop_tokens", stop_tokens, V))
    start = _initial_state(prompt, W, N, G, pool_from_prompt)
    return _Steps(PathRows(target, config), prompt, start, (W, N, G), max_new_tokens, stops, pool_from_prompt,
                  verify, pool_key or (lambda context: context[-1]))


class _Steps:
    """The settings of one decode and its call: verification branch, lookahead branch, pool, window."""

    def __init__(self, rows, prompt, start, sizes, max_new_tokens, stops, pool_from_prompt, verify, pool_key):
        self.rows, self.prompt, self.start, self.sizes = rows, prompt, start, sizes
        self.max_new_tokens, self.stops, self.pool_from_prompt = max_new_tokens, stops, pool_from_prompt
        self.verify, self.pool_key = verify, pool_key

    def call(self, state, rng) -> _Call:
        """One target call from ``state`` (``()`` for the start)."""
        st = self.start if state == () else state
        _, N, G = self.sizes
        context = self.prompt + list(st.generated)
        full = len(st.window) == N - 1  # the levels are filled: the pool is used and fed
        pool = dict(st.pool)
        candidates = pool.get(int(self.pool_key(context)), ()) if full else ()
        for c in candidates:  # the verification branch: every candidate's rows, in the same call
            self.rows.along(context + list(c), len(c) + 1)
        emitted, accepted = self.verify(candidates, lambda prefix: self.rows(context + list(prefix)), rng)
        outputs = _jacobi_step(st.window, context, lambda path: self.rows(context + list(path)))  # lookahead branch
        if full:
            for key, continuation in _ngrams(st.window, context, outputs):
                _pool_add(pool, key, continuation, G)
        generated = st.generated + tuple(int(x) for x in emitted)
        if self.pool_from_prompt:  # the code's POOL_FROM_PROMPT: the n-gram ending at each new token
            every = self.prompt + list(generated)
            for end in range(max(len(context) + 1, N), len(every) + 1):
                _pool_add(pool, every[end - N], tuple(every[end - N + 1: end]), G)
        return _Call(list(emitted), accepted, LookaheadState(generated, _moved(st.window, outputs, N), _frozen(pool)))

    def finish(self, state, call: _Call):
        """``(block, next state)``: the block cut at the first stop token and at ``max_new_tokens``."""
        generated = () if state == () else state.generated
        kept = []
        for x in call.emitted[: self.max_new_tokens - len(generated)]:
            kept.append(int(x))
            if x in self.stops:
                break
        done = len(generated) + len(kept) >= self.max_new_tokens or (kept and kept[-1] in self.stops)
        return tuple(kept), None if done else call.state

    def iteration(self, state, rng):
        return self.finish(state, self.call(state, rng))


def lookahead_decode(target, prompt, *, window: int, ngram: int, guesses: int, max_new_tokens: int, rng,
                     config: SamplingConfig = SamplingConfig(), stop_tokens=(), pool_from_prompt: bool = False,
                     bonus: bool = False, verify=None) -> DecodeResult:
    """Lookahead decoding until a stop token or ``max_new_tokens``; the record of the run.

    ``accepted_per_iteration`` counts candidate tokens accepted per call (at most ``N - 1``);
    ``target_calls == iterations``; there are no draft calls.
    """
    check_rng(rng)
    steps = _call_factory(target, prompt, window, ngram, guesses, config, max_new_tokens, stop_tokens,
                          pool_from_prompt, _verifier(verify, bonus), None)
    result = DecodeResult(tokens=[])
    state = () if max_new_tokens > 0 else None
    while state is not None:
        call = steps.call(state, rng)
        block, state = steps.finish(state, call)
        result.tokens += list(block)
        result.iterations += 1
        result.target_calls += 1
        result.accepted_per_iteration.append(call.accepted)
    result.stopped = bool(result.tokens) and result.tokens[-1] in steps.stops
    return result
