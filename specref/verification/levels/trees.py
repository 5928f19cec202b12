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

The completed block must have the target law of ``depth + 1`` tokens.  Exact mode
enumerates every draft and every coin (the implementation's ``rng`` is the
enumerator's); statistical mode samples N blocks and runs the pooled G-test of
:mod:`specref.verification.statistics.counts`, handing the implementation a seeded
``numpy.random.Generator`` (the one the drafts are drawn from; an implementation may
ignore it and use its own randomness).

SGLang-style kernels take their coins as arguments: :func:`from_coins` wraps such a
kernel into a ``tree_step_fn`` by passing it lazy uniforms, so it runs in exact mode.
:func:`sglang_style_kernel` is a reference kernel of that shape (one coin per node,
siblings tried by a running sum of target probabilities, a scratch row per node that
records the tried siblings, inverse-CDF final draw with a separate coin).  Dense batches
of trees (``[B, N]``, as SGLang runs them) are checked exactly by :func:`specref.verification.oracle.check_tree_batch`:
the joint law of the B rows must be the product of the target laws.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from specref.core.numbers import is_exact
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.core.tree import to_sglang
from specref.decoding.chain import next_token_probs
from specref.decoding.tree import SCHEMES, draft_tree, tree_rows
from specref.verification.running.calling import Misbehaved, call
from specref.verification.laws.enumeration import target_law
from specref.verification.levels.runner import exact_verdict, run_cases, sampled_verdict
from specref.verification.running.level import Level
from specref.verification.running.report import INVALID
from specref.verification.cases.tables import ProbTable

__all__ = ["TreeCase", "tree_cases", "from_coins", "sglang_style_kernel", "check_tree", "tree_program",
           "batched_reference_kernel", "tree_batch_program", "run_tree_batch"]


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
        if self.drafting not in SCHEMES:
            raise SpecrefError(f"TreeCase {self.name!r}: drafting must be one of {SCHEMES}, got {self.drafting!r}")

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


def memo_rows(prompt, config=SamplingConfig()):
    """``row(model, path) -> next-token row`` after ``prompt + path``, each computed once."""
    memo: dict = {}

    def row(model, path):
        key = (id(model), tuple(path))
        if key not in memo:
            memo[key] = next_token_probs(model, list(prompt) + list(path), config)
        return memo[key]

    return row


def tree_program(fn, case: TreeCase, time_limit):
    """``(program(rng, impl_rng), expected law)`` for one case (the tree level's criterion)."""
    target, draft = case.models()
    V, prompt, depth = case.vocab_size, list(case.prompt), case.depth
    config = SamplingConfig()
    row = memo_rows(prompt, config)

    def program(rng, impl_rng):
        tree, q_draft, paths = draft_tree(case.widths, lambda path: row(draft, path), case.drafting, rng)
        p_target = tree_rows(lambda path: row(target, path), paths)
        q_arg = None if case.drafting == "topk" else q_draft
        out = call(fn, (tree, p_target.copy(), None if q_arg is None else q_arg.copy(), impl_rng), {}, time_limit)
        try:
            path, token = out
            path = tree.check_path(path)
        except (TypeError, ValueError) as e:
            raise Misbehaved(INVALID, f"tree_step_fn returned {out!r}, not (a root-down path, a token): {e}") from None
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < V:
            raise Misbehaved(INVALID, f"tree_step_fn returned next token {token!r} outside the vocabulary 0..{V - 1}")
        block = [tree.tokens[n] for n in path] + [int(token)]
        while len(block) < depth + 1:  # complete by target sampling
            block.append(draw(rng, row(target, tuple(block))))
        return tuple(block)

    return program, target_law(target, prompt, config, depth + 1)


def _validate(case):
    if not isinstance(case, TreeCase):
        raise SpecrefError(f"tree-level cases must be TreeCase objects, got {case!r}")
    case.models()  # validates the tables


def _run(spec, fn, cases, settings):
    """Each case enumerated (exact) or sampled and G-tested (statistical), through the one runner."""

    def exact(case):
        program, expected = tree_program(fn, case, settings.time_limit)
        return partial(exact_verdict, case, lambda rng: program(rng, rng), expected, settings)

    def statistical(case, seed):
        run_case = case.as_float()
        _, expected = tree_program(fn, run_case, settings.time_limit)
        recipe = partial(_statistical_program, fn, run_case, settings.time_limit)  # rebuilt where a shard runs
        return partial(sampled_verdict, case, recipe, expected, settings, seed)

    return run_cases(spec, cases, settings, validate=_validate, exact=exact, statistical=statistical)


def _statistical_program(fn, case, time_limit):
    """The case's program, built where a shard runs; the implementation gets the oracle's generator."""
    program, _ = tree_program(fn, case, time_limit)
    return lambda rng, impl_seed: program(rng, rng)


# ---------------------------------------------------------------- coins as arguments


def from_coins(kernel):
    """A ``tree_step_fn`` from an SGLang-style kernel that takes its coins as arguments.

    ``kernel(candidates [N], retrive_next_token [N], retrive_next_sibling [N],
    uniform_samples [N], uniform_final, target_probs [N, V]) -> (accept_index, next_token)``,
    where ``accept_index`` lists the root (0) and then the accepted nodes, padded with
    -1.  The coins are drawn from ``rng`` -- lazy uniforms in exact mode, so the kernel
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
        return [i for i in accept_index[1:] if i != -1], int(token)

    tree_step_fn.__name__ = f"from_coins({getattr(kernel, '__name__', 'kernel')})"
    return tree_step_fn


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


def tree_batch_program(kernel, case: TreeCase, batch: int, time_limit):
    """``(program(rng), expected law)``: ``batch`` independent trees of one case in one kernel call.

    ``kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N],
    uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) -> (accept_index [B, S], next_tokens [B])``.
    Each row's block is completed to ``depth + 1`` tokens; the joint law of the B blocks must be
    the product of the target laws (rows independent), so coupling across rows (a coin shared by
    two rows, say) is a nonzero TV.
    """
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
        out = call(kernel, ([c for c, _, _ in links], [f for _, f, _ in links], [s for _, _, s in links],
                            coins, finals, np.stack(p_rows)), {}, time_limit)
        blocks = []
        try:
            accept_index, tokens = out
            for b in range(batch):
                path = trees[b].check_path([int(i) for i in list(accept_index[b])[1:] if int(i) != -1])
                token = int(tokens[b])
                if not 0 <= token < V:
                    raise SpecrefError(f"row {b}: next token {token} outside the vocabulary 0..{V - 1}")
                block = [trees[b].tokens[n] for n in path] + [token]
                while len(block) < depth + 1:
                    block.append(draw(rng, row(target, tuple(block))))
                blocks.append(tuple(block))
        except (TypeError, ValueError, IndexError) as e:
            raise Misbehaved(INVALID, f"kernel returned {out!r}: {e}") from None
        return tuple(blocks)

    one = target_law(target, prompt, config, depth + 1)
    expected = {(): Fraction(1)}
    for _ in range(batch):
        expected = {k + (o,): w * v for k, w in expected.items() for o, v in one.items()}
    return program, expected


def _batch_recipe(kernel, case, batch, time_limit):
    """The batch program, built where a shard runs: the kernel's coins are the shard's floats."""
    program, _ = tree_batch_program(kernel, case, batch, time_limit)
    return lambda rng, impl_seed: program(rng)


def run_tree_batch(spec, kernel, cases, settings, *, batch: int = 2):
    """The ``tree_batch`` level: exact (coins as lazy uniforms) or statistical, through the one runner."""
    check_positive_int("batch", batch)

    def exact(case):
        program, expected = tree_batch_program(kernel, case, batch, settings.time_limit)
        return partial(exact_verdict, case, program, expected, settings)

    def statistical(case, seed):
        run_case = case.as_float()
        _, expected = tree_batch_program(kernel, run_case, batch, settings.time_limit)
        recipe = partial(_batch_recipe, kernel, run_case, batch, settings.time_limit)
        return partial(sampled_verdict, case, recipe, expected, settings, seed)

    return run_cases(spec, cases, settings, validate=_validate, exact=exact, statistical=statistical)


LEVELS = (
    Level("tree", "tree_step_fn(tree, p_target [N, V], q_draft [N, V] | None, rng) -> (path, next_token)",
          lambda: tree_cases("topk"), _run),
    Level("tree_batch", "kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N], "
                        "uniform_samples [B, N], uniform_final [B], target_probs [B, N, V]) "
                        "-> (accept_index [B, S], next_tokens [B])", lambda: tree_cases("topk"), run_tree_batch),
)
"""The tree level, and dense batches of trees (B = 2 by default; ``check_tree_batch(batch=B)``)."""
