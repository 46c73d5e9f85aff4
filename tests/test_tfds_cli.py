"""The documented TFDS path end to end on the smoke corpus, offline.

``m4moe-build-corpus --tfds_data_dir`` writes the corpus built from the
smoke recipe's generated catalogs as m4moe_corpus; ``m4moe-train
--tfds_name=m4moe_corpus`` trains a micro MoE from it for a few steps;
``m4moe-eval`` scores its test splits and ``m4moe-decode`` translates one of
them, both reading TFDS.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from m4moe.data import fixtures
from m4moe.data import tfds_corpus
from m4moe.data import vocab

# The smoke recipe's catalog tree (m4moe-run --recipe=smoke) and its micro
# MoE (configs/recipes/smoke.toml).
SMOKE_CATALOGS = (("de", 500), ("fr", 250), ("ru", 120), ("ja", 60))
MICRO_MOE = ["--config=tiny/moe", "--d_model=32", "--d_kv=8", "--d_ff=64",
             "--num_encoder_layers=2", "--num_decoder_layers=2",
             "--expert_hidden_dim=32", "--num_experts=4", "--group_size=64",
             "--sequence_length=32", "--batch_tokens=512", "--log_every=1",
             "--deterministic"]
# Child processes cannot reach the network (they would fail, not hang).
NO_NETWORK = ("import socket\ndef refuse(*a, **k):\n  raise OSError("
              "'network access attempted')\nsocket.socket.connect = refuse\n"
              "socket.create_connection = refuse\n")


def _tool(module: str, *args: str, stdin: str | None = None
          ) -> subprocess.CompletedProcess:
  code = f"{NO_NETWORK}from m4moe.cli.{module} import run\nrun()"
  return subprocess.run([sys.executable, "-c", code, *args], input=stdin,
                        capture_output=True, text=True, timeout=600,
                        check=False)


def _smoke_catalogs(root: pathlib.Path) -> pathlib.Path:
  sentences = fixtures.english_sentences(600, seed=0, max_words=10)
  for locale, n in SMOKE_CATALOGS:
    fixtures.write_catalog(fixtures.make_catalog(locale, sentences[:n]),
                           root / locale / "LC_MESSAGES" / "demo.po")
  return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds_cli")
  catalogs = _smoke_catalogs(root / "catalogs")
  proc = _tool("build_corpus", "--norecipe", f"--sources={catalogs}",
               f"--output_dir={root / 'corpus'}", "--split_keys=",
               "--dev_groups=10", "--test_groups=10", "--workers=1",
               f"--tfds_data_dir={root / 'tfds'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
  assert "wrote m4moe_corpus 1.1.0" in proc.stderr
  proc = _tool("vocab", f"--corpus_dir={root / 'corpus'}",
               f"--output_dir={root / 'vocab'}", "--source_vocab_size=400",
               "--target_vocab_size=320", "--max_sentences=2000")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return root, summary


def test_build_corpus_writes_the_tfds_dataset_of_the_corpus(built):
  root, _ = built
  languages = vocab.corpus_languages(root / "corpus", "train")
  assert languages == ["de", "fr", "ja", "ru"]
  for split in ("train", "dev", "test"):
    pairs = tfds_corpus.split_pairs(tfds_corpus.NAME, split=split,
                                    data_dir=str(root / "tfds"))
    assert sorted(pairs) == vocab.corpus_languages(root / "corpus", split)
    for lang, lang_pairs in pairs.items():
      assert lang_pairs == vocab.read_split_pairs(root / "corpus", split,
                                                  lang)


def _data_flags(root: pathlib.Path) -> list[str]:
  return [f"--tfds_name={tfds_corpus.NAME}",
          f"--tfds_data_dir={root / 'tfds'}"]


@pytest.fixture(scope="module")
def trained(built):
  """(root, run dir, m4moe-train's process) of 2 steps from TFDS."""
  root, _ = built
  run = root / "run"
  proc = _tool("train", *MICRO_MOE, *_data_flags(root),
               f"--vocab_dir={root / 'vocab'}", f"--model_dir={run}",
               "--train_steps=2", "--eval_every=2", "--checkpoint_every=2")
  return root, run, proc


def test_train_from_tfds_on_the_smoke_corpus(trained):
  root, run, proc = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["step"] == 2 and result["train_ce"] > 0
  config = json.loads((run / "config.json").read_text())
  assert config["data"]["tfds_name"] == tfds_corpus.NAME
  assert config["languages"] == vocab.corpus_languages(root / "corpus")
  metrics = [json.loads(line) for line in
             (run / "metrics.jsonl").read_text().splitlines()]
  [dev] = [m for m in metrics if m["kind"] == "eval"]
  assert sorted(dev["dev_ce"]) == ["de", "fr", "ja", "ru"]  # the dev splits


@pytest.mark.slow  # two more CLI runs that restore and decode a model
def test_eval_and_decode_read_the_test_splits_from_tfds(trained):
  root, run, proc = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = root / "eval.json"
  proc = _tool("eval", f"--model_dir={run}", *_data_flags(root),
               f"--output={out}", "--max_sentences=3", "--beam_size=1",
               "--alpha=0", "--languages=de,ja")
  assert proc.returncode == 0, proc.stderr[-3000:]
  scores = json.loads(out.read_text())
  assert sorted(scores["languages"]) == ["de", "ja"]
  assert all(s["num_segments"] == 3 for s in scores["languages"].values())
  assert scores["languages"]["de"]["train_size"] == len(
      vocab.read_split_pairs(root / "corpus", "train", "de"))
  hyp = root / "test.de.en"
  proc = _tool("decode", f"--model_dir={run}", *_data_flags(root),
               "--tfds_split=test", "--source_lang=de", f"--output={hyp}",
               "--beam_size=1", "--alpha=0")
  assert proc.returncode == 0, proc.stderr[-3000:]
  # An untrained model's output may hold line breaks of its own: count
  # the inputs the tool read.
  sources = vocab.read_split_pairs(root / "corpus", "test", "de")
  assert f"m4moe-decode: {len(sources)} lines" in proc.stderr
  assert hyp.is_file()


def test_tools_name_a_missing_tfds_build(built, tmp_path):
  root, _ = built
  proc = _tool("train", *MICRO_MOE, f"--tfds_name={tfds_corpus.NAME}",
               f"--tfds_data_dir={tmp_path}", f"--vocab_dir={root / 'vocab'}",
               f"--model_dir={tmp_path / 'run'}", "--check_config")
  assert proc.returncode == 2
  assert f"m4moe-build-corpus --tfds_data_dir={tmp_path}" in proc.stderr


def test_a_url_model_dir_is_refused_not_made_a_local_folder(tmp_path,
                                                            monkeypatch):
  monkeypatch.chdir(tmp_path)
  proc = _tool("train", "--config=tiny/dense", "--synthetic_data",
               "--model_dir=gs://BUCKET/runs/x", "--check_config")
  assert proc.returncode == 2
  assert "must be a local path" in proc.stderr
  assert not list(tmp_path.iterdir())
