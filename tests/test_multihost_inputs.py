"""Multi-host input: two simulated hosts read disjoint shards of every language.

Each host (``process_index`` of ``process_count``, or a
``tf.distribute.InputContext``) builds its own stream; together the shards
are every training pair once, no pair is on both hosts, each host's stream
is deterministic, and a host restored from its iterator checkpoint goes on
with its own shard.
"""

import collections
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import vocab
from m4moe.training import inputs

SIZES = {"de": 60, "fr": 31, "ja": 9}
HOSTS = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("multihost")
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes=SIZES, dev=3,
                                     test=2)
  vocab.train_vocabularies(corpus_dir, root / "vocab", config=vocab.VocabConfig(
      source_vocab_size=400, target_vocab_size=300, max_sentences=500))
  return corpus_dir, root / "vocab"


def _config(corpus, index: int, count: int = HOSTS, *,
            length: int = 32) -> inputs.DataConfig:
  corpus_dir, vocab_dir = corpus
  return inputs.DataConfig(
      corpus_dir=str(corpus_dir), vocab_dir=str(vocab_dir),
      sequence_length=length, batch_tokens=16 * length, seed=1,
      process_index=index, process_count=count)


def test_shards_are_disjoint_and_together_the_whole_stream(corpus):
  corpus_dir, _ = corpus
  train = pipeline.read_tsv_corpus(corpus_dir, split="train")
  shards = [inputs.shard_datasets(train.datasets, train.sizes, index=i,
                                  count=HOSTS) for i in range(HOSTS)]
  for lang, whole_ds in train.datasets.items():
    whole = [tuple(p) for p in whole_ds.as_numpy_iterator()]
    parts = [[tuple(p) for p in shard[lang].as_numpy_iterator()]
             for shard in shards]
    assert len(whole) == SIZES[lang]
    assert not set(parts[0]) & set(parts[1]), lang
    assert collections.Counter(parts[0] + parts[1]) == collections.Counter(
        whole)
    # Host i holds positions i, i + HOSTS, ...: deterministic, balanced.
    assert parts[1] == whole[1::HOSTS]


def _targets(batches, target_model) -> set[str]:
  """The English sentences of packed batches (target side, by segment)."""
  out = set()
  for batch in batches:
    ids, seg = batch["targets"].numpy(), batch["targets_segment_ids"].numpy()
    for row in range(ids.shape[0]):
      for s in np.unique(seg[row][seg[row] > 0]):
        tokens = ids[row][seg[row] == s].tolist()
        out.add(target_model.decode([t for t in tokens if t != vocab.EOS_ID]))
  return out


def test_each_host_trains_on_its_own_shard_only(corpus):
  corpus_dir, vocab_dir = corpus
  target_model = vocab.load(vocab_dir / "target.model")
  seen = []
  for index in range(HOSTS):
    # Rows long enough that no pair is dropped for length.
    built = inputs.build_inputs(_config(corpus, index, length=128))
    batches = list(built.train.take(40))
    assert batches[0]["inputs"].shape == (16 // HOSTS, 128)
    seen.append(_targets(batches, target_model))
  shard_english = [set(), set()]
  for lang in SIZES:
    english = [e for e, _ in vocab.read_split_pairs(corpus_dir, "train",
                                                    lang)]
    for index in range(HOSTS):
      shard_english[index] |= set(english[index::HOSTS])
  # The fixture's English sentences are shared by all languages at one
  # position, so each host's English is its shard's (all of it, after
  # enough batches).
  assert seen[0] == shard_english[0]
  assert seen[1] == shard_english[1]
  assert not seen[0] & seen[1]


def test_input_context_picks_the_shard_and_hosts_are_deterministic(corpus):
  context = tf.distribute.InputContext(num_input_pipelines=HOSTS,
                                       input_pipeline_id=1,
                                       num_replicas_in_sync=8)
  config = inputs.shard_for_input_context(_config(corpus, 0, count=1),
                                          context)
  assert (config.process_index, config.process_count) == (1, HOSTS)
  first = next(iter(inputs.build_inputs(config).train))
  again = next(iter(inputs.build_inputs(_config(corpus, 1)).train))
  other = next(iter(inputs.build_inputs(_config(corpus, 0)).train))
  np.testing.assert_array_equal(first["inputs"], again["inputs"])
  assert not np.array_equal(first["inputs"], other["inputs"])


def test_a_resumed_host_continues_its_own_shard(corpus, tmp_path):
  iterator = iter(inputs.build_inputs(_config(corpus, 1)).train)
  for _ in range(3):
    next(iterator)
  path = tf.train.Checkpoint(data=iterator).save(str(tmp_path / "ckpt"))
  expected = [next(iterator) for _ in range(3)]
  resumed = iter(inputs.build_inputs(_config(corpus, 1)).train)
  tf.train.Checkpoint(data=resumed).restore(path).assert_consumed()
  # Without iterator state the trainer skips the consumed batches instead.
  skipped = iter(inputs.build_inputs(_config(corpus, 1)).train.skip(3))
  for want in expected:
    got, got_skipped = next(resumed), next(skipped)
    for key in want:
      np.testing.assert_array_equal(want[key], got[key], key)
      np.testing.assert_array_equal(want[key], got_skipped[key], key)


def test_bad_host_settings_name_the_flag(corpus):
  with pytest.raises(inputs.DataConfigError, match="--process_index=2"):
    _config(corpus, 2)
  with pytest.raises(inputs.DataConfigError, match="split evenly"):
    inputs.DataConfig(synthetic=True, sequence_length=32, batch_tokens=96,
                      process_count=2)
  corpus_dir, vocab_dir = corpus
  config = inputs.DataConfig(
      corpus_dir=str(corpus_dir), vocab_dir=str(vocab_dir),
      sequence_length=32, batch_tokens=32 * 16, process_count=16)
  with pytest.raises(inputs.DataConfigError, match="ja has fewer training"):
    inputs.build_inputs(config)


def test_the_one_process_trainer_takes_host_shards_only_to_check(tmp_path):
  small = ["--config=tiny/dense", "--synthetic_data", "--sequence_length=16",
           "--batch_tokens=256", "--process_index=1", "--process_count=2",
           f"--model_dir={tmp_path / 'run'}"]
  code = "from m4moe.cli.train import run; run()"

  def train(*args):
    return subprocess.run([sys.executable, "-c", code, *small, *args],
                          capture_output=True, text=True, timeout=300,
                          check=False)
  checked = train("--check_config")
  assert checked.returncode == 0, checked.stderr[-2000:]
  refused = train("--train_steps=1")
  assert refused.returncode == 2
  assert "--process_count=2: this trainer is one process" in refused.stderr
  assert not (tmp_path / "run").exists()
