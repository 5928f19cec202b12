"""Lookahead decoding and REST: accepted length and target calls per token against W, N, G and the trie size.

Two tables, written to ``figures/data/methods_retrieval.json``:

- ``exact``: a bigram table target (V = 3, Fraction rows, temperature 1), the prompt
  ``0 1 2 0 1``, 5 new tokens.  Every value is an exact expectation over the decoder's law
  (:func:`specref.verification.zoo.retrieval.calls_per_token`, enumerated with
  ``law_iterated``): E[calls] / E[tokens] (calls per token, as a fraction and a decimal) and
  E[tokens] / E[calls] (the accepted length: tokens per call).  Lookahead over
  ``W in 1..4``, ``N in 2..4``, ``G in 1, 2, 4``, with and without the bonus token; REST over the
  trie size (``num_draft``) and the continuation length, with point-mass verification and, for
  tries of at most 4 nodes, the published rule (its exact TV from the target's law; its
  independent coins per path make the enumeration grow as 2^paths per call: 7 s at 8 nodes,
  hours at 16); Algorithm 1 with a unigram draft fitted to
  less of the same corpus (K = 1..4) beside them.
- ``greedy``: the toy language (``toy_models.corpus``), a trigram target and the trained
  one-layer transformer (``draft_small``), 100 prompts, 16 new tokens, greedy: a greedy decode
  is deterministic, so each prompt's calls are exact; the table gives their mean per token.
  REST's datastore is 20,000 tokens of the language from another seed.

    python benchmarks/methods_retrieval.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "figures", "data", "methods_retrieval.json")
PROMPT = [0, 1, 2, 0, 1]


def machine_info() -> dict:
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__}


def _value(cpt) -> dict:
    per = cpt.per_token
    return {"calls_per_token": str(per), "calls_per_token_float": float(per),
            "tokens_per_call": float(cpt.tokens_per_call), "calls": float(cpt.calls)}


def exact_table(quick: bool) -> dict:
    """Exact E[calls] / E[tokens] on the bigram pair, per setting (module docstring)."""
    from specref.core.sampling import SamplingConfig
    from specref.decoding.rest import RestDatastore, rest_transition
    from specref.verification.laws.enumeration import compare, law_iterated, target_law
    from specref.verification.zoo.retrieval import (calls_per_token, chain_calls_per_token,
                                                    lookahead_calls_per_token)
    from toy_models.ngram import NGramModel, random_table_corpus

    n, config = 5, SamplingConfig()
    docs = random_table_corpus(3, 12, 30, seed=5)
    target = NGramModel.fit(docs, order=2, vocab_size=3, add_k=1).exact
    draft = NGramModel.fit(docs[:2], order=1, vocab_size=3, add_k=1).exact
    ds = RestDatastore([t for d in docs for t in d])
    want = target_law(target, PROMPT, config, n)
    out: dict = {"target": "bigram fitted to random_table_corpus(3, 12, 30, seed=5), add_k=1",
                 "draft": "unigram fitted to its first 2 documents", "prompt": PROMPT, "max_new_tokens": n,
                 "config": "temperature 1", "lookahead": [], "rest": [], "chain": []}
    for W in (1, 2, 3, 4)[: 2 if quick else 4]:
        for N in (2, 3, 4):
            for G in (1, 2, 4):
                for bonus in (False, True):
                    cpt = lookahead_calls_per_token(target, PROMPT, window=W, ngram=N, guesses=G, max_new_tokens=n,
                                                    config=config, pool_from_prompt=True, bonus=bonus)
                    out["lookahead"].append({"W": W, "N": N, "G": G, "bonus": bonus, **_value(cpt)})
    for num_draft in (1, 2, 4, 8, 16)[: 3 if quick else 5]:
        for length in (2, 4):
            for verify in ("rest", "pointmass") if num_draft <= 4 else ("pointmass",):
                it = rest_transition(target, PROMPT, ds, max_new_tokens=n, config=config, num_draft=num_draft,
                                     length=length, verify=verify)
                tv = compare(law_iterated((), it), want).tv
                out["rest"].append({"num_draft": num_draft, "length": length, "verify": verify, "tv": str(tv),
                                    "tv_float": float(tv), **_value(calls_per_token(it))})
    for k in (1, 2, 3, 4):
        cpt = chain_calls_per_token(target, draft, PROMPT, k=k, config=config, max_new_tokens=n)
        out["chain"].append({"k": k, **_value(cpt)})
    return out


def _greedy_mean(decode, prompts, n) -> dict:
    calls = [decode(prompt).target_calls for prompt in prompts]
    return {"calls_per_token": sum(calls) / (n * len(prompts)), "tokens_per_call": n * len(prompts) / sum(calls)}


def greedy_table(quick: bool) -> dict:
    """Mean calls per token of greedy decodes on the toy language (module docstring)."""
    from specref.core.sampling import GREEDY
    from specref.decoding.lookahead import lookahead_decode
    from specref.decoding.rest import RestDatastore, rest_decode
    from toy_models.corpus import corpus
    from toy_models.ngram import NGramModel
    from toy_models.transformer import CachedTransformer

    n, count = 16, 30 if quick else 100
    prompts = [corpus(200, seed=100 + i)[50 + i: 58 + i] for i in range(count)]
    ds = RestDatastore(corpus(20000, seed=1))
    models = {"trigram": NGramModel.fit([corpus(20000, seed=2)], order=3, vocab_size=40),
              "transformer": CachedTransformer.from_saved("draft_small")}
    rng = np.random.default_rng(0)
    out: dict = {"prompts": count, "max_new_tokens": n, "datastore_tokens": len(ds)}
    for name, model in models.items():
        rows: dict = {"lookahead": [], "rest": []}
        for W, N, G in [(2, 3, 2), (4, 3, 4), (8, 3, 8), (4, 4, 4), (8, 5, 8), (15, 5, 15)][: 3 if quick else 6]:
            def decode(prompt, W=W, N=N, G=G, model=model):
                return lookahead_decode(model, prompt, window=W, ngram=N, guesses=G, max_new_tokens=n, config=GREEDY,
                                        rng=rng, pool_from_prompt=True)
            rows["lookahead"].append({"W": W, "N": N, "G": G, **_greedy_mean(decode, prompts, n)})
        for num_draft in (4, 16, 64)[: 2 if quick else 3]:
            def decode(prompt, num_draft=num_draft, model=model):
                return rest_decode(model, prompt, ds, max_new_tokens=n, config=GREEDY, rng=rng, num_draft=num_draft,
                                   max_matches=500)
            rows["rest"].append({"num_draft": num_draft, "length": 10, "max_matches": 500,
                                 **_greedy_mean(decode, prompts, n)})
        out[name] = rows
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller grid and 30 prompts")
    ap.add_argument("--json", metavar="PATH", default=OUT)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = {"command": "python benchmarks/methods_retrieval.py" + (" --quick" if args.quick else ""),
           "machine": machine_info(), "exact": exact_table(args.quick), "greedy": greedy_table(args.quick)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    best = min(out["exact"]["lookahead"], key=lambda r: r["calls_per_token_float"])
    print(f"exact: best lookahead {best['calls_per_token']} calls/token at W={best['W']} N={best['N']} G={best['G']}; "
          f"{out['seconds']} s -> {args.json}")
    return out



if __name__ == "__main__":
    main()
