"""Crash statuses carry the innermost frame (file:line in function) and the exception text."""

from specref.verification.running.calling import describe
from specref.verification.running.frames import innermost_frame
from specref.verification.oracle import check_step, default_cases
from specref.verification.running.report import RAISED


def _deep(n):
    if n == 0:
        raise RuntimeError()  # no message: the frame is then the only clue
    return _deep(n - 1)


def crashes(p_target, q_draft, draft_tokens, rng):
    return _deep(2)


def test_a_crash_names_the_innermost_frame_and_says_when_there_is_no_message():
    report = check_step(crashes, cases=default_cases("step")[:1])
    r = report.results[0]
    assert r.status == RAISED
    assert r.detail.startswith("RuntimeError: (no message) (at ") and "test_frames.py:" in r.detail
    assert r.detail.endswith(" in _deep)")
    line = _deep.__code__.co_firstlineno + 2  # the raise
    assert f"test_frames.py:{line} in _deep" in r.detail


def test_an_exception_never_raised_has_no_frame():
    assert innermost_frame(ValueError("x")) == ""
    assert describe(ValueError("x")) == "ValueError: x"
    try:
        raise KeyError("k")
    except KeyError as e:
        assert describe(e).startswith("KeyError: 'k' (at ") and "test_frames.py:" in describe(e)
