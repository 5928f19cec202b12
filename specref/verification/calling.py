"""Calling an implementation under test: every misbehaviour becomes a :class:`Misbehaved`.

The oracle never raises on an implementation's behalf: an exception, a time-out,
arithmetic on a lazy uniform or an output that is not a block of tokens is turned
into a status (:mod:`specref.verification.report`) with the case that caused it.
"""

from __future__ import annotations

import signal
import threading

import numpy as np

from specref.verification.laws import LazyUniformError
from specref.verification.report import ARITHMETIC, INVALID, RAISED, TIMEOUT

__all__ = ["Misbehaved", "call", "checked_tokens"]


class Misbehaved(Exception):
    """An implementation misbehaved: ``status`` (a report status) and ``detail``."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status, self.detail = status, detail


class _TimedOut(BaseException):  # BaseException: an implementation's `except Exception` cannot eat it
    pass


def call(fn, args, kwargs, time_limit):
    """Run the implementation once, turning every misbehaviour into ``Misbehaved``."""
    try:
        return _with_time_limit(fn, args, kwargs, time_limit)
    except _TimedOut:
        raise Misbehaved(TIMEOUT, f"no result within {time_limit} s") from None
    except LazyUniformError as e:
        raise Misbehaved(ARITHMETIC, str(e)) from None
    except Exception as e:  # the implementation's own failure, reported with the case
        raise Misbehaved(RAISED, f"{type(e).__name__}: {e}") from None


def _with_time_limit(fn, args, kwargs, seconds):
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            raise _TimedOut()

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box = {}  # off the main thread: a daemon thread that is abandoned if it hangs

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller below
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimedOut()
    if "error" in box:
        raise box["error"]
    return box["value"]


def checked_tokens(out, V, *, min_len, max_len, what):
    """Validate an implementation's returned tokens: ints in range, length in bounds."""
    try:
        seq = list(out.tolist() if hasattr(out, "tolist") else out)
    except TypeError:
        raise Misbehaved(INVALID, f"{what} returned {out!r}, not a sequence of tokens") from None
    if not min_len <= len(seq) <= max_len:
        raise Misbehaved(INVALID, f"{what} returned {len(seq)} tokens {seq}; expected {min_len} to {max_len}")
    for t in seq:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < V:
            raise Misbehaved(INVALID, f"{what} returned token {t!r} outside the vocabulary 0..{V - 1}: {seq}")
    return [int(t) for t in seq]

