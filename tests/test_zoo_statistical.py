"""Statistical mode catches the zoo at the N its planner asks for.

For every probability-level zoo entry: its exact TV on one case (V = 2, K = 2, 8
outcomes), then the oracle in statistical mode with N planned to detect TV >= 0.05
with power 0.9 at alpha = 1e-6 (``specref.verification.statistics.counts.samples_needed``; about 6,000
samples here).  Every wrong or approximate entry whose exact TV is >= 0.05 must be
flagged, and the two correct ones must pass: a false alarm has probability 1e-6
per case, a miss at most 0.1 by the plan, and the seeds are fixed.  The claim at
TV >= 0.01 (about 130,000 samples per entry) is measured by
``benchmarks/zoo_statistical.py``; its numbers are in the README.
"""

import sys
from pathlib import Path

import pytest

from specref.verification.zoo import chain as zoo
from specref.verification.oracle import check_step

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from zoo_statistical import STEP_CASE  # noqa: E402  the one case the benchmark uses too

DETECT = 0.05


@pytest.mark.parametrize("entry", zoo.entries(level="step"), ids=lambda e: e.name)
def test_statistical_mode_flags_every_entry_above_the_planned_tv(entry):
    report = check_step(entry.fn, mode="statistical", cases=[STEP_CASE], detect_tv=DETECT, seed=7)
    result = report.results[0]
    if entry.kind == "correct":
        assert report.ok, str(report)
        return
    exact_tv = float(check_step(entry.fn, cases=[STEP_CASE]).worst_tv)
    if exact_tv >= DETECT:
        assert not report.ok and result.p_value <= 1e-6, (entry.name, exact_tv, str(report))
    assert result.n_samples > 1000  # planned, not a token N
