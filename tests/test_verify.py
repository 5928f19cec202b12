"""python -m specref.verify: the report, its exit status, and the --impl entry point."""

import json
import subprocess
import sys
from fractions import Fraction

import pytest

from specref import verify
from specref.core.sampling import SamplingConfig
from tests.implementations import resample_from_p
from toy_models.ngram import NGramModel


def test_worked_example_and_mass_balance_hold():
    we = verify.worked_example()
    assert we["ok"] and we["resample_from_p"] == ["7/25", "1/2", "11/50"] and we["output"] == we["p"]
    mb = verify.mass_balance(300, seed=1)
    assert mb["ok"] and mb["with_rejection"] > 100


def test_edge_scenarios_and_json_report(tmp_path, capsys):
    path = tmp_path / "report.json"
    assert verify.main(["--scenario", "edge", "--json", str(path), "--no-progress"]) == 0
    report = json.loads(path.read_text())
    rows = report["scenarios"]
    assert report["ok"] and len(rows) >= 7 and all(r["kind"] == "correct" and r["ok"] for r in rows)
    exact_rows = [r for r in rows if r["tv_exact"] is not None]
    assert exact_rows and all(r["tv_exact"] == "0" for r in exact_rows)
    assert "PASS" in capsys.readouterr().out


def test_a_wrong_step_in_the_correct_matrix_fails_the_run():
    """The status logic can fail: a buggy step run as a 'correct' scenario is a FAIL row."""
    target = NGramModel.random(order=2, vocab_size=3, seed=1)
    draft = NGramModel.random(order=2, vocab_size=3, seed=2, zero_frac=0.3)
    bad = verify.decoder_law_scenario("bug as correct", target.exact, draft.exact, [0], k=2,
                                      config=SamplingConfig(), max_new_tokens=3, step=resample_from_p,
                                      key=verify.ngram_key(2, [0]))
    as_control = verify.Scenario("ref as control", "control", verify.decoder_law_scenario(
        "ref", target.exact, draft.exact, [0], k=2, config=SamplingConfig(), max_new_tokens=3).run)
    rows = verify.run_scenarios([bad, as_control], progress=False)
    assert [r["status"] for r in rows] == ["FAIL", "MISSED"]
    assert isinstance(Fraction(rows[0]["tv_exact"]), Fraction) and rows[0]["tv"] > 0


def test_memo_key_matches_the_unmemoised_law():
    """The n-gram memo key is an optimisation only: same law as memoising on the full state."""
    from specref.decoding.chain import speculative_transition
    from specref.verification.laws.enumeration import compare, law_iterated

    target = NGramModel.random(order=2, vocab_size=3, seed=5)
    draft = NGramModel.random(order=2, vocab_size=3, seed=6, zero_frac=0.3)
    it = speculative_transition(target.exact, draft.exact, [1, 2], k=2, config=SamplingConfig(), max_new_tokens=5)
    keyed = law_iterated((), it, key=verify.ngram_key(2, [1, 2]))
    full = law_iterated((), it)
    assert compare(keyed, full).tv == 0 and keyed.states < full.states


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "specref.verify", *args], capture_output=True, text=True, timeout=300)


def test_impl_entry_point_exit_status(tmp_path):
    ok = run_cli("--impl", "specref.core.step:speculative_step", "--level", "step")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "preserves the target distribution" in ok.stdout
    bad = run_cli("--impl", "tests.implementations:resample_from_p", "--level", "step")
    assert bad.returncode == 1 and "counterexample" in bad.stdout
    missing = run_cli("--impl", "no_such_module:f")
    assert missing.returncode == 2 and "cannot load" in missing.stderr


@pytest.mark.parametrize("scenario", ["no such scenario"])
def test_unknown_scenario_is_an_error(scenario):
    assert verify.main(["--scenario", scenario]) == 2


def test_impl_takes_a_batch_and_declared_rules():
    batched = run_cli("--impl", "tests.test_batched_calls:step_many", "--level", "step", "--batch", "64",
                      "--mode", "statistical", "--samples", "2000")
    assert batched.returncode == 0, batched.stdout + batched.stderr
    unbatched = run_cli("--impl", "tests.test_batched_calls:step_many", "--level", "step", "--mode", "statistical",
                        "--samples", "200")
    assert unbatched.returncode == 3 and "raised" in unbatched.stdout  # one sample per call: not its signature
    ruled = run_cli("--impl", "tests.test_rules:self_consistent", "--level", "logits",
                    "--rules", "order=top_k,top_p,min_p,temperature")
    assert ruled.returncode == 0 and "self-consistent" in ruled.stdout, ruled.stdout + ruled.stderr
    assert run_cli("--impl", "tests.test_rules:self_consistent", "--level", "logits").returncode == 1


@pytest.mark.parametrize("args, message", [
    (["--rules", "top_p_ties=keep_one"], "unknown top_p_ties convention 'keep_one'; known: keep_all, lowest_id"),
    (["--rules", "ties=lowest_id"], "unknown rules field 'ties'"),
    (["--batch", "0"], "batch (samples per call) must be a positive integer, got 0"),
    (["--level", "batched", "--batch", "4"], "applies at the step, logits, decoder levels, not 'batched'"),
    (["--level", "step", "--rules", "greedy_ties=split"], "rules apply at the logits and decoder levels"),
])
def test_bad_batch_and_rules_flags_are_usage_errors(args, message, capsys):
    assert verify.main(["--impl", "no_such_module:f", "--level", "logits", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "cannot load" not in err  # named before the implementation is imported


def test_batch_and_rules_go_with_impl(capsys):
    with pytest.raises(SystemExit) as e:
        verify.main(["--batch", "4"])
    assert e.value.code == 2 and "--batch and --rules" in capsys.readouterr().err
