"""Peak resident memory of a command, and when (in which phase) it happened.

Runs the command as a child process, reads its ``VmRSS`` from
``/proc/<pid>/status`` every ``interval`` seconds, and echoes each line the
command prints (stdout and stderr together) to ``echo`` with the elapsed
seconds and the last sampled RSS in front, so the log shows the phase the
memory belongs to (step, dev evaluation, checkpoint save). When the command
exits, its exact peak comes from the kernel (``ru_maxrss`` of ``wait4``,
the same number as ``/usr/bin/time -v``'s "Maximum resident set size");
the samples give the time of the largest sampled RSS and the last output
line before it. That time is the end of the peak's plateau (the last sample
within 1% of the largest), not its first sample: output lines are
time-stamped when this process reads them, which on a loaded machine can
lag the child's print by more than a sampling interval. Linux only (``/proc``). Only the child's own memory is
counted, not that of processes it starts.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from typing import Any, Sequence, TextIO

from m4moe import jsonfile


@dataclasses.dataclass(frozen=True)
class RssSample:
  """One reading: seconds since the start, resident set size in KiB."""
  seconds: float
  rss_kb: int


def _rss_kb(pid: int) -> int | None:
  """VmRSS of ``pid`` in KiB, or None once the process is gone."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1])
  except (OSError, ValueError):
    return None
  return None  # a zombie has no VmRSS line


def measure(command: Sequence[str], *, interval: float = 0.5,
            echo: TextIO | None = None) -> dict[str, Any]:
  """Runs ``command`` to its end and returns its peak-RSS record.

  Args:
    command: program and arguments (no shell).
    interval: seconds between two RSS readings; > 0.
    echo: where the command's output goes, each line prefixed with
      ``[<seconds>s rss=<MiB>MB]``; None: the output is read and dropped.

  Returns:
    ``{"benchmark": "peak_rss", "command", "returncode", "max_rss_kb"
    (exact, from the kernel), "peak_sampled_rss_kb", "peak_time_sec",
    "peak_line" (the last output line read before the end of the
    peak's plateau, "" if none), "wall_sec", "cpu_sec" (the child's user + system time),
    "samples"}``.

  Raises:
    ValueError: empty ``command`` or ``interval`` <= 0.
    FileNotFoundError / PermissionError: the program cannot be started.
  """
  if not command:
    raise ValueError("no command given: pass the program and its arguments")
  if interval <= 0:
    raise ValueError(f"interval={interval} must be > 0 seconds")
  start = time.monotonic()
  proc = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1,
                          errors="replace")
  sampler = _Sampler(proc.pid, start=start, interval=interval)
  lines = _read_output(proc, sampler, start=start, echo=echo)
  # wait4 (not Popen.wait) reaps the child and returns its resource usage.
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  samples = sampler.stop()
  peak = _plateau_end(samples)
  before = [text for t, text in lines if t <= peak.seconds]
  return {
      "benchmark": "peak_rss",
      # As run from the working directory, with no machine's paths in it.
      "command": jsonfile.relative_command(command, start=os.getcwd()),
      "returncode": proc.returncode, "max_rss_kb": usage.ru_maxrss,
      "peak_sampled_rss_kb": peak.rss_kb,
      "peak_time_sec": round(peak.seconds, 1),
      "peak_line": before[-1] if before else "",
      "wall_sec": round(time.monotonic() - start, 1),
      "cpu_sec": round(usage.ru_utime + usage.ru_stime, 1),
      "samples": len(samples),
  }


def _plateau_end(samples: Sequence[RssSample]) -> RssSample:
  """The last sample within 1% of the largest RSS (0 s, 0 KiB if none).

  Its ``rss_kb`` is the largest sampled value; its time is when the peak
  phase was last seen, so a line read late still falls before it.
  """
  if not samples:
    return RssSample(0.0, 0)
  largest = max(s.rss_kb for s in samples)
  last = [s for s in samples if s.rss_kb >= 0.99 * largest][-1]
  return RssSample(seconds=last.seconds, rss_kb=largest)


class _Sampler:
  """Reads a process's RSS every ``interval`` seconds on a daemon thread.

  A thread, because the main thread blocks reading the command's output;
  sampling there would miss the memory of phases that print nothing.
  """

  def __init__(self, pid: int, *, start: float, interval: float):
    self.samples: list[RssSample] = []
    self._exited = threading.Event()
    self._thread = threading.Thread(
        target=self._run, args=(pid, start, interval), daemon=True)
    self._thread.start()

  def _run(self, pid: int, start: float, interval: float) -> None:
    while not self._exited.is_set():
      rss = _rss_kb(pid)
      if rss is not None:
        self.samples.append(RssSample(seconds=time.monotonic() - start,
                                      rss_kb=rss))
      self._exited.wait(interval)

  def stop(self) -> list[RssSample]:
    """Stops sampling (the process has exited) and returns the samples."""
    self._exited.set()
    self._thread.join()
    return self.samples


def _read_output(proc: subprocess.Popen, sampler: _Sampler, *, start: float,
                 echo: TextIO | None) -> list[tuple[float, str]]:
  """(seconds since start, line) of every output line, echoed with the last
  sampled RSS in front so a log shows which phase the memory belongs to."""
  lines: list[tuple[float, str]] = []
  assert proc.stdout is not None
  for line in proc.stdout:
    now = time.monotonic() - start
    lines.append((now, line.rstrip("\n")))
    if echo is not None:
      samples = sampler.samples
      rss = samples[-1].rss_kb if samples else 0
      echo.write(f"[{now:8.1f}s rss={rss / 1024:7.1f}MB] {line}")
      echo.flush()
  return lines
