"""The study v2 recipe's plan: seeds, early stopping, out-of-domain test."""

import dataclasses
import subprocess
import sys

import pytest

from m4moe.pipeline import plan as main_job
from m4moe.pipeline import recipes as recipes_lib


def _flags(stage: main_job.Stage) -> dict[str, str]:
  return stage.flag_values()


def test_study_plan_trains_every_seed_and_reports_both_test_splits(tmp_path):
  recipe = recipes_lib.load_recipe("study")
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path / "c")
  by_name = {s.name: s for s in stages}
  assert len(by_name) == len(stages)
  assert [s.name for s in stages][-2:] == ["report", "report_ood"]
  assert _flags(by_name["corpus"])["ood_packages"] == "packaged"
  # The main comparison: dense and MoE of equal active FLOPs (same layers,
  # same config family), >= 3 seeds each, to early stopping on dev.
  experts = {}
  for model in recipe.models:
    assert len(model.seeds) >= 3
    seeds = set()
    for run, seed in model.runs():
      train = _flags(by_name[f"train_{run}"])
      assert train["model_dir"] == str(tmp_path / "models" / run)
      seeds.add(int(train["seed"]))
      assert int(train["early_stopping_patience"]) >= 2
      assert 0 < int(train["eval_every"]) * 4 <= int(train["train_steps"])
      experts[model.name] = model.config
      for out, split_name in (("eval", None), ("eval_ood", "test_ood")):
        evaluation = _flags(by_name[f"{out}_{run}"])
        assert evaluation["model_name"] == model.name  # seeds share a name
        assert evaluation.get("split") == split_name
        assert evaluation["output"] == str(tmp_path / out / f"{run}.json")
        assert evaluation["hypotheses_dir"] == str(tmp_path / out / run)
        assert evaluation["max_sentences"] == (
            "0" if split_name is None else
            str(recipe.ood_eval_max_sentences))
    assert seeds == set(model.seeds)
  assert sorted(m.config for m in recipe.models) == ["tiny/dense", "tiny/moe"]
  assert len({m.extra_flags for m in recipe.models}) == 1
  # Every model of the study trains with the same optimiser and dropout
  # (the comparison is about routing and data, not regularisation).
  baseline_flags = {b.extra_flags for b in recipe.baselines()}
  assert len(baseline_flags) == 1
  (baseline_extra,) = baseline_flags
  for flag in ("--dropout_rate=0.1", "--attention_dropout_rate=0.1"):
    assert flag in baseline_extra and flag in recipe.models[0].extra_flags
  assert not any(m.continue_from for m in recipe.models)
  for baseline in recipe.baselines():
    train = _flags(by_name[f"train_{baseline.name}"])
    assert int(train["early_stopping_patience"]) >= 1
    assert "seed" not in train
  for report, out in (("report", "eval"), ("report_ood", "eval_ood")):
    flags = _flags(by_name[report])
    runs = [run for m in recipe.models for run, _ in m.runs()]
    assert flags["models"].split(",") == [
        str(tmp_path / out / f"{run}.json") for run in runs]
    assert len(flags["baselines"].split(",")) == len(recipe.languages)
    assert flags["output_dir"] == str(tmp_path / report)
    # Every seed's training log, in the order of --models.
    logs = [tuple(item.split("=", 1)) for item in
            flags["training_logs"].split(",")]
    assert logs == [(m.name, str(tmp_path / "models" / run /
                                 "metrics.jsonl"))
                    for m in recipe.models for run, _ in m.runs()]


def test_recipes_without_seeds_or_ood_plan_as_before(tmp_path):
  recipe = recipes_lib.load_recipe("demo")
  names = [s.name for s in main_job.plan(recipe, run_dir=tmp_path,
                                         cache_dir=tmp_path / "c")]
  assert not any("ood" in n or "_s1" in n for n in names)
  assert "ood_packages" not in _flags(main_job.plan(
      recipe, run_dir=tmp_path, cache_dir=tmp_path)[0])


def test_seed_and_ood_validation_names_the_problem():
  with pytest.raises(ValueError, match="distinct non-negative"):
    recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1,
                      seeds=(1, 1))
  seeded = recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1,
                             seeds=(1, 2))
  assert seeded.runs() == (("m_s1", 1), ("m_s2", 2))
  clash = recipes_lib.ModelRun(name="m_s1", config="tiny/moe", train_steps=1)
  recipe = recipes_lib.load_recipe("smoke")
  with pytest.raises(ValueError, match="two runs share a directory name"):
    dataclasses.replace(recipe, models=(seeded, clash))
  with pytest.raises(ValueError, match="ood_test needs the packaged"):
    dataclasses.replace(recipe, ood_test=True)


def test_study_dry_run_shows_the_new_plan(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.run", "--recipe=study", "--dry_run",
       f"--run_dir={tmp_path / 'run'}"], capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  for text in ("--ood_packages=packaged", "train_moe_E8_L2_s3",
               "--split=test_ood", "report_ood", "--seed=2"):
    assert text in proc.stdout, text
  assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_study_runs_in_two_balanced_lanes(tmp_path):
  """Dense seeds on one core, MoE seeds on the other, baselines alternating;
  every eval stage in its model's lane, after its train stage."""
  recipe = recipes_lib.load_recipe("study")
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path / "c")
  train = {s.name.removeprefix("train_"): s.lane for s in stages
           if s.tool == "train"}
  assert {train[f"dense_L2_s{i}"] for i in (1, 2, 3)} == {0}
  assert {train[f"moe_E8_L2_s{i}"] for i in (1, 2, 3)} == {1}
  baseline_lanes = [train[f"bilingual_{lang}"] for lang in recipe.languages]
  assert baseline_lanes.count(0) == baseline_lanes.count(1) == 8
  assert baseline_lanes[:2] == [0, 1]  # the two largest languages split
  for index, stage in enumerate(stages):
    if stage.tool == "eval":
      run = stage.name.removeprefix("eval_").removeprefix("ood_")
      assert stage.lane == train[run], stage.name
      assert [s.name for s in stages[:index]].count(f"train_{run}") == 1
  blocks = main_job.parallel_blocks(stages)
  assert max(len(block) for block in blocks) == 2
