"""specref as an oracle: check another implementation, get a verdict and a counterexample.

Three protocol levels (SPEC §3-§4), each with a ``check_*`` function:

- **step**: ``step_fn(p_target, q_draft, draft_tokens, rng) -> tokens`` on probability
  rows (``p_target [K+1, V]``, ``q_draft [K, V]``, ``draft_tokens [K]``) -- :func:`check_step`;
- **logits**: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng) -> tokens``;
  the implementation applies the sampling rules itself -- :func:`check_logits_step`;
- **decoder**: ``decode_fn(target, draft, prompt, *, k, config, max_new_tokens,
  stop_tokens, rng) -> tokens`` with specref models -- :func:`check_decoder`.

The criterion at step level: draft tokens are drawn from q (row ``i`` conditioned on
the prompt and ``x_1..x_{i-1}``), the step emits a block, and the block is completed
to K+1 tokens by target sampling.  The completed sequence must have the target law
of K+1 tokens.  At decoder level the output must have the target sampler's law.

Every level is an entry of :data:`LEVELS` (a :class:`Level`: its signature, the
tables its cases need, its default cases, and how a case becomes a randomized
program with the exact law it must have); :func:`check` runs any of them under one
:class:`Settings`.  Cases are plain data (:mod:`specref.verification.cases`), so a
counterexample reproduces when passed back in (``check_step(fn, cases=[report.counterexample])``).

Modes:

- ``"exact"``: the implementation draws all its randomness from the ``rng`` it is
  handed; specref enumerates every path (:mod:`specref.verification.laws`) and computes the total
  variation to the target law exactly.  It fails when TV > ``tolerance`` (1e-9).
- ``"statistical"``: the implementation uses its own randomness and ``rng`` is an
  integer seed; specref draws N samples (planned by :func:`specref.verification.stats.samples_needed`
  to detect TV >= ``detect_tv`` with power 0.9 at ``alpha``), runs a pooled G-test,
  and reports N, the p-value and a TV interval.

Misbehaviour is reported, never raised: an implementation that raises, returns tokens
outside the vocabulary, returns an empty or over-long block, does arithmetic on a
lazy uniform, or does not return within ``time_limit`` seconds gets that status,
with the case that caused it.
"""

from __future__ import annotations

import copy
from dataclasses import fields, replace
from functools import partial

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.decoding.chain import next_token_probs
from specref.verification.calling import call, checked_tokens
from specref.verification.calling import run_case as guarded_case
from specref.verification.progress import progress_bar
from specref.verification.cases import Case, default_cases, fixed_cases, strategy_cases
from specref.verification.laws import compare, law, target_law
from specref.verification.levels import LEVELS, Level, register
from specref.verification.report import DIFFERS, INTERNAL, OK, CaseResult, Report, Settings, law_verdict
from specref.verification.rules import RulesReport, declare_rules, ruled, rules_of
from specref.verification.shards import check_travel, tally
from specref.verification.stats import compare_counts, samples_needed

__all__ = [
    "Case",
    "CaseResult",
    "Report",
    "Settings",
    "Level",
    "LEVELS",
    "register",
    "run_programs",
    "check",
    "check_step",
    "check_logits_step",
    "check_decoder",
    "default_cases",
    "fixed_cases",
    "strategy_cases",
]


def check(level: str, fn, *, cases=None, settings: Settings | None = None, rules=None, **fields_) -> Report:
    """Check ``fn`` at ``level`` (a key of :data:`LEVELS`) on ``cases`` (default: the level's own).

    Settings come as one :class:`Settings`, or as its fields by keyword
    (``check("step", fn, mode="statistical")``); keywords override ``settings``.
    ``rules`` (logits and decoder levels): the implementation's declared rule order or its
    own plain sampler (:mod:`specref.verification.rules`); speculative output is then
    checked against that sampler, and the report says so.
    """
    if level not in LEVELS:
        raise SpecrefError(f"level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    unknown = set(fields_) - {f.name for f in fields(Settings)}
    if unknown:
        raise SpecrefError(f"unknown setting(s) {sorted(unknown)}; Settings has {[f.name for f in fields(Settings)]}")
    settings = replace(settings or Settings(), **fields_)
    spec = LEVELS[level]
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({spec.signature.split('(')[0]}) must be callable, got {fn!r:.80}")
    if rules is not None:
        fn = declare_rules(fn, rules)
    if rules_of(fn) is not None and level not in ("logits", "decoder"):
        raise SpecrefError(f"rules apply at the logits and decoder levels, not {level!r}")
    try:
        cases = spec.cases() if cases is None else list(cases)
    except TypeError:
        raise SpecrefTypeError(f"cases must be an iterable of Case objects, got {cases!r:.80}") from None
    if not cases:
        raise SpecrefError(f"cases is empty: a check on no case proves nothing (level {level!r})")
    if settings.mode == "statistical":
        check_travel(settings.executor, fn)  # before any case runs: a usage error, not the implementation's
    report = spec.run(spec, fn, cases, settings)
    return report if rules_of(fn) is None else RulesReport.of(report, rules_of(fn))


def run_programs(spec: Level, fn, cases, settings: Settings) -> Report:
    """Step, logits and decoder levels: each case is a randomized program with an exact law,
    enumerated (exact mode) or sampled and G-tested (statistical mode)."""
    for c in cases:
        _check_case(spec, c, settings.max_paths)
    level = spec.name
    report = Report(level=level, mode=settings.mode)
    # an executor's shards run in processes of their own; otherwise the whole case runs in a forked worker
    isolate = settings.isolate and getattr(settings, "executor", None) is None
    for i, case in enumerate(cases):
        snapshot = copy.deepcopy(case)  # the case as handed in: a counterexample must reproduce from it
        run_case = case if settings.mode == "exact" else case.as_float()
        program, expected = spec.program(fn, run_case, settings.time_limit)
        if settings.mode == "exact":
            body = partial(_exact, case, program, expected, settings.tolerance, settings.max_paths)
        else:
            recipe = partial(_program_of, level, fn, run_case, settings.time_limit)  # rebuilt where it runs
            body = partial(_statistical, case, recipe, expected, settings, settings.seed + i)
        result = guarded_case(body, case, isolate=isolate, time_limit=settings.time_limit,
                              case_time_limit=settings.case_time_limit)
        report.results.append(_rechecked(spec, result, snapshot, expected, settings))
    return report


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
    check = guarded_case(partial(_exact, snapshot, program, reference_law, settings.tolerance, settings.max_paths),
                         snapshot, isolate=False, time_limit=settings.time_limit,
                         case_time_limit=settings.case_time_limit)
    if check.status != OK or compare(reference_law, expected).tv > settings.tolerance:
        result.status = INTERNAL
        result.detail = f"the reference does not reproduce this case's law ({check.status}); " + result.detail
    return result


def check_step(step_fn, **options) -> Report:
    """``check("step", step_fn, **options)``: ``step_fn(p_target, q_draft, draft_tokens, rng)``."""
    return check("step", step_fn, **options)


def check_logits_step(step_fn, **options) -> Report:
    """``check("logits", step_fn, **options)``: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng)``."""
    return check("logits", step_fn, **options)


def check_decoder(decode_fn, **options) -> Report:
    """``check("decoder", decode_fn, **options)``: ``decode_fn(target, draft, prompt, *, k, config, ...)``."""
    return check("decoder", decode_fn, **options)


def _check_case(spec: Level, case, max_paths: int):
    level = spec.name
    if not isinstance(case, Case):
        raise SpecrefError(f"cases must hold specref.verification.cases.Case objects, got {case!r}")
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


def _exact(case, program, expected, tolerance, max_paths):
    """One case enumerated; misbehaviour propagates as Misbehaved (calling.run_case makes it a status)."""
    got = law(lambda rng: program(rng, rng), max_paths=max_paths)
    return law_verdict(case, compare(got, expected), tolerance)


def _program_of(level, fn, case, time_limit):
    """The level's program for a case, built where it runs (a shard's worker, or here)."""
    return LEVELS[level].program(fn, case, time_limit)[0]


def _statistical(case, recipe, expected, settings, seed):
    """N samples in shards (:mod:`specref.verification.shards`), then a pooled G-test."""
    outcomes = sorted(expected)
    null = np.array([float(expected[o]) for o in outcomes] + [0.0])  # last bin: outputs the target never makes
    alpha = settings.alpha
    n = settings.samples or samples_needed(settings.detect_tv, alpha, 0.9, len(null), null=null)
    with progress_bar(n, f"{case.name}", enabled=settings.progress) as bar:
        t = tally(recipe, outcomes, n, seed, executor=settings.executor, shard_blocks=settings.shard_blocks,
                  progress=bar, store=settings.shard_store)
    if t.misbehaved:
        _, status, detail = t.misbehaved
        return CaseResult(case, status, detail=detail)
    counts, strays = t.counts, t.strays
    result = compare_counts(counts, null, alpha=alpha)
    est = result.tv
    detail = f"{result.g}"
    if strays:
        detail += f"; outputs the target never makes: {dict(list(strays.items())[:3])}"
    return CaseResult(case, DIFFERS if result.rejected else OK, tv=est.estimate, detail=detail,
                      n_samples=n, p_value=result.g.p_value, tv_interval=(est.lower, est.upper))


# ---------------------------------------------------------------- the registry

register(Level("step", "step_fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> tokens",
               lambda: default_cases("step"), run_programs, tables="probs", program=_step_program))
register(Level("logits", "step_fn(target_logits [K+1, V], draft_logits [K, V], draft_tokens [K], config, rng) -> tokens",
               lambda: default_cases("logits"), run_programs, tables="logits",
               program=lambda fn, case, time_limit: _step_program(fn, case, time_limit, logits=True)))
register(Level("decoder", "decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng) -> tokens",
               lambda: default_cases("decoder"), run_programs, program=_decoder_program))

# Levels defined in other modules of this floor register themselves when imported here, so that
# check() and the CLI see every level (one import line per module below).
from specref.verification import trees  # noqa: E402,F401  registers "tree"
from specref.verification import batched  # noqa: E402,F401  registers "batched" and "draft_and_verify"
