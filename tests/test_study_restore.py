"""m4moe.pipeline.restore: committed study runs back into a run dir."""

import hashlib
import json
import pathlib
import subprocess
import sys

import pytest

from m4moe.data import vocab as vocab_lib
from m4moe.pipeline import restore as restore_lib
import recipe_fixtures

_STUDY = pathlib.Path(__file__).parents[1] / "results" / "study"
_COMMAND = [sys.executable, "-m", "m4moe.pipeline.restore"]


def _module():
  return restore_lib


_OLD = "/old/runs/study2"


def _marker(path: pathlib.Path, stage: str, *args: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"stage": stage, "command": [
      "python3", "-m", "m4moe.cli.x", *args], "seconds": 1.0}))


def _committed(tmp_path: pathlib.Path, old: str = _OLD
               ) -> tuple[pathlib.Path, pathlib.Path]:
  """A results dir with one whole run (a) and one without its ood eval (b),
  and a run dir whose corpus/vocab match the manifest. ``old``: the run
  directory the records name ("": records relative to their run dir)."""
  prefix = f"{old}/" if old else ""
  results, run_dir = tmp_path / "v2", tmp_path / "run"
  files = {"corpus/test/pt.tsv": "o\tx\n", "vocab/source.vocab": "spm"}
  lines = []
  for name, text in files.items():
    (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_text(text)
    lines.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {name}")
  results.mkdir()
  (results / "inputs.sha256").write_text("\n".join(lines) + "\n")
  _marker(results / "stages" / "corpus.json", "corpus",
          f"--output_dir={prefix}corpus")
  for run in ("a", "b"):
    _marker(results / "stages" / f"train_{run}.json", f"train_{run}",
            f"--model_dir={prefix}models/{run}")
    (results / "metrics").mkdir(exist_ok=True)
    (results / "metrics" / f"{run}.jsonl").write_text(
        json.dumps({"kind": "end", "reason": "done"}) + "\n")
    splits = ("eval", "eval_ood") if run == "a" else ("eval",)
    for split in splits:
      _marker(results / "stages" / f"{split}_{run}.json", f"{split}_{run}",
              f"--output={prefix}{split}/{run}.json")
      (results / split / run).mkdir(parents=True, exist_ok=True)
      (results / split / run / "pt.hyp").write_text(f"hyp {split}\n")
      (results / split / f"{run}.json").write_text(json.dumps(
          {"metadata": {"hypotheses_dir": f"{prefix}{split}/{run}"},
           "languages": {"pt": {"num_segments": 1}}}))
  return results, run_dir


def test_checkout_relative_records_are_rewritten_to_the_run_dir(tmp_path):
  # Committed records name their run directory relative to the checkout
  # (runs/study2/...), as results/ keeps them.
  restore = _module()
  results, run_dir = _committed(tmp_path, old="runs/study2")
  assert restore.recorded_run_dir(results) == "runs/study2"
  assert restore.restore(results, run_dir) == ["a"]
  marker = json.loads((run_dir / "stages" / "eval_ood_a.json").read_text())
  assert marker["command"][-1] == f"--output={run_dir}/eval_ood/a.json"


def test_run_dir_relative_records_are_copied_as_they_are(tmp_path):
  restore = _module()
  results, run_dir = _committed(tmp_path, old="")
  assert restore.recorded_run_dir(results) == "."
  assert restore.restore(results, run_dir) == ["a"]
  marker = json.loads((run_dir / "stages" / "eval_ood_a.json").read_text())
  assert marker["command"][-1] == "--output=eval_ood/a.json"
  evaluation = json.loads((run_dir / "eval" / "a.json").read_text())
  assert evaluation["metadata"]["hypotheses_dir"] == "eval/a"


def test_whole_runs_are_restored_with_their_paths_rewritten(tmp_path):
  restore = _module()
  results, run_dir = _committed(tmp_path)
  assert restore.check_inputs(results, run_dir) == []
  assert restore.recorded_run_dir(results) == _OLD
  assert restore.restore(results, run_dir) == ["a"]  # b lacks its ood eval
  marker = json.loads((run_dir / "stages" / "eval_ood_a.json").read_text())
  assert marker["command"][-1] == f"--output={run_dir}/eval_ood/a.json"
  evaluation = json.loads((run_dir / "eval" / "a.json").read_text())
  assert evaluation["metadata"]["hypotheses_dir"] == f"{run_dir}/eval/a"
  assert (run_dir / "eval_ood" / "a" / "pt.hyp").read_text() == "hyp eval_ood\n"
  assert (run_dir / "models" / "a" / "metrics.jsonl").is_file()
  assert not (run_dir / "stages" / "train_b.json").exists()
  assert not (run_dir / "models" / "b").exists()
  # A second restore changes nothing (the run has its records now).
  before = (run_dir / "eval" / "a.json").stat().st_mtime_ns
  assert restore.restore(results, run_dir) == []
  assert (run_dir / "eval" / "a.json").stat().st_mtime_ns == before


def test_a_run_started_here_is_left_to_resume(tmp_path):
  restore = _module()
  results, run_dir = _committed(tmp_path)
  (run_dir / "models" / "a").mkdir(parents=True)
  (run_dir / "models" / "a" / "checkpoint").write_text("mine")
  assert restore.restore(results, run_dir) == []
  assert not (run_dir / "stages").exists()
  assert (run_dir / "models" / "a" / "checkpoint").read_text() == "mine"


def test_other_inputs_are_refused_by_name(tmp_path):
  results, run_dir = _committed(tmp_path)
  (run_dir / "vocab" / "source.vocab").write_text("another vocabulary")
  proc = subprocess.run(
      [*_COMMAND, f"--results={results}",
       f"--run_dir={run_dir}"], capture_output=True, text=True, timeout=120,
      check=False)
  assert proc.returncode != 0
  assert "vocab/source.vocab" in proc.stderr
  assert "not be comparable" in proc.stderr
  assert not (run_dir / "stages").exists()


def test_a_malformed_manifest_names_its_line(tmp_path):
  restore = _module()
  results, run_dir = _committed(tmp_path)
  (results / "inputs.sha256").write_text("abc corpus/test/pt.tsv\n")
  with pytest.raises(ValueError, match=r"inputs.sha256:1: not a sha256sum"):
    restore.check_inputs(results, run_dir)


def test_a_split_without_sentences_needs_no_hypotheses(tmp_path):
  """ckb has no test_ood sentences: its run has no eval_ood/<run>/ dir."""
  restore = _module()
  results, run_dir = _committed(tmp_path)
  for path in (results / "eval_ood" / "a").iterdir():
    path.unlink()
  (results / "eval_ood" / "a").rmdir()
  assert restore.restore(results, run_dir) == []  # pt had sentences
  (results / "eval_ood" / "a.json").write_text(json.dumps(
      {"metadata": {}, "languages": {"ckb": {"num_segments": 0}}}))
  assert restore.restore(results, run_dir) == ["a"]
  assert (run_dir / "eval_ood" / "a").is_dir()
  assert (run_dir / "stages" / "eval_ood_a.json").is_file()


def test_a_run_dir_without_inputs_is_told_to_build_them(tmp_path):
  results, _ = _committed(tmp_path)
  empty = tmp_path / "empty"
  proc = subprocess.run(
      [*_COMMAND, f"--results={results}",
       f"--run_dir={empty}"], capture_output=True, text=True, timeout=120,
      check=False)
  assert proc.returncode != 0
  assert "has none of the 2" in proc.stderr and "--stop_after=vocab" in proc.stderr
  assert not empty.exists()


def test_regenerate_copy_only_refuses_a_run_dir_without_stages(tmp_path):
  """A mistyped RUN_DIR must not report 'copied' with nothing copied."""
  script = _STUDY / "regenerate.sh"
  v2 = _STUDY / "v2"
  before = sorted(p.name for p in v2.iterdir()) if v2.exists() else []
  (tmp_path / "run").mkdir()  # exists, but no study ran in it
  result = subprocess.run(
      ["bash", str(script), str(tmp_path / "run")], capture_output=True,
      text=True, env={"COPY_ONLY": "1", "PATH": "/usr/bin:/bin"}, check=False)
  assert result.returncode == 1
  assert "has no stages/ directory" in result.stderr
  assert str(tmp_path / "run") in result.stderr
  assert "copied" not in result.stdout
  after = sorted(p.name for p in v2.iterdir()) if v2.exists() else []
  assert after == before



def _inputs(root: pathlib.Path, vocab: str = "spm") -> None:
  for name, text in {"corpus/train/pt.tsv": "o\tx\n",
                     "vocab/source.vocab": vocab}.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


def _trained(source: pathlib.Path, run: str, command: list[str]) -> None:
  """A finished run of ``source``: model directory and stage record."""
  model = source / "models" / run
  (model / "best").mkdir(parents=True)
  (model / "checkpoint").write_text('model_checkpoint_path: "ckpt-30"\n')
  (model / "ckpt-30.data-00000-of-00001").write_bytes(bytes(range(256)))
  (model / "best" / "ckpt-30.index").write_bytes(b"\x00\x01index")
  (model / "config.json").write_text(json.dumps(
      {"corpus_dir": f"{source}/corpus", "model_dir": str(model)}))
  (model / "metrics.jsonl").write_text('{"kind": "end"}\n')
  (model / "train.lock").write_text('{"pid": 1, "host": "elsewhere"}')
  (source / "stages").mkdir(parents=True, exist_ok=True)
  (source / "stages" / f"train_{run}.json").write_text(json.dumps(
      {"stage": f"train_{run}", "command": command, "seconds": 1.0}))


def test_finished_runs_of_a_run_dir_are_copied_with_paths_rewritten(
    tmp_path):
  source, run_dir = tmp_path / "old", tmp_path / "new"
  _inputs(source)
  _inputs(run_dir)
  assert restore_lib.differing_inputs(source, run_dir) == []
  _trained(source, "a", ["py", f"--model_dir={source}/models/a"])
  _trained(source, "c", ["py", f"--model_dir={source}/models/c"])
  (source / "models" / "b").mkdir()  # started, never finished: no record
  assert restore_lib.finished_runs(source) == ["a", "c"]
  assert restore_lib.import_runs(source, run_dir, patterns=["a*"]) == ["a"]
  model = run_dir / "models" / "a"
  assert json.loads((model / "config.json").read_text()) == {
      "corpus_dir": f"{run_dir}/corpus", "model_dir": str(model)}
  assert (model / "ckpt-30.data-00000-of-00001").read_bytes() == bytes(
      range(256))
  assert (model / "best" / "ckpt-30.index").read_bytes() == b"\x00\x01index"
  assert not (model / "train.lock").exists()
  assert not list(run_dir.rglob("*.restoring"))
  record = json.loads((run_dir / "stages" / "train_a.json").read_text())
  assert record["command"] == ["py", f"--model_dir={run_dir}/models/a"]
  assert not (run_dir / "models" / "c").exists()
  # Runs this directory has already are left alone.
  assert restore_lib.import_runs(source, run_dir) == ["c"]
  assert restore_lib.import_runs(source, run_dir) == []


def test_runs_the_recipe_would_train_otherwise_are_refused(tmp_path):
  source, run_dir = tmp_path / "old", tmp_path / "new"
  _trained(source, "a", ["py", f"--model_dir={source}/models/a", "--lr=2"])
  _trained(source, "x", ["py", "--other"])
  with pytest.raises(ValueError) as error:
    restore_lib.import_runs(source, run_dir, expected={
        "train_a": ["python3", f"--model_dir={run_dir}/models/a", "--lr=1"]})
  assert "2 run(s)" in str(error.value)
  assert "--lr=2" in str(error.value) and "--lr=1" in str(error.value)
  assert "x (the recipe has no such run)" in str(error.value)
  assert not run_dir.exists()
  # The same command (rewritten to this directory, any Python): copied.
  assert restore_lib.import_runs(source, run_dir, patterns=["a"], expected={
      "train_a": ["python3", f"--model_dir={run_dir}/models/a",
                  "--lr=2"]}) == ["a"]


def test_the_tool_checks_inputs_and_the_recipes_commands(tmp_path):
  from m4moe.pipeline import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  recipe_path = tmp_path / "reuse.toml"
  recipe_path.write_text(recipe_fixtures.MINIMAL)
  source, run_dir = tmp_path / "old", tmp_path / "new"
  _inputs(source)
  _inputs(run_dir, vocab="another vocabulary")
  stages = plan_lib.plan(recipes.load_recipe(str(recipe_path)),
                         run_dir=source, cache_dir=source / "cache")
  train = next(s for s in stages if s.name.startswith("train_"))
  _trained(source, train.name.removeprefix("train_"), train.command())

  def run(recipe: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_COMMAND, f"--from_run_dir={source}", f"--run_dir={run_dir}",
         f"--recipe={recipe}"], capture_output=True, text=True, timeout=120,
        check=False)

  refused = run(recipe_path)
  assert refused.returncode != 0 and "vocab/source.vocab" in refused.stderr
  assert not (run_dir / "models").exists()
  _inputs(run_dir)
  other = tmp_path / "other.toml"
  other.write_text(recipe_fixtures.MINIMAL.replace("train_steps = 3",
                                                   "train_steps = 60"))
  changed = run(other)
  assert changed.returncode != 0 and "--train_steps=60" in changed.stderr
  assert not (run_dir / "models").exists()
  copied = run(recipe_path)
  assert copied.returncode == 0, copied.stderr[-2000:]
  assert "1 finished run(s)" in copied.stdout
  assert (run_dir / "stages" / f"{train.name}.json").is_file()


def test_a_recipe_check_without_a_run_dir_to_copy_from_is_refused(tmp_path):
  results, run_dir = _committed(tmp_path)
  proc = subprocess.run(
      [*_COMMAND, f"--results={results}", f"--run_dir={run_dir}",
       "--recipe=study"], capture_output=True, text=True, timeout=120,
      check=False)
  assert proc.returncode != 0 and "drop --recipe" in proc.stderr
  assert not (run_dir / "stages").exists()


def _spm_model(path: pathlib.Path, *, prefix: str, pieces: list[str]) -> str:
  """A SentencePiece model file with these pieces, trained to ``prefix``;
  returns its sha256."""
  proto = vocab_lib.sentencepiece_model_pb2.ModelProto()
  for piece in pieces:
    proto.pieces.add(piece=piece, score=0.0)
  proto.trainer_spec.model_prefix = prefix
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(proto.SerializeToString())
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_copied_runs_vocabulary_fingerprint_names_the_models_here(
    tmp_path):
  # Rebuilt vocabularies hold the same pieces as the source's but record
  # another training path, so their bytes differ: the decoder, which checks
  # the run's fingerprint byte for byte, must see this directory's files.
  source, run_dir = tmp_path / "old", tmp_path / "new"
  old_src = _spm_model(source / "vocab" / "source.model",
                       prefix="/tmp/a/source", pieces=["<unk>", "a", "b"])
  new_src = _spm_model(run_dir / "vocab" / "source.model",
                       prefix="/tmp/b/source", pieces=["<unk>", "a", "b"])
  old_tgt = _spm_model(source / "vocab" / "target.model",
                       prefix="/tmp/a/target", pieces=["<unk>", "c"])
  new_tgt = _spm_model(run_dir / "vocab" / "target.model",
                       prefix="/tmp/a/target", pieces=["<unk>", "d"])
  assert old_src != new_src and old_tgt != new_tgt
  assert restore_lib.vocabulary_digests(source, run_dir) == {
      old_src: new_src}  # the target models hold other pieces: not equal
  _trained(source, "a", ["py", f"--model_dir={source}/models/a"])
  (source / "models" / "a" / "run.json").write_text(json.dumps(
      {"vocab": {"source": {"sha256": old_src}, "target":
                 {"sha256": old_tgt}}}))
  assert restore_lib.import_runs(source, run_dir) == ["a"]
  copied = json.loads((run_dir / "models" / "a" / "run.json").read_text())
  assert copied["vocab"]["source"]["sha256"] == new_src
  assert copied["vocab"]["target"]["sha256"] == old_tgt
