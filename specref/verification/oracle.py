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

A :class:`Case` is plain data -- bigram tables for target and draft, a prompt, K and
sampling settings -- so a counterexample reproduces when passed back in
(``check_step(fn, cases=[report.counterexample])``).  Bigram tables make every row
depend on the previous token, which is what exposes bugs such as judging draft
positions after a rejection or a context that is not rolled back.

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

import signal
import threading
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from specref.decoding.chain import next_token_probs
from specref.core.errors import SpecrefError, check_positive_int
from specref.verification.laws import LazyUniformError, compare, law, target_law
from specref.core.sampling import SamplingConfig
from specref.verification.stats import compare_counts, samples_needed
from specref.core.step import draw
from specref.verification.tables import LogitTable, ProbTable

__all__ = [
    "Case",
    "CaseResult",
    "Report",
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


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One input: table models (:mod:`specref.verification.tables`) for target and draft, and settings.

    A table of shape ``[V] * (h + 1)`` holds at ``table[x_1..x_h]`` the row used after
    the tokens ``x_1..x_h`` (``[V, V]``: a bigram).  ``tables`` says what they hold:
    ``"probs"`` (final distributions; step level, or exact models at decoder level) or
    ``"logits"`` (logits level, or logit models).
    """

    name: str
    target: np.ndarray  # [V, V] or [V] * (h + 1)
    draft: np.ndarray  # same shape
    prompt: tuple = (0,)
    k: int = 2
    config: SamplingConfig = SamplingConfig()
    max_new_tokens: int = 3  # decoder level only
    stop_tokens: tuple = ()  # decoder level only
    tables: str = "probs"

    @property
    def vocab_size(self) -> int:
        return self.target.shape[-1]

    def models(self):
        """(target, draft) as specref models: ProbTable or LogitTable."""
        kind = ProbTable if self.tables == "probs" else LogitTable
        return kind(self.target), kind(self.draft)

    def as_float(self) -> "Case":
        """The same case with float64 tables (for statistical mode)."""
        return replace(self, target=np.asarray(self.target, dtype=np.float64),
                       draft=np.asarray(self.draft, dtype=np.float64))

    def to_json(self) -> dict:
        def rows(t):
            return np.vectorize(lambda v: str(v) if isinstance(v, Fraction) else float(v), otypes=[object])(t).tolist()

        return {
            "name": self.name, "target": rows(self.target), "draft": rows(self.draft),
            "prompt": list(self.prompt), "k": self.k, "config": dict(vars(self.config)),
            "max_new_tokens": self.max_new_tokens, "stop_tokens": list(self.stop_tokens),
            "tables": self.tables,
        }

    def __repr__(self):
        return (f"Case({self.name!r}, V={self.vocab_size}, k={self.k}, prompt={self.prompt}, "
                f"config={self.config}, tables={self.tables!r})")


def _frac_table(rows):
    return np.array([[Fraction(v) for v in row] for row in rows], dtype=object)


def default_cases(level: str, *, drawn: int = 4) -> list[Case]:
    """The fixed edge cases of SPEC §3, seeded random cases, and ``drawn`` cases drawn
    (with a fixed seed) from :mod:`specref.verification.strategies`, for one protocol level."""
    return fixed_cases(level) + (strategy_cases(level, drawn) if drawn else [])


def strategy_cases(level: str, n: int, *, seed: int = 20261129) -> list[Case]:
    """``n`` cases drawn from ``specref.verification.strategies.table_model_pairs`` (V = 3), deterministic in ``seed``.

    Relations between target and draft include identical, independent, disjoint
    (every draft token rejected) and near-equal rows; logits cases also draw a
    sampling configuration.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from specref.verification import strategies

    if level not in ("step", "logits", "decoder"):
        raise SpecrefError(f"level must be 'step', 'logits' or 'decoder', got {level!r}")
    kind = "logits" if level == "logits" else "probs"
    pairs = strategies.table_model_pairs(vocab_size=3, exact=kind == "probs", kind=kind)
    configs = strategies.sampling_configs(vocab_size=3) if level == "logits" else st.just(SamplingConfig())
    drawn = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(pairs, st.integers(1, 2), configs)
    def collect(pair, k, config):
        drawn.append((pair, k, config))

    collect()
    return [Case(f"drawn-{i}", t.table, d.table, k=k, config=config, tables=kind)
            for i, ((t, d), k, config) in enumerate(drawn[:n])]


def fixed_cases(level: str) -> list[Case]:
    """The fixed edge cases of SPEC §3 plus seeded random cases, for one protocol level."""
    if level not in ("step", "logits", "decoder"):
        raise SpecrefError(f"level must be 'step', 'logits' or 'decoder', got {level!r}")
    rng = np.random.default_rng(20261129)
    if level == "logits":
        cases = []
        configs = [
            SamplingConfig(temperature=0.7), SamplingConfig(top_k=2), SamplingConfig(top_p=0.7),
            SamplingConfig(min_p=0.3), SamplingConfig(temperature=1.3, top_k=3, top_p=0.9, min_p=0.05),
        ]
        for i, config in enumerate(configs):
            t, d = rng.normal(0, 1.5, size=(2, 4, 4))
            cases.append(Case(f"logits-{i}", t, d, k=2, config=config, tables="logits"))
        # rows where the order of the rules matters: top-p before temperature keeps a different set
        peaked = np.log(np.array([[0.5, 0.2, 0.2, 0.1], [0.3, 0.3, 0.25, 0.15],
                                  [0.45, 0.35, 0.15, 0.05], [0.4, 0.4, 0.1, 0.1]]))
        cases.append(Case("logits-rule-order", peaked, peaked[::-1].copy(), k=2, tables="logits",
                          config=SamplingConfig(temperature=0.5, top_k=3, top_p=0.6)))
        return cases
    p = _frac_table([["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]])
    q = _frac_table([["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/2", "1/2", "0"]])
    no_two = _frac_table([["1/2", "1/2", "0"], ["1/4", "3/4", "0"], ["2/3", "1/3", "0"]])
    only_two = _frac_table([["0", "0", "1"]] * 3)
    cases = [
        Case("worked-example-rows", p, q),
        Case("p-equals-q", p, p),
        Case("zeros-in-q", p, q, k=3),
        Case("zeros-in-p", no_two, q),
        Case("always-rejected-at-1", no_two, only_two),
        Case("k-equals-1", p, q, k=1, prompt=(1,)),
        Case("random-dense", _random_table(rng, 3, 0.0), _random_table(rng, 3, 0.0)),
        Case("random-sparse", _random_table(rng, 3, 0.3), _random_table(rng, 3, 0.3), prompt=(2,)),
    ]
    if level == "decoder":
        # whole decodes are enumerated without memoisation: keep K <= 2 and 3 new tokens
        cases = [replace(c, k=min(c.k, 2), max_new_tokens=3) for c in cases]
        cases.append(Case("stop-token", p, q, stop_tokens=(1,), max_new_tokens=3))
        cases.append(Case("logits-top-p", rng.normal(0, 1.5, (3, 3)), rng.normal(0, 1.5, (3, 3)),
                          config=SamplingConfig(temperature=0.8, top_p=0.8), tables="logits"))
        # rows that depend on the last two tokens: a context kept after a rejection shows
        base = _frac_table([["1/2", "1/3", "1/6"], ["1/6", "1/2", "1/3"], ["1/3", "1/6", "1/2"]])
        tri = np.stack([np.roll(base, a, axis=-1) for a in range(3)])  # tri[a][b]: base[b] rotated by a
        cases.append(Case("trigram", tri, np.stack([p, q, p]), prompt=(0, 1), max_new_tokens=3))
    return cases


def _random_table(rng, V, zero_frac):
    counts = rng.integers(1, 7, size=(V, V)) * (rng.random((V, V)) >= zero_frac)
    counts[np.arange(V), rng.integers(V, size=V)] += 1
    return _frac_table([[Fraction(int(c), int(row.sum())) for c in row] for row in counts])


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


# ---------------------------------------------------------------- the checks


def check_step(step_fn, *, mode="exact", cases=None, samples=None, seed=0, alpha=1e-6,
               detect_tv=0.01, tolerance=1e-9, time_limit=10.0) -> Report:
    """Check a probability-level step ``step_fn(p_target, q_draft, draft_tokens, rng)``."""
    return _check("step", step_fn, mode, cases, samples, seed, alpha, detect_tv, tolerance, time_limit)


def check_logits_step(step_fn, *, mode="exact", cases=None, samples=None, seed=0, alpha=1e-6,
                      detect_tv=0.01, tolerance=1e-9, time_limit=10.0) -> Report:
    """Check a logits-level step ``step_fn(target_logits, draft_logits, draft_tokens, config, rng)``."""
    return _check("logits", step_fn, mode, cases, samples, seed, alpha, detect_tv, tolerance, time_limit)


def check_decoder(decode_fn, *, mode="exact", cases=None, samples=None, seed=0, alpha=1e-6,
                  detect_tv=0.01, tolerance=1e-9, time_limit=10.0) -> Report:
    """Check a decoder ``decode_fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng)``."""
    return _check("decoder", decode_fn, mode, cases, samples, seed, alpha, detect_tv, tolerance, time_limit)


def _check(level, fn, mode, cases, samples, seed, alpha, detect_tv, tolerance, time_limit):
    if not callable(fn):
        raise SpecrefError(f"the implementation must be callable, got {fn!r}")
    if mode not in ("exact", "statistical"):
        raise SpecrefError(f"mode must be 'exact' or 'statistical', got {mode!r}")
    if samples is not None:
        samples = check_positive_int("samples", samples)
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise SpecrefError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    cases = default_cases(level) if cases is None else list(cases)
    for c in cases:
        _check_case(level, c)
    report = Report(level=level, mode=mode)
    for i, case in enumerate(cases):
        program, expected = _program(level, fn, case if mode == "exact" else case.as_float(), time_limit)
        if mode == "exact":
            report.results.append(_exact(case, program, expected, tolerance))
        else:
            report.results.append(_statistical(case, program, expected, samples, seed + i, alpha, detect_tv))
    return report


def _check_case(level, case):
    if not isinstance(case, Case):
        raise SpecrefError(f"cases must hold specref.verification.oracle.Case objects, got {case!r}")
    want = "logits" if level == "logits" else ("probs" if level == "step" else None)
    if want and case.tables != want:
        raise SpecrefError(f"case {case.name!r} has tables={case.tables!r}; the {level} level needs {want!r}")
    if len(case.prompt) < case.target.ndim - 1:
        raise SpecrefError(f"case {case.name!r}: prompt {case.prompt} is shorter than the tables' context "
                           f"({case.target.ndim - 1} tokens)")
    if case.draft.shape != case.target.shape:
        raise SpecrefError(f"case {case.name!r}: draft table shape {case.draft.shape} != target {case.target.shape}")
    if level == "step" and case.config != SamplingConfig():
        raise SpecrefError(f"case {case.name!r}: step-level tables are final distributions; config must be default")
    case.models()  # validates the tables
    check_positive_int("k", case.k)


def _program(level, fn, case, time_limit):
    """The randomized program ``(rng, impl_rng) -> output`` and the exact law it must have."""
    target, draft = case.models()
    V, k, config, prompt = case.vocab_size, case.k, case.config, list(case.prompt)
    if level == "decoder":
        def program(rng, impl_rng):
            out = _call(fn, (target, draft, list(prompt)),
                        dict(k=k, config=config, max_new_tokens=case.max_new_tokens,
                             stop_tokens=list(case.stop_tokens), rng=impl_rng), time_limit)
            return tuple(_tokens(out, V, min_len=0, max_len=10 ** 6, what="decode_fn"))

        return program, target_law(target, prompt, config, case.max_new_tokens, case.stop_tokens)

    rows = {}  # processed next-token rows per prefix: the oracle's own, computed once

    def raw(model, context):  # unprocessed rows, a fresh copy for the implementation
        return (model.probs(context) if level == "step" else model(context)).copy()

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
        args = (t_rows, d_rows, np.array(drafted)) + (() if level == "step" else (config,))
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

