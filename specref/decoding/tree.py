"""Tree speculative decoding: draft a tree from the draft model, one target call, verify.

One iteration on the prefix ``tokens``:

1. draft a tree of shape ``widths`` (``widths[d]`` children under every node at depth
   ``d``) from the draft model's rows; the children of a node are

   - ``"topk"``: the ``w`` most likely draft tokens, distinct, no randomness (point mass,
     as EAGLE-2/3 and SGLang draft them; lowest id first on ties);
   - ``"iid"``: ``w`` i.i.d. draws from the draft row (SpecInfer, K-SEQ);
   - ``"without_replacement"``: ``w`` draws without replacement (RSD), one at a time
     from the renormalised remainder;

2. one target call scores every node: ``p_target [N, V]``;
3. ``verify(tree, p_target, q_draft | None, rng) -> (path, next_token)``
   (:mod:`specref.core.tree_verify`); the block is the path's tokens and the next token.

:func:`draft_on_shape` redraws the children of a given tree shape from one draft row per
node (a user-built tree's rows), the drafting the tree level replays for a sampled user tree.

:func:`tree_transition` is that iteration as ``iteration(state, rng)`` for
:func:`specref.verification.laws.enumeration.law_iterated`, so the loop's output law can be
compared exactly with the target sampler's law.
"""

from __future__ import annotations

import numpy as np

from specref.core.draws import draw
from specref.core.errors import SpecrefError, check_positive_int, check_tokens
from specref.core.numbers import same_kind
from specref.core.sampling import SamplingConfig
from specref.core.tree import DraftTree
from specref.core.tree_verify import VERIFIERS
from specref.decoding.chain import next_token_probs

__all__ = ["SCHEMES", "draft_tree", "draft_on_shape", "tree_paths", "tree_rows", "tree_block", "tree_transition",
           "tree_decode"]

SCHEMES = ("topk", "iid", "without_replacement")


def _children(q, w, scheme, rng) -> list[int]:
    """``w`` child tokens from the draft row ``q`` ([V]) under ``scheme``."""
    V = q.shape[0]
    if scheme == "topk":
        if w > V:
            raise SpecrefError(f"topk drafting needs width <= V = {V}, got {w}")
        return sorted(range(V), key=lambda j: (-q[j], j))[:w]
    if scheme == "iid":
        return [draw(rng, q) for _ in range(w)]
    if scheme == "without_replacement":
        if w > int((q > 0).sum()):
            raise SpecrefError(f"drafting {w} children without replacement needs {w} tokens with q > 0, "
                               f"got {int((q > 0).sum())}")
        left, out = q.copy(), []
        for _ in range(w):
            x = draw(rng, left)
            out.append(x)
            left[x] = 0
            if len(out) < w:
                left = left / left.sum()
        return out
    raise SpecrefError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def draft_tree(widths, draft_row, scheme: str, rng):
    """``(tree, q_draft [N, V], paths)``: a tree of shape ``widths`` drafted from ``draft_row(path_tokens) -> [V]``;
    ``paths[i]`` is node ``i``'s path of tokens (``()`` for the root).

    Nodes are numbered breadth-first, so parents precede children and siblings are
    contiguous, in the order they were drafted.
    """
    widths = tuple(check_positive_int("widths[i]", w) for w in widths)
    if not widths:
        raise SpecrefError("widths must hold at least one level, got ()")
    parents, tokens = [-1], [-1]
    paths: list[tuple[int, ...]] = [()]
    q_rows = [draft_row(())]
    level = [0]
    for w in widths:
        nxt = []
        for node in level:
            for x in _children(q_rows[node], w, scheme, rng):
                parents.append(node)
                tokens.append(int(x))
                paths.append(paths[node] + (int(x),))
                q_rows.append(draft_row(paths[-1]))
                nxt.append(len(parents) - 1)
        level = nxt
    return DraftTree(tuple(parents), tuple(tokens)), np.stack(q_rows), paths


def draft_on_shape(tree: DraftTree, q_rows, scheme: str, rng) -> DraftTree:
    """A tree of ``tree``'s shape whose children are drawn afresh: node ``i``'s children, in node
    order, are ``len(children)`` draws from ``q_rows[i]`` ([N, V]) under ``scheme`` (``"iid"`` or
    ``"without_replacement"``).  The rows stay with the node, whatever token it now carries."""
    if scheme not in ("iid", "without_replacement"):
        raise SpecrefError(f"scheme must be 'iid' or 'without_replacement' to redraw a tree, got {scheme!r}")
    tokens = list(tree.tokens)
    for node in range(tree.size):
        kids = tree.children(node)
        if kids:
            for c, x in zip(kids, _children(q_rows[node], len(kids), scheme, rng)):
                tokens[c] = int(x)
    return DraftTree(tree.parents, tuple(tokens))


def tree_paths(tree: DraftTree) -> list[tuple]:
    """Node ``i``'s path of tokens from the root (``()`` for the root): the context its rows follow."""
    paths = [()]
    for i in range(1, tree.size):
        paths.append(paths[tree.parents[i]] + (tree.tokens[i],))
    return paths


def tree_rows(target_row, paths):
    """``p_target [N, V]``: the target's row after every node's path (one target call)."""
    return np.stack([target_row(path) for path in paths])


def tree_block(target_row, draft_row, *, widths, scheme, verify, rng):
    """One iteration: ``(emitted tokens, path, tree)``; ``verify`` a verifier or its name in ``VERIFIERS``."""
    verify = _verifier(verify)
    tree, q_draft, paths = draft_tree(widths, draft_row, scheme, rng)
    p_target = tree_rows(target_row, paths)
    p_target, q_draft = same_kind(p_target, q_draft)
    path, token = verify(tree, p_target, None if scheme == "topk" else q_draft, rng)
    return [tree.tokens[n] for n in path] + [int(token)], list(path), tree


def _verifier(verify):
    if callable(verify):
        return verify
    if verify not in VERIFIERS:
        raise SpecrefError(f"verify must be a callable or one of {sorted(VERIFIERS)}, got {verify!r}")
    return VERIFIERS[verify]


def tree_transition(target, draft, prompt, *, widths, scheme, verify, config: SamplingConfig,
                    max_new_tokens: int, stop_tokens=(), target_row=None):
    """``iteration(generated, rng) -> (block, next_state)`` for tree speculative decoding.

    ``target_row(model, tokens, config) -> [V]`` replaces the target's processed row
    when given (the hook a verification-side processing bug plugs into); rows are
    memoised per prefix, as the enumerator replays each iteration many times.
    """
    if not isinstance(config, SamplingConfig):
        raise SpecrefError(f"config must be a SamplingConfig, got {config!r}")
    verify = _verifier(verify)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    prompt = list(prompt)
    if not prompt:
        raise SpecrefError("prompt must hold at least one token, got []")
    V = next_token_probs(target, prompt, config, name="target").shape[0]
    prompt = check_tokens("prompt", prompt, V)
    stops = frozenset(check_tokens("stop_tokens", stop_tokens, V))
    rows_of = target_row or (lambda model, tokens, config: next_token_probs(model, tokens, config))
    memo: dict = {}

    def row(model, tokens):
        key = (id(model), tuple(tokens))
        if key not in memo:
            memo[key] = rows_of(model, tokens, config) if model is target else next_token_probs(model, tokens, config)
        return memo[key]

    def iteration(generated: tuple, rng):
        base = prompt + list(generated)
        emitted, _, _ = tree_block(lambda path: row(target, base + list(path)),
                                   lambda path: row(draft, base + list(path)),
                                   widths=widths, scheme=scheme, verify=verify, rng=rng)
        room, kept = max_new_tokens - len(generated), []
        for x in emitted[:room]:
            kept.append(x)
            if x in stops:
                break
        state = generated + tuple(kept)
        done = len(state) >= max_new_tokens or (kept and kept[-1] in stops)
        return tuple(kept), None if done else state

    return iteration


def tree_decode(target, draft, prompt, *, widths, scheme, verify, config: SamplingConfig,
                max_new_tokens: int, stop_tokens=(), rng) -> dict:
    """Decode with trees until a stop token or ``max_new_tokens``.

    Returns ``{"tokens": [...], "accepted": [draft tokens accepted per iteration]}``.
    """
    iteration = tree_transition(target, draft, prompt, widths=widths, scheme=scheme, verify=verify,
                                config=config, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens)
    tokens: list[int] = []
    accepted: list[int] = []
    state = () if max_new_tokens > 0 else None
    while state is not None:
        before = len(tokens)
        block, state = iteration(state, rng)
        tokens += block
        accepted.append(max(len(tokens) - before - 1, 0))
    return {"tokens": tokens, "accepted": accepted}
