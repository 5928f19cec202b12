"""The oracle's front door and its time limits: they never lie and never die (SPEC §13.2, §13.3, §15).

Each test reproduces one way an implementation, an argument or a slow machine made ``check``,
``plan`` or the command line raise, hang, blame the wrong party or say "FAILS" where nothing was
judged.  Every hang runs under short limits: the default rule's constants are patched down (the
test is about the mechanism), and the default numbers themselves are tested as the pure function
that derives them.  A check that could hang runs in a forked process with a deadline
(:func:`_in_a_fork`), so a regression fails the test instead of stopping the suite.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.step import speculative_step
from specref.decoding.batched import batched_step
from specref.verification.campaigns.planning import plan
from specref.verification.cases.chain import Case
from specref.verification.levels import LEVELS
from specref.verification.oracle import check
from specref.verification.running import calling
from specref.verification.running.calling import can_isolate
from specref.verification.running.level import Level, fixed_reference
from specref.verification.running.report import CaseResult, Report, Settings
from tests.implementations import decoder_reference

ROOT = Path(__file__).resolve().parents[1]
needs_fork = pytest.mark.skipif(not can_isolate(), reason="the hard deadline and these tests need fork")
TWO_ROWS = [c for c in LEVELS["batched"].cases() if c.name == "two-rows"]
# V = 2, K = 1: a handful of enumerated paths, so a case of slow calls stays short
TINY = Case("tiny", np.array([[Fraction(1, 2), Fraction(1, 2)]] * 2, dtype=object),
            np.array([[Fraction(1, 4), Fraction(3, 4)]] * 2, dtype=object), k=1)


def _in_a_fork(thunk, seconds: float):
    """``thunk()`` in a forked process given ``seconds``: ``("returned", value)``, ``("raised", text)``,
    ``("died", exit code)`` when it ended without a word, or ``("not answered", None)`` (then killed).
    Not daemonic: the check inside forks workers of its own."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            send.send(("returned", thunk()))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            send.send(("raised", f"{type(e).__name__}: {e}"))

    process = ctx.Process(target=child)
    process.start()
    send.close()
    got = ("not answered", None)
    if receive.poll(seconds):
        try:
            got = receive.recv()
        except EOFError:
            process.join(5)
            got = ("died", process.exitcode)
    if process.is_alive():
        process.kill()
    process.join()
    return got


# ---------------------------------------------------------------- 11. counts that are not numbers


def nan_counts(p_target, q_draft, draft_tokens, seed):
    """Right tokens, ``n_emitted`` as floats with a NaN: not a count."""
    out = batched_step(p_target, q_draft, draft_tokens, seed)
    counts = np.asarray(out.n_emitted, dtype=np.float64)
    counts[0] = np.nan
    return out.tokens, counts


def half_counts(p_target, q_draft, draft_tokens, seed):
    """``n_emitted + 0.5``: a float that truncates to the right count is still not one."""
    out = batched_step(p_target, q_draft, draft_tokens, seed)
    return out.tokens, np.asarray(out.n_emitted, dtype=np.float64) + 0.5


@pytest.mark.parametrize("fn", [nan_counts, half_counts])
def test_counts_that_are_not_whole_numbers_are_invalid_output(fn):
    """Before: ``int(nan)`` raised inside the oracle's parser -- ``internal error`` (the CLI exited 2);
    ``n + 0.5`` truncated to ``n`` and passed.  Fails if the parser accepts or crashes on them."""
    r = check("batched", fn, cases=TWO_ROWS, isolate=False, state_check=False).results[0]
    assert r.status == "invalid output" and "n_emitted" in r.detail, r


# ---------------------------------------------------------------- 16. arguments named


@dataclass(frozen=True)
class _Row:
    name: str
    row: tuple


def _one_draw(rng_row):  # pragma: no cover - the level is never run here
    raise AssertionError


_BARE = Level("bare_front_door", "sample_fn(p [V], rng) -> token", lambda: [_Row("r", (Fraction(1),))],
              lambda level, fn, cases, settings: Report(level.name, settings.mode),
              reference=fixed_reference(_one_draw))  # no validate: the door itself must name a bad case


@pytest.mark.parametrize("call, words", [
    (lambda: check("step", speculative_step, settings="x"), ("settings", "'x'")),
    (lambda: check("step", speculative_step, settings=Settings), ("settings", "Settings")),
    (lambda: plan("step", speculative_step, cases=[None], quiet=True), ("cases", "None")),
    (lambda: plan(_BARE, _one_draw, cases=[None], quiet=True), ("case 0", "None")),
    (lambda: check(_BARE, _one_draw, cases=[3]), ("case 0", "3")),
    (lambda: plan("step", speculative_step, file=5, samples=32), ("file", "5")),
    (lambda: plan("step", speculative_step, quiet="yes"), ("quiet", "'yes'")),
])
def test_a_bad_argument_is_a_specref_error_naming_it_and_its_value(call, words):
    """Before: ``plan(file=5)`` raised AttributeError after timing every case, and a level without its
    own ``validate`` let ``None`` through to ``case.name``.  Fails if any of these raises anything
    but a SpecrefError that names the argument and the value."""
    with pytest.raises(SpecrefError) as caught:
        call()
    assert all(w in str(caught.value) for w in words), str(caught.value)


# ---------------------------------------------------------------- 17. attribute reads that raise


class _Hostile:
    """Callable; every attribute it does not have raises RuntimeError (not AttributeError)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("the front door should not have called it")

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")


@pytest.mark.parametrize("level", ["step", "logits", "batched", "tree", "batched_coins", "mrv2", "greedy_tree"])
@pytest.mark.parametrize("mode", ["exact", "statistical"])
def test_an_attribute_read_that_raises_is_named_before_any_case(level, mode):
    """Before: ``rules_of`` (and the other declaration reads) let the RuntimeError out of ``check``.
    Decided (SPEC §13.2): the declarations are read once, before any case; a read that raises
    anything but AttributeError is a SpecrefError naming the attribute -- the oracle cannot know
    how to call the implementation.  Fails if check raises anything else or calls it."""
    if mode == "statistical" and not LEVELS[level].statistical:
        pytest.skip("exact-only level")
    fn = _Hostile()
    with pytest.raises(SpecrefError) as caught:
        check(level, fn, mode=mode, samples=32, progress=False)
    text = str(caught.value)
    assert "attribute" in text and "RuntimeError" in text and "no specref_" in text, text
    assert fn.calls == 0


# ---------------------------------------------------------------- 18. declarations of non-callables


def test_declare_ties_refuses_what_it_cannot_call():
    """Before: ``declare_ties(5, "split")`` returned a wrapper, and the check blamed the implementation
    (``raised``: 'int' object is not callable).  Fails if the declaration is accepted."""
    from specref.verification.levels.trees.greedy import declare_ties

    with pytest.raises(SpecrefError, match="callable.*5"):
        declare_ties(5, "split")


# ---------------------------------------------------------------- 19. a decoder that writes into its inputs


def rolls_its_target_once(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
    """On its first call, rolls the target table it was handed, then decodes."""
    if not getattr(rolls_its_target_once, "done", False):
        rolls_its_target_once.done = True
        target.table[...] = np.roll(target.table, 1, axis=-1)
    return decoder_reference(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                             stop_tokens=stop_tokens, rng=rng)


def test_a_decoder_that_writes_into_its_target_table_is_told_so():
    """Before: the first call's write made the enumerated law sum to 203/200, reported as the oracle's
    ``internal error``.  Fails unless the status names the write."""
    cases = [c for c in LEVELS["decoder"].cases() if c.name == "worked-example-rows"]
    rolls_its_target_once.done = False
    r = check("decoder", rolls_its_target_once, cases=cases, isolate=False).results[0]
    assert r.status == "writes into its inputs", r


# ---------------------------------------------------------------- 20. a time-out swallowed in a retry loop


def swallows_time_outs(*args, **kwargs):
    while True:  # eats every BaseException, the in-process time-out included
        try:
            time.sleep(5)
        except BaseException:  # noqa: BLE001
            pass


@needs_fork
@pytest.mark.parametrize("level, cases", [("batched", TWO_ROWS), ("batched_coins", LEVELS["batched_coins"].cases()[:1])])
def test_a_swallowed_time_out_is_answered_by_the_worker_s_hard_deadline(level, cases):
    """Before: exact mode ran in-process by default, where a retry loop eats SIGALRM's exception and the
    check never ended.  Now every level's default isolates the case, and the worker is killed at
    its per-call deadline.  Fails if no answer comes within 30 s (0.5 s a call here)."""
    got = _in_a_fork(lambda: [r.status for r in check(level, swallows_time_outs, cases=cases, time_limit=0.5).results],
                     30)
    assert got == ("returned", ["timeout"]), got


# ---------------------------------------------------------------- 21, 22. time limits from measured calls


def test_the_default_per_call_limit_follows_the_measured_calls():
    """The rule of SPEC §13.2 as a pure function: a case's first call 45 s; later calls 4 x the slowest
    call before them, at least 10 s.  A hang is thus answered within 45 s plus the set-up, under the
    60 s the rule promises.  Fails if the constants or the rule change without the spec."""
    assert calling.derived_time_limit(None) == calling.FIRST_CALL_LIMIT == 45.0
    assert calling.derived_time_limit(0.001) == calling.CALL_FLOOR == 10.0
    assert calling.derived_time_limit(9.0) == 36.0  # a correct 9 s kernel: 36 s a call, never 10
    assert calling.CALL_MARGIN == 4.0 and calling.FIRST_CALL_LIMIT + 15 <= 60


@pytest.fixture
def short_rule(monkeypatch):
    """The default rule with its constants scaled down: first call 0.4 s, then 4 x the slowest, >= 0.05 s."""
    monkeypatch.setattr(calling, "FIRST_CALL_LIMIT", 0.4)
    monkeypatch.setattr(calling, "CALL_FLOOR", 0.05)


def slow_but_correct(p_target, q_draft, draft_tokens, rng):
    time.sleep(0.08)  # each call 0.08 s: over a fixed 0.06 s limit, within 4 x any call before it
    return speculative_step(p_target, q_draft, draft_tokens, rng)


@needs_fork
def test_a_slow_correct_implementation_is_not_a_timeout_under_the_default_rule(short_rule):
    """A fixed limit below the call's time is a false time-out; the rule measures the first call and
    holds the later ones to 4 x it.  Fails if the default (time_limit=None) stops a correct slow call."""
    assert check("step", slow_but_correct, cases=[TINY], time_limit=0.06).results[0].status == "timeout"
    report = check("step", slow_but_correct, cases=[TINY])
    assert report.ok, str(report)


def hangs(*args, **kwargs):
    time.sleep(60)


@needs_fork
@pytest.mark.parametrize("level, mode", [("step", "exact"), ("step", "statistical"), ("mrv2", "exact"),
                                         ("batched_coins", "exact")])
def test_under_the_default_rule_the_first_time_out_ends_the_check(short_rule, level, mode):
    """A never-returning implementation: the first case times out at the first call's limit and the
    others are ``not run`` (before: each case waited 10 s, 30-280 s in all; the mrv2 level runs
    each case through its own runner call).  Fails if the check takes more than 15 s here, or if
    its first line says FAILS or DIFFERS."""
    cases = LEVELS[level].cases()[:3]
    t0 = time.monotonic()
    got = _in_a_fork(lambda: (lambda r: ([x.status for x in r.results], str(r).splitlines()[0]))(
        check(level, hangs, cases=cases, mode=mode, samples=64, progress=False)), 30)
    assert got[0] == "returned", got
    statuses, first_line = got[1]
    assert statuses == ["timeout", "not run", "not run"], got
    assert "FAILS" not in first_line and "DIFFERS" not in first_line and "timed out" in first_line, first_line
    assert time.monotonic() - t0 < 15


@needs_fork
def test_plan_run_each_and_sweeps_stop_at_the_first_time_out_too(short_rule, tmp_path):
    """The same rule in a plan (the rows after it: not timed), in run_each (the case whose planned
    calls timed out is not waited for twice; the cases after it are not run, and not written, so a
    run on the same file runs them) and in a sweep (the cells after it: not run, not recorded, and
    counted in its table).  Fails if any of them waits on every case."""
    from specref.verification.campaigns.planning import run_each
    from specref.verification.campaigns.sweep import run_sweep, sweep_table

    cases, path = LEVELS["step"].cases()[:3], tmp_path / "each.jsonl"
    sweep = {"impl": "tests.test_front_door_guards:hangs", "level": "step",
             "settings": {"mode": "statistical", "samples": 64}, "grid": {"case": [c.name for c in cases]}}

    def three():
        rows = plan("step", hangs, cases, quiet=True, samples=64)
        report = run_each("step", hangs, cases, json_lines=path, mode="statistical", samples=64, progress=False)
        table = sweep_table(run_sweep(sweep, progress=False))
        return ([r.note.partition(":")[0] for r in rows], [r.status for r in report.results],
                [line.split()[1] for line in table.splitlines()[1:-1]], table.splitlines()[-1][:17])

    t0 = time.monotonic()
    got = _in_a_fork(three, 40)
    assert got == ("returned", (["timeout", "not timed", "not timed"], ["timeout", "not run", "not run"],
                                ["timeout"], "2 cell(s) not run")), got
    assert len(path.read_text().splitlines()) == 1 and time.monotonic() - t0 < 20


@pytest.mark.parametrize("statuses, said, unsaid, code", [
    (["ok", "timeout"], "NO VERDICT: 1 case(s) timed out", ("MISBEHAVES", "DIFFERS", "BOUNDARY"), 6),
    (["timeout", "not run"], "NO VERDICT", ("MISBEHAVES", "DIFFERS"), 6),
    (["ok", "raised"], "MISBEHAVES: 1 case(s) (raised: 1", ("DIFFERS",), 3),  # before: "DIFFERS (worst TV 0.004)"
    (["differs", "timeout"], "DIFFERS", ("MISBEHAVES", "NO VERDICT"), 1),
    (["ok", "boundary", "boundary"], "BOUNDARY: 2 case(s)", ("DIFFERS", "MISBEHAVES"), 4),  # before: "FAILS"
    (["boundary", "timeout"], "BOUNDARY", ("DIFFERS", "MISBEHAVES"), 4),
    (["boundary", "stateful"], "MISBEHAVES", ("DIFFERS",), 3),
    (["over budget", "ok"], "NO VERDICT: 1 case(s) could not be judged", ("DIFFERS", "MISBEHAVES"), 5),
    (["differs", "internal error"], "INTERNAL ERROR", ("MISBEHAVES",), 2),
])
def test_the_first_line_says_what_was_judged(statuses, said, unsaid, code):
    """A time-out is no verdict, an ok case's plug-in TV estimate is no difference, a boundary deviation is
    neither a difference nor a misbehaviour; the exit status names the same outcome (SPEC §13.3).  Fails if
    the report's first line or its exit status says otherwise."""
    tvs = {"ok": 0.004, "differs": 0.3, "boundary": 6e-8}
    report = Report("step", "statistical", [CaseResult(replace(TINY, name=f"case-{i}"), s, tv=tvs.get(s))
                                            for i, s in enumerate(statuses)])
    line = str(report).splitlines()[0]
    assert said in line and not any(w in line for w in unsaid) and report.exit_status == code, line
    judged = [r.case for r in report.results if r.status not in ("ok", "not run")]
    assert report.counterexample in judged  # a failing case that was judged, never one not run


# ---------------------------------------------------------------- 23. the command line's exit statuses


IMPLS = (
    "import os\n"
    "from specref.core.step import speculative_step\n"
    "def hard_exit(p, q, x, rng): os._exit(0)\n"
    "def interrupts(p, q, x, rng): raise KeyboardInterrupt\n"
)


@pytest.fixture
def impls(tmp_path, monkeypatch):
    (tmp_path / "front_door_impls.py").write_text(IMPLS)
    (tmp_path / "interrupts_at_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("front_door_impls", "interrupts_at_import"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def _cli(*argv):
    """``specref ARGV`` in this process: (exit status, output)."""
    from specref import cli

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


@needs_fork
@pytest.mark.parametrize("target, code, word", [
    ("front_door_impls:hard_exit", 3, "crashed"),  # misbehaves (SPEC §13.3)
    ("front_door_impls:interrupts", 3, "KeyboardInterrupt"),
    ("interrupts_at_import:f", 2, "cannot load"),
])
def test_no_isolate_exit_statuses_follow_the_statuses(impls, target, code, word):
    """Before: ``os._exit(0)`` in the implementation under ``--no-isolate`` ended the command with 0,
    and a KeyboardInterrupt at import with 130.  Fails unless 3 (a misbehaviour) and 2 (an import
    failure), with the reason printed."""
    got = _in_a_fork(lambda: _cli("check", "--impl", target, "--no-isolate", "--time-limit", "5"), 60)
    assert got[0] == "returned" and got[1][0] == code and word in got[1][1], got


@needs_fork
def test_no_isolate_exit_status_of_the_real_process(impls):
    """The console command as a user runs it (one process, real file descriptors)."""
    env = {**os.environ, "PYTHONPATH": f"{impls}{os.pathsep}{ROOT}"}
    run = subprocess.run([sys.executable, "-m", "specref", "check", "--impl", "front_door_impls:hard_exit",
                          "--no-isolate"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert run.returncode == 3 and "crashed" in run.stdout + run.stderr, run.stdout + run.stderr


# ---------------------------------------------------------------- 24. Dask


def test_a_dask_client_takes_dask_executor_or_is_refused():
    """Before: a Client was accepted (its futures are not concurrent.futures'), and its get_executor()
    ran every shard on a Dask thread, each call with a watchdog thread: 2.07x a pool's time.  Fails
    unless both are refused naming dask_executor, and dask_executor(client=) is accepted."""
    distributed = pytest.importorskip("distributed")
    from specref.adapters.cluster import dask_executor

    cluster = distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    client = distributed.Client(cluster)
    try:
        for executor in (client, client.get_executor()):
            with pytest.raises(SpecrefError, match="dask_executor"):
                check("step", speculative_step, mode="statistical", executor=executor)
        with dask_executor(client=client) as executor:
            assert Settings(mode="statistical", executor=executor).executor is executor
        assert client.status == "running"  # a client handed in is the caller's to close
    finally:
        client.close()
        cluster.close()
