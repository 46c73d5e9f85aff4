r"""The selection table of a dev-only recipe: candidates ranked on dev.

A screening recipe (``eval_split = "dev"``, e.g. ``study3_screen``) trains
each candidate once and scores it on dev only. This tool reads what each
finished run left in the run directory (its ``metrics.jsonl`` and its
``eval_dev/<run>.json``), or in ``--landed`` for runs landed from an
earlier run directory (:mod:`m4moe.pipeline.landing`), and writes one
table, ranked by the best token-weighted dev cross-entropy (the selection rule; dev BLEU is shown
beside it). Candidates still training or not started are listed as such,
so the table can be regenerated as runs land:

  python3 -m m4moe.pipeline.screening --recipe=study3_screen \
      --run_dir=runs/study3 --landed=results/study/v3/runs \
      --output=results/study/v3/screening

writes ``screening.md`` and ``screening.json`` under ``--output``. It never
reads a test split: the recipe has none.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe.eval import comparison
from m4moe.eval import dev_ranking
from m4moe.eval import results as results_lib
from m4moe.eval import training_logs
from m4moe.pipeline import curves as curves_lib
from m4moe.pipeline import equal_cost
from m4moe.pipeline import landing
from m4moe.pipeline import recipes as recipes_lib
from m4moe.training import metrics_log

# The resource thirds of the languages, high to low (the study's buckets).
_BUCKETS = tuple(b for b in comparison.BUCKETS if b != "all")


def _define_flags() -> None:
  """The tool's flags, defined only when it runs as a program.

  ``m4moe-run`` has a ``--recipe`` flag too; defining these at import would
  clash in any process that imports both modules (the library functions
  above are imported by tests and notebooks).
  """
  flags.DEFINE_string("recipe", "study3_screen",
                      "The dev-only recipe (name or .toml path).")
  flags.DEFINE_string("run_dir", None, "Where the recipe ran.")
  flags.DEFINE_string("landed", None, "Landed runs (m4moe.pipeline.landing, "
                      "e.g. results/study/v3/runs), read for candidates the "
                      "run directory has no training log of.")
  flags.DEFINE_string("output", None,
                      "Directory for screening.md and screening.json.")
  flags.DEFINE_list(
      "step_costs", [],
      "Step-cost files (what `m4moe-bench recipe_step --clock=cpu "
      "--step_recipe=RECIPE` prints; several are averaged): then each "
      "candidate is also read at equal measured cost, the largest number "
      "of reference steps every candidate reached "
      "(m4moe.pipeline.equal_cost), and ranked there.")
  flags.DEFINE_float(
      "ce_target", 3.2,
      "Dev CE whose cost the table compares: the steps and CPU seconds "
      "each candidate needed to first reach it (the equal-compute view).")


@dataclasses.dataclass(frozen=True)
class Candidate:
  """What one candidate run shows on dev (None: not measured yet)."""
  name: str
  run: str
  status: str  # "scored", "trained", "training", "not started"
  steps: int | None = None
  best_dev_ce: float | None = None
  best_step: int | None = None
  final_dev_ce: float | None = None
  dev_bleu: float | None = None
  dev_languages: int = 0
  executed_ffn_fraction: dict[str, float] | None = None
  steps_per_sec: float | None = None
  cpu_sec_per_step: float | None = None
  train_cpu_seconds: float | None = None
  num_params: int | None = None
  flags: tuple[str, ...] = ()
  steps_to_target: float | None = None
  cpu_sec_to_target: float | None = None
  bucket_dev_ce: dict[str, float] | None = None
  step_cost: float | None = None
  equal_cost_dev_ce: float | None = None


def _executed(records: Sequence[dict]) -> dict[str, float] | None:
  """Per stack, the mean executed expert FLOPs / dense FFN FLOPs of the
  last logged quarter of training."""
  rows = [r["expert_compute"] for r in records
          if r.get("kind", "train") == "train"
          and isinstance(r.get("expert_compute"), dict) and r["expert_compute"]]
  if not rows:
    return None
  tail = rows[-max(1, len(rows) // 4):]
  stacks = sorted({s for row in tail for s in row})
  return {s: statistics.fmean(row[s]["expert_flops_dense_fraction"]
                              for row in tail if s in row) for s in stacks}


def _dev_bleu(path: pathlib.Path) -> tuple[float | None, int]:
  if not path.is_file():
    return None, 0
  scored = [s.bleu for s in results_lib.read_eval_json(path).languages.values()
            if s.bleu is not None]
  return (statistics.fmean(scored) if scored else None), len(scored)


def resource_buckets(files: landing.RunFiles, runs: Sequence[str]
                     ) -> dict[str, str]:
  """Language -> ``high``/``mid``/``low``: terciles of the training pairs
  (:func:`m4moe.eval.comparison.tercile_bounds`, as the study reports
  bucket languages) over every language of ``runs``' dev eval JSONs that
  record them (so bilingual probes of one language each are bucketed
  among each other); {} while none has."""
  sizes: dict[str, int] = {}
  for run in runs:
    path = files.eval_dev(run)
    if not path.is_file():
      continue
    for lang, score in results_lib.read_eval_json(path).languages.items():
      if score.train_size is not None:
        sizes.setdefault(lang, score.train_size)
  if not sizes:
    return {}
  ordered = comparison.order_languages(sizes)
  bounds = comparison.tercile_bounds([sizes[l] for l in ordered])
  return {lang: bounds.bucket(sizes[lang]) for lang in ordered}


def _bucket_dev_ce(records: Sequence[dict], step: int | None,
                   buckets: dict[str, str]) -> dict[str, float] | None:
  """Token-weighted dev CE per bucket at the evaluation of ``step`` (the
  best checkpoint's), from its per-language ``dev_ce`` and ``dev_tokens``;
  None where the log has no per-language record there."""
  record = next((r for r in records if r.get("kind") == "eval"
                 and r.get("step") == step and isinstance(r.get("dev_ce"), dict)
                 and isinstance(r.get("dev_tokens"), dict)), None)
  if record is None or not buckets:
    return None
  out = {}
  for bucket in _BUCKETS:
    langs = [l for l, b in buckets.items() if b == bucket
             and l in record["dev_ce"] and record["dev_tokens"].get(l)]
    tokens = sum(float(record["dev_tokens"][l]) for l in langs)
    if tokens:
      out[bucket] = sum(float(record["dev_ce"][l]) *
                        float(record["dev_tokens"][l]) for l in langs) / tokens
  return out or None


def candidate(model: recipes_lib.ModelRun, run: str,
              files: landing.RunFiles, *, ce_target: float,
              buckets: dict[str, str] | None = None) -> Candidate:
  """The dev measurements of one run of ``model``; ``buckets`` (from
  :func:`resource_buckets`) adds the dev CE per bucket."""
  metrics = files.metrics(run)
  if not metrics.is_file():
    return Candidate(name=model.name, run=run, status="not started",
                     flags=model.extra_flags)
  records = metrics_log.read_metrics(metrics)
  # Steps and CPU seconds from the start of training (an upcycled run's
  # include its source's).
  curve = curves_lib.read_curve(files, run)
  points = list(curve.points)
  best = min(points, key=lambda point: point[1]) if points else (None, None)
  bleu, languages = _dev_bleu(files.eval_dev(run))
  done = files.train_record(run).is_file()
  start = [r for r in records if r.get("kind") == "start"]
  cost = training_logs.training_cost(records)
  source = training_logs.upcycled_from(records)
  cpu_per_step = cost.cpu_sec_per_step
  return Candidate(
      name=model.name, run=run,
      status="scored" if bleu is not None else (
          "trained" if done else "training"),
      steps=None if cost.steps is None else cost.steps + (
          source[1] if source else 0),
      best_dev_ce=best[1], best_step=best[0],
      final_dev_ce=points[-1][1] if points else None, dev_bleu=bleu,
      dev_languages=languages, executed_ffn_fraction=_executed(records),
      steps_per_sec=cost.steps_per_sec, cpu_sec_per_step=cpu_per_step,
      train_cpu_seconds=cost.train_cpu_seconds,
      num_params=start[0].get("num_params") if start else None,
      flags=model.extra_flags,
      bucket_dev_ce=_bucket_dev_ce(
          records, _own_step(best[0], source), buckets or {}),
      **_to_target(curve, ce_target, cpu_per_step=cpu_per_step))


def at_equal_cost(rows: Sequence[Candidate], files: landing.RunFiles,
                  costs: dict[str, float]
                  ) -> tuple[list[Candidate], float | None]:
  """``rows`` with their step cost and dev CE at the common budget of
  reference steps (:mod:`m4moe.pipeline.equal_cost`), and that budget."""
  curves = {row.name: list(curves_lib.read_curve(files, row.run).points)
            for row in rows if row.status != "not started"}
  finished = {name: curve for name, curve in curves.items()
              if any(r.name == name and r.status in ("scored", "trained")
                     for r in rows)}
  budget = equal_cost.common_budget(finished, costs)
  out = []
  for row in rows:
    cost = costs.get(row.name)
    value = (equal_cost.dev_ce_at(curves[row.name], cost=cost, budget=budget)
             if cost is not None and budget is not None
             and row.name in curves else None)
    out.append(dataclasses.replace(row, step_cost=cost,
                                   equal_cost_dev_ce=value))
  return out, budget


def _own_step(step: int | None, source: tuple[str, int] | None
              ) -> int | None:
  """The run's own log step of a curve step (an upcycled run's curve
  counts from its source's start; None for a step of the source's)."""
  if step is None or source is None:
    return step
  return step - source[1] if step > source[1] else None


def _to_target(curve: curves_lib.Curve, target: float, *,
               cpu_per_step: float | None) -> dict[str, float | None]:
  """Steps and CPU seconds to first reach ``target``: the cumulative CPU
  curve where the log has one, else the steps times the median CPU s/step
  (logs with CPU times for part of the run)."""
  steps = training_logs.steps_to_reach(curve.points, target)
  cpu_curve = curve.cpu_curve()
  if cpu_curve is not None:
    cpu = training_logs.steps_to_reach(cpu_curve, target)
  else:
    cpu = (steps * cpu_per_step
           if steps is not None and cpu_per_step is not None else None)
  return {"steps_to_target": steps, "cpu_sec_to_target": cpu}


def _cell(value: Any, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def _buckets_text(buckets: dict[str, str]) -> str:
  if not buckets:
    return ""
  parts = [f"{b}: {', '.join(l for l, x in buckets.items() if x == b) or '-'}"
           for b in _BUCKETS]
  return (" Dev CE high / mid / low: token-weighted over each third of the "
          "languages by training pairs, at the best checkpoint ("
          + "; ".join(parts) + ").")


def _equal_cost_text(budget: float | None) -> str:
  """The table's note on the equal-cost columns ('' without them)."""
  if budget is None:
    return ""
  return (" Ranked instead by the dev CE at equal measured cost: step cost "
          "= the candidate's training step over the reference's (the cost "
          "file's first model), measured interleaved in one process "
          "(`m4moe-bench recipe_step --clock=cpu`); each candidate's dev CE "
          f"read at {budget:,.0f} reference steps (its steps x its step "
          "cost), the most every finished candidate reached, linear between "
          "its evaluations. Unlike logged CPU seconds, this does not drift "
          "with the machine's speed while the candidates train.")


def markdown(recipe: recipes_lib.Recipe, rows: Sequence[Candidate], *,
             ce_target: float, buckets: dict[str, str] | None = None,
             budget: float | None = None) -> str:
  """The ranked table (best dev CE first, or with ``budget`` the dev CE at
  equal measured cost; unmeasured candidates last)."""
  lines = [f"# {recipe.name}: selection on dev", "",
           "Ranked by the best token-weighted dev cross-entropy over the "
           "recipe's languages (lower is better); dev BLEU is the mean over "
           "the languages scored (beam "
           f"{recipe.beam_size}, at most {recipe.eval_max_sentences} dev "
           "sentences each, at the best dev-CE checkpoint). Executed FFN = "
           "expert FLOPs actually executed per token over the dense FFN's "
           "(encoder / decoder means). CPU s/step = the trainer's median "
           "CPU seconds per step (all threads; a shared core's other work "
           "does not inflate it, unlike steps/s; it is the code of that run's "
           "time). Train CPU s = the CPU seconds all its training steps "
           "used (the end record's; a budget of equal CPU time, "
           "`--max_train_cpu_seconds`, stops each run at about the same "
           f"value). To CE {ce_target:g}: the step and the training CPU "
           "seconds (summed over the logged intervals; for runs with CPU "
           "times for part of training, the steps times the median) at "
           "which dev CE first reaches it, linear between evaluations: the "
           "equal-compute view. Steps and CPU seconds of an upcycled run "
           "include its source run's. Regenerate: `python3 -m "
           "m4moe.pipeline.screening --recipe=RECIPE --run_dir=RUN_DIR "
           f"[--landed=LANDED] --output=DIR --ce_target={ce_target:g}`."
           + _buckets_text(buckets or {}) + _equal_cost_text(budget), "",
           "| rank | candidate | status | steps | best dev CE (step) | final "
           "dev CE | dev CE high / mid / low | dev BLEU (langs) | executed "
           "FFN enc / dec | steps/s | "
           f"CPU s/step | train CPU s | steps to CE {ce_target:g} | CPU s to "
           f"CE {ce_target:g} | params |" + (
               " step cost | dev CE at equal cost |" if budget else ""),
           "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
           "---:|---:|" + ("---:|---:|" if budget else "")]
  key = ((lambda c: c.equal_cost_dev_ce) if budget
         else (lambda c: c.best_dev_ce))
  ranked = dev_ranking.best_first(rows, score=lambda c: (
      None if key(c) is None else (key(c),)))
  for rank, c in ranked:
    executed = ("-" if not c.executed_ffn_fraction else " / ".join(
        f"{v:.2f}" for v in c.executed_ffn_fraction.values()))
    best = ("-" if c.best_dev_ce is None
            else f"{c.best_dev_ce:.3f} ({c.best_step})")
    by_bucket = ("-" if not c.bucket_dev_ce else " / ".join(
        _cell(c.bucket_dev_ce.get(b), ".3f") for b in _BUCKETS))
    lines.append(
        f"| {rank} | {c.name} | {c.status} | {_cell(c.steps, 'd')} | {best} "
        f"| {_cell(c.final_dev_ce, '.3f')} | {by_bucket} "
        f"| {_cell(c.dev_bleu, '.2f')} "
        f"({c.dev_languages}) | {executed} | {_cell(c.steps_per_sec, '.3f')} "
        f"| {_cell(c.cpu_sec_per_step, '.3f')} "
        f"| {_cell(c.train_cpu_seconds, ',.0f')} "
        f"| {_cell(c.steps_to_target, '.0f')} "
        f"| {_cell(c.cpu_sec_to_target, ',.0f')} "
        f"| {_cell(c.num_params, ',d')} |" + (
            f" {_cell(c.step_cost, '.3f')} "
            f"| {_cell(c.equal_cost_dev_ce, '.3f')} |" if budget else ""))
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  if not values.run_dir or not values.output:
    raise app.UsageError("give --run_dir (where the recipe ran) and --output")
  try:
    recipe = recipes_lib.load_recipe(values.recipe)
  except recipes_lib.RecipeError as e:
    raise app.UsageError(str(e)) from None
  if recipe.eval_split != "dev":
    raise app.UsageError(f"--recipe={values.recipe} scores {recipe.eval_split}"
                         "; a selection table reads dev-only recipes")
  if values.ce_target <= 0:
    raise app.UsageError(f"--ce_target={values.ce_target}: give a dev "
                         "cross-entropy in nats, e.g. 3.2")
  run_dir = pathlib.Path(values.run_dir)
  landed = pathlib.Path(values.landed) if values.landed else None
  if not (run_dir / "models").is_dir() and not (landed and landed.is_dir()):
    raise app.UsageError(f"--run_dir={run_dir} holds no trained "
                         "candidate (no models/) and no --landed folder "
                         f"exists; run m4moe-run --recipe={values.recipe} "
                         "there first")
  files = landing.RunFiles(run_dir=run_dir, landed=landed)
  target = values.ce_target
  runs = [(model, run) for model in recipe.models for run, _ in model.runs()]
  buckets = resource_buckets(files, [run for _, run in runs])
  rows = [candidate(model, run, files, ce_target=target, buckets=buckets)
          for model, run in runs]
  budget = None
  if values.step_costs:
    try:
      costs = equal_cost.read_step_costs(
          [pathlib.Path(p) for p in values.step_costs])
    except (OSError, ValueError) as e:
      raise app.UsageError(f"--step_costs: {e}") from None
    unknown = sorted(set(costs) - {model.name for model in recipe.models})
    if unknown:
      raise app.UsageError(
          f"--step_costs: {', '.join(unknown)} are not candidates of "
          f"{recipe.name}; measure with m4moe-bench recipe_step "
          f"--step_recipe={values.recipe} and its model names")
    rows, budget = at_equal_cost(rows, files, costs)
  out = pathlib.Path(values.output)
  out.mkdir(parents=True, exist_ok=True)
  text = markdown(recipe, rows, ce_target=target, buckets=buckets,
                  budget=budget)
  (out / "screening.md").write_text(text, encoding="utf-8")
  (out / "screening.json").write_text(json.dumps(
      {"recipe": recipe.name, "selected_on": "dev", "ce_target": target,
       "buckets": buckets, "equal_cost_reference_steps": budget,
       "step_costs": list(values.step_costs),
       "candidates": [dataclasses.asdict(r) for r in rows]}, indent=1),
      encoding="utf-8")
  print(text)


if __name__ == "__main__":
  _define_flags()
  cli.run_tool(main, module=__name__)
