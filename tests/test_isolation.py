"""The oracle never raises on an implementation's behalf and cannot be stopped by one.

Each reproducer of a way to crash, hang or fool the oracle has a test here: exits,
crashes, signal tampering, C-level hangs, conversions that raise, case tables that
are written into, and the CLI's exit codes.  Isolated checks fork one worker per
case, so each test uses one or two cases and short time limits.
"""

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.verification.zoo import chain as zoo
from specref.verification.running.calling import Misbehaved, can_isolate, describe
from specref.verification.oracle import Case, check, check_decoder, check_logits_step, check_step, default_cases
from specref.verification.running.report import MAX_TOLERANCE, TABLE_DETAIL, Settings
from tests.implementations import decoder_reference, logits_reference

ROOT = Path(__file__).resolve().parents[1]
ONE = default_cases("step")[:1]  # worked-example rows, K = 2
needs_fork = pytest.mark.skipif(not can_isolate(), reason="isolation needs the fork start method")


# ---------------------------------------------------------------- implementations that misbehave


def exits(p, q, x, rng):
    sys.exit(0)


def hard_exit(p, q, x, rng):
    os._exit(0)


def segfault(p, q, x, rng):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def retries_forever(p, q, x, rng):
    while True:  # eats every BaseException, the in-process time-out included
        try:
            time.sleep(5)
        except BaseException:  # noqa: BLE001
            pass


def ignores_alarm(p, q, x, rng):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(30)


def resets_alarm(p, q, x, rng):
    signal.setitimer(signal.ITIMER_REAL, 0)
    time.sleep(30)


def c_level_hang(p, q, x, rng):
    re.match(r"(a+)+b", "a" * 40)  # catastrophic backtracking inside the C regex engine


_OWN_RNG = np.random.default_rng(7)  # seeded, so the test is deterministic; still not the oracle's rng


def own_generator(p, q, x, rng):  # forgot mode="statistical": its randomness is not the oracle's
    return speculative_step(p, q, x, _OWN_RNG)


class _StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def bad_exception(p, q, x, rng):
    raise _StrRaises()


class _ToListRaises:
    def tolist(self):
        raise RuntimeError("tolist failed")


class _IterRaises:
    def __iter__(self):
        raise RuntimeError("iter failed")


class _SlowToList:
    def tolist(self):
        time.sleep(30)


def fails_midway(p, q, x, rng):
    yield 0
    raise ValueError("midway")


def claims_ok(p, q, x, rng):  # raises the oracle's own exception with the status "ok"
    raise Misbehaved("ok", "I pass")


def endless(p, q, x, rng):
    while True:
        yield 0


# ---------------------------------------------------------------- exits and BaseExceptions


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=needs_fork)])
@pytest.mark.parametrize("exc", [SystemExit(0), KeyboardInterrupt(), GeneratorExit()])
def test_base_exceptions_become_statuses(isolate, exc):
    def fn(p, q, x, rng):
        raise exc

    report = check_step(fn, cases=ONE, isolate=isolate)
    assert report.results[0].status == "raised" and type(exc).__name__ in report.results[0].detail


@needs_fork
@pytest.mark.parametrize("fn, status, word", [
    (hard_exit, "crashed", "exit code 0"),
    (segfault, "crashed", "SIGSEGV"),
    (retries_forever, "timeout", "time_limit"),
    (ignores_alarm, "timeout", "time_limit"),
    (resets_alarm, "timeout", "time_limit"),
    (c_level_hang, "timeout", "time_limit"),
])
def test_isolated_worker_turns_exits_crashes_and_hangs_into_statuses(fn, status, word):
    t0 = time.monotonic()
    report = check_step(fn, cases=ONE, isolate=True, time_limit=0.5)
    r = report.results[0]
    assert not report.ok and r.status == status and word in r.detail, r
    assert r.case.name == ONE[0].name
    assert time.monotonic() - t0 < 10  # the hard deadline held (0.5 s a call, plus the fork)


@needs_fork
def test_case_time_budget_kills_a_case_of_many_slow_calls():
    def slow(p, q, x, rng):
        time.sleep(0.05)
        return speculative_step(p, q, x, rng)

    report = check_step(slow, cases=ONE, isolate=True, case_time_limit=0.3)
    assert report.results[0].status == "timeout" and "case_time_limit" in report.results[0].detail


def test_case_time_budget_in_process():
    def slow(p, q, x, rng):
        time.sleep(0.05)
        return speculative_step(p, q, x, rng)

    report = check_step(slow, cases=ONE, case_time_limit=0.2, isolate=False)
    assert report.results[0].status == "timeout" and "budget" in report.results[0].detail


# ---------------------------------------------------------------- conversions and odd failures


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=needs_fork)])
@pytest.mark.parametrize("fn, status, word", [
    (own_generator, "bad rng use", "different random calls"),
    (bad_exception, "raised", "_StrRaises"),
    (lambda p, q, x, rng: _ToListRaises(), "invalid output", "tolist failed"),
    (lambda p, q, x, rng: _IterRaises(), "invalid output", "iter failed"),
    (fails_midway, "invalid output", "midway"),
    (endless, "invalid output", "or more tokens"),
    (lambda p, q, x, rng: np.zeros((2, 2), dtype=int), "invalid output", "shape"),
    (claims_ok, "raised", "I pass"),
])
def test_conversion_failures_are_statuses(isolate, fn, status, word):
    report = check_step(fn, cases=ONE, isolate=isolate)
    r = report.results[0]
    assert not report.ok and r.status == status and word in r.detail, r


def test_describe_survives_a_hostile_exception():
    assert describe(_StrRaises()) == "_StrRaises: <str() of the exception raised RuntimeError>"


def test_conversion_runs_inside_the_time_limit():
    t0 = time.monotonic()
    report = check_step(lambda p, q, x, rng: _SlowToList(), cases=ONE, time_limit=0.3)
    assert report.results[0].status == "timeout" and time.monotonic() - t0 < 5


def test_statistical_mode_statuses():
    def exits_with_seed(p, q, x, seed):
        sys.exit(3)

    report = check_step(exits_with_seed, cases=ONE, mode="statistical", samples=50)
    assert report.results[0].status == "raised" and "SystemExit" in report.results[0].detail


@needs_fork
def test_statistical_mode_isolated_crash():
    def crash_with_seed(p, q, x, seed):
        os._exit(7)

    report = check_step(crash_with_seed, cases=ONE, mode="statistical", samples=50, isolate=True)
    assert report.results[0].status == "crashed" and "exit code 7" in report.results[0].detail


_PYTEST_PID = os.getpid()


def _exits_in_a_worker(*args, **kwargs):
    """``os._exit(0)`` in a forked worker; in this process (which it would end) a RuntimeError instead."""
    if os.getpid() == _PYTEST_PID:
        raise RuntimeError("called in the oracle's own process")
    os._exit(0)


def _busy_ignoring_alarm(*args, **kwargs):
    """SIGALRM ignored, then 4 s of busy loop (no sleep for a signal to interrupt): an in-process
    time limit of 0.5 s cannot stop it, so in-process the check takes 4 s and gets None back."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    end = time.monotonic() + 4.0
    while time.monotonic() < end:
        pass


@needs_fork
@pytest.mark.parametrize("checker", [check_step, check_logits_step, check_decoder])
@pytest.mark.parametrize("fn, status, word", [
    (_exits_in_a_worker, "crashed", "exit code 0"),
    (_busy_ignoring_alarm, "timeout", "time_limit"),
])
def test_statistical_chain_checks_are_isolated_by_default(checker, fn, status, word):
    """Under the default ``isolate=None`` a statistical check at the step, logits and decoder levels
    runs each case in a forked worker: an implementation that calls ``os._exit`` or ignores SIGALRM
    in a busy loop gets a status within the time limit (0.5 s a call; 10 s in all allows two forks
    on a loaded machine), and the check goes on to its next case."""
    level = {check_step: "step", check_logits_step: "logits", check_decoder: "decoder"}[checker]
    two = default_cases(level)[:2]
    t0 = time.monotonic()
    report = checker(fn, cases=two, mode="statistical", samples=50, time_limit=0.5, progress=False)
    assert [r.status for r in report.results] == [status, status], str(report)
    assert all(word in r.detail for r in report.results), str(report)
    assert time.monotonic() - t0 < 10, "the hard deadline held"


def test_an_implementation_may_declare_it_runs_in_process():
    """``specref_isolate = False`` keeps a statistical chain check in this process: its side effects
    stay visible here (in a forked worker the counter would stay at 0)."""
    calls = []

    def counted(p, q, x, seed):
        calls.append(seed)
        return speculative_step(p, q, x, np.random.default_rng(seed))

    counted.specref_isolate = False
    report = check_step(counted, cases=ONE, mode="statistical", samples=200, progress=False)
    assert report.ok and len(calls) == 200, (str(report), len(calls))


# ---------------------------------------------------------------- cases that cannot change the verdict


def test_zero_cases_and_a_filter_that_matched_nothing_are_errors():
    with pytest.raises(SpecrefError, match="cases is empty"):
        check_step(zoo.residual_from_p, cases=[])
    with pytest.raises(SpecrefError, match="cases is empty"):  # the README's filter idiom, with a typo
        check_decoder(zoo.eos_mid_block_continues,
                      cases=[c for c in default_cases("decoder") if c.name == "stop-tokens"])
    with pytest.raises(SpecrefError, match="cases is empty"):
        check_step(speculative_step, cases=iter(()))


def _vandal(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
    out = decoder_reference(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                            stop_tokens=stop_tokens, rng=rng)
    target.table[...] = draft.table  # after its own decode: later calls would see the draft as target
    return out


def _rebinder(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
    out = decoder_reference(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                            stop_tokens=stop_tokens, rng=rng)
    target.table = draft.table.copy()  # its model object's own attribute: not an input's memory
    object.__setattr__(config, "temperature", 0.01)
    return out


@pytest.mark.parametrize("isolate", [False, pytest.param(True, marks=needs_fork)])
@pytest.mark.parametrize("fn, status", [(_vandal, "writes into its inputs"), (_rebinder, "ok")])
def test_writing_into_the_tables_changes_no_later_case(isolate, fn, status):
    """Each call gets fresh models and config, their tables read-only (SPEC §13.3): a write into a
    table is named at the write; rebinding its own model's table or config reaches no later call."""
    cases = [c for c in default_cases("decoder") if c.name in ("worked-example-rows", "p-equals-q")]
    before = [c.target.copy() for c in cases]
    report = check_decoder(fn, cases=cases, isolate=isolate)
    assert [r.status for r in report.results] == [status] * 2, str(report)
    assert all(np.array_equal(c.target, b) for c, b in zip(cases, before))
    assert all(c.config == SamplingConfig() for c in cases)


def test_rewriting_the_frozen_config_at_logits_level_changes_nothing():
    def vandal(t, d, x, config, rng):
        out = logits_reference(t, d, x, config, rng)
        object.__setattr__(config, "top_k", 1)
        return out

    cases = default_cases("logits")[:2]
    report = check_logits_step(vandal, cases=cases)
    assert report.ok, str(report)
    assert [c.config.top_k for c in cases] == [None, 2]


def test_counterexample_reproduces_and_is_rechecked_against_the_reference():
    def vandal(p, q, x, rng):  # wrong, and writes into what it is handed
        out = zoo.residual_from_p(p, q, x, rng)
        p[...], q[...] = 0, 0
        return out

    report = check_step(vandal)
    assert not report.ok and report.worst_tv > 1e-3
    case = report.counterexample
    assert all(r.status in ("ok", "differs") for r in report.results)  # "internal error": the re-check failed
    assert check_step(speculative_step, cases=[case]).ok
    assert check_step(vandal, cases=[case]).worst_tv == report.worst_tv


def test_a_case_too_large_to_enumerate_is_refused_up_front():
    big = Case("k30", ONE[0].target, ONE[0].draft, k=30)
    t0 = time.monotonic()
    with pytest.raises(SpecrefError, match="max_paths"):
        check_step(speculative_step, cases=[big])
    assert time.monotonic() - t0 < 2


def test_enumeration_over_its_path_budget_is_a_status():
    def many_draws(p, q, x, rng):
        for _ in range(12):
            rng.choice(2)
        return speculative_step(p, q, x, rng)

    report = check_step(many_draws, cases=ONE, max_paths=1000)
    assert report.results[0].status == "over budget"


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("field, value", [
    ("time_limit", float("inf")), ("time_limit", 0), ("case_time_limit", float("nan")),
    ("tolerance", 1), ("tolerance", MAX_TOLERANCE * 2), ("seed", -1), ("seed", 2**63), ("samples", 0),
    ("isolate", 1), ("max_paths", 0), ("mode", "fast"),
])
def test_settings_refuse_values_that_could_change_the_verdict(field, value):
    with pytest.raises(SpecrefError, match=field):
        Settings(**{field: value})
    with pytest.raises(SpecrefError, match=field):
        check_step(speculative_step, cases=ONE, **{field: value})


# ---------------------------------------------------------------- the CLI


IMPLS = (
    "import os, sys\n"
    "from specref.core.step import speculative_step\n"
    "def exits(p, q, x, rng): sys.exit(0)\n"
    "def hard_exit(p, q, x, rng): os._exit(0)\n"
    "def huge(p, q, x, rng): raise ValueError('x' * 200_000)\n"
    "def wrong(p, q, x, rng): return [int(x[0])] * (len(x) + 1)\n"
    "not_callable = 3\n"
)


@pytest.fixture
def impls(tmp_path, monkeypatch):
    """Modules impls13 (implementations) and broken13 (exits at import) on sys.path."""
    (tmp_path / "impls13.py").write_text(IMPLS)
    (tmp_path / "broken13.py").write_text("raise SystemExit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("impls13", "broken13"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def main(*args):
    """``python -m specref.verify`` in this process: (exit status, stdout + stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from specref import verify

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            code = verify.main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return code, out.getvalue()


@pytest.mark.parametrize("target, code, word", [
    pytest.param("impls13:exits", 3, "SystemExit", marks=needs_fork),  # raised: misbehaves (SPEC §13.3)
    pytest.param("impls13:hard_exit", 3, "crashed", marks=needs_fork),
    ("impls13:not_callable", 2, "not a callable"),
    ("broken13:f", 2, "cannot load"),
    ("no_such_module_13:f", 2, "cannot load"),
    ("specref.core.step:speculative_step", 0, "preserves"),
])
def test_cli_exit_codes(impls, target, code, word):
    got, text = main("--impl", target, "--time-limit", "5")
    assert got == code and word in text, text[-2000:]


def test_cli_usage_errors_exit_2(impls):
    got, text = main("--impl", "impls13:wrong", "--samples", "0")
    assert got == 2 and "--samples" in text


@needs_fork
def test_cli_truncates_details_and_json_keeps_the_record(impls, tmp_path):
    out = tmp_path / "report.json"
    got, text = main("--impl", "impls13:huge", "--json", str(out))
    assert got == 3, text[-2000:]  # raised: misbehaves
    assert len(text) < 30 * (TABLE_DETAIL + 200)  # ~14 cases of at most TABLE_DETAIL characters each
    record = json.loads(out.read_text())
    assert not record["ok"] and record["results"][0]["status"] == "raised"
    assert len(record["results"][0]["detail"]) > 200_000
    assert record["results"][0]["case"]["name"] == "worked-example-rows"
    got, text = main("--impl", "impls13:wrong", "--no-isolate")
    assert got == 1 and "counterexample" in text


@needs_fork
def test_cli_process_exit_status(tmp_path):
    """The real process: an implementation that calls os._exit(0) makes the CLI exit 3 (misbehaves: crashed),
    with a report."""
    (tmp_path / "impls13.py").write_text(IMPLS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = subprocess.run([sys.executable, "-m", "specref.verify", "--impl", "impls13:hard_exit"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 3 and "crashed" in run.stdout, run.stdout + run.stderr


def test_check_raises_only_for_bad_arguments():
    with pytest.raises(SpecrefError, match="callable"):
        check("step", 3)
    with pytest.raises(SpecrefError, match="level"):
        check("nope", speculative_step)


def test_an_internal_error_is_a_status_and_the_cli_exits_2(impls, monkeypatch):
    def broken_compare(*args, **kwargs):
        raise RuntimeError("the oracle's own bug")

    from specref.decoding.batched import batched_step
    from specref.verification.levels.batched.steps import default_batched_cases

    monkeypatch.setattr("specref.verification.levels.batched.steps.compare", broken_compare)
    report = check("batched", lambda p, q, x, seed: batched_step(p, q, x, seed), cases=default_batched_cases()[:1])
    assert report.results[0].status == "internal error" and "own bug" in report.results[0].detail
    got, text = main("--impl", "specref.decoding.batched:batched_step", "--level", "batched", "--no-isolate")
    assert got == 2 and "internal error" in text


def test_a_worker_forked_after_torch_ran_its_thread_pool_does_not_hang():
    """GNU OpenMP's pool is not fork-safe: without one intra-op thread in the worker, every
    isolated case of a torch implementation timed out once the parent had run torch's pool
    (measured: 7 of 7 cases 'timeout' at time_limit = 20 s; with it, all ok in 1.3 s)."""
    torch = pytest.importorskip("torch")
    from specref.decoding.batched import batched_step
    from specref.verification.levels.batched.steps import default_batched_cases

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(300, 300)
        float((a @ a).sum())  # the parent's pool has run

        def step(p, q, x, seed):
            float((torch.randn(200, 200) @ torch.randn(200, 200)).sum())  # a parallel region in the worker
            return batched_step(p, q, x, seed).tokens

        report = check("batched", step, cases=default_batched_cases()[:1], mode="statistical", samples=500,
                       isolate=True, time_limit=10, progress=False)
    finally:
        torch.set_num_threads(before)
    assert report.ok, str(report)
