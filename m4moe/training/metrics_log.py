"""The training metrics log, ``<model_dir>/metrics.jsonl``: its writer and
its one reader.

The trainer writes it, and the run supervisor, the report, the study's
screening and curves and the peer comparison read it, all through
:func:`read_metrics`, so a line cut short by a crash is treated alike
everywhere. The numbers are those of the TensorBoard summaries
(:mod:`m4moe.training.metrics`).

One JSON object per line, keyed by ``kind``; on resume, records with
``step`` beyond the restored checkpoint are dropped so every (kind, step)
appears once:

* ``{"kind": "train", "step", "time", "elapsed_sec", "tokens_seen",
  "source_tokens_seen", "train_ce", "train_loss", "moe_loss", "aux_loss",
  "z_loss", "learning_rate", "grad_norm", "step_time_sec", "step_cpu_sec",
  "tokens_per_sec",
  "target_tokens_per_sec", "nonfinite_skipped", "devices", "device_kind",
  "batch_tokens", "grad_accum_steps", "router": {layer: {stat: value}},
  "expert_compute": {stack: {stat: mean}}}``
  -- ``train_ce`` is the plain token cross-entropy (no label smoothing, no
  aux loss) averaged over the target tokens of the logging interval;
  ``tokens_seen`` counts non-padding target tokens since step 0;
  ``tokens_per_sec`` counts source + target non-padding tokens;
  ``step_cpu_sec`` is the process's CPU seconds (all threads) per step,
  which, unlike the wall-clock ``step_time_sec``, a busy shared core does
  not inflate: the measure for comparing models at equal CPU time;
  ``expert_compute`` (MoE models) is :func:`expert_compute_means` of
  ``router``: per stack (``encoder``, ``decoder``) the mean over its MoE
  layers of the expert FLOPs actually executed per real token, absolute and
  as a fraction of the dense FFN's (after second-expert policy skips and
  capacity drops), so "equal active FLOPs" is measured.
* ``{"kind": "eval", "step", "time", "tokens_seen", "dev_ce": {lang: ce},
  "dev_tokens": {lang: n}, "dev_ce_mean", "source_reliance": {lang: gap},
  "empty_dev": [lang]}`` -- ``dev_ce_mean`` is weighted by tokens over the
  languages with dev target tokens; ``empty_dev`` lists those without (no
  cross-entropy, left out; no eval record when every dev set is empty);
  ``source_reliance`` is the dev CE with each source replaced by another
  pair's minus the true dev CE (nats per token; see
  ``StepRunner.evaluate_with_source_reliance``).
* ``{"kind": "start", "step", "time", "devices", "device_kind",
  "num_params", "resumed_from", "damaged_checkpoints",
  "removed_leftovers", "metrics_cut"}`` (the last two: the leftovers of
  killed checkpoint saves removed at this start, and :class:`Cut` as a
  dict or None) and ``{"kind": "end", "step", "time", "reason"}`` (reason:
  ``done``, ``preempted``). Paths in a start record (``resumed_from``, the
  warm start's, damaged checkpoints', removed leftovers) are relative to
  the model directory: the log is copied into ``results/``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

METRICS_FILENAME = "metrics.jsonl"


class MetricsFormatError(ValueError):
  """A line of a metrics log is not a JSON object (strict reading)."""


@dataclasses.dataclass(frozen=True)
class Cut:
  """What :class:`MetricsLog` dropped when it was opened for a resume.

  Attributes:
    step: the restored step the log was cut back to.
    records: records of later steps dropped (those steps are redone).
    first_step, last_step: the steps of the first and last of them.
    malformed: lines that were not JSON (cut short by a kill), dropped.
  """
  step: int
  records: int
  first_step: int | None
  last_step: int | None
  malformed: int

  def describe(self, path: str | os.PathLike[str]) -> str:
    """``cut <path> back to step N (dropped ...)``, for one log line."""
    parts = []
    if self.records:
      steps = (f"step {self.first_step}" if self.first_step == self.last_step
               else f"steps {self.first_step}-{self.last_step}")
      parts.append(f"{self.records} record(s) of {steps}, which are redone")
    if self.malformed:
      parts.append(f"{self.malformed} line(s) cut short by a kill")
    return (f"cut {path} back to step {self.step} (dropped "
            f"{' and '.join(parts)})")


class MetricsWriteError(OSError):
  """Appending a record failed (e.g. a full disk); the log was cut back to
  its last whole line, so it holds no half record."""


class MetricsLog:
  """Append-only JSONL metrics file that stays consistent across resumes.

  Args:
    path: the ``metrics.jsonl`` file.
    resume_step: the step of the restored checkpoint (0 for a fresh run).
      Records of a later step, written by a run that crashed before its next
      checkpoint, are dropped (atomically) since those steps will be redone;
      :attr:`cut` says what was dropped (None: nothing).

  Each record is appended with one unbuffered write, and a write that fails
  (a full disk) is undone by cutting the file back to where it was, so the
  log never ends in half a record and a resume reads every record before it.
  """

  def __init__(self, path: str | os.PathLike[str], *, resume_step: int):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.cut: Cut | None = None
    if self.path.exists():
      self.cut = self._truncate_after(resume_step)
    # Unbuffered: each record is written at once (see write()).
    self._file = open(  # pylint: disable=consider-using-with
        self.path, "ab", buffering=0)

  def _truncate_after(self, step: int) -> Cut | None:
    kept, dropped, malformed = [], [], 0
    with open(self.path, encoding="utf-8", errors="replace") as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          malformed += bool(line.strip())  # a line cut short by a crash
          continue
        if not isinstance(record, dict):
          malformed += 1
        elif int(record.get("step") or 0) <= step:
          kept.append(json.dumps(record, sort_keys=True))
        else:
          dropped.append(int(record["step"]))
    tmp = self.path.with_name(f".{self.path.name}.tmp")
    tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    os.replace(tmp, self.path)
    if not dropped and not malformed:
      return None
    return Cut(step=step, records=len(dropped),
               first_step=min(dropped, default=None),
               last_step=max(dropped, default=None), malformed=malformed)

  def write(self, record: Mapping[str, Any]) -> None:
    """Appends ``record`` as one line.

    Raises:
      MetricsWriteError: the write failed (``errno`` as the OS's, e.g.
        ENOSPC); the file was cut back to its previous end.
    """
    data = (json.dumps(dict(record), sort_keys=True) + "\n").encode("utf-8")
    end = os.fstat(self._file.fileno()).st_size
    try:
      written = 0
      while written < len(data):  # a raw write may write only a part
        written += self._file.write(data[written:])
    except OSError as e:
      try:
        os.ftruncate(self._file.fileno(), end)
      except OSError:
        pass  # the next start drops the half line (see _truncate_after)
      raise MetricsWriteError(e.errno, e.strerror, str(self.path)) from e

  def close(self) -> None:
    self._file.close()


def read_metrics(path: str | os.PathLike[str], kind: str | None = None, *,
                 strict: bool = False) -> list[dict[str, Any]]:
  """Records of a metrics log (optionally only one ``kind``), in order.

  A trainer killed mid-write leaves a line cut short, which the next run
  drops on resume; readers skip such lines (and blank ones) rather than
  refuse a log that is still being written.

  Args:
    path: the ``metrics.jsonl`` file.
    kind: keep only records of this ``kind`` (``train``, ``eval``,
      ``start``, ``end``).
    strict: raise on a line that is not a JSON object instead, for logs of
      finished runs, where such a line means the file was damaged.

  Raises:
    OSError: the file cannot be read.
    MetricsFormatError: with ``strict``, naming the file and line.
  """
  out = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        problem = None if isinstance(record, dict) else "not a JSON object"
      except json.JSONDecodeError as e:
        problem = f"not JSON ({e})"
      if problem is not None:
        if strict:
          raise MetricsFormatError(
              f"{path}:{number}: {problem}; the log was damaged: rerun the "
              "training or remove the line")
        continue
      if kind is None or record.get("kind") == kind:
        out.append(record)
  return out


def end_reason(path: str | os.PathLike[str]) -> str | None:
  """The ``reason`` of the log's last ``end`` record (``done``,
  ``preempted``, ...); None when there is no log or no end record."""
  if not pathlib.Path(path).is_file():
    return None
  ends = read_metrics(path, "end")
  return ends[-1].get("reason") if ends else None
