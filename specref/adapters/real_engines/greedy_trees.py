"""A greedy tree kernel in SGLang's dense-batch call, checked two ways: deterministically against
the argmax path (:func:`check_greedy_tree`), and as a ``tree`` level step on one-hot targets
(:func:`greedy_tree_step`, exact mode).

The call is sglang 0.5.23's ``verify_tree_greedy_triton`` (the links of
:func:`specref.core.tree.to_sglang`); the kernel is any callable in that call, such as
:func:`specref.adapters.real_engines.sglang.sglang_greedy_tree_engine`.  Nothing here loads a wheel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specref.core.tree import DraftTree, to_sglang


def greedy_tree_step(kernel):
    """A greedy dense-batch kernel as a ``tree`` level ``tree_step_fn`` (B = 1).

    ``target_predict`` is the argmax of each node's ``p_target`` row (ties to the lowest id, as
    ``torch.argmax``).  Greedy verification emits the argmax path, which has the target's law
    exactly when every target row is one-hot: check it with one-hot target tables (exact mode).
    """

    def tree_step_fn(tree, p_target, q_draft, rng):
        cand, first, sibling = to_sglang(tree, root_token=0)
        predict = [int(np.argmax(np.asarray(row))) for row in p_target]
        ai, num, pr = kernel([cand], [first], [sibling], [predict], tree.depth())
        path = [int(i) for i in ai[0, 1:int(num[0]) + 1]]
        return path, int(pr[ai[0, int(num[0])]])

    tree_step_fn.__name__ = f"greedy_tree_step({getattr(kernel, '__name__', 'kernel')})"
    return tree_step_fn


@dataclass
class GreedyTreeReport:
    """The outcome of :func:`check_greedy_tree`: every batch compared with the argmax path."""

    ok: bool
    trees: int
    batches: int
    accepted: dict = field(default_factory=dict)  # accepted drafts -> trees
    mismatches: list = field(default_factory=list)  # (batch, row, what, got, expected, tree)

    def __str__(self):
        head = (f"greedy tree check: {'matches the argmax path' if self.ok else 'DIFFERS from the argmax path'} on "
                f"{self.trees} trees in {self.batches} dense batches; accepted drafts -> trees: "
                f"{dict(sorted(self.accepted.items()))}")
        return head + "".join(f"\n  batch {m[0]} row {m[1]}: {m[2]}: got {m[3]}, expected {m[4]}; tree {m[5]}"
                              for m in self.mismatches[:5])


def _random_tree(rng, N: int, V: int, max_children: int) -> DraftTree:
    """A random tree of N nodes with distinct children per node (parents precede children)."""
    used: dict[int, set[int]]  # node -> its children's tokens
    parents, tokens, used = [-1], [-1], {0: set()}
    for i in range(1, N):
        while True:
            par = int(rng.integers(i))
            if len(used[par]) < min(max_children, V):
                break
        tok = int(rng.choice([t for t in range(V) if t not in used[par]]))
        used[par].add(tok)
        used[i] = set()
        parents.append(par)
        tokens.append(tok)
    return DraftTree(tuple(parents), tuple(tokens))


def _argmax_path(tree: DraftTree, predict) -> tuple[list, list]:
    """The greedy rule: from the root, follow the child carrying the target's argmax; then the argmax."""
    path, cur = [], 0
    while True:
        nxt = [c for c in tree.children(cur) if tree.tokens[c] == predict[cur]]
        if not nxt:
            break
        cur = nxt[0]
        path.append(cur)
    return path, [tree.tokens[n] for n in path] + [int(predict[cur])]


def check_greedy_tree(kernel, *, batches: int = 6, batch: int = 3, nodes=(1, 2, 4, 7, 10), V: int = 6,
                      match: float = 0.75, seed: int = 0) -> GreedyTreeReport:
    """Deterministic check of a dense-batch greedy tree kernel against the argmax path.

    For each of ``batches`` dense batches (``batch`` trees of the same node count, cycling
    through ``nodes``): random trees with distinct children per node over ``V`` tokens; random
    float32 target logits per node, where with probability ``match`` one child's token gets the
    row's largest logit (so paths run deep); ``target_predict = argmax`` per node.  Ties: the
    logits are continuous draws, so a tie has probability 0; were there one, argmax takes the
    lowest id (``np.argmax`` and ``torch.argmax`` alike), and the kernel and the reference read
    the same ``target_predict``.  Compared per row: the accepted nodes (``accept_index``, the
    root's index first), ``accept_token_num``, and the emitted block
    ``predicts[accept_index[:n + 1]]`` = the accepted tokens and the argmax after the last one.
    """
    rng = np.random.default_rng(seed)
    report = GreedyTreeReport(ok=True, trees=0, batches=0)
    for j in range(batches):
        N = nodes[j % len(nodes)]
        trees = [_random_tree(rng, N, V, max_children=3) for _ in range(batch)]
        depth = max(t.depth() for t in trees)
        logits = rng.standard_normal((batch, N, V)).astype(np.float32)
        for b, t in enumerate(trees):
            for i in range(N):
                kids = t.children(i)
                if kids and rng.random() < match:
                    logits[b, i, t.tokens[int(rng.choice(kids))]] = logits[b, i].max() + 1.0
        predict = logits.argmax(axis=2)
        links = [to_sglang(t, root_token=int(rng.integers(V))) for t in trees]
        ai, num, pr = kernel([c for c, _, _ in links], [f for _, f, _ in links], [s for _, _, s in links], predict, depth)
        for b, t in enumerate(trees):
            path, block = _argmax_path(t, predict[b])
            want_ai = [b * N] + [b * N + i for i in path]
            n = int(num[b])
            got_ai = [int(i) for i in ai[b, :n + 1]]
            checks = [("accept_token_num", n, len(path)), ("accept_index", got_ai, want_ai),
                      ("padding after the path", [int(i) for i in ai[b, n + 1:]], [-1] * (ai.shape[1] - n - 1))]
            if got_ai == want_ai:
                checks.append(("emitted block", [int(pr[i]) for i in got_ai], block))
            for what, got, want in checks:
                if got != want:
                    report.ok = False
                    report.mismatches.append((j, b, what, got, want, (t.parents, t.tokens)))
            report.accepted[len(path)] = report.accepted.get(len(path), 0) + 1
            report.trees += 1
        report.batches += 1
    return report
