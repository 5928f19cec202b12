"""The ``tree`` oracle level: check a tree verifier exactly or statistically.

``tree_step_fn(tree, p_target [N, V], q_draft [N, V] | None, rng) -> (path, next_token)``
(:mod:`specref.core.tree`, :mod:`specref.core.tree_verify`).  For each
:class:`TreeCase` the oracle

1. drafts a tree of shape ``widths`` from the case's draft table with the case's
   drafting scheme (``"topk"``: point mass, ``q_draft`` passed as None; ``"iid"`` or
   ``"without_replacement"``: sampled children, ``q_draft`` passed);
2. scores every node with the target table (``p_target``) and calls the implementation;
3. checks that ``path`` is a root-down path of the tree and the token is in the
   vocabulary, emits the path's tokens and the next token, and completes the block to
   ``depth + 1`` tokens by target sampling.

A :class:`UserTreeCase` hands in the user's own drafted tree instead (parents and tokens per
slot with -1 padding, or SGLang's links; a draft row per node or None; how the children were
drafted): a deterministic tree (``"topk"``, ``"deterministic"``) is handed to every call as it
is, a sampled one (``"iid"``, ``"without_replacement"``) keeps its shape and rows and has its
children redrawn from them on every call, since the target law holds only over the drafting.

The completed block must have the target law of ``depth + 1`` tokens.  Exact mode
enumerates every draft and every coin (the implementation's ``rng`` is the
enumerator's); statistical mode samples N blocks and runs the pooled G-test of
:mod:`specref.verification.statistics.counts`, handing the implementation a
``numpy.random.Generator`` of its own, seeded from the sample's seed (the oracle draws the
drafts and completions from its own generator, which the implementation never sees; it may
ignore its generator and use its own randomness).

Every call gets its own copy of the drafted tree, checked after the call, and read-only copies of
the rows (views that cannot be made writeable again); a write is the status ``writes into its
inputs`` (SPEC §12.4).  Its output is parsed inside the guarded call
(:func:`parse_tree_output`, :func:`parse_tree_batch_output`) against the oracle's own tree, so
an output whose iteration raises ``SystemExit`` or never ends is ``invalid output`` or a
time-out.  The target law of a case, and of a dense batch (the product of ``batch`` laws), is
built inside the case within ``max_paths``; over it the case is ``over budget`` at once.

SGLang-style kernels take their coins as arguments: :func:`from_coins` wraps such a
kernel into a ``tree_step_fn`` by passing it lazy uniforms, so it runs in exact mode.
:func:`sglang_style_kernel` is a reference kernel of that shape (one coin per node,
siblings tried by a running sum of target probabilities, a scratch row per node that
records the tried siblings, inverse-CDF final draw with a separate coin).  Dense batches
of trees (``[B, N]``, as SGLang runs them) are checked exactly by :func:`specref.verification.oracle.check_tree_batch`:
the joint law of the B rows must be the product of the target laws.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from itertools import islice

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int, check_prob_rows
from specref.core.numbers import is_exact
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.core.tree import DraftTree, from_padded, sglang_slots, to_sglang
from specref.decoding.chain import next_token_probs
from specref.decoding.tree import SCHEMES, draft_on_shape, draft_tree, tree_paths, tree_rows
from specref.verification.running.calling import Misbehaved, call, foreign, short_repr
from specref.verification.laws.enumeration import target_law
from specref.verification.levels.runner import exact_verdict, program_plan, run_cases, sampled_verdict
from specref.verification.running.level import CasePlan, Level, Option, fixed_reference
from specref.verification.running.report import INVALID, WRITES
from specref.verification.cases.tables import ProbTable

__all__ = ["TreeCase", "tree_cases", "UserTreeCase", "user_tree_cases", "USER_DRAFTINGS", "TREE_TIES",
           "from_coins", "sglang_style_kernel", "tree_program", "DRAFTING", "TREES_PER_CALL",
           "batched_reference_kernel", "tree_batch_program", "run_tree_batch", "parse_tree_output",
           "parse_tree_batch_output", "MAX_TREE_NODES"]


@dataclass(frozen=True)
class TreeCase:
    """One tree input: target and draft tables (``[V] * (h + 1)``), a prompt, a shape and a drafting scheme."""

    name: str
    target: np.ndarray
    draft: np.ndarray
    prompt: tuple = (0,)
    widths: tuple = (2, 2)  # children per node at depth 0, 1, ...
    drafting: str = "topk"  # "topk" | "iid" | "without_replacement"
    tables: str = "probs"  # the tables hold final distributions (no sampling rules are applied)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise SpecrefTypeError(f"TreeCase name must be a string, got {self.name!r:.80}")
        if not isinstance(self.drafting, str) or self.drafting not in SCHEMES:
            raise SpecrefError(f"TreeCase {self.name!r}: drafting must be one of {SCHEMES}, got {self.drafting!r}")
        object.__setattr__(self, "widths", _widths(self.name, self.widths))
        object.__setattr__(self, "prompt", _prompt(self.name, self.prompt))
        for field in ("target", "draft"):
            if not hasattr(getattr(self, field), "shape"):
                raise SpecrefTypeError(f"TreeCase {self.name!r}: {field} must be an array of next-token rows, "
                                       f"got {type(getattr(self, field)).__name__}")

    @property
    def vocab_size(self) -> int:
        return self.target.shape[-1]

    @property
    def depth(self) -> int:
        return len(self.widths)

    def models(self):
        return ProbTable(self.target), ProbTable(self.draft)

    def as_float(self) -> "TreeCase":
        return replace(self, target=np.asarray(self.target, dtype=np.float64),
                       draft=np.asarray(self.draft, dtype=np.float64))

    def __repr__(self):
        return (f"TreeCase({self.name!r}, V={self.vocab_size}, widths={self.widths}, drafting={self.drafting!r}, "
                f"prompt={self.prompt})")


MAX_TREE_NODES = 10**6  # nodes of one drafted tree (a TreeCase's widths) before it is refused


def _widths(name, widths) -> tuple:
    """``widths`` as a non-empty tuple of positive ints whose tree has at most ``MAX_TREE_NODES`` nodes."""
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__"):
        raise SpecrefTypeError(f"TreeCase {name!r}: widths must be a tuple of positive ints, got {widths!r:.80}")
    widths = tuple(widths)
    if not widths:
        raise SpecrefError(f"TreeCase {name!r}: widths must hold at least one level, got ()")
    nodes, level = 1, 1
    for i, w in enumerate(widths):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)) or w < 1:
            raise SpecrefError(f"TreeCase {name!r}: widths[{i}] must be a positive int, got {w!r:.80}")
        level *= int(w)
        nodes += level
        if nodes > MAX_TREE_NODES:
            raise SpecrefError(f"TreeCase {name!r}: widths {widths} make a tree of more than {MAX_TREE_NODES} nodes")
    return tuple(int(w) for w in widths)


def _prompt(name, prompt) -> tuple:
    """``prompt`` as a non-empty tuple of non-negative ints (the vocabulary is checked with the tables)."""
    if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__iter__"):
        raise SpecrefTypeError(f"TreeCase {name!r}: prompt must be a tuple of token ids, got {prompt!r:.80}")
    prompt = tuple(prompt)
    for i, t in enumerate(prompt):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or t < 0:
            raise SpecrefError(f"TreeCase {name!r}: prompt[{i}] must be a token id (an int >= 0), got {t!r:.80}")
    if not prompt:
        raise SpecrefError(f"TreeCase {name!r}: prompt must hold at least one token, got ()")
    return tuple(int(t) for t in prompt)


def _frac(rows):
    return np.array([[Fraction(v) for v in row] for row in rows], dtype=object)


def tree_cases(drafting: str = "topk") -> list[TreeCase]:
    """Small default cases for one drafting scheme (bigram tables, V = 3)."""
    if drafting not in SCHEMES:
        raise SpecrefError(f"drafting must be one of {SCHEMES}, got {drafting!r}")
    p = _frac([["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]])
    q = _frac([["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"]])
    peaked = _frac([["1/10", "4/5", "1/10"], ["7/10", "1/5", "1/10"], ["1/6", "1/6", "2/3"]])
    sampled = drafting != "topk"
    cases = [
        TreeCase("width2-depth2", p, q, widths=(2, 1) if sampled else (2, 2), drafting=drafting),
        TreeCase("width2-depth1", peaked, q, prompt=(1,), widths=(2,), drafting=drafting),
        TreeCase("chain-depth2", p, peaked, widths=(1, 1), drafting=drafting),
        TreeCase("p-equals-q", p, p, widths=(2,), drafting=drafting),
    ]
    if drafting == "iid":  # three i.i.d. children: duplicates are likely
        cases.append(TreeCase("width3-depth1", p, q, prompt=(2,), widths=(3,), drafting=drafting))
    return cases


# ---------------------------------------------------------------- user-built trees


USER_DRAFTINGS = ("topk", "deterministic", "iid", "without_replacement")
"""How a user-built tree's children were drafted (SPEC §12.4): ``"topk"`` -- chosen without the
coins, distinct (the draft's most likely tokens); ``"deterministic"`` -- chosen without the coins,
a token may repeat under one parent (top-k with replacement, merged beams, a hand-built tree);
``"iid"`` -- i.i.d. draws from the node's q row; ``"without_replacement"`` -- draws without
replacement from it."""

TREE_TIES = ("any", "lowest")
"""How a ``"topk"`` tree's children rank q's ties, checked when its q rows are given: ``"any"`` --
no token left out is more likely than a child; ``"lowest"`` -- the children, in sibling order,
are q's most likely tokens with ties to the lowest id (:func:`~specref.decoding.tree.draft_tree`)."""


@dataclass(frozen=True)
class UserTreeCase:
    """A tree the user drafted, judged on the target law of ``depth + 1`` tokens (SPEC §12.4).

    The target table scores every node (``p_target``); the user gives the tree per slot --
    ``parents``, ``tokens`` (node 0 the root; a padded slot has both -1), or
    :meth:`from_sglang` -- the draft row each node's children came from (``q_draft [slots, V]``,
    padded rows ignored; None: point masses, deterministic drafting only) and how they came
    (``drafting``, one of :data:`USER_DRAFTINGS`; ``ties``, one of :data:`TREE_TIES`).  Validated
    on construction: every error names the node (its slot) and the field.  The implementation
    gets the tree without its padding (nodes in slot order) and the q rows of its nodes (None if
    none were given).
    """

    name: str
    target: np.ndarray  # the target table, [V] * (h + 1)
    parents: tuple  # per slot; parents[0] = -1
    tokens: tuple  # per slot; tokens[0] = -1 (the root carries no draft)
    q_draft: np.ndarray | None = None  # [slots, V] or None (point masses)
    drafting: str = "topk"  # USER_DRAFTINGS
    prompt: tuple = (0,)
    ties: str = "any"  # TREE_TIES: read for "topk" trees with q rows
    tables: str = "probs"  # the target table holds final distributions

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise SpecrefTypeError(f"UserTreeCase name must be a string, got {self.name!r:.80}")
        for field, value, known in (("drafting", self.drafting, USER_DRAFTINGS), ("ties", self.ties, TREE_TIES)):
            if not isinstance(value, str) or value not in known:
                raise SpecrefError(f"UserTreeCase {self.name!r}: {field} must be one of {known}, got {value!r:.80}")
        object.__setattr__(self, "prompt", _prompt(self.name, self.prompt))
        table = _user_target(self.name, self.target)
        object.__setattr__(self, "target", table)  # float32 and float16 tables: renormalised in float64
        try:
            tree, slots = from_padded(self.parents, self.tokens)
            rows = _user_rows(tree, slots, len(self.parents), self.q_draft, self.drafting, self.ties, table)
        except SpecrefError as e:
            raise SpecrefError(f"UserTreeCase {self.name!r}: {e}") from None
        object.__setattr__(self, "parents", tuple(int(v) for v in self.parents))
        object.__setattr__(self, "tokens", tuple(int(v) for v in self.tokens))
        object.__setattr__(self, "_drafted", (tree, slots, rows))

    @classmethod
    def from_sglang(cls, name, target, candidates, retrive_next_token, retrive_next_sibling, **options):
        """The case of a tree in SGLang's layout (a slot no link reaches, with candidate -1, is padding)."""
        try:
            parents, tokens = sglang_slots(candidates, retrive_next_token, retrive_next_sibling)
        except SpecrefError as e:
            raise SpecrefError(f"UserTreeCase {name!r}: {e}") from None
        return cls(name, target, parents, tokens, **options)

    def _parts(self) -> tuple:
        """``(tree, slots, q rows)``, set by ``__post_init__``: an attribute, not a field, so that
        ``dataclasses.fields`` (a case's shapes, ``replace``) sees only what the user gives."""
        return self.__dict__["_drafted"]

    @property
    def tree(self) -> DraftTree:
        """The tree without its padding, nodes numbered in slot order."""
        return self._parts()[0]

    @property
    def slots(self) -> tuple:
        """``slots[j]``: the slot of node ``j``."""
        return self._parts()[1]

    @property
    def q_rows(self):
        """``[N, V]``: the q rows of the nodes (None for point masses)."""
        return self._parts()[2]

    @property
    def sampled(self) -> bool:
        return self.drafting in ("iid", "without_replacement")

    @property
    def vocab_size(self) -> int:
        return self.target.shape[-1]

    @property
    def depth(self) -> int:
        return self.tree.depth()

    def models(self):
        return ProbTable(self.target), None

    def as_float(self) -> "UserTreeCase":
        q = None if self.q_draft is None else np.asarray(to_numpy(self.q_draft), dtype=np.float64)
        return replace(self, target=np.asarray(self.target, dtype=np.float64), q_draft=q)

    def __repr__(self):
        return (f"UserTreeCase({self.name!r}, V={self.vocab_size}, nodes={self.tree.size}, "
                f"drafting={self.drafting!r}, q={'given' if self.q_rows is not None else 'None'}, "
                f"prompt={self.prompt})")


def _user_target(name, target):
    """A user-built tree's target table, validated (SPEC §12.4.1): real numbers or Fractions of shape
    ``[V] * (h + 1)``, rows that are distributions within ``row_tolerance`` of the dtype; every error
    names the case and the field.  Float32 and float16 tables come back renormalised in float64."""
    try:
        if not hasattr(target, "shape"):
            raise SpecrefTypeError(f"target must be an array of next-token rows, got {type(target).__name__}")
        table = target if is_exact(target) else to_numpy(target)
        if not is_exact(table) and getattr(getattr(table, "dtype", None), "kind", None) not in ("f", "i", "u"):
            raise SpecrefTypeError(f"target must hold probabilities (a float, integer or Fraction array), got "
                                   f"dtype {getattr(table, 'dtype', type(table).__name__)}")
        shape = tuple(table.shape)
        if len(shape) < 2 or len(set(shape)) != 1 or shape[0] < 1:
            raise SpecrefError(f"target must have shape [V, V] or [V] * (h + 1), got shape {shape}")
        table = check_prob_rows("target", table)
    except SpecrefError as e:
        raise type(e)(f"UserTreeCase {name!r}: {e}") from None
    return table if is_exact(table) else np.asarray(table, dtype=np.float64)


def _user_rows(tree, slots, n_slots, q_draft, drafting, ties, target):
    """The q rows of ``tree``'s nodes (``[N, V]``, None for point masses), after the checks that name
    the node (its slot) and the field: tokens in the vocabulary, distinct children where the drafting
    needs them, q rows per slot that are distributions, positive at each drafted token, and for
    ``"topk"`` the children's rank in q under ``ties``."""
    V = target.shape[-1]
    for j in range(1, tree.size):
        if tree.tokens[j] >= V:
            raise SpecrefError(f"node {slots[j]}: token {tree.tokens[j]} is outside the vocabulary 0..{V - 1} "
                               f"(tokens[{slots[j]}])")
    if drafting in ("topk", "without_replacement"):
        _distinct_children(tree, slots, drafting)
    if q_draft is None:
        if drafting in ("iid", "without_replacement"):
            raise SpecrefError(f"drafting {drafting!r} samples the children from q: q_draft [slots, V] is needed, "
                               f"got None (q_draft)")
        return None
    q = to_numpy(q_draft)
    if getattr(q, "ndim", None) != 2 or q.shape != (n_slots, V):
        raise SpecrefError(f"q_draft must have shape [slots, V] = [{n_slots}, {V}] (one row per slot, padded slots "
                           f"included), got {getattr(q, 'shape', type(q).__name__)} (q_draft)")
    if is_exact(q) != is_exact(target):
        raise SpecrefError("q_draft and the target table must both be Fraction (object) rows or both float rows "
                           "(q_draft)")
    rows = []
    for s in slots:
        try:
            rows.append(check_prob_rows("q_draft", q[s:s + 1])[0])
        except SpecrefError as e:  # its message names row 0 of the one-row table: name the slot's row instead
            detail = str(e).replace("q_draft row 0", "it").replace("q_draft[0]", f"q_draft[{s}]")
            raise SpecrefError(f"node {s}: q_draft[{s}] is not a distribution: {detail} (q_draft[{s}])") from None
    rows = np.stack(rows) if is_exact(q) else np.stack(rows).astype(np.float64)
    for j in range(1, tree.size):
        a, x = tree.parents[j], tree.tokens[j]
        if rows[a, x] == 0:
            raise SpecrefError(f"node {slots[j]}: token {x} has q_draft[{slots[a]}, {x}] = 0 at its parent "
                               f"{slots[a]}: the draft cannot have proposed it (q_draft[{slots[a]}][{x}])")
    if drafting == "topk":
        _check_topk(tree, slots, rows, ties)
    return rows


def _distinct_children(tree, slots, drafting):
    for node in range(tree.size):
        seen = {}
        for c in tree.children(node):
            x = tree.tokens[c]
            if x in seen:
                raise SpecrefError(f"node {slots[node]}: children {slots[seen[x]]} and {slots[c]} both carry token "
                                   f"{x}; drafting {drafting!r} draws distinct children (tokens[{slots[c]}])")
            seen[x] = c


def _check_topk(tree, slots, rows, ties):
    """SpecrefError naming the child when a ``"topk"`` node's children are not q's most likely tokens."""
    V = rows.shape[1]
    for node in range(tree.size):
        kids = tree.children(node)
        if not kids:
            continue
        q, chosen = rows[node], [tree.tokens[c] for c in kids]
        if ties == "lowest":
            ranked = sorted(range(V), key=lambda j: (-q[j], j))
            for rank, (c, x) in enumerate(zip(kids, chosen)):
                if x != ranked[rank]:
                    raise SpecrefError(f"node {slots[c]}: token {x} is child {rank} of node {slots[node]}, but the "
                                       f"draft's rank-{rank} token under ties='lowest' is {ranked[rank]} "
                                       f"(q_draft[{slots[node]}]); not a top-{len(kids)} tree (tokens[{slots[c]}])")
            continue
        left = [j for j in range(V) if j not in set(chosen)]
        weakest = min(range(len(kids)), key=lambda i: q[chosen[i]])
        if left and max(q[j] for j in left) > q[chosen[weakest]]:
            best = max(left, key=lambda j: q[j])
            c = kids[weakest]
            raise SpecrefError(f"node {slots[c]}: token {chosen[weakest]} (q = {q[chosen[weakest]]}) is a child of "
                               f"node {slots[node]} but token {best} (q = {q[best]}) is more likely and is not: not a "
                               f"top-{len(kids)} tree (tokens[{slots[c]}], q_draft[{slots[node]}])")


def _slot_rows(table, prompt, tokens):
    """``[slots, V]``: each slot's row of a bigram ``table`` (after its token; the root after the prompt;
    zeros at padded slots) -- the q rows of the default user trees."""
    V = table.shape[-1]
    zero = np.array([Fraction(0)] * V, dtype=object)
    return np.stack([table[prompt[-1]] if i == 0 else (zero if t == -1 else table[t]) for i, t in enumerate(tokens)])


def user_tree_cases() -> list[UserTreeCase]:
    """One small user-built tree of each kind (bigram tables of :func:`tree_cases`, V = 3): top-k with and
    without q rows, deterministic with repeated tokens, SGLang links with padded slots, i.i.d. and
    without-replacement trees."""
    p = _frac([["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]])
    q = _frac([["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"]])
    topk = ((-1, 0, 0, 1, 1, 2, 2), (-1, 0, 1, 0, 1, 1, 2))  # draft_tree's (2, 2) top-k tree of q
    repeats = ((-1, 0, 0, 0, 1, 3, 3), (-1, 1, 2, 1, 0, 2, 2))  # token 1 twice under the root, 2 twice under 3
    links = ([0, 1, -1, 0, 1, -1], [1, 4, -1, -1, -1, -1], [-1, 3, -1, -1, -1, -1])  # slots 2 and 5 padded
    iid = ((-1, 0, 0, 0, 1), (-1, 0, 0, 2, 1))  # one draw: token 0 twice under the root
    without = ((-1, 0, 0, 1, 2), (-1, 0, 1, 1, 2))
    return [
        UserTreeCase("topk-with-q", p, *topk, q_draft=_slot_rows(q, (0,), topk[1]), ties="lowest"),
        UserTreeCase("topk-point-mass", p, *topk),
        UserTreeCase("deterministic-repeats", p, *repeats, q_draft=_slot_rows(q, (0,), repeats[1]),
                     drafting="deterministic"),
        UserTreeCase.from_sglang("sglang-padded", p, *links, q_draft=_slot_rows(q, (0,), [-1] + links[0][1:])),
        UserTreeCase("iid", p, *iid, q_draft=_slot_rows(q, (0,), iid[1]), drafting="iid"),
        UserTreeCase("without-replacement", p, *without, q_draft=_slot_rows(q, (0,), without[1]),
                     drafting="without_replacement"),
    ]


def memo_rows(prompt, config=SamplingConfig()):
    """``row(model, path) -> next-token row`` after ``prompt + path``, each computed once."""
    memo: dict = {}

    def row(model, path):
        key = (id(model), tuple(path))
        if key not in memo:
            memo[key] = next_token_probs(model, list(prompt) + list(path), config)
        return memo[key]

    return row


def _read_only(a):
    """A read-only copy of the oracle's rows for one call (None stays None): a view of a read-only
    copy, so the implementation cannot make it writeable again (the copy itself could be)."""
    if a is None:
        return None
    out = np.array(a, copy=True)
    out.flags.writeable = False
    return out.view()


def _twin(tree):
    """The implementation's own copy of a drafted tree: what it does to it never reaches the oracle's."""
    return DraftTree(tree.parents, tree.tokens)


def _check_twin(twin, handed: dict, tree, what: str) -> None:
    """``Misbehaved(WRITES)`` unless the implementation's copy of ``tree`` is as it was handed
    (``handed``: its attributes then): the same ``parents`` and ``tokens`` tuples, no attribute
    added, and shape tables, if it had them built, equal to the tree's (SPEC §12.4).  Runs inside
    the guarded call, before the output is parsed."""
    with foreign(f"{what}'s copy of the tree could not be read back"):
        state = None if type(twin) is not DraftTree else dict(vars(twin))
        tables = None if state is None else state.pop("_shape_tables", None)
        same = (state is not None and state.keys() == handed.keys()
                and all(state[k] is v for k, v in handed.items())
                and (tables is None or _same_tables(tables, tree)))
    if not same:
        raise Misbehaved(WRITES, f"{what} wrote into the tree it was handed (its parents, tokens or shape tables "
                                 f"changed); inputs are shared, copy them before writing")


def _same_tables(tables, tree) -> bool:
    """Whether a copy's cached ``(children, depths)`` are plain lists of ints equal to ``tree``'s."""
    if type(tables) is not tuple or len(tables) != 2 or type(tables[0]) is not list or type(tables[1]) is not list:
        return False
    kids, depths = tables
    if not all(type(k) is list and all(type(c) is int for c in k) for k in kids):
        return False
    return all(type(d) is int for d in depths) and (kids, depths) == tree._tables()


def _snapshot(items: list) -> list:
    """What a list handed over holds, to compare by identity after the call (a list of lists: its rows' items too)."""
    return [(item, tuple(item) if type(item) is list else None) for item in items]


def _unchanged(items, snapshot: list) -> bool:
    """Whether a list handed over still holds the very items it held (never compared by value: a lazy
    coin cannot be compared)."""
    if type(items) is not list or len(items) != len(snapshot):
        return False
    for item, (was, inner) in zip(items, snapshot):
        if item is not was:
            return False
        if inner is not None and (len(item) != len(inner) or any(a is not b for a, b in zip(item, inner))):
            return False
    return True


def _index(v) -> int:
    """An implementation's id as an int: ints, NumPy integers and 0-d integer arrays; not bools or floats."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{v!r} is a bool, not an id")
    return operator.index(v)


def _index_list(seq, limit: int) -> list:
    """An implementation's sequence of ids, read to at most ``limit + 1`` items."""
    if hasattr(seq, "tolist"):
        seq = seq.tolist()
    if isinstance(seq, (str, bytes, dict)) or seq is None:
        raise TypeError(f"{type(seq).__name__} is not a sequence of ids")
    items = list(islice(iter(seq), limit + 1))
    if len(items) > limit:
        raise ValueError(f"more than {limit} entries")
    return [_index(v) for v in items]


def _pair(out):
    """An implementation's ``(a, b)``, read without trusting its iteration."""
    if isinstance(out, (str, bytes, dict)) or out is None:
        raise TypeError(f"{type(out).__name__} is not a pair")
    items = list(islice(iter(out), 3))
    if len(items) != 2:
        raise ValueError(f"{len(items)} items or more, not 2")
    return items


def parse_tree_output(out, tree, V, *, what="tree_step_fn"):
    """``(path, token)`` of a tree implementation's output, checked against the oracle's own ``tree``;
    ``Misbehaved(INVALID)`` for anything else (runs inside the guarded call)."""
    with foreign(f"{what} returned {short_repr(out)}, not (a root-down path, a token)"):
        path, token = _pair(out)
        nodes = _index_list(path, tree.size)
        token = _index(token)
    inner = _inner_padding(nodes)
    if inner is not None:
        raise Misbehaved(INVALID, f"{what} returned {short_repr(out)}: path[{inner[0]}] = -1 but accepted node {inner[1]} "
                                  f"follows it (accept_index[{inner[0] + 1}] of a coin-fed kernel); only trailing -1 "
                                  f"is padding")
    try:
        nodes = tree.check_path(nodes)
    except SpecrefError as e:
        raise Misbehaved(INVALID, f"{what} returned {short_repr(out)}, not (a root-down path, a token): {e}") from None
    if not 0 <= token < V:
        raise Misbehaved(INVALID, f"{what} returned next token {token!r} outside the vocabulary 0..{V - 1}")
    return nodes, token


def tree_program(fn, case, time_limit, *, max_paths: int | None = None):
    """``(program(rng, impl_rng), expected law)`` for one case (the tree level's criterion).

    Each call gets its own copy of the drafted tree and read-only copies of the rows; the output
    is parsed inside the guarded call against the oracle's own tree.  ``max_paths``: the target
    law's budget (its prefixes); over it, SpecrefError (an ``over budget`` status in a case).
    """
    program = _tree_program(fn, case, time_limit)
    target, _ = case.models()
    law_budget = {} if max_paths is None else {"max_paths": max_paths}
    return program, target_law(target, list(case.prompt), SamplingConfig(), case.depth + 1, **law_budget)


def _tree_program(fn, case, time_limit):
    if isinstance(case, UserTreeCase):
        return _user_tree_program(fn, case, time_limit)
    target, draft = case.models()
    V, prompt, depth = case.vocab_size, list(case.prompt), case.depth
    config = SamplingConfig()
    row = memo_rows(prompt, config)

    fixed = None  # a top-k tree takes no coins: drafted once, not on every path
    if case.drafting == "topk":
        fixed = draft_tree(case.widths, lambda path: row(draft, path), case.drafting, None)

    def program(rng, impl_rng):
        tree, q_draft, paths = fixed or draft_tree(case.widths, lambda path: row(draft, path), case.drafting, rng)
        p_target = tree_rows(lambda path: row(target, path), paths)
        q_arg = None if case.drafting == "topk" else q_draft
        return _judged_block(fn, tree, p_target, q_arg, impl_rng, rng, lambda path: row(target, path), V, depth,
                             time_limit)

    return program


def _user_tree_program(fn, case: "UserTreeCase", time_limit):
    """The program of a user-built tree: the tree as given (deterministic drafting) or its shape with
    children redrawn from its q rows (sampled drafting), scored by the target table."""
    target, _ = case.models()
    V, depth, tree, q_rows = case.vocab_size, case.depth, case.tree, case.q_rows
    row = memo_rows(list(case.prompt), SamplingConfig())

    def program(rng, impl_rng):
        drafted = draft_on_shape(tree, q_rows, case.drafting, rng) if case.sampled else tree
        p_target = tree_rows(lambda path: row(target, path), tree_paths(drafted))
        return _judged_block(fn, drafted, p_target, q_rows, impl_rng, rng, lambda path: row(target, path), V, depth,
                             time_limit)

    return program


def _judged_block(fn, tree, p_target, q_arg, impl_rng, rng, target_row, V, depth, time_limit):
    """One guarded call on its own copies of the tree and rows, the copy of the tree checked and its
    output parsed against ``tree``, and the block completed to ``depth + 1`` tokens by target
    sampling (``target_row(path) -> [V]``)."""
    twin = _twin(tree)
    handed = dict(vars(twin))

    def convert(out):
        _check_twin(twin, handed, tree, "tree_step_fn")
        return parse_tree_output(out, tree, V)

    path, token = call(fn, (twin, _read_only(p_target), _read_only(q_arg), impl_rng), {}, time_limit,
                       convert=convert, read_only=True)
    block = [tree.tokens[n] for n in path] + [int(token)]
    while len(block) < depth + 1:
        block.append(draw(rng, target_row(tuple(block))))
    return tuple(block)


def _validate(case):
    if isinstance(case, UserTreeCase):  # its tree and rows were validated on construction
        _check_prompt(case)
        return
    _validate_batch(case)


def _check_prompt(case):
    V = case.vocab_size
    if len(case.prompt) < case.target.ndim - 1:
        raise SpecrefError(f"case {case.name!r}: prompt {case.prompt} is shorter than the tables' context "
                           f"({case.target.ndim - 1} tokens)")
    if max(case.prompt) >= V:
        raise SpecrefError(f"case {case.name!r}: prompt {case.prompt} holds a token outside the vocabulary 0..{V - 1}")


def _validate_batch(case):
    """A :class:`TreeCase` (the ``tree_batch`` level drafts every tree itself)."""
    if not isinstance(case, TreeCase):
        raise SpecrefError(f"tree-level cases must be TreeCase (or, at the tree level, UserTreeCase) objects, "
                           f"got {case!r:.200}")
    target, draft = case.models()  # validates the tables
    V = case.vocab_size
    if case.draft.shape != case.target.shape:
        raise SpecrefError(f"case {case.name!r}: draft table shape {case.draft.shape} != target {case.target.shape}")
    _check_prompt(case)
    if case.drafting == "topk" and max(case.widths) > V:
        raise SpecrefError(f"case {case.name!r}: topk drafting needs widths <= V = {V}, got {case.widths}")
    if case.drafting == "without_replacement":
        support = int((np.asarray(case.draft).reshape(-1, V) > 0).sum(axis=1).min())
        if max(case.widths) > support:
            raise SpecrefError(f"case {case.name!r}: drafting {max(case.widths)} children without replacement "
                               f"needs that many tokens with q > 0 in every draft row; a row has {support}")


def _budget(case, settings, batch: int = 1):
    """The case's target law of ``depth + 1`` tokens, and of ``batch`` blocks (their product), within
    ``settings.max_paths``: SpecrefError naming it (an ``over budget`` status) before any is built."""
    V, depth = case.vocab_size, case.depth
    if _prefixes_over(V, depth, settings.max_paths):
        raise SpecrefError(f"case {case.name!r}: its target law has more prefixes than max_paths={settings.max_paths} "
                           f"(V={V}, {depth + 1} tokens); shrink the case or raise max_paths")
    target, _ = case.models()
    one = target_law(target, list(case.prompt), SamplingConfig(), depth + 1, max_paths=settings.max_paths)
    if batch > 1 and len(one) > 1 and batch * math.log(len(one)) > math.log(settings.max_paths) + 1e-9:
        raise SpecrefError(f"case {case.name!r}: the joint law of {batch} blocks has {len(one)}^{batch} "
                           f"outcomes, over max_paths={settings.max_paths}; shrink the batch or the case, or "
                           f"raise max_paths")
    return one


def _prefixes_over(V: int, depth: int, limit: int) -> bool:
    """Whether ``sum(V ** i for i <= depth)`` passes ``limit``, counted only until it does (a deep
    tree's sum has thousands of digits: never formed, never printed)."""
    total, level = 0, 1
    for _ in range(depth + 1):
        total += level
        if total > limit:
            return True
        level *= V
    return False


def _run(spec, fn, cases, settings):
    """Each case enumerated (exact) or sampled and G-tested (statistical), through the one runner;
    the target law is built inside the case, within its budget."""
    return run_cases(spec, cases, settings, validate=_validate, fn=fn,
                     exact=lambda case: partial(_tree_exact, fn, case, settings),
                     statistical=lambda case, seed: partial(_tree_sampled, fn, case, settings, seed))


def _tree_exact(fn, case, settings):
    expected = _budget(case, settings)
    program = _tree_program(fn, case, settings.time_limit)
    return exact_verdict(case, lambda rng: program(rng, rng), expected, settings)


def _tree_sampled(fn, case, settings, seed):
    run_case = case.as_float()
    expected = _budget(run_case, settings)
    recipe = partial(_statistical_program, fn, run_case, settings.time_limit)  # rebuilt where a shard runs
    return sampled_verdict(case, recipe, expected, settings, seed)


def _statistical_program(fn, case, time_limit):
    """The case's program, built where a shard runs.  The implementation gets a generator of its own,
    seeded from the sample's seed: the oracle's generator (drafts, completions) stays the oracle's."""
    program = _tree_program(fn, case, time_limit)
    return lambda rng, impl_seed: program(rng, np.random.default_rng(impl_seed))


# ---------------------------------------------------------------- coins as arguments


def from_coins(kernel):
    """A ``tree_step_fn`` from an SGLang-style kernel that takes its coins as arguments.

    ``kernel(candidates [N], retrive_next_token [N], retrive_next_sibling [N],
    uniform_samples [N], uniform_final, target_probs [N, V]) -> (accept_index, next_token)``,
    where ``accept_index`` lists the root (0) and then the accepted nodes, padded with
    -1.  Only trailing -1 is padding: the path handed on keeps a -1 that an accepted node
    follows, which :func:`parse_tree_output` makes ``invalid output`` naming its position.
    The coins are drawn from ``rng`` -- lazy uniforms in exact mode, so the kernel
    may only compare them with thresholds; coins it never reads open no branch.
    """

    def tree_step_fn(tree, p_target, q_draft, rng):
        candidates, first, sibling = to_sglang(tree, root_token=0)
        coins = [rng.random() for _ in range(tree.size)]
        final = rng.random()
        accept_index, token = kernel(candidates, first, sibling, coins, final, p_target)
        accept_index = [int(i) for i in accept_index]
        if not accept_index or accept_index[0] != 0:
            raise SpecrefError(f"accept_index must start with the root 0, got {accept_index}")
        return _unpadded(accept_index)[1:], int(token)

    tree_step_fn.__name__ = f"from_coins({getattr(kernel, '__name__', 'kernel')})"
    return tree_step_fn


def _unpadded(accept_index: list) -> list:
    """``accept_index`` without its trailing -1 padding (a -1 before an accepted node stays)."""
    end = len(accept_index)
    while end > 0 and accept_index[end - 1] == -1:
        end -= 1
    return accept_index[:end]


def _inner_padding(nodes: list):
    """``(position, node)``: the first -1 in ``nodes`` that an accepted node follows, and the last
    such node; None when every -1 trails."""
    inner = _unpadded(nodes)
    return (inner.index(-1), inner[-1]) if -1 in inner else None


def sglang_style_kernel(candidates, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_final,
                        target_probs, *, scratch=None, check_distinct=True):
    """A reference kernel in the shape of SGLang's target-only tree sampler (thresholds 1, 1).

    At node ``cur`` with coin ``u = uniform_samples[cur]``: walk the children (first
    child, then next siblings) keeping a running sum of their target probabilities and
    accept the first child whose running sum exceeds ``u`` (so child ``i`` is accepted
    exactly when ``u`` falls in its bucket, probability ``p(x_i)``); a rejected child's
    target probability is written to ``scratch[cur, x]``.  On stopping, the next token
    is drawn by inverse CDF with ``uniform_final`` from ``max(target_probs[cur] -
    scratch[cur], 0)`` -- the target with the tried siblings removed, or the fresh
    target at an accepted leaf (nothing tried there).  ``scratch`` must be zeros
    (default); children must be distinct.
    """
    N = len(candidates)
    p = target_probs
    if check_distinct:
        for node in range(N):
            c, seen = retrive_next_token[node], set()
            while c != -1:
                if candidates[c] in seen:
                    raise SpecrefError(f"node {node}: two children carry token {candidates[c]}; distinct children needed")
                seen.add(candidates[c])
                c = retrive_next_sibling[c]
    if scratch is None:
        scratch = np.zeros_like(p) if not is_exact(p) else np.full(p.shape, Fraction(0), dtype=object)
    accept, cur = [0], 0
    while True:
        u, runsum, child, chosen = uniform_samples[cur], 0, retrive_next_token[cur], -1
        while child != -1:
            x = candidates[child]
            runsum = runsum + p[cur, x]
            if u < runsum:
                chosen = child
                break
            scratch[cur, x] = p[cur, x]
            child = retrive_next_sibling[child]
        if chosen == -1:
            break
        accept.append(chosen)
        cur = chosen
    residual = np.maximum(p[cur] - scratch[cur], 0 * p[cur])
    total, cum = residual.sum(), 0
    token = max(j for j in range(len(residual)) if residual[j] > 0)  # fallback: last positive entry
    for j, w in enumerate(residual.tolist()):
        cum = cum + w
        if w > 0 and uniform_final < cum / total:
            token = j
            break
    return accept, token


# ---------------------------------------------------------------- dense batches [B, N]


def batched_reference_kernel(candidates, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_final,
                             target_probs):
    """:func:`sglang_style_kernel` row by row over a dense batch: ``[B, N]`` links and coins,
    ``[B]`` final coins, ``[B, N, V]`` rows -> ``(accept_index [B, depth + 1] padded with -1, next tokens [B])``."""
    rows = [sglang_style_kernel(candidates[b], retrive_next_token[b], retrive_next_sibling[b], uniform_samples[b],
                                uniform_final[b], target_probs[b]) for b in range(len(candidates))]
    width = max(len(a) for a, _ in rows)
    return [a + [-1] * (width - len(a)) for a, _ in rows], [t for _, t in rows]


def tree_batch_program(kernel, case: TreeCase, batch: int, time_limit, *, max_paths: int | None = None):
    """``(program(rng), expected law)``: ``batch`` independent trees of one case in one kernel call.

    ``kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N],
    uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) -> (accept_index [B, S], next_tokens [B])``.
    Each row's block is completed to ``depth + 1`` tokens; the joint law of the B blocks must be
    the product of the target laws (rows independent), so coupling across rows (a coin shared by
    two rows, say) is a nonzero TV.  Each call gets fresh links and coins and read-only rows; its
    output is parsed inside the guarded call against the oracle's own trees.  ``max_paths``: the
    budget of the target law and of the joint law (SpecrefError over it).
    """
    program = _tree_batch_program(kernel, case, batch, time_limit)
    one = _budget(case, _Budget(max_paths), batch) if max_paths is not None else target_law(
        case.models()[0], list(case.prompt), SamplingConfig(), case.depth + 1)
    return program, _product(one, batch)


class _Budget:  # the one field of Settings that _budget reads
    def __init__(self, max_paths):
        self.max_paths = max_paths


def _product(one, batch):
    """The law of ``batch`` independent blocks of law ``one``."""
    expected = {(): Fraction(1)}
    for _ in range(batch):
        expected = {k + (o,): w * v for k, w in expected.items() for o, v in one.items()}
    return expected


def parse_tree_batch_output(out, trees, V, *, what="kernel"):
    """Each row's ``(path, token)`` of a dense-batch kernel's ``(accept_index [B, S], next_tokens [B])``,
    checked against the oracle's own trees; ``Misbehaved(INVALID)`` naming the row otherwise."""
    batch = len(trees)
    with foreign(f"{what} returned {short_repr(out)}, not (accept_index [B, S], next_tokens [B])"):
        accept_index, tokens = _pair(out)
        if hasattr(accept_index, "tolist"):
            accept_index = accept_index.tolist()
        rows = _index_rows(accept_index, batch, max(t.size for t in trees) + 1)
        tokens = _index_list(tokens, batch)
    if len(tokens) != batch:
        raise Misbehaved(INVALID, f"{what} returned {len(tokens)} next tokens for a batch of {batch}: {short_repr(out)}")
    parsed = []
    for b, (accept, token) in enumerate(zip(rows, tokens)):
        inner = _inner_padding(accept)
        if inner is not None:
            raise Misbehaved(INVALID, f"{what} returned row {b}: accept_index[{b}][{inner[0]}] = -1 but accepted node "
                                      f"{inner[1]} follows it; only trailing -1 is padding: {short_repr(out)}")
        try:
            path = trees[b].check_path(_unpadded(accept)[1:])
        except SpecrefError as e:
            raise Misbehaved(INVALID, f"{what} returned row {b}: {e}: {short_repr(out)}") from None
        if not 0 <= token < V:
            raise Misbehaved(INVALID, f"{what} returned row {b}: next token {token} outside the vocabulary 0..{V - 1}")
        parsed.append((path, token))
    return parsed


def _index_rows(rows, batch, limit):
    """``batch`` rows of ids from an implementation's ``[B, S]`` (a list of lists, an array)."""
    if isinstance(rows, (str, bytes, dict)) or rows is None:
        raise TypeError(f"{type(rows).__name__} is not a [B, S] table of ids")
    got = list(islice(iter(rows), batch + 1))
    if len(got) != batch:
        raise ValueError(f"{len(got)} rows{' or more' if len(got) > batch else ''} for a batch of {batch}")
    return [_index_list(r, limit) for r in got]


def _tree_batch_program(kernel, case: TreeCase, batch: int, time_limit):
    target, draft = case.models()
    prompt, V, depth = list(case.prompt), case.vocab_size, case.depth
    config = SamplingConfig()
    row = memo_rows(prompt, config)

    def program(rng):
        trees, p_rows = [], []
        for _ in range(batch):
            tree, _, paths = draft_tree(case.widths, lambda path: row(draft, path), case.drafting, rng)
            trees.append(tree)
            p_rows.append(tree_rows(lambda path: row(target, path), paths))
        links = [to_sglang(t, root_token=0) for t in trees]
        coins = [[rng.random() for _ in range(trees[0].size)] for _ in range(batch)]
        finals = [rng.random() for _ in range(batch)]
        handed = ([c for c, _, _ in links], [f for _, f, _ in links], [s for _, _, s in links], coins, finals)
        kept = [_snapshot(a) for a in handed]

        def convert(out):
            if not all(_unchanged(a, k) for a, k in zip(handed, kept)):
                raise Misbehaved(WRITES, "the kernel wrote into the links or coins it was handed; inputs are shared, "
                                         "copy them before writing")
            return parse_tree_batch_output(out, trees, V)

        parsed = call(kernel, handed + (_read_only(np.stack(p_rows)),), {}, time_limit, convert=convert,
                      read_only=True)
        blocks = []
        for b, (path, token) in enumerate(parsed):
            block = [trees[b].tokens[n] for n in path] + [token]
            while len(block) < depth + 1:
                block.append(draw(rng, row(target, tuple(block))))
            blocks.append(tuple(block))
        return tuple(blocks)

    return program


def _batch_recipe(kernel, case, batch, time_limit):
    """The batch program, built where a shard runs: the kernel's coins are the shard's floats."""
    program = _tree_batch_program(kernel, case, batch, time_limit)
    return lambda rng, impl_seed: program(rng)


def run_tree_batch(spec: Level, kernel, cases, settings):
    """The ``tree_batch`` level: exact (coins as lazy uniforms) or statistical, through the one runner,
    with the level's ``batch`` trees per call (:data:`TREES_PER_CALL`); the joint law is built inside
    the case, within ``max_paths`` (else ``over budget``)."""
    batch = check_positive_int("batch", spec.option("batch"))
    return run_cases(spec, cases, settings, validate=_validate_batch, fn=kernel,
                     exact=lambda case: partial(_batch_exact, kernel, case, batch, settings),
                     statistical=lambda case, seed: partial(_batch_sampled, kernel, case, batch, settings, seed))


def _batch_exact(kernel, case, batch, settings):
    expected = _product(_budget(case, settings, batch), batch)
    return exact_verdict(case, _tree_batch_program(kernel, case, batch, settings.time_limit), expected, settings)


def _batch_sampled(kernel, case, batch, settings, seed):
    run_case = case.as_float()
    expected = _product(_budget(run_case, settings, batch), batch)
    recipe = partial(_batch_recipe, kernel, run_case, batch, settings.time_limit)
    return sampled_verdict(case, recipe, expected, settings, seed)


def _plan_tree(level: Level, fn, case, settings, seed: int) -> CasePlan:
    """A statistical tree check: N over the case's target law, one block per call."""
    run_case = case.as_float()
    return program_plan(_budget(run_case, settings), partial(_statistical_program, fn, run_case, settings.time_limit),
                        settings, seed)


def _plan_tree_batch(level: Level, kernel, case, settings, seed: int) -> CasePlan:
    """A statistical ``tree_batch`` check: N over the joint law of the level's ``batch`` blocks, one call each."""
    batch, run_case = level.option("batch"), case.as_float()
    return program_plan(_product(_budget(run_case, settings, batch), batch),
                        partial(_batch_recipe, kernel, run_case, batch, settings.time_limit), settings, seed)


def _positive_trees(batch) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecrefError(f"batch must be a positive integer, got {batch!r}")
    return batch


DRAFTING = Option("drafting", f"the default cases' drafting scheme, one of {SCHEMES}", default="topk",
                  cases=tree_cases)
"""``drafting``: the default tree cases drafted so (:func:`tree_cases`); cases handed in keep their own."""
TREES_PER_CALL = Option("batch", "trees per call", phrase="batch (trees per call) applies", default=2,
                        check=_positive_trees)
"""``batch=B``: the ``tree_batch`` kernel gets ``B`` independent trees of a case per call."""

LEVELS = (
    Level("tree", "tree_step_fn(tree, p_target [N, V], q_draft [N, V] | None, rng) -> (path, next_token)",
          tree_cases, _run, validate=lambda level, case, settings: _validate(case),
          reference=fixed_reference(from_coins(sglang_style_kernel)), planner=_plan_tree, options=(DRAFTING,),
          shorthand="check_tree"),
    Level("tree_batch", "kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N], "
                        "uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) "
                        "-> (accept_index [B, S], next_tokens [B])", tree_cases, run_tree_batch,
          validate=lambda level, case, settings: _validate_batch(case),
          reference=fixed_reference(batched_reference_kernel), planner=_plan_tree_batch, options=(TREES_PER_CALL,),
          shorthand="check_tree_batch"),
)
"""The tree level, and dense batches of trees (B = 2 by default; ``check("tree_batch", kernel, batch=B)``)."""
