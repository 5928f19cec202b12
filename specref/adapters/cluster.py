"""Executors for sharded checks: a local process pool, or a Dask cluster (the
``distributed`` extra).

Statistical checks take any :class:`concurrent.futures.Executor` through
``Settings(executor=...)`` (:mod:`specref.verification.statistics.shards`).  This module opens
the two that the command line offers:

- :func:`local_pool` -- ``--workers N``: a ``ProcessPoolExecutor`` of N processes;
- :func:`dask_executor` -- ``--scheduler tcp://host:port``: the executor of a
  ``dask.distributed.Client`` connected to a cluster the user already runs, or
  (``scheduler=None``) to a ``LocalCluster`` of ``workers`` processes on the loopback
  interface.  Dask retries a shard whose worker died (``retries``); a shard's counts
  are merged only once, when its result arrives, so nothing is counted twice.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
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
                  retries: int = 3):
    """``with dask_executor("tcp://host:8786") as executor:`` -- a Dask client's executor.

    ``scheduler=None`` starts a ``LocalCluster`` (``workers`` processes, one thread
    each, 127.0.0.1) for the duration of the block.  An unreachable scheduler is a
    SpecrefError after ``timeout`` seconds.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SpecrefError("Dask is not installed: pip install 'specref[distributed]'") from None
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf")):
        raise SpecrefError(f"timeout must be a positive number of seconds, got {timeout!r}")
    retries = check_positive_int("retries", retries, minimum=0)
    cluster = None
    if scheduler is None:
        workers = check_positive_int("workers", workers)
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
        try:
            yield client.get_executor(retries=retries, pure=False)
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
