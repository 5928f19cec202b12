"""Medusa: heads on the target's last hidden state, a tree of their top-k candidates, one call (SPEC §16.2).

Cai, Li, Geng, Peng, Lee, Chen & Dao, *Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads* (ICML 2024, arXiv 2401.10774).  Leviathan et al. notation: ``p`` is the
target.  **Heads** as in :mod:`specref.decoding.blockwise`: ``heads(tokens) -> [K, V]`` rows from
one view of ``tokens``; row ``j`` is head ``k = j + 1`` of the paper (§2.1.1: "the k-th head is used
to predict the token in the (t + k + 1)-th position", the original head the (t + 1)-th).

One decoding step (§2, substeps (1) generate candidates, (2) process them, (3) accept):

1. **candidates** (§2.1.2, §2.3.3) -- the tree's root is the target's next token ``y_0`` (its
   "0-level"); a node at depth ``d`` with rank ``r`` carries the ``r``-th most likely token of head
   ``d`` (lowest id first on ties), so the children of every node are the same top-``s_d`` tokens
   (the Cartesian product of §2.1.2).  Which nodes exist is given by ``choices``: each node is its
   path of ranks from the root, every prefix of a choice is a choice (the sparse trees of §2.3.3;
   :func:`cartesian_choices` gives the regular tree, :func:`sparse_choices` the greedy construction
   from per-head accuracies).  Nodes are numbered by ``(depth, ranks)``, as Medusa's code sorts them;
2. **one target call** with tree attention scores every node: ``p_target[i] = p(. | c, y_0, path_i)``;
3. **acceptance**, one of (``verify=``):

   - ``"pointmass"`` -- lossless.  The candidates are deterministic, so rejection sampling treats
     each as a point mass: :func:`specref.core.tree_verify.pointmass_verify` (accept child ``x`` with
     the probability ``p~(x)``, else remove it and renormalise; the token after the accepted path
     is drawn from ``p~`` at its end).  In law: draw ``y ~ p`` at each node, descend while ``y`` is
     a child.  At temperature 0 it is greedy verification: the output is greedy decoding's;
   - ``"typical"`` -- §2.3.1, approximate: a candidate ``x`` after the context ``u`` passes when
     ``p(x | u) > min(epsilon, delta exp(-H(p(. | u))))`` (natural log; Medusa's code adds 1e-5
     inside the log, not here); the accepted prefix is the longest root path all of whose nodes
     pass (the paper: "the longest accepted prefix among all candidates"; ties, which the paper
     leaves open, go to the larger product of ``p``, then the smaller node index); and, the
     paper's rule for the first token of every step, "we apply greedy decoding for the first token
     and unconditionally accept it": the token after the accepted prefix is the argmax of ``p`` at
     its end (it is the next step's first token).  So with deterministic heads the whole output is
     deterministic -- a point mass, whose TV from the target is ``1 - P_target(output)``.  Medusa's
     code does the same by default (``medusa_generate(fast=True)``: the first token is the argmax,
     the threshold test deterministic, ties broken by the likelihood of the accepted prefix);
   - ``"typical_sampled"`` -- the same path with the token after it drawn from ``p`` at its end:
     :func:`specref.core.tree_verify.typical_acceptance` (the tree verifier specref already had, which
     does not follow the paper's greedy first token).  It is the target sampler when nothing passes.

Thresholds: the paper sets ``delta = sqrt(epsilon)`` after Hewitt et al. and sweeps ``epsilon``
from 0.01 to 0.25 (§3.3.2); the defaults here are Medusa's ``medusa_generate`` defaults,
``epsilon = 0.09`` (``posterior_threshold``) and ``delta = 0.3`` (``posterior_alpha``, "recommended
to be sqrt(posterior_threshold)").

**Calls**, as in blockwise decoding: an iteration is one target call.  The first scores the prompt
and decides ``y_0`` (drawn from ``p``; greedy under ``"typical"``) while the heads read that view;
each later one builds the tree from the heads' view of the context without its last token
(``y_0``'s), scores it and emits the accepted candidates and the token after them.

Exact laws without the enumerator (an independent route for the tests): :func:`medusa_output_law`
combines each iteration's closed-form law (point mass: the product of ``p`` along the path times
``p`` of the token after it, off the end node's children); :func:`calls_per_token`,
:func:`tv_to_target` and :func:`typical_tv_table` are built on it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from numbers import Real

import numpy as np

from specref.core.draws import check_rng, draw
from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int
from specref.core.sampling import SamplingConfig
from specref.core.tree import ROOT, DraftTree
from specref.core.tree_verify import pointmass_verify, typical_acceptance
from specref.decoding.blockwise import check_run, head_rows, ranked
from specref.decoding.chain import DecodeResult, kept_block, next_token_probs
from specref.decoding.tree import tree_paths

__all__ = ["PAPER_EPSILON", "PAPER_DELTA", "PAPER_GRID", "VERIFY", "cartesian_choices", "sparse_choices",
           "MedusaShape", "medusa_shape", "medusa_candidates", "typical_passes", "typical_path", "typical_verify",
           "medusa_transition", "medusa_decode", "medusa_output_law", "calls_per_token", "tv_to_target",
           "typical_tv_table", "check_thresholds"]

PAPER_EPSILON = 0.09  # Medusa's medusa_generate default posterior_threshold
PAPER_DELTA = 0.3  # its posterior_alpha default, sqrt(0.09)
PAPER_GRID = tuple((e, math.sqrt(e)) for e in (0.01, 0.05, 0.09, 0.3))  # delta = sqrt(epsilon) (§3.3.2)
VERIFY = ("pointmass", "typical", "typical_sampled")


# ---------------------------------------------------------------- the tree of candidates


def cartesian_choices(widths) -> list[tuple[int, ...]]:
    """The regular tree of §2.1.2: every rank path ``(i_1..i_d)`` with ``i_j < widths[j - 1]``,
    ``d <= len(widths)``."""
    widths = [check_positive_int("widths[i]", w) for w in widths]
    if not widths:
        raise SpecrefError("widths must hold at least one level, got []")
    return [c for d in range(1, len(widths) + 1) for c in itertools.product(*(range(w) for w in widths[:d]))]


def sparse_choices(accuracy, n_nodes: int) -> list[tuple[int, ...]]:
    """The greedy sparse tree of §2.3.3: ``n_nodes`` rank paths, each added as the one (connected to
    the tree) with the largest ``prod_j accuracy[j][i_j]`` -- ``accuracy[k][i]`` estimates how often
    the ``i``-th top prediction of head ``k + 1`` is right (ties: shorter, then smaller path)."""
    accuracy = [list(a) for a in accuracy]
    n_nodes = check_positive_int("n_nodes", n_nodes)
    chosen: list[tuple[int, ...]] = []
    frontier: dict[tuple[int, ...], float] = {(i,): accuracy[0][i] for i in range(len(accuracy[0]))}
    while len(chosen) < n_nodes and frontier:
        best = max(frontier, key=lambda c: (frontier[c], -len(c), tuple(-i for i in c)))
        value = frontier.pop(best)
        chosen.append(best)
        if len(best) < len(accuracy):
            frontier.update({best + (i,): value * a for i, a in enumerate(accuracy[len(best)])})
    return sorted(chosen, key=lambda c: (len(c), c))


@dataclass(frozen=True)
class MedusaShape:
    """The tree's nodes as rank paths, sorted by (depth, ranks); node ``i + 1`` is ``choices[i]``."""

    choices: tuple  # of rank tuples
    parents: tuple  # per node, node 0 the root (-1)
    depth: int  # the deepest choice: heads needed

    def tokens(self, rows) -> tuple:
        """Node tokens from the heads' rows ``[K, V]``: rank ``r`` at depth ``d`` is ``ranked(rows[d - 1])[r]``."""
        tops = {d: ranked(rows[d - 1], 1 + max(c[-1] for c in self.choices if len(c) == d))
                for d in range(1, self.depth + 1)}
        return (-1,) + tuple(tops[len(c)][c[-1]] for c in self.choices)


def medusa_shape(choices) -> MedusaShape:
    """``choices`` checked and sorted: a non-empty list of distinct rank paths (ints >= 0) closed under prefixes."""
    if isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
        raise SpecrefTypeError(f"choices must be a list of rank paths such as [[0], [1], [0, 0]], got {choices!r:.80}")
    paths = []
    for i, c in enumerate(choices):
        if isinstance(c, (str, bytes)) or not hasattr(c, "__iter__") or not list(c):
            raise SpecrefError(f"choices[{i}] = {c!r:.60} must be a non-empty path of ranks such as [0, 1]")
        c = tuple(c)
        if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0 for r in c):
            raise SpecrefError(f"choices[{i}] = {list(c)} must hold ranks: integers >= 0")
        paths.append(tuple(int(r) for r in c))
    if not paths:
        raise SpecrefError("choices must hold at least one rank path, got []")
    for i, c in enumerate(paths):
        if c in paths[:i]:
            raise SpecrefError(f"choices[{i}] = {list(c)} repeats choices[{paths.index(c)}]")
        if len(c) > 1 and c[:-1] not in paths:
            raise SpecrefError(f"choices[{i}] = {list(c)}: its prefix {list(c[:-1])} is not a choice "
                               "(every prefix of a path must be one)")
    ordered = tuple(sorted(paths, key=lambda c: (len(c), c)))
    index = {c: i + 1 for i, c in enumerate(ordered)}
    parents = (-1,) + tuple(index[c[:-1]] if len(c) > 1 else ROOT for c in ordered)
    return MedusaShape(ordered, parents, max(len(c) for c in ordered))


def medusa_candidates(shape: MedusaShape, rows) -> DraftTree:
    """The tree of candidates: ``shape`` filled from the heads' rows ``[K, V]`` (root token -1)."""
    if shape.depth > rows.shape[0]:
        raise SpecrefError(f"choices reach depth {shape.depth} but heads(tokens) returned K = {rows.shape[0]} rows")
    deepest = max(c[-1] for c in shape.choices)
    if deepest >= rows.shape[1]:
        raise SpecrefError(f"choices hold rank {deepest}, which needs V > {deepest}; "
                           f"the target has V = {rows.shape[1]}")
    return DraftTree(shape.parents, shape.tokens(rows))


# ---------------------------------------------------------------- typical acceptance (§2.3.1)


def check_thresholds(epsilon, delta) -> tuple[float, float]:
    """``epsilon`` in (0, 1] and ``delta`` > 0, finite reals; else SpecrefError naming the argument."""
    for name, value, top in (("epsilon", epsilon, 1.0), ("delta", delta, math.inf)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise SpecrefTypeError(f"{name} must be a real number, got {value!r:.60}")
        if not (0 < float(value) <= top and math.isfinite(float(value))):
            interval = "(0, 1]" if top == 1.0 else "(0, inf), finite"
            raise SpecrefError(f"{name} must be in {interval}, got {value!r}")
    return float(epsilon), float(delta)


def typical_passes(row, x: int, epsilon: float, delta: float) -> bool:
    """``p(x) > min(epsilon, delta exp(-H(p)))`` for the row ``p`` ([V]); entropy in nats, in float64."""
    pf = np.asarray(row, dtype=np.float64)
    nz = pf[pf > 0]
    entropy = float(-(nz * np.log(nz)).sum())
    return row[x] > min(epsilon, delta * math.exp(-entropy))


def typical_path(tree: DraftTree, p_target, epsilon: float, delta: float) -> list[int]:
    """The longest root path whose nodes all pass; ties: the larger product of ``p``, then the smaller node."""
    ok = [True] + [typical_passes(p_target[tree.parents[i]], tree.tokens[i], epsilon, delta)
                   for i in range(1, tree.size)]
    best: list[int] = []
    best_key: tuple = (0, 0, 0)
    for node in range(1, tree.size):
        path = tree.path(node)
        if all(ok[n] for n in path):
            key = (len(path), math.prod(p_target[tree.parents[n]][tree.tokens[n]] for n in path), -node)
            if key > best_key:
                best, best_key = path, key
    return best


def typical_verify(tree: DraftTree, p_target, q_draft, rng, *, epsilon: float = PAPER_EPSILON,
                   delta: float = PAPER_DELTA):
    """§2.3.1 as a tree verifier: ``(typical_path, argmax of p at its end)`` -- no randomness."""
    path = typical_path(tree, p_target, epsilon, delta)
    return path, ranked(p_target[path[-1] if path else ROOT], 1)[0]


# ---------------------------------------------------------------- the decoder


class _Medusa:
    """One decoder's settings and its memoised target rows; :meth:`step` is one target call."""

    def __init__(self, target, heads, prompt, *, choices, max_new_tokens, config, verify, stop_tokens, epsilon,
                 delta, draft_view):
        if not isinstance(config, SamplingConfig):
            raise SpecrefTypeError(f"config must be a SamplingConfig, got {config!r:.80}")
        self.prompt, self.stops, self.V = check_run(target, prompt, max_new_tokens, stop_tokens)
        self.shape = medusa_shape(choices)
        self.epsilon, self.delta = check_thresholds(epsilon, delta)
        if not (callable(verify) or verify in VERIFY):
            raise SpecrefError(f"verify must be a tree verifier or one of {VERIFY}, got {verify!r:.80}")
        if draft_view is not None and not callable(draft_view):
            raise SpecrefError(f"draft_view must be None or a callable, got {draft_view!r:.80}")
        self.target, self.heads, self.config, self.verify = target, heads, config, verify
        self.max_new_tokens, self.view = max_new_tokens, draft_view or (lambda context: context)
        self.memo: dict = {}

    def row(self, tokens):  # [n] -> [V], the processed target row, memoised per prefix
        key = tuple(tokens)
        if key not in self.memo:
            self.memo[key] = next_token_probs(self.target, list(tokens), self.config, name="target")
        return self.memo[key]

    def verifier(self):
        if callable(self.verify):
            return self.verify
        named = {"pointmass": pointmass_verify,
                 "typical": partial(typical_verify, epsilon=self.epsilon, delta=self.delta),
                 "typical_sampled": partial(typical_acceptance, epsilon=self.epsilon, delta=self.delta)}
        return named[self.verify]

    def tree(self, generated):
        """``(tree, p_target [N, V])`` after ``generated`` (non-empty): the heads read the context without
        its last token; the target scores every node (one call with tree attention)."""
        base = self.prompt + list(generated)
        rows = head_rows(self.heads, self.view(self.prompt + list(generated[:-1])), self.V)
        tree = medusa_candidates(self.shape, rows)
        return tree, np.stack([self.row(base + list(path)) for path in tree_paths(tree)])

    def step(self, generated, rng) -> tuple[list[int], list[int] | None]:
        """``(emitted, accepted path)`` of one target call; the path is None for the call on the prompt."""
        if not generated:  # the first token: greedy under the paper's typical rule, else drawn from p
            p = self.row(self.prompt)
            return [ranked(p, 1)[0] if self.verify == "typical" else draw(rng, p)], None
        tree, p_target = self.tree(generated)
        path, token = self.verifier()(tree, p_target, None, rng)
        return [tree.tokens[n] for n in path] + [int(token)], list(path)

    def outcomes(self, generated) -> dict:
        """The closed-form law of one iteration's emitted tokens, ``{emitted: probability}`` (named verifiers)."""
        if callable(self.verify):
            raise SpecrefError("the closed-form law needs a named verify, one of " + str(VERIFY))
        if not generated:
            p = self.row(self.prompt)
            if self.verify == "typical":
                return {(ranked(p, 1)[0],): 1}
            return {(y,): p[y] for y in range(self.V) if p[y] > 0}
        tree, p_target = self.tree(generated)
        if self.verify == "pointmass":
            return _pointmass_law(tree, p_target)
        path = typical_path(tree, p_target, self.epsilon, self.delta)
        end, toks = p_target[path[-1] if path else ROOT], tuple(tree.tokens[n] for n in path)
        if self.verify == "typical":
            return {toks + (ranked(end, 1)[0],): 1}
        return {toks + (y,): end[y] for y in range(self.V) if end[y] > 0}


def _pointmass_law(tree: DraftTree, p_target) -> dict:
    """``P(path, y) = prod_path p(child) * p_end(y)`` for ``y`` not a child token of the end node (distinct
    children): point-mass verification is "draw ``y ~ p`` at each node, descend while ``y`` is a child"."""
    out: dict = {}
    stack: list[tuple[int, tuple, object]] = [(ROOT, (), 1)]
    while stack:
        node, toks, w = stack.pop()
        p, kids = p_target[node], tree.children(node)
        kid_tokens = {tree.tokens[c] for c in kids}
        for y in range(p.shape[0]):
            if p[y] > 0 and y not in kid_tokens:
                out[toks + (y,)] = out.get(toks + (y,), 0) + w * p[y]
        stack += [(c, toks + (tree.tokens[c],), w * p[tree.tokens[c]]) for c in kids if p[tree.tokens[c]] > 0]
    return out


def medusa_transition(target, heads, prompt, *, choices, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                      verify="pointmass", stop_tokens=(), epsilon=PAPER_EPSILON, delta=PAPER_DELTA, draft_view=None,
                      stats: DecodeResult | None = None):
    """One iteration (one target call) of Medusa, as ``(state, rng) -> (block, next state)``.

    The state is the tuple of generated tokens (None once the decode has ended); the block is cut at
    the first stop token and at ``max_new_tokens``.  ``verify``: ``"pointmass"`` (lossless),
    ``"typical"`` (§2.3.1, approximate), ``"typical_sampled"`` (approximate) or a tree verifier
    ``verify(tree, p_target, None, rng) -> (path, token)`` (the zoo's hook).  ``draft_view(context) ->
    tokens`` replaces the view the heads read; ``stats``: a :class:`~specref.decoding.chain.DecodeResult` the
    iterations are counted into.  Target rows are memoised per prefix.
    """
    decoder = _Medusa(target, heads, prompt, choices=choices, max_new_tokens=max_new_tokens, config=config,
                      verify=verify, stop_tokens=stop_tokens, epsilon=epsilon, delta=delta, draft_view=draft_view)

    def iteration(generated: tuple, rng):
        emitted, path = decoder.step(generated, rng)
        if stats is not None:
            _record(stats, path, decoder.shape.depth)
        return kept_block(generated, emitted, max_new_tokens, decoder.stops)

    return iteration


def _record(result: DecodeResult, path, depth: int) -> None:
    result.iterations += 1
    result.target_calls += 1
    result.accepted_per_iteration.append(len(path or []))
    if path is None:
        return
    if not result.tested_per_position:
        result.tested_per_position, result.accepted_per_position = [0] * depth, [0] * depth
    for d in range(min(len(path) + 1, depth)):  # depths 1..len(path)+1 were judged
        result.tested_per_position[d] += 1
        result.accepted_per_position[d] += d < len(path)


def medusa_decode(target, heads, prompt, *, choices, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                  verify="pointmass", stop_tokens=(), epsilon=PAPER_EPSILON, delta=PAPER_DELTA, rng) -> DecodeResult:
    """Decode with Medusa until a stop token or ``max_new_tokens``.

    ``iterations == target_calls`` (the call on the prompt included); ``accepted_per_iteration``: the
    candidates accepted per call (0 for the first); ``tested_per_position[d]`` /
    ``accepted_per_position[d]``: calls that judged / accepted a candidate at depth ``d + 1``.
    """
    check_rng(rng)
    result = DecodeResult(tokens=[])
    iteration = medusa_transition(target, heads, prompt, choices=choices, max_new_tokens=max_new_tokens,
                                  config=config, verify=verify, stop_tokens=stop_tokens, epsilon=epsilon, delta=delta,
                                  stats=result)
    state = () if max_new_tokens > 0 else None
    while state is not None:
        block, state = iteration(state, rng)
        result.tokens += block
    result.stopped = bool(result.tokens) and result.tokens[-1] in set(int(t) for t in stop_tokens)
    return result


# ---------------------------------------------------------------- exact laws, calls, TV


def _exact_run(decoder: _Medusa, key=None):
    """``(law of the output, E[calls], E[tokens])`` from the per-iteration closed form, memoised on
    ``key(state)`` (default the state; :func:`~specref.decoding.blockwise.window_key` for window models)."""
    memo: dict = {}
    key = key or (lambda state: state)

    def solve(state):
        k = key(state)
        if k not in memo:
            law: dict = {}
            calls, tokens = 1, 0
            for emitted, w in decoder.outcomes(state).items():
                block, nxt = kept_block(state, list(emitted), decoder.max_new_tokens, decoder.stops)
                rest, c, t = solve(nxt) if nxt is not None else ({(): 1}, 0, 0)
                for tail, pw in rest.items():
                    law[block + tail] = law.get(block + tail, 0) + w * pw
                calls, tokens = calls + w * c, tokens + w * (len(block) + t)
            memo[k] = (law, calls, tokens)
        return memo[k]

    if decoder.max_new_tokens == 0:
        return {(): 1}, 0, 0
    return solve(())


def _decoder(target, heads, prompt, settings) -> _Medusa:
    return _Medusa(target, heads, prompt, draft_view=None, **settings)


def medusa_output_law(target, heads, prompt, *, choices, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                      verify="pointmass", stop_tokens=(), epsilon=PAPER_EPSILON, delta=PAPER_DELTA, key=None) -> dict:
    """The exact law of the output, ``{tokens: probability}`` (Fractions for exact targets), from each
    iteration's closed-form law -- no rng and no enumeration; memoised on ``key(state)`` when given."""
    settings = dict(choices=choices, max_new_tokens=max_new_tokens, config=config, verify=verify,
                    stop_tokens=stop_tokens, epsilon=epsilon, delta=delta)
    return _exact_run(_decoder(target, heads, prompt, settings), key)[0]


def calls_per_token(target, heads, prompt, *, choices, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                    verify="pointmass", stop_tokens=(), epsilon=PAPER_EPSILON, delta=PAPER_DELTA, key=None):
    """Expected target calls per generated token, ``E[calls] / E[tokens]``, exact (the call on the prompt
    counted); memoised on ``key(state)`` when given."""
    settings = dict(choices=choices, max_new_tokens=check_positive_int("max_new_tokens", max_new_tokens),
                    config=config, verify=verify, stop_tokens=stop_tokens, epsilon=epsilon, delta=delta)
    _, calls, tokens = _exact_run(_decoder(target, heads, prompt, settings), key)
    return _ratio(calls, tokens)


def _ratio(a, b):
    """``a / b``: a Fraction when both are exact (int or Fraction), else a float."""
    if isinstance(a, (int, Fraction)) and isinstance(b, (int, Fraction)):
        return Fraction(a) / Fraction(b)
    return float(a) / float(b)


def tv_to_target(law: dict, target, prompt, config: SamplingConfig, max_new_tokens: int, stop_tokens=()):
    """TV between ``law`` and the target sampler's law: ``sum over law's outputs of max(0, law - P_target)``
    (both sum to 1), ``P_target`` the product of the target's conditionals along the output."""
    prompt, stops, _ = check_run(target, prompt, max_new_tokens, stop_tokens)
    total = 0
    for out, w in law.items():
        p_out = 1
        for i, x in enumerate(out):
            p_out = p_out * next_token_probs(target, prompt + list(out[:i]), config, name="target")[x]
            if x in stops and i + 1 < len(out):  # generation ends at a stop token
                p_out = 0 * p_out
        if len(out) != max_new_tokens and not (out and out[-1] in stops):
            p_out = 0 * p_out
        total = total + max(0 * w, w - p_out)
    return total


def typical_tv_table(target, heads, prompt, *, choices, max_new_tokens: int, config: SamplingConfig = SamplingConfig(),
                     stop_tokens=(), grid=PAPER_GRID, key=None) -> list[dict]:
    """Exact TV from the target (and calls per token) of typical acceptance per ``(epsilon, delta)`` in ``grid``.

    Per row: ``tv`` (the paper's rule, greedy token after the prefix), ``tv_sampled_next`` (that token
    drawn from ``p``), and both rules' ``calls_per_token``; exact where the target's rows are.
    """
    rows = []
    for epsilon, delta in grid:
        row = {"epsilon": epsilon, "delta": delta}
        for verify, suffix in (("typical", ""), ("typical_sampled", "_sampled_next")):
            settings = dict(choices=choices, max_new_tokens=max_new_tokens, config=config, verify=verify,
                            stop_tokens=stop_tokens, epsilon=epsilon, delta=delta)
            law, calls, tokens = _exact_run(_decoder(target, heads, prompt, settings), key)
            row["tv" + suffix] = tv_to_target(law, target, prompt, config, max_new_tokens, stop_tokens)
            row["calls_per_token" + suffix] = _ratio(calls, tokens)
        rows.append(row)
    return rows
