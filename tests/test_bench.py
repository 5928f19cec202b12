"""``python -m specref.bench``: its command line refuses bad input clearly, a tiny run's JSON is
self-consistent, and the README's benchmark tables are exactly what the committed JSON runs say."""

import json
import statistics
import sys
from pathlib import Path

import pytest

from specref import bench
from specref.core.errors import SpecrefError
from toy_models.transformer import load

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_tables import OUT, REPEATS, RUNS, reproduction, tables  # noqa: E402


@pytest.mark.parametrize("args, needle", [
    (["--tokens", "0"], "argument --tokens: must be integers in 1..1024 separated by commas, got '0'"),
    (["--tokens", "32,x"], "argument --tokens: must be integers in 1..1024 separated by commas, got '32,x'"),
    (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got '0'"),
    (["--repeats", "two"], "argument --repeats: must be an integer >= 1, got 'two'"),
    (["--batch", "4,-1"], "argument --batch: must be integers in 1..64 separated by commas, got '4,-1'"),
    (["--batch", ""], "argument --batch: must be integers in 1..64 separated by commas, got ''"),
    (["--temperatures", "hot"], "argument --temperatures: must be a comma list of"),
    (["--drafts", "bigram"], "argument --drafts: must be a comma list of"),
])
def test_bad_arguments_get_a_clear_error_naming_the_argument_and_value(args, needle, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(args)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_a_missing_weights_file_names_the_command_that_makes_it():
    with pytest.raises(SpecrefError, match=r"no weights 'target_v9'.*python -m toy_models.train"):
        load("target_v9")


def test_a_tiny_run_writes_consistent_json(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert bench.main(["--target", "small", "--ks", "1,3", "--tokens", "12", "--temperatures", "1,greedy",
                       "--repeats", "2", "--batch", "2", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert len(report["cells"]) == 2 * 2  # drafts x temperatures x lengths
    for c in report["cells"]:
        assert [r["k"] for r in c["runs"]] == [1, 3] and c["k_rule"] in (1, 3)
        for r in c["runs"]:
            lo, hi = r["speedup_range"]
            assert lo <= r["speedup_measured"] <= hi and 0 <= r["alpha"] <= 1
            assert 1 <= r["tokens_per_iteration"] <= r["k"] + 1
            assert r["latency_p50_seconds"] <= r["latency_p99_seconds"]
        best = max(c["runs"], key=lambda r: r["speedup_measured"])
        assert c["best_k"] == best["k"]
    greedy = [r for c in report["cells"] if c["temperature"] == "greedy" and c["draft"] == "transformer-small"
              for r in c["runs"]]
    assert all(statistics.median(r["alpha_per_position"]) > 0.5 for r in greedy)
    (batch,) = report["batches"]
    assert batch["batch"] == 2 and 0 <= batch["padding_fraction"] < 1
    assert "python -m specref.bench --target small" in report["command"]


RESULTS = ROOT / "docs" / "results" / "performance.md"  # the tables the README links to

@pytest.mark.parametrize("run", RUNS)
def test_the_results_page_tables_are_the_committed_json(run):
    report = json.loads((OUT / run).read_text())
    page = RESULTS.read_text()
    assert tables(report) in page, f"{RESULTS.name}'s table for {run} differs: run python benchmarks/bench_tables.py"


def test_the_results_page_reproduction_line_is_the_committed_json():
    reports = [json.loads((OUT / r).read_text()) for r in REPEATS]
    assert reproduction(reports, json.loads((OUT / RUNS[0]).read_text())) in RESULTS.read_text()


def test_the_results_page_check_can_fail():
    report = json.loads((OUT / RUNS[0]).read_text())
    report["cells"][0]["best_speedup"] += 0.01
    assert tables(report) not in RESULTS.read_text()
