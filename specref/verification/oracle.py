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

import math
import signal
import threading
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int
from specref.core.sampling import SamplingConfig
from specref.core.step import draw
from specref.decoding.chain import next_token_probs
from specref.verification.cases import Case, default_cases, fixed_cases, strategy_cases
from specref.verification.laws import LazyUniformError, compare, law, target_law
from specref.verification.stats import compare_counts, samples_needed

__all__ = [
    "Case",
    "CaseResult",
    "Report",
    "Settings",
    "Level",
    "LEVELS",
    "check",
    "check_step",
    "check_logits_step",
    "check_decoder",
    "default_cases",
    "fixed_cases",
    "strategy_cases",
]

OK, DIFFERS, RAISED, INVALID, TIMEOUT, ARITHMETIC = (
    "ok", "differs", "raised", "invalid output", "timeout", "lazy-uniform arithmetic",
)


# ---------------------------------------------------------------- results


@dataclass
class CaseResult:
    """The verdict on one case."""

    case: Case
    status: str  # ok / differs / raised / invalid output / timeout / lazy-uniform arithmetic
    tv: float | Fraction | None = None  # exact TV, or the plug-in estimate in statistical mode
    detail: str = ""  # the error, or the outputs that differ most
    n_samples: int | None = None  # statistical mode: N
    p_value: float | None = None  # statistical mode: the G-test's p-value
    tv_interval: tuple | None = None  # statistical mode: confidence interval of the TV

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class Report:
    """What a check found: the verdict, the worst TV, a counterexample and a table per case."""

    level: str
    mode: str
    results: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def worst_tv(self):
        tvs = [r.tv for r in self.results if r.tv is not None]
        return max(tvs) if tvs else None

    @property
    def counterexample(self) -> Case | None:
        """The failing case with the largest TV (errors first), or None when all pass."""
        bad = [r for r in self.results if not r.ok]
        if not bad:
            return None
        return max(bad, key=lambda r: (r.tv is None, r.tv or 0)).case

    def table(self) -> str:
        lines = [f"{'case':<24} {'status':<24} {'TV':>12}  detail"]
        for r in self.results:
            tv = "-" if r.tv is None else f"{float(r.tv):.3g}"
            extra = f"N={r.n_samples}, p={r.p_value:.2g}; " if r.n_samples else ""
            lines.append(f"{r.case.name:<24} {r.status:<24} {tv:>12}  {extra}{r.detail}")
        return "\n".join(lines)

    def __str__(self):
        verdict = "preserves the target distribution" if self.ok else (
            f"DIFFERS from the target distribution (worst TV {float(self.worst_tv or 0):.3g})"
            if self.worst_tv else "FAILS (see statuses)"
        )
        text = f"{self.level}-level check, {self.mode} mode: {verdict}\n{self.table()}"
        if self.counterexample is not None:
            text += f"\ncounterexample: {self.counterexample!r}"
        return text


# ---------------------------------------------------------------- calling the implementation


class _Misbehaved(Exception):
    def __init__(self, status, detail):
        super().__init__(detail)
        self.status, self.detail = status, detail


class _TimedOut(BaseException):  # BaseException: an implementation's `except Exception` cannot eat it
    pass


def _call(fn, args, kwargs, time_limit):
    """Run the implementation once, turning every misbehaviour into ``_Misbehaved``."""
    try:
        return _with_time_limit(fn, args, kwargs, time_limit)
    except _TimedOut:
        raise _Misbehaved(TIMEOUT, f"no result within {time_limit} s") from None
    except LazyUniformError as e:
        raise _Misbehaved(ARITHMETIC, str(e)) from None
    except Exception as e:  # the implementation's own failure, reported with the case
        raise _Misbehaved(RAISED, f"{type(e).__name__}: {e}") from None


def _with_time_limit(fn, args, kwargs, seconds):
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            raise _TimedOut()

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box = {}  # off the main thread: a daemon thread that is abandoned if it hangs

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller below
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimedOut()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _tokens(out, V, *, min_len, max_len, what):
    """Validate an implementation's returned tokens: ints in range, length in bounds."""
    try:
        seq = list(out.tolist() if hasattr(out, "tolist") else out)
    except TypeError:
        raise _Misbehaved(INVALID, f"{what} returned {out!r}, not a sequence of tokens") from None
    if not min_len <= len(seq) <= max_len:
        raise _Misbehaved(INVALID, f"{what} returned {len(seq)} tokens {seq}; expected {min_len} to {max_len}")
    for t in seq:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < V:
            raise _Misbehaved(INVALID, f"{what} returned token {t!r} outside the vocabulary 0..{V - 1}: {seq}")
    return [int(t) for t in seq]


# ---------------------------------------------------------------- settings and levels


@dataclass(frozen=True)
class Settings:
    """How a check runs; every field is validated here, once."""

    mode: str = "exact"  # "exact" (enumerate the rng) or "statistical" (rng is an int seed)
    samples: int | None = None  # statistical mode: N per case (None: planned for detect_tv)
    seed: int = 0  # statistical mode: case i uses seed + i
    alpha: float = 1e-6  # statistical mode: the G-test's level
    detect_tv: float = 0.01  # statistical mode: the TV that N is planned to detect with power 0.9
    tolerance: float = 1e-9  # exact mode: TV above this differs
    time_limit: float = 10.0  # seconds per call of the implementation

    def __post_init__(self):
        if self.mode not in ("exact", "statistical"):
            raise SpecrefError(f"mode must be 'exact' or 'statistical', got {self.mode!r}")
        if self.samples is not None:
            check_positive_int("samples", self.samples)
        check_positive_int("seed", self.seed, minimum=0)
        for name, upper in (("alpha", 1), ("detect_tv", 1), ("tolerance", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < upper:
                raise SpecrefError(f"{name} must be a number in (0, {upper}), got {value!r}")
        t = self.time_limit
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise SpecrefError(f"time_limit must be a positive finite number of seconds, got {t!r}")


@dataclass(frozen=True)
class Level:
    """One protocol level: how the oracle calls an implementation and what it expects."""

    name: str
    signature: str  # the call, for messages and the CLI's help
    tables: str | None  # the case tables this level needs: "probs", "logits", or None for either
    cases: Callable[[], list]  # the default cases
    program: Callable  # (fn, case, time_limit) -> (program(rng, impl_rng) -> output, exact law)


def check(level: str, fn, *, cases=None, settings: Settings | None = None, **fields_) -> Report:
    """Check ``fn`` at ``level`` (a key of :data:`LEVELS`) on ``cases`` (default: the level's own).

    Settings come as one :class:`Settings`, or as its fields by keyword
    (``check("step", fn, mode="statistical")``); keywords override ``settings``.
    """
    if level not in LEVELS:
        raise SpecrefError(f"level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    unknown = set(fields_) - {f.name for f in fields(Settings)}
    if unknown:
        raise SpecrefError(f"unknown setting(s) {sorted(unknown)}; Settings has {[f.name for f in fields(Settings)]}")
    settings = replace(settings or Settings(), **fields_)
    spec = LEVELS[level]
    if not callable(fn):
        raise SpecrefError(f"the implementation must be callable, got {fn!r}")
    cases = spec.cases() if cases is None else list(cases)
    if not cases:
        raise SpecrefError(f"cases is empty: a check on no case proves nothing (level {level!r})")
    for c in cases:
        _check_case(spec, c)
    report = Report(level=level, mode=settings.mode)
    for i, case in enumerate(cases):
        run_case = case if settings.mode == "exact" else case.as_float()
        program, expected = spec.program(fn, run_case, settings.time_limit)
        if settings.mode == "exact":
            report.results.append(_exact(case, program, expected, settings.tolerance))
        else:
            report.results.append(_statistical(case, program, expected, settings.samples, settings.seed + i,
                                               settings.alpha, settings.detect_tv))
    return report


def check_step(step_fn, **options) -> Report:
    """``check("step", step_fn, **options)``: ``step_fn(p_target, q_draft, draft_tokens, rng)``."""
    return check("step", step_fn, **options)


def check_logits_step(step_fn, **options) -> Report:
    """``check("logits", step_fn, **options)``: ``step_fn(target_logits, draft_logits, draft_tokens, config, rng)``."""
    return check("logits", step_fn, **options)


def check_decoder(decode_fn, **options) -> Report:
    """``check("decoder", decode_fn, **options)``: ``decode_fn(target, draft, prompt, *, k, config, ...)``."""
    return check("decoder", decode_fn, **options)


def _check_case(spec: Level, case):
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


def _decoder_program(fn, case, time_limit):
    """Decoder level: the output must have the target sampler's law."""
    target, draft = case.models()
    V, prompt = case.vocab_size, list(case.prompt)

    def program(rng, impl_rng):
        out = _call(fn, (target, draft, list(prompt)),
                    dict(k=case.k, config=case.config, max_new_tokens=case.max_new_tokens,
                         stop_tokens=list(case.stop_tokens), rng=impl_rng), time_limit)
        return tuple(_tokens(out, V, min_len=0, max_len=10 ** 6, what="decode_fn"))

    return program, target_law(target, prompt, case.config, case.max_new_tokens, case.stop_tokens)


def _step_program(fn, case, time_limit, *, logits=False):
    """Step and logits levels: draft K tokens ~ q, call ``fn`` on the rows, complete the
    block to K+1 tokens by target sampling; the result must have the target law of K+1 tokens.
    At the logits level ``fn`` gets raw logits and the config and applies the rules itself."""
    target, draft = case.models()
    V, k, config, prompt = case.vocab_size, case.k, case.config, list(case.prompt)
    rows = {}  # processed next-token rows per prefix: the oracle's own, computed once

    def raw(model, context):  # unprocessed rows, a fresh copy for the implementation
        return (model(context) if logits else model.probs(context)).copy()

    def row(model, context):
        key = (id(model), tuple(context))
        if key not in rows:
            rows[key] = next_token_probs(model, context, config)
        return rows[key]

    def program(rng, impl_rng):
        context = list(prompt)
        for _ in range(k):  # draft tokens ~ q, each row conditioned on the tokens before it
            context.append(draw(rng, row(draft, context)))
        drafted = context[len(prompt):]
        # the K+1 target rows and K draft rows for the prefixes prompt + x_<i, as the model gives them
        t_rows, d_rows = raw(target, context)[-(k + 1):], raw(draft, context[:-1])[-k:]
        args = (t_rows, d_rows, np.array(drafted)) + ((config,) if logits else ())
        out = _tokens(_call(fn, args + (impl_rng,), {}, time_limit), V, min_len=1, max_len=k + 1,
                      what="step_fn")
        while len(out) < k + 1:  # complete the block by target sampling
            out.append(draw(rng, row(target, prompt + out)))
        return tuple(out)

    return program, target_law(target, prompt, config, k + 1)


def _exact(case, program, expected, tolerance):
    try:
        got = law(lambda rng: program(rng, rng))
    except _Misbehaved as m:
        return CaseResult(case, m.status, detail=m.detail)
    c = compare(got, expected)
    status = OK if c.tv <= tolerance else DIFFERS
    detail = "" if status == OK else "worst outputs (output, got, target): " + ", ".join(
        f"{o}: {float(a):.4g} vs {float(b):.4g}" for o, a, b in c.worst[:3]
    )
    return CaseResult(case, status, tv=c.tv, detail=detail)


def _statistical(case, program, expected, samples, seed, alpha, detect_tv):
    outcomes = sorted(expected)
    index = {o: i for i, o in enumerate(outcomes)}
    null = np.array([float(expected[o]) for o in outcomes] + [0.0])  # last bin: outputs the target never makes
    n = samples or samples_needed(detect_tv, alpha, 0.9, len(null), null=null)
    gen = np.random.default_rng(seed)
    counts = np.zeros(len(null), dtype=np.int64)
    strays = {}
    try:
        for _ in range(n):
            out = program(gen, int(gen.integers(2 ** 63)))
            j = index.get(out)
            if j is None:
                strays[out] = strays.get(out, 0) + 1
                j = len(outcomes)
            counts[j] += 1
    except _Misbehaved as m:
        return CaseResult(case, m.status, detail=m.detail)
    result = compare_counts(counts, null, alpha=alpha)
    est = result.tv
    detail = f"{result.g}"
    if strays:
        detail += f"; outputs the target never makes: {dict(list(strays.items())[:3])}"
    return CaseResult(case, DIFFERS if result.rejected else OK, tv=est.estimate, detail=detail,
                      n_samples=n, p_value=result.g.p_value, tv_interval=(est.lower, est.upper))


# ---------------------------------------------------------------- the registry

LEVELS: dict[str, Level] = {
    level.name: level for level in (
        Level("step", "step_fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> tokens",
              "probs", lambda: default_cases("step"), _step_program),
        Level("logits", "step_fn(target_logits [K+1, V], draft_logits [K, V], draft_tokens [K], config, rng) -> tokens",
              "logits", lambda: default_cases("logits"),
              lambda fn, case, time_limit: _step_program(fn, case, time_limit, logits=True)),
        Level("decoder", "decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng) -> tokens",
              None, lambda: default_cases("decoder"), _decoder_program),
    )
}
"""Every protocol level the oracle checks, by name (``check(name, fn)``, ``--level name``)."""
