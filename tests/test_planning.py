"""plan: N per case and an ETA before a statistical run; run_each: verdicts kept case by case."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from specref.core.errors import SpecrefError
from specref.verification.campaigns.planning import CASE_TIME_CAP, PlanRow

from specref.verification.oracle import check_step, default_cases
from specref.verification.campaigns.planning import plan, run_each
from tests.implementations import raises_on_token_two, reference_with_seed


def test_plan_gives_the_planned_n_and_an_eta_per_case(capsys):
    cases = default_cases("step")[:2]
    rows = plan("step", reference_with_seed, cases, calls=3)
    out = capsys.readouterr().out
    assert "total ETA" in out and cases[0].name in out
    assert [r.case for r in rows] == [c.name for c in cases]
    assert rows[0].outcomes == 27 and rows[0].n == 181_452  # the planned N of the README's HF table
    assert all(r.seconds_per_call > 0 and r.batch == 1 and r.calls == r.n for r in rows)
    assert all(r.eta_s == r.first_call_s + (r.n - 1) * r.seconds_per_call for r in rows)
    assert plan("step", reference_with_seed, cases, samples=500, quiet=True)[0].n == 500


def test_plan_reports_a_misbehaving_implementation_instead_of_raising():
    rows = plan("step", raises_on_token_two, default_cases("step")[:1], calls=50, quiet=True)
    assert rows[0].eta_s is None and rows[0].note.startswith("raised")


def test_run_each_matches_one_check_and_keeps_every_verdict(tmp_path):
    cases = default_cases("step")[:3]
    seen = []
    path = tmp_path / "partial.jsonl"
    each = run_each("step", reference_with_seed, cases, mode="statistical", samples=300,
                    on_case=lambda i, r: seen.append((i, r.status)), json_lines=path)
    whole = check_step(reference_with_seed, cases=cases, mode="statistical", samples=300)
    assert [(r.status, r.p_value) for r in each.results] == [(r.status, r.p_value) for r in whole.results]
    assert seen == [(i, r.status) for i, r in enumerate(whole.results)]
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert [d["index"] for d in lines] == [0, 1, 2] and lines[0]["case"]["name"] == cases[0].name


# ---------------------------------------------------------------- batched implementations


def slow_batched(P, Q, X, seeds):  # 0.02 s per call whatever its size; a valid (wrong) block: x_1
    time.sleep(0.02)
    return X[:, :1]


def worked_example():
    return [c for c in default_cases("step", drawn=0) if c.name == "worked-example-rows"]


def test_a_batched_implementation_is_planned_per_call_of_its_batch():
    """N = 16,384 samples in calls of B = 256: 64 calls of 0.02 s each, about 1.3 s, not N x 0.02 s = 328 s.
    The ETA is checked against the actual check's time (isolate=False both times: no fork in either)
    within the factor 1.5 promised; the sleep is 0.02 s so that it, not the 2-core machine's load,
    dominates both times."""
    N, B = 16_384, 256
    row = plan("step", slow_batched, worked_example(), batch=B, samples=N, isolate=False, quiet=True)[0]
    assert (row.n, row.batch, row.calls) == (N, B, N // B)
    assert 0.02 <= row.seconds_per_call < 0.2 and row.first_call_s >= 0.02
    t0 = time.perf_counter()
    check_step(slow_batched, batch=B, cases=worked_example(), mode="statistical", samples=N, isolate=False,
               progress=False)
    actual = time.perf_counter() - t0
    assert actual / 1.5 <= row.eta_s <= 1.5 * actual, (row, actual)
    assert row.eta_s < N * 0.02 / 20


def test_calls_never_span_two_blocks_and_a_batch_is_cut_to_n():
    rows = plan("step", slow_batched, worked_example(), batch=300, samples=3000, isolate=False, quiet=True, calls=1)
    assert (rows[0].batch, rows[0].calls) == (300, 4 + 4 + 4)  # blocks of 1024, 1024, 952: 4 calls each
    rows = plan("step", slow_batched, worked_example(), batch=5000, samples=700, isolate=False, quiet=True, calls=1)
    assert (rows[0].batch, rows[0].calls) == (700, 1)


def test_the_first_call_is_timed_apart():
    seen = []

    def warms_up(P, Q, X, seeds):  # a first call that compiles: 0.3 s, then 0.01 s
        time.sleep(0.3 if not seen else 0.01)
        seen.append(len(seeds))
        return X[:, :1]

    row = plan("step", warms_up, worked_example(), batch=64, samples=6400, isolate=False, quiet=True)[0]
    assert seen == [64] * 6  # the first call and 5 warm ones, each of the declared batch
    assert row.first_call_s >= 0.3 and row.seconds_per_call < 0.1
    assert row.eta_s == row.first_call_s + (row.calls - 1) * row.seconds_per_call


PLAN_FRESH = textwrap.dedent("""
    from specref.verification.campaigns.planning import plan
    from specref.core.draws import coerce_rng
    from specref.core.errors import SpecrefError
    from specref.core.sampling import process
    from specref.core.step import speculative_step
    from specref.decoding.chain import speculative_decode
    from specref.verification.levels import LEVELS
    from specref.verification.oracle import EXACT_ONLY, STATISTICAL_ONLY, _reference_of

    def step(p, q, x, rng):
        return speculative_step(p, q, x, coerce_rng(rng))

    def logits(t, d, x, config, rng):
        return speculative_step(process(t, config), process(d, config), x, coerce_rng(rng))

    def decoder(target, draft, prompt, *, rng, **kw):
        return speculative_decode(target, draft, list(prompt), rng=coerce_rng(rng), **kw).tokens

    chain = {"step": step, "logits": logits, "decoder": decoder}
    for level in LEVELS:
        fn = chain.get(level) or _reference_of(level)
        for mode in ("statistical", "exact"):
            if (mode == "statistical" and level in EXACT_ONLY) or (mode == "exact" and level in STATISTICAL_ONLY):
                try:  # "has no statistical mode" / "is statistical only"
                    plan(level, fn, mode=mode, quiet=True)
                except SpecrefError as e:
                    assert level in str(e) and "statistical" in str(e) and mode in str(e), e
                    print(level, mode, "refused", 0)
                    continue
                raise AssertionError(level)
            rows = plan(level, fn, LEVELS[level].cases()[:2], mode=mode, calls=1, quiet=True,
                        samples=100 if mode == "statistical" else None)
            bad = [r for r in rows if r.eta_s is None or r.seconds_per_call is None or r.first_call_s is None
                   or r.calls is None or r.case_time_limit < 300]
            assert rows and not bad, (level, mode, bad)
            print(level, mode, len(rows), sum(r.n for r in rows))
""")


def test_plan_works_at_every_level_and_mode_in_a_fresh_process():
    """The first two default cases of every registered level, each with specref's own implementation
    there, statistical and exact mode, with nothing imported before the planning module
    (``plan(..., mode="statistical")`` once raised a raw TypeError): every row has N, its calls, the
    first and the warm calls timed and an ETA; statistical mode at an exact-only level, and exact
    mode at a statistical-only one, is refused, naming the level and the mode."""
    from specref.verification.levels import LEVELS
    from specref.verification.oracle import EXACT_ONLY, STATISTICAL_ONLY

    out = subprocess.run([sys.executable, "-c", PLAN_FRESH], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assert [line[:2] for line in lines] == [[lv, m] for lv in LEVELS for m in ("statistical", "exact")]
    for level, mode, n_cases, n in lines:
        if n_cases == "refused":
            assert (level in EXACT_ONLY and mode == "statistical") or (level in STATISTICAL_ONLY and mode == "exact")
        else:
            assert int(n) == (100 * int(n_cases) if mode == "statistical" else int(n)) and int(n) >= int(n_cases)


def test_exact_mode_plans_the_reference_paths():
    """Exact mode: N is the number of paths of the reference's enumeration -- on the worked example
    (K = 2, V = 3) every draft pair and coin outcome, counted by the enumerator itself."""
    from specref.core.step import speculative_step
    from specref.verification.laws.enumeration import law
    from specref.verification.levels import LEVELS

    case = worked_example()[0]
    program, _ = LEVELS["step"].program(speculative_step, case, 10.0)
    paths = law(lambda rng: program(rng, rng)).paths
    row = plan("step", speculative_step, [case], mode="exact", isolate=False, quiet=True)[0]
    assert row.n == row.calls == paths and row.batch == 1 and row.eta_s > 0


def test_plan_refuses_unknown_levels_exact_only_modes_and_bad_batches_by_name():
    from specref.verification.levels.coins.kernels import engine_coin_kernel

    with pytest.raises(SpecrefError, match="plan needs a registered level .*'no-such-level'"):
        plan("no-such-level", slow_batched)
    with pytest.raises(SpecrefError, match="batched_coins level has no statistical mode.*mode='statistical'"):
        plan("batched_coins", engine_coin_kernel, quiet=True)
    for bad in (0, True, 2.5):
        with pytest.raises(SpecrefError, match=f"batch .* must be a positive integer, got {bad!r}"):
            plan("step", slow_batched, worked_example(), batch=bad, quiet=True)


def test_the_planned_n_and_calls_are_the_checks_at_the_batched_level():
    """Statistical: N rows is the N the batched check itself reports, in calls of one block of copies
    (the reference, B = 2 rows per copy: 2 x 1024 rows per call), counted by a wrapper during the check;
    exact: N is the calls the exact check makes of the reference, counted the same way."""
    from specref.decoding.batched import batched_step
    from specref.verification.oracle import check
    from specref.verification.levels.batched.steps import default_batched_cases

    case = [c for c in default_batched_cases() if c.name == "two-rows"]
    seen = []

    def counted(p, q, x, seed):
        seen.append(p.shape[0])
        return batched_step(p, q, x, seed)

    for mode in ("statistical", "exact"):
        seen.clear()
        row = plan("batched", counted, case, mode=mode, isolate=True, quiet=True, calls=2)[0]
        result = check("batched", counted, cases=case, mode=mode, isolate=False, progress=False,
                       state_check=False).results[0]
        assert result.ok and row.calls == len(seen) and row.eta_s > 0, (mode, row, len(seen))
        if mode == "statistical":
            assert row.n == result.n_samples and row.batch == 1024 and set(seen) == {2 * 1024, 2 * (row.n % 1024)}
        else:
            assert row.n == len(seen) and set(seen) == {2}


def test_a_level_registered_outside_specref_says_what_it_cannot_plan(monkeypatch):
    """A level specref does not know: its calls are still timed, but N (statistical) and the calls of
    an exact check (no reference to count them on) are unknown until run: no ETA, the reason in the
    note, and the case time limit is the floor."""
    from specref.decoding.batched import batched_draft_and_verify
    from specref.verification.levels import LEVELS
    from specref.verification.levels.batched.steps import run_batched
    from specref.verification.running.level import Level

    level = Level("my-batched", "step_fn(p_target, q_draft, seed)", lambda: [], run_batched)  # draft-and-verify's call
    monkeypatch.setitem(LEVELS, "my-batched", level)
    case = [c for c in LEVELS["batched"].cases() if c.name == "two-rows"]
    for mode, why in (("statistical", "plan does not know how the 'my-batched' level plans N"),
                      ("exact", "no reference at the 'my-batched' level")):
        row = plan("my-batched", batched_draft_and_verify, case, mode=mode, isolate=False, quiet=True, calls=1)[0]
        assert row.eta_s is None and row.n is None and why in row.note, row
        assert row.seconds_per_call > 0 and row.case_time_limit == 300.0


# ---------------------------------------------------------------- case time limits and resuming


def test_the_default_case_time_limit_follows_the_plan():
    short = PlanRow("a", 3, 100, 0.001, 0.1)
    assert short.case_time_limit == 300.0  # the Settings default is the floor
    assert PlanRow("a", 3, 10**6, 0.01, 1000.0).case_time_limit == 3000.0  # three ETAs
    assert PlanRow("a", 3, 10**9, 1.0, 1e9).case_time_limit == CASE_TIME_CAP == 24 * 3600.0
    assert PlanRow("a", 3, 100, None, None, note="raised").case_time_limit == 300.0


def sleepy(p, q, x, seed):  # 0.01 s per call; a valid block (x_1)
    time.sleep(0.01)
    return [int(x[0])]


def test_run_each_gives_each_case_its_planned_time_limit(monkeypatch):
    """100,000 samples of calls of >= 0.01 s: an ETA of >= 1,000 s, so the case's limit is 3 ETAs
    (3,000 s and a little more for the time around the sleep; under 1.5 x that), not 300 s.  The
    check itself is replaced by a recorder: the run would take 17 minutes."""
    from specref.verification import oracle

    used = []

    def recorder(level, fn, *, cases, settings, **kw):
        used.append(settings.case_time_limit)
        return oracle.Report(level=level, mode=settings.mode, results=[oracle.CaseResult(cases[0], "ok")])

    monkeypatch.setattr(oracle, "check", recorder)
    case = default_cases("step")[:1]
    run_each("step", sleepy, case, mode="statistical", samples=100_000)
    run_each("step", sleepy, case, mode="statistical", samples=100_000, case_time_limit=42.0)
    assert 3000.0 <= used[0] <= 4500.0 and used[1] == 42.0, used


def test_run_each_resumes_from_its_json_lines_without_duplicates(tmp_path):
    cases = default_cases("step")[:3]
    path = tmp_path / "campaign.jsonl"
    first = run_each("step", reference_with_seed, cases[:2], mode="statistical", samples=300, json_lines=path)
    path.write_text(path.read_text() + '{"index": 2, "case": {"na')  # a line cut short by an interrupt
    seen = []
    again = run_each("step", reference_with_seed, cases, mode="statistical", samples=300, json_lines=path,
                     on_case=lambda i, r: seen.append(i))
    assert seen == [2]  # cases 0 and 1 were in the file
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert [d["index"] for d in lines] == [0, 1, 2]
    whole = check_step(reference_with_seed, cases=cases, mode="statistical", samples=300)
    assert [(r.status, r.p_value, r.n_samples) for r in again.results] == [
        (r.status, r.p_value, r.n_samples) for r in whole.results]
    assert [r.case.name for r in again.results] == [c.name for c in cases]
    assert [r.p_value for r in first.results] == [r.p_value for r in again.results[:2]]
    third = run_each("step", reference_with_seed, cases, mode="statistical", samples=300, json_lines=path)
    assert len(path.read_text().splitlines()) == 3 and third.ok == whole.ok
    with pytest.raises(SpecrefError, match="another run"):
        run_each("step", reference_with_seed, cases, mode="statistical", samples=300, json_lines=path, seed=7)


@pytest.mark.skipif(sys.platform == "win32", reason="the plan's timed calls run in a forked worker")
def test_the_default_case_time_limit_times_no_more_calls_than_the_check_makes(tmp_path):
    """A statistical check whose case is one call: its default case time limit is planned from that one
    call timed (not from the first and three warm calls, four checks' worth of work), and the check's
    own calls follow.  Calls are counted in a file: the plan's run in a forked worker."""
    from specref import check
    from specref.decoding.batched import batched_step
    from specref.verification.levels import LEVELS

    log = tmp_path / "calls"

    def counted(p, q, x, seed):
        with open(log, "a") as f:
            f.write(f"{len(x)}\n")
        return batched_step(p, q, x, seed)

    case = next(c for c in LEVELS["batched"].cases() if c.num_draft is None and not c.statistical_only)
    counts = {}
    for name, limit in (("default", {}), ("given", {"case_time_limit": 600.0})):
        log.write_text("")
        report = check("batched", counted, cases=[case], mode="statistical", samples=64, isolate=False,
                       progress=False, **limit)
        assert report.ok, str(report)
        counts[name] = len(log.read_text().split())
    assert counts["given"] >= 1 and counts["default"] - counts["given"] == 1, counts
