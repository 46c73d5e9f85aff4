r"""Dev CE curves of runs against a reference, at equal steps and CPU time.

A sparse model can lead a dense one at equal steps and still lose at equal
compute when its step costs more. This tool puts both views side by side
for runs of one run directory (``<run_dir>/models/<run>/metrics.jsonl``)
and, with ``--landed``, runs landed from earlier run directories
(:mod:`m4moe.pipeline.landing`):

* **equal steps**: each run's dev CE (token-weighted over the languages) at
  every evaluation, and its gap to the reference's at the same step;
* **equal CPU time**: each evaluation's cumulative training CPU seconds
  (the trainer's ``step_cpu_sec`` times the steps of each logged interval),
  and the gap to the reference's dev CE interpolated at the same CPU
  seconds. Runs logged before the trainer measured CPU time get no
  equal-CPU column rather than a partial one;
* **equal measured cost** (``--step_costs=RUN=RATIO``): the gap to the
  reference's dev CE at RATIO times the run's steps, RATIO being the run's
  step cost over the reference's as a benchmark measured it interleaved
  in one process (``m4moe-bench recipe_step --clock=cpu``). Logged CPU
  seconds carry whatever else the machine did while each run trained;
  an interleaved ratio does not.

Gaps are run minus reference (negative: the run is ahead). The runs must
have been trained by the same code for CPU seconds to compare; the table
names the runs without CPU times.

  python3 -m m4moe.pipeline.curves --run_dir=runs/study3 \
      --landed=results/study/v3/runs --runs=dense_lr4x_s1,moe_E64k8_every_lr4x_s1 \
      --reference=dense_lr4x_s1 --output=results/study/v3/curves/lr4x

writes ``curves.md``, ``curves.json`` and ``curves.png`` under ``--output``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe.eval import training_logs
from m4moe.pipeline import landing
from m4moe.training import metrics_log


def _define_flags() -> None:
  """Defined only when the tool runs (other CLIs share these names)."""
  flags.DEFINE_string("run_dir", None, "Where the recipe ran (models/).")
  flags.DEFINE_string("landed", None, "Landed runs (m4moe.pipeline.landing, "
                      "e.g. results/study/v3/runs), read for runs the run "
                      "directory lacks.")
  flags.DEFINE_list("runs", [], "Runs to compare (model directory names, "
                    "e.g. dense_s1), reference included.")
  flags.DEFINE_string("reference", None, "The run the gaps are taken to.")
  flags.DEFINE_string("output", None,
                      "Directory for curves.md, curves.json, curves.png.")
  flags.DEFINE_list("step_costs", [],
                    "RUN=RATIO pairs: a run's step cost over the "
                    "reference's, measured interleaved (m4moe-bench "
                    "recipe_step); adds the gap at equal measured cost, "
                    "the reference read at RATIO times the run's steps.")


@dataclasses.dataclass(frozen=True)
class Curve:
  """One run's dev CE per evaluation.

  Attributes:
    run: the model directory name.
    points: (step, dev CE) per evaluation, in step order.
    cpu_seconds: cumulative training CPU seconds at each evaluation's step
      (None: the log lacks CPU times).
  """

  run: str
  points: tuple[tuple[int, float], ...]
  cpu_seconds: tuple[float, ...] | None

  def cpu_curve(self) -> list[tuple[float, float]] | None:
    if self.cpu_seconds is None:
      return None
    return [(c, ce) for c, (_, ce) in zip(self.cpu_seconds, self.points)]


def _own_curve(path: pathlib.Path
               ) -> tuple[list[tuple[int, float]], list[float] | None,
                          list[dict]]:
  """(dev CE points, cumulative CPU seconds at them, records) of one log."""
  records = metrics_log.read_metrics(path)
  points = training_logs.dev_ce_curve(records)
  cpu = training_logs.cpu_seconds_at(records)
  if cpu is None:
    return points, None, records
  cpu_curve = [(0.0, 0.0)] + [(float(s), cpu[s]) for s in sorted(cpu)]
  values = [training_logs.interpolate(cpu_curve, float(step))
            for step, _ in points]
  return points, (None if None in values else values), records


def read_curve(files: landing.RunFiles, run: str) -> Curve:
  """The run's curve from its metrics log (in the run directory, or landed).

  An upcycled run (:func:`training_logs.upcycled_from`) counts its steps
  from the upcycling; its curve is continued from its source run's up to
  the upcycled step, with steps and CPU seconds counted from the source's
  start, so it compares with runs trained from scratch.

  Raises:
    FileNotFoundError: the run (or an upcycled run's source) has no
      ``metrics.jsonl``, naming the path.
  """
  path = files.metrics(run)
  if not path.is_file():
    where = f" or landed in {files.landed}" if files.landed else ""
    raise FileNotFoundError(f"{path} does not exist: is {run!r} a run of "
                            f"{files.run_dir}{where} (its models/ directory "
                            "names)?")
  points, cpu, records = _own_curve(path)
  source = training_logs.upcycled_from(records)
  if source is None:
    return Curve(run=run, points=tuple(points),
                 cpu_seconds=None if cpu is None else tuple(cpu))
  before = read_curve(files, source[0])
  offset = source[1]
  head = [(s, ce) for s, ce in before.points if s <= offset]
  joined_cpu = None
  if before.cpu_seconds is not None and cpu is not None:
    source_cpu = [(0.0, 0.0)] + [(float(s), c) for (s, _), c in
                                 zip(before.points, before.cpu_seconds)]
    cpu_offset = training_logs.interpolate(source_cpu, float(offset))
    if cpu_offset is not None:
      joined_cpu = tuple(list(before.cpu_seconds[:len(head)]) +
                         [c + cpu_offset for c in cpu])
  return Curve(run=run,
               points=tuple(head + [(s + offset, ce) for s, ce in points]),
               cpu_seconds=joined_cpu)


def _gap(value: float | None, reference: float | None) -> float | None:
  return None if value is None or reference is None else value - reference


def compare(curves: Sequence[Curve], reference: Curve,
            step_costs: Mapping[str, float] | None = None) -> dict[str, Any]:
  """Per run and evaluation: dev CE, gap at equal steps and at equal CPU,
  and for runs in ``step_costs`` ({run: step cost over the reference's})
  the gap at equal measured cost."""
  step_costs = dict(step_costs or {})
  ref_steps = [(float(s), ce) for s, ce in reference.points]
  ref_cpu = reference.cpu_curve()
  out: dict[str, Any] = {"reference": reference.run, "runs": {},
                         "step_costs": step_costs}
  for curve in curves:
    rows = []
    ratio = step_costs.get(curve.run)
    for i, (step, ce) in enumerate(curve.points):
      cpu = curve.cpu_seconds[i] if curve.cpu_seconds else None
      ref_at_cpu = (training_logs.interpolate(ref_cpu, cpu)
                    if ref_cpu is not None and cpu is not None else None)
      row = {"step": step, "dev_ce": ce, "cpu_seconds": cpu,
             "gap_equal_steps": _gap(
                 ce, training_logs.interpolate(ref_steps, float(step))),
             "gap_equal_cpu": _gap(ce, ref_at_cpu)}
      if step_costs:
        row["gap_equal_cost"] = None if ratio is None else _gap(
            ce, training_logs.interpolate(ref_steps, step * ratio))
      rows.append(row)
    out["runs"][curve.run] = rows
  return out


def parse_step_costs(values: Sequence[str], runs: Sequence[str]
                     ) -> dict[str, float]:
  """{run: ratio} from ``--step_costs`` RUN=RATIO items.

  Raises:
    ValueError: an item that is not RUN=RATIO with a positive RATIO, or
      a RUN not among ``runs``, naming the item and the fix.
  """
  out = {}
  for item in values:
    run, sep, text = item.partition("=")
    try:
      ratio = float(text) if sep else float("nan")
    except ValueError:
      ratio = float("nan")
    if not ratio > 0:
      raise ValueError(f"--step_costs: {item!r} is not RUN=RATIO with a "
                       "positive RATIO (e.g. moe_s1=1.21)")
    if run not in runs:
      raise ValueError(f"--step_costs names {run!r}, which is not one of "
                       f"--runs={','.join(runs)}: list it there too")
    out[run] = ratio
  return out


def _fmt(value: float | None, spec: str) -> str:
  return "-" if value is None else format(value, spec)


def _legend(comparison: dict[str, Any]) -> list[str]:
  """The paragraph that says how to read the tables."""
  ref = comparison["reference"]
  costs = comparison.get("step_costs") or {}
  text = ("Gap = run minus reference (negative: the run is ahead); at "
          "equal CPU time the reference's dev CE is interpolated at the "
          "run's cumulative training CPU seconds ('-': outside the "
          "reference's range, or no CPU times logged).")
  flag = ""
  if costs:
    given = ", ".join(f"{run} {ratio:g}x" for run, ratio in costs.items())
    text += (" At equal measured cost it is read at the run's steps times "
             "the run's step cost over the reference's, measured "
             f"interleaved ({given}).")
    flag = " --step_costs=" + ",".join(f"{r}={v:g}" for r, v in costs.items())
  return [text + " Regenerate: `python3 -m m4moe.pipeline.curves "
          "--run_dir=RUN_DIR [--landed=LANDED] --runs=... "
          f"--reference={ref}{flag} --output=DIR`.", ""]


def markdown(comparison: dict[str, Any]) -> str:
  """One table per run: step, CPU s, dev CE, the gaps."""
  ref = comparison["reference"]
  costs = bool(comparison.get("step_costs"))
  lines = [f"# Dev CE against {ref}: equal steps and equal CPU time", "",
           *_legend(comparison)]
  without = [run for run, rows in comparison["runs"].items()
             if rows and all(r["cpu_seconds"] is None for r in rows)]
  if without:
    lines += [f"Without CPU times (logged before the trainer measured them, "
              f"or only for part of training): {', '.join(without)}.", ""]
  header = ("| step | CPU s | dev CE | gap at equal steps | gap at equal "
            "CPU |" + (" gap at equal measured cost |" if costs else ""))
  for run, rows in comparison["runs"].items():
    if run == ref:
      continue
    lines += [f"## {run}", "", header,
              "|---:|---:|---:|---:|---:|" + ("---:|" if costs else "")]
    for r in rows:
      cost = (f" {_fmt(r['gap_equal_cost'], '+.3f')} |" if costs else "")
      lines.append(
          f"| {r['step']} | {_fmt(r['cpu_seconds'], ',.0f')} | "
          f"{r['dev_ce']:.3f} | {_fmt(r['gap_equal_steps'], '+.3f')} | "
          f"{_fmt(r['gap_equal_cpu'], '+.3f')} |{cost}")
    lines.append("")
  return "\n".join(lines)


def save_figure(curves: Sequence[Curve], path: pathlib.Path) -> None:
  """Two panels: dev CE against steps and against CPU seconds."""
  # pylint: disable=g-import-not-at-top
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  figure = Figure(figsize=(10, 4))
  FigureCanvasAgg(figure)
  by_steps, by_cpu = figure.subplots(1, 2, sharey=True)
  for curve in curves:
    by_steps.plot([s for s, _ in curve.points],
                  [ce for _, ce in curve.points], marker=".", label=curve.run)
    cpu = curve.cpu_curve()
    if cpu is not None:
      by_cpu.plot([c for c, _ in cpu], [ce for _, ce in cpu], marker=".",
                  label=curve.run)
  by_steps.set(xlabel="training steps", ylabel="dev CE (nats/token)")
  by_cpu.set(xlabel="training CPU seconds")
  by_steps.legend(fontsize="small")
  figure.tight_layout()
  figure.savefig(str(path), format="png", dpi=110)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  if not (values.run_dir and values.runs and values.reference
          and values.output):
    raise app.UsageError("give --run_dir, --runs, --reference and --output")
  if values.reference not in values.runs:
    raise app.UsageError(f"--reference={values.reference} is not one of "
                         f"--runs={','.join(values.runs)}: list it there too")
  try:
    step_costs = parse_step_costs(values.step_costs, values.runs)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  files = landing.RunFiles(
      run_dir=pathlib.Path(values.run_dir),
      landed=pathlib.Path(values.landed) if values.landed else None)
  try:
    curves = [read_curve(files, run) for run in values.runs]
  except FileNotFoundError as e:
    raise app.UsageError(str(e)) from None
  reference = curves[values.runs.index(values.reference)]
  comparison = compare(curves, reference, step_costs)
  out = pathlib.Path(values.output)
  out.mkdir(parents=True, exist_ok=True)
  text = markdown(comparison)
  (out / "curves.md").write_text(text + "\n", encoding="utf-8")
  (out / "curves.json").write_text(json.dumps(comparison, indent=1) + "\n",
                                   encoding="utf-8")
  save_figure(curves, out / "curves.png")
  print(text)


if __name__ == "__main__":
  _define_flags()
  cli.run_tool(main, module=__name__)
