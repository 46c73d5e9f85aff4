"""The peer comparison's preparation and bookkeeping (m4moe.benchmarks.peer).

OpenNMT-tf itself is not installed here: the model file is executed against
a stand-in ``opennmt`` module that records the Transformer's arguments, and
the virtualenv builder runs with a fake ``subprocess.run``.
"""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

from m4moe.benchmarks.peer import driver
from m4moe.benchmarks.peer import throughput
from m4moe.benchmarks.peer import toolkit
from m4moe.data import fixtures
from m4moe.data import vocab as vocab_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  """A fixture corpus with de/fr and its SentencePiece vocabularies."""
  root = tmp_path_factory.mktemp("peer")
  fixtures.write_corpus(root / "corpus", sizes={"de": 200, "fr": 100},
                        dev=5, test=8)
  config = vocab_lib.VocabConfig(source_vocab_size=400, target_vocab_size=300,
                                 max_sentences=2000)
  vocab_lib.train_vocabularies(root / "corpus", root / "vocab", config=config)
  return root


def _sp(demo, side):
  return vocab_lib.load(demo / "vocab" / f"{side}.model")


def test_vocabulary_has_onmt_specials_then_every_non_control_piece(demo, tmp_path):
  out = tmp_path / "source.vocab"
  n = toolkit.write_vocabulary(demo / "vocab" / "source.vocab", out)
  lines = out.read_text(encoding="utf-8").splitlines()
  sp = _sp(demo, "source")
  assert n == len(lines) == sp.get_piece_size() - 3 + 3  # pad, eos, unk out
  assert lines[:3] == ["<blank>", "<s>", "</s>"]
  assert len(set(lines)) == len(lines)
  assert "<unk>" not in lines and "<pad>" not in lines
  assert "<2de>" in lines and "<2en>" in lines  # language tags are pieces
  # Every piece our encoder can produce has an id in the peer's vocabulary.
  for text in ("Open file", "Show delete show next settings"):
    assert set(sp.encode(text, out_type=str)) <= set(lines)


def test_vocabulary_errors_name_file_and_line(tmp_path):
  bad = tmp_path / "bad.vocab"
  bad.write_text("<unk>\t0\n▁a\t-1\nno tab here\n", encoding="utf-8")
  with pytest.raises(toolkit.PeerError, match=r"bad.vocab:3: expected"):
    toolkit.write_vocabulary(bad, tmp_path / "out.vocab")
  dup = tmp_path / "dup.vocab"
  dup.write_text("▁a\t-1\n▁b\t-2\n▁a\t-3\n", encoding="utf-8")
  with pytest.raises(toolkit.PeerError, match=r"dup.vocab:3: piece '▁a'"):
    toolkit.write_vocabulary(dup, tmp_path / "out.vocab")
  assert not (tmp_path / "out.vocab").exists()


def test_pieces_round_trip_and_drops_are_counted(demo, tmp_path):
  source_sp, target_sp = _sp(demo, "source"), _sp(demo, "target")
  pairs = [("Open the file", "Open the file (de)"), ("", "empty source"),
           ("Close", "   "),
           (" ".join(["settings"] * 40), "Settings")]
  counts = toolkit.write_pieces(
      pairs, source_sp=source_sp, target_sp=target_sp,
      source_path=tmp_path / "s", target_path=tmp_path / "t", max_length=24)
  assert counts == toolkit.PieceCounts(pairs=4, written=1, dropped_too_long=1,
                                       dropped_empty=2)
  (src,) = (tmp_path / "s").read_text(encoding="utf-8").splitlines()
  (tgt,) = (tmp_path / "t").read_text(encoding="utf-8").splitlines()
  assert src.split() == source_sp.encode("Open the file", out_type=str)
  assert toolkit.detokenize(tgt, target_sp=target_sp) == "Open the file (de)"
  # The length rule is our pipeline's: source pieces + tag + EOS, target
  # pieces + EOS, each <= max_length.
  n_src = len(source_sp.encode("Open the file", out_type=str))
  n_tgt = len(target_sp.encode("Open the file (de)", out_type=str))
  tight = toolkit.write_pieces(
      [("Open the file", "Open the file (de)")], source_sp=source_sp,
      target_sp=target_sp, source_path=tmp_path / "s2",
      target_path=tmp_path / "t2", max_length=max(n_src + 2, n_tgt + 1))
  assert tight.written == 1
  cut = toolkit.write_pieces(
      [("Open the file", "Open the file (de)")], source_sp=source_sp,
      target_sp=target_sp, source_path=tmp_path / "s3",
      target_path=tmp_path / "t3", max_length=max(n_src + 2, n_tgt + 1) - 1)
  assert cut.dropped_too_long == 1


def test_test_pieces_are_cut_like_our_translator(demo, tmp_path):
  sp = _sp(demo, "source")
  long_text = " ".join(["document"] * 30)
  flags = toolkit.write_test_pieces(["Open file", long_text], source_sp=sp,
                                    path=tmp_path / "test", max_pieces=10)
  assert flags == [False, True]
  lines = (tmp_path / "test").read_text(encoding="utf-8").splitlines()
  assert lines[0].split() == sp.encode("Open file", out_type=str)
  assert lines[1].split() == sp.encode(long_text, out_type=str)[:10]


def test_detokenize_keeps_one_line():
  class Sp:
    def decode_pieces(self, pieces):
      return "a\nb" if pieces == ["x"] else ""
  assert toolkit.detokenize("x", target_sp=Sp()) == "a b"


def test_model_file_builds_our_tiny_dense_dimensions():
  calls = {}
  fake = types.ModuleType("opennmt")
  fake.inputters = types.SimpleNamespace(
      WordEmbedder=lambda **kw: ("embedder", kw["embedding_size"]))
  fake.models = types.SimpleNamespace(
      Transformer=lambda **kw: calls.update(kw) or "model",
      EmbeddingsSharingLevel=types.SimpleNamespace(NONE="none"))
  namespace = {}
  saved = sys.modules.get("opennmt")
  sys.modules["opennmt"] = fake
  try:
    exec(compile(toolkit.model_file_text(toolkit.PeerModel()), "model.py",
                 "exec"), namespace)
    assert namespace["model"]() == "model"
  finally:
    if saved is None:
      del sys.modules["opennmt"]
    else:
      sys.modules["opennmt"] = saved
  assert calls["num_layers"] == (2, 2)
  assert (calls["num_units"], calls["num_heads"], calls["ffn_inner_dim"]) == (
      128, 4, 512)
  assert calls["pre_norm"] is True and calls["share_embeddings"] == "none"
  assert calls["source_inputter"] == calls["target_inputter"] == (
      "embedder", 128)
  assert calls["dropout"] == calls["attention_dropout"] == 0.1


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=130), "multiple of num_heads"),
    (dict(num_encoder_layers=0), "num_encoder_layers=0"),
    (dict(dropout=1.0), "dropout=1.0"),
])
def test_peer_model_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    toolkit.PeerModel(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(learning_rate=0), "learning_rate=0"),
    (dict(batch_tokens=32, max_length=64), "max_length <= batch_tokens"),
    (dict(label_smoothing=1.0), "label_smoothing=1.0"),
    (dict(warmup_steps=0), "warmup_steps=0"),
    (dict(length_penalty=-1), "length_penalty=-1"),
])
def test_peer_recipe_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    toolkit.PeerRecipe(**kwargs)


def test_run_config_is_the_issue_recipe_and_reads_as_yaml(tmp_path):
  files = toolkit.PeerFiles(
      train_source=tmp_path / "train.pt", train_target=tmp_path / "train.en",
      dev_source=tmp_path / "dev.pt", dev_target=tmp_path / "dev.en",
      source_vocab=tmp_path / "s.vocab", target_vocab=tmp_path / "t.vocab")
  config = toolkit.run_config(recipe=toolkit.PeerRecipe(), files=files,
                              model_dir=tmp_path / "model")
  path = tmp_path / "config.json"
  toolkit.write_json(path, config)
  loaded = json.loads(path.read_text(encoding="utf-8"))
  assert loaded == json.loads(json.dumps(config))
  try:  # OpenNMT-tf reads its config with PyYAML (not one of our deps).
    import yaml  # pylint: disable=g-import-not-at-top
  except ImportError:
    yaml = None
  if yaml is not None:
    assert yaml.safe_load(path.read_text(encoding="utf-8")) == loaded
  params, train = loaded["params"], loaded["train"]
  assert params["optimizer"] == "Adam" and params["learning_rate"] == 5e-4
  assert params["decay_type"] == "InvSqrtDecay"
  assert params["decay_params"] == {"warmup_steps": 300}
  assert params["label_smoothing"] == 0.1
  assert (params["beam_width"], params["length_penalty"]) == (4, 0.6)
  assert (train["batch_size"], train["batch_type"]) == (4096, "tokens")
  assert train["effective_batch_size"] is None  # no hidden accumulation
  assert train["maximum_features_length"] == 64
  assert loaded["data"]["train_features_file"] == str(tmp_path / "train.pt")


def _metrics(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records),
                  encoding="utf-8")
  return path


def test_m4moe_train_summary(tmp_path):
  # A hand-made log: 50 steps an interval; tokens_seen counts target tokens.
  path = _metrics(tmp_path / "metrics.jsonl", [
      {"kind": "start", "step": 0},
      {"kind": "train", "step": 50, "tokens_per_sec": 100.0,
       "tokens_seen": 10000, "step_time_sec": 0.5, "learning_rate": 0.004},
      {"kind": "train", "step": 100, "tokens_per_sec": 4000.0,
       "tokens_seen": 30000, "step_time_sec": 0.2, "learning_rate": 0.004},
      {"kind": "train", "step": 150, "tokens_per_sec": 5000.0,
       "tokens_seen": 45000, "step_time_sec": 0.1, "learning_rate": 0.003},
      {"kind": "eval", "step": 160, "dev_ce": {"pt": 3.21}},
      {"kind": "end", "step": 160, "train_seconds": 80.0,
       "stopped_by": "time_budget"}])
  summary = toolkit.m4moe_train_summary(path, language="pt")
  # Target tokens over step seconds, the first interval (tracing) left
  # out: (20000 + 15000) / (50 * 0.2 + 50 * 0.1).
  assert summary == {"steps": 160, "train_seconds": 80.0, "steps_per_sec": 2.0,
                     "tokens_per_sec": 4500.0, "dev_ce": 3.21,
                     "stopped_by": "time_budget",
                     "target_tokens_per_sec": round(35000 / 15, 1),
                     "target_tokens": 45000, "logged_learning_rate": 0.003,
                     "logged_learning_rate_step": 150}
  with pytest.raises(toolkit.PeerError, match="no dev evaluation of 'kk'"):
    toolkit.m4moe_train_summary(path, language="kk")
  unfinished = _metrics(tmp_path / "u.jsonl", [{"kind": "train", "step": 1,
                                                "tokens_per_sec": 1.0}])
  untimed = _metrics(tmp_path / "t.jsonl", [
      {"kind": "train", "step": 50, "tokens_per_sec": 1.0},
      {"kind": "eval", "step": 50, "dev_ce": {"pt": 3.0}},
      {"kind": "end", "step": 50, "train_seconds": 1.0}])
  with pytest.raises(toolkit.PeerError, match="lacks 'tokens_seen'"):
    toolkit.m4moe_train_summary(untimed, language="pt")
  with pytest.raises(toolkit.PeerError, match="did not finish"):
    toolkit.m4moe_train_summary(unfinished, language="pt")
  broken = tmp_path / "b.jsonl"
  broken.write_text('{"kind": "start"}\n{"kind": "tr\n', encoding="utf-8")
  with pytest.raises(toolkit.PeerError, match=r"b.jsonl:2: not JSON"):
    toolkit.m4moe_train_summary(broken, language="pt")


def test_system_record_and_examples():
  record = toolkit.system_record(
      train={"steps": 10, "tokens_per_sec": 5.0, "steps_per_sec": 0.5,
             "train_seconds": 20.0, "dev_ce": 3.0},
      bleu=12.345, chrf=30.0, decode_sentences=200, decode_seconds=50.0,
      budget_seconds=40.0)
  assert record["bleu"] == 12.35 and record["decode_sentences_per_sec"] == 4.0
  assert record["steps_per_sec"] == 0.5  # not stopped by the budget
  budgeted = toolkit.system_record(
      train={"steps": 10, "tokens_per_sec": 5.0, "steps_per_sec": 0.2,
             "train_seconds": 50.0, "dev_ce": 3.0, "stopped_by": "time_budget"},
      bleu=1.0, chrf=2.0, decode_sentences=1, decode_seconds=1.0,
      budget_seconds=40.0)
  assert budgeted["steps_per_sec"] == 0.25  # steps over the budget
  rows = toolkit.examples(sources=list("abcdefghij"),
                          references=list("ABCDEFGHIJ"),
                          hypotheses={"ours": list("0123456789")}, count=3)
  assert [r["source"] for r in rows] == ["a", "d", "g"]
  assert rows[1] == {"source": "d", "ours": "3", "reference": "D"}
  assert toolkit.examples(sources=[], references=[], hypotheses={},
                          count=3) == []


def test_benchmark_lines_go_into_one_block_before_the_dispatch_section(
    tmp_path):
  md = tmp_path / "benchmarks.md"
  md.write_text("# B\n\n```\n{\"benchmark\": \"x\"}\n```\n\n"
                "## Default dispatch per platform\n\ntext\n", encoding="utf-8")
  toolkit.append_benchmark_lines(md, [{"benchmark": "peer_train", "a": 1}])
  toolkit.append_benchmark_lines(md, [{"benchmark": "peer_decode", "b": 2},
                                      {"benchmark": "peer_train", "a": 3}])
  text = md.read_text(encoding="utf-8")
  assert text.count(toolkit.PEER_SECTION) == 1
  assert text.index(toolkit.PEER_SECTION) < text.index("## Default dispatch")
  block = text[text.index(toolkit.PEER_SECTION):].split("```")[1]
  rows = [json.loads(l) for l in block.strip().splitlines()]
  assert [r["benchmark"] for r in rows] == ["peer_train", "peer_decode",
                                           "peer_train"]
  assert text.startswith("# B\n\n```\n{\"benchmark\": \"x\"}\n```\n")
  assert text.rstrip().endswith("text")


def test_benchmark_lines_errors(tmp_path):
  with pytest.raises(toolkit.PeerError, match="does not exist"):
    toolkit.append_benchmark_lines(tmp_path / "none.md", [{}])
  md = tmp_path / "b.md"
  md.write_text(f"{toolkit.PEER_SECTION}\n\nno block\n", encoding="utf-8")
  with pytest.raises(toolkit.PeerError, match="no ``` block"):
    toolkit.append_benchmark_lines(md, [{"benchmark": "peer_train"}])
  assert md.read_text(encoding="utf-8") == (
      f"{toolkit.PEER_SECTION}\n\nno block\n")


class _FakeRun:
  """Records commands; ``version`` is what the venv's python reports."""

  def __init__(self, venv, *, fail_on=None, version="2.32.0"):
    self.venv, self.fail_on, self.version = venv, fail_on, version
    self.commands = []

  def __call__(self, command, **kwargs):
    self.commands.append(command)
    if command[:3] == ["python3", "-m", "venv"]:
      (self.venv / "bin").mkdir(parents=True)
      (self.venv / "bin" / "python").write_text("")
    if "-c" in command:
      return subprocess.CompletedProcess(command, 0, stdout=self.version + "\n")
    code = 1 if self.fail_on and self.fail_on in command else 0
    return subprocess.CompletedProcess(command, code)


def test_ensure_venv_builds_with_exact_pins(tmp_path):
  venv = tmp_path / "onmt"
  run = _FakeRun(venv)
  python = toolkit.ensure_venv(venv, log=tmp_path / "log", run=run)
  assert python == venv / "bin" / "python"
  builds = [c for c in run.commands if "-c" not in c]
  assert builds == [
      ["python3", "-m", "venv", str(venv)],
      [str(venv / "bin" / "pip"), "install", "tensorflow==2.13.1",
       "tensorflow-addons==0.21.0", "ctranslate2==3.24.0", "pyonmttok",
       "pyyaml", "rouge", "sacrebleu"],
      [str(venv / "bin" / "pip"), "install", "--no-deps", "opennmt-tf==2.32.0"]]
  # Ready: nothing is built again.
  again = _FakeRun(venv)
  toolkit.ensure_venv(venv, log=tmp_path / "log", run=again)
  assert all("-c" in c for c in again.commands)


def test_ensure_venv_failures_name_the_command_and_never_reuse_a_foreign_venv(
    tmp_path):
  venv = tmp_path / "onmt"
  with pytest.raises(toolkit.PeerError, match=r"exit 1\): .*--no-deps.*see "):
    toolkit.ensure_venv(venv, log=tmp_path / "log",
                        run=_FakeRun(venv, fail_on="--no-deps"))
  other = tmp_path / "other"
  (other / "bin").mkdir(parents=True)
  (other / "bin" / "python").write_text("")
  run = _FakeRun(other, version="2.31.0")
  with pytest.raises(toolkit.PeerError, match="does not have opennmt-tf==2.32"):
    toolkit.ensure_venv(other, log=tmp_path / "log2", run=run)
  assert all("-c" in c for c in run.commands)  # nothing installed into it


def test_driver_rejects_bad_budget_before_importing_opennmt(capsys):
  with pytest.raises(SystemExit) as exit_info:
    driver.main(["train", "--config=c", "--model_file=m", "--summary=s",
                 "--steps_log=l", "--budget_seconds=0"])
  assert exit_info.value.code == 2
  assert "--budget_seconds=0.0: use a positive" in capsys.readouterr().err
  assert "opennmt" not in sys.modules


def test_driver_step_log_is_read_by_the_shared_definition(tmp_path):
  path = tmp_path / "steps.jsonl"
  log = driver.StepLog(str(path), every=2)
  # Hand-made steps: (step, target tokens, seconds); the last one flushes.
  for step, tokens, seconds in ((1, 50, 4.0), (2, 70, 0.5), (3, 60, 0.5),
                                (4, 80, 0.5), (5, 90, 0.25)):
    log.add(step=step, target_tokens=tokens, seconds=seconds,
            learning_rate=1e-3 * step, last=step == 5)
  intervals = throughput.peer_intervals(path)
  assert [(i.step, i.steps, i.target_tokens) for i in intervals] == [
      (2, 2, 120), (4, 2, 140), (5, 1, 90)]
  # The first interval (tracing) is left out: (140 + 90) / (1.0 + 0.25).
  assert throughput.target_tokens_per_sec(intervals) == pytest.approx(
      230 / 1.25)
  assert throughput.summary(intervals)["logged_learning_rate"] == 5e-3
  path.write_text('{"step": 1}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"steps.jsonl:1: not an interval"):
    throughput.peer_intervals(path)
  with pytest.raises(ValueError, match="no logged training interval"):
    throughput.target_tokens_per_sec([])


def test_driver_throughput_log_reads_onmt_step_lines():
  log = driver._ThroughputLog()  # pylint: disable=protected-access
  for message in ("Step = 50 ; steps/s = 1.00, tokens/s = 7000 (3500 source, "
                  "3500 target) ; Learning rate = 0.0001 ; Loss = 6.0",
                  "Evaluation result for step 50: loss = 5.0",
                  "Step = 100 ; steps/s = 1.10, tokens/s = 7700 (3850 source, "
                  "3850 target) ; Learning rate = 0.0002 ; Loss = 5.0"):
    log.emit(driver.logging.LogRecord("tf", 20, "", 0, message, None, None))
  assert log.rates == [7000, 7700]


@pytest.mark.parametrize("flag, match", [
    ("--systems=m4moe,fairseq", "name each of m4moe, m4moe-moe, m4moe-factored, opennmt-tf"),
    ("--budget_seconds=0", "--budget_seconds=0.0: use a positive"),
    ("--language=xx", "train/xx.tsv does not exist"),
    ("--test_sentences=9", "has 8 test sentences, fewer than"),
    ("--cores=a", "--cores=a: list CPU numbers"),
])
def test_run_flag_errors_are_usage_errors(demo, tmp_path, flag, match):
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.run",
       f"--corpus_dir={demo / 'corpus'}", f"--vocab_dir={demo / 'vocab'}",
       f"--work_dir={tmp_path / 'work'}", "--language=de", flag,
       f"--output_dir={tmp_path / 'out'}"],
      capture_output=True, text=True, cwd=ROOT, check=False)
  assert done.returncode != 0
  assert match in done.stderr and "Traceback" not in done.stderr
  assert not (tmp_path / "work").exists()
  assert not (tmp_path / "out").exists()


def test_run_without_a_venv_says_how_to_give_one(demo, tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "M4MOE_ONMT_VENV"}
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.run",
       f"--corpus_dir={demo / 'corpus'}", f"--vocab_dir={demo / 'vocab'}",
       f"--work_dir={tmp_path / 'work'}", "--language=de",
       "--test_sentences=8"],
      capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
  assert done.returncode != 0
  assert "pass --onmt_venv=DIR or set M4MOE_ONMT_VENV=DIR" in done.stderr
  assert not (tmp_path / "work" / "peer.json").exists()
  assert not list(tmp_path.glob("**/benchmark*"))


def test_run_refuses_a_work_dir_with_an_earlier_comparison(demo, tmp_path):
  (tmp_path / "work" / "opennmt-tf").mkdir(parents=True)
  marker = tmp_path / "work" / "opennmt-tf" / "train.log"
  marker.write_text("earlier run\n", encoding="utf-8")
  done = subprocess.run(
      [sys.executable, "-m", "m4moe.benchmarks.peer.run",
       f"--corpus_dir={demo / 'corpus'}", f"--vocab_dir={demo / 'vocab'}",
       f"--work_dir={tmp_path / 'work'}", "--language=de",
       "--test_sentences=8"],
      capture_output=True, text=True, cwd=ROOT, check=False)
  assert done.returncode != 0 and "pass a new --work_dir" in done.stderr
  assert marker.read_text(encoding="utf-8") == "earlier run\n"
