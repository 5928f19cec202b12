"""Fuzzing the public entry points and the oracle.

1. Hypothesis properties: each public function is called with one argument replaced
   by a value drawn from a pool of bad values (wrong types, NaN, inf, negatives,
   wrong shapes, unnormalised rows, generator classes and modules).  Every call
   either returns an output with no NaN, or raises ``SpecrefError`` naming the
   argument; a wrong type raises a ``TypeError`` (``SpecrefTypeError``) naming it.
   Nothing else may escape.
2. A misbehaviour suite: more than 60 kinds of implementation that raise, exit,
   crash, hang, return garbage, misuse the rng or are simply wrong.  Each must get a
   status that is not "ok" -- in exact mode (in-process and isolated), in
   statistical mode, and through the CLI -- with no exception escaping the oracle.
3. Regression tests for each reproduced defect of the inputs (rngs, temperatures,
   the ``step=`` hook, stop tokens, model errors, vocabularies, float32 rows, laws,
   counts).
"""

import io
import os
import re
import signal
import sys
import time
import types
import warnings
from contextlib import redirect_stderr, redirect_stdout
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specref import verify
from specref.core.errors import LowPrecisionRows, SpecrefError, check_prob_rows, row_tolerance
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.core.step import speculative_step
from specref.decoding.chain import sample_target, speculative_decode
from specref.decoding.vectorized import sample_steps
from specref.verification.zoo import chain as zoo
from specref.verification.running.calling import can_isolate
from specref.verification.laws.enumeration import compare, target_law
from specref.verification.oracle import check_step, default_cases
from specref.verification.running.report import Settings
from specref.verification.statistics.counts import g_test
from specref.verification.cases.tables import LogitTable, ProbTable

FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
P = np.array([[0.2, 0.5, 0.3], [0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])  # [K+1 = 3, V = 3]
Q = np.array([[0.6, 0.3, 0.1], [1 / 6, 0.5, 1 / 3]])  # [K = 2, V = 3]
X = [0, 1]
needs_fork = pytest.mark.skipif(not can_isolate(), reason="isolation needs the fork start method")


class _Weird:
    def __repr__(self):
        return "<weird>"


BAD = st.sampled_from([
    None, "abc", b"x", 3, -1, 0, 2**70, 1.5, float("nan"), float("inf"), -float("inf"), True, [], [[]], {}, (),
    _Weird(), object, np.random.Generator, np.random, np.random.RandomState(0), np.array([]), np.zeros((0, 3)),
    np.full((3, 3), np.nan), -P, P * 2, P[:, :2], P[None], P.astype(np.float32) * 1.01, P.astype(complex),
    np.array([["a", "b", "c"]] * 3), Fraction(1, 3), [0.2, 0.5, 0.3], lambda *a: None,
])


def outcome(fn, name):
    """Call fn(); return its value, or None after checking the exception it raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LowPrecisionRows)
            return fn()
    except SpecrefError as e:  # includes SpecrefTypeError
        assert name in str(e), f"{type(e).__name__} does not name {name!r}: {e}"
    except TypeError as e:
        assert name in str(e), f"TypeError does not name {name!r}: {e}"
    return None


def no_nan(value):
    arrays = value if isinstance(value, tuple) else (value,)
    for a in arrays:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            assert not np.isnan(a).any()


# ---------------------------------------------------------------- 1. properties of the entry points


@FUZZ
@given(st.sampled_from(["p_target", "q_draft", "draft_tokens", "rng"]), BAD)
def test_speculative_step_refuses_or_works(name, bad):
    args = dict(p_target=P, q_draft=Q, draft_tokens=X, rng=np.random.default_rng(0))
    args[name] = bad
    out = outcome(lambda: speculative_step(**args), name)
    if out is not None:
        assert 1 <= len(out) <= 3 and all(0 <= t < 3 for t in out)


@FUZZ
@given(st.sampled_from(["p_target", "q_draft", "n", "rng", "draft_tokens"]), BAD)
def test_sample_steps_refuses_or_works(name, bad):
    args = dict(p_target=P, q_draft=Q, n=5, rng=np.random.default_rng(0), draft_tokens=None)
    args[name] = bad
    out = outcome(lambda: sample_steps(**args), name)
    if out is not None:
        assert np.all(out.n_emitted >= 1)
    # the generator class never poisons later calls
    assert sample_steps(P, Q, 3, np.random.default_rng(1)).tokens.shape == (3, 3)


@FUZZ
@given(st.sampled_from(["temperature", "top_k", "top_p", "min_p"]), BAD)
def test_sampling_config_refuses_or_works(name, bad):
    config = outcome(lambda: SamplingConfig(**{name: bad}), name)
    if config is not None:
        no_nan(process(np.array([[1.0, 2.0, -3.0]]), config))
        no_nan(process_probs(P, config))


@FUZZ
@given(st.sampled_from(["logits", "probs"]), BAD, st.sampled_from([1.0, 0.5, 1e-3, 1e-300, 5e-324, 7.0, 1e300]))
def test_process_refuses_or_has_no_nan(name, bad, temperature):
    config = SamplingConfig(temperature=temperature)
    fn = process if name == "logits" else process_probs
    out = outcome(lambda: fn(bad, config), name)
    if out is not None:
        no_nan(out)
        assert np.allclose(np.asarray(out, dtype=float).sum(axis=-1), 1)


@FUZZ
@given(st.sampled_from(["prompt", "k", "config", "max_new_tokens", "stop_tokens", "rng", "step"]), BAD)
def test_speculative_decode_refuses_or_works(name, bad):
    target, draft = ProbTable(np.stack([P[0], P[1], P[2]])), ProbTable(np.stack([Q[0], Q[1], P[2]]))
    args = dict(prompt=[0], k=2, config=SamplingConfig(), max_new_tokens=3, stop_tokens=(), rng=np.random.default_rng(0),
                step=None)
    assume(not (name == "max_new_tokens" and isinstance(bad, int) and bad > 100))  # valid, but endless here
    args[name] = bad
    expected = "step" if name == "step" else name
    try:
        out = speculative_decode(target, draft, **args)
    except SpecrefError as e:
        assert expected in str(e), e
        return
    except TypeError as e:
        assert name in str(e), e
        return
    assert len(out.tokens) <= 3 and all(0 <= t < 3 for t in out.tokens)


@FUZZ
@given(st.sampled_from(["mode", "samples", "seed", "alpha", "detect_tv", "tolerance", "time_limit",
                        "case_time_limit", "isolate", "max_paths"]), BAD)
def test_settings_refuse_or_work(name, bad):
    s = outcome(lambda: Settings(**{name: bad}), name)
    if s is not None:
        assert getattr(s, name) is bad


@FUZZ
@given(st.sampled_from(["law_a", "law_b"]), st.sampled_from([
    {(0,): float("nan")}, {(0,): -0.5, (1,): 1.5}, {(0,): 0.5}, {(0,): 2.0}, {(0,): "1"}, {(0,): float("inf")},
    {(0,): Fraction(1, 2)}, [((0,), 1.0)], None, {(0,): True},
]))
def test_compare_refuses_bad_laws(name, bad):
    good = {(0,): Fraction(1)}
    args = dict(law_a=good, law_b=good)
    args[name] = bad
    with pytest.raises(SpecrefError, match=name):
        compare(**args)


@FUZZ
@given(st.sampled_from(["counts", "probs", "min_expected"]), BAD)
def test_g_test_refuses_or_works(name, bad):
    args = dict(counts=np.array([3, 5, 2]), probs=P[0], min_expected=5)
    args[name] = bad
    out = outcome(lambda: g_test(args["counts"], args["probs"], min_expected=args["min_expected"]), name)
    if out is not None:
        assert 0 <= out.p_value <= 1


# ---------------------------------------------------------------- 2. the misbehaviour suite

V, K = 3, 2


def _gen(r):  # the implementation's generator: the oracle's (exact) or one seeded by it (statistical)
    return np.random.default_rng(r) if isinstance(r, (int, np.integer)) else r


def _raiser(exc):
    def fn(p, q, x, r):
        raise exc
    return fn


def _returns(value):
    return lambda p, q, x, r: value() if callable(value) else value


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError


class _BadBase(BaseException):
    pass


class _RaisingToList:
    def tolist(self):
        raise ValueError("tolist")


class _RaisingIter:
    def __iter__(self):
        raise ValueError("iter")


class _RaisingLen(list):
    def __len__(self):
        raise ValueError("len")


class _BadInt(int):
    def __index__(self):
        raise ValueError("index")


def _gen_fails(p, q, x, r):
    yield 0
    raise RuntimeError("midway")


def _gen_endless(p, q, x, r):
    while True:
        yield 1


def _recursion(p, q, x, r):
    return _recursion(p, q, x, r)


def _first_draft_always(p, q, x, r):
    return [int(x[0])]


def _argmax_p(p, q, x, r):
    return [int(np.argmax(p[0]))]


def _always_zero(p, q, x, r):
    return [0]


def _accept_all(p, q, x, r):
    return [int(t) for t in x] + [int(np.argmax(p[-1]))]


def _uniform_token(p, q, x, r):
    return [int(_gen(r).integers(3))]


def _draft_sample(p, q, x, r):
    return [int(_gen(r).choice(3, p=q[0]))]


def _resample_from_p(p, q, x, r):
    return zoo.residual_from_p(p, q, x, _gen(r))


def _lazy_arith(p, q, x, r):
    return [int(_gen(r).random() * 3)]


def _lazy_eq(p, q, x, r):
    return [0] if _gen(r).random() == 0.5 else [0, 0]


def _lazy_float(p, q, x, r):
    return [int(float(_gen(r).random()) > 2)]


def _lazy_np(p, q, x, r):
    return [int(np.exp(_gen(r).random()) > 9)]


def _rng_normal(p, q, x, r):
    return [int(abs(_gen(r).normal()) > 100)]


_OWN = np.random.default_rng(11)  # seeded for a deterministic test; still not the oracle's rng


def _own_rng(p, q, x, r):
    return speculative_step(p, q, x, _OWN)


def _global_rng(p, q, x, r):
    return [int(np.random.randint(3))] if np.random.rand() < 2 else [0]


def _mutates_and_wrong(p, q, x, r):
    p[...] = 1 / 3
    return [0]


def _sleeps(p, q, x, r):
    time.sleep(30)


def _busy(p, q, x, r):
    while True:
        pass


def _retry(p, q, x, r):
    while True:
        try:
            time.sleep(30)
        except BaseException:  # noqa: BLE001
            pass


def _c_hang(p, q, x, r):
    re.match(r"(a+)+b", "a" * 40)


def _block_alarm(p, q, x, r):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(30)


def _exit0(p, q, x, r):
    os._exit(0)


def _exit3(p, q, x, r):
    os._exit(3)


def _abort(p, q, x, r):
    os.abort()


def _segv(p, q, x, r):
    import ctypes
    ctypes.string_at(0)


def _kill_self(p, q, x, r):
    os.kill(os.getpid(), signal.SIGKILL)


SAFE = {  # misbehaviour that an in-process oracle survives
    **{f"raises {e!r}": _raiser(e) for e in [
        ValueError("v"), TypeError("t"), ZeroDivisionError(), KeyError("k"), IndexError(), RuntimeError(),
        MemoryError(), AssertionError(), NotImplementedError(), StopIteration(), OverflowError(), ArithmeticError(),
        SystemExit(0), SystemExit(1), SystemExit("msg"), KeyboardInterrupt(), GeneratorExit(), _BadStr(), _BadBase(),
        SpecrefError("claims to be specref"),
    ]},
    "recursion": _recursion,
    **{f"returns {name}": _returns(v) for name, v in [
        ("None", None), ("[]", []), ("-1", [-1]), ("V", [V]), ("V+3", [V + 3]), ("K+2 tokens", [0] * (K + 2)),
        ("K+5 tokens", [0] * (K + 5)), ("float", [0.5]), ("float 1.0", [1.0]), ("bool", [True]), ("str", "abc"),
        ("bytes", b"\x00"), ("dict", {0: 1}), ("int", 0), ("nan", [float("nan")]), ("2-D array", np.zeros((2, 2), int)),
        ("float array", np.array([0.0])), ("nested", [[0]]), ("complex", [1j]), ("np out of range", [np.int64(7)]),
        ("np negative", [np.int8(-1)]), ("huge", lambda: list(range(10**6))), ("raising tolist", _RaisingToList),
        ("raising iter", _RaisingIter), ("raising len", lambda: _RaisingLen([0])), ("bad int", lambda: [_BadInt(0)]),
        ("object", object()), ("2**70", [2**70]),
    ]},
    "generator fails midway": _gen_fails,
    "endless generator": _gen_endless,
    "first draft token always": _first_draft_always,
    "argmax of p": _argmax_p,
    "always token 0": _always_zero,
    "accepts everything": _accept_all,
    "uniform token": _uniform_token,
    "samples the draft": _draft_sample,
    "resamples from p": _resample_from_p,
    "lazy-uniform arithmetic": _lazy_arith,
    "lazy-uniform equality": _lazy_eq,
    "float() of a lazy uniform": _lazy_float,
    "np.exp of a lazy uniform": _lazy_np,
    "rng.normal": _rng_normal,
    "global np.random": _global_rng,
    "mutates its rows, wrong": _mutates_and_wrong,
}
EXACT_ONLY = {"own default_rng (forgot statistical mode)": _own_rng}  # correct with its own randomness
ISOLATED_ONLY = {  # would end or hang an in-process oracle
    "sleeps": _sleeps, "busy loop": _busy, "retries on BaseException": _retry, "C-level hang": _c_hang,
    "blocks SIGALRM": _block_alarm, "os._exit(0)": _exit0, "os._exit(3)": _exit3, "abort": _abort,
    "segfault": _segv, "SIGKILL itself": _kill_self,
}
# The CLI's exit status of each kind's outcome (SPEC §13.3), reasoned from what the kind does: 6 a hang; 1 a wrong
# law -- a wrong rule, randomness not from the rng (one fixed draw in exact mode), or an output read as the tokens it
# iterates to (bytes b"\\x00", a dict {0: 1}, a sequence whose len() raises, an int-like: all [0]); 3 every other
# misbehaviour (an exception, garbage, misuse of the lazy uniform or the rng, a crash).
HANGS = {"sleeps", "busy loop", "retries on BaseException", "C-level hang", "blocks SIGALRM"}
WRONG_LAW = {"first draft token always", "argmax of p", "always token 0", "accepts everything", "uniform token",
             "samples the draft", "resamples from p", "global np.random", "mutates its rows, wrong", "returns bytes",
             "returns dict", "returns raising len", "returns bad int"}
CASES = default_cases("step")[:1]  # worked-example rows: every wrong kind above is far (TV > 0.1) from it


def test_the_suite_has_at_least_60_kinds():
    assert len(SAFE) + len(EXACT_ONLY) + len(ISOLATED_ONLY) >= 60


def _verdicts(kinds, **options):
    escaped, passed, statuses = [], [], {}
    for name, fn in kinds.items():
        try:
            report = check_step(fn, cases=CASES, **options)
        except BaseException as e:  # noqa: BLE001 - counted: nothing may escape
            escaped.append(f"{name}: {type(e).__name__}: {e}")
            continue
        statuses[name] = report.results[0].status
        if report.ok:
            passed.append(name)
    return escaped, passed, statuses


def test_misbehaviour_exact_in_process():
    escaped, passed, statuses = _verdicts({**SAFE, **EXACT_ONLY}, time_limit=2)
    assert escaped == [] and passed == [], (escaped, passed)
    assert statuses["resamples from p"] == "differs" and statuses["raises SystemExit(0)"] == "raised"


@needs_fork
def test_misbehaviour_exact_isolated():
    escaped, passed, statuses = _verdicts({**SAFE, **EXACT_ONLY, **ISOLATED_ONLY}, isolate=True, time_limit=0.5)
    assert escaped == [] and passed == [], (escaped, passed)
    assert statuses["segfault"] == "crashed" and statuses["C-level hang"] == "timeout"


@needs_fork
def test_misbehaviour_statistical_isolated():
    # N = 3000 per case at alpha = 1e-6: the wrong kinds here are at TV >= 0.1 from the target, where the
    # G-test's power is ~1 (samples_needed(0.1, 1e-6, 0.9, 28) is about 2,000); seeded, so deterministic
    escaped, passed, statuses = _verdicts({**SAFE, **ISOLATED_ONLY}, mode="statistical", samples=3000,
                                          isolate=True, time_limit=0.5)
    assert escaped == [] and passed == [], (escaped, passed)
    assert statuses["resamples from p"] == "differs"


@needs_fork
def test_misbehaviour_through_the_cli(monkeypatch):
    module = types.ModuleType("misbehaving13")
    kinds = {**SAFE, **EXACT_ONLY, **ISOLATED_ONLY}
    names = {}
    for i, (name, fn) in enumerate(kinds.items()):
        setattr(module, f"kind{i}", fn)
        names[f"kind{i}"] = name
    monkeypatch.setitem(sys.modules, "misbehaving13", module)
    monkeypatch.setattr("specref.verification.levels.chain.programs.default_cases", lambda level, **kw: CASES if level == "step"
                        else default_cases(level, **kw))
    codes, escaped = {}, []
    for attr, name in names.items():
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                codes[name] = verify.main(["--impl", f"misbehaving13:{attr}", "--time-limit", "0.5"])
        except BaseException as e:  # noqa: BLE001
            escaped.append(f"{name}: {type(e).__name__}: {e}")
    assert escaped == []
    want = {name: 6 if name in HANGS else 1 if name in WRONG_LAW else 3 for name in codes}
    assert {n: c for n, c in codes.items() if c != want[n]} == {}


# ---------------------------------------------------------------- 3. regressions of the inputs


@pytest.mark.parametrize("rng, word", [
    (None, "None"), (np.random.Generator, "class"), (np.random, "module"), (np.random.RandomState(0), "RandomState"),
    (42, "generator"),
])
def test_rngs_must_be_generator_instances(rng, word):
    for call in (lambda: speculative_step(P, Q, X, rng), lambda: sample_steps(P, Q, 4, rng),
                 lambda: speculative_decode(ProbTable(P), ProbTable(np.vstack([Q, P[2:]])), [0], k=1,
                                            config=SamplingConfig(), max_new_tokens=2, rng=rng)):
        with pytest.raises(TypeError, match="rng") as e:
            call()
        assert isinstance(e.value, SpecrefError)
    assert sample_steps(P, Q, 4, np.random.default_rng(0)).tokens.shape == (4, 3)  # and nothing is broken after


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-300, 5e-324, Fraction(1, 10**400), Fraction(10**400), 1e300])
def test_low_and_high_temperatures_give_no_nan(temperature):
    config = SamplingConfig(temperature=temperature)
    flat = process_probs(np.full((1, 4), 0.25), config)
    assert np.allclose(flat, 0.25)  # ties stay tied at every temperature
    peaked = process_probs(np.array([[0.5, 0.3, 0.2, 0.0]]), config)
    logits = process(np.array([[1.0, 0.5, -2.0, -np.inf]]), config)
    for out in (flat, peaked, logits):
        assert not np.isnan(out).any() and np.allclose(out.sum(axis=-1), 1)
    assert peaked[0, 3] == 0 and logits[0, 3] == 0  # an impossible token stays impossible
    if temperature < 1e-2:
        assert peaked[0, 0] == 1 and logits[0, 0] == 1


def test_low_temperature_agrees_with_the_power_where_it_does_not_underflow():
    p = np.array([[0.5, 0.3, 0.2]])
    want = p ** 4 / (p ** 4).sum()
    assert np.allclose(process_probs(p, SamplingConfig(temperature=0.25)), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("hook, word", [
    (lambda p, q, x, rng: [], "1 to K\\+1"), (lambda p, q, x, rng: [-1], "out of range"),
    (lambda p, q, x, rng: [6], "out of range"), (lambda p, q, x, rng: [0] * 7, "1 to K\\+1"),
    (lambda p, q, x, rng: None, "step= hook"), (lambda p, q, x, rng: [0.5], "step= hook"),
])
def test_the_step_hook_output_is_checked(hook, word):
    target, draft = ProbTable(P), ProbTable(np.vstack([Q, P[2:]]))
    t0 = time.monotonic()
    with pytest.raises(SpecrefError, match=word):
        speculative_decode(target, draft, [0], k=2, config=SamplingConfig(), max_new_tokens=4,
                           rng=np.random.default_rng(0), step=hook)
    assert time.monotonic() - t0 < 5  # [] used to loop forever


def test_stop_tokens_from_a_generator_are_read_once():
    target = ProbTable(np.array([[0.0, 0.0, 1.0]] * 3))  # always emits the stop token 2
    out = speculative_decode(target, target, [0], k=2, config=SamplingConfig(), max_new_tokens=4,
                             stop_tokens=(t for t in [2]), rng=np.random.default_rng(0))
    assert out.tokens == [2] and out.stopped
    out = sample_target(target, [0], config=SamplingConfig(), max_new_tokens=4, stop_tokens=(t for t in [2]),
                        rng=np.random.default_rng(0))
    assert out.tokens == [2] and out.stopped


def test_model_errors_say_which_side_failed():
    good = LogitTable(np.zeros((3, 3)))

    def broken(tokens):
        raise IndexError("boom")

    def nan_logits(tokens):
        return np.full((len(tokens), 3), np.nan)

    for target, draft, side in [(broken, good, "target"), (good, broken, "draft"), (good, nan_logits, "draft")]:
        with pytest.raises(Exception) as e:
            speculative_decode(target, draft, [0], k=2, config=SamplingConfig(), max_new_tokens=3,
                               rng=np.random.default_rng(0))
        assert side in str(e.value) + " ".join(getattr(e.value, "__notes__", [])), e.value


def test_a_larger_draft_vocabulary_is_caught_before_the_target_sees_a_token():
    seen = []

    def target(tokens):  # a callable target over V = 3 that indexes with the tokens it gets
        seen.append(list(tokens))
        return np.eye(3)[np.asarray(tokens) % 3] * 0.0

    draft = LogitTable(np.zeros((5, 5)))
    with pytest.raises(SpecrefError, match="vocabulary mismatch"):
        speculative_decode(target, draft, [0], k=2, config=SamplingConfig(), max_new_tokens=3,
                           rng=np.random.default_rng(0))
    assert all(max(s) < 3 for s in seen)


def _float32_rows(rng, V, n):
    z = rng.normal(0, 3, (n, V)).astype(np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)  # a softmax in float32, as engines give it


@pytest.mark.parametrize("V", [2, 7, 100, 5000, 50000])
def test_float32_rows_are_accepted_and_renormalised(V):
    rng = np.random.default_rng(V)
    p, q = _float32_rows(rng, V, 3), _float32_rows(rng, V, 2)
    x = [int(np.argmax(q[0])), int(np.argmax(q[1]))]
    with pytest.warns(LowPrecisionRows):
        out = speculative_step(p, q, x, rng)
    assert 1 <= len(out) <= 3
    with pytest.warns(LowPrecisionRows):
        fixed = check_prob_rows("p", p)
    assert fixed.dtype == np.float64 and np.all(np.abs(fixed.sum(axis=-1) - 1) <= 1e-12)
    assert np.abs(p.astype(np.float64).sum(axis=-1) - 1).max() <= row_tolerance(np.float32, V)
    for dtype in (np.float32, np.float16):  # a row off by more than the tolerance is still refused
        off = np.full((1, V), 1.0 / V, dtype=np.float64)
        off[0, 0] += 3 * row_tolerance(dtype, V)
        with pytest.raises(SpecrefError, match="tolerance"):
            check_prob_rows("p", off.astype(dtype))


def test_row_tolerance_scales_with_eps_and_v():
    assert row_tolerance(np.float64, 50000) == 1e-9
    assert row_tolerance(np.float32, 4) == pytest.approx(8 * np.finfo(np.float32).eps * 2)
    assert row_tolerance(np.float32, 400) == pytest.approx(10 * row_tolerance(np.float32, 4))
    assert row_tolerance(np.float16, 10**6) == 1e-2  # capped


def test_counts_near_2_to_62_and_infinite_min_expected_are_refused():
    with pytest.raises(SpecrefError, match="2\\*\\*53"):
        g_test(np.array([2**62, 2**62, 2**62]), np.full(3, 1 / 3))
    with pytest.raises(SpecrefError, match="min_expected"):
        g_test(np.array([5, 5]), np.full(2, 0.5), min_expected=float("inf"))
    assert g_test(np.array([2**40, 2**40]), np.full(2, 0.5)).p_value == 1.0  # large exact counts still work


def test_target_law_has_a_path_budget():
    t0 = time.monotonic()
    with pytest.raises(SpecrefError, match="max_paths"):  # 16 new tokens at V = 3: 2e7 prefixes
        target_law(ProbTable(P), [0], SamplingConfig(), 16, max_paths=2000)
    assert time.monotonic() - t0 < 10
    with pytest.raises(SpecrefError, match="max_paths"):
        target_law(ProbTable(P), [0], SamplingConfig(), 6, max_paths=10)


def test_statistical_check_with_the_generator_class_is_refused_not_crashed():
    def uses_class(p, q, x, seed):
        return sample_steps(p, q, 1, np.random.Generator).tokens[0][:1].tolist()

    report = check_step(uses_class, cases=CASES, mode="statistical", samples=20)
    assert report.results[0].status == "raised" and "class" in report.results[0].detail


def _entry_points():
    """(name, function, valid keyword arguments) for the public functions not covered above."""
    from specref.core.step import acceptance_rate, accepted_mass, residual, residual_mass
    from specref.decoding.vectorized import first_token_frequencies
    from specref.verification.laws.enumeration import law
    from specref.verification.statistics.counts import samples_needed, tv_estimate

    table = ProbTable(np.stack([P[0], P[1], P[2]]))
    return [
        ("residual", residual, dict(p=P[0], q=Q[0])),
        ("acceptance_rate", acceptance_rate, dict(p=P[0], q=Q[0])),
        ("accepted_mass", accepted_mass, dict(p=P[0], q=Q[0])),
        ("residual_mass", residual_mass, dict(p=P[0], q=Q[0])),
        ("first_token_frequencies", first_token_frequencies,
         dict(p_target=P, q_draft=Q, n=10, rng=np.random.default_rng(0))),
        ("samples_needed", samples_needed, dict(tv=0.1, alpha=1e-3, power=0.9, n_outcomes=3)),
        ("tv_estimate", tv_estimate, dict(counts=np.array([3, 5, 2]), probs=P[0], confidence=0.99)),
        ("target_law", target_law, dict(model=table, prompt=[0], config=SamplingConfig(), max_new_tokens=2,
                                        stop_tokens=())),
        ("sample_target", sample_target, dict(target=table, prompt=[0], config=SamplingConfig(), max_new_tokens=2,
                                              stop_tokens=(), rng=np.random.default_rng(0))),
        ("law", law, dict(program=lambda rng: rng.choice(2), max_paths=10)),
        ("check_step", check_step, dict(step_fn=speculative_step, cases=CASES, mode="exact")),
    ]


ENTRY_POINTS = _entry_points()


@FUZZ
@given(st.sampled_from(range(len(ENTRY_POINTS))), st.data(), BAD)
def test_every_other_entry_point_refuses_or_works(i, data, bad):
    name, fn, valid = ENTRY_POINTS[i]
    arg = data.draw(st.sampled_from(sorted(valid)))
    assume(not (arg == "max_new_tokens" and isinstance(bad, int) and bad > 100))  # valid, but a huge law
    assume(not (arg in ("n", "max_paths") and isinstance(bad, int) and bad > 10**6))  # valid, but long
    args = dict(valid)
    args[arg] = bad
    positional = [args.pop(k) for k in list(args) if k in ("step_fn", "program")]
    out = outcome(lambda: fn(*positional, **args), arg)
    if out is not None:
        no_nan(out if isinstance(out, np.ndarray) else np.asarray(getattr(out, "frequencies", 0.0), dtype=float))
