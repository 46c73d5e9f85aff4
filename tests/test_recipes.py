"""Recipe files (configs/recipes/*.toml) and their loader."""

import pathlib

import pytest

from m4moe.pipeline import plan as plan_lib
from m4moe.pipeline import recipes as recipes_lib
import recipe_fixtures

_MINIMAL = recipe_fixtures.MINIMAL


def _stage_commands(run_dir, names):
  """``{recipe: {stage: its command without the interpreter}}``."""
  return {
      name: {stage.name: stage.command()[1:] for stage in plan_lib.plan(
          recipes_lib.load_recipe(name), run_dir=run_dir,
          cache_dir=run_dir / "cache")}
      for name in names}


def test_packaged_recipes_are_the_documented_ones():
  assert recipes_lib.packaged_names() == [
      "demo", "demo_pypi", "smoke", "study", "study3", "study3_baselines",
      "study3_screen", "study4", "study4_screen"]


def _flag(model, name: str) -> str | None:
  """The value of ``--name=...`` in a model's extra_flags (None: absent)."""
  values = [f.split("=", 1)[1] for f in model.extra_flags
            if f.startswith(f"--{name}=")]
  assert len(values) <= 1, (model.name, name, values)
  return values[0] if values else None


def test_study4_screen_compares_at_equal_cpu_time_on_study3_data(tmp_path):
  # Study v4 selects at equal training CPU seconds, not equal steps: every
  # candidate has the same CPU budget and a step cap it never reaches
  # (20000 steps would take hours), the dense side and the MoE side get
  # the same number of candidates, and the data is the confirmation's
  # (same corpus and vocabulary commands as study3), read on dev only.
  screen = recipes_lib.load_recipe("study4_screen")
  assert screen.eval_split == "dev" and not screen.ood_test
  assert {_flag(m, "max_train_cpu_seconds") for m in screen.models} == {
      "1500"}
  assert all(m.train_steps >= 10 * 1500 for m in screen.models)
  assert all(m.early_stopping_patience == 0 for m in screen.models)
  families = [m.config for m in screen.models]
  assert families.count("tiny/dense") == families.count("tiny/moe") == 3
  # Every MoE candidate executes the dense FFN's 512 hidden units.
  for model in screen.models:
    if model.config == "tiny/moe":
      assert int(_flag(model, "num_selected_experts")) * int(
          _flag(model, "expert_hidden_dim")) == 512, model.name
  commands = _stage_commands(tmp_path, ("study3", "study4_screen"))
  for stage in ("corpus", "vocab"):
    assert commands["study3"][stage] == commands["study4_screen"][stage]
  assert not any("--split=test" in " ".join(command)
                 for command in commands["study4_screen"].values())


def test_study3_confirmation_dense_is_the_baselines_recipes_dense(tmp_path):
  # Seed 1 of the confirmation's dense model is copied from
  # study3_baselines (restore --from_run_dir --recipe=study3), which
  # requires the same training command, and the same corpus and vocab.
  commands = _stage_commands(tmp_path, ("study3", "study3_baselines"))
  # The ru baseline is the probe that chose the high third's recipe.
  for stage in ("corpus", "vocab", "train_dense_lr4x_ffn8th_s1",
                "train_bilingual_ru_lr4x_ffn8th_s1"):
    assert commands["study3"][stage] == commands["study3_baselines"][stage]
  confirm = {m.name: m for m in recipes_lib.load_recipe("study3").models}
  # The bilingual baselines keep study v2's recipe (early stopping on dev
  # CE within 3000 steps), one per high-resource language.
  baselines = {name: confirm.pop(name) for name in list(confirm)
               if confirm[name].bilingual}
  assert sorted(m.languages[0] for m in baselines.values()) == sorted(
      ["pt", "de", "ru", "ja", "fi", "ar"])
  assert all(m.train_steps == 3000 and m.early_stopping_patience == 3
             for m in baselines.values())
  # Every confirmation model trains the same fixed budget (equal steps),
  # but the continuations of the same runs: the dense model's to the MoE's
  # CPU time, and the longer budget's pair, whose steps keep that ratio.
  equal_cpu = confirm.pop("dense_lr4x_ffn8th_eqcpu")
  moe_long = confirm.pop("moe_E64k8_every_outqtr_lr4x_long")
  dense_long = confirm.pop("dense_lr4x_ffn8th_eqcpu_long")
  assert moe_long.continue_from == "moe_E64k8_every_outqtr_lr4x"
  assert dense_long.continue_from == "dense_lr4x_ffn8th_eqcpu"
  # The MoE step's measured cost, 1.21x the dense step's
  # (results/study/v3/bench/): each dense continuation is within one
  # evaluation interval of the MoE's CPU time.
  for dense, moe_steps in ((equal_cpu, 3000), (dense_long, 6000)):
    assert abs(dense.train_steps - 1.21 * moe_steps) <= dense.eval_every
  assert moe_long.train_steps == 6000
  assert {m.train_steps for m in confirm.values()} == {3000}
  assert all(m.early_stopping_patience == 0 for m in confirm.values())
  assert equal_cpu.continue_from == "dense_lr4x_ffn8th"
  assert equal_cpu.train_steps == 3600
  assert equal_cpu.seeds == confirm["dense_lr4x_ffn8th"].seeds
  stages = {s.name: s for s in plan_lib.plan(
      recipes_lib.load_recipe("study3"), run_dir=tmp_path,
      cache_dir=tmp_path / "cache")}
  assert (f"--continue_from={tmp_path / 'models' / 'dense_lr4x_ffn8th_s2'}"
          in stages["train_dense_lr4x_ffn8th_eqcpu_s2"].args)


def test_demo_recipe_values_come_from_its_file():
  recipe = recipes_lib.load_recipe("demo")
  assert recipe.languages == ("pt", "kk", "si", "ia")
  assert recipe.models[0].max_train_seconds == 1200.0
  baselines = {b.languages[0]: b for b in recipe.baselines()}
  assert baselines["si"].lane == 0 and baselines["pt"].lane == 1
  assert baselines["ia"].max_train_seconds == 370.0
  assert "--dropout_rate=0.1" in baselines["kk"].extra_flags
  assert "--dropout_rate=0.1" not in baselines["pt"].extra_flags


def test_a_recipe_file_by_path_plans_like_a_packaged_one(tmp_path):
  path = tmp_path / "mini.toml"
  path.write_text(_MINIMAL)
  recipe = recipes_lib.load_recipe(str(path))
  stages = plan_lib.plan(recipe, run_dir=tmp_path / "r", cache_dir=tmp_path)
  assert [s.name for s in stages] == [
      "corpus", "vocab", "train_m", "eval_m", "report"]
  assert "--train_steps=3" in stages[2].args


@pytest.mark.parametrize("extra, message", [
    ("trian_steps = 3\n", "unknown key(s) ['trian_steps']"),
    ("batch_tokens = \"many\"\n", "batch_tokens: expected int"),
    ("[baselines.pt]\nlane = 1\n", "need a [baseline]"),
])
def test_bad_recipe_files_name_file_and_key(tmp_path, extra, message):
  path = tmp_path / "bad.toml"
  lines = _MINIMAL.replace("batch_tokens = 512\n", "")
  if "batch_tokens" not in extra:
    lines = lines.replace("beam_size = 2\n", "beam_size = 2\nbatch_tokens = 512\n")
  head, _, models = lines.partition("[[models]]")
  path.write_text(head + extra + "[[models]]" + models)
  with pytest.raises(recipes_lib.RecipeError) as error:
    recipes_lib.load_recipe(str(path))
  assert str(path) in str(error.value) and message in str(error.value)


def test_an_unknown_recipe_lists_the_packaged_ones():
  with pytest.raises(recipes_lib.RecipeError, match=r"demo.*smoke.*study"):
    recipes_lib.load_recipe("demoo")


def test_a_file_that_is_not_toml_is_named(tmp_path):
  path = tmp_path / "broken.toml"
  path.write_text("name = \n")
  with pytest.raises(recipes_lib.RecipeError, match="not a valid TOML"):
    recipes_lib.load_recipe(str(path))


def test_recipe_validation_errors_carry_the_file(tmp_path):
  path = tmp_path / "dup.toml"
  path.write_text(_MINIMAL + '[[models]]\nname = "m"\nconfig = "tiny/dense"\n'
                  'train_steps = 1\n')
  with pytest.raises(recipes_lib.RecipeError, match=r"dup.toml.*repeats"):
    recipes_lib.load_recipe(str(path))


def test_a_dev_only_recipe_never_reads_a_test_split(tmp_path):
  path = tmp_path / "screen.toml"
  path.write_text(_MINIMAL.replace("beam_size = 2\n",
                                   'beam_size = 2\neval_split = "dev"\n'))
  stages = plan_lib.plan(recipes_lib.load_recipe(str(path)),
                         run_dir=tmp_path / "r", cache_dir=tmp_path)
  evals = [s for s in stages if s.tool == "eval"]
  assert [s.name for s in evals] == ["eval_dev_m"]
  assert all("--split=dev" in s.args for s in evals)
  assert stages[-1].name == "report_dev"
  args = [arg.replace(str(tmp_path), "") for s in stages[1:] for arg in s.args]
  assert not [arg for arg in args if "test" in arg], "a test split is named"


def test_a_dev_only_recipe_refuses_the_ood_test(tmp_path):
  path = tmp_path / "screen.toml"
  path.write_text(_MINIMAL.replace(
      "beam_size = 2\n", 'beam_size = 2\neval_split = "dev"\nood_test = true\n'
  ).replace("use_packaged_corpus_recipe = false",
            "use_packaged_corpus_recipe = true"))
  with pytest.raises(recipes_lib.RecipeError, match="reads no test split"):
    recipes_lib.load_recipe(str(path))


def test_ood_holdout_builds_the_ood_test_corpus_without_decoding_it(tmp_path):
  """A dev-only recipe with ood_holdout trains on the data of a recipe with
  ood_test (the same corpus command) and still reads no test split."""
  packaged = _MINIMAL.replace("use_packaged_corpus_recipe = false",
                              "use_packaged_corpus_recipe = true")
  commands = {}
  for name, extra in (("held", 'eval_split = "dev"\nood_holdout = true\n'),
                      ("report", "ood_test = true\n")):
    path = tmp_path / f"{name}.toml"
    path.write_text(packaged.replace("beam_size = 2\n",
                                     f"beam_size = 2\n{extra}"))
    stages = plan_lib.plan(recipes_lib.load_recipe(str(path)),
                           run_dir=tmp_path / "r", cache_dir=tmp_path)
    commands[name] = stages
  assert commands["held"][0].args == commands["report"][0].args
  assert "--ood_packages=packaged" in commands["held"][0].args
  held = [s for s in commands["held"] if s.tool == "eval"]
  assert [s.name for s in held] == ["eval_dev_m"]
  assert "eval_ood_m" in [s.name for s in commands["report"]]


def test_ood_holdout_needs_the_packaged_corpus(tmp_path):
  path = tmp_path / "fixture.toml"
  path.write_text(_MINIMAL.replace("beam_size = 2\n",
                                   "beam_size = 2\nood_holdout = true\n"))
  with pytest.raises(recipes_lib.RecipeError,
                     match="ood_holdout needs the packaged corpus recipe"):
    recipes_lib.load_recipe(str(path))


def test_study4_confirms_the_selection_at_its_equal_cost(tmp_path):
  # The confirmation trains each side's rank 1 of the committed selection
  # to the cost it was ranked at: the dense model the common budget of
  # reference steps, the MoE that budget over its measured step cost
  # (the committed interleaved measurements), as fixed step budgets; the
  # rest of each training command is the screen's, on the same data.
  import json  # pylint: disable=g-import-not-at-top
  from m4moe.pipeline import equal_cost  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[1] / "results/study/v4"
  table = json.loads((root / "screening/screening.json").read_text())
  budget = table["equal_cost_reference_steps"]
  costs = equal_cost.read_step_costs(
      [root / "bench/step_costs_a.jsonl", root / "bench/step_costs_b.jsonl"])
  ranked = sorted((c for c in table["candidates"]
                   if c["equal_cost_dev_ce"] is not None),
                  key=lambda c: c["equal_cost_dev_ce"])
  screen = {m.name: m for m in recipes_lib.load_recipe("study4_screen").models}
  best = {side: next(c["name"] for c in ranked
                     if screen[c["name"]].config == side)
          for side in ("tiny/dense", "tiny/moe")}
  confirm = {m.name: m for m in recipes_lib.load_recipe("study4").models}
  assert sorted(confirm) == sorted(best.values())
  for name, model in confirm.items():
    assert list(model.seeds) == [1, 2, 3]
    assert abs(model.train_steps - budget / costs[name]) <= 1, name
    assert list(model.extra_flags) == [
        f for f in screen[name].extra_flags
        if not f.startswith("--max_train_cpu_seconds=")]
  commands = _stage_commands(tmp_path, ("study4_screen", "study4"))
  for stage in ("corpus", "vocab"):
    assert commands["study4"][stage] == commands["study4_screen"][stage]
