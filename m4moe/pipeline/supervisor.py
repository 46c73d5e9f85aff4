"""Runs the main job's stage processes: lanes, signals, no orphans.

Each stage runs as a child process through :func:`run_stage_process` or
:class:`StageProcesses`, which never leave it behind as an orphan: SIGTERM,
SIGINT and SIGHUP sent to the job are forwarded to the stage (a training
stage then saves and stops), and on Linux the stage gets SIGTERM from the
kernel if the job dies without being able to forward anything (``kill -9``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Sequence


def lane_environment(cpus: Sequence[int]) -> dict[str, str]:
  """This process's environment with TF's thread pool sized to ``cpus``."""
  threads = str(len(cpus))
  return {**os.environ, "TF_NUM_INTRAOP_THREADS": threads,
          "OMP_NUM_THREADS": threads}


# Linux prctl(2) option: the signal the calling process gets when its parent
# dies.
_PR_SET_PDEATHSIG = 1
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class StageExit:
  """How a stage's process ended.

  Attributes:
    returncode: its exit code (negative: killed by that signal).
    interrupted_by: the signal this job received and forwarded to it while
      it ran (None: none); the job must stop after such a stage.
  """
  returncode: int
  interrupted_by: int | None


def _die_with_parent(*, cpus: Sequence[int] = ()
                     ) -> Callable[[], None] | None:
  """A ``preexec_fn`` giving the child SIGTERM when this process dies.

  With ``cpus``, the child is also pinned to those cores.

  libc is loaded here, in the parent: loading libraries between fork and
  exec is unsafe. The child also checks that its parent is still the one
  that forked it, since a parent killed before ``prctl`` ran would never
  signal it. None off Linux (no PR_SET_PDEATHSIG there).
  """
  if not sys.platform.startswith("linux"):
    return None
  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                     use_errno=True)
  parent = os.getpid()

  def preexec() -> None:
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
      os.write(2, b"m4moe-run: prctl(PR_SET_PDEATHSIG) failed\n")
      os._exit(125)  # pylint: disable=protected-access
    if os.getppid() != parent:
      os.kill(os.getpid(), signal.SIGTERM)
    if cpus:
      os.sched_setaffinity(0, cpus)

  return preexec


class StageProcesses:
  """Runs stage commands as children without ever leaving an orphan.

  Used as a context manager: while it is open, SIGTERM, SIGINT and SIGHUP
  received by this process are forwarded to every running child (the same
  signal) instead of ending this process; the caller waits for the children
  and must then stop (:attr:`interrupted_by`). Each child runs in its own
  process group, so a terminal's Ctrl-C reaches it once, through this
  process, not twice. On Linux each child is also set up to receive SIGTERM
  when this process dies, so ``kill -9`` of this process does not orphan it
  (``m4moe-train`` saves a checkpoint and exits on SIGTERM). Signal
  forwarding needs the main thread; elsewhere only the parent-death signal
  applies.
  """

  def __init__(self) -> None:
    self._running: list[subprocess.Popen] = []
    self._received: list[int] = []
    self._previous: dict[int, Any] = {}

  @property
  def interrupted_by(self) -> int | None:
    """The first signal received and forwarded (None: none)."""
    return self._received[0] if self._received else None

  def _forward(self, signum, frame) -> None:  # pylint: disable=unused-argument
    self._received.append(signum)
    for child in self._running:
      if child.poll() is None:
        child.send_signal(signum)

  def __enter__(self) -> "StageProcesses":
    if threading.current_thread() is threading.main_thread():
      for sig in FORWARDED_SIGNALS:
        self._previous[sig] = signal.signal(sig, self._forward)
    return self

  def __exit__(self, *exc_info) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def start(self, command: Sequence[str], *, cpus: Sequence[int] = (),
            env: dict[str, str] | None = None,
            stdout: Any = None) -> subprocess.Popen:
    """Starts ``command``; ``cpus`` pins it to those cores (Linux)."""
    # Its own process group: a terminal's Ctrl-C (sent to the foreground
    # group) reaches only this process, which forwards it once.
    child = subprocess.Popen(
        list(command), process_group=0, env=env, stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        preexec_fn=_die_with_parent(cpus=cpus))
    self._running.append(child)
    if self._received:  # arrived between installing the handlers and the fork
      child.send_signal(self._received[0])
    return child

  def wait_any(self) -> tuple[subprocess.Popen, int]:
    """Waits until one running child exits: (child, its exit code)."""
    while True:
      for child in self._running:
        returncode = child.poll()
        if returncode is not None:
          self._running.remove(child)
          return child, returncode
      if not self._running:
        raise RuntimeError("wait_any() with no running stage")
      try:  # wakes early when the first child exits; polls the others
        self._running[0].wait(timeout=0.2)
      except subprocess.TimeoutExpired:
        pass

  def terminate_all(self) -> None:
    """SIGTERM to every running child (training saves and stops)."""
    for child in self._running:
      if child.poll() is None:
        child.send_signal(signal.SIGTERM)


def run_stage_process(command: Sequence[str]) -> StageExit:
  """Runs ``command`` as a child and waits for it, without leaving orphans.

  See :class:`StageProcesses` for how signals reach the child; the caller
  must stop after a stage that was interrupted
  (:attr:`StageExit.interrupted_by`).
  """
  with StageProcesses() as processes:
    child = processes.start(command)
    while True:
      done, returncode = processes.wait_any()
      if done is child:
        break
  return StageExit(returncode=returncode,
                   interrupted_by=processes.interrupted_by)
