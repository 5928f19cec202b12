"""The chain levels (SPEC §3-§4): step, logits and decoder.

- **step**: ``step_fn(p_target, q_draft, draft_tokens, rng) -> tokens`` on probability
  rows (``p_target [K+1, V]``, ``q_draft [K, V]``, ``draft_tokens [K]``);
- **logits**: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng) -> tokens``;
  the implementation applies the sampling rules itself;
- **decoder**: ``decode_fn(target, draft, prompt, *, k, config, max_new_tokens,
  stop_tokens, rng) -> tokens`` with specref models.

The criterion at step level: draft tokens are drawn from q (row ``i`` conditioned on
the prompt and ``x_1..x_{i-1}``), the step emits a block, and the block is completed
to K+1 tokens by target sampling.  The completed sequence must have the target law
of K+1 tokens.  At decoder level the output must have the target sampler's law.

Each case becomes a randomized program with the exact law it must have (``Level.program``);
:func:`specref.verification.levels.runner.run_cases` enumerates it (exact mode) or samples
it in seeded shards and G-tests the counts (statistical mode).
"""

from __future__ import annotations

import copy
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.decoding.chain import next_token_probs
from specref.verification.running.calling import call, checked_tokens
from specref.verification.running.calling import run_case as guarded_case
from specref.verification.cases.chain import Case, default_cases
from specref.verification.laws.enumeration import compare, target_law
from specref.verification.levels.runner import exact_verdict, run_cases, sampled_verdict
from specref.verification.running.level import Level
from specref.verification.running.report import DIFFERS, INTERNAL, OK, Report, Settings
from specref.verification.cases.rules import ruled, rules_of

__all__ = ["LEVELS", "run_programs"]


def run_programs(spec: Level, fn, cases, settings: Settings) -> Report:
    """Step, logits and decoder levels: each case is a randomized program with an exact law,
    enumerated (exact mode) or sampled and G-tested (statistical mode), through
    :func:`~specref.verification.levels.runner.run_cases`."""
    handed_in, expected_of = {}, {}  # by id(case): the case as handed in, and the law it must have

    def prepared(case, run_case):
        handed_in[id(case)] = copy.deepcopy(case)  # a counterexample must reproduce from the case as handed in
        program, expected_of[id(case)] = spec.program(fn, run_case, settings.time_limit)
        return program

    def exact(case):
        program = prepared(case, case)
        return partial(exact_verdict, case, lambda rng: program(rng, rng), expected_of[id(case)], settings)

    def statistical(case, seed):
        run_case = case.as_float()
        prepared(case, run_case)
        recipe = partial(_program_of, spec.name, fn, run_case, settings.time_limit)  # rebuilt where it runs
        return partial(sampled_verdict, case, recipe, expected_of[id(case)], settings, seed)

    def recheck(case, result):
        return _rechecked(spec, result, handed_in[id(case)], expected_of[id(case)], settings)

    return run_cases(spec, cases, settings, validate=lambda c: _check_case(spec, c, settings.max_paths),
                     exact=exact, statistical=statistical, recheck=recheck)


def _reference(level):
    """specref's own implementation at a level, for re-checking a counterexample."""
    from specref.core.sampling import process
    from specref.core.step import speculative_step
    from specref.decoding.chain import speculative_decode

    if level == "step":
        return speculative_step
    if level == "logits":
        return lambda t, d, x, config, rng: speculative_step(process(t, config), process(d, config), x, rng)
    return lambda target, draft, prompt, **kw: speculative_decode(target, draft, prompt, **kw).tokens


def _rechecked(spec, result, snapshot, expected, settings):
    """A case that differs is reported only if it is intact and the reference preserves on it."""
    if result.status != DIFFERS or spec.name not in ("step", "logits", "decoder"):
        return result
    case = result.case
    same = all(np.array_equal(getattr(case, f), getattr(snapshot, f)) for f in ("target", "draft")) and (
        (case.prompt, case.k, case.config, case.max_new_tokens, case.stop_tokens)
        == (snapshot.prompt, snapshot.k, snapshot.config, snapshot.max_new_tokens, snapshot.stop_tokens))
    if not same:
        result.status, result.case = INTERNAL, snapshot
        result.detail = "the case changed while it was checked; " + result.detail
        return result
    program, reference_law = spec.program(_reference(spec.name), snapshot, settings.time_limit)
    check = guarded_case(partial(exact_verdict, snapshot, lambda rng: program(rng, rng), reference_law, settings),
                         snapshot, isolate=False, time_limit=settings.time_limit,
                         case_time_limit=settings.case_time_limit)
    if check.status != OK or compare(reference_law, expected).tv > settings.tolerance:
        result.status = INTERNAL
        result.detail = f"the reference does not reproduce this case's law ({check.status}); " + result.detail
    return result


def _check_case(spec: Level, case, max_paths: int):
    level = spec.name
    if not isinstance(case, Case):
        raise SpecrefError(f"cases must hold specref.verification.cases.chain.Case objects, got {case!r}")
    if spec.tables and case.tables != spec.tables:
        raise SpecrefError(f"case {case.name!r} has tables={case.tables!r}; the {level} level needs {spec.tables!r}")
    if len(case.prompt) < case.target.ndim - 1:
        raise SpecrefError(f"case {case.name!r}: prompt {case.prompt} is shorter than the tables' context "
                           f"({case.target.ndim - 1} tokens)")
    if case.draft.shape != case.target.shape:
        raise SpecrefError(f"case {case.name!r}: draft table shape {case.draft.shape} != target {case.target.shape}")
    if level == "step" and case.config != SamplingConfig():
        raise SpecrefError(f"case {case.name!r}: step-level tables are final distributions; config must be default")
    case.models()  # validates the tables
    check_positive_int("k", case.k)
    V, n = case.vocab_size, case.max_new_tokens if level == "decoder" else case.k + 1
    prefixes = sum(V ** i for i in range(n)) if V > 1 else n  # model queries of the target law
    if prefixes > max_paths:
        raise SpecrefError(f"case {case.name!r}: its target law has up to {prefixes} prefixes (V={V}, "
                           f"{n} tokens), over max_paths={max_paths}; shrink the case or raise max_paths")


def _decoder_program(fn, case, time_limit):
    """Decoder level: the output must have the target sampler's law."""
    target, _ = case.models()
    models = case.models()  # validated once; each call gets copies of these (the oracle keeps `target`)
    V, prompt = case.vocab_size, list(case.prompt)
    n = case.max_new_tokens

    def program(rng, impl_rng):
        # fresh models and config for every call: what the implementation does to them stays there
        out = call(fn, (_fresh(models[0]), _fresh(models[1]), list(prompt)),
                   dict(k=case.k, config=copy.copy(case.config), max_new_tokens=n,
                        stop_tokens=list(case.stop_tokens), rng=impl_rng), time_limit,
                   convert=lambda out: checked_tokens(out, V, min_len=0, max_len=n, what="decode_fn"))
        return tuple(out)

    law_model, law_config = ruled(target, case.config, rules_of(fn))  # the target's own plain sampler
    return program, target_law(law_model, prompt, law_config, case.max_new_tokens, case.stop_tokens)


def _fresh(model):
    """A copy of a table model with its own table (validated already: no second check)."""
    twin = copy.copy(model)
    twin.table = model.table.copy()
    return twin


def _step_program(fn, case, time_limit, *, logits=False):
    """Step and logits levels: draft K tokens ~ q, call ``fn`` on the rows, complete the
    block to K+1 tokens by target sampling; the result must have the target law of K+1 tokens.
    At the logits level ``fn`` gets raw logits and the config and applies the rules itself."""
    target, draft = case.models()
    V, k, config, prompt = case.vocab_size, case.k, case.config, list(case.prompt)
    rows = {}  # processed next-token rows per prefix: the oracle's own, computed once
    (law_t, law_config), (law_d, _) = ruled(target, config, rules_of(fn)), ruled(draft, config, rules_of(fn))
    law_models = {id(target): law_t, id(draft): law_d}  # seen through the implementation's declared rules

    def raw(model, context):  # unprocessed rows, a fresh copy for the implementation
        return (model(context) if logits else model.probs(context)).copy()

    def row(model, context):
        key = (id(model), tuple(context))
        if key not in rows:
            rows[key] = next_token_probs(law_models[id(model)], context, law_config)
        return rows[key]

    def program(rng, impl_rng):
        context = list(prompt)
        for _ in range(k):  # draft tokens ~ q, each row conditioned on the tokens before it
            context.append(draw(rng, row(draft, context)))
        drafted = context[len(prompt):]
        # the K+1 target rows and K draft rows for the prefixes prompt + x_<i, as the model gives them
        t_rows, d_rows = raw(target, context)[-(k + 1):], raw(draft, context[:-1])[-k:]
        args = (t_rows, d_rows, np.array(drafted)) + ((copy.copy(config),) if logits else ())
        out = call(fn, args + (impl_rng,), {}, time_limit,
                   convert=lambda out: checked_tokens(out, V, min_len=1, max_len=k + 1, what="step_fn"))
        while len(out) < k + 1:  # complete the block by target sampling
            out.append(draw(rng, row(target, prompt + out)))
        return tuple(out)

    return program, target_law(law_t, prompt, law_config, k + 1)


def _program_of(level, fn, case, time_limit):
    """The level's program for a case, built where it runs (a shard's worker, or here)."""
    return _BY_NAME[level].program(fn, case, time_limit)[0]


# ---------------------------------------------------------------- the levels

LEVELS = (
    Level("step", "step_fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> tokens",
          lambda: default_cases("step"), run_programs, tables="probs", program=_step_program),
    Level("logits", "step_fn(target_logits [K+1, V], draft_logits [K, V], draft_tokens [K], config, rng) -> tokens",
          lambda: default_cases("logits"), run_programs, tables="logits",
          program=lambda fn, case, time_limit: _step_program(fn, case, time_limit, logits=True)),
    Level("decoder", "decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng) -> tokens",
          lambda: default_cases("decoder"), run_programs, program=_decoder_program),
)
"""The three chain levels, in the order the registry lists them."""
_BY_NAME = {level.name: level for level in LEVELS}
