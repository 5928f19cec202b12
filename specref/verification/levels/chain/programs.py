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

**Calls in batches.**  An implementation may take ``n`` samples per call
(``check(..., batch=n)``, :func:`declare_batch`, or an attribute ``fn.specref_batch = n``): in statistical mode the
oracle then calls it once per ``n`` samples, with the rows stacked --

- step: ``step_fn(p_target [n, K+1, V], q_draft [n, K, V], draft_tokens [n, K], seeds [n])``;
- logits: ``step_fn(target_logits [n, K+1, V], draft_logits [n, K, V], draft_tokens [n, K], config, seeds [n])``;
- decoder: ``decode_fn(target, draft, prompts [n, P], *, k, config, max_new_tokens, stop_tokens, rng=seeds [n])``;

each returning ``n`` token lists (or an ``[n, L]`` array padded at the end with ``-1``).
``seeds`` is a NumPy int64 array, one seed per sample.  A call never spans two blocks of
:data:`~specref.verification.statistics.shards.BLOCK` samples, so ``n`` above 1024 is cut to
1024.  In exact mode (and in an exact-mode :func:`~specref.verification.campaigns.planning.plan`)
such an implementation gets batches of one, with ``seeds = [rng]``; a statistical plan times
calls of the declared batch.

**Seeds and coins in statistical mode** (the same for one call per sample and for calls in
batches, so the counts are identical for the same seed whatever the batch size, when the
implementation's output depends only on its rows and its seed, as the reference's does):
block ``j`` of a case seeded ``seed`` draws from ``block_rng(seed, j)``, in this order,
``seeds = gen.integers(2**63, size=m)`` (sample ``i`` of the block hands ``seeds[i]`` to the
implementation) and then ``coins = gen.random((m, 2K))`` at the step and logits levels
(none at the decoder level): sample ``i`` draws its K draft tokens with ``coins[i, :K]`` and
its completion tokens with ``coins[i, K:]``, each by inverse CDF on the row
(``searchsorted(cumsum(row) / sum(row), u, side="right")``, the draw ``Generator.choice``
makes).
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from numbers import Integral
from typing import Callable

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.decoding.chain import next_token_probs
from specref.verification.running.calling import Misbehaved, call, checked_tokens
from specref.verification.running.calling import run_case as guarded_case
from specref.verification.cases.chain import Case, default_cases
from specref.verification.laws.enumeration import compare, law, target_law
from specref.verification.levels.runner import exact_verdict, run_cases, sampled_verdict
from specref.verification.running.level import CasePlan, Level, Option
from specref.verification.running.report import DIFFERS, INTERNAL, INVALID, OK, Report, Settings, law_verdict
from specref.verification.cases.rules import (CONVENTIONS, RuledModel, Rules, RulesReport, apply_rules, declare_rules, ruled,
                                              rules_of)
from specref.verification.statistics.counts import planned_n
from specref.verification.statistics.shards import BLOCK, Sampler, calls_for, tally_blocks, timed_calls

__all__ = ["LEVELS", "BATCH", "RULES", "run_programs", "declare_batch", "batch_of", "BatchForm"]

ARRAYS = ("numpy", "torch")  # what a batched implementation's rows are handed as
DTYPES = ("float64", "float32")


# ---------------------------------------------------------------- batch declarations


@dataclass(frozen=True)
class BatchForm:
    """How an implementation takes its samples: ``size`` per call, rows as ``array``
    (``"numpy"`` or ``"torch"``, then on ``device``) of ``dtype``."""

    size: int
    array: str = "numpy"
    device: str | None = None
    dtype: str = "float64"

    def __post_init__(self):
        check_positive_int("batch", self.size)
        if self.array not in ARRAYS:
            raise SpecrefError(f"array must be one of {', '.join(ARRAYS)}, got {self.array!r}")
        if self.dtype not in DTYPES:
            raise SpecrefError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device is not None and (self.array != "torch" or not isinstance(self.device, str)):
            raise SpecrefError(f"device is a torch device name (with array='torch'), got {self.device!r}")

    @property
    def per_call(self) -> int:
        """Samples per call: ``size``, at most one block."""
        return min(self.size, BLOCK)


class declare_batch:
    """``fn`` declared to take ``size`` samples per call (``fn.specref_batch``); calls go straight
    to ``fn``.  ``array="torch"`` hands the rows (and draft tokens, or prompts) as torch tensors on
    ``device``; ``dtype`` is the rows' (``"float64"`` or ``"float32"``).  Declared rules of
    ``fn`` (``fn.specref_rules``) stay visible on the wrapper."""

    def __init__(self, fn, size: int, *, array: str = "numpy", device: str | None = None, dtype: str = "float64"):
        if not callable(fn):
            raise SpecrefError(f"declare_batch needs a callable, got {fn!r:.80}")
        self.fn, self.specref_batch = fn, BatchForm(size, array, device, dtype)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        rules = getattr(fn, "specref_rules", None)
        if rules is not None:
            self.specref_rules = rules

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"declare_batch({self.fn!r}, {self.specref_batch.size})"


def batch_of(fn) -> BatchForm | None:
    """The batch ``fn`` declares (``fn.specref_batch``: a :class:`BatchForm` or an int), or None."""
    form = getattr(fn, "specref_batch", None)
    if form is None or isinstance(form, BatchForm):
        return form
    if isinstance(form, (int, np.integer)) and not isinstance(form, bool):
        return BatchForm(int(form))
    raise SpecrefError(f"specref_batch must be a positive int or a BatchForm, got {form!r:.80}")


# ---------------------------------------------------------------- the levels' runner


def run_programs(spec: Level, fn, cases, settings: Settings) -> Report:
    """Step, logits and decoder levels: each case is a randomized program with an exact law,
    enumerated (exact mode) or sampled and G-tested (statistical mode), through
    :func:`~specref.verification.levels.runner.run_cases`, which is told ``fn``: under the default
    ``Settings.isolate`` a statistical check runs each case in a forked worker (unless ``fn``
    declares ``specref_isolate = False``)."""
    batch_of(fn)  # a malformed declaration is a usage error, before any case runs
    handed_in, expected_of = {}, {}  # by id(case): the case as handed in, and the law it must have

    def prepared(case, run_case):
        handed_in[id(case)] = copy.deepcopy(case)  # a counterexample must reproduce from the case as handed in
        program, expected_of[id(case)] = spec.program(fn, run_case, settings.time_limit)
        return program

    def exact(case):
        program = prepared(case, case)
        others = None if spec.name == "step" else partial(_other_conventions, spec, fn, case, settings)
        return partial(_exact_named, case, lambda rng: program(rng, rng), expected_of[id(case)], settings, others)

    def statistical(case, seed):
        run_case = case.as_float()
        prepared(case, run_case)
        recipe = partial(_sampler_of, spec.name, fn, run_case, settings.time_limit)  # rebuilt where it runs
        return partial(sampled_verdict, case, recipe, expected_of[id(case)], settings, seed)

    def recheck(case, result):
        return _rechecked(spec, result, handed_in[id(case)], expected_of[id(case)], settings, rules_of(fn))

    report = run_cases(spec, cases, settings, validate=lambda c: _check_case(spec, c, settings),
                       exact=exact, statistical=statistical, recheck=recheck, fn=fn)
    return report if rules_of(fn) is None else RulesReport.of(report, rules_of(fn))


def _exact_named(case, program, expected, settings: Settings, others=None):
    """:func:`~specref.verification.levels.runner.exact_verdict`, and for a case that differs the
    name of a convention (:data:`~specref.verification.cases.rules.CONVENTIONS`) under which the
    implementation has exactly its plain sampler's law: a sampler with another tie rule is
    reported by its name.  ``others(expected) -> (label, implementation's law, its sampler's law)``
    for each convention one change away from the declared rules."""
    got = law(program, max_paths=settings.max_paths)
    result = law_verdict(case, compare(got, expected), settings.tolerance)
    if result.status == DIFFERS and others is not None:
        for label, got_other, other in others(expected, settings.tolerance):
            if compare(got_other, other).tv <= settings.tolerance:
                result.detail = (f"the output has the law of the plain sampler with {label} (declare it: "
                                 f"rules=Rules({label})); " + result.detail)
                break
    return result


def _other_conventions(spec, fn, case, settings, expected, tolerance):
    """``(label, law, its sampler's law)`` of ``fn`` checked under each convention one change away
    from its declared rules (the oracle's drafts drawn under that convention too); conventions
    that do not change this case's law, and runs that misbehave, are left out."""
    base = rules_of(fn) or Rules()
    if base.sampler is not None:  # an own sampler decides its ties itself
        return
    for name, known in CONVENTIONS.items():
        for value in known:
            if value == getattr(base, name):
                continue
            other = declare_rules(fn, replace(base, **{name: value}))
            program, law_other = spec.program(other, case, settings.time_limit)
            if compare(law_other, expected).tv <= tolerance:
                continue
            try:
                got = law(lambda rng, program=program: program(rng, rng), max_paths=settings.max_paths)
            except (Misbehaved, SpecrefError):
                continue
            yield f"{name}={value!r}", got, law_other


def _reference(level, rules=None):
    """specref's own implementation at a level, for re-checking a counterexample; with the
    implementation's declared ``rules`` it samples through them (and declares them)."""
    from specref.core.step import speculative_step
    from specref.decoding.chain import speculative_decode

    if level == "step":
        return speculative_step

    reference: Callable  # one of three calls
    if level == "logits":
        def reference(t, d, x, config, rng):
            return speculative_step(apply_rules(t, config, rules), apply_rules(d, config, rules), x, rng)
    elif rules is None:
        def reference(target, draft, prompt, **kw):
            return speculative_decode(target, draft, prompt, **kw).tokens
    else:
        def reference(target, draft, prompt, *, config, **kw):
            t, d = RuledModel(target, rules, config), RuledModel(draft, rules, config)
            return speculative_decode(t, d, prompt, config=SamplingConfig(), **kw).tokens
    return reference if rules is None else declare_rules(reference, rules)


def _rechecked(spec, result, snapshot, expected, settings, rules=None):
    """A case that differs is reported only if it is intact and the reference (sampling through
    the implementation's declared ``rules``) preserves on it."""
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
    program, reference_law = spec.program(_reference(spec.name, rules), snapshot, settings.time_limit)
    check = guarded_case(partial(exact_verdict, snapshot, lambda rng: program(rng, rng), reference_law, settings),
                         snapshot, isolate=False, time_limit=settings.time_limit,
                         case_time_limit=settings.case_time_limit)
    if check.status != OK or compare(reference_law, expected).tv > settings.tolerance:
        result.status = INTERNAL
        result.detail = f"the reference does not reproduce this case's law ({check.status}); " + result.detail
    return result


def _check_case(spec: Level, case, settings: Settings):
    """SpecrefError unless ``case`` is a :class:`Case` this level can run within ``settings.max_paths``."""
    level, max_paths = spec.name, settings.max_paths
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


# ---------------------------------------------------------------- batched calls


class _RowMisbehaved(Misbehaved):
    """A batched call's output misbehaved in one row: ``row`` is its index in the call."""

    def __init__(self, status, detail, row):
        super().__init__(status, detail)
        self.row = row


def _checked_batch(out, m, V, *, min_len, max_len, what):
    """A batched call's output: ``m`` token lists (a sequence of them, or an ``[m, L]`` array
    padded at the end with -1), each checked as :func:`checked_tokens` checks one call's."""
    try:
        rows = out.tolist() if hasattr(out, "tolist") else list(islice(iter(out), m + 1))
        rows = rows if isinstance(rows, list) else [rows]
    except Exception as e:  # noqa: BLE001 - the output's own methods failed (a time-out passes through)
        raise Misbehaved(INVALID, f"{what} returned {type(out).__name__}, not {m} rows of tokens "
                                  f"({type(e).__name__}: {e})") from None
    if len(rows) != m:
        more = "or more " if len(rows) > m else ""
        raise Misbehaved(INVALID, f"{what} returned {len(rows)} {more}rows for a batch of {m} samples")
    checked = []
    for r, row in enumerate(rows):
        try:
            checked.append(checked_tokens(_unpadded(row), V, min_len=min_len, max_len=max_len,
                                          what=f"{what} (row {r})"))
        except Misbehaved as e:
            raise _RowMisbehaved(e.status, e.detail, r) from None
        except Exception as e:  # noqa: BLE001 - the row's own methods failed
            raise _RowMisbehaved(INVALID, f"{what} (row {r}) is not a sequence of tokens "
                                          f"({type(e).__name__}: {e})", r) from None
    return checked


def _unpadded(row):
    """A row without its trailing -1 padding (a list; other objects as they are)."""
    if hasattr(row, "tolist"):  # a tensor or array per row
        row = row.tolist()
    if not isinstance(row, (list, tuple)):
        return row
    row = list(row)
    while row and isinstance(row[-1], (int, np.integer)) and not isinstance(row[-1], bool) and row[-1] == -1:
        row.pop()
    return row


def _handed(form: BatchForm, array):
    """Rows or tokens as the implementation takes them (a fresh array: what it does stays there)."""
    if form.array == "numpy":
        return array.astype(form.dtype) if array.dtype.kind == "f" else array.copy()
    import torch

    t = torch.from_numpy(np.array(array, copy=True))  # its own memory: .to() below may not copy
    t = t.to(getattr(torch, form.dtype)) if array.dtype.kind == "f" else t.to(torch.int64)
    return t.to(form.device) if form.device else t


def _seeds(impl_rngs):
    """Seeds for a batched call: an int64 array of integer seeds, else (exact mode) the list of generators."""
    if all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in impl_rngs):
        return np.array(impl_rngs, dtype=np.int64)
    return list(impl_rngs)


def _cdf(row):
    """The inverse-CDF table of a row: ``cumsum(row) / sum(row)`` (as ``Generator.choice``)."""
    cdf = np.cumsum(np.asarray(row, dtype=np.float64))
    cdf /= cdf[-1]
    return cdf


class _Coins:
    """One sample's coins in statistical mode: each of the oracle's draws takes the next one."""

    __slots__ = ("u", "i")

    def __init__(self, u):
        self.u, self.i = u, 0

    def take(self) -> float:
        self.i += 1
        return self.u[self.i - 1]


# ---------------------------------------------------------------- the decoder level


def _decoder_program(fn, case, time_limit):
    """Decoder level: the output must have the target sampler's law."""
    run = _DecoderRun(fn, case, time_limit)
    law_model, law_config = ruled(run.models[0], case.config, rules_of(fn))  # the target's own plain sampler
    return run.one, target_law(law_model, list(case.prompt), law_config, case.max_new_tokens, case.stop_tokens)


class _ChainCalls(Sampler):
    """What the decoder and step calls share as a :class:`~specref.verification.statistics.shards.Sampler`:
    a block draws its seeds, then its coins (module docstring); its samples run one call each, or
    ``per_call`` to a call for an implementation that declares a batch."""

    coins = 0  # coins the oracle draws per sample
    form: BatchForm | None  # the batch the implementation declares (set by each subclass's __init__)

    # Sampler's two class attributes, read-only here (derived from the declared batch); nothing
    # assigns them on a sampler it did not make, so the narrowing is safe
    @property
    def per_call(self) -> int:  # type: ignore[override]
        return 1 if self.form is None else self.form.per_call

    @property
    def names_calls(self) -> bool:  # type: ignore[override]
        return self.form is not None

    def block(self, gen, m):
        return gen.integers(2**63, size=m), gen.random((m, self.coins))

    def call(self, drawn, a, b):
        seeds, coins = drawn
        if self.form is None:
            return [self.one(coins[a], int(seeds[a]))]
        return self.many(seeds[a:b], coins[a:b])


class _DecoderRun(_ChainCalls):
    """Calls of a decoder: one sample (``one(rng, impl_rng)``, the program) or a batch (``many``)."""

    coins = 0  # the oracle draws nothing at this level

    def __init__(self, fn, case, time_limit):
        self.fn, self.case, self.time_limit, self.form = fn, case, time_limit, batch_of(fn)
        self.models = case.models()  # validated once; each call gets copies of these (the oracle keeps them)

    def _kwargs(self, rng):
        case = self.case
        return dict(k=case.k, config=copy.copy(case.config), max_new_tokens=case.max_new_tokens,
                    stop_tokens=list(case.stop_tokens), rng=rng)

    def _call(self, prompts, impl_rngs):
        m, form, V = len(impl_rngs), self.form, self.case.vocab_size
        args = (_fresh(self.models[0]), _fresh(self.models[1]), _handed(form, prompts))
        return call(self.fn, args, self._kwargs(_seeds(impl_rngs)), self.time_limit, read_only=True,
                    convert=lambda out: _checked_batch(out, m, V, min_len=0, max_len=self.case.max_new_tokens,
                                                       what="decode_fn"))

    def one(self, rng, impl_rng):
        if self.form is not None:
            return tuple(self._call(np.array([self.case.prompt], dtype=np.int64), [impl_rng])[0])
        # fresh models and config for every call: what the implementation does to them stays there
        n, V = self.case.max_new_tokens, self.case.vocab_size
        out = call(self.fn, (_fresh(self.models[0]), _fresh(self.models[1]), list(self.case.prompt)),
                   self._kwargs(impl_rng), self.time_limit, read_only=True,
                   convert=lambda out: checked_tokens(out, V, min_len=0, max_len=n, what="decode_fn"))
        return tuple(out)

    def many(self, seeds, coins):
        prompts = np.tile(np.array(self.case.prompt, dtype=np.int64), (len(seeds), 1))
        return [tuple(out) for out in self._call(prompts, seeds.tolist())]


def _fresh(model):
    """A copy of a table model with its own table, read-only (validated already: no second check).  A
    decoder that writes into it gets ``writes into its inputs`` at the write (SPEC §13.3), not a law
    that is no law because its first call saw another table."""
    twin = copy.copy(model)
    twin.table = model.table.copy()
    twin.table.flags.writeable = False
    return twin


# ---------------------------------------------------------------- the step and logits levels


def _step_program(fn, case, time_limit, *, logits=False):
    """Step and logits levels: draft K tokens ~ q, call ``fn`` on the rows, complete the
    block to K+1 tokens by target sampling; the result must have the target law of K+1 tokens.
    At the logits level ``fn`` gets raw logits and the config and applies the rules itself."""
    run = _StepRun(fn, case, time_limit, logits)
    return run.one, target_law(run.law_t, list(case.prompt), run.law_config, case.k + 1)


class _StepRun(_ChainCalls):
    """Calls of a step: one sample (``one(rng, impl_rng)``, the program) or a batch (``many``)."""

    def __init__(self, fn, case, time_limit, logits):
        self.fn, self.case, self.time_limit, self.logits, self.form = fn, case, time_limit, logits, batch_of(fn)
        self.target, self.draft = case.models()
        self.V, self.k, self.prompt = case.vocab_size, case.k, tuple(case.prompt)
        self.coins = 2 * self.k  # statistical mode: K draft coins, then up to K completion coins
        rules = rules_of(fn)
        (self.law_t, self.law_config), (law_d, _) = ruled(self.target, case.config, rules), ruled(self.draft, case.config, rules)
        self.law_models = {id(self.target): self.law_t, id(self.draft): law_d}  # seen through the declared rules
        self._rows, self._cdfs, self._raw = {}, {}, {}  # the oracle's own, per prefix: computed once

    def row(self, model, context):
        """The processed next-token row after ``context`` (a tuple), as the law sees it."""
        key = (id(model), context)
        if key not in self._rows:
            self._rows[key] = next_token_probs(self.law_models[id(model)], list(context), self.law_config)
        return self._rows[key]

    def cdf(self, model, context):
        key = (id(model), context)
        if key not in self._cdfs:
            self._cdfs[key] = _cdf(self.row(model, context))
        return self._cdfs[key]

    def pick(self, rng, model, context):
        """A token after ``context``: the next coin by inverse CDF (statistical), or ``rng``'s draw."""
        if isinstance(rng, _Coins):
            return bisect_right(self._cdf_list(model, context), rng.take())
        return draw(rng, self.row(model, context))

    def _cdf_list(self, model, context):
        key = (id(model), context, "list")
        if key not in self._cdfs:
            self._cdfs[key] = self.cdf(model, context).tolist()
        return self._cdfs[key]

    def raw(self, drafted):
        """The K+1 target rows and K draft rows for the prefixes prompt + x_<i, as the models give them."""
        if drafted not in self._raw:
            context = list(self.prompt + drafted)
            get = (lambda m, c: m(c)) if self.logits else (lambda m, c: m.probs(c))
            self._raw[drafted] = (get(self.target, context)[-(self.k + 1):], get(self.draft, context[:-1])[-self.k:])
        return self._raw[drafted]

    def _complete(self, out, rng):
        while len(out) < self.k + 1:  # complete the block by target sampling
            out.append(self.pick(rng, self.target, self.prompt + tuple(out)))
        return tuple(out)

    def _config(self):
        return (copy.copy(self.case.config),) if self.logits else ()

    def one(self, rng, impl_rng):
        """One sample: ``rng`` the oracle's draws (a generator, the enumerator, or the sample's coins)."""
        if isinstance(rng, np.ndarray):
            rng = _Coins(rng)
        context = self.prompt
        for _ in range(self.k):  # draft tokens ~ q, each row conditioned on the tokens before it
            context = context + (self.pick(rng, self.draft, context),)
        drafted = context[len(self.prompt):]
        t_rows, d_rows = self.raw(drafted)
        if self.form is not None:
            out = self._call(t_rows[None], d_rows[None], np.array([drafted]), [impl_rng])[0]
        else:
            k, V = self.k, self.V
            args = (t_rows.copy(), d_rows.copy(), np.array(drafted)) + self._config()
            out = call(self.fn, args + (impl_rng,), {}, self.time_limit,
                       convert=lambda out: checked_tokens(out, V, min_len=1, max_len=k + 1, what="step_fn"))
        return self._complete(out, rng)

    def _call(self, t_rows, d_rows, drafted, impl_rngs):
        m, form, k, V = len(impl_rngs), self.form, self.k, self.V
        args = (_handed(form, t_rows), _handed(form, d_rows), _handed(form, drafted)) + self._config()
        return call(self.fn, args + (_seeds(impl_rngs),), {}, self.time_limit,
                    convert=lambda out: _checked_batch(out, m, V, min_len=1, max_len=k + 1, what="step_fn"))

    def many(self, seeds, coins):
        """``len(seeds)`` samples in one call: coins ``[m, 2K]`` as :meth:`one` takes them, row by row."""
        m, k = len(seeds), self.k
        drafted = np.empty((m, k), dtype=np.int64)
        prefixes = [()] * m
        for t in range(k):  # position t: the samples grouped by their drafted prefix, one searchsorted per group
            groups = {}
            for i, c in enumerate(prefixes):
                groups.setdefault(c, []).append(i)
            for c, idx in groups.items():
                idx = np.array(idx)
                drafted[idx, t] = np.searchsorted(self.cdf(self.draft, self.prompt + c), coins[idx, t], side="right")
            prefixes = [c + (x,) for c, x in zip(prefixes, drafted[:, t].tolist())]
        unique = {c: i for i, c in enumerate(dict.fromkeys(prefixes))}
        rows = [self.raw(c) for c in unique]
        which = np.array([unique[c] for c in prefixes])
        t_rows, d_rows = np.stack([r[0] for r in rows])[which], np.stack([r[1] for r in rows])[which]
        outs = self._call(t_rows, d_rows, drafted, seeds.tolist())
        return [self._complete(out, _Coins(coins[i, k:])) for i, out in enumerate(outs)]


# ---------------------------------------------------------------- statistical mode: seeded blocks


def _sampler_of(level, fn, case, time_limit):
    """The level's calls of ``fn`` on a case (``one`` and ``many``), built where a shard runs."""
    if level == "decoder":
        return _DecoderRun(fn, case, time_limit)
    return _StepRun(fn, case, time_limit, level == "logits")


tally_chain_blocks = tally_blocks  # the chain levels' samplers are counted by the one block tally (0.2 name)


def _program_of(level, fn, case, time_limit):
    """The level's program for a case, built where it runs (a shard's worker, or here)."""
    return _BY_NAME[level].program(fn, case, time_limit)[0]


# ---------------------------------------------------------------- plans (SPEC §15)


def _plan_statistical(spec: Level, fn, case, settings: Settings, seed: int) -> CasePlan:
    """N over the case's target law, in calls of the declared batch (at most N), timed as the
    check makes them (:func:`~specref.verification.statistics.shards.timed_calls`)."""
    assert spec.program is not None  # every chain level has one
    run_case = case.as_float()
    _, expected = spec.program(fn, run_case, settings.time_limit)
    n = planned_n(settings, np.array([float(w) for w in expected.values()] + [0.0]))
    form = batch_of(fn)
    per_call = 1 if form is None else min(form.per_call, n)
    recipe = partial(_sampler_of, spec.name, fn, run_case, settings.time_limit)
    return CasePlan(len(expected), n, per_call, calls_for(n, per_call), timer=timed_calls(recipe, seed, per_call))


def _plan_exact(spec: Level, fn, case, settings: Settings, seed: int) -> CasePlan:
    """N: the paths of the reference's enumeration of the case (over ``max_paths``: the note says
    so); timed: runs of the case's program on a generator seeded ``seed``, each one call."""
    assert spec.program is not None  # every chain level has one
    _, expected = spec.program(fn, case, settings.time_limit)
    reference, _ = spec.program(spec.reference_for(rules_of(fn)), case, settings.time_limit)
    try:
        n = law(lambda rng: reference(rng, rng), max_paths=settings.max_paths).paths
    except SpecrefError as e:  # over max_paths: the exact check stops there too
        return CasePlan(len(expected), settings.max_paths, 1, None, note=f"over budget: {e}"[:120])

    def timer(calls):
        program, _ = spec.program(fn, case, settings.time_limit)
        gen = np.random.default_rng(seed)
        return lambda i: program(gen, gen)

    return CasePlan(len(expected), n, 1, n, timer=timer)


# ---------------------------------------------------------------- the levels' options


def _positive_batch(batch) -> int:
    if isinstance(batch, bool) or not isinstance(batch, Integral) or batch < 1:
        raise SpecrefError(f"batch (samples per call) must be a positive integer, got {batch!r:.80}")
    return int(batch)


def _declared_batch(fn, size: int):
    """``fn`` declared to take ``size`` samples per call; a batch declared already keeps its array, device and dtype."""
    form = batch_of(fn)
    if form is None:
        return declare_batch(fn, size)
    return declare_batch(fn, size, array=form.array, device=form.device, dtype=form.dtype)


BATCH = Option("batch", "samples per call", phrase="batch (samples per call) applies", check=_positive_batch,
               declare=_declared_batch)
"""``batch=n``: the implementation takes ``n`` samples per call, rows stacked (SPEC §13.1; :func:`declare_batch`)."""
RULES = Option("rules", "the implementation's declared sampler (rule order, or its own sampler)", phrase="rules apply",
               declare=declare_rules, declared=rules_of)
"""``rules``: speculative output is checked against the implementation's own plain sampler
(:mod:`specref.verification.cases.rules`); the report says so."""


# ---------------------------------------------------------------- the levels


def _chain_level(name: str, signature: str, program, shorthand: str, *, tables: str | None = None,
                 options=(BATCH, RULES)) -> Level:
    # default_cases is looked up when the cases are asked for (not bound here), so replacing it in this
    # module changes what the level runs
    return Level(name, signature, lambda: default_cases(name), run_programs, tables=tables, program=program,
                 validate=_check_case, reference=partial(_reference, name), planner=_plan_statistical,
                 exact_planner=_plan_exact, options=options, shorthand=shorthand)


LEVELS = (
    _chain_level("step", "step_fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> tokens", _step_program,
                 "check_step", tables="probs", options=(BATCH,)),
    _chain_level("logits", "step_fn(target_logits [K+1, V], draft_logits [K, V], draft_tokens [K], config, rng) "
                           "-> tokens", partial(_step_program, logits=True), "check_logits_step", tables="logits"),
    _chain_level("decoder", "decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng) -> tokens",
                 _decoder_program, "check_decoder"),
)
"""The three chain levels, in the order the registry lists them."""
_BY_NAME = {level.name: level for level in LEVELS}
