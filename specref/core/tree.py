"""Draft trees as data: a parent-index array, a token per node, and per-node rows.

Node 0 is the root: the last committed context (its token is not a draft and is
stored as -1).  Nodes ``1..N-1`` are draft tokens; ``parents[i]`` is the node whose
context token ``i`` continues, and ``parents[i] < i`` (a parent comes before its
children, as in every engine's layout).  A root-to-node path spells a candidate
continuation.

The rows that travel with a tree (one target call scores every node):

- ``p_target [N, V]``: row ``i`` is the target distribution of the token *after*
  node ``i``'s context.  It judges node ``i``'s children, and when node ``i`` is an
  accepted leaf it is the bonus row.
- ``q_draft [N, V]`` or ``None``: row ``i`` is the draft distribution node ``i``'s
  children were drawn from.  ``None`` means point-mass drafts (children chosen
  deterministically, e.g. top-k, as EAGLE-2/3 and SGLang deploy them).  A leaf's
  draft row is never read but must still be a distribution.

Layouts engines use, with converters both ways:

- SGLang: ``candidates [N]`` (token per node, node 0 the root) and first-child /
  next-sibling links ``retrive_next_token [N]``, ``retrive_next_sibling [N]``
  (-1 = none) -- :func:`from_sglang`, :func:`to_sglang`;
- EAGLE: a choice list such as ``[[0], [1], [0, 0]]``: each node is the path of
  child ranks (0 = the draft's most likely token) from the root, every prefix of a
  choice is itself a choice -- :func:`from_eagle_choices`, :func:`to_eagle_choices`.

Padded layouts (engines allocate a fixed number of slots): a slot ``i > 0`` whose parent
and token are both -1 is padding, not a node.  :func:`from_padded` drops such slots and
numbers the nodes left in slot order; :func:`sglang_slots` reads SGLang's links into that
layout (a slot no link reaches and whose candidate is -1 is padding).

Malformed input raises :class:`~specref.core.errors.SpecrefError` naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError, check_prob_rows
from specref.core.numbers import is_exact

__all__ = [
    "DraftTree",
    "ROOT",
    "check_tree_rows",
    "from_sglang",
    "to_sglang",
    "from_padded",
    "sglang_slots",
    "from_eagle_choices",
    "to_eagle_choices",
    "chain_tree",
]

ROOT = 0  # the root node: the committed context, no draft token


@dataclass(frozen=True)
class DraftTree:
    """A draft tree: ``parents[i]`` and ``tokens[i]`` per node; node 0 is the root.

    ``parents[0] == -1`` and ``tokens[0] == -1``; for ``i >= 1``, ``0 <= parents[i] < i``
    and ``tokens[i] >= 0``.  Validated on construction (cycles, a parent after its
    child, out-of-range parents, negative tokens) in O(N); the shape queries
    (:meth:`children`, :meth:`depth`, :meth:`is_chain`) read tables built once, in O(N).
    """

    parents: tuple
    tokens: tuple

    def __post_init__(self):
        parents = _ints("parents", self.parents)
        tokens = _ints("tokens", self.tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        n = len(parents)
        if n < 1:
            raise SpecrefError("a draft tree needs at least the root node 0, got parents=()")
        if len(tokens) != n:
            raise SpecrefError(f"tokens must hold one token per node (parents has {n} nodes), got {len(tokens)}")
        if parents[0] != -1:
            raise SpecrefError(f"node 0 is the root and must have parent -1, got parents[0] = {parents[0]}")
        if tokens[0] != -1:
            raise SpecrefError(f"node 0 is the root (no draft token) and must have token -1, got tokens[0] = {tokens[0]}")
        for i in range(1, n):
            if not 0 <= parents[i] < n:
                raise SpecrefError(f"node {i}: parent {parents[i]} is not a node of this {n}-node tree (parents[{i}])")
            if tokens[i] < 0:
                raise SpecrefError(f"node {i}: token {tokens[i]} is negative (tokens[{i}])")
        if any(parents[i] >= i for i in range(1, n)):  # else no cycle is possible: skip the walk
            _check_no_cycle(parents)
            i = next(i for i in range(1, n) if parents[i] >= i)
            raise SpecrefError(f"node {i}: its parent {parents[i]} comes after it; parents must precede children "
                               f"(parents[{i}])")

    def _tables(self):
        """``(children lists, depths)``, built once (O(N)): parents precede children."""
        tables = self.__dict__.get("_shape_tables")
        if tables is None:
            n = self.size
            kids = [[] for _ in range(n)]
            depths = [0] * n
            for i in range(1, n):
                kids[self.parents[i]].append(i)
                depths[i] = depths[self.parents[i]] + 1
            tables = (kids, depths)
            object.__setattr__(self, "_shape_tables", tables)
        return tables

    # -- shape -------------------------------------------------------------

    @property
    def size(self) -> int:
        """N: nodes including the root."""
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        """The children of ``node``, in node order (the order siblings are tried)."""
        return list(self._tables()[0][node])

    def path(self, node: int) -> list[int]:
        """The non-root nodes from the root down to ``node`` (``[]`` for the root)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def depth(self, node: int | None = None) -> int:
        """The depth of ``node`` (root 0), or of the deepest node when ``node`` is None."""
        depths = self._tables()[1]
        return max(depths) if node is None else depths[node]

    def is_chain(self) -> bool:
        return all(len(kids) <= 1 for kids in self._tables()[0])

    def check_distinct_children(self, what: str = "this algorithm") -> None:
        """SpecrefError naming the node when two children of one node carry the same token."""
        for node, kids in enumerate(self._tables()[0]):
            seen: dict[int, int] = {}
            for c in kids:
                t = self.tokens[c]
                if t in seen:
                    raise SpecrefError(
                        f"node {node}: children {seen[t]} and {c} both carry token {t}; {what} needs distinct children"
                    )
                seen[t] = c

    def check_path(self, path) -> list[int]:
        """``path`` as a list of nodes, each a child of the one before (the first a child of the root)."""
        out, at = [], ROOT
        for i, node in enumerate(_ints("path", path)):
            if not 0 < node < self.size or self.parents[node] != at:
                raise SpecrefError(f"path[{i}] = {node} is not a child of node {at}: path {list(path)}")
            out.append(node)
            at = node
        return out


def _check_no_cycle(parents) -> None:
    """SpecrefError naming the first node (and a node on the cycle) whose parent links never reach
    the root, in O(N): each walk stops at a node already known to reach it."""
    state = [0] * len(parents)  # 0: unknown, 1: on the walk in progress, 2: reaches the root
    state[0] = 2
    for i in range(1, len(parents)):
        walk, j = [], i
        while state[j] == 0:
            state[j] = 1
            walk.append(j)
            j = parents[j]
        if state[j] == 1:
            raise SpecrefError(f"node {i}: its parent links form a cycle through node {j} (parents)")
        for w in walk:
            state[w] = 2


def _ints(name, values) -> tuple:
    try:
        seq = list(values.tolist() if hasattr(values, "tolist") else values)
    except TypeError:
        raise SpecrefError(f"{name} must be a sequence of ints, got {values!r}") from None
    for i, v in enumerate(seq):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise SpecrefError(f"{name}[{i}] must be an int, got {v!r}")
    return tuple(int(v) for v in seq)


def chain_tree(tokens) -> DraftTree:
    """A chain: node ``i`` is the child of node ``i - 1`` and carries ``tokens[i - 1]``."""
    tokens = _ints("tokens", tokens)
    return DraftTree(tuple(range(-1, len(tokens))), (-1,) + tokens)


def check_tree_rows(tree: DraftTree, p_target, q_draft=None):
    """Validated host rows ``(p_target [N, V], q_draft [N, V] or None)`` for ``tree``.

    Every row must be a distribution; tokens must lie in the vocabulary; with real
    drafts, ``q_draft[parent, token] > 0`` at every node (else the draft cannot have
    proposed it), and both sides must be of one kind (Fraction or float).
    """
    if not isinstance(tree, DraftTree):
        raise SpecrefError(f"tree must be a DraftTree, got {type(tree).__name__}")
    p_target = to_numpy(p_target)
    n = tree.size
    if getattr(p_target, "ndim", None) != 2 or p_target.shape[0] != n:
        raise SpecrefError(f"p_target must have shape [N, V] with one row per node (N = {n}), "
                           f"got {getattr(p_target, 'shape', type(p_target).__name__)}")
    p_target = _checked_rows("p_target", p_target)  # float32/float16 rows come back renormalised in float64
    V = p_target.shape[1]
    for i in range(1, n):
        if tree.tokens[i] >= V:
            raise SpecrefError(f"node {i}: token {tree.tokens[i]} is out of range for vocabulary size {V}")
    if not is_exact(p_target):
        p_target = p_target.astype(np.float64)
    if q_draft is None:
        return p_target, None
    q_draft = to_numpy(q_draft)
    if getattr(q_draft, "ndim", None) != 2 or q_draft.shape != (n, V):
        raise SpecrefError(f"q_draft must have shape [N, V] = [{n}, {V}] (one row per node), "
                           f"got {getattr(q_draft, 'shape', type(q_draft).__name__)}")
    if is_exact(p_target) != is_exact(q_draft):
        raise SpecrefError("p_target and q_draft must both be Fraction (object) rows or both float rows")
    q_draft = _checked_rows("q_draft", q_draft)
    for i in range(1, n):
        a, x = tree.parents[i], tree.tokens[i]
        if q_draft[a, x] == 0:
            raise SpecrefError(f"node {i}: token {x} has q_draft[{a}, {x}] = 0 at its parent {a}: "
                               f"the draft cannot have proposed it")
    if not is_exact(q_draft):
        q_draft = q_draft.astype(np.float64)
    return p_target, q_draft


_VALID_EXACT_ROWS: dict = {}  # Fraction rows already validated, by content: the enumerator hands the same rows
_MAX_VALID_ROWS = 100_000  # on every path, and summing Fractions is most of an exact tree check's time


def _checked_rows(name, rows):
    """:func:`~specref.core.errors.check_prob_rows`, each distinct Fraction row validated once.

    A row counts as seen only if it holds Fractions and ints alone (a float equal to a Fraction
    hashes alike): anything else, or any row not seen, validates the whole table again, so an
    error names the same row it always did."""
    if not is_exact(rows):
        return check_prob_rows(name, rows)
    keys = [tuple(row) for row in rows.reshape(-1, rows.shape[-1]).tolist()] if rows.ndim == 2 else None
    if keys is not None and all(k in _VALID_EXACT_ROWS for k in keys) and \
            all(type(v) in (Fraction, int) for k in keys for v in k):
        return rows
    rows = check_prob_rows(name, rows)
    if keys is not None:
        if len(_VALID_EXACT_ROWS) > _MAX_VALID_ROWS:
            _VALID_EXACT_ROWS.clear()
        _VALID_EXACT_ROWS.update(dict.fromkeys(keys))
    return rows


# ---------------------------------------------------------------- SGLang links


def from_sglang(candidates, retrive_next_token, retrive_next_sibling) -> DraftTree:
    """A tree from SGLang's layout: tokens per node and first-child / next-sibling links.

    ``candidates[0]`` is the root's (committed) token and is dropped; every node must
    be reached from the root exactly once, and a node's children are its first child
    followed by the next-sibling chain (the order they are tried).
    """
    parents, tokens = _sglang_walk(candidates, retrive_next_token, retrive_next_sibling, padding=False)
    return DraftTree(parents, tokens)


def sglang_slots(candidates, retrive_next_token, retrive_next_sibling) -> tuple[tuple, tuple]:
    """``(parents, tokens)`` per slot from SGLang's links, -1 padding kept (for :func:`from_padded`).

    A slot that no link reaches and whose candidate is -1 is padding; one that no link reaches
    but carries a token is an error naming it, as in :func:`from_sglang`.
    """
    return _sglang_walk(candidates, retrive_next_token, retrive_next_sibling, padding=True)


def _sglang_walk(candidates, retrive_next_token, retrive_next_sibling, *, padding: bool):
    """``(parents, tokens)`` per slot, reached from the root through the links (see :func:`from_sglang`)."""
    tokens = _ints("candidates", candidates)
    first = _ints("retrive_next_token", retrive_next_token)
    sibling = _ints("retrive_next_sibling", retrive_next_sibling)
    n = len(tokens)
    if len(first) != n or len(sibling) != n:
        raise SpecrefError(f"candidates, retrive_next_token and retrive_next_sibling must have one entry per node, "
                           f"got {n}, {len(first)}, {len(sibling)}")
    if n < 1:
        raise SpecrefError("a draft tree needs at least the root node 0, got candidates=()")
    parents: list[int | None] = [None] * n
    parents[0] = -1
    stack = [0]
    while stack:
        node = stack.pop()
        c = first[node]
        while c != -1:
            if not 0 < c < n:
                raise SpecrefError(f"node {node}: link to {c} is not a non-root node of this {n}-node tree")
            if parents[c] is not None:
                raise SpecrefError(f"node {c} is reached twice (again from node {node}): the links form a cycle or a DAG")
            parents[c] = node
            stack.append(c)
            c = sibling[c]
    for i in range(n):
        if parents[i] is None:
            if not padding or tokens[i] != -1:
                raise SpecrefError(f"node {i} is not reachable from the root through the links"
                                   + (f" and carries token {tokens[i]} (candidates[{i}]): padding is -1" if padding
                                      else ""))
            parents[i] = -1
    return tuple(parents), (-1,) + tokens[1:]


def from_padded(parents, tokens) -> tuple[DraftTree, tuple]:
    """``(tree, slots)``: the tree of a padded layout and the slot of each of its nodes.

    A slot ``i > 0`` with ``parents[i] == tokens[i] == -1`` is padding; the other slots are
    nodes, numbered in slot order (``slots[j]`` is node ``j``'s slot).  The layout is
    validated in slot numbers -- cycles, a parent after its child, out-of-range parents,
    negative tokens (:class:`DraftTree`'s checks), a parent that is a padded slot, half a
    padding marker -- each error naming the slot and the field.
    """
    parents, tokens = _ints("parents", parents), _ints("tokens", tokens)
    if len(tokens) != len(parents):
        raise SpecrefError(f"tokens must hold one token per slot (parents has {len(parents)} slots), "
                           f"got {len(tokens)}")
    pad = [i > 0 and parents[i] == -1 and tokens[i] == -1 for i in range(len(parents))]
    for i in range(1, len(parents)):
        if not pad[i] and tokens[i] == -1:
            raise SpecrefError(f"node {i}: tokens[{i}] = -1 marks padding but parents[{i}] = {parents[i]}: "
                               f"a padded slot has both -1")
        if not pad[i] and parents[i] == -1:
            raise SpecrefError(f"node {i}: parents[{i}] = -1 but tokens[{i}] = {tokens[i]}: only the root has no "
                               f"parent; a padded slot has both -1")
    # DraftTree's checks in slot numbers: a padded slot stands in as a leaf under the root
    DraftTree(tuple(0 if pad[i] else parents[i] for i in range(len(parents))),
              tuple(0 if pad[i] else tokens[i] for i in range(len(tokens))))
    for i in range(1, len(parents)):
        if not pad[i] and pad[parents[i]]:
            raise SpecrefError(f"node {i}: its parent {parents[i]} is a padded slot, not a node (parents[{i}])")
    slots = tuple(i for i in range(len(parents)) if not pad[i])
    index = {s: j for j, s in enumerate(slots)}
    tree = DraftTree(tuple(-1 if s == 0 else index[parents[s]] for s in slots), tuple(tokens[s] for s in slots))
    return tree, slots


def to_sglang(tree: DraftTree, root_token: int = -1):
    """``(candidates [N], retrive_next_token [N], retrive_next_sibling [N])`` lists, -1 = none."""
    n = tree.size
    first, sibling = [-1] * n, [-1] * n
    for node, kids in enumerate(tree._tables()[0]):
        if kids:
            first[node] = kids[0]
            for a, b in zip(kids, kids[1:]):
                sibling[a] = b
    return [root_token] + list(tree.tokens[1:]), first, sibling


# ---------------------------------------------------------------- EAGLE choices


def from_eagle_choices(choices):
    """``(parents, ranks)`` from an EAGLE choice list, nodes sorted by (depth, path) as EAGLE sorts them.

    ``ranks[i]`` is node ``i``'s child rank (its token is the draft's ``ranks[i]``-th most
    likely token at its parent); ``ranks[0] = -1``.  Every prefix of a choice must be a
    choice, and no choice may appear twice.
    """
    paths = []
    for i, c in enumerate(choices):
        path = _ints(f"choices[{i}]", c)
        if not path or min(path) < 0:
            raise SpecrefError(f"choices[{i}] = {list(c)!r} must be a non-empty list of child ranks >= 0")
        paths.append(path)
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise SpecrefError(f"choice {list(dup)} appears twice: duplicate children")
    order = sorted(paths, key=lambda p: (len(p), p))
    index = {(): 0}
    for j, p in enumerate(order, 1):
        index[p] = j
    parents, ranks = [-1], [-1]
    for p in order:
        if p[:-1] not in index:
            raise SpecrefError(f"choice {list(p)} has no parent: its prefix {list(p[:-1])} is not a choice")
        parents.append(index[p[:-1]])
        ranks.append(p[-1])
    return tuple(parents), tuple(ranks)


def to_eagle_choices(parents, ranks) -> list[list[int]]:
    """The EAGLE choice list of a tree shape given each node's child rank."""
    parents, ranks = _ints("parents", parents), _ints("ranks", ranks)
    DraftTree(parents, (-1,) + (0,) * (len(parents) - 1))  # validates the shape
    out = []
    for i in range(1, len(parents)):
        path, j = [], i
        while j != 0:
            path.append(ranks[j])
            j = parents[j]
        out.append(path[::-1])
    return out
