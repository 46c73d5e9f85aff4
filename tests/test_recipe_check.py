"""A recipe is checked whole before its first stage (m4moe.pipeline.
recipe_check): a bad zoo config, tool flag, language or output directory
fails at once, naming the recipe file, the model and the fix, and nothing
runs."""

import subprocess
import sys

import pytest

from m4moe.pipeline import plan as plan_lib
from m4moe.pipeline import recipe_check
from m4moe.pipeline import recipes as recipes_lib
import recipe_fixtures


def _check(tmp_path, text, **kwargs):
  path = tmp_path / "r.toml"
  path.write_text(text)
  recipe = recipes_lib.load_recipe(path)
  run_dir = kwargs.pop("run_dir", tmp_path / "run")
  stages = plan_lib.plan(recipe, run_dir=run_dir, cache_dir=tmp_path / "c")
  recipe_check.check_recipe(recipe, source=path, stages=stages,
                            run_dir=run_dir, cache_dir=tmp_path / "c",
                            **kwargs)
  return path


def test_unknown_zoo_config_fails_before_the_corpus_stage(tmp_path):
  recipe = tmp_path / "typo.toml"
  recipe.write_text(recipe_fixtures.MINIMAL.replace('"tiny/moe"',
                                                    '"tiny/moee"'))
  run_dir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.run", f"--recipe={recipe}",
       f"--run_dir={run_dir}", "--stop_after=corpus"],
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
  [line] = [l for l in result.stderr.splitlines() if "error:" in l]
  assert line.startswith(f"m4moe-run: error: {recipe}: model 'm': config = "
                         "'tiny/moee': ")
  assert "one of: " in line and "tiny/moe," in line  # the fix: real entries
  assert line.endswith("Nothing was run")
  assert "[stage 1/" not in result.stdout
  assert not run_dir.exists()  # no corpus, no fixtures, no stage record


TRAIN_PROBLEMS = [
    # An unknown flag: named, with absl's suggestion.
    ('extra_flags = ["--d_model=32", "--d_modl=8"]',
     "model 'm': extra_flags entry '--d_modl=8' is not a valid m4moe-train "
     "flag (Unknown command line flag 'd_modl'. Did you mean: d_model ?)"),
    # A training flag that does not parse (not a model flag: only the
    # trainer's own flags know it).
    ('extra_flags = ["--warmup_steps=ten"]',
     "extra_flags entry '--warmup_steps=ten' is not a valid m4moe-train "
     "flag (flag --warmup_steps=ten: invalid literal for int()"),
    # Parses, but the trainer's config refuses the value.
    ('extra_flags = ["--label_smoothing=2"]',
     "model 'm': its m4moe-train command line is invalid: "
     "--label_smoothing=2.0 is invalid: use a value in [0, 1)"),
]


@pytest.mark.parametrize("line,message", TRAIN_PROBLEMS)
def test_a_bad_train_flag_names_the_file_the_model_and_the_fix(
    tmp_path, line, message):
  with pytest.raises(recipes_lib.RecipeError) as e:
    _check(tmp_path, recipe_fixtures.MINIMAL + line + "\n")
  assert str(e.value).startswith(f"{tmp_path / 'r.toml'}: ")
  assert message in str(e.value)
  assert "Nothing was run" in str(e.value)
  assert not (tmp_path / "run").exists()


BASELINE = '''languages = ["de", "fr"]
''' + recipe_fixtures.MINIMAL.split("\n", 1)[1] + '''
[baseline]
name = "b"
config = "tiny/dense"
train_steps = 3
'''
FR_FLAGS = '''[baselines.fr]
extra_flags = ["--num_experts=-1"]
'''


@pytest.mark.parametrize("text,message", [
    (BASELINE + FR_FLAGS,
     "model 'bilingual_fr' (from [baseline] and [baselines.fr]): its config "
     "'tiny/dense' with its extra_flags gives no valid model: "
     "--num_experts=-1 is invalid"),
    (BASELINE.replace('"fr"]', '"pt_BR"]'),
     "languages: 'pt_BR' is not a corpus language code (it is 'pt' in the "
     "corpus); write 'pt'"),
    (BASELINE.replace('"fr"]', '"qq"]'),
     "languages: 'qq' is not a known language"),
    (recipe_fixtures.MINIMAL.replace(
        "[[models]]", 'vocab_flags = ["--nope=1"]\n[[models]]'),
     "r.toml: vocab_flags entry '--nope=1' is not a valid m4moe-vocab flag "
     "(Unknown command line flag 'nope'); fix or remove it"),
])
def test_other_problems_name_the_key_and_the_fix(tmp_path, text, message):
  with pytest.raises(recipes_lib.RecipeError) as e:
    _check(tmp_path, text)
  assert str(e.value).startswith(f"{tmp_path / 'r.toml'}: ")
  assert message in str(e.value)


def test_an_unwritable_run_dir_is_named(tmp_path):
  (tmp_path / "afile").write_text("")
  with pytest.raises(recipes_lib.RecipeError,
                     match=r"--run_dir=.*afile is a file, not a directory"):
    _check(tmp_path, recipe_fixtures.MINIMAL, run_dir=tmp_path / "afile")


def test_a_passed_check_is_recorded_and_not_repeated(tmp_path, monkeypatch):
  with monkeypatch.context() as patch:  # the tools' verdict: all good
    patch.setattr(recipe_check, "_check_commands", lambda *args: None)
    _check(tmp_path, recipe_fixtures.MINIMAL, record=False)  # a dry run
  assert not (tmp_path / "run").exists()  # changed nothing
  _check(tmp_path, recipe_fixtures.MINIMAL)
  assert (tmp_path / "run" / recipe_check.RECORD).is_file()

  def no_child(*args, **kwargs):
    raise AssertionError("checked again")

  monkeypatch.setattr(subprocess, "Popen", no_child)
  _check(tmp_path, recipe_fixtures.MINIMAL)  # the same commands: recorded
  with pytest.raises(AssertionError, match="checked again"):
    _check(tmp_path, recipe_fixtures.MINIMAL.replace("train_steps = 3",
                                                     "train_steps = 4"))
