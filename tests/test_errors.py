"""specref.core.errors.row_tolerance: one formula, two documented parameter sets, each recomputed.

The second route takes eps as ``np.spacing(dtype(1))`` (the gap above 1, not
``finfo``) and the square root as ``V ** 0.5``; they agree with the function to
1e-12 relative.
"""

import numpy as np
import pytest

from specref.core.errors import FLOAT_ROW_TOL, LowPrecisionRows, check_prob_rows, row_tolerance
from specref.decoding import batched

VS = [1, 2, 10, 1000, 32_000, 50_000, 10**6, 10**8, 2 * 10**8, 10**12]


def _independent(dtype, V, *, cap, scale_float64):
    eps = float(np.spacing(dtype(1)))
    if np.dtype(dtype).itemsize >= 8 and not scale_float64:
        return FLOAT_ROW_TOL
    tol = max(1e-9, 8 * eps * V ** 0.5)
    return tol if cap is None else min(tol, cap)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("V", VS)
def test_row_tolerance_matches_its_formula(dtype, V):
    assert row_tolerance(dtype, V) == pytest.approx(_independent(dtype, V, cap=1e-2, scale_float64=False), rel=1e-12)
    assert row_tolerance(dtype, V, cap=None, scale_float64=True) == pytest.approx(
        _independent(dtype, V, cap=None, scale_float64=True), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.uint8])
@pytest.mark.parametrize("V", VS)
def test_batched_row_tolerance_is_the_core_one_with_its_parameters(dtype, V):
    assert batched.row_tolerance(dtype, V) == row_tolerance(dtype, V, cap=None, scale_float64=True)


def test_the_two_parameter_sets_part_only_where_documented():
    """Capped and flat-float64 (check_prob_rows) vs uncapped and scaled (the batched level)."""
    for V in VS:
        core, level = row_tolerance(np.float32, V), batched.row_tolerance(np.float32, V)
        assert (core == level) == (V <= 10**8)  # float32: the cap 1e-2 binds above V = 1.1e8
        core, level = row_tolerance(np.float64, V), batched.row_tolerance(np.float64, V)
        assert (core == level == FLOAT_ROW_TOL) == (V <= 3 * 10**11)  # float64: eps growth passes 1e-9 at V = 3.2e11
    assert row_tolerance(np.float32, 2 * 10**8) == 1e-2 < batched.row_tolerance(np.float32, 2 * 10**8)
    assert batched.row_tolerance(np.float64, 10**12) == pytest.approx(8e6 * np.finfo(np.float64).eps)
    assert row_tolerance(np.int64, 10**12) == row_tolerance(np.int64, 10**12, cap=None, scale_float64=True) == 1e-9


def test_check_prob_rows_accepts_exactly_within_the_default_tolerance():
    V = 1000
    tol = row_tolerance(np.float32, V)
    row = np.full((1, V), 1 / V)
    inside, outside = row.copy(), row.copy()
    inside[0, 0] += 0.5 * tol
    outside[0, 0] += 2 * tol
    with pytest.warns(LowPrecisionRows):
        got = check_prob_rows("p", inside.astype(np.float32))
    assert got.dtype == np.float64 and abs(got.sum() - 1) < 1e-12
    with pytest.raises(ValueError, match="tolerance"):
        check_prob_rows("p", outside.astype(np.float32))


def test_the_docstring_example_of_row_tolerance_is_what_it_computes():
    import re

    from specref.core import errors

    shown = re.search(r"V = 50,000: ([0-9.e-]+);", errors.row_tolerance.__doc__).group(1)
    assert float(shown) == pytest.approx(errors.row_tolerance(np.float32, 50_000), rel=0.05)
