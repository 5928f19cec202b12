"""The tables of Hugging Face ``generate``'s paths are what the committed record says.

``benchmarks/hf_paths.py`` runs every path at a stated N; ``--table`` prints the table that
``docs/results/hf-paths.md`` holds, and ``--readme-table`` the shorter one that the Hugging Face
guide (``docs/guide/huggingface.md``, where the README's table moved) holds.  These tests need
neither torch nor transformers: they read the committed JSON.
"""

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from hf_paths import main, readme_table, table  # noqa: E402

RECORD = ROOT / "benchmarks" / "out" / "hf_paths.json"
PAGE = ROOT / "docs" / "results" / "hf-paths.md"
GUIDE = ROOT / "docs" / "guide" / "huggingface.md"  # the summary table the README once held
TABLES = [(table, PAGE, "--table"), (readme_table, GUIDE, "--readme-table")]


@pytest.mark.parametrize("make, page, flag", TABLES)
def test_the_page_and_the_guide_hold_the_committed_table(make, page, flag):
    assert make(json.loads(RECORD.read_text())) in page.read_text(), \
        f"run: python benchmarks/hf_paths.py {flag} {RECORD.relative_to(ROOT)}"


@pytest.mark.parametrize("make, page, flag", TABLES)
def test_the_table_check_can_fail(make, page, flag):
    record = json.loads(RECORD.read_text())
    changed = copy.deepcopy(record)
    changed["paths"][0]["p_value"] = 0.5 if record["paths"][0]["p_value"] != 0.5 else 0.25
    assert make(changed) not in page.read_text()


def test_the_summary_table_has_one_row_per_path_of_the_record():
    record = json.loads(RECORD.read_text())
    rows = [line for line in readme_table(record).splitlines()[2:]]
    assert len(rows) == len(record["paths"]) >= 13


def test_the_record_has_every_path_once_with_its_numbers():
    record = json.loads(RECORD.read_text())
    names = [row["path"] for row in record["paths"]]
    assert len(names) == len(set(names))
    for needed in ("prompt lookup", "early exit", "different tokenizers, sampling", "different tokenizers, greedy",
                   "ensemble weight 0.5", "ensemble weight 0.8", "MTP, sampling", "DFlash, sampling",
                   "Gemma4, sampling"):
        assert needed in names, needed
    for row in record["paths"]:
        for field in ("n", "p_value", "tv_interval", "seconds", "peak_rss_mb", "planned_n", "efficiency"):
            assert row[field] is not None, (row["path"], field)
        assert row["n"] >= row["planned_n"], (row["path"], "a verdict below its planned N")
    assert {"transformers", "torch", "python"} <= set(record["versions"])
    ensemble = [row for row in record["paths"] if row["path"].startswith("ensemble")]
    assert all("exact_tv" in row and row["status"] == "differs" for row in ensemble)


@pytest.mark.parametrize("argv, named", [
    (["--samples", "1"], "--samples must be >= 2, got 1"),
    (["--efficiency-samples", "0"], "--efficiency-samples must be >= 2, got 0"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
    (["--paths", "MTP"], "--paths: unknown ['MTP']"),
])
def test_the_script_names_a_bad_argument_and_its_value(capsys, argv, named):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err
