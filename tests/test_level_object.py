"""A level is one object: a level written outside specref, registered through the public
``register``, is checked (exact and statistical), planned and swept like specref's own.

The level here is made up for the test: "sample one token from a probability row",
``sample_fn(p [V], rng) -> token``.  Its law is the row itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np
import pytest

from specref.core.draws import coerce_rng
from specref.core.errors import SpecrefError
from specref.core.step import draw
from specref.verification.campaigns.planning import plan
from specref.verification.campaigns.sweep import run_sweep
from specref.verification.levels import LEVELS, register
from specref.verification.levels.runner import exact_verdict, program_plan, run_cases, sampled_verdict
from specref.verification.oracle import check
from specref.verification.running.calling import call, checked_tokens
from specref.verification.running.level import Level, Option, fixed_reference


@dataclass(frozen=True)
class RowCase:
    name: str
    row: tuple  # Fractions summing to 1


def row_cases(width: int = 3) -> list[RowCase]:
    """Two rows over ``width`` tokens: a peaked one and a flat one."""
    peaked = (Fraction(1, 2),) + (Fraction(1, 2 * (width - 1)),) * (width - 1)
    return [RowCase(f"peaked-{width}", peaked), RowCase(f"flat-{width}", (Fraction(1, width),) * width)]


def _validate(level, case, settings) -> None:
    if not isinstance(case, RowCase) or sum(case.row) != 1:
        raise SpecrefError(f"cases of the {level.name} level must be RowCase objects summing to 1, got {case!r:.80}")


def _law(case) -> dict:
    return {(t,): w for t, w in enumerate(case.row) if w > 0}


def _program(fn, row, time_limit):
    """One call on its own copy of the row, its output checked: ``program(rng, impl_rng) -> (token,)``."""
    V = len(row)

    def program(rng, impl_rng):
        return tuple(call(fn, (row.copy(), impl_rng), {}, time_limit,
                          convert=lambda out: checked_tokens([out], V, min_len=1, max_len=1, what="sample_fn")))

    return program


def _floats(case) -> np.ndarray:
    return np.array([float(w) for w in case.row])


def _run(level, fn, cases, settings):
    def exact(case):
        program = _program(fn, np.array(case.row, dtype=object), settings.time_limit)
        return partial(exact_verdict, case, lambda rng: program(rng, rng), _law(case), settings)

    def statistical(case, seed):
        return partial(sampled_verdict, case, partial(_program, fn, _floats(case), settings.time_limit), _law(case),
                       settings, seed)

    return run_cases(level, cases, settings, validate=lambda case: _validate(level, case, settings), exact=exact,
                     statistical=statistical, fn=fn)


def _plan(level, fn, case, settings, seed):
    return program_plan(_law(case), partial(_program, fn, _floats(case), settings.time_limit), settings, seed)


def sample_row(p, rng):
    """The implementation under test: one draw from the row."""
    return draw(coerce_rng(rng), p)


def always_first(p, rng):
    """A wrong one: always token 0."""
    return 0


WIDTH = Option("width", "the default cases' vocabulary size", default=3, cases=row_cases)
ROW_LEVEL = Level("third_party_row", "sample_fn(p [V], rng) -> token", row_cases, _run, validate=_validate,
                  reference=fixed_reference(sample_row), planner=_plan, options=(WIDTH,))


@pytest.fixture
def registered():
    level = register(ROW_LEVEL)
    yield level
    del LEVELS[level.name]


def test_an_outside_level_is_checked_exactly_by_name(registered):
    good = check("third_party_row", sample_row)
    assert good.ok and all(r.tv == 0 for r in good.results), str(good)
    bad = check("third_party_row", always_first)
    assert [r.status for r in bad.results] == ["differs", "differs"], str(bad)


def test_an_outside_level_is_checked_statistically_and_takes_its_own_option(registered):
    good = check("third_party_row", sample_row, mode="statistical", samples=3000, isolate=False, width=4)
    assert good.ok and [r.case.name for r in good.results] == ["peaked-4", "flat-4"], str(good)
    assert all(r.n_samples == 3000 for r in good.results)
    bad = check("third_party_row", always_first, mode="statistical", samples=3000, isolate=False)
    assert not bad.ok and all(r.status == "differs" for r in bad.results), str(bad)


def test_an_outside_level_is_planned_in_both_modes(registered):
    stat = plan("third_party_row", sample_row, mode="statistical", samples=500, isolate=False, quiet=True, calls=2)
    assert [r.n for r in stat] == [500, 500] and all(r.calls == 500 and r.eta_s > 0 for r in stat), stat
    exact = plan("third_party_row", sample_row, mode="exact", isolate=False, quiet=True, calls=1)
    assert [r.n for r in exact] == [3, 3] and all(r.eta_s > 0 for r in exact), exact  # the reference's calls


def test_an_outside_level_is_swept(registered, tmp_path):
    spec = {"impl": "tests.test_level_object:always_first", "level": "third_party_row",
            "settings": {"mode": "exact"}, "grid": {"case": ["*"], "seed": [0, 1]}}
    record = run_sweep(spec, out=tmp_path / "sweep.json", progress=False, isolate=False)
    statuses = [c["result"]["status"] for c in record["cells"].values()]
    assert statuses == ["differs"] * 4 and json.loads((tmp_path / "sweep.json").read_text())["cells"]


def test_an_unregistered_level_object_is_checked_too():
    assert check(ROW_LEVEL, sample_row).ok and not check(ROW_LEVEL, always_first).ok


def test_register_names_the_missing_part_and_refuses_a_second_level_of_a_name(registered):
    from dataclasses import replace

    with pytest.raises(SpecrefError, match=r"missing or malformed part\(s\): cases \(a callable"):
        register(replace(ROW_LEVEL, name="no-cases", cases=None))
    with pytest.raises(SpecrefError, match=r"part\(s\): run \(a callable"):
        register(replace(ROW_LEVEL, name="no-run", run="run"))
    with pytest.raises(SpecrefError, match="level 'third_party_row' is registered already"):
        register(ROW_LEVEL)
    assert "no-cases" not in LEVELS and "no-run" not in LEVELS


def test_an_unknown_level_lists_the_registered_names_and_an_unknown_keyword_lists_fields_and_options(registered):
    with pytest.raises(SpecrefError, match="'step', 'logits'.*'third_party_row'.*got 'nope'"):
        check("nope", sample_row)
    with pytest.raises(SpecrefError, match=r"unknown keyword\(s\) \['wdth'\].*Settings fields \[.*'mode'.*"
                                           r"its own options \['width'\]"):
        check("third_party_row", sample_row, wdth=4)
