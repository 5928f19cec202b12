"""specref as an oracle: check another implementation, get a verdict and a counterexample.

:func:`check` runs any level of :data:`~specref.verification.levels.LEVELS` under one
:class:`~specref.verification.running.report.Settings`; the ``check_*`` functions are its shorthands, one per level:

- **step**, **logits**, **decoder** (SPEC §3-§4; :mod:`specref.verification.levels.chain`);
- **batched**, **draft_and_verify** (SPEC §11; :mod:`specref.verification.levels.batched`);
- **tree** (SPEC §12; :mod:`specref.verification.levels.trees`), and dense batches of trees
  (:func:`check_tree_batch`);
- **vllm**, **flashinfer**: the batched level in the engines' calls
  (:mod:`specref.verification.levels.engines`).

``batch=n`` (step, logits and decoder levels) says "call me with ``n`` samples at once": the
same as :func:`~specref.verification.levels.chain.declare_batch` (SPEC §13.1).

Cases are plain data, so a counterexample reproduces when passed back in
(``check_step(fn, cases=[report.counterexample])``).

Modes:

- ``"exact"``: the implementation draws all its randomness from the ``rng`` it is handed;
  specref enumerates every path (:mod:`specref.verification.laws`) and computes the total
  variation to the target law exactly.  It fails when TV > ``tolerance`` (SPEC §13).
- ``"statistical"``: the implementation uses its own randomness and ``rng`` is an integer
  seed; specref draws N samples (planned by
  :func:`specref.verification.statistics.counts.samples_needed` to detect TV >= ``detect_tv``
  with power 0.9 at ``alpha``), runs a pooled G-test, and reports N, the p-value and a TV interval.

Misbehaviour is reported, never raised: an implementation that raises, returns tokens
outside the vocabulary, returns an empty or over-long block, does arithmetic on a lazy
uniform, or does not return within ``time_limit`` seconds gets that status, with the case
that caused it.
"""

from __future__ import annotations

from dataclasses import fields, replace
from functools import partial
from numbers import Integral

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.verification.cases.chain import Case, default_cases, fixed_cases, strategy_cases
from specref.verification.cases.rules import RulesReport, declare_rules, rules_of
from specref.verification.laws.enumeration import compare
from specref.verification.levels import LEVELS, register
from specref.verification.levels.batched import default_batched_cases
from specref.verification.levels.chain import batch_of, declare_batch, run_programs
from specref.verification.levels.trees import run_tree_batch, tree_cases
from specref.verification.running.level import Level
from specref.verification.running.report import CaseResult, Report, Settings
from specref.verification.statistics.shards import check_travel

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
    "declared",
    "check_step",
    "check_logits_step",
    "check_decoder",
    "check_batched_step",
    "check_draft_and_verify",
    "check_tree",
    "check_tree_batch",
    "compare",
    "default_cases",
    "fixed_cases",
    "strategy_cases",
]


BATCH_LEVELS = ("step", "logits", "decoder")  # the levels where batch= (calls of n samples) applies


def check(level: str, fn, *, cases=None, settings: Settings | None = None, rules=None, batch: int | None = None,
          **fields_) -> Report:
    """Check ``fn`` at ``level`` (a key of :data:`~specref.verification.levels.LEVELS`) on ``cases`` (default: the level's own).

    Settings come as one :class:`~specref.verification.running.report.Settings`, or as its fields by keyword
    (``check("step", fn, mode="statistical")``); keywords override ``settings``.
    ``rules`` (logits and decoder levels): the implementation's declared rule order or its
    own plain sampler (:mod:`specref.verification.cases.rules`); speculative output is then
    checked against that sampler, and the report says so.
    ``batch`` (step, logits and decoder levels): ``fn`` takes ``batch`` samples per call, rows
    stacked (:func:`~specref.verification.levels.chain.declare_batch`; SPEC §13.1).
    """
    if not isinstance(level, str) or level not in LEVELS:
        raise SpecrefError(f"level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    return _check(LEVELS[level], fn, cases=cases, settings=settings, rules=rules, batch=batch, **fields_)


def declared(level: str, fn, *, rules=None, batch: int | None = None):
    """``fn`` with ``rules`` and ``batch`` declared on it (:func:`check`'s arguments), validated:
    ``batch`` a positive int (not a bool) at the step, logits and decoder levels, ``rules`` at the
    logits and decoder levels.  A batch already declared keeps its array, device and dtype."""
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({level} level) must be callable, got {fn!r:.80}")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, Integral) or batch < 1:
            raise SpecrefError(f"batch (samples per call) must be a positive integer, got {batch!r:.80}")
        if level not in BATCH_LEVELS:
            raise SpecrefError(f"batch (samples per call) applies at the {', '.join(BATCH_LEVELS)} levels, "
                               f"not {level!r}")
        form = batch_of(fn)
        kw = {} if form is None else dict(array=form.array, device=form.device, dtype=form.dtype)
        fn = declare_batch(fn, int(batch), **kw)
    if rules is not None:
        fn = declare_rules(fn, rules)
    if rules_of(fn) is not None and level not in ("logits", "decoder"):
        raise SpecrefError(f"rules apply at the logits and decoder levels, not {level!r}")
    return fn


def _check(spec: Level, fn, *, cases, settings, rules, batch=None, **fields_) -> Report:
    """:func:`check` on a level object (a registered level, or a variant of one)."""
    level = spec.name
    unknown = set(fields_) - {f.name for f in fields(Settings)}
    if unknown:
        raise SpecrefError(f"unknown setting(s) {sorted(unknown)}; Settings has {[f.name for f in fields(Settings)]}")
    settings = replace(settings or Settings(), **fields_)
    if not callable(fn):
        raise SpecrefTypeError(f"the implementation ({spec.signature.split('(')[0]}) must be callable, got {fn!r:.80}")
    fn = declared(level, fn, rules=rules, batch=batch)
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


def check_step(step_fn, **options) -> Report:
    """``check("step", step_fn, **options)``: ``step_fn(p_target, q_draft, draft_tokens, rng)``."""
    return check("step", step_fn, **options)


def check_logits_step(step_fn, **options) -> Report:
    """``check("logits", step_fn, **options)``: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng)``."""
    return check("logits", step_fn, **options)


def check_decoder(decode_fn, **options) -> Report:
    """``check("decoder", decode_fn, **options)``: ``decode_fn(target, draft, prompt, *, k, config, ...)``."""
    return check("decoder", decode_fn, **options)


def _with_array(cases, array):
    return cases if array is None else [replace(c, array=array) for c in cases]


def check_batched_step(step_fn, *, cases=None, array: str | None = None, **settings) -> Report:
    """``check("batched", step_fn)``: ``step_fn(p_target [B,K+1,V], q_draft [B,K,V] | None, draft_tokens [B,K], seed)``.

    ``array="torch"`` hands the implementation torch tensors in statistical mode.
    """
    cases = default_batched_cases("batched") if cases is None else list(cases)
    return check("batched", step_fn, cases=_with_array(cases, array), **settings)


def check_draft_and_verify(step_fn, *, cases=None, array: str | None = None, **settings) -> Report:
    """``check("draft_and_verify", step_fn)``: ``step_fn(p_target [B,K+1,V], q_draft [B,K,V], seed)``."""
    cases = default_batched_cases("draft_and_verify") if cases is None else list(cases)
    return check("draft_and_verify", step_fn, cases=_with_array(cases, array), **settings)


def check_tree(tree_step_fn, *, drafting: str = "topk", **options) -> Report:
    """``check("tree", fn, cases=tree_cases(drafting), **options)``."""
    options.setdefault("cases", tree_cases(drafting))
    return check("tree", tree_step_fn, **options)


def check_tree_batch(kernel, *, batch: int = 2, cases=None, **options) -> Report:
    """``check("tree_batch", kernel)`` with ``batch`` trees per call (SPEC §12): exact with the
    kernel's coins as lazy uniforms, or statistical; ``options`` are :class:`~specref.verification.running.report.Settings` fields."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecrefError(f"batch must be a positive integer, got {batch!r}")
    spec = replace(LEVELS["tree_batch"], run=partial(run_tree_batch, batch=batch))
    return _check(spec, kernel, cases=cases, settings=options.pop("settings", None), rules=options.pop("rules", None),
                  **options)
