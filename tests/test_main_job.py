"""The main job (m4moe-run): stage planning, an end-to-end smoke run, resume."""

import json
import subprocess
import sys

import pytest

from m4moe.pipeline import plan as main_job
from m4moe.pipeline import supervisor
from m4moe.pipeline import recipes as recipes_lib


def _flags(stage: main_job.Stage) -> dict[str, str]:
  return stage.flag_values()


def test_demo_plan_trains_then_evaluates_every_model_and_reports_last(tmp_path):
  recipe = recipes_lib.load_recipe("demo")
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
  run = recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1)
  with pytest.raises(ValueError, match="repeats a model name"):
    recipes_lib.Recipe(name="r", description="", languages=("de",),
                    use_packaged_corpus_recipe=False, source_vocab_size=300,
                    target_vocab_size=300, models=(run, run), baseline=None,
                    batch_tokens=64, sequence_length=8, eval_max_sentences=1,
                    beam_size=1)
  with pytest.raises(ValueError, match="explicit language list"):
    recipes_lib.Recipe(name="r", description="", languages=(),
                    use_packaged_corpus_recipe=False, source_vocab_size=300,
                    target_vocab_size=300, models=(run,), baseline=run,
                    batch_tokens=64, sequence_length=8, eval_max_sentences=1,
                    beam_size=1)
  with pytest.raises(ValueError, match="exactly one"):
    recipes_lib.ModelRun(name="b", config="tiny/dense", train_steps=1,
                      bilingual=True)


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "m4moe.cli.run", *args],
                        capture_output=True, text=True, timeout=900,
                        check=False)


@pytest.mark.slow
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
  # The two models trained in two lanes, their outputs in logs/.
  for name in ("moe", "dense"):
    log = (run_dir / "logs" / f"train_{name}.log").read_text()
    assert log.startswith("$ ") and f"--model_dir={run_dir / 'models' / name}" in log
    assert (run_dir / "eval" / f"{name}.json").is_file()
  assert "lane 2 of 2" in first.stdout

  second = _run("--recipe=smoke", f"--run_dir={run_dir}")
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.count("done earlier, skipped") == 7

  # --restart_from re-runs that stage only (it is the last one).
  before = (report_dir / "report.md").stat().st_mtime_ns
  third = _run("--recipe=smoke", f"--run_dir={run_dir}",
               "--restart_from=report")
  assert third.returncode == 0, third.stderr[-3000:]
  assert third.stdout.count("done earlier, skipped") == 6
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


def _stage(name: str, lane=None) -> main_job.Stage:
  return main_job.Stage(name=name, description="", tool="train", args=(),
                        lane=lane)


def test_consecutive_laned_stages_form_one_block_of_ordered_lanes():
  stages = [_stage("corpus"), _stage("train_a", 0), _stage("eval_a", 0),
            _stage("train_b", 1), _stage("eval_b", 1), _stage("train_c", 1),
            _stage("report"), _stage("x", 0), _stage("y", 2)]
  blocks = [[[s.name for s in lane] for lane in block]
            for block in main_job.parallel_blocks(stages)]
  assert blocks == [[["corpus"]],
                    [["train_a", "eval_a"], ["train_b", "eval_b", "train_c"]],
                    [["report"]], [["x"], ["y"]]]
  # Without lanes every stage is a block of its own, in order.
  plain = [_stage(n) for n in "abc"]
  assert main_job.parallel_blocks(plain) == [[[s]] for s in plain]


def test_lanes_share_the_cores_evenly_and_need_one_each():
  assert main_job.lane_cpus(2, [0, 1]) == [(0,), (1,)]
  assert main_job.lane_cpus(2, [3, 1, 2, 0, 4]) == [(0, 1, 2), (3, 4)]
  assert main_job.lane_cpus(1, [0, 1]) == [(0, 1)]
  with pytest.raises(ValueError, match="2 lane.*have 1"):
    main_job.lane_cpus(2, [0])
  env = supervisor.lane_environment((0, 1, 2))
  assert env["TF_NUM_INTRAOP_THREADS"] == env["OMP_NUM_THREADS"] == "3"


def test_the_demo_trains_its_multilingual_model_beside_the_baselines(
    tmp_path):
  recipe = recipes_lib.load_recipe("demo")
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path / "c")
  blocks = main_job.parallel_blocks(stages)
  # corpus, vocab, then two lanes, then the report.
  assert [len(b) for b in blocks] == [1, 1, 2, 1]
  lanes = [[s.name for s in lane] for lane in blocks[2]]
  # The MoE starts at once in its lane, the largest baseline in the other.
  assert lanes[0][:2] == ["train_moe", "eval_moe"]
  assert lanes[1][:2] == ["train_bilingual_pt", "eval_bilingual_pt"]
  assert sorted(n for lane in lanes for n in lane) == sorted(
      s.name for s in stages if s.lane is not None)
  with pytest.raises(ValueError, match="lane must be >= 0"):
    recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1, lane=-1)
  with pytest.raises(ValueError, match="baseline_lanes names languages"):
    recipes_lib.Recipe(name="r", description="", languages=("de",),
                    use_packaged_corpus_recipe=False, source_vocab_size=300,
                    target_vocab_size=300, models=recipe.models,
                    baseline=recipe.baseline, baseline_lanes=(("fr", 0),),
                    batch_tokens=64, sequence_length=8, eval_max_sentences=1,
                    beam_size=1)


class _ScriptStage(main_job.Stage):
  """A stage whose command is a Python snippet (for the lane runner)."""

  def command(self) -> list[str]:
    return [sys.executable, "-c", self.args[0]]


def test_a_failing_lane_stops_the_others_and_records_neither(tmp_path):
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  pid_file = tmp_path / "affinity"
  slow = _ScriptStage(
      name="slow", description="", tool="eval", lane=1, args=(
          "import os, pathlib, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, lambda *a: (print('SAVED'), "
          "sys.exit(0)))\n"
          f"pathlib.Path({str(pid_file)!r}).write_text(repr(("
          "sorted(os.sched_getaffinity(0)), "
          "os.environ['TF_NUM_INTRAOP_THREADS'])))\n"
          # short sleeps: a SIGTERM landing just before a long sleep's
          # syscall would wait it out (handlers run between bytecodes)
          "deadline = time.monotonic() + 300\n"
          "while time.monotonic() < deadline: time.sleep(0.05)\n",))
  fast_ok = _ScriptStage(name="ok", description="", tool="eval", lane=0,
                         args=("print('fine')",))
  bad = _ScriptStage(name="bad", description="", tool="eval", lane=0,
                     args=("import time, sys; time.sleep(1); "
                           "print('boom'); sys.exit(4)",))
  job = run_cli._Job(recipe=recipes_lib.load_recipe("smoke"), run_dir=tmp_path,
                     stages=[fast_ok, bad, slow])
  with pytest.raises(SystemExit, match="stage 'bad' failed .exit 4."):
    job.run_lanes([[fast_ok, bad], [slow]], [(0,), (0,)])
  assert run_cli._marker(tmp_path, fast_ok).exists()
  assert not run_cli._marker(tmp_path, bad).exists()
  assert not run_cli._marker(tmp_path, slow).exists()
  # The other lane was stopped with SIGTERM (it saved) and waited for.
  assert "SAVED" in (tmp_path / "logs" / "slow.log").read_text()
  assert "boom" in (tmp_path / "logs" / "bad.log").read_text()
  # The lane ran pinned to its core, with one TF thread.
  assert pid_file.read_text() == "([0], '1')"


def test_demo_schedule_is_its_own_rate_at_the_demos_batch_size():
  """The demo keeps the rate its results used, per token of its batches.

  Its 2048-token batches hold a peak of 1e-3 for 2000 steps (the
  4,096,000 tokens of 1000 steps of 4096), whatever the zoo's default
  rate (configs/tiny/*.flags); every other optimiser setting is the zoo's.
  """
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  recipe = recipes_lib.load_recipe("demo")
  assert recipe.batch_tokens == 2048
  for model in (*recipe.models, recipe.baseline):
    tiny = config_lib.load_optimizer_config(model.config)
    demo = config_lib.load_optimizer_config(model.config, model.extra_flags)
    assert demo.warmup_steps * recipe.batch_tokens == 1000 * 4096, model.name
    peak = demo.learning_rate / demo.warmup_steps ** 0.5
    assert peak == pytest.approx(1e-3, rel=1e-4), model.name
    assert demo.factored == tiny.factored and demo.beta1 == tiny.beta1
    assert (demo.clipping_threshold, demo.multiply_by_parameter_scale) == (
        tiny.clipping_threshold, tiny.multiply_by_parameter_scale)


def _recipe(**overrides) -> recipes_lib.Recipe:
  run = recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1)
  base = recipes_lib.ModelRun(name="b", config="tiny/dense", train_steps=5,
                           extra_flags=("--d_ff=64",))
  return recipes_lib.Recipe(
      name="r", description="", languages=("de", "fr"),
      use_packaged_corpus_recipe=False, source_vocab_size=300,
      target_vocab_size=300, models=(run,), baseline=base, batch_tokens=64,
      sequence_length=8, eval_max_sentences=1, beam_size=1, **overrides)


def test_baseline_flags_tune_one_languages_baseline_only():
  recipe = _recipe(baseline_flags=(("fr", ("--dropout_rate=0.1",)),))
  by_lang = {b.languages[0]: b for b in recipe.baselines()}
  assert by_lang["de"].extra_flags == ("--d_ff=64",)
  assert by_lang["fr"].extra_flags == ("--d_ff=64", "--dropout_rate=0.1")
  with pytest.raises(ValueError, match=r"baseline_flags names languages "
                     r"\['it'\]"):
    _recipe(baseline_flags=(("it", ("--dropout_rate=0.1",)),))


def test_demo_baselines_of_small_languages_keep_dropout():
  """Dropout 0 overfit the kk and si baselines (results/demo/)."""
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  recipe = recipes_lib.load_recipe("demo")
  rates = {}
  for b in recipe.baselines():
    flags = [f for f in b.extra_flags if f.startswith("--dropout_rate")]
    model = config_lib.load_model_config(b.config, flags)
    rates[b.languages[0]] = model.dropout_rate
  assert rates == {"pt": 0.0, "kk": 0.1, "si": 0.1, "ia": 0.1}


def test_stop_after_runs_the_stages_up_to_it_and_a_rerun_goes_on(tmp_path):
  run_dir = tmp_path / "smoke"
  first = _run("--recipe=smoke", f"--run_dir={run_dir}",
               "--stop_after=corpus")
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  assert sorted(p.name for p in (run_dir / "stages").iterdir()) == [
      "corpus.json"]
  assert "stopped after stage 'corpus'" in first.stdout
  assert not (run_dir / "vocab").exists()
  assert (run_dir / "corpus" / "train").is_dir()
  # A later run goes on from there: the corpus is not built again.
  second = _run("--recipe=smoke", f"--run_dir={run_dir}",
                "--stop_after=corpus")
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.count("done earlier, skipped") == 1
  unknown = _run("--recipe=smoke", f"--run_dir={run_dir}",
                 "--stop_after=nope")
  assert unknown.returncode != 0
  assert "--stop_after='nope' is not a stage" in unknown.stderr


def test_demo_lanes_train_at_most_2000_seconds_whatever_the_cpu(tmp_path):
  """Every demo training run has a wall-clock cap, and each lane's caps add
  up to at most 2000 s, so a slower CPU still ends the job inside 45 min."""
  recipe = recipes_lib.load_recipe("demo")
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path / "c")
  per_lane = {}
  for stage in stages:
    if stage.tool == "train":
      cap = float(_flags(stage)["max_train_seconds"])
      assert cap > 0, stage.name
      per_lane[stage.lane] = per_lane.get(stage.lane, 0.0) + cap
  assert sorted(per_lane) == [0, 1]
  assert max(per_lane.values()) <= 2000
  # The study and smoke recipes train to their step budgets only.
  for name in ("study", "smoke"):
    assert not any("max_train_seconds" in _flags(s) for s in main_job.plan(
        recipes_lib.load_recipe(name), run_dir=tmp_path, cache_dir=tmp_path))


def test_time_caps_are_validated_and_set_per_baseline():
  with pytest.raises(ValueError, match="max_train_seconds must be >= 0"):
    recipes_lib.ModelRun(name="m", config="tiny/moe", train_steps=1,
                      max_train_seconds=-1)
  recipe = _recipe(baseline_seconds=(("fr", 30.0),))
  caps = {b.languages[0]: b.max_train_seconds for b in recipe.baselines()}
  assert caps == {"de": 0.0, "fr": 30.0}
  with pytest.raises(ValueError, match=r"baseline_seconds names languages "
                     r"\['it'\]"):
    _recipe(baseline_seconds=(("it", 1.0),))


def test_only_runs_the_matching_stages_in_plan_order(tmp_path):
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  stages = main_job.plan(recipes_lib.load_recipe("study"), run_dir=tmp_path,
                         cache_dir=tmp_path)
  chosen = run_cli._matching(stages, ["train_bilingual_s*", "eval_bilingual_s*"])
  assert [s.name for s in chosen] == [
      "train_bilingual_si", "eval_bilingual_si", "train_bilingual_sd",
      "eval_bilingual_sd"]
  # The baselines keep their lanes, so they still train side by side.
  assert {s.lane for s in chosen} == {0, 1}
  with pytest.raises(Exception, match="matches no stage"):
    run_cli._matching(stages, ["nope*"])
  run_dir = tmp_path / "smoke"
  only = _run("--recipe=smoke", f"--run_dir={run_dir}", "--only=corpus")
  assert only.returncode == 0, only.stdout[-3000:] + only.stderr[-3000:]
  assert sorted(p.name for p in (run_dir / "stages").iterdir()) == [
      "corpus.json"]
  assert "the 1 stage(s) of --only" in only.stdout


def test_nolanes_runs_every_stage_alone_in_plan_order(tmp_path):
  from m4moe.cli import run as run_cli  # pylint: disable=g-import-not-at-top
  recipe = recipes_lib.load_recipe("study3_screen")
  stages = main_job.plan(recipe, run_dir=tmp_path, cache_dir=tmp_path)
  alone = run_cli._blocks(stages, lanes=False)
  assert [block[0][0].name for block in alone] == [s.name for s in stages]
  assert all(len(block) == 1 and len(block[0]) == 1 for block in alone)
  # With lanes the recipe's two lanes share one block, lane by lane.
  laned = run_cli._blocks(stages, lanes=True)
  assert len(laned[2]) == 2
  first = {lane: next(m.name for m in recipe.models if m.lane == lane)
           for lane in (0, 1)}
  assert laned[2][0][0].name == f"train_{first[0]}_s1"
  assert laned[2][1][0].name == f"train_{first[1]}_s1"
