"""Training observability: TensorBoard summaries, JSONL metrics, console lines.

TensorBoard: summaries are written with the core ``tf.summary.write`` op and
the TensorBoard plugin metadata (``scalars`` / ``histograms``), so writing
needs no ``tensorboard`` package (reading them does). Tags:

  train/cross_entropy, train/loss, train/moe_loss, train/aux_loss,
  train/z_loss, train/learning_rate, train/grad_norm, train/step_time_sec,
  train/tokens_per_sec, train/nonfinite_skipped
  router/<layer>/<stat> for every scalar RouterStats field (load_cv,
    dropped_first, dropped_second, entropy, max_logit, ...) and the
    executed expert compute of ``m4moe.moe.layer.MoeLayerStats``
    (expert_assignments_per_token, expert_flops_per_token,
    expert_flops_dense_fraction)
  router/<layer>/load_per_expert   a histogram with one bucket per expert
    (x = expert index, height = fraction of tokens routed to it)
  dev/cross_entropy/<lang>, dev/cross_entropy (token-weighted over languages)
  dev/source_reliance/<lang> (CE with wrong sources minus CE, nats/token)

JSONL (``<model_dir>/metrics.jsonl``), one JSON object per line, keyed by
``kind``; on resume, records with ``step`` beyond the restored checkpoint are
dropped so every (kind, step) appears once:

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
import time
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import summary_pb2

METRICS_FILENAME = "metrics.jsonl"


def _metadata(plugin: str) -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))


def write_scalar(tag: str, value: float, *, step: int) -> None:
  """A TensorBoard scalar on the default summary writer."""
  tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step,
                   metadata=_metadata("scalars"))


def write_per_expert_histogram(tag: str, load: np.ndarray, *,
                               step: int) -> None:
  """A histogram with bucket ``e`` = [e, e+1) of height ``load[e]``.

  Args:
    tag: summary tag.
    load: <float32>[E] fraction of tokens routed to each expert.
    step: global step.
  """
  load = np.asarray(load, np.float64).reshape(-1)
  edges = np.arange(load.size + 1, dtype=np.float64)
  buckets = np.stack([edges[:-1], edges[1:], load], axis=1)
  tf.summary.write(tag, tf.constant(buckets), step=step,
                   metadata=_metadata("histograms"))


def write_router_summaries(router: Mapping[str, Mapping[str, np.ndarray]], *,
                           step: int) -> None:
  """Scalars for every scalar stat, a per-expert histogram for ``load``."""
  for layer, stats in router.items():
    for name, value in stats.items():
      value = np.asarray(value)
      if value.ndim == 0:
        write_scalar(f"router/{layer}/{name}", value, step=step)
      elif name == "load":
        write_per_expert_histogram(f"router/{layer}/load_per_expert", value,
                                   step=step)


def router_scalars(router: Mapping[str, Mapping[str, np.ndarray]]
                   ) -> dict[str, dict[str, float]]:
  """The scalar router stats as plain floats (for the JSONL log)."""
  return {layer: {k: float(v) for k, v in stats.items() if np.ndim(v) == 0}
          for layer, stats in router.items()}


# The per-layer stats of the executed expert compute (MoeLayerStats).
EXPERT_COMPUTE_STATS = ("expert_assignments_per_token",
                        "expert_flops_per_token",
                        "expert_flops_dense_fraction")


def expert_compute_means(router: Mapping[str, Mapping[str, Any]]
                         ) -> dict[str, dict[str, float]]:
  """Per stack, the mean over its MoE layers of the executed expert compute.

  Args:
    router: ``{layer: {stat: value}}`` with layer names such as
      ``encoder/layer_1/moe`` (the stack is the first path component).

  Returns:
    ``{stack: {stat: mean}}`` for the :data:`EXPERT_COMPUTE_STATS`, stacks
    in sorted order; empty without MoE layers that report them.
  """
  values: dict[str, dict[str, list[float]]] = {}
  for layer, stats in router.items():
    stack = layer.split("/")[0]
    for name in EXPERT_COMPUTE_STATS:
      if name in stats:
        values.setdefault(stack, {}).setdefault(name, []).append(
            float(stats[name]))
  return {stack: {name: float(np.mean(v)) for name, v in stats.items()}
          for stack, stats in sorted(values.items())}


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


def read_metrics(path: str | os.PathLike[str],
                 kind: str | None = None) -> list[dict[str, Any]]:
  """Records of a metrics.jsonl (optionally only one ``kind``), in order."""
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if kind is None or record.get("kind") == kind:
        out.append(record)
  return out


class Interval:
  """Accumulates per-step host values between two log lines."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.steps = 0
    self.ce_sum = 0.0
    self.objective_sum = 0.0
    self.target_tokens = 0.0
    self.source_tokens = 0.0
    self.seconds = 0.0
    self.cpu_seconds = 0.0

  def add(self, *, ce_sum: float, objective: float, target_tokens: float,
          source_tokens: float, seconds: float,
          cpu_seconds: float) -> None:
    self.steps += 1
    self.ce_sum += ce_sum
    self.objective_sum += objective
    self.target_tokens += target_tokens
    self.source_tokens += source_tokens
    self.seconds += seconds
    self.cpu_seconds += cpu_seconds

  def summary(self) -> dict[str, float]:
    steps = max(self.steps, 1)
    seconds = max(self.seconds, 1e-9)
    return {
        "train_ce": self.ce_sum / max(self.target_tokens, 1.0),
        "train_loss": self.objective_sum / steps,
        "step_time_sec": self.seconds / steps,
        "step_cpu_sec": self.cpu_seconds / steps,
        "tokens_per_sec": (self.source_tokens + self.target_tokens) / seconds,
        "target_tokens_per_sec": self.target_tokens / seconds,
    }


def format_eta(seconds: float) -> str:
  seconds = max(0, int(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s"


def log_console(record: Mapping[str, Any], *, train_steps: int) -> None:
  """One absl line per logging interval: step, losses, tokens/s and ETA."""
  eta = (train_steps - record["step"]) * record["step_time_sec"]
  logging.info(
      "step %d/%d  ce %.4f  loss %.4f  moe %.4f  lr %.3g  |g| %.3g  "
      "%.0f tok/s  %.3fs/step  skipped %d  ETA %s",
      record["step"], train_steps, record["train_ce"], record["train_loss"],
      record["moe_loss"], record["learning_rate"], record["grad_norm"],
      record["tokens_per_sec"], record["step_time_sec"],
      record["nonfinite_skipped"], format_eta(eta))


def now() -> float:
  return time.time()
