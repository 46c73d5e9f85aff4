"""Recipes with an upcycled model (ModelRun.init_from): load-time refusals,
the planned stages (flag, source directory, waiting across lanes), the lane
runner honouring the wait, and a resumed run keeping its own weights."""

import copy
import json
import pathlib
import sys

import pytest
import tensorflow as tf

from m4moe.cli import run as run_cli
from m4moe.moe import upcycle
from m4moe.pipeline import plan as main_job
from m4moe.pipeline import recipes as recipes_lib
from m4moe.training import loop as train_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic
import toy_model

SMALL = ["--d_model=32", "--d_kv=8", "--d_ff=64", "--num_encoder_layers=2",
         "--num_decoder_layers=2"]
TABLE = {
    "name": "up", "description": "upcycling", "languages": ["de", "fr"],
    "use_packaged_corpus_recipe": False, "source_vocab_size": 400,
    "target_vocab_size": 320, "batch_tokens": 512, "sequence_length": 32,
    "eval_max_sentences": 8, "beam_size": 2,
    "models": [
        {"name": "dense", "config": "tiny/dense", "train_steps": 20,
         "lane": 0, "seeds": [1, 2], "extra_flags": SMALL},
        {"name": "moe", "config": "tiny/moe", "train_steps": 20, "lane": 1,
         "seeds": [1], "extra_flags": SMALL},
        {"name": "up", "config": "tiny/moe", "train_steps": 10, "lane": 1,
         "seeds": [1, 2], "init_from": "dense",
         "extra_flags": [*SMALL, "--expert_hidden_dim=64"]},
    ],
    "baseline": {"name": "b", "config": "tiny/dense", "train_steps": 5,
                 "lane": 0, "extra_flags": SMALL},
}


def _recipe(change=None) -> recipes_lib.Recipe:
  table = copy.deepcopy(TABLE)
  if change is not None:
    change(table)
  return recipes_lib.recipe_from_table(table, source="my.toml")


def _up(**values):
  return lambda table: table["models"][2].update(values)


@pytest.mark.parametrize("change, message", [
    (_up(init_from="nope"), "has init_from = 'nope', which is not a model of "
     r"the recipe; name one of \['dense', 'moe'\]"),
    (_up(init_from="up"), "has init_from = 'up', itself"),
    (_up(init_from="moe", seeds=[1]), r"'moe', an MoE model "
     r"\(--num_experts=8\); upcycling starts from a dense model"),
    (lambda t: t["models"].append({**t["models"][2], "name": "up2",
                                   "init_from": "up"}),
     r"model 'up2' has init_from = 'up', which is itself upcycled .*name a "
     "model trained from scratch, e.g. 'dense'"),
    (_up(seeds=[2, 3]), r"which has seeds \[1, 2\], not a run of each seed "
     r"of this model \(\[2, 3\]\); give this model seeds = \[1, 2\] or a "
     "subset"),
    (_up(seeds=[]), r"not a run of each seed of this model \(no seeds\)"),
    (_up(extra_flags=SMALL), "--expert_hidden_dim=256 differs from the dense "
     "run's --d_ff=64: each expert starts as a copy of the dense FFN, set "
     r"--expert_hidden_dim=64 \(in this model's extra_flags\)"),
    (_up(extra_flags=[*SMALL, "--expert_hidden_dim=64", "--num_experts=0"]),
     "--init_from_dense needs an MoE model"),
    (_up(extra_flags=[*SMALL, "--expert_hidden_dim=64", "--d_model=64"]),
     "--d_model=64 differs from the dense run's 32"),
    (lambda t: t["models"].insert(0, t["models"].pop(2)),
     "'dense', which is listed after it; list 'dense' first"),
    (_up(continue_from="dense"), "sets both init_from and continue_from"),
    (_up(init_from="", extra_flags=[*SMALL, "--init_from_dense_optimizer"]),
     "has --init_from_dense_optimizer but the model has no init_from"),
    (_up(init_from="", extra_flags=[*SMALL, "--init_from_dense=/x"]),
     r"--init_from_dense=/x; name the dense model of the recipe with "
     'init_from = "NAME" instead'),
    (lambda t: t["baseline"].update(init_from="dense"),
     "the \\[baseline\\] template sets init_from"),
])
def test_a_bad_init_from_is_refused_naming_file_model_and_fix(change,
                                                              message):
  with pytest.raises(recipes_lib.RecipeError, match=message) as raised:
    _recipe(change)
  assert str(raised.value).startswith("my.toml: recipe 'up'")


def test_recipe_loading_reads_the_configs_without_tensorflow(tmp_path):
  """m4moe-run starts without TensorFlow; checking init_from must not
  load it (a subprocess: this test process has loaded it already)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  path = tmp_path / "up.toml"
  path.write_text(_toml(TABLE))
  code = ("import sys; from m4moe.pipeline import recipes as r; "
          f"r.load_recipe({str(path)!r}); "
          "print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout
  assert out.strip() == "False"


def _toml(table) -> str:
  """A flat TOML rendering of TABLE (strings, ints, lists, tables)."""
  def value(v):
    return json.dumps(v)  # JSON scalars and lists of them are TOML too
  lines = [f"{k} = {value(v)}" for k, v in table.items()
           if not isinstance(v, (dict, list)) or
           (isinstance(v, list) and not isinstance(v[0], dict))]
  for model in table["models"]:
    lines += ["[[models]]", *(f"{k} = {value(v)}" for k, v in model.items())]
  if "baseline" in table:
    lines += ["[baseline]", *(f"{k} = {value(v)}"
                              for k, v in table["baseline"].items())]
  return "\n".join(lines) + "\n"


def test_each_seed_starts_from_the_dense_run_of_that_seed(tmp_path):
  stages = main_job.plan(_recipe(), run_dir=tmp_path, cache_dir=tmp_path)
  names = [s.name for s in stages]
  by_name = {s.name: s for s in stages}
  for seed in (1, 2):
    train = by_name[f"train_up_s{seed}"]
    flags = train.flag_values()
    assert flags["init_from_dense"] == str(
        tmp_path / "models" / f"dense_s{seed}")
    assert flags["model_dir"] == str(tmp_path / "models" / f"up_s{seed}")
    assert flags["seed"] == str(seed)
    assert flags["train_steps"] == "10"
    assert train.after == (f"train_dense_s{seed}",)
    assert "10 steps after upcycling" in train.description
    assert names.index(f"train_dense_s{seed}") < names.index(
        f"train_up_s{seed}") < names.index(f"eval_up_s{seed}")
  # Nothing else upcycles or waits.
  others = [s for s in stages if not s.name.startswith("train_up_")]
  assert not any(s.after for s in others)
  assert not any("init_from_dense" in s.flag_values() for s in others)
  # The optimiser state stays the recipe's choice (extra_flags).
  assert "init_from_dense_optimizer" not in by_name["train_up_s1"].args
  # The source trains in lane 0, the upcycled model in lane 1 of the same
  # block: the wait is the runner's (Stage.after), not the block order.
  blocks = main_job.parallel_blocks(stages)
  block = next(b for b in blocks if len(b) == 2)
  lanes = [[s.name for s in lane] for lane in block]
  assert "train_dense_s1" in lanes[0] and "train_up_s1" in lanes[1]


def test_an_upcycled_continuation_trains_after_it(tmp_path):
  table = copy.deepcopy(TABLE)
  longer = {**table["models"][0], "name": "dense_long", "train_steps": 40,
            "continue_from": "dense"}
  table["models"][1:1] = [longer]
  table["models"][3]["init_from"] = "dense_long"
  stages = main_job.plan(recipes_lib.recipe_from_table(table, source="x"),
                         run_dir=tmp_path, cache_dir=tmp_path)
  names = [s.name for s in stages]
  # Continuations come after the baselines, and so must their upcycling.
  assert names.index("train_bilingual_fr") < names.index(
      "train_dense_long_s1") < names.index("train_up_s1")
  assert stages[names.index("train_up_s1")].flag_values()[
      "init_from_dense"] == str(tmp_path / "models" / "dense_long_s1")


class _ScriptStage(main_job.Stage):
  """A stage whose command is a Python snippet (for the lane runner)."""

  def command(self) -> list[str]:
    return [sys.executable, "-c", self.args[0]]


def test_the_lane_runner_starts_a_stage_after_the_stages_it_waits_for(
    tmp_path):
  done = tmp_path / "source_done"
  seen = tmp_path / "seen"
  source = _ScriptStage(
      name="train_src", description="", tool="eval", lane=0, args=(
          f"import pathlib, time; time.sleep(2); "
          f"pathlib.Path({str(done)!r}).write_text('x')",))
  quick = _ScriptStage(name="other", description="", tool="eval", lane=1,
                       args=("pass",))
  waiting = _ScriptStage(
      name="train_up", description="", tool="eval", lane=1,
      after=("train_src",), args=(
          f"import pathlib; pathlib.Path({str(seen)!r}).write_text("
          f"str(pathlib.Path({str(done)!r}).exists()))",))
  job = run_cli._Job(recipe=_recipe(), run_dir=tmp_path,
                     stages=[source, quick, waiting])
  job.run_lanes([[source], [quick, waiting]], [(0,), (0,)])
  # Lane 2 was free after `other`, but `train_up` waited for lane 1.
  assert seen.read_text() == "True"
  for stage in (source, quick, waiting):
    assert run_cli._marker(tmp_path, stage).exists()


def test_only_without_the_unfinished_source_is_refused(tmp_path):
  stages = main_job.plan(_recipe(), run_dir=tmp_path, cache_dir=tmp_path)
  chosen = run_cli._matching(stages, ["train_up_s1"])
  with pytest.raises(Exception, match="stage 'train_up_s1' needs "
                     "train_dense_s1 .its init_from source., which has not "
                     "finished; add it to --only"):
    run_cli._check_needed(chosen, tmp_path)
  run_cli._check_needed(run_cli._matching(
      stages, ["train_dense_s1", "train_up_s1"]), tmp_path)
  (tmp_path / "stages").mkdir()
  (tmp_path / "stages" / "train_dense_s1.json").write_text("{}")
  run_cli._check_needed(chosen, tmp_path)  # the source finished earlier


def _dense_checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
  """A stand-in source run: a checkpoint with a step counter."""
  run = tmp_path / "models" / "dense_s1"
  tf.train.CheckpointManager(
      tf.train.Checkpoint(step=tf.Variable(20, dtype=tf.int64)), str(run),
      max_to_keep=1).save(checkpoint_number=20)
  return run


def test_a_rerun_of_a_killed_upcycled_stage_resumes_its_own_run(tmp_path):
  """The re-run's command is the planned one, --init_from_dense included;
  m4moe-train ignores it once the run has a checkpoint of its own."""
  stages = main_job.plan(_recipe(), run_dir=tmp_path, cache_dir=tmp_path)
  flags = next(s for s in stages
               if s.name == "train_up_s1").flag_values()
  _dense_checkpoint(tmp_path)
  own = pathlib.Path(flags["model_dir"])
  tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)),
                             str(own), max_to_keep=1).save(
                                 checkpoint_number=4)
  warm, problems, notice = upcycle.prepare(
      dense_dir=flags["init_from_dense"], model_dir=flags["model_dir"],
      copy_optimizer=False, config=None, optimizer=None, mesh=False)
  assert warm is None and problems == []
  assert notice == (f"resuming {own / 'ckpt-4'}: --init_from_dense="
                    f"{flags['init_from_dense']} is ignored")


VOCAB = 24
PAIRS = synthetic.synthetic_pairs(num_pairs=64, vocab_size=VOCAB,
                                  max_length=9)


def test_the_start_record_says_where_a_warm_started_run_began(tmp_path):
  calls = []

  def warm_start(model, optimizer):
    calls.append(model)
    return {"kind": "upcycled", "dense_step": 20, "optimizer_iterations": 0}

  def train(steps):
    tf.random.set_seed(0)
    return train_lib.train(
        model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB + 1),
        train_dataset=synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                              shuffle_seed=1),
        config=train_lib.TrainConfig(
            model_dir=str(tmp_path / "run"), train_steps=steps, seed=3,
            log_every=1, checkpoint_every=2,
            optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20)),
        warm_start=warm_start)

  assert train(2).step == 2
  assert train(3).step == 3  # a resume: the warm start does not run again
  assert len(calls) == 1
  starts = [json.loads(line) for line in
            (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "start"]
  assert [(s["step"], s["warm_start"]) for s in starts] == [
      (0, {"kind": "upcycled", "dense_step": 20, "optimizer_iterations": 0}),
      (2, None)]
  assert starts[1]["resumed_from"].endswith("ckpt-2")


SMOKE = {
    "name": "up_smoke", "description": "upcycling end to end",
    "use_packaged_corpus_recipe": False, "source_vocab_size": 400,
    "target_vocab_size": 320, "batch_tokens": 512, "sequence_length": 32,
    "eval_max_sentences": 8, "beam_size": 2,
    "models": [
        {"name": "dense", "config": "tiny/dense", "train_steps": 20,
         "lane": 0, "extra_flags": [*SMALL, "--warmup_steps=10"]},
        {"name": "up", "config": "tiny/moe", "train_steps": 10, "lane": 1,
         "init_from": "dense",
         "extra_flags": [*SMALL, "--warmup_steps=10", "--num_experts=4",
                         "--group_size=64", "--expert_hidden_dim=64",
                         "--init_from_dense_optimizer"]},
    ],
}


def _starts(model_dir: pathlib.Path) -> list[dict]:
  records = [json.loads(line) for line in
             (model_dir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in records if r["kind"] in ("start", "end")]


@pytest.mark.slow  # m4moe-run's stages end to end (minutes)
def test_m4moe_run_upcycles_then_resumes_the_upcycled_run(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  path, run_dir = tmp_path / "up.toml", tmp_path / "run"
  table = copy.deepcopy(SMOKE)

  def run():
    path.write_text(_toml(table))
    return subprocess.run(
        [sys.executable, "-m", "m4moe.cli.run", f"--recipe={path}",
         f"--run_dir={run_dir}", "--stop_after=train_up"],
        capture_output=True, text=True, timeout=900, check=False)

  first = run()
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  up = run_dir / "models" / "up"
  starts = _starts(up)
  # Relative to the upcycled run's model directory.
  assert starts[0]["warm_start"]["init_from_dense"] == "../dense"
  # The dense run's 20 steps came first; the schedule went on from them.
  assert starts[0]["warm_start"]["dense_step"] == 20
  assert starts[0]["warm_start"]["optimizer_iterations"] == 20
  assert starts[-1]["kind"] == "end" and starts[-1]["step"] == 10
  # A longer budget re-runs the stage (same --init_from_dense), which
  # resumes the upcycled run's own checkpoint: no second upcycling.
  table["models"][1]["train_steps"] = 14
  second = run()
  assert second.returncode == 0, second.stderr[-3000:]
  starts = _starts(up)
  assert [(r["kind"], r["step"]) for r in starts] == [
      ("start", 0), ("end", 10), ("start", 10), ("end", 14)]
  assert starts[2]["warm_start"] is None
  assert starts[2]["resumed_from"] == "ckpt-10"
  reader = tf.train.load_checkpoint(str(up / "ckpt-14"))
  assert reader.get_tensor("optimizer/iterations/.ATTRIBUTES/"
                           "VARIABLE_VALUE") == 34
