"""``python -m specref.verify``: the exact verification of speculative decoding (SPEC §5).

It prints, and checks:

1. the worked example of SPEC §3 in exact rationals (and the "resample from p" bug);
2. the single-step mass balance ``min(p, q) + (1 - alpha) residual = p`` on random
   rational cases;
3. the scenario matrix: for each scenario the exact law of speculative decoding
   (enumerated by :func:`specref.verification.laws.enumeration.law_iterated`) against the target law
   (:func:`specref.verification.laws.enumeration.target_law`, an independent product of conditionals):
   n-gram models of orders 1-3, random table models and the tiny transformer;
   K = 1..4; temperature, greedy, top-k, top-p, min-p and a combination; stop tokens
   and several lengths; forced edge cases; rational mode, where TV must be exactly 0;
4. negative controls: every wrong implementation of :mod:`specref.verification.zoo.chain` (SPEC §7),
   run through the same decoder matrix when it is a probability-level step and
   through the oracle at its own level otherwise -- each must be detected (TV > 0);
   approximate algorithms are reported with their exact TV; and every entry of
   :mod:`specref.verification.zoo.stateful`, each case in a fresh worker, which must be
   reported ``stateful`` (SPEC §13.5).

Exit status 0 only when every correct scenario has TV <= 1e-12 (exactly 0 in
rational mode) and every negative control is detected.

``--impl module:function --level step|logits|decoder`` checks an outside
implementation with the oracle instead, and exits non-zero when it fails.  With it,
``--batch N`` says the implementation takes N samples per call (step, logits and decoder
levels: ``check(..., batch=N)``), and ``--rules ITEM ...`` declares its sampler, read by
:func:`specref.verification.cases.rules.parse_rules` into a
:class:`~specref.verification.cases.rules.Rules`: ``name=value`` items, e.g.
``--rules order=top_k,top_p,min_p,temperature top_p_ties=lowest_id``.  A bad value of
either is a usage error (exit status 2, the message naming it).

The same jobs are subcommands of the ``specref`` command (:mod:`specref.cli`): ``specref selftest``
(1-4 above), ``specref check --impl ...`` and ``specref sweep FILE``; both run the functions here
(:func:`selftest`, :func:`check_outside`, :func:`run_sweep_file`).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.core.step import acceptance_rate, accepted_mass, residual, residual_mass
from specref.decoding.chain import speculative_transition
from specref.verification.laws.enumeration import compare, law_iterated, target_law
from specref.verification.oracle import LEVELS

FLOAT_TOL = 1e-12  # a correct float scenario: TV <= this
DETECT_TOL = 1e-9  # a negative control is detected when TV > this


# ---------------------------------------------------------------- 1-2. the single step


def worked_example() -> dict:
    """SPEC §3 worked example in exact rationals."""
    p = np.array([Fraction(1, 5), Fraction(1, 2), Fraction(3, 10)], dtype=object)
    q = np.array([Fraction(3, 5), Fraction(3, 10), Fraction(1, 10)], dtype=object)
    acc, rej = accepted_mass(p, q), residual_mass(p, q)
    res = residual(p, q)
    out = acc + rej * res
    wrong = acc + rej * p  # SPEC §7 bug 1: the correction drawn from p
    checks = {
        "accepted mass = [1/5, 3/10, 1/10]": list(acc) == [Fraction(1, 5), Fraction(3, 10), Fraction(1, 10)],
        "rejection mass = 2/5": rej == Fraction(2, 5),
        "residual = [0, 1/2, 1/2]": list(res) == [0, Fraction(1, 2), Fraction(1, 2)],
        "accepted + rejection x residual = p": list(out) == list(p),
        "resample-from-p gives [7/25, 1/2, 11/50]": list(wrong) == [Fraction(7, 25), Fraction(1, 2), Fraction(11, 50)],
    }
    return {
        "p": _strs(p), "q": _strs(q), "accepted": _strs(acc), "rejection": str(rej), "residual": _strs(res),
        "output": _strs(out), "resample_from_p": _strs(wrong), "checks": checks, "ok": all(checks.values()),
    }


def mass_balance(n_cases: int, seed: int) -> dict:
    """accepted + rejection x residual == p exactly, on random rational (p, q) with zeros and ties."""
    rng = random.Random(seed)
    failures, with_rejection = [], 0
    for _ in range(n_cases):
        V = rng.randint(2, 6)
        p = _random_rational_row(rng, V)
        q = p.copy() if rng.random() < 0.15 else _random_rational_row(rng, V)
        alpha = acceptance_rate(p, q)
        if alpha == 1:  # p = q: nothing is ever rejected, and the residual is never formed
            ok = list(accepted_mass(p, q)) == list(p)
        else:
            with_rejection += 1
            ok = list(accepted_mass(p, q) + (1 - alpha) * residual(p, q)) == list(p)
        if not ok:
            failures.append({"p": _strs(p), "q": _strs(q)})
    return {"cases": n_cases, "with_rejection": with_rejection, "failures": failures, "ok": not failures}


def _random_rational_row(rng, V):
    w = [rng.choice([0, 0, 1, 2, 3, 5, 8]) for _ in range(V)]
    if not any(w):
        w[rng.randrange(V)] = 1
    return np.array([Fraction(x, sum(w)) for x in w], dtype=object)


def _strs(row):
    return [str(v) for v in row]


# ---------------------------------------------------------------- 3-4. scenarios


@dataclass(frozen=True)
class Scenario:
    """One row of the matrix: a thunk that returns (TV, outputs, paths) and what TV must be."""

    name: str
    kind: str  # "correct" (TV must be ~0), "control" (must be > 0) or "approximate" (reported)
    run: object  # () -> dict(tv=..., n_outputs=..., paths=...)
    quick: bool = False  # part of --quick


def decoder_law_scenario(name, target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(),
                         key=None, step=None, kind="correct", quick=False) -> Scenario:
    """Speculative decoding's exact law (memoised per iteration) against the target law."""

    def run():
        iteration = speculative_transition(target, draft, prompt, k=k, config=config,
                                           max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, step=step)
        got = law_iterated((), iteration, key=key)
        want = target_law(target, prompt, config, max_new_tokens, stop_tokens)
        c = compare(got, want)
        return {"tv": c.tv, "n_outputs": len(want), "paths": got.paths, "states": got.states, "exact": c.exact}

    return Scenario(name, kind, run, quick)


def ngram_key(order, prompt):
    """Memo key for n-gram models: the last n-1 tokens and the count generated so far."""
    h = order - 1

    def key(generated):
        context = (tuple(prompt) + tuple(generated))[-h:] if h else ()
        return context, len(generated)

    return key


CONFIGS = {
    "T1": SamplingConfig(),
    "T0.7": SamplingConfig(temperature=0.7),
    "greedy": GREEDY,
    "topk2": SamplingConfig(top_k=2),
    "topp0.8": SamplingConfig(top_p=0.8),
    "minp0.2": SamplingConfig(min_p=0.2),
    "combo": SamplingConfig(temperature=0.8, top_k=3, top_p=0.9, min_p=0.05),
}
EXACT_CONFIGS = {  # exact on Fraction rows: 1/T integral, thresholds as Fractions
    "T1": SamplingConfig(),
    "T1/2": SamplingConfig(temperature=Fraction(1, 2)),
    "topk2": SamplingConfig(top_k=2),
    "topp4/5": SamplingConfig(top_p=Fraction(4, 5)),
    "minp1/5": SamplingConfig(min_p=Fraction(1, 5)),
}


def model_pairs():
    """(name, target, draft, key order, V): n-gram pairs that disagree, and random tables."""
    from toy_models.ngram import NGramModel, random_table_corpus

    pairs = []
    for order_t, order_d, V in [(1, 1, 4), (2, 1, 3), (2, 2, 4), (3, 2, 3)]:
        corpus = random_table_corpus(V, 12, 30, seed=10 * V + order_t)
        target = NGramModel.fit(corpus, order=order_t, vocab_size=V, add_k=Fraction(1, 2))
        draft = NGramModel.fit(corpus[:2], order=order_d, vocab_size=V, add_k=1)
        pairs.append((f"ngram{order_t}/{order_d}-V{V}", target, draft, order_t, V))
    for order, V in [(2, 4), (3, 3)]:
        target = NGramModel.random(order=order, vocab_size=V, seed=order * 100 + V)
        draft = NGramModel.random(order=order, vocab_size=V, seed=order * 100 + V + 1, zero_frac=0.4)
        pairs.append((f"table{order}-V{V}", target, draft, order, V))
    return pairs


def matrix() -> list[Scenario]:
    """The correct scenarios: every pair x config (float), rational mode, and forced edge cases."""
    scenarios = []
    pairs = model_pairs()
    for i, (pname, target, draft, order, V) in enumerate(pairs):
        ks = [1, 2, 3, 4] if V <= 3 else [1, 2, 3]
        for j, (cname, config) in enumerate(CONFIGS.items()):
            n = i * len(CONFIGS) + j
            k, max_new = ks[n % len(ks)], [2, 3, 4][n % 3] if V <= 3 else [2, 3][n % 2]
            stops = (V - 1,) if n % 2 else ()
            prompt = [n % V]
            name = f"{pname} {cname} K={k} n={max_new}" + (f" stop={stops[0]}" if stops else "")
            scenarios.append(decoder_law_scenario(
                name, target, draft, prompt, k=k, config=config, max_new_tokens=max_new, stop_tokens=stops,
                key=ngram_key(order, prompt), quick=(j == i % len(CONFIGS)),
            ))
    for i, (pname, target, draft, order, V) in enumerate(pairs[1:4] + pairs[4:5]):
        for j, (cname, config) in enumerate(EXACT_CONFIGS.items()):
            k = [1, 2, 3][(i + j) % 3]
            prompt = [j % V]
            scenarios.append(decoder_law_scenario(
                f"rational {pname} {cname} K={k} n=3", target.exact, draft.exact, prompt, k=k, config=config,
                max_new_tokens=3, stop_tokens=(0,) if j % 2 else (), key=ngram_key(order, prompt),
                quick=(j == i),
            ))
    scenarios += larger()
    scenarios += edge_cases()
    scenarios += transformer_scenarios()
    scenarios += tree_scenarios()
    scenarios += heads_scenarios()
    scenarios += retrieval_scenarios()
    return scenarios


def larger() -> list[Scenario]:
    """A few scenarios at the sizes of the enumeration benchmark (V up to 8, 6 tokens)."""
    from toy_models.ngram import NGramModel, random_table_corpus

    out = []
    for V, k, n, exact, config, fitted in [
        (8, 3, 6, False, SamplingConfig(), False),
        (6, 4, 4, False, CONFIGS["combo"], True),
        (5, 3, 4, True, SamplingConfig(), False),
        (6, 2, 5, True, EXACT_CONFIGS["topp4/5"], False),
    ]:
        if fitted:  # a bigram target and a unigram draft fitted to less text from the same chain
            target = NGramModel.fit(random_table_corpus(V, 20, 40, seed=V), order=2, vocab_size=V)
            draft = NGramModel.fit(random_table_corpus(V, 4, 25, seed=V), order=1, vocab_size=V)
        else:
            target = NGramModel.random(order=2, vocab_size=V, seed=1000 + V)
            draft = NGramModel.random(order=2, vocab_size=V, seed=2000 + V, zero_frac=0.3)
        models = (target.exact, draft.exact) if exact else (target, draft)
        name = f"{'rational ' if exact else ''}larger bigram V={V} {config_name(config)} K={k} n={n}"
        out.append(decoder_law_scenario(name, models[0], models[1], [0], k=k, config=config, max_new_tokens=n,
                                        key=ngram_key(2, [0])))
    return out


def edge_cases() -> list[Scenario]:
    """The forced edge cases of SPEC §3 and §9, each a decoder scenario."""
    from specref.verification.cases.tables import ProbTable
    from toy_models.ngram import NGramModel

    F = Fraction
    target = NGramModel.random(order=2, vocab_size=3, seed=7)
    sparse = NGramModel.random(order=2, vocab_size=3, seed=8, zero_frac=0.6)
    no_two = ProbTable(np.array([[F(1, 2), F(1, 2), F(0)], [F(1, 4), F(3, 4), F(0)], [F(2, 3), F(1, 3), F(0)]]))
    only_two = ProbTable(np.array([[F(0), F(0), F(1)]] * 3))
    # a chain that emits the stop token 2 right after token 1, with high probability
    chain = ProbTable(np.array([[F(1, 10), F(4, 5), F(1, 10)], [F(1, 20), F(1, 20), F(9, 10)], [F(1, 3)] * 3]))
    key2 = ngram_key(2, [0])
    T1 = SamplingConfig()
    return [
        decoder_law_scenario("edge p=q (draft = target) K=3", target.exact, target.exact, [0], k=3, config=T1,
                             max_new_tokens=4, key=key2, quick=True),
        decoder_law_scenario("edge zeros in q K=2", target.exact, sparse.exact, [0], k=2, config=T1,
                             max_new_tokens=3, key=key2, quick=True),
        decoder_law_scenario("edge zeros in p K=2", sparse.exact, target.exact, [0], k=2, config=T1,
                             max_new_tokens=3, key=key2),
        decoder_law_scenario("edge always rejected at position 1 K=3", no_two, only_two, [0], k=3, config=T1,
                             max_new_tokens=3, key=key2, quick=True),
        decoder_law_scenario("edge stop inside accepted block K=4", chain, chain, [0], k=4, config=T1,
                             max_new_tokens=4, stop_tokens=(2,), key=key2, quick=True),
        decoder_law_scenario("edge greedy, draft disagrees K=2", target, sparse, [1], k=2, config=GREEDY,
                             max_new_tokens=4, key=key2),
        decoder_law_scenario("edge max length mid-block K=4", target.exact, target.exact, [2], k=4, config=T1,
                             max_new_tokens=2, key=key2),
    ]


def transformer_pair(*, rollback: bool = True):
    """Tiny random transformers (V = 4) with KV caches: a 2-layer target and a 1-layer draft.

    The token embedding (tied to the output layer) is scaled up so that the rows are far
    from uniform and the two models disagree.  ``rollback=False`` keeps discarded draft
    tokens in the target's KV cache (SPEC §7 bug 12).
    """
    from toy_models.transformer import CachedTransformer, TransformerConfig, init_params

    models = []
    for n_layer, seed, cache_rollback in [(2, 11, rollback), (1, 12, True)]:
        config = TransformerConfig(n_vocab=4, n_ctx=16, n_embd=16, n_layer=n_layer, n_head=2)
        params = init_params(config, seed=seed)
        params["wte"] = params["wte"] * 5.0
        models.append(CachedTransformer(params, config, rollback=cache_rollback))
    return models[0], models[1], [1, 2]


def transformer_scenarios() -> list[Scenario]:
    """Tiny transformers through the same matrix and a KV cache that is not rolled back."""
    scenarios = []
    for k, config, n, quick in [(2, SamplingConfig(), 3, True), (3, SamplingConfig(temperature=1.5, top_p=0.9), 3, False),
                                (4, SamplingConfig(temperature=1.2, top_k=3, min_p=0.05), 4, False)]:
        target, draft, prompt = transformer_pair()
        scenarios.append(decoder_law_scenario(
            f"transformer V=4 {config_name(config)} K={k} n={n}", target, draft, prompt, k=k,
            config=config, max_new_tokens=n, quick=quick,
        ))
    scenarios.append(Scenario("control transformer KV cache not rolled back (§7.12) T1 K=1 n=3", "control",
                              _stale_cache_run, quick=True))
    return scenarios


def _stale_cache_run():
    """SPEC §7 bug 12 with a real KV cache: the target keeps discarded draft tokens.

    Whole decodes are enumerated (no memo: a cache of rows per prefix would hide the
    bug), each from an empty cache, against the law of a correctly cached target.
    """
    from specref.decoding.chain import speculative_decode
    from specref.verification.laws.enumeration import law

    stale, draft, prompt = transformer_pair(rollback=False)
    fresh, _, _ = transformer_pair()
    config = SamplingConfig()

    def program(rng):
        stale.reset()
        draft.reset()
        return tuple(speculative_decode(stale, draft, prompt, k=1, config=config, max_new_tokens=3, rng=rng).tokens)

    got = law(program)
    want = target_law(fresh, prompt, config, 3)
    c = compare(got, want)
    return {"tv": c.tv, "n_outputs": len(want), "paths": got.paths}


def tree_scenarios() -> list[Scenario]:
    """Tree speculation: each reference verifier's decoding law against the target law (rational,
    TV == 0), the SGLang-style kernel through the tree level, Medusa's typical acceptance
    (approximate), and every tree bug of :mod:`specref.verification.zoo.trees` as a control."""
    from specref.decoding.tree import tree_transition
    from specref.verification.levels.trees.sampled import from_coins, sglang_style_kernel
    from specref.verification.oracle import check_tree
    from specref.verification.zoo.trees import REORDER_CONFIG, tree_bugs
    from toy_models.ngram import NGramModel

    t3, d3 = (NGramModel.random(order=2, vocab_size=3, seed=s, zero_frac=z).exact for s, z in [(7, 0), (8, 0.3)])
    t4, d4 = (NGramModel.random(order=2, vocab_size=4, seed=s, zero_frac=z).exact for s, z in [(7, 0), (8, 0.3)])

    def tree_law(name, target, draft, scheme, verify, widths, n, kind="correct", config=SamplingConfig(),
                 target_row=None, quick=False):
        def run():
            it = tree_transition(target, draft, [0], widths=widths, scheme=scheme, verify=verify, config=config,
                                 max_new_tokens=n, stop_tokens=(2,), target_row=target_row)
            got = law_iterated((), it, key=ngram_key(2, [0]))
            c = compare(got, target_law(target, [0], config, n, (2,)))
            return {"tv": c.tv, "n_outputs": c.n_outputs, "paths": got.paths, "states": got.states, "exact": c.exact}
        return Scenario(f"{'' if kind == 'correct' else kind + ' '}tree {name} {scheme} widths={widths} n={n}",
                        kind, run, quick)

    def oracle_row(name, fn, drafting, kind):
        def run():
            # specref's own trees and zoo entries: in-process, as exact mode ran before isolation became the
            # default (SPEC §13.2); isolation guards against an outside implementation, not these
            report = check_tree(fn, drafting=drafting, isolate=False)
            return {"tv": report.worst_tv, "n_outputs": None, "paths": None, "exact": True}
        return Scenario(f"{'' if kind == 'correct' else kind + ' '}tree {name} ({drafting}) oracle tree-level cases",
                        kind, run, quick=kind == "control")

    out = [
        tree_law("point mass", t3, d3, "topk", "pointmass", (2, 2), 3, quick=True),
        tree_law("point mass", t4, d4, "topk", "pointmass", (3, 1), 3),
        tree_law("point mass topk3,topp4/5", t4, d4, "topk", "pointmass", (2, 2), 3, config=REORDER_CONFIG),
        tree_law("RRS with replacement", t3, d3, "iid", "rrs_with_replacement", (2,), 3, quick=True),
        tree_law("RRS without replacement", t3, d3, "without_replacement", "rrs_without_replacement", (2, 1), 3),
        tree_law("K-SEQ", t3, d3, "iid", "kseq", (2,), 3),
        tree_law("block verification", t3, d3, "iid", "block", (1, 1), 3, quick=True),
        tree_law("block verification", t3, d3, "topk", "block", (1, 1, 1), 4),
        oracle_row("SGLang-style kernel, coins passed", from_coins(sglang_style_kernel), "topk", "correct"),
        tree_law("typical acceptance", t3, d3, "topk", "typical", (2, 2), 3, kind="approximate"),
    ]
    for bug in tree_bugs():
        if bug.level == "tree":
            out.append(oracle_row(bug.name, bug.fn, bug.drafting, "control"))
        else:  # a processing-order bug lives in the rows the loop verifies against
            out.append(tree_law(bug.name, t4, d4, "topk", "pointmass", (2, 2), 3, kind="control",
                                config=REORDER_CONFIG, target_row=bug.fn, quick=True))
    return out


def heads_scenarios() -> list[Scenario]:
    """Decoders that draft from heads (SPEC §16): Medusa's point-mass law against the target law (rational,
    TV == 0) and blockwise parallel decoding against greedy decoding, a verification slip of
    :mod:`specref.verification.zoo.drafting` as a control, Medusa's typical acceptance reported."""
    from specref.decoding.blockwise import blockwise_transition, window_key
    from specref.decoding.medusa import cartesian_choices, medusa_transition
    from specref.verification.zoo.drafting import DRAFTING_ZOO
    from toy_models.heads import RolledHeads
    from toy_models.ngram import NGramModel

    target = NGramModel.random(order=2, vocab_size=4, seed=7).exact
    heads = RolledHeads(target, 3, window=1)
    prompt, key = [0, 1], window_key([0, 1], 1)

    def medusa_row(name, kind, make, quick):
        def run():
            iteration = make(target, heads, prompt, choices=cartesian_choices([2, 2]), max_new_tokens=4,
                             config=SamplingConfig())
            got = law_iterated((), iteration, key=key)
            c = compare(got, target_law(target, prompt, SamplingConfig(), 4))
            return {"tv": c.tv, "n_outputs": c.n_outputs, "paths": got.paths, "states": got.states, "exact": c.exact}
        return Scenario(name, kind, run, quick)

    def blockwise_run(make=blockwise_transition):
        got = law_iterated((), make(target, heads, prompt, k=3, max_new_tokens=8), key=key)
        c = compare(got, target_law(target, prompt, GREEDY, 8))
        return {"tv": c.tv, "n_outputs": c.n_outputs, "paths": got.paths, "states": got.states, "exact": c.exact}

    return [
        medusa_row("medusa point mass tree [2, 2] table2-V4 T1 n=4", "correct", medusa_transition, True),
        Scenario("blockwise parallel decoding k=3 table2-V4 greedy n=8", "correct", blockwise_run, True),
        Scenario("control blockwise emits_rejected_proposal (drafting zoo) k=3 table2-V4 greedy n=8", "control",
                 partial(blockwise_run, DRAFTING_ZOO["emits_rejected_proposal"].transition), True),
        medusa_row("control medusa node_judged_by_parent_row (drafting zoo) table2-V4 T1 n=4", "control",
                   DRAFTING_ZOO["node_judged_by_parent_row"].transition, True),
        medusa_row("approximate medusa typical acceptance eps=0.09 delta=0.3 table2-V4 T1 n=4", "approximate",
                   DRAFTING_ZOO["typical"].transition, False),
    ]


def retrieval_scenarios() -> list[Scenario]:
    """Lookahead decoding and REST (SPEC §16.3, §16.4): each method's exact law against the target
    law (rational rows, TV == 0), REST's published sampling rule (approximate: its exact TV), and a
    lookahead slip of :mod:`specref.verification.zoo.retrieval` as a control."""
    from specref.decoding.lookahead import lookahead_transition
    from specref.decoding.rest import RestDatastore, rest_transition
    from specref.verification.zoo.retrieval import RETRIEVAL_ZOO
    from toy_models.ngram import NGramModel, random_table_corpus

    prompt = [0, 1, 2, 0, 1]
    table = NGramModel.random(order=2, vocab_size=3, seed=7).exact
    docs = random_table_corpus(3, 12, 30, seed=5)
    fitted = NGramModel.fit(docs, order=2, vocab_size=3, add_k=1).exact
    store = RestDatastore([t for d in docs for t in d])

    def row(name, kind, target, make, n, quick):
        def run():
            got = law_iterated((), make())
            c = compare(got, target_law(target, prompt, SamplingConfig(), n))
            return {"tv": c.tv, "n_outputs": c.n_outputs, "paths": got.paths, "states": got.states, "exact": c.exact}
        return Scenario(name, kind, run, quick)

    def lookahead(fn=lookahead_transition, **extra):
        return lambda: fn(table, prompt, window=2, ngram=3, guesses=2, max_new_tokens=4, pool_from_prompt=True,
                          **extra)

    def rest(verify, fn=rest_transition):
        return lambda: fn(fitted, prompt, store, max_new_tokens=4, num_draft=4, length=3, verify=verify)

    return [
        row("lookahead W=2 N=3 G=2 published rule n=4", "correct", table, lookahead(), 4, True),
        row("REST pointmass num_draft=4 length=3 n=4", "correct", fitted, rest("pointmass"), 4, True),
        row("approximate REST published rule num_draft=4 length=3 n=4", "approximate", fitted, rest("rest"), 4,
            False),
        row("control REST rest_stale_tree (retrieval zoo) pointmass num_draft=4 length=3 n=4", "control", fitted,
            rest("pointmass", RETRIEVAL_ZOO["rest_stale_tree"].transition), 4, True),
        row("control lookahead_resample_from_p W=2 N=3 G=2 n=4", "control", table,
            lookahead(RETRIEVAL_ZOO["lookahead_resample_from_p"].transition), 4, True),
    ]


def config_name(config: SamplingConfig) -> str:
    for table in (CONFIGS, EXACT_CONFIGS):
        for name, c in table.items():
            if c == config:
                return name
    parts = [f"T{config.temperature}"]
    parts += [f"topk{config.top_k}"] if config.top_k is not None else []
    parts += [f"topp{config.top_p}"] if config.top_p < 1 else []
    parts += [f"minp{config.min_p}"] if config.min_p > 0 else []
    return ",".join(parts)


def controls() -> list[Scenario]:
    """Every zoo entry: wrong ones must be detected; approximate ones are reported."""
    from specref.verification import oracle, zoo
    from toy_models.ngram import NGramModel

    target = NGramModel.random(order=2, vocab_size=3, seed=21)
    draft = NGramModel.random(order=2, vocab_size=3, seed=22, zero_frac=0.3)
    scenarios = []
    for entry in zoo.entries():
        if entry.kind == "correct" or "exact" not in entry.modes:
            continue
        kind = "control" if entry.kind == "wrong" else "approximate"
        label = f"§7.{entry.spec_item}" if entry.spec_item else entry.kind
        if entry.level == "step":  # through the same decoder matrix as the reference
            for quick, (name, config) in [(True, ("T1", SamplingConfig())), (False, ("T0.7", SamplingConfig(temperature=0.7)))]:
                scenarios.append(decoder_law_scenario(
                    f"{kind} {entry.name} ({label}) table2-V3 {name} K=2 n=3", target, draft, [0], k=2,
                    config=config, max_new_tokens=3, key=ngram_key(2, [0]), step=entry.fn, kind=kind, quick=quick,
                ))
        def run(entry=entry):
            report = oracle.check(entry.level, entry.fn, mode="exact", cases=control_cases(entry.level), isolate=False)
            bad = [r for r in report.results if not r.ok]
            return {"tv": report.worst_tv, "n_outputs": None, "paths": None,
                    "detail": "; ".join(f"{r.case.name}: {r.status}" for r in bad[:2]),
                    "flagged": not report.ok}

        scenarios.append(Scenario(f"{kind} {entry.name} ({label}) oracle {entry.level}-level cases", kind, run,
                                  quick=entry.level != "step"))
    return scenarios + stateful_controls()


def stateful_controls() -> list[Scenario]:
    """Every entry of :mod:`specref.verification.zoo.stateful`, each case in a fresh worker (as the
    CLI runs it) and ``state_check=True`` (every case judged again): right on every case alone, so
    only the state check (SPEC §13.5) flags it; the row is detected when some case is ``stateful``.  The batched row runs two of the level's default
    cases (the others enumerate grid coins for seconds each and add nothing here)."""
    from specref.verification import oracle
    from specref.verification.running.report import STATEFUL
    from specref.verification.zoo import stateful

    def run(entry):
        cases = LEVELS[entry.level].cases()
        if entry.level == "batched":
            cases = [c for c in cases if c.name in ("p-equals-q-row", "zero-draft-row")]
        report = oracle.check(entry.level, entry.make(), mode="exact", isolate=True, state_check=True, cases=cases)
        caught = [r for r in report.results if r.status == STATEFUL]
        return {"tv": None, "n_outputs": None, "paths": None, "flagged": bool(caught),
                "detail": caught[0].detail[:200] if caught else "no case stateful"}

    return [Scenario(f"control {e.name} (keeps state between calls) oracle {e.level}-level cases, isolated, "
                     "state_check=True",
                     "control", partial(run, e)) for e in stateful.entries()]


def control_cases(level):
    """The oracle's default cases; at decoder level a K = 1 subset (whole decodes are
    enumerated without memoisation, and a decoder bug may draft K + 1 tokens)."""
    from dataclasses import replace

    from specref.verification.oracle import default_cases

    cases = default_cases(level)
    if level == "decoder":
        keep = ("worked-example-rows", "zeros-in-p", "stop-token", "trigram", "position-aware", "greedy")
        cases = [replace(c, k=1) for c in cases if c.name in keep]
    return cases


# ---------------------------------------------------------------- running


def status_of(kind, tv, exact, flagged=False) -> tuple[str, bool]:
    """A row's status; a control is detected by its TV, or (``flagged``) by an oracle status
    such as "invalid output" that a correct implementation never gets."""
    if kind == "correct":
        ok = tv is not None and (tv == 0 if exact else tv <= FLOAT_TOL)
        return ("ok" if ok else "FAIL"), ok
    if kind == "control":
        ok = (tv is not None and tv > DETECT_TOL) or flagged
        return ("detected" if ok else "MISSED"), ok
    return "approximate", True


def _timed_run(s) -> tuple[dict, float]:
    t0 = time.perf_counter()
    try:
        r = s.run()
    except SpecrefError as e:  # a scenario that cannot run is a failure, reported in its row
        r = {"tv": None, "n_outputs": None, "paths": None, "detail": f"error: {e}"}
    return r, time.perf_counter() - t0


_BY_NAME: dict = {}  # a worker's own copy of the matrix, built once per process


def _run_named(name: str) -> tuple[dict, float]:
    """Run the scenario called ``name`` in a worker process (scenarios hold closures: names travel)."""
    if not _BY_NAME:
        _BY_NAME.update((s.name, s) for s in matrix() + controls())
    return _timed_run(_BY_NAME[name])


def run_scenarios(scenarios, *, progress=True, out=sys.stdout, executor=None) -> list[dict]:
    """Run and print each scenario, here or (``executor``) in worker processes; rows in matrix order."""
    rows = []
    width = max(len(s.name) for s in scenarios) if scenarios else 10
    print(f"{'':8}{'scenario':<{width}}  {'outputs':>7}  {'TV(spec, target)':>16}  status", file=out)
    results = (map(_timed_run, scenarios) if executor is None
               else executor.map(_run_named, [s.name for s in scenarios]))
    for i, (s, (r, seconds)) in enumerate(zip(scenarios, results), 1):
        tv = r["tv"]
        status, ok = status_of(s.kind, tv, r.get("exact", False) and s.kind == "correct", r.get("flagged", False))
        tv_text = "-" if tv is None else ("0 (exact)" if tv == 0 and isinstance(tv, Fraction) else f"{float(tv):.3g}")
        n_out = "-" if r.get("n_outputs") is None else str(r["n_outputs"])
        detail = f"  {r['detail']}" if r.get("detail") and not ok else ""
        prefix = f"[{i}/{len(scenarios)}]" if progress else ""
        print(f"{prefix:<8}{s.name:<{width}}  {n_out:>7}  {tv_text:>16}  {status} ({seconds:.2f}s){detail}",
              file=out, flush=True)
        rows.append({
            "name": s.name, "kind": s.kind, "status": status, "ok": ok,
            "tv": None if tv is None else float(tv), "tv_exact": str(tv) if isinstance(tv, Fraction) else None,
            "n_outputs": r.get("n_outputs"), "paths": r.get("paths"), "states": r.get("states"),
            "seconds": round(seconds, 4), "detail": r.get("detail", ""),
        })
    return rows


EXIT_PRESERVES, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2  # --impl: preserves; differs; usage/import/internal (SPEC §13.3)
EXIT_MISBEHAVES = 3  # the implementation misbehaved (here: it ended the supervised process); the others: EXIT_STATUS


def check_outside(spec: str, level: str, mode: str, samples: int | None, *, isolate: bool = True,
                  json_path: str | None = None, rules=None, batch: int | None = None, **settings) -> int:
    """--impl module:function: the oracle's verdict on an outside implementation.

    Exit status (SPEC §13.3, :data:`~specref.verification.running.report.EXIT_STATUS`): 0 the
    implementation preserves the target distribution; 1 it differs; 3 it misbehaves (raised,
    crashed, invalid output, stateful...); 4 it deviates only on single coin grid points
    (``boundary``); 5 a case could not be judged (over budget, not piecewise constant...); 6 a
    case timed out (no verdict); 2 a usage error, a module that cannot be imported (one that
    exits, crashes or hangs at import included: it is first imported in a forked worker), a
    target that is not callable, or an internal error of the oracle.  Each case runs in a forked worker
    with a hard deadline unless ``isolate`` is False.  The printed table cuts details at
    ``specref.verification.running.report.TABLE_DETAIL`` characters; ``json_path`` gets the
    whole record.  ``rules`` (a :class:`~specref.verification.cases.rules.Rules`, or its
    ``--rules`` text) and ``batch`` are :func:`~specref.verification.oracle.check`'s.
    """
    from specref.verification import oracle
    from specref.verification.running.calling import describe

    loaded = load_outside(spec, level, rules=rules, batch=batch, isolate=isolate)
    if loaded is None:
        return EXIT_ERROR
    fn, rules = loaded
    try:
        report = oracle.check(level, fn, mode=mode, samples=samples, isolate=isolate, rules=rules, batch=batch,
                              **settings)
    except SpecrefError as e:
        print(f"cannot check {spec!r}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the oracle's own failure (SystemExit & co. that got past it too)
        print(f"internal error while checking {spec!r}: {describe(e)}", file=sys.stderr)
        return EXIT_ERROR
    print(report, flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"impl": spec, **report.to_json()}, f, indent=1, default=str)
        print(f"wrote {json_path}")
    return report.exit_status


def load_outside(spec: str, level: str, *, rules=None, batch: int | None = None, isolate: bool = True):
    """``(fn, rules)``: the implementation named ``module:function`` and its ``rules`` parsed;
    ``None`` after printing why to stderr (a usage error: exit 2).  The module is imported first in
    a forked worker unless ``isolate`` is False.  The declarations are validated at ``level``
    before the module is imported -- or, for a level not registered yet, after it: the module may
    register it (:func:`specref.register`); if it does not, the error lists the registered levels."""
    from specref.verification import oracle
    from specref.verification.cases.rules import parse_rules
    from specref.verification.levels import LEVELS
    from specref.verification.running.calling import load_implementation

    if ":" not in spec or not all(spec.partition(":")[::2]):
        print(f"--impl must look like module:function, got {spec!r}", file=sys.stderr)
        return None
    known = level in LEVELS
    try:  # the declarations are the user's: checked before the implementation is imported
        rules = parse_rules(rules) if isinstance(rules, (str, list, tuple)) else rules
        if known:
            oracle.declared(level, _not_yet_imported, rules=rules, batch=batch)
    except SpecrefError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    try:
        fn = load_implementation(spec, probe=isolate)
    except SpecrefError as e:
        print(str(e), file=sys.stderr)
        return None
    except KeyboardInterrupt:
        if _SUPERVISOR[0] is None:  # here a Ctrl-C cannot be told from the module's own
            raise
        print(f"cannot load {spec!r}: importing it raised KeyboardInterrupt (a Ctrl-C is answered by the "
              f"supervising command)", file=sys.stderr)
        return None
    _loaded()
    try:  # a level the module just imported registered, or an error that names the registered levels
        if not known:
            oracle.declared(level, _not_yet_imported, rules=rules, batch=batch)
    except SpecrefError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    return fn, rules


def _not_yet_imported(*args, **kwargs):
    """Stands for an implementation while its declared batch and rules are checked, before it is imported."""
    raise AssertionError("never called")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specref.verify", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a subset of the matrix (under 30 s)")
    ap.add_argument("--json", metavar="PATH", help="write a machine-readable report with every number")
    ap.add_argument("--scenario", metavar="NAME", help="only scenarios whose name contains NAME")
    ap.add_argument("--no-progress", action="store_true", help="no [i/N] counters")
    ap.add_argument("--impl", metavar="MODULE:FUNCTION", help="check an outside implementation with the oracle")
    ap.add_argument("--level", choices=list(LEVELS), default="step",
                    help="; ".join(f"{name}: {lv.signature}" for name, lv in LEVELS.items()))
    ap.add_argument("--mode", choices=["exact", "statistical"], default="exact")
    ap.add_argument("--samples", type=int, help="statistical mode: N (default: planned)")
    ap.add_argument("--no-isolate", action="store_true",
                    help="--impl, --sweep: run the implementation in this process (faster; no hard deadline, and "
                         "an implementation that exits or crashes ends the run)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="--impl: seconds per call (default: derived from the calls measured, SPEC 13.2)")
    ap.add_argument("--batch", type=int, metavar="N",
                    help="--impl at the step, logits and decoder levels: the implementation takes N samples per "
                         "call, rows stacked (SPEC 13.1)")
    ap.add_argument("--rules", nargs="+", metavar="NAME=VALUE",
                    help="--impl at the logits and decoder levels: the implementation's declared sampler, e.g. "
                         "order=top_k,top_p,min_p,temperature top_p_ties=lowest_id (fields: order, "
                         "top_p_ties, top_k_ties, greedy_ties; SPEC 2.1)")
    ap.add_argument("--workers", type=int, default=1,
                    help="worker processes for the matrix, statistical --impl checks and sweeps (default 1)")
    ap.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask cluster, e.g. tcp://host:8786")
    ap.add_argument("--sweep", metavar="FILE", help="run the sweep in FILE (TOML or JSON; see specref.verification.campaigns.sweep)")
    ap.add_argument("--out", metavar="PATH", help="--sweep: the JSON record (resumed when it exists)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be a positive integer, got {args.workers}")  # exits 2
    if args.samples is not None and args.samples < 1:
        ap.error(f"--samples must be a positive integer, got {args.samples}")  # exits 2
    if (args.batch is not None or args.rules) and not args.impl:
        ap.error("--batch and --rules declare an implementation: they go with --impl")  # exits 2
    if args.time_limit is not None and not 0 < args.time_limit < float("inf"):
        ap.error(f"--time-limit must be a positive number of seconds, got {args.time_limit}")  # exits 2
    if args.sweep:
        job = partial(run_sweep_file, args.sweep, out=args.out, progress=not args.no_progress,
                      isolate=not args.no_isolate)
    elif args.impl:
        job = partial(check_args, args)
    else:
        job = partial(selftest, quick=args.quick, scenario=args.scenario, json_path=args.json,
                      progress=not args.no_progress,
                      command="python -m specref.verify " + " ".join(argv or sys.argv[1:]))
    run = partial(with_executor, job, workers=args.workers, scheduler=args.scheduler)
    return supervised(run, loaded=bool(args.sweep)) if args.no_isolate and (args.impl or args.sweep) else run()


# ---------------------------------------------------------------- --no-isolate: one supervised process


_SUPERVISOR: list = [None]  # in a supervised child: the pipe to the supervising command


def supervised(run, *, loaded: bool = False) -> int:
    """``run()``'s exit status, with ``run`` in one forked child that the command supervises (SPEC
    §13.3): under ``--no-isolate`` the implementation runs in the checking process, where
    ``os._exit(0)``, a crash or a signal would end the command with a status that is not the
    verdict's.  The child's output comes here as it is written; a child that ends without an exit
    status is 3 (the implementation ended the check's process: ``crashed``, a misbehaviour), or 2 when it ended
    while the implementation was being imported (``loaded``: nothing is imported first, as in a
    sweep).  A Ctrl-C here ends both: 130.  Without ``fork``, ``run()`` here."""
    import multiprocessing

    from specref.verification.running.calling import can_isolate

    if not can_isolate():
        return run()
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    ttys = (_isatty(sys.stdout), _isatty(sys.stderr))
    child = ctx.Process(target=_supervised_child, args=(run, send, ttys), name="specref-check")  # not daemonic
    child.start()
    send.close()
    code = None
    try:
        while code is None:
            try:
                kind, value = receive.recv()
            except (EOFError, OSError):
                break
            if kind == "exit":
                code = value
            elif kind == "loaded":
                loaded = True
            else:
                stream = sys.stdout if kind == "out" else sys.stderr
                stream.write(value)
                stream.flush()
    except KeyboardInterrupt:  # the person running it pressed Ctrl-C (the child got it too)
        child.kill()
        child.join()
        print("interrupted", file=sys.stderr)
        return 130
    child.join()
    return code if code is not None else _ended(child.exitcode, loaded)


def _ended(exitcode, loaded: bool) -> int:
    """The exit status, printed, of a supervised child that ended without one."""
    how = (f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0
           else f"ended with exit code {exitcode}")
    if not loaded:
        print(f"cannot load the implementation: the process importing it {how} (--no-isolate)", file=sys.stderr)
        return EXIT_ERROR
    print(f"crashed: the implementation ended the check's process ({how}) before the report: with --no-isolate "
          f"it runs in that process (without it, each case's worker would be reported 'crashed')", file=sys.stderr)
    return EXIT_MISBEHAVES


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a stream without isatty
        return False


class _Forward:
    """A text stream of a supervised child: what is written goes to the command's own stream."""

    encoding, errors = "utf-8", "replace"

    def __init__(self, send, kind: str, tty: bool):
        self.send, self.kind, self.tty = send, kind, tty

    def write(self, text) -> int:
        self.send.send((self.kind, str(text)))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty


def _supervised_child(run, send, ttys):
    """The supervised child: ``run()``, its output forwarded, its exit status sent (an exception
    that escaped everything is an internal error, 2; a KeyboardInterrupt raised without a Ctrl-C
    came from the implementation, outside a call or at its import)."""
    _SUPERVISOR[0] = send
    sys.stdout, sys.stderr = _Forward(send, "out", ttys[0]), _Forward(send, "err", ttys[1])
    try:
        code = run()
    except KeyboardInterrupt:
        print("internal error: a KeyboardInterrupt escaped the oracle (raised by the implementation outside a "
              "call; a Ctrl-C is answered by the command)", file=sys.stderr)
        code = EXIT_ERROR
    except BaseException as e:  # noqa: BLE001 - reported, and the status says so
        print(f"internal error: {type(e).__name__} escaped the oracle", file=sys.stderr)
        code = EXIT_ERROR
    send.send(("exit", code))


def _loaded() -> None:
    """Tell a supervising command that the implementation is imported (a death after it is a crash)."""
    if _SUPERVISOR[0] is not None:
        _SUPERVISOR[0].send(("loaded", None))


def with_executor(job, *, workers: int = 1, scheduler: str | None = None) -> int:
    """``job(executor=...)``'s exit status, on the executor that ``--workers`` / ``--scheduler`` ask for
    (``None``: run here); an error of specref's (an unreachable scheduler, a bad sweep file) exits 2,
    and so does an implementation's ``SystemExit`` that got past the oracle (never its exit status).
    The ``specref`` command's subcommands run through here too (:mod:`specref.cli`)."""
    try:
        with executor_for(workers, scheduler) as executor:
            return job(executor=executor)
    except SpecrefError as e:  # unreachable scheduler, bad sweep file, ...
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except SystemExit as e:  # an implementation's exit that got past the oracle: never its exit status
        print(f"internal error: SystemExit({e.code!r}) escaped the oracle", file=sys.stderr)
        return EXIT_ERROR


def executor_for(workers: int = 1, scheduler: str | None = None):
    """The executor that --workers / --scheduler ask for (None: run here), as a context manager."""
    from contextlib import nullcontext

    from specref.adapters.cluster import dask_executor, local_pool

    if scheduler:
        return dask_executor(scheduler)
    return local_pool(workers) if workers > 1 else nullcontext(None)


def check_args(args, executor=None) -> int:
    """``--impl`` (and ``specref check``): :func:`check_outside` with the command line's settings and
    declarations (the two parsers name them alike)."""
    extra = {"executor": executor} if executor is not None and args.mode == "statistical" else {}
    return check_outside(args.impl, args.level, args.mode, args.samples, isolate=not args.no_isolate,
                         json_path=args.json, time_limit=args.time_limit, rules=args.rules, batch=args.batch, **extra)


def run_sweep_file(path: str, *, out: str | None = None, executor=None, progress: bool = True,
                   isolate: bool = True) -> int:
    """``--sweep FILE``: run the sweep, print its table; 0 every cell ok, 1 one differs or misbehaves,
    2 an internal error (a bad file is a SpecrefError: :func:`with_executor` makes it 2)."""
    from specref.verification.campaigns.sweep import load_sweep, run_sweep, sweep_table

    record = run_sweep(load_sweep(path), out=out, executor=executor, progress=progress, isolate=isolate)
    print(sweep_table(record))
    if out:
        print(f"wrote {out}")
    from specref.verification.running.report import EXIT_STATUS, outcome_of

    return EXIT_STATUS[outcome_of(c["result"]["status"] for c in record["cells"].values())]


def selftest(*, quick: bool = False, scenario: str | None = None, json_path: str | None = None,
             progress: bool = True, executor=None, command: str = "python -m specref.verify") -> int:
    """The self-check (the module docstring's 1-4): 0 when it passes, 1 when it fails, 2 when
    ``scenario`` matches no scenario.  ``command`` is what the JSON record says was run."""
    t0 = time.perf_counter()
    print("1. SPEC §3 worked example, exact rationals")
    we = worked_example()
    for name, key in [("p", "p"), ("q", "q"), ("accepted min(p,q)", "accepted"), ("residual", "residual"),
                      ("accepted + (2/5) residual", "output"), ("bug: accepted + (2/5) p", "resample_from_p")]:
        print(f"   {name:<26} [{', '.join(we[key])}]")
    for check, ok in we["checks"].items():
        print(f"   {'ok  ' if ok else 'FAIL'} {check}")
    mb = mass_balance(200 if quick else 2000, seed=2026)
    print(f"\n2. single-step mass balance on {mb['cases']} random rational (p, q) "
          f"({mb['with_rejection']} with rejections): {'exact for all' if mb['ok'] else 'FAILED'}"
          f"{'' if mb['ok'] else ': ' + str(mb['failures'][:3])}")

    scenarios = matrix() + controls()
    if quick:
        scenarios = [s for s in scenarios if s.quick]
    if scenario:
        scenarios = [s for s in scenarios if scenario in s.name]
        if not scenarios:
            print(f"no scenario matches {scenario!r}", file=sys.stderr)
            return 2
    print(f"\n3-4. scenario matrix ({len(scenarios)} scenarios): TV(speculative, target) exactly")
    rows = run_scenarios(scenarios, progress=progress, executor=executor)
    correct = [r for r in rows if r["kind"] == "correct"]
    controls_ = [r for r in rows if r["kind"] == "control"]
    ok = we["ok"] and mb["ok"] and all(r["ok"] for r in rows)
    seconds = time.perf_counter() - t0
    print(f"\n{sum(r['ok'] for r in correct)}/{len(correct)} correct scenarios exact, "
          f"{sum(r['ok'] for r in controls_)}/{len(controls_)} negative controls detected, "
          f"{sum(r['kind'] == 'approximate' for r in rows)} approximate algorithms reported; "
          f"{seconds:.1f} s. {'PASS' if ok else 'FAIL'}")
    if json_path:
        report = {
            "ok": ok, "seconds": round(seconds, 2), "command": command,
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "numpy": np.__version__},
            "worked_example": we, "mass_balance": mb, "scenarios": rows,
        }
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {json_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
