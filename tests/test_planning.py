"""plan: N per case and an ETA before a statistical run; run_each: verdicts kept case by case."""

import json

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
    assert all(r.seconds_per_call > 0 and r.eta_s == r.n * r.seconds_per_call for r in rows)
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
