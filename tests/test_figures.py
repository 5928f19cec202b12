"""``python -m figures``: every promised file is written, the key numbers are right,
and the output is deterministic.

The numbers are checked against independent computations written out here (the
formula of SPEC §8, the fractions of SPEC §3), not against specref.core.cost / specref.core.step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("matplotlib")

from figures import fig4_measured, fig6_verify, fig7_methods  # noqa: E402
from figures.__main__ import FIGURES
from figures.__main__ import main as figures_main  # noqa: E402
from figures.__main__ import resolve

PROMISED = sorted(f"{name}.{ext}" for name in FIGURES for ext in ("png", "json"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``python -m figures --out OUT`` in a fresh process, run from a temporary directory."""
    cwd = tmp_path_factory.mktemp("cwd")
    out = cwd / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "figures", "--out", str(out)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def _json(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text(encoding="utf-8"))


def test_every_promised_file_exists_and_is_not_empty(run):
    out, stdout = run
    assert sorted(p.name for p in out.iterdir()) == PROMISED
    for name in PROMISED:
        assert (out / name).stat().st_size > 0, name
        assert str(out / name) in stdout.splitlines()  # each file written is printed
    for name in FIGURES:
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        data = _json(out, name)
        assert data["figure"] == name and len(data["caption"]) > 80


def _speed_ratio(alpha, k, c):  # SPEC §8, written out independently of specref.core.cost
    return sum(alpha**i for i in range(k + 1)) / (1 + k * c)


def test_figure1_worked_example(run):
    out, _ = run
    data = _json(out, "fig1_speed_ratio")
    got = {(pt["alpha"], pt["k"], pt["c"]): pt["speed_ratio"] for pt in data["worked_example"]}
    assert round(got[(0.8, 4, 0.1)], 3) == round((1 - 0.8**5) / (0.2 * 1.4), 3) == 2.401
    assert round(got[(0.2, 4, 0.1)], 3) == round((1 - 0.2**5) / (0.8 * 1.4), 3) == 0.893
    # the curves themselves, at the same points
    panel = next(p for p in data["panels"] if p["c"] == 0.1)
    k4 = next(c for c in panel["curves"] if c["k"] == 4)["speed_ratio"]
    for alpha in (0.2, 0.8):
        i = data["alpha"].index(alpha)
        assert k4[i] == pytest.approx(_speed_ratio(alpha, 4, 0.1), abs=1e-9)
    assert data["k_values"] == list(range(1, 9))
    assert sorted(p["c"] for p in data["panels"]) == [0.0, 0.05, 0.1, 0.2]


def test_figure2_best_k_at_the_spec_point(run):
    out, _ = run
    marked = _json(out, "fig2_draft_length")["marked"]
    assert (marked["k"], round(marked["speed_ratio"], 3)) == (6, 2.470)  # SPEC §10
    brute = max(range(1, 60), key=lambda k: _speed_ratio(0.8, k, 0.1))
    assert brute == 6


def test_figure3_worked_example_fractions(run):
    out, _ = run
    ex = _json(out, "fig3_mass_balance")["exact"]
    assert ex["wrong_output_resample_from_p"] == ["7/25", "1/2", "11/50"]
    assert ex["correct_output"] == ex["enumerated_output"] == ex["p"] == ["1/5", "1/2", "3/10"]
    assert ex["accepted_mass"] == ["1/5", "3/10", "1/10"]
    assert ex["residual"] == ["0", "1/2", "1/2"]


def test_figure5_reference_converges_and_bugs_do_not(run):
    out, _ = run
    data = _json(out, "fig5_monte_carlo")
    assert data["n"][0] == 10 and data["n"][-1] == 10**6
    ref, *bugs = data["curves"]
    assert ref["kind"] == "correct" and len(bugs) == 2
    assert ref["tv_max"][-1] < data["band"]["upper"][-1]  # every reference stream inside the 99% band
    for bug in bugs:
        assert bug["tv_min"][-1] > data["band"]["upper"][-1]
        assert bug["tv_median"][-1] == pytest.approx(bug["exact_tv"], abs=5 * data["band"]["upper"][-1])


def test_output_is_deterministic(run, tmp_path):
    out, _ = run
    figures_main(["--out", str(tmp_path)])
    for name in PROMISED:
        if name.endswith(".json"):
            assert (tmp_path / name).read_text() == (out / name).read_text(), name
        else:  # the Agg PNG writer without date/software metadata gives identical bytes
            assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_only_selects_figures(tmp_path, capsys):
    assert resolve("3") == resolve("fig3") == resolve("mass_balance") == "fig3_mass_balance"
    figures_main(["--out", str(tmp_path), "--only", "fig3", "--only", "2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fig2_draft_length.json", "fig2_draft_length.png", "fig3_mass_balance.json", "fig3_mass_balance.png"]
    assert len(capsys.readouterr().out.splitlines()) == 4
    with pytest.raises(SystemExit):
        resolve("fig9")


def test_missing_data_gives_a_placeholder(tmp_path):
    fig4_measured.main(tmp_path, bench_path=tmp_path / "no-bench.json")
    fig6_verify.main(tmp_path, verify_path=tmp_path / "no-verify.json")
    assert _json(tmp_path, "fig4_measured")["status"] == "no benchmark data"
    assert _json(tmp_path, "fig6_verify")["status"] == "no verification data"
    assert "python -m specref.bench --json" in _json(tmp_path, "fig4_measured")["caption"]


def test_figure4_reads_benchmark_json(tmp_path):
    bench = {"machine": "test", "command": "python -m specref.bench --json x", "pairs": [
        {"name": "toy", "alpha_per_position": [0.9, 0.85, 0.8], "alpha": 0.8, "c": 0.1,
         "runs": [{"k": 2, "speedup_measured": 1.5}, {"k": 4, "speedup_measured": 1.9, "speedup_model": 9.9}]}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    written = fig4_measured.main(tmp_path / "out", bench_path=path)
    assert all(p.stat().st_size > 0 for p in written)
    data = _json(tmp_path / "out", "fig4_measured")
    (pair,) = data["pairs"]
    assert data["status"] == "ok" and pair["model_k"] == [1, 2, 3, 4]
    # the model comes from the measured alpha and c, not from the file's "speedup_model"
    assert pair["speedup_model"][3] == pytest.approx(_speed_ratio(0.8, 4, 0.1), abs=1e-9)
    del bench["pairs"][0]["c"]
    path.write_text(json.dumps(bench))
    with pytest.raises(ValueError, match="'c'"):
        fig4_measured.main(tmp_path / "out", bench_path=path)


def test_figure6_reads_verify_json(tmp_path):
    report = {"scenarios": [
        {"name": "bug", "kind": "control", "tv": "2/25", "status": "detected", "n_outputs": 3},
        {"name": "reference", "kind": "correct", "tv": 0, "status": "ok", "n_outputs": 3},
        {"name": "float", "kind": "correct", "tv": 2e-16, "tv_exact": None, "status": "ok"},
        {"name": "lenience", "kind": "approximate", "tv": 0.25, "tv_exact": "1/4", "status": "approximate"},
        {"name": "crashed", "kind": "control", "tv": None, "status": "MISSED", "n_outputs": None}]}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(report))
    fig6_verify.main(tmp_path / "out", verify_path=path)
    data = _json(tmp_path / "out", "fig6_verify")
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert list(by_name) == ["reference", "float", "bug", "crashed", "lenience"]  # correct, control, approximate
    assert by_name["reference"]["tv_is_exact_zero"] and not by_name["float"]["tv_is_exact_zero"]
    assert (by_name["bug"]["tv"], by_name["bug"]["tv_exact"]) == (0.08, "2/25")
    assert by_name["crashed"]["tv"] is None
    report["scenarios"][0]["kind"] = "maybe"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match="kind"):
        fig6_verify.main(tmp_path / "out", verify_path=path)


def test_matplotlib_is_imported_by_the_figure_scripts_only():
    code = (
        "import sys, pkgutil, importlib, specref, figures\n"
        "for pkg in (specref, figures):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        if m.name != '__main__':\n"
        "            importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at module level'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)


def test_figure7_plots_the_records_and_says_when_one_is_missing(tmp_path):
    """Every point of figure 7 is 1 / calls_per_token of its record's row (the records' other field, a
    second route), and a missing record is a placeholder naming the command that makes it."""
    fig7_methods.main(tmp_path)
    data = _json(tmp_path, "fig7_methods")
    heads = json.loads(fig7_methods.HEADS.read_text())
    retrieval = json.loads(fig7_methods.RETRIEVAL.read_text())
    ks, tokens = data["heads"]["blockwise"]
    want = {r["k"]: 1 / r["blockwise_calls_per_token"] for r in heads["greedy"]}
    assert ks and all(abs(t - want[k]) < 1e-9 for k, t in zip(ks, tokens))
    sizes, tokens = data["retrieval"]["rest_pointmass"]
    length = data["retrieval"]["rest_length"]
    want = {r["num_draft"]: 1 / r["calls_per_token_float"] for r in retrieval["exact"]["rest"]
            if r["verify"] == "pointmass" and r["length"] == length}
    assert sizes and all(abs(t - want[n]) < 1e-9 for n, t in zip(sizes, tokens))
    fig7_methods.main(tmp_path / "missing", heads_path=tmp_path / "none.json")
    missing = _json(tmp_path / "missing", "fig7_methods")
    assert missing["heads"] is None and missing["retrieval"] is not None
    assert missing["hints"]["heads"] == "run python benchmarks/methods_heads.py"
