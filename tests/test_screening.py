"""m4moe.pipeline.screening: dev-only candidates ranked by best dev CE."""

import json
import subprocess
import sys

import pytest

from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.pipeline import landing
from m4moe.pipeline import recipes as recipes_lib
from m4moe.pipeline import screening
import recipe_fixtures

_RECIPE = recipe_fixtures.HEADER + '''eval_split = "dev"
[[models]]
name = "a"
config = "tiny/dense"
train_steps = 30
seeds = [1]
[[models]]
name = "b"
config = "tiny/moe"
train_steps = 30
seeds = [1]
[[models]]
name = "c"
config = "tiny/moe"
train_steps = 30
seeds = [1]
'''


def _run(run_dir, run, curve, *, bleu=None, fraction=None, cpu=None,
         per_language=None, sizes=None):
  model = run_dir / "models" / run
  model.mkdir(parents=True)
  records = [{"kind": "start", "step": 0, "num_params": 1000}]
  for step, ce in curve:
    train = {"kind": "train", "step": step, "step_time_sec": 0.5,
             "tokens_seen": step * 100}
    if cpu is not None:
      train["step_cpu_sec"] = cpu[step]
    if fraction is not None:
      train["expert_compute"] = {
          "decoder": {"expert_flops_dense_fraction": fraction[1]},
          "encoder": {"expert_flops_dense_fraction": fraction[0]}}
    evaluation = {"kind": "eval", "step": step, "dev_ce_mean": ce}
    if per_language is not None:
      evaluation["dev_ce"], evaluation["dev_tokens"] = per_language[step]
    records += [train, evaluation]
  (model / "metrics.jsonl").write_text(
      "\n".join(json.dumps(r) for r in records) + "\n")
  if bleu is not None:
    (run_dir / "stages").mkdir(exist_ok=True)
    (run_dir / "stages" / f"train_{run}.json").write_text("{}")
    languages = {lang: scoring.LanguageScore(
        language=lang, source_lang=lang, target_lang="en", num_segments=5,
        bleu=value, chrf=value, bleu_signature="s", chrf_signature="s",
        train_size=(sizes or {}).get(lang))
                 for lang, value in bleu.items()}
    results.write_eval_json(results.EvalResult(
        model=run, kind="multilingual", metadata={}, languages=languages),
        run_dir / "eval_dev" / f"{run}.json")


def test_candidates_rank_by_best_dev_ce(tmp_path):
  path = tmp_path / "screen.toml"
  path.write_text(_RECIPE)
  recipe = recipes_lib.load_recipe(str(path))
  run_dir = tmp_path / "run"
  # a: best 3.0 at step 20, then overfits; b: best 2.9 (final) and scored.
  _run(run_dir, "a_s1", [(10, 3.2), (20, 3.0), (30, 3.1)], bleu={"de": 10.0,
                                                               "fr": 14.0})
  _run(run_dir, "b_s1", [(10, 3.3), (20, 2.95), (30, 2.9)],
       bleu={"de": 12.0, "fr": 13.0}, fraction=(0.5, 0.75),
       cpu={10: 0.4, 20: 0.9, 30: 0.5})
  rows = [screening.candidate(m, run, landing.RunFiles(run_dir=run_dir), ce_target=2.96)
          for m in recipe.models for run, _ in m.runs()]
  by_name = {r.name: r for r in rows}
  assert (by_name["a"].best_dev_ce, by_name["a"].best_step) == (3.0, 20)
  assert by_name["a"].final_dev_ce == 3.1
  assert by_name["a"].dev_bleu == 12.0 and by_name["a"].dev_languages == 2
  assert by_name["b"].executed_ffn_fraction == {"decoder": 0.75,
                                                "encoder": 0.5}
  assert by_name["b"].steps_per_sec == 2.0
  # The median of the logged CPU seconds per step; none logged: unknown.
  assert by_name["b"].cpu_sec_per_step == 0.5
  assert by_name["a"].cpu_sec_per_step is None
  assert by_name["c"].status == "not started"
  # CE 2.96 is crossed by b between steps 10 (3.3) and 20 (2.95): step
  # 10 + 10 * 0.34 / 0.35; a never reaches it.
  assert by_name["b"].steps_to_target == pytest.approx(10 + 10 * 34 / 35)
  # Cumulative CPU: 10 x 0.4 = 4 s at step 10, 4 + 10 x 0.9 = 13 s at 20.
  assert by_name["b"].cpu_sec_to_target == pytest.approx(4 + 9 * 34 / 35)
  assert by_name["a"].steps_to_target is None
  table = screening.markdown(recipe, rows, ce_target=2.96)
  assert "steps to CE 2.96" in table
  lines = [l for l in table.splitlines() if l.startswith("| ")][1:]
  assert [l.split("|")[2].strip() for l in lines] == ["b", "a", "c"]


def test_a_run_stopped_by_its_cpu_budget_between_log_lines(tmp_path):
  # A run stopped by --max_train_cpu_seconds ends between its log lines:
  # its steps are the end record's, and its training CPU seconds are shown
  # so the table shows the budgets were equal.
  path = tmp_path / "screen.toml"
  path.write_text(_RECIPE)
  recipe = recipes_lib.load_recipe(str(path))
  run_dir = tmp_path / "run"
  _run(run_dir, "a_s1", [(10, 3.2), (20, 3.0)], bleu={"de": 10.0},
       cpu={10: 0.4, 20: 0.5})
  metrics = run_dir / "models" / "a_s1" / "metrics.jsonl"
  with metrics.open("a") as out:
    out.write(json.dumps({"kind": "eval", "step": 23, "dev_ce_mean": 2.9})
              + "\n" + json.dumps({"kind": "end", "step": 23,
                                   "stopped_by": "cpu_budget",
                                   "train_cpu_seconds": 10.25}) + "\n")
  files = landing.RunFiles(run_dir=run_dir)
  row = screening.candidate(recipe.models[0], "a_s1", files, ce_target=2.96)
  assert (row.steps, row.train_cpu_seconds) == (23, 10.25)
  assert (row.best_dev_ce, row.best_step) == (2.9, 23)
  table = screening.markdown(recipe, [row], ce_target=2.96)
  header, _, line = [l for l in table.splitlines() if l.startswith("|")]
  cells = dict(zip([c.strip() for c in header.split("|")],
                   [c.strip() for c in line.split("|")]))
  assert (cells["steps"], cells["train CPU s"]) == ("23", "10")


def test_the_tool_refuses_a_recipe_that_scores_test(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.screening", "--recipe=demo",
       f"--run_dir={tmp_path}", f"--output={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0
  assert "dev-only recipes" in proc.stderr
  assert not (tmp_path / "out").exists()


def test_the_tool_refuses_a_target_that_is_not_a_cross_entropy(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.screening",
       f"--run_dir={tmp_path}", f"--output={tmp_path / 'out'}",
       "--ce_target=-1"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0 and "--ce_target=-1.0" in proc.stderr
  assert not (tmp_path / "out").exists()


def test_the_tool_refuses_a_run_dir_without_candidates(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.screening",
       f"--run_dir={tmp_path / 'nowhere'}", f"--output={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0 and "holds no trained candidate" in proc.stderr
  assert not (tmp_path / "out").exists()


def test_dev_ce_per_resource_third_at_the_best_checkpoint(tmp_path):
  path = tmp_path / "screen.toml"
  path.write_text(_RECIPE)
  recipe = recipes_lib.load_recipe(str(path))
  run_dir = tmp_path / "run"
  # Six languages by training pairs: de, fr high; ru, ja mid; si, az low.
  sizes = {"de": 900, "fr": 800, "ru": 500, "ja": 400, "si": 90, "az": 80}
  tokens = {"de": 300, "fr": 100, "ru": 50, "ja": 50, "si": 10, "az": 30}
  best = {"de": 2.0, "fr": 3.0, "ru": 3.0, "ja": 4.0, "si": 5.0, "az": 3.0}
  later = {lang: ce + 1 for lang, ce in best.items()}
  _run(run_dir, "a_s1", [(10, 3.2), (20, 2.5), (30, 3.6)],
       bleu={lang: 10.0 for lang in sizes}, sizes=sizes,
       per_language={10: (later, tokens), 20: (best, tokens),
                     30: (later, tokens)})
  buckets = screening.resource_buckets(landing.RunFiles(run_dir=run_dir), ["b_s1", "a_s1"])
  assert buckets == {"de": "high", "fr": "high", "ru": "mid", "ja": "mid",
                     "si": "low", "az": "low"}
  row = screening.candidate(recipe.models[0], "a_s1", landing.RunFiles(run_dir=run_dir),
                            ce_target=3.0, buckets=buckets)
  # At step 20 (the best): high (2*300 + 3*100) / 400, mid (3*50 + 4*50)
  # / 100, low (5*10 + 3*30) / 40.
  assert row.bucket_dev_ce == pytest.approx(
      {"high": 2.25, "mid": 3.5, "low": 3.5})
  table = screening.markdown(recipe, [row], ce_target=3.0, buckets=buckets)
  assert "| 2.250 / 3.500 / 3.500 |" in table
  assert "high: de, fr; mid: ru, ja; low: si, az" in table
  # A log without per-language records has no bucket column values.
  _run(run_dir, "b_s1", [(10, 3.0)], bleu={"de": 1.0})
  plain = screening.candidate(recipe.models[1], "b_s1", landing.RunFiles(run_dir=run_dir),
                              ce_target=3.0, buckets=buckets)
  assert plain.bucket_dev_ce is None


def test_bilingual_probes_are_bucketed_among_each_other(tmp_path):
  # One language per run (a baseline probe per resource third): the thirds
  # come from all runs' languages, not from the first run's one language.
  run_dir = tmp_path / "run"
  for run, lang, size in [("ru_s1", "ru", 900), ("kk_s1", "kk", 300),
                          ("uz_s1", "uz", 30)]:
    _run(run_dir, run, [(10, 3.0)], bleu={lang: 10.0}, sizes={lang: size})
  files = landing.RunFiles(run_dir=run_dir)
  buckets = screening.resource_buckets(files, ["kk_s1", "ru_s1", "uz_s1"])
  assert buckets == {"ru": "high", "kk": "mid", "uz": "low"}
  # Before any but the first has a dev eval, the others' thirds are empty.
  only = screening.resource_buckets(files, ["ru_s1", "missing_s1"])
  assert only == {"ru": "high"}
  recipe_path = tmp_path / "screen.toml"
  recipe_path.write_text(_RECIPE)
  table = screening.markdown(recipes_lib.load_recipe(str(recipe_path)), [],
                             ce_target=3.0, buckets=only)
  assert "high: ru; mid: -; low: -" in table


def test_at_equal_measured_cost_the_ranking_can_turn(tmp_path):
  # b has the better dev CE at its end, but its step costs 1.5 of a's:
  # the most reference steps both reached is a's 30; there b is at its
  # step 20 (3.0), behind a (2.9). c has not started: no value, ranked
  # last.
  path = tmp_path / "screen.toml"
  path.write_text(_RECIPE)
  recipe = recipes_lib.load_recipe(str(path))
  run_dir = tmp_path / "run"
  _run(run_dir, "a_s1", [(10, 3.4), (20, 3.1), (30, 2.9)], bleu={"de": 1.0})
  _run(run_dir, "b_s1", [(10, 3.3), (20, 3.0), (30, 2.8)], bleu={"de": 1.0})
  files = landing.RunFiles(run_dir=run_dir)
  rows = [screening.candidate(m, run, files, ce_target=2.96)
          for m in recipe.models for run, _ in m.runs()]
  rows, budget = screening.at_equal_cost(rows, files,
                                         {"a": 1.0, "b": 1.5, "c": 1.2})
  assert budget == 30
  by_name = {r.name: r for r in rows}
  assert by_name["a"].equal_cost_dev_ce == pytest.approx(2.9)
  assert by_name["b"].equal_cost_dev_ce == pytest.approx(3.0)
  assert by_name["c"].equal_cost_dev_ce is None
  table = screening.markdown(recipe, rows, ce_target=2.96, budget=budget)
  assert "dev CE at equal cost" in table and "at 30 reference steps" in table
  lines = [l for l in table.splitlines() if l.startswith("| ")][1:]
  assert [l.split("|")[2].strip() for l in lines] == ["a", "b", "c"]
  # Without costs, the best dev CE ranks: b first.
  plain = screening.markdown(recipe, rows, ce_target=2.96)
  lines = [l for l in plain.splitlines() if l.startswith("| ")][1:]
  assert [l.split("|")[2].strip() for l in lines] == ["b", "a", "c"]


def test_the_tool_refuses_step_costs_of_another_recipe(tmp_path):
  path = tmp_path / "screen.toml"
  path.write_text(_RECIPE)
  run_dir = tmp_path / "run"
  _run(run_dir, "a_s1", [(10, 3.4), (20, 3.1)], bleu={"de": 1.0})
  costs = tmp_path / "costs.jsonl"
  costs.write_text("\n".join(json.dumps(line) for line in (
      {"benchmark": "recipe_step", "model": "a"},
      {"benchmark": "recipe_step", "model": "zz", "speed_vs_a": 0.9})) + "\n")
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.screening", f"--recipe={path}",
       f"--run_dir={run_dir}", f"--output={tmp_path / 'out'}",
       f"--step_costs={costs}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0
  assert "--step_costs: zz are not candidates of" in proc.stderr
  assert not (tmp_path / "out").exists()
