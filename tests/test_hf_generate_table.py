"""The README's planned-N table for Hugging Face ``generate`` is what the committed record says.

``benchmarks/hf_generate.py`` runs one case per process at planned N (minutes each);
``--merge`` joins the records and ``--table`` prints the README's table.  These tests
need neither torch nor transformers: they read the committed JSON.
"""

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from hf_generate import merge, planned_table  # noqa: E402

RECORD = ROOT / "benchmarks" / "out" / "hf_generate_planned.json"


PAGE = ROOT / "docs" / "guide" / "huggingface.md"  # the guide that holds the planned-N table


def test_the_guide_holds_the_committed_planned_table():
    table = planned_table(json.loads(RECORD.read_text()))
    assert table in PAGE.read_text(), "run: python benchmarks/hf_generate.py --table " + str(RECORD)


def test_the_guide_check_can_fail():
    record = json.loads(RECORD.read_text())
    record["cases"][0]["assisted"]["p_value"] = 0.5 if record["cases"][0]["assisted"]["p_value"] != 0.5 else 0.25
    assert planned_table(record) not in PAGE.read_text()


def _run(case, **parts):
    return {"versions": {"transformers": "x"}, "settings": {"alpha": 1e-6}, "assistant_processors": [],
            "cases": [{"case": case, "k": 2, **parts}]}


def test_merge_joins_parts_of_a_case_measured_in_separate_runs():
    a = _run("c1", assisted={"n": 1})
    b = _run("c1", plain={"n": 2})
    c = _run("c2", assisted={"n": 3})
    m = merge([a, b, c])
    assert [row["case"] for row in m["cases"]] == ["c1", "c2"]
    assert m["cases"][0] == {"case": "c1", "k": 2, "assisted": {"n": 1}, "plain": {"n": 2}}
    assert m["versions"] == a["versions"]


@pytest.mark.parametrize("bad, needle", [
    ([_run("c1", assisted={"n": 1}), _run("c1", assisted={"n": 2})], "'assisted' from two runs"),
    ([_run("c1"), {**_run("c1"), "versions": {"transformers": "y"}}], "versions differ"),
    ([_run("c1"), _run("c1", k=3)], "differs in 'k'"),
    ([], "records is empty"),
])
def test_merge_refuses_conflicting_runs(bad, needle):
    with pytest.raises(ValueError, match=needle):
        merge(copy.deepcopy(bad))


@pytest.mark.parametrize("args, needle", [
    (["--decodes", "0"], "--decodes must be >= 1, got 0"),
    (["--workers", "-1"], "--workers must be >= 1, got -1"),
])
def test_the_calls_script_names_a_bad_argument_and_its_value(args, needle, capsys):
    from hf_generate_calls import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and needle in capsys.readouterr().err
