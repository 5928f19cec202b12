"""Calling an implementation under test: every misbehaviour becomes a status.

The oracle never raises on an implementation's behalf.  An exception of any kind
(``SystemExit``, ``KeyboardInterrupt`` and other ``BaseException``\\ s included, and an
exception whose ``str()`` itself raises), a time-out, arithmetic on a lazy uniform,
an output that is not a block of tokens, or a conversion of the output that raises
or never ends is turned into a :class:`Misbehaved` (a status of
:mod:`specref.verification.running.report` and a detail), reported with the case that caused it.

Two ways to run a case (:func:`run_case`):

- **isolated** (``Settings(isolate=True)``; the default of the CLI and of the API in both modes,
  ``Settings.isolate``): the whole case -- the enumeration of every path in exact
  mode, or the N samples in statistical mode -- runs in a worker process forked for that case.  The parent watches a hard
  deadline: each call must end within ``time_limit`` and the case within
  ``case_time_limit``, or the worker is killed (SIGKILL).  An implementation that
  exits (``sys.exit``, ``os._exit``), crashes (a segfault), ignores or resets
  signals, catches ``BaseException`` in a retry loop, or hangs inside C code cannot
  stop or fool the oracle: the case gets the status ``timeout`` or ``crashed``.
  The worker sends back only the case's verdict.  Needs the ``fork`` start method
  (Linux, macOS); without it cases run in-process.
- **in-process** (``Settings(isolate=False)``; an implementation that declares
  ``specref_isolate = False``, or a process that has started CUDA): the same conversions, with a
  SIGALRM time limit on the main thread.  It cannot stop an implementation that blocks signals,
  catches the time-out in a retry loop, or hangs in C code (a call that caught the time-out and
  returned later is still ``timeout``), and ``os._exit``, a segfault or an abort end the whole
  process.

The per-call limit is ``time_limit`` seconds, or with ``time_limit=None`` (the default) derived from
the calls measured in the case in progress (:func:`derived_time_limit`, SPEC §13.2).

Isolation costs one ``fork`` per case, not per call: about 4-10 ms for the fork and the
pipe, and 5-20 ms per case in all (pages copied on write), against cases of 10 ms to
minutes.  A case that writes into the oracle's tables in a worker changes nothing here.

All conversion of a return value (``.cpu()``, ``__array__``, ``tolist()``, iteration, the
checks of :func:`checked_tokens` and the levels' parsers) happens inside the time limit,
through :func:`call`'s ``convert``, and a ``SystemExit`` (or any other exception) that the
output's own methods raise there is ``invalid output`` (:func:`foreign`).  Inputs handed
read-only (``call(read_only=True)``) turn NumPy's "read-only" error into the status
``writes into its inputs``.

:func:`load_implementation` imports ``module:function`` for the CLI and sweeps, first in a
forked worker, so that a module that exits (``sys.exit``, ``os._exit``) or hangs at import
is a usage error, not the end of the oracle.
"""

from __future__ import annotations

import faulthandler
import importlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from functools import partial
from itertools import islice

import numpy as np

from specref.core.errors import SpecrefError, SpecrefTypeError
from specref.verification.running.frames import innermost_frame
from specref.verification.laws.enumeration import LazyUniformError
from specref.verification.running.report import (
    ARITHMETIC,
    BUDGET,
    CRASHED,
    INTERNAL,
    INVALID,
    OK,
    RAISED,
    RNG_MISUSE,
    TIMEOUT,
    WRITES,
    CaseResult,
)

__all__ = ["Misbehaved", "call", "checked_tokens", "foreign", "run_case", "guarded", "can_isolate", "cuda_started",
           "describe", "short_repr",
           "load_implementation", "DETAIL_LIMIT", "IMPORT_TIME_LIMIT", "derived_time_limit", "FIRST_CALL_LIMIT",
           "CALL_FLOOR", "CALL_MARGIN"]

DETAIL_LIMIT = 1_000_000  # characters kept of one misbehaviour's detail (a report's table shows less)
IMPORT_TIME_LIMIT = 300.0  # seconds an implementation's module may take to import (load_implementation)

# The per-call limit under time_limit=None (SPEC §13.2), from the calls measured in the case in progress:
FIRST_CALL_LIMIT = 45.0  # a case's calls until one returned: warm-up (imports, compilation) on a loaded machine;
#                          a never-returning implementation is answered in this plus the set-up, under 60 s
CALL_FLOOR = 10.0  # later calls: at least this (a fast implementation's hang is answered in 10 s) ...
CALL_MARGIN = 4.0  # ... and this many times the slowest call returned before them (load moves call times ~3x)


class Misbehaved(Exception):
    """An implementation misbehaved: ``status`` (a report status) and ``detail``."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status, self.detail = status, _cut(detail, DETAIL_LIMIT)


class _TimedOut(BaseException):  # BaseException: an implementation's `except Exception` cannot eat it
    pass


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 40] + f"... [{len(text) - limit + 40} characters cut]"


def describe(e: BaseException) -> str:
    """``Type: message`` for any exception, even one whose ``__str__`` raises."""
    try:
        name = type(e).__name__
    except BaseException:  # noqa: BLE001 - nothing about a hostile exception is trusted
        name = "exception"
    try:
        text = str(e)
    except BaseException as inner:  # noqa: BLE001
        text = f"<str() of the exception raised {type(inner).__name__}>"
    if not isinstance(text, str):
        text = "<str() of the exception did not return a string>"
    where = innermost_frame(e)  # the innermost frame: file:line in function
    text = (text or "(no message)") + (f" (at {where})" if where else "")
    return _cut(f"{name}: {text}", DETAIL_LIMIT)


# ---------------------------------------------------------------- one call

# In an isolated worker: a shared double holding the monotonic time by which the call in
# progress must end (0.0: no call in progress).  The parent reads it and kills the worker.
_shared_deadline = None
# The monotonic time by which the case in progress must end (in-process budget).
_case_end = [math.inf]


# The slowest call of the implementation that returned in the case (or shard) in progress here: None until one has.
_slowest: list[float | None] = [None]


def derived_time_limit(slowest: float | None) -> float:
    """The per-call limit of SPEC §13.2 under ``time_limit=None``: :data:`FIRST_CALL_LIMIT` until a call
    of the case has returned (``slowest`` None), then :data:`CALL_MARGIN` x the slowest returned call,
    at least :data:`CALL_FLOOR`."""
    if slowest is None:
        return FIRST_CALL_LIMIT
    return max(CALL_FLOOR, CALL_MARGIN * slowest)


def _limit_text(time_limit, seconds) -> str:
    """How a per-call limit of ``seconds`` came about, for a time-out's detail."""
    if time_limit is not None:
        return f"time_limit = {time_limit} s"
    return (f"{seconds:.3g} s, the time_limit derived from the calls measured (time_limit=None: a case's first "
            f"call {FIRST_CALL_LIMIT:g} s, later calls {CALL_MARGIN:g} x the slowest before them, at least "
            f"{CALL_FLOOR:g} s; SPEC 13.2)")


def case_time_left() -> float:
    """Seconds left of the case in progress here (inf outside a case)."""
    return _case_end[0] - time.monotonic()


@contextmanager
def case_budget(seconds: float):
    """Within the block, the case in progress has ``seconds`` left: a shard that runs in
    another process carries its case's budget with it (time is measured where it runs).  The
    block's calls are measured afresh for the derived per-call limit (:func:`derived_time_limit`)."""
    previous, slowest = _case_end[0], _slowest[0]
    _case_end[0], _slowest[0] = time.monotonic() + seconds, None
    try:
        yield
    finally:
        _case_end[0], _slowest[0] = previous, slowest


_spent = [0.0]  # seconds spent inside implementations' calls in this process (implementation_seconds)


def implementation_seconds() -> float:
    """Seconds this process has spent inside implementations' calls (:func:`call`), so far:
    the difference of two readings is the implementation's share of what ran between them."""
    return _spent[0]


def call(fn, args, kwargs, time_limit, convert=None, *, read_only: bool = False):
    """Run ``fn(*args, **kwargs)`` and then ``convert(result)``, both within ``time_limit`` s (None: the
    limit derived from the calls measured so far in the case, :func:`derived_time_limit`).

    Every exception the implementation raises, of any class, becomes
    ``Misbehaved(RAISED)`` (``LazyUniformError``: ``ARITHMETIC``; the enumerator's "not
    replayable": ``RNG_MISUSE``; with ``read_only``, NumPy's error for a write into a
    read-only input: ``WRITES``); a time-out or a case over its time budget becomes
    ``Misbehaved(TIMEOUT)``.  ``convert`` is oracle code (e.g. :func:`checked_tokens`, a
    level's parser): its own ``Misbehaved`` passes through; a ``BaseException`` that is not an
    ``Exception`` (``SystemExit``, ``GeneratorExit``, ...) raised while it runs can only come
    from the output's own methods and becomes ``Misbehaved(INVALID)``; an ``Exception`` is
    the oracle's own bug and propagates (``internal error``).  The seconds of both count as
    the implementation's (a GPU output's conversion waits for its kernels).
    """
    remaining = _case_end[0] - time.monotonic()
    if remaining <= 0:
        raise Misbehaved(TIMEOUT, "the case ran over its time budget (case_time_limit)")
    limit = derived_time_limit(_slowest[0]) if time_limit is None else time_limit
    seconds = min(limit, remaining)

    def body():
        started, stopped = time.perf_counter(), [False]
        try:
            try:
                out = fn(*args, **kwargs)
            except _TimedOut:
                stopped[0] = True
                raise
            except BaseException as e:  # noqa: BLE001 - the implementation's failure, whatever its class
                return _Raised(e)
            try:
                return out if convert is None else _converted(convert, out)
            except _TimedOut:
                stopped[0] = True
                raise
        finally:
            took = time.perf_counter() - started
            _spent[0] += took
            if not stopped[0]:  # the call ended by itself: measured (its conversion included)
                _slowest[0] = max(_slowest[0] or 0.0, took)

    shared = _shared_deadline
    if shared is not None:  # an isolated worker: the parent enforces the deadline ([end, seconds])
        shared[1], shared[0] = seconds, time.monotonic() + seconds
        try:
            result = _guarded(body, "no result within the time limit")
        finally:
            shared[0] = 0.0
    else:
        why = (f"no result within {_limit_text(time_limit, seconds)}" if seconds == limit
               else "the case ran over its time budget (case_time_limit)")
        result = _guarded(lambda: _with_time_limit(body, seconds), why)
    if isinstance(result, _Raised):
        raise _misbehaviour(result.error, read_only)
    return result


def _misbehaviour(e: BaseException, read_only: bool) -> Misbehaved:
    """The status of an exception the implementation raised (see :func:`call`)."""
    if isinstance(e, LazyUniformError):
        return Misbehaved(ARITHMETIC, describe(e).partition(": ")[2])
    if read_only and _writes_read_only(e):
        return Misbehaved(WRITES, f"the implementation wrote into an input it was handed read-only "
                                  f"({describe(e)}); inputs are shared, copy them before writing")
    if isinstance(e, SpecrefError) and _enumeration_status(e) == RNG_MISUSE:
        return Misbehaved(RNG_MISUSE, describe(e).partition(": ")[2])
    return Misbehaved(RAISED, describe(e))


def _writes_read_only(e: BaseException) -> bool:
    """NumPy's ValueError for a write into a read-only array ("assignment destination is read-only")."""
    try:
        return isinstance(e, ValueError) and "is read-only" in str(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return False


@contextmanager
def foreign(what: str):
    """Oracle code that touches an implementation's output (``.cpu()``, ``__array__``, ``len``,
    iteration): any exception it raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is
    ``Misbehaved(INVALID)`` naming ``what``; ``Misbehaved`` and the time-out pass through."""
    try:
        yield
    except (Misbehaved, _TimedOut):
        raise
    except BaseException as e:  # noqa: BLE001 - the output's own methods failed
        raise Misbehaved(INVALID, f"{what}: converting it raised {describe(e)}") from None


def _converted(convert, out):
    """``convert(out)``: its Misbehaved, the time-out and its Exceptions (the oracle's own bugs) pass
    through; SystemExit & co. can only come from the output's own methods: ``invalid output``."""
    try:
        return convert(out)
    except (Misbehaved, _TimedOut, Exception):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit, GeneratorExit, KeyboardInterrupt of the output
        raise Misbehaved(INVALID, f"converting the output raised {describe(e)}") from None


class _Raised:
    def __init__(self, error):
        self.error = error


def _guarded(thunk, why):
    """Run oracle code around an implementation call: a time-out becomes TIMEOUT."""
    try:
        return thunk()
    except _TimedOut:
        raise Misbehaved(TIMEOUT, why) from None


def _with_time_limit(body, seconds):
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        fired = []

        def alarm(signum, frame):
            fired.append(True)
            raise _TimedOut()

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            out = body()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if fired:  # the implementation caught the time-out and returned later: still over its limit
            raise _TimedOut()
        return out
    box = {}  # off the main thread: a daemon thread that is abandoned if it hangs

    def target():
        try:
            box["value"] = body()
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
    """Validate an implementation's returned tokens: ints in range, length in bounds.

    Runs inside :func:`call` (as its ``convert``): ``tolist()``, iteration and
    comparisons that raise, and iterables longer than ``max_len`` (consumed only to
    ``max_len + 1`` items), become ``Misbehaved(INVALID)``.
    """
    try:
        if isinstance(out, np.ndarray):
            if out.ndim != 1 or out.size > max_len:
                raise Misbehaved(INVALID, f"{what} returned an array of shape {out.shape}; "
                                          f"expected 1-D with {min_len} to {max_len} tokens")
            seq = out.tolist()
        else:
            if hasattr(out, "tolist"):
                out = out.tolist()
            seq = list(islice(iter(out), max_len + 1))
        if not min_len <= len(seq) <= max_len:
            more = "or more " if len(seq) > max_len else ""
            raise Misbehaved(INVALID, f"{what} returned {len(seq)} {more}tokens {_short(seq)}; "
                                      f"expected {min_len} to {max_len}")
        for t in seq:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < V:
                raise Misbehaved(INVALID, f"{what} returned token {_short(t)} outside the vocabulary "
                                          f"0..{V - 1}: {_short(seq)}")
        return [int(t) for t in seq]
    except Misbehaved:
        raise
    except _TimedOut:
        raise
    except BaseException as e:  # noqa: BLE001 - the output's own methods failed
        raise Misbehaved(INVALID, f"{what} returned {_short(out)}, not a sequence of tokens "
                                  f"(converting it raised {describe(e)})") from None


def short_repr(value, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; a ``repr`` that raises (anything) is named, not raised."""
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001 - a hostile __repr__
        text = f"<a {type(value).__name__} whose repr() raised>"
    return text if len(text) <= limit else text[:limit] + "..."


def _short(value, limit: int = 300) -> str:
    try:
        text = repr(value)
    except BaseException as e:  # noqa: BLE001
        text = f"<an object whose repr() raised {type(e).__name__}>"
    return _cut(text, limit)


# ---------------------------------------------------------------- one case


def can_isolate() -> bool:
    """Whether cases can run in a forked worker on this platform."""
    return "fork" in multiprocessing.get_all_start_methods()


def cuda_started() -> bool:
    """Whether this process has started CUDA through torch: a forked worker then cannot use the GPU
    (CUDA does not survive ``fork``), so the default isolation runs such checks in-process.  Asking
    does not start CUDA (``torch.cuda.is_initialized``), and torch is not imported for it."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without cuda support, or a stub module
        return False


def guarded(body, *, isolate: bool, time_limit: float | None, case_time_limit: float, store=None) -> tuple:
    """``("result", body())``, or ``(status, detail)`` of its misbehaviour: the core of :func:`run_case`
    for any body (a plan's timed calls, an import).

    ``isolate``: in a forked worker with a hard deadline (see the module docstring).  ``store``: a
    mutable mapping the body fills (a statistical check's ``shard_store``); what an isolated body
    added to it is copied back here when the worker ends with a result.
    """
    if isolate and can_isolate():
        return _in_worker(body, time_limit, case_time_limit, store)
    return _here(body, case_time_limit)


def run_case(body, case, *, isolate: bool, time_limit: float | None, case_time_limit: float,
             store=None) -> CaseResult:
    """``body() -> CaseResult`` for ``case``, with its misbehaviour turned into a status.

    ``isolate``: in a forked worker with a hard deadline (see the module docstring).
    A worker's verdict is re-attached to ``case`` (the parent's own copy); ``store``: see :func:`guarded`.
    """
    status, value = guarded(body, isolate=isolate, time_limit=time_limit, case_time_limit=case_time_limit,
                            store=store)
    if status == "result":
        result = value
        if not isinstance(result, CaseResult):  # cannot happen with the oracle's bodies
            return CaseResult(case, RAISED, detail=f"internal: the case produced {_short(result)}")
        result.case = case
        return result
    if status == OK:  # a Misbehaved claiming "ok" was raised by the implementation itself
        status = RAISED
    return CaseResult(case, status, detail=value)


def _here(body, case_time_limit):
    previous, slowest = _case_end[0], _slowest[0]
    _case_end[0], _slowest[0] = time.monotonic() + case_time_limit, None  # the case's calls measured afresh
    try:
        return "result", body()
    except Misbehaved as m:
        return m.status, m.detail
    except SpecrefError as e:  # raised by the enumeration or sampling on the implementation's account
        return _enumeration_status(e), describe(e).partition(": ")[2]
    except Exception as e:  # noqa: BLE001 - the oracle's own failure: reported, never raised
        return INTERNAL, f"internal error of the oracle: {describe(e)}"
    except KeyboardInterrupt:  # outside a call: the person running the check pressed Ctrl-C
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit & co. got past the guards: the oracle's bug
        return INTERNAL, f"internal error of the oracle: {describe(e)} escaped the guarded calls"
    finally:
        _case_end[0], _slowest[0] = previous, slowest


def _enumeration_status(e: SpecrefError) -> str:
    """A SpecrefError outside a call: the enumeration's budget, a program that is not replayable
    (randomness from elsewhere than the rng handed over), or the oracle's own (INTERNAL)."""
    text = str(e)
    if "max_paths" in text:
        return BUDGET
    if "random calls" in text or "lazy uniform" in text or "enumerating generator" in text:
        return RNG_MISUSE
    return INTERNAL


def _in_worker(body, time_limit, case_time_limit, store=None):
    """``body()`` in a forked worker, watched from here: ``(status, value)`` as :func:`_here` gives.

    The worker is killed once a call runs past its deadline or the case past ``case_time_limit``;
    a worker that ends without a message is ``crashed``.  Entries the body added to ``store``
    come back with its message.
    """
    ctx = multiprocessing.get_context("fork")
    deadline = ctx.RawArray("d", 2)  # [monotonic end of the call in progress (0: none), its limit in seconds]
    receive, send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=_child, args=(body, deadline, receive, send, store), daemon=True,
                         name="specref-case")
    worker.start()
    send.close()
    try:
        message = _watch(worker, receive, deadline, time_limit, case_time_limit)
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()
        receive.close()
    if message is None:
        return _ended_without_message(worker.exitcode)
    if len(message) == 3:  # (status, value, entries the body added to the store)
        status, value, added = message
        for key, entry in added.items():
            store[key] = entry
        return status, value
    return message


def _one_thread_after_fork():
    """torch on one intra-op thread in a forked worker: GNU OpenMP's thread pool is not
    fork-safe, so a worker forked after the parent ran torch's pool would hang in its first
    parallel region (until the time limit).  Rows under the oracle are small; one thread loses
    nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and callable(getattr(torch, "set_num_threads", None)):
        try:
            torch.set_num_threads(1)
        except Exception:  # noqa: BLE001 - a stand-in module named torch: nothing to protect
            pass


def _child(body, deadline, receive, send, store=None):
    """The worker: the case with the call deadline shared with the parent (which enforces it and
    the case's), its message sent back, then ``os._exit`` whatever happened."""
    global _shared_deadline
    _shared_deadline = deadline
    faulthandler.disable()  # a crash of the implementation is reported by the parent, not dumped here
    receive.close()
    _one_thread_after_fork()
    try:
        try:
            before = None if store is None else set(store)
            message = _here(body, math.inf)
            if store is not None:
                message = message + ({k: v for k, v in store.items() if k not in before},)
        except BaseException as e:  # noqa: BLE001 - the oracle's own code failed in the worker
            message = (INTERNAL, f"internal error in the worker: {describe(e)}")
        try:
            send.send(message)
        except BaseException as e:  # noqa: BLE001 - e.g. a result that does not pickle
            send.send((RAISED, f"the worker could not send its result: {describe(e)}"))
    finally:
        os._exit(0)


def _watch(worker, receive, deadline, time_limit, case_time_limit):
    """Poll the worker until its message, a passed deadline (a time-out message) or its end
    without a message (None)."""
    end = time.monotonic() + case_time_limit
    while True:
        if receive.poll(0.005):
            return _receive(receive)
        if not worker.is_alive():
            if receive.poll(0):
                continue
            return None
        now, d = time.monotonic(), deadline[0]
        if d and now > d:
            return (TIMEOUT, f"no result within {_limit_text(time_limit, deadline[1])} (worker killed)")
        if now > end:
            return (TIMEOUT, f"the case ran over case_time_limit = {case_time_limit} s (worker killed)")


def _receive(receive):
    """The worker's message; None when the pipe closed without one."""
    try:
        return receive.recv()
    except (EOFError, OSError):
        return None
    except BaseException as e:  # noqa: BLE001 - a message that does not unpickle
        return (RAISED, f"the worker's result could not be read: {describe(e)}")


def _ended_without_message(code):
    """The ``crashed`` message of a worker that ended with exit code ``code`` and sent nothing."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        detail = f"the worker process was killed by {name} (a crash in the implementation)"
    else:
        detail = f"the implementation ended the worker process (exit code {code}) without a result"
    return (CRASHED, detail)


# ---------------------------------------------------------------- loading an implementation


def load_implementation(spec, *, probe: bool = True):
    """The callable named ``"module:attribute"``; SpecrefError (a usage error) when it cannot be had.

    ``probe``: the module is first imported in a forked worker (where fork exists), within
    :data:`IMPORT_TIME_LIMIT` seconds, so that a module that calls ``sys.exit`` or ``os._exit``,
    crashes or hangs at import is reported instead of ending (or stopping) this process; then it
    is imported here, where any exception of its import, ``SystemExit`` included, is the error.
    """
    if not isinstance(spec, str):
        raise SpecrefTypeError(f"an implementation is named 'module:function', got {spec!r:.80}")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SpecrefError(f"an implementation is named 'module:function', got {spec!r}")
    if probe and can_isolate():
        status, value = _in_worker(partial(_probe_import, module_name, attr), math.inf, IMPORT_TIME_LIMIT)
        if status != "result":
            raise SpecrefError(f"cannot load {spec!r}: importing it in a worker process: {status}: {value}")
        if value is not None:
            raise SpecrefError(f"cannot load {spec!r}: {value}")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a module may fail to import in any way, sys.exit included
        raise SpecrefError(f"cannot load {spec!r}: {describe(e)}") from None
    if not callable(fn):
        raise SpecrefTypeError(f"cannot check {spec!r}: it is a {type(fn).__name__}, not a callable")
    return fn


def _probe_import(module_name, attr):
    """In the probe worker: None when ``module:attr`` imports, else what went wrong."""
    try:
        getattr(importlib.import_module(module_name), attr)
    except BaseException as e:  # noqa: BLE001 - reported by the parent as a usage error
        return describe(e)
    return None
