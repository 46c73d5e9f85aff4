"""The main job (m4moe-run): stage planning, an end-to-end smoke run, resume."""

import json
import subprocess
import sys

import pytest

from m4moe import main_job


def _flags(stage: main_job.Stage) -> dict[str, str]:
  out = {}
  for arg in stage.args:
    name, _, value = arg.lstrip("-").partition("=")
    out[name] = value
  return out


def test_demo_plan_trains_then_evaluates_every_model_and_reports_last(tmp_path):
  recipe = main_job.RECIPES["demo"]
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path / "c")
  names = [s.name for s in stages]
  assert names[:2] == ["corpus", "vocab"]
  assert names[-1] == "report"
  models = recipe.models + recipe.baselines()
  for model in models:
    assert names.index(f"train_{model.name}") < names.index(
        f"eval_{model.name}")
  # One bilingual baseline per language, each trained on that language only.
  assert [m.languages for m in recipe.baselines()] == [
      (lang,) for lang in recipe.languages]
  by_name = {s.name: s for s in stages}
  for model in recipe.baselines():
    train = _flags(by_name[f"train_{model.name}"])
    evaluation = _flags(by_name[f"eval_{model.name}"])
    assert train["languages"] == evaluation["languages"] == model.languages[0]
    assert evaluation["kind"] == "bilingual"
    # Baselines are sized by a stopping rule on dev, not a step count.
    assert int(train["early_stopping_patience"]) >= 1
    assert 0 < int(train["eval_every"]) < int(train["train_steps"])
  report = _flags(by_name["report"])
  assert report["models"].split(",") == [
      _flags(by_name[f"eval_{m.name}"])["output"] for m in recipe.models]
  assert len(report["baselines"].split(",")) == len(recipe.languages)


def test_recipe_validation_names_the_problem():
  run = main_job.ModelRun(name="m", config="tiny/moe", train_steps=1)
  with pytest.raises(ValueError, match="repeats a model name"):
    main_job.Recipe(name="r", description="", languages=("de",),
                    use_packaged_corpus_recipe=False, source_vocab_size=300,
                    target_vocab_size=300, models=(run, run), baseline=None,
                    batch_tokens=64, sequence_length=8, eval_max_sentences=1,
                    beam_size=1)
  with pytest.raises(ValueError, match="explicit language list"):
    main_job.Recipe(name="r", description="", languages=(),
                    use_packaged_corpus_recipe=False, source_vocab_size=300,
                    target_vocab_size=300, models=(run,), baseline=run,
                    batch_tokens=64, sequence_length=8, eval_max_sentences=1,
                    beam_size=1)
  with pytest.raises(ValueError, match="exactly one"):
    main_job.ModelRun(name="b", config="tiny/dense", train_steps=1,
                      bilingual=True)


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "m4moe.cli.run", *args],
                        capture_output=True, text=True, timeout=900,
                        check=False)


def test_smoke_recipe_runs_every_stage_then_resumes(tmp_path):
  run_dir = tmp_path / "smoke"
  first = _run("--recipe=smoke", f"--run_dir={run_dir}")
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  report_dir = run_dir / "report"
  for name in ("report.md", "report.html", "delta_bleu.png", "summary.json"):
    assert (report_dir / name).is_file(), name
  evaluation = json.loads((run_dir / "eval" / "moe.json").read_text())
  scored = json.dumps(evaluation)
  for lang in ("de", "fr", "ru", "ja"):
    assert f'"{lang}"' in scored
  assert "BLEU|" in scored  # sacrebleu signatures are recorded

  # A second run skips every finished stage.
  second = _run("--recipe=smoke", f"--run_dir={run_dir}")
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.count("done earlier, skipped") == 5

  # --restart_from re-runs that stage only (it is the last one).
  before = (report_dir / "report.md").stat().st_mtime_ns
  third = _run("--recipe=smoke", f"--run_dir={run_dir}",
               "--restart_from=report")
  assert third.returncode == 0, third.stderr[-3000:]
  assert third.stdout.count("done earlier, skipped") == 4
  assert (report_dir / "report.md").stat().st_mtime_ns > before


def test_unknown_restart_stage_is_a_usage_error(tmp_path):
  result = _run("--recipe=smoke", f"--run_dir={tmp_path}",
                "--restart_from=nope")
  assert result.returncode != 0
  assert "--restart_from='nope' is not a stage" in result.stderr
  assert "corpus, vocab" in result.stderr


def test_a_preempted_training_stage_is_not_marked_done(tmp_path):
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  stage = main_job.Stage(name="train_moe", description="", tool="train",
                         args=(f"--model_dir={tmp_path}", "--train_steps=9"))
  assert not run_cli._training_finished(stage)  # no metrics log yet
  log = tmp_path / "metrics.jsonl"
  records = [{"kind": "start", "step": 0}, {"kind": "end", "step": 4,
                                            "reason": "preempted"}]
  log.write_text("".join(json.dumps(r) + "\n" for r in records))
  assert not run_cli._training_finished(stage)
  records += [{"kind": "start", "step": 4},
              {"kind": "end", "step": 9, "reason": "done"}]
  log.write_text("".join(json.dumps(r) + "\n" for r in records))
  assert run_cli._training_finished(stage)


def test_a_stage_whose_command_changed_reruns_with_later_stages(tmp_path):
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  stages = [main_job.Stage(name=n, description="", tool="train",
                           args=(f"--n={n}",)) for n in ("a", "b", "c")]
  for stage in stages:
    run_cli._write_marker(run_cli._marker(tmp_path, stage), stage, 1.0)
  assert run_cli._first_changed(stages, tmp_path) is None
  # Another interpreter path alone is not a change.
  marker = run_cli._marker(tmp_path, stages[0])
  data = json.loads(marker.read_text())
  data["command"][0] = "/other/python3"
  marker.write_text(json.dumps(data))
  assert run_cli._first_changed(stages, tmp_path) is None
  # The recipe now trains b for longer: b and c are forgotten, a is kept.
  edited = [stages[0], main_job.Stage(name="b", description="", tool="train",
                                      args=("--n=b", "--train_steps=9")),
            stages[2]]
  assert run_cli._first_changed(edited, tmp_path) == "b"
  run_cli._forget_from(edited, tmp_path, "b")
  assert [run_cli._marker(tmp_path, s).exists() for s in edited] == [
      True, False, False]
  # An unreadable marker is not trusted.
  marker.write_text("{")
  assert run_cli._first_changed(edited, tmp_path) == "a"
