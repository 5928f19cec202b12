"""Executors for sharded checks: a local process pool, or a Dask cluster (the
``distributed`` extra).

Statistical checks take any :class:`concurrent.futures.Executor` through
``Settings(executor=...)`` (:mod:`specref.verification.statistics.shards`).  This module opens
the two that the command line offers:

- :func:`local_pool` -- ``--workers N``: a ``ProcessPoolExecutor`` of N processes;
- :func:`dask_executor` -- ``--scheduler tcp://host:port``: the executor of a
  ``dask.distributed.Client`` connected to a cluster the user already runs, or
  (``scheduler=None``) to a ``LocalCluster`` of ``workers`` processes on the loopback
  interface, or of a ``Client`` the caller holds (``client=``).  Dask retries a shard whose
  worker died (``retries``); a shard's counts are merged only once, when its result arrives,
  so nothing is counted twice.

A ``Client`` itself, or its own ``client.get_executor()``, handed to a check as ``executor`` is
refused, with a message naming :func:`dask_executor` (``Settings``, SPEC §6.4): its shards would
run on Dask's threads (below), measured 2.07x the time of a pool of the same size.

**Why a Dask shard runs in a process of its own.**  A Dask worker runs tasks on threads of
its pool, never on its main thread, and there the oracle's per-call time limit
(:func:`specref.verification.running.calling.call`) cannot use ``SIGALRM``: it starts a
watchdog thread for every call of the implementation.  On the benchmark's check
(``benchmarks/bench_distributed.py``: the reference step, ~0.1 ms a call) that thread cost
more than the call itself -- measured 0.40 ms of oracle time per sample on a thread against
0.07 ms on a main thread, which is why a 2-process LocalCluster took 2.3x the time of a
2-process pool.  :func:`dask_executor` therefore hands each shard, cloudpickled, to a
process of the worker's own (one per worker thread, spawned once, ended with the block or
with its worker), where it runs on the main thread exactly as in a process pool.  ``main_thread=False`` turns this off (the shard runs on the Dask thread: the benchmark's
comparison row).  The
LocalCluster's workers are started non-daemonic (``distributed.worker.daemon: false``), as
a process that starts one must be; on a cluster of daemonic workers (Dask's default) the
shard runs on the Dask thread: start those workers with that setting to get the speed.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import time
from contextlib import contextmanager

from specref.core.errors import SpecrefError, check_positive_int

__all__ = ["local_pool", "dask_executor", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = 10.0  # seconds before an unreachable scheduler is reported


@contextmanager
def local_pool(workers: int):
    """``with local_pool(2) as executor:`` -- a pool of ``workers`` processes (fork where available)."""
    workers = check_positive_int("workers", workers)
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else methods[0])
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool


@contextmanager
def dask_executor(scheduler: str | None = None, *, workers: int = 2, timeout: float = CONNECT_TIMEOUT,
                  retries: int = 3, main_thread: bool = True, client=None):
    """``with dask_executor("tcp://host:8786") as executor:`` -- a Dask client's executor.

    ``scheduler=None`` starts a ``LocalCluster`` (``workers`` processes, one thread
    each, 127.0.0.1) for the duration of the block.  An unreachable scheduler is a
    SpecrefError after ``timeout`` seconds.  ``client``: a ``distributed.Client`` the caller
    holds (then no ``scheduler``); it stays open after the block.  ``main_thread``: each task
    runs on the main thread of a process of its worker's own (module docstring); the task and
    its result travel cloudpickled, so lambdas travel too.
    """
    if not isinstance(main_thread, bool):
        raise SpecrefError(f"main_thread must be True or False, got {main_thread!r}")
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SpecrefError("Dask is not installed: pip install 'specref[distributed]'") from None
    if client is not None:
        if not isinstance(client, Client) or scheduler is not None:
            raise SpecrefError(f"client must be a distributed.Client, given without a scheduler, got "
                               f"client={client!r:.80}, scheduler={scheduler!r}")
        with _executor_of(client, retries, main_thread, close=False) as executor:
            yield executor
        return
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf")):
        raise SpecrefError(f"timeout must be a positive number of seconds, got {timeout!r}")
    retries = check_positive_int("retries", retries, minimum=0)
    cluster = None
    if scheduler is None:
        workers = check_positive_int("workers", workers)
        import dask

        with dask.config.set({"distributed.worker.daemon": not main_thread}):  # a daemon may not start a pool
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None)
        address = cluster.scheduler_address
    else:
        if not isinstance(scheduler, str) or "://" not in scheduler:
            raise SpecrefError(f"scheduler must be an address such as 'tcp://host:8786', got {scheduler!r}")
        address = scheduler
    try:
        try:
            client = Client(address, timeout=f"{timeout}s")
        except (OSError, TimeoutError) as e:
            raise SpecrefError(f"cannot reach the Dask scheduler at {address!r} within {timeout} s: {e}") from None
        with _executor_of(client, retries, main_thread, close=True) as executor:
            yield executor
    finally:
        if cluster is not None:
            cluster.close()


@contextmanager
def _executor_of(client, retries: int, main_thread: bool, *, close: bool):
    """``client``'s executor for checks (its shards on main threads, or marked as on Dask's threads);
    the workers' own processes end with the block, and ``client`` too when ``close``."""
    try:
        executor = client.get_executor(retries=retries, pure=False)
        yield _OnMainThread(executor) if main_thread else _OnDaskThreads(executor)
    finally:
        if main_thread:
            try:  # the workers' own processes end with the block, on any cluster
                client.run(_close_pool)
            except Exception:  # noqa: BLE001 - a worker that is gone has no pool left to close
                pass
        if close:
            client.close()


# ---------------------------------------------------------------- Dask tasks on a main thread


class _OnMainThread(cf.Executor):
    """A Dask client's executor whose tasks run on the main thread of a process of their
    worker's own (:func:`_on_main_thread`).  Other attributes are the wrapped executor's."""

    def __init__(self, inner):
        self._inner = inner

    def submit(self, fn, /, *args, **kwargs):
        import cloudpickle

        return self._inner.submit(_on_main_thread, cloudpickle.dumps((fn, args, kwargs)))

    def shutdown(self, wait=True, *, cancel_futures=False):
        self._inner.shutdown(wait=wait)

    def __getattr__(self, name):  # _client, ... (the wrapped executor's)
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _OnDaskThreads(_OnMainThread):
    """``main_thread=False``: the tasks run on Dask's threads, as the client's own executor runs them
    (a check accepts this wrapper, chosen knowingly, and refuses the bare executor: ``Settings``)."""

    def submit(self, fn, /, *args, **kwargs):
        return self._inner.submit(fn, *args, **kwargs)


_POOL: list = [None, threading.Lock()]  # this worker process's own pool, and the lock that starts it


def _on_main_thread(payload: bytes):
    """Run a cloudpickled ``(fn, args, kwargs)`` on a main thread: here if this is one, else in
    this process's pool (started on first use, one process per Dask thread of this worker).
    A daemonic worker (Dask's default, ``distributed.worker.daemon``) may not start one: the
    task then runs here, on the Dask thread."""
    if threading.current_thread() is threading.main_thread() or multiprocessing.current_process().daemon:
        return _run_payload(payload)
    with _POOL[1]:
        if _POOL[0] is None:
            _POOL[0] = cf.ProcessPoolExecutor(max_workers=_worker_threads(), mp_context=_clean_context(),
                                               initializer=_watch_parent, initargs=(os.getpid(),))
        pool = _POOL[0]
    try:
        return pool.submit(_run_payload, payload).result()
    except cf.process.BrokenProcessPool:  # the implementation killed the process: a fresh pool next time
        with _POOL[1]:
            if _POOL[0] is pool:
                _POOL[0] = None
        pool.shutdown(wait=False)
        raise


def _close_pool() -> bool:
    """End this process's pool (``client.run`` at the end of :func:`dask_executor`'s block)."""
    with _POOL[1]:
        pool, _POOL[0] = _POOL[0], None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    return pool is not None


def _watch_parent(parent: int, every: float = 1.0):
    """In a pool process: exit once the worker that started it is gone (a killed worker's pool
    would otherwise wait forever on a queue whose writing end it holds itself)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(0)

    threading.Thread(target=watch, name="specref-watch-parent", daemon=True).start()


def _run_payload(payload: bytes):
    import cloudpickle

    fn, args, kwargs = cloudpickle.loads(payload)
    return fn(*args, **kwargs)


def _worker_threads() -> int:
    """Threads of the Dask worker this runs in (1 outside one)."""
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def _clean_context():
    """``spawn``: a start method that does not fork a multi-threaded Dask worker, and whose
    processes are the worker's own children (so :func:`_watch_parent` sees it end)."""
    return multiprocessing.get_context("spawn")
