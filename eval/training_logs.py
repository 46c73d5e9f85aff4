"""Training cost (Table 3), tokens-to-cross-entropy (Table 2), router stats.

Works on the records of a training metrics log
(``<model_dir>/metrics.jsonl``, read by
:func:`m4moe.training.metrics_log.read_metrics`); a record counts as a
training record if its ``kind`` is ``train`` or absent and it has a
``step``. Fields used when present: ``step``,
``tokens_seen`` (or ``tokens``), ``train_ce``, ``time`` (Unix seconds),
``step_time_sec``, ``devices``, ``batch_tokens``, and ``router`` (layer ->
``RouterStats.as_dict()`` of the logged step: ``load_cv``,
``dropped_first``, ``dropped_second``, ``aux_loss``, ...). Eval records
(``kind`` = ``eval``) give the per-language teacher-forced dev
cross-entropy ``dev_ce`` ({lang: nats per target token}) and, from logs
written since the trainer measures it, ``source_reliance`` ({lang: dev CE
with each source replaced by another pair's minus the true dev CE}).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import statistics
from typing import Any, Sequence

_CKPT_STEP = re.compile(r"ckpt-(\d+)$")


@dataclasses.dataclass(frozen=True)
class TrainingCost:
  """One run's cost, like the paper's Table 3 (None = not in the log).

  Attributes:
    devices: devices (TPU cores in the paper; CPU replicas here).
    steps_per_sec: training steps per second.
    cpu_sec_per_step: the median CPU seconds (all threads) per step over
      the logged intervals; unlike steps/s not inflated by other work on a
      shared core (None: logged before the trainer recorded
      ``step_cpu_sec``).
    batch_tokens: tokens per batch.
    device_hours: devices x wall hours.
    wall_hours: first to last record.
    steps: last step: the end record's where the run ended, else the last
      logged training step (a run stops between its log lines).
    tokens: last tokens_seen.
    train_cpu_seconds: the CPU seconds its training steps used in all, from
      the end record (what ``--max_train_cpu_seconds`` budgets; None: the
      run has not ended, or ended before the trainer recorded it).
  """

  devices: int | None
  steps_per_sec: float | None
  cpu_sec_per_step: float | None
  batch_tokens: int | None
  device_hours: float | None
  wall_hours: float | None
  steps: int | None
  tokens: int | None
  train_cpu_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Stopping:
  """How a run ended (None = not in the log).

  Attributes:
    steps: the last step trained.
    stopped_by: the last ``end`` record's reason: ``train_steps``,
      ``early_stopping``, ``time_budget`` or ``preempted``.
    evaluations: dev evaluations logged.
    best_step: the step of the lowest token-weighted dev cross-entropy.
  """

  steps: int | None
  stopped_by: str | None
  evaluations: int
  best_step: int | None


def stopping(records: Sequence[dict]) -> Stopping:
  """How the run of ``records`` was sized: its stop and best evaluation."""
  ends = [r for r in records if r.get("kind") == "end"]
  evals = [r for r in records if r.get("kind") == "eval"
           and _num(r.get("dev_ce_mean")) is not None
           and _num(r.get("step")) is not None]
  train = _train_records(records)
  steps = [_num(r.get("step")) for r in (*train, *ends, *evals)]
  steps = [s for s in steps if s is not None]
  best = min(evals, key=lambda r: r["dev_ce_mean"]) if evals else None
  return Stopping(
      steps=int(max(steps)) if steps else None,
      stopped_by=str(ends[-1].get("stopped_by")) if ends else None,
      evaluations=len(evals),
      best_step=int(best["step"]) if best else None)


def _train_records(records: Sequence[dict]) -> list[dict]:
  return [r for r in records
          if r.get("kind", "train") == "train" and _num(r.get("step"))
          is not None]


def _num(value: Any) -> float | None:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  return float(value)


def _tokens(record: dict) -> float | None:
  value = _num(record.get("tokens_seen"))
  return value if value is not None else _num(record.get("tokens"))


def _steps_per_sec(train: Sequence[dict]) -> float | None:
  """Steady-state steps/s: the median over logging intervals.

  Each interval's rate is 1 / step_time_sec when logged, else its step and
  time deltas; the median ignores the first interval's compilation time.
  """
  rates = [1.0 / r["step_time_sec"] for r in train
           if (_num(r.get("step_time_sec")) or 0) > 0]
  if rates:
    return float(statistics.median(rates))
  timed = [(r["step"], r["time"]) for r in train
           if _num(r.get("time")) is not None]
  pairs = zip(timed, timed[1:])
  deltas = [(s2 - s1, t2 - t1) for (s1, t1), (s2, t2) in pairs
            if s2 > s1 and t2 > t1]
  if not deltas:
    return None
  return float(statistics.median(s / t for s, t in deltas))


def _cpu_sec_per_step(train: Sequence[dict]) -> float | None:
  values = [r["step_cpu_sec"] for r in train
            if _num(r.get("step_cpu_sec")) is not None]
  return float(statistics.median(values)) if values else None


def training_cost(records: Sequence[dict]) -> TrainingCost:
  """Summarises a run's metrics records."""
  train = _train_records(records)
  devices = [int(r["devices"]) for r in records if _num(r.get("devices"))]
  batch = [int(r["batch_tokens"]) for r in train
           if _num(r.get("batch_tokens"))]
  times = [r["time"] for r in records if _num(r.get("time")) is not None]
  wall = (max(times) - min(times)) / 3600 if len(times) >= 2 else None
  device_count = max(devices) if devices else None
  tokens = [_tokens(r) for r in train if _tokens(r) is not None]
  ends = [r for r in records
          if r.get("kind") == "end" and _num(r.get("step")) is not None]
  steps = [int(r["step"]) for r in train] + [int(r["step"]) for r in ends]
  cpu = [float(r["train_cpu_seconds"]) for r in ends
         if _num(r.get("train_cpu_seconds")) is not None]
  return TrainingCost(
      devices=device_count, steps_per_sec=_steps_per_sec(train),
      cpu_sec_per_step=_cpu_sec_per_step(train),
      batch_tokens=int(statistics.median(batch)) if batch else None,
      device_hours=(device_count * wall
                    if device_count and wall is not None else None),
      wall_hours=wall,
      steps=max(steps) if train else None,
      tokens=int(tokens[-1]) if tokens else None,
      train_cpu_seconds=cpu[-1] if cpu else None)


def tokens_to_reach(records: Sequence[dict],
                    thresholds: Sequence[float]) -> dict[float, int | None]:
  """Tokens seen when train_ce first fell to each threshold.

  None when the threshold was never reached or the log has no token counts.
  """
  out: dict[float, int | None] = {t: None for t in thresholds}
  for record in _train_records(records):
    ce = _num(record.get("train_ce"))
    if ce is None:
      continue
    tokens = _tokens(record)
    if tokens is None:
      continue
    for threshold in thresholds:
      if out[threshold] is None and ce <= threshold:
        out[threshold] = int(tokens)
  return out


def dev_ce_curve(records: Sequence[dict]) -> list[tuple[int, float]]:
  """(step, token-weighted dev CE over the languages) of each evaluation."""
  return [(int(r["step"]), float(r["dev_ce_mean"])) for r in records
          if r.get("kind") == "eval" and _num(r.get("dev_ce_mean")) is not None]


def steps_to_reach(curve: Sequence[tuple[float, float]],
                   target: float) -> float | None:
  """Where a (x, dev CE) curve first reaches ``target``.

  Linear between the two evaluations around the crossing; the first
  evaluation's x if it is already at or below ``target``; None if the curve
  never reaches it. x is a step or a cumulative cost (e.g.
  :func:`cpu_seconds_at`).
  """
  previous = None
  for x, ce in curve:
    if ce <= target:
      if previous is None or previous[1] == ce:
        return float(x)
      x0, c0 = previous
      return x0 + (x - x0) * (c0 - target) / (c0 - ce)
    previous = (x, ce)
  return None


def cpu_seconds_at(records: Sequence[dict]) -> dict[int, float] | None:
  """Cumulative training CPU seconds at each logged training step.

  Each logged interval's ``step_cpu_sec`` times its steps (evaluations and
  checkpoints excluded, so this is the training compute). None if any
  logged interval lacks ``step_cpu_sec`` (logs written before the trainer
  measured it), so a partial sum is never mistaken for the total. A run
  that ended after its last logged step (a budget stops it between log
  lines) adds its end step with the end record's ``train_cpu_seconds``,
  the trainer's own total (never below the logged sum, so the curve keeps
  rising).
  """
  out, total, last = {}, 0.0, 0
  for record in sorted(_train_records(records), key=lambda r: r["step"]):
    cpu = _num(record.get("step_cpu_sec"))
    if cpu is None:
      return None
    step = int(record["step"])
    total += cpu * (step - last)
    out[step], last = total, step
  ends = [r for r in records if r.get("kind") == "end"
          and _num(r.get("step")) is not None
          and _num(r.get("train_cpu_seconds")) is not None]
  if out and ends and int(ends[-1]["step"]) > last:
    out[int(ends[-1]["step"])] = max(total, float(
        ends[-1]["train_cpu_seconds"]))
  return out or None


def upcycled_from(records: Sequence[dict]) -> tuple[str, int] | None:
  """(source model directory name, its step) of an upcycled run, else None.

  From the ``warm_start`` of the run's first ``start`` record (a sparse
  upcycling: :func:`m4moe.moe.upcycle.start_record`), whose steps count
  from the upcycling.
  """
  starts = [r for r in records if r.get("kind") == "start"]
  warm = starts[0].get("warm_start") if starts else None
  if not isinstance(warm, dict) or warm.get("kind") != "upcycled":
    return None
  step = _num(warm.get("dense_step"))
  if step is None or not warm.get("init_from_dense"):
    return None
  return pathlib.PurePath(str(warm["init_from_dense"])).name, int(step)


def interpolate(curve: Sequence[tuple[float, float]], x: float
                ) -> float | None:
  """The curve's y at ``x`` (linear; None outside its x range)."""
  for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
    if x0 <= x <= x1:
      return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
  if curve and curve[-1][0] == x:
    return curve[-1][1]
  return None


@dataclasses.dataclass(frozen=True)
class RouterPoint:
  """Router statistics of one logged step, over the run's MoE layers.

  Attributes:
    step: training step.
    layers: MoE layers with statistics in the record.
    load_cv_mean, load_cv_max: coefficient of variation of the expert loads
      (0 = perfectly balanced), mean and max over layers.
    dropped_first, dropped_second: fractions of first/second choices that
      overflowed capacity, mean over layers (None if no layer logged it).
    aux_loss: the balancing loss E * sum_e f_e P_e (1.0 = uniform), mean.
  """

  step: int
  layers: int
  load_cv_mean: float | None
  load_cv_max: float | None
  dropped_first: float | None
  dropped_second: float | None
  aux_loss: float | None


def _mean(values: Sequence[float]) -> float | None:
  return float(statistics.fmean(values)) if values else None


def router_trajectory(records: Sequence[dict]) -> list[RouterPoint]:
  """One :class:`RouterPoint` per training record with router statistics."""
  points = []
  for record in _train_records(records):
    router = record.get("router")
    if not isinstance(router, dict) or not router:
      continue
    layers = [v for v in router.values() if isinstance(v, dict)]
    def values(key, layers=layers):
      return [float(v[key]) for v in layers if _num(v.get(key)) is not None]
    load_cv = values("load_cv")
    points.append(RouterPoint(
        step=int(record["step"]), layers=len(layers),
        load_cv_mean=_mean(load_cv),
        load_cv_max=max(load_cv) if load_cv else None,
        dropped_first=_mean(values("dropped_first")),
        dropped_second=_mean(values("dropped_second")),
        aux_loss=_mean(values("aux_loss"))))
  return points


def checkpoint_step(checkpoint: Any) -> int | None:
  """The step of a checkpoint path prefix ``.../ckpt-<step>`` (None: other)."""
  match = _CKPT_STEP.search(str(checkpoint or ""))
  return int(match.group(1)) if match else None


def final_dev_ce(records: Sequence[dict], *,
                 step: int | None = None) -> dict[str, float]:
  """Per-language dev cross-entropy of the scored step or the last evaluation.

  Args:
    records: a metrics log's records, in file order.
    step: the step of the checkpoint that was scored (e.g. the best dev
      evaluation, ``m4moe-eval --checkpoint=best``); its dev evaluation is
      used when the log has one, else the last.

  Returns:
    language -> ``dev_ce`` (nats per target token) of that ``eval`` record
    (the last one whose ``dev_ce`` is a non-empty mapping); non-numeric
    values are skipped. Empty if no eval record has per-language dev
    cross-entropies.
  """
  at_step = [r for r in records if r.get("kind") == "eval"
             and step is not None and _num(r.get("step")) == step]
  for record in reversed(at_step or records):
    dev_ce = record.get("dev_ce")
    if record.get("kind") != "eval" or not isinstance(dev_ce, dict):
      continue
    values = {lang: _num(ce) for lang, ce in dev_ce.items()}
    values = {lang: ce for lang, ce in values.items() if ce is not None}
    if values:
      return values
  return {}


@dataclasses.dataclass(frozen=True)
class SourceReliance:
  """Source reliance of a run's last dev evaluation.

  Attributes:
    step: the step of that evaluation (None if the log has none).
    values: language -> gap in nats per target token (non-numeric values
      skipped).
    logged: whether that record has the ``source_reliance`` key at all
      (older logs do not).
  """

  step: int | None
  values: dict[str, float]
  logged: bool


def final_source_reliance(records: Sequence[dict]) -> SourceReliance:
  """``source_reliance`` of the last ``eval`` record with a ``dev_ce``.

  The same evaluation :func:`final_dev_ce` reads, so both describe one
  checkpoint.
  """
  for record in reversed(records):
    dev_ce = record.get("dev_ce")
    if record.get("kind") != "eval" or not isinstance(dev_ce, dict):
      continue
    if not any(_num(v) is not None for v in dev_ce.values()):
      continue
    step = _num(record.get("step"))
    reliance = record.get("source_reliance")
    logged = isinstance(reliance, dict)
    values = {lang: float(v) for lang, v in (reliance or {}).items()
              if _num(v) is not None} if logged else {}
    return SourceReliance(step=None if step is None else int(step),
                          values=values, logged=logged)
  return SourceReliance(step=None, values={}, logged=False)


def sample_points(points: Sequence[RouterPoint], *,
                  count: int) -> list[RouterPoint]:
  """At most ``count`` points evenly spaced over the run, first and last kept."""
  if len(points) <= count:
    return list(points)
  picks = sorted({round(i * (len(points) - 1) / (count - 1))
                  for i in range(count)})
  return [points[i] for i in picks]
