"""Worker processes that never outlive the builder and survive their crashes.

:class:`WorkerPool` wraps ``concurrent.futures.ProcessPoolExecutor`` for the
corpus builder's catalog parsing:

* every worker asks the kernel to SIGKILL it when the builder dies, even by
  ``kill -9`` (Linux ``prctl(PR_SET_PDEATHSIG)``), ignores Ctrl-C (the
  builder stops the pool) and ends on SIGTERM (fork copies the builder's
  handler; it is reset);
* leaving the ``with`` block by an exception (SIGTERM turned into an
  exception, Ctrl-C, a failure) cancels queued work and terminates the
  workers instead of waiting for them;
* workers are forked (``ProcessPoolExecutor`` forks on ``submit``) with
  SIGTERM, SIGINT and SIGHUP blocked in the builder, so a signal that
  arrives during a fork is delivered right after it: a Python signal
  handler that raises inside ``os.fork``'s at-fork callbacks (logging
  releases its lock there) is printed as "Exception ignored" and lost, which
  let a SIGTERM'd build run on. Workers unblock them first thing;
* :meth:`WorkerPool.map` yields results in input order, like
  ``Executor.map``, but a worker that dies (a segfault, the OOM killer)
  costs only the item it was processing: the pool is restarted, the items of
  the broken chunk are retried one at a time, and the one that kills its
  worker again is given to ``on_crash`` instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from concurrent.futures import process as futures_process
from typing import Any, Callable, Iterator, Sequence

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_EXIT_TIMEOUT_S = 5.0
# Signals held back while workers are forked (module docstring).
_HELD_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
  """Blocks :data:`_HELD_SIGNALS` in this thread; pending ones are delivered
  (their handlers run) when the block ends."""
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _init_worker(builder_pid: int) -> None:
  """Pool initializer (module docstring); exits if the builder is gone."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  # Forked with the builder's signals held (_signals_held): take them again.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)
  if sys.platform.startswith("linux"):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
  if os.getppid() != builder_pid:
    os._exit(1)  # the builder died before prctl took effect


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
  return [fn(item) for item in chunk]


class WorkerPool:
  """A process pool for one build (module docstring); use as a context.

  Args:
    workers: number of processes (>= 2; run in-process instead for 1).
    chunksize: items sent to a worker at once.
  """

  def __init__(self, *, workers: int, chunksize: int):
    if workers < 2 or chunksize < 1:
      raise ValueError(f"workers={workers} must be >= 2 and chunksize="
                       f"{chunksize} >= 1")
    self._workers = workers
    self._chunksize = chunksize
    self._executor: concurrent.futures.ProcessPoolExecutor | None = None
    self._before: set[multiprocessing.Process] = set()
    self.restarts = 0

  def __enter__(self) -> WorkerPool:
    self._start()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self._executor.shutdown(wait=True)
    else:
      self._stop()

  def _start(self) -> None:
    # Workers are the children started from here on (active_children:
    # multiprocessing's own registry of this process's children).
    self._before = set(multiprocessing.active_children())
    self._executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=self._workers, initializer=_init_worker,
        initargs=(os.getpid(),))

  def _stop(self) -> None:
    """Cancels queued work and terminates the workers, without waiting for
    running tasks."""
    self._executor.shutdown(wait=False, cancel_futures=True)
    workers = set(multiprocessing.active_children()) - self._before
    for process in workers:
      process.terminate()
    for process in workers:
      process.join(_EXIT_TIMEOUT_S)
      if process.is_alive():
        process.kill()
        process.join(_EXIT_TIMEOUT_S)

  def _restart(self) -> None:
    self._stop()
    self.restarts += 1
    self._start()

  def map(self, fn: Callable[[Any], Any], items: Sequence[Any], *,
          on_crash: Callable[[Any, str], Any]) -> Iterator[Any]:
    """``fn(item)`` for every item, in order, computed in the workers.

    Args:
      fn: a picklable module-level function.
      items: its arguments.
      on_crash: ``on_crash(item, reason)`` stands in for the result of an
        item whose worker died twice while processing it.
    """
    start = 0
    while start < len(items):
      with _signals_held():  # submit forks the workers
        futures = [self._executor.submit(_run_chunk, fn,
                                         items[i:i + self._chunksize])
                   for i in range(start, len(items), self._chunksize)]
      for k, future in enumerate(futures):
        try:
          results = future.result()
        except futures_process.BrokenProcessPool:
          # Some worker died: maybe on this chunk, maybe on one running
          # beside it. Retry this chunk's items one by one in a new pool.
          first = start + k * self._chunksize
          self._restart()
          yield from self._isolate(fn, items[first:first + self._chunksize],
                                   on_crash)
          start = first + self._chunksize
          break
        yield from results
      else:
        start = len(items)

  def _isolate(self, fn, chunk: Sequence[Any],
               on_crash: Callable[[Any, str], Any]) -> Iterator[Any]:
    for item in chunk:
      try:
        with _signals_held():  # submit forks the workers
          future = self._executor.submit(fn, item)
        yield future.result()
      except futures_process.BrokenProcessPool as e:
        self._restart()
        yield on_crash(item, f"the worker process died ({e})")
