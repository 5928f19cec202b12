"""Greedy tree verification: the argmax path, a point mass (or a declared split among ties).

Two levels share one law and one set of cases (:class:`GreedyTreeCase`: a dense batch of
:class:`~specref.core.tree.DraftTree` trees and their target rows):

- ``"greedy_tree"``: SGLang's call, read from :data:`SOURCE`::

      kernel(predicts [B N] int32, accept_index [B, S] int32, accept_token_num [B] int32,
             candidates [B, N] int64, retrieve_index [B, N] int64, retrieve_next_token [B, N] int64,
             retrieve_next_sibling [B, N] int64, target_predict [B, N] int64)

  in place, as ``verify_tree_greedy_triton`` (a kernel may instead return the three outputs).
  The level allocates the outputs as SGLang's caller does (``predicts`` 0, ``accept_index`` -1,
  ``accept_token_num`` 0), sets ``candidates[b, 0]`` to the committed token and
  ``retrieve_index[b, i] = b N + i``, links each tree first-child / next-sibling in node order
  (:func:`~specref.core.tree.to_sglang`), and forms ``target_predict[b, i]`` -- the target's
  argmax after node ``i`` -- itself, by the declared tie convention (SGLang's caller takes
  ``torch.argmax``: the lowest id).  A tree with fewer than ``N`` nodes is padded: its padding
  nodes are linked from nowhere (-1 links) and carry the token the target's argmax picks at the
  root, so a kernel that finds nodes by scanning instead of following links accepts one.  Row
  ``b``'s output: ``accept_index[b, 0] = b N`` (the root), then the accepted nodes' indices,
  -1 after ``accept_token_num[b]`` of them; ``predicts`` at each accepted node's parent holds
  that node's token and at the last accepted node the next token.
- ``"greedy_tree_step"``: ``step(tree, p_target [N, V], rng) -> (path, next_token)``, one tree
  per call; the implementation takes the argmax itself, so its tie-breaking is in scope.
  :func:`sglang_step` runs an SGLang-call kernel in this form (B = 1, argmax to the lowest id).

**Rule.** From the root, at the current node ``c`` take the target's argmax ``t`` after ``c``;
if a child of ``c`` carries ``t``, accept the first such child in sibling order and continue
from it; otherwise stop: the next token is ``t``.  With distinct children this is the longest
root-down path whose every token is the target's argmax at its parent, then that argmax at
its last node; with duplicated children it follows the first of them (as SGLang does), which
need not be the longest.

**Ties**, a convention the implementation declares (:func:`declare_ties`; default
``"lowest"``): ``"lowest"`` -- the lowest tied id is the argmax (``np.argmax``,
``torch.argmax``); ``"split"`` -- at each node the argmax is uniform over the tied tokens,
independently across nodes, as a decoder that breaks ties at random does.  The law is then
split: each output's probability is the product over its visited nodes of ``1 / (number of
tied maxima)``, exact in ``Fraction``.  At the ``greedy_tree`` level the oracle draws the
split ``target_predict`` from its generator at every node the rule can visit under some tie
choice (enumerated; the lowest id elsewhere); at the ``greedy_tree_step`` level the
implementation draws from the ``rng`` it is handed.

**Modes.**  Exact: the program -- the level's own draws, the kernel's call, the output read
back -- is enumerated (:func:`~specref.verification.laws.enumeration.law`); a deterministic
kernel is one path per tie choice.  The law of the batch (``(path, next_token)`` per tree,
paths as node indices) must equal the expected law; a difference names the tree, the node
where the kernel leaves the argmax path, and what the rule does there.  Statistical: the
implementation gets the oracle's seeded ``numpy.random.Generator`` and the outputs are
G-tested against the law (:func:`~specref.verification.levels.runner.sampled_verdict`); a point
mass is not G-tested (its null has one category) but sampled ``ceil(ln 0.1 / ln(1 - detect_tv))``
times (230 at the default 0.01), and any output off it is a difference.

**Inputs and outputs** (SPEC §12.5).  The expected law is computed before the first call.  Every
call gets its inputs afresh and read-only (``greedy_tree``: the five input arrays, the three
outputs writable; ``greedy_tree_step``: its own copy of the tree, checked after the call, and the
rows), so a write is ``writes into its inputs``.  The output is read inside the guarded call:
SGLang's outputs must be integer arrays (never cast), a step's ``(path, next_token)`` is parsed
as at the tree level (:func:`~specref.verification.levels.trees.sampled.parse_tree_output`,
bounded reads).  :class:`GreedyTreeCase` fields are validated before any case runs, each error
naming the case, the field and the value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree, check_tree_rows, to_sglang
from specref.verification.laws.enumeration import compare, law
from specref.verification.levels.runner import program_plan, run_cases, sampled_verdict, target_null
from specref.verification.levels.trees.sampled import _check_twin, _read_only, _twin, parse_tree_output
from specref.verification.running.calling import Misbehaved, call, foreign, short_repr
from specref.verification.running.level import CasePlan, Level, fixed_reference
from specref.verification.running.report import DIFFERS, INVALID, OK, CaseResult, law_verdict
from specref.verification.statistics.counts import PLAN_POWER, planned_n
from specref.verification.statistics.shards import tally

__all__ = [
    "SOURCE",
    "PARAMETERS",
    "TIES",
    "MAX_WIDTH",
    "GreedyTreeCase",
    "argmax_law",
    "explain",
    "declare_ties",
    "ties_of",
    "sglang_inputs",
    "greedy_reference",
    "greedy_step_reference",
    "sglang_step",
    "default_greedy_cases",
    "LEVELS",
]

SOURCE = ("sglang", "0.5.23", "sglang/kernels/ops/speculative/spec_tree.py", "verify_tree_greedy_triton")
"""Where the call was read: distribution, version, file, function."""

PARAMETERS = ("predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
              "retrieve_next_sibling", "target_predict")
"""``verify_tree_greedy_triton``'s parameters, in order, as :data:`SOURCE` defines them."""

TIES = ("lowest", "split")

MAX_WIDTH = 1 << 16
"""A case's ``width`` may pad its trees up to this many nodes (the dense batch is allocated: ``B x width``)."""


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class GreedyTreeCase:
    """A dense batch of trees with their target rows: plain data that reproduces a verdict.

    ``trees``: one :class:`~specref.core.tree.DraftTree` per batch row; ``target``: per row, its
    ``[N_b, V]`` target rows (row ``i``: the target after node ``i``'s path; Fractions or floats);
    ``width``: the dense ``N`` (default the largest tree; smaller trees are padded, to at most :data:`MAX_WIDTH`);
    ``root_tokens``: the committed token per row (``candidates[b, 0]``, default 0).
    """

    name: str
    trees: tuple
    target: tuple
    width: int | None = None
    root_tokens: tuple | None = None

    @property
    def batch(self) -> int:
        return len(self.trees)

    @property
    def vocab_size(self) -> int:
        return np.asarray(self.target[0]).shape[1]

    @property
    def dense(self) -> int:
        return self.width or max(t.size for t in self.trees)

    @property
    def depth(self) -> int:
        """``S - 1``: the deepest tree's depth (``accept_index`` holds ``S`` entries per row)."""
        return max(t.depth() for t in self.trees)

    def __repr__(self):
        try:
            shapes = ", ".join(f"{t.size} nodes" for t in self.trees)
            return (f"GreedyTreeCase({self.name!r}, B={self.batch}, N={self.dense}, V={self.vocab_size}, "
                    f"trees: {shapes})")
        except Exception:  # noqa: BLE001 - a malformed case (refused by the level): its name alone
            return f"GreedyTreeCase({short_repr(self.name, 80)}, malformed)"


def _validate(case):
    """SpecrefError naming the case, the field and the value for a malformed case (SPEC §12.5)."""
    if not isinstance(case, GreedyTreeCase):
        raise SpecrefError(f"greedy tree cases must be GreedyTreeCase objects, got {short_repr(case, 120)}")
    if not isinstance(case.name, str):
        raise SpecrefError(f"a GreedyTreeCase's name must be a string, got name={short_repr(case.name, 80)}")
    where, trees, target = f"case {case.name!r}", case.trees, case.target
    if not isinstance(trees, (tuple, list)) or not trees:
        raise SpecrefError(f"{where}: trees must be a non-empty tuple of DraftTree (one per batch row), got "
                           f"trees={short_repr(trees, 80)}")
    for b, tree in enumerate(trees):
        if not isinstance(tree, DraftTree):
            raise SpecrefError(f"{where}: trees[{b}] must be a DraftTree, got {short_repr(tree, 80)}")
    if not isinstance(target, (tuple, list)) or len(target) != len(trees):
        raise SpecrefError(f"{where}: target must be a tuple of {len(trees)} [N_b, V] row tables, one per tree, "
                           f"got target={short_repr(target, 80)}")
    V = None
    for b, (tree, rows) in enumerate(zip(trees, target)):
        try:
            rows = check_tree_rows(tree, rows)[0]
        except SpecrefError as e:
            raise SpecrefError(f"{where}: target[{b}] (tree {b}'s rows): {e}") from None
        V = rows.shape[1] if V is None else V
        if rows.shape[1] != V:
            raise SpecrefError(f"{where}: target[{b}] has rows over {rows.shape[1]} tokens, target[0] over {V}")
    _validate_ints(case, where, max(t.size for t in trees), V)


def _is_int(v) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer))


def _validate_ints(case, where, largest, V):
    """``width`` and ``root_tokens``: ints (not bools, floats or strings) in their ranges."""
    width, roots = case.width, case.root_tokens
    if width is not None and (not _is_int(width) or not largest <= width <= max(largest, MAX_WIDTH)):
        raise SpecrefError(f"{where}: width must be None or an int from the largest tree's node count {largest} "
                           f"to {max(largest, MAX_WIDTH)} (MAX_WIDTH = 2^16: the dense batch is allocated), "
                           f"got width={short_repr(width, 80)}")
    if roots is None:
        return
    if not isinstance(roots, (tuple, list)) or len(roots) != len(case.trees):
        raise SpecrefError(f"{where}: root_tokens must be None or {len(case.trees)} token ids, one per tree, got "
                           f"root_tokens={short_repr(roots, 80)}")
    for b, t in enumerate(roots):
        if not _is_int(t) or not 0 <= t < V:
            raise SpecrefError(f"{where}: root_tokens[{b}] must be a token id in 0..{V - 1}, got {short_repr(t, 80)}")


# ---------------------------------------------------------------- the law


def _maxima(row) -> list:
    """The tied argmax tokens of a row, lowest first (exact comparison)."""
    values = list(row)
    top = max(values)
    return [j for j, v in enumerate(values) if v == top]


def _choices(row, ties):
    tied = _maxima(row)
    return tied[:1] if ties == "lowest" else tied


def _first_child(tree, node, token):
    return next((c for c in tree.children(node) if tree.tokens[c] == token), None)


def argmax_law(tree: DraftTree, rows, ties: str = "lowest") -> dict:
    """``{(path, next_token): probability}`` of the greedy rule on one tree (Fractions).

    ``rows [N, V]``: the target after each node.  ``ties="lowest"``: a point mass;
    ``"split"``: each visited node's argmax uniform over its tied maxima.
    """
    if not _is_convention(ties):
        raise SpecrefError(f"ties must be one of {TIES}, got ties={short_repr(ties, 80)}")
    out: dict = {}
    stack: list = [(0, (), Fraction(1))]  # (node, path to it, probability): iterative, so any depth is judged
    while stack:
        node, path, w = stack.pop()
        options = _choices(rows[node], ties)
        for t in reversed(options):  # popped in the order of the options
            child = _first_child(tree, node, t)
            if child is None:
                key = (path, int(t))
                out[key] = out.get(key, Fraction(0)) + w / len(options)
            else:
                stack.append((child, path + (child,), w / len(options)))
    return out


def _batch_law(case, ties) -> dict:
    expected: dict[tuple, Fraction] = {(): Fraction(1)}
    for tree, rows in zip(case.trees, case.target):
        one = argmax_law(tree, np.asarray(rows), ties)
        expected = {k + (o,): w * v for k, w in expected.items() for o, v in one.items()}
    return expected


def explain(tree: DraftTree, rows, path, token, ties: str = "lowest") -> str | None:
    """Where ``(path, token)`` leaves the greedy rule on ``tree``, in words (None: it follows it)."""
    cur = 0
    for depth in range(len(path) + 1):
        options = _choices(rows[cur], ties)
        tied = _maxima(rows[cur])
        note = f" (tied maxima {tied}; ties={ties!r})" if len(tied) > 1 else ""
        argmax = options[0] if len(options) == 1 else options
        if depth == len(path):  # the kernel stopped at cur
            below = [(t, _first_child(tree, cur, t)) for t in options]
            if all(c is not None for _, c in below):
                t, c = below[0]
                return (f"stopped at node {cur}, but its child node {c} carries the target's argmax {t} there{note}: "
                        f"the argmax path continues")
            if token not in [t for t, c in below if c is None]:
                return f"next token {token} at node {cur}, but the target's argmax there is {argmax}{note}"
            return None
        node = path[depth]
        x = tree.tokens[node]
        if x not in options:
            return (f"at node {cur} accepted node {node} (token {x}), but the target's argmax at node {cur} is "
                    f"{argmax}{note}")
        first = _first_child(tree, cur, x)
        if first != node:
            return (f"at node {cur} accepted node {node} (token {x}); the first child carrying {x} in sibling "
                    f"order is node {first}")
        cur = node
    return None


# ---------------------------------------------------------------- declared conventions


def declare_ties(fn, ties: str):
    """``fn`` declared to break ties ``"lowest"`` or ``"split"`` (read by both greedy levels)."""
    if not callable(fn):
        raise SpecrefError(f"declare_ties needs a callable, got {fn!r:.80}")
    if not _is_convention(ties):
        raise SpecrefError(f"declare_ties: ties must be one of {TIES}, got ties={short_repr(ties, 80)}")

    def declared(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapped: Any = functools.wraps(fn)(declared)  # fn's name and docstring, and one attribute more
    wrapped.specref_ties = ties
    return wrapped


def ties_of(fn) -> str:
    """The tie convention ``fn`` declares (:func:`declare_ties`), ``"lowest"`` by default."""
    ties = getattr(fn, "specref_ties", "lowest")
    if not _is_convention(ties):
        raise SpecrefError(f"{fn!r:.60} declares ties={short_repr(ties, 80)}; the conventions are {TIES}")
    return ties


def _is_convention(ties) -> bool:
    """One of :data:`TIES` (a string: an array is never compared elementwise, SPEC §12.5)."""
    return isinstance(ties, str) and ties in TIES


# ---------------------------------------------------------------- the SGLang call


def sglang_inputs(case: GreedyTreeCase, predict_rows) -> tuple:
    """The eight arguments of SGLang's call for ``case`` (NumPy), given ``target_predict`` per row.

    ``predict_rows``: per tree, the argmax token of each node's row (``[N_b]``).  Padding nodes
    (past a tree's size) have -1 links and carry the token ``target_predict[b, 0]`` names.
    """
    B, N, S = case.batch, case.dense, case.depth + 1
    candidates = np.zeros((B, N), dtype=np.int64)
    first = np.full((B, N), -1, dtype=np.int64)
    sibling = np.full((B, N), -1, dtype=np.int64)
    predict = np.zeros((B, N), dtype=np.int64)
    for b, tree in enumerate(case.trees):
        root = 0 if case.root_tokens is None else int(case.root_tokens[b])
        c, f, s = to_sglang(tree, root_token=root)
        n = tree.size
        candidates[b, :n], first[b, :n], sibling[b, :n] = c, f, s
        predict[b, :n] = predict_rows[b]
        candidates[b, n:] = predict[b, n:] = predict_rows[b][0]  # padding: the root's argmax, linked from nowhere
    index = np.arange(B * N, dtype=np.int64).reshape(B, N)
    return (np.zeros(B * N, dtype=np.int32), np.full((B, S), -1, dtype=np.int32), np.zeros(B, dtype=np.int32),
            candidates, index, first, sibling, predict)


def _outputs(args, out) -> list:
    """The call's three outputs as NumPy integer arrays (in place: the buffers handed over; a
    functional kernel: what it returned), read inside the guarded call; never cast from another dtype."""
    names = ("predicts", "accept_index", "accept_token_num")
    with foreign(f"the kernel's outputs ({', '.join(names)}) could not be read"):
        got = out if isinstance(out, tuple) and len(out) == 3 else args[:3]  # a functional kernel returns them
        arrays = [np.asarray(to_numpy(a)) for a in got]
    for name, a in zip(names, arrays):
        if a.dtype.kind not in "iu":
            raise Misbehaved(INVALID, f"{name} is a {a.dtype} array, not integers: the outputs must be integer arrays "
                                      f"(they are never cast)")
    return arrays


def _read_back(case, args, out):
    """Per tree ``(path, next_token)`` from the call's outputs, or Misbehaved naming the row (runs inside
    the guarded call)."""
    predicts, accept_index, accept_num = _outputs(args, out)
    pr = predicts.reshape(-1).astype(np.int64)
    ai = accept_index.astype(np.int64)
    num = accept_num.reshape(-1).astype(np.int64)
    B, N, S, V = case.batch, case.dense, case.depth + 1, case.vocab_size
    if pr.shape != (B * N,) or ai.shape != (B, S) or num.shape != (B,):
        raise Misbehaved(INVALID, f"outputs of shapes predicts {list(pr.shape)}, accept_index {list(ai.shape)}, "
                                  f"accept_token_num {list(num.shape)}; expected [{B * N}], [{B}, {S}], [{B}]")
    rows = []
    for b, tree in enumerate(case.trees):
        n, row = int(num[b]), ai[b].tolist()
        if not 0 <= n < S:
            raise Misbehaved(INVALID, f"row {b}: accept_token_num = {n} is outside 0..{S - 1}")
        if row[0] != b * N:
            raise Misbehaved(INVALID, f"row {b}: accept_index[{b}, 0] = {row[0]}, not the root's index {b * N}")
        if any(v != -1 for v in row[n + 1:]):
            raise Misbehaved(INVALID, f"row {b}: accept_index {row} holds entries after its {n} accepted nodes")
        local = [v - b * N for v in row[1:n + 1]]
        try:
            path = tree.check_path(local)
        except SpecrefError as e:
            raise Misbehaved(INVALID, f"row {b}: accept_index {row} is not a root-down path of its tree: {e}") from None
        for j, node in enumerate(path):
            if pr[row[j]] != tree.tokens[node]:
                raise Misbehaved(INVALID, f"row {b}: predicts[{row[j]}] = {pr[row[j]]}, but the accepted node {node} "
                                          f"there carries token {tree.tokens[node]}")
        token = int(pr[row[n]])
        if not 0 <= token < V:
            raise Misbehaved(INVALID, f"row {b}: next token predicts[{row[n]}] = {token} is outside 0..{V - 1}")
        rows.append((tuple(path), token))
    return tuple(rows)


def greedy_reference(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                     retrieve_next_sibling, target_predict):
    """Specref's reference in SGLang's call (NumPy, in place): the greedy rule row by row.

    Row ``b`` starts at its root (``retrieve_index[b, 0]``); at node ``c`` the target token is
    ``target_predict`` at ``c``'s flat index; the children are walked from
    ``retrieve_next_token`` along ``retrieve_next_sibling`` and the first carrying the target
    token is accepted (``predicts`` at ``c`` gets its token), for at most ``S - 1`` levels; at
    the last accepted node ``predicts`` gets its target token.
    """
    B, N = np.shape(candidates)
    S = np.shape(accept_index)[1]
    flat_predict = np.asarray(target_predict).reshape(-1)
    for b in range(B):
        cur, last = 0, int(retrieve_index[b][0])
        accept_index[b][0] = last
        n = 0
        for _ in range(1, S):
            want = flat_predict[last]
            child = int(retrieve_next_token[b][cur])
            while child != -1 and candidates[b][child] != want:
                child = int(retrieve_next_sibling[b][child])
            if child == -1:
                break
            predicts[last] = want
            n += 1
            last = int(retrieve_index[b][child])
            accept_index[b][n] = last
            cur = child
        accept_token_num[b] = n
        predicts[last] = flat_predict[last]


def _reachable(tree, rows) -> set:
    """The nodes the greedy rule visits under some choice among tied maxima."""
    seen, stack = set(), [0]
    while stack:
        node = stack.pop()
        seen.add(node)
        stack.extend(c for t in _maxima(rows[node]) if (c := _first_child(tree, node, t)) is not None)
    return seen


def _sglang_program(kernel, case, ties, time_limit):
    """``program(rng) -> ((path, token) per tree)``: target_predict formed by ``ties``, the kernel called."""
    rows = [np.asarray(r) for r in case.target]
    # split ties are drawn at the nodes the rule can visit (elsewhere the lowest id): every tie the
    # argmax path can meet is enumerated, without multiplying paths by ties no path reaches
    visit = [_reachable(tree, rs) for tree, rs in zip(case.trees, rows)]

    def program(rng):
        predict = [[o[0] if len(o) == 1 or i not in visit[b] else int(rng.choice(o))
                    for i, o in enumerate(_choices(r, ties) for r in rs)] for b, rs in enumerate(rows)]
        made = sglang_inputs(case, predict)
        args = made[:3] + tuple(_read_only(a) for a in made[3:])  # the outputs writable, the inputs read-only
        return call(kernel, args, {}, time_limit, convert=lambda out: _read_back(case, args, out), read_only=True)

    return program


# ---------------------------------------------------------------- the step form


def greedy_step_reference(tree, p_target, rng=None, *, ties: str = "lowest"):
    """Specref's reference in the step form: the greedy rule with argmax ties ``ties``
    (``"split"``: each node's choice drawn from ``rng`` with ``rng.choice``)."""
    rows = np.asarray(p_target)
    path: list[int] = []
    cur = 0
    while True:
        options = _choices(rows[cur], ties)
        t = options[0] if len(options) == 1 else int(rng.choice(options))
        child = _first_child(tree, cur, t)
        if child is None:
            return path, int(t)
        path.append(child)
        cur = child


def sglang_step(kernel):
    """An SGLang-call kernel as a ``greedy_tree_step`` step (one tree; ``target_predict`` the lowest argmax)."""

    def step(tree, p_target, rng=None):
        rows = np.asarray(p_target)
        case = GreedyTreeCase("step", (tree,), (rows,))
        args = sglang_inputs(case, [[_maxima(r)[0] for r in rows]])
        out = kernel(*args)
        (path, token), = _read_back(case, args, out)
        return list(path), token

    step.__name__ = f"sglang_step({getattr(kernel, '__name__', 'kernel')})"
    return step


def _step_program(step, case, time_limit):
    rows = [np.asarray(r) for r in case.target]

    def program(rng):
        return tuple(_judged_step(step, b, tree, rows[b], rng, case.vocab_size, time_limit)
                     for b, tree in enumerate(case.trees))

    return program


def _judged_step(step, b, tree, rows, rng, V, time_limit):
    """One guarded call of the step on its own copy of tree ``b`` and read-only rows; inside the call
    the copy is checked (a write: ``writes into its inputs``) and the output parsed against ``tree``."""
    twin = _twin(tree)
    handed = dict(vars(twin))
    what = f"tree {b}: step"

    def convert(out):
        _check_twin(twin, handed, tree, what)
        return parse_tree_output(out, tree, V, what=what)

    path, token = call(step, (twin, _read_only(rows), rng), {}, time_limit, convert=convert, read_only=True)
    return tuple(path), int(token)


# ---------------------------------------------------------------- verdicts and the levels


def _exact(case, program, ties, settings):
    expected = _batch_law(case, ties)  # before any call
    got = law(program, max_paths=settings.max_paths)
    result = law_verdict(case, compare(got, expected), settings.tolerance,
                         label="trees' (path, next token), got, expected")
    if result.status == DIFFERS:
        wrong = [o for o in sorted(got, key=lambda o: -float(got[o])) if expected.get(o, 0) == 0]
        where = []
        for o in wrong[:1]:
            for b, (path, token) in enumerate(o):
                why = explain(case.trees[b], np.asarray(case.target[b]), list(path), token, ties)
                if why:
                    where.append(f"tree {b}: {why}")
        if not where and ties == "split":
            where.append("the outputs are the argmax paths, but not with the split law (uniform over tied maxima)")
        result.detail = "; ".join(where + [result.detail])
    return result


def _runner(program_of):
    """A level's run function: exact (enumerated) or statistical (sampled, G-tested), through the one runner."""

    def run(level, fn, cases, settings):
        ties = ties_of(fn)

        def exact(case):
            return partial(_exact, case, program_of(fn, case, ties, settings.time_limit), ties, settings)

        def statistical(case, seed):
            recipe = partial(_recipe, program_of, fn, case, ties, settings.time_limit)
            expected = _batch_law(case, ties)
            if len(expected) == 1:  # a point mass: no G-test (its null has one category)
                return partial(_point_mass_verdict, case, recipe, expected, settings, seed, ties=ties)
            return partial(sampled_verdict, case, recipe, expected, settings, seed)

        return run_cases(level, cases, settings, validate=_validate, exact=exact, statistical=statistical,
                         fn=fn)

    return run


def _point_mass_verdict(case, recipe, expected, settings, seed, *, ties="lowest"):
    """Statistical mode on a point mass: every sample must be the one output.  N detects an
    implementation that strays with probability ``detect_tv`` with power :data:`PLAN_POWER` (no
    G-test: a correct implementation never strays, so there is no false alarm to control)."""
    n = planned_n(settings, target_null(expected))
    (only,) = expected
    t = tally(recipe, (only,), n, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
              store=settings.shard_store)
    if t.misbehaved:
        return CaseResult(case, t.misbehaved[1], detail=t.misbehaved[2])
    strays = sum(t.strays.values())
    detail = f"{n} samples, {strays} off the argmax law"
    if t.strays:
        out, count = max(t.strays.items(), key=lambda kv: kv[1])
        for b, (path, token) in enumerate(out):
            why = explain(case.trees[b], np.asarray(case.target[b]), list(path), token, ties)
            if why:
                detail = f"tree {b}: {why}; " + detail
                break
        detail += f"; most frequent: {out} ({count} times)"
    return CaseResult(case, DIFFERS if strays else OK, tv=strays / n, detail=detail, n_samples=n,
                      p_value=0.0 if strays else 1.0, detectable_tv=1 - (1 - PLAN_POWER) ** (1 / n))


def _recipe(program_of, fn, case, ties, time_limit):
    program = program_of(fn, case, ties, time_limit)
    return lambda rng, impl_seed: program(rng)


def _frac_rows(rows):
    return np.array([[Fraction(v) for v in row] for row in rows], dtype=object)


def default_greedy_cases() -> list:
    """Small exact cases over V = 4: distinct children with paths two and three deep, ties at a
    judged node and at the bonus, duplicated children, a padded dense batch, a chain accepted to
    its leaf, no match at the root, and a root with no drafts."""
    def tree(parents, tokens):
        return DraftTree(tuple(parents), tuple(tokens))

    def rows(*rs):
        return _frac_rows([r.split() for r in rs])

    wide = tree([-1, 0, 0, 1, 1, 2, 3], [-1, 2, 1, 0, 3, 3, 1])  # depth 3, distinct children
    wide_rows = rows("1/8 1/4 1/2 1/8", "1/2 1/5 1/5 1/10", "1/4 1/4 1/4 1/4", "1/10 3/5 1/10 1/5",
                     "1/4 1/4 1/4 1/4", "1/4 1/4 1/4 1/4", "1/6 1/6 1/6 1/2")  # path 1 -> 3 -> 6, bonus 3
    tie = tree([-1, 0, 0, 1], [-1, 3, 1, 2])
    tie_rows = rows("1/8 3/8 1/8 3/8", "1/3 0 1/3 1/3", "1/4 1/4 1/4 1/4",
                    "2/5 2/5 1/10 1/10")  # root: 1 and 3 tie; node 1: 0, 2, 3 tie; node 3: 0 and 1 tie (bonus)
    dup = tree([-1, 0, 0, 2], [-1, 1, 1, 0])  # root's children 1 and 2 both carry token 1; only node 2 has a child
    dup_rows = rows("1/10 7/10 1/10 1/10", "3/5 1/5 1/10 1/10", "3/5 1/5 1/10 1/10", "1/4 1/4 1/2 0")
    chain = tree([-1, 0, 1, 2], [-1, 2, 2, 0])
    chain_rows = rows("0 0 1 0", "1/5 1/5 2/5 1/5", "1/2 1/6 1/6 1/6", "1/7 2/7 0 4/7")
    miss = tree([-1, 0, 0], [-1, 0, 1])
    miss_rows = rows("1/5 1/5 3/5 0", "1/4 1/4 1/4 1/4", "1/4 1/4 1/4 1/4")
    root = tree([-1], [-1])
    root_rows = rows("1/6 1/2 1/6 1/6")
    return [
        GreedyTreeCase("distinct-children", (wide, miss), (wide_rows, miss_rows), root_tokens=(2, 0)),
        GreedyTreeCase("ties", (tie, wide), (tie_rows, wide_rows)),
        GreedyTreeCase("duplicate-children", (dup,), (dup_rows,)),
        GreedyTreeCase("padded-batch", (chain, root, miss), (chain_rows, root_rows, miss_rows)),
        GreedyTreeCase("chain-to-leaf-padded", (chain,), (chain_rows,), width=6),
    ]


def _sglang_of(kernel, case, ties, time_limit):
    return _sglang_program(kernel, case, ties, time_limit)


def _step_of(step, case, ties, time_limit):
    return _step_program(step, case, time_limit)


def _planner(program_of):
    """A level's planner: N over the trees' argmax law under the declared ties, one call per sample."""

    def planner(level: Level, fn, case, settings, seed: int) -> CasePlan:
        ties = ties_of(fn)
        return program_plan(_batch_law(case, ties), partial(_recipe, program_of, fn, case, ties, settings.time_limit),
                            settings, seed)

    return planner


def _validated(level: Level, case, settings) -> None:
    _validate(case)


LEVELS = (
    Level("greedy_tree", "kernel(predicts [B N], accept_index [B, S], accept_token_num [B], candidates [B, N], "
                         "retrieve_index [B, N], retrieve_next_token [B, N], retrieve_next_sibling [B, N], "
                         "target_predict [B, N]) in place", default_greedy_cases, _runner(_sglang_of),
          validate=_validated, reference=fixed_reference(greedy_reference), planner=_planner(_sglang_of)),
    Level("greedy_tree_step", "step(tree, p_target [N, V], rng) -> (path, next_token)", default_greedy_cases,
          _runner(_step_of), validate=_validated, reference=fixed_reference(greedy_step_reference),
          planner=_planner(_step_of)),
)
"""SGLang's greedy tree call and the one-tree step form; the argmax path under a declared tie rule."""
