"""Synthetic parallel data: the reverse-and-permute toy task.

The data source of ``m4moe-train --synthetic_data`` (smoke runs without a
corpus, :mod:`m4moe.training.inputs`) and of the trainer's tests: the
target is the source reversed, each token mapped through a fixed
permutation. :func:`synthetic_parallel_dataset` is a deterministic,
checkpointable tf.data pipeline of padded model batches;
:func:`unigram_cross_entropy` is the loss a model that ignores the source
cannot beat.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def synthetic_pairs(*, num_pairs: int, vocab_size: int, min_length: int = 3,
                    max_length: int = 8, seed: int = 0,
                    reverse: bool = True
                    ) -> list[tuple[list[int], list[int]]]:
  """Pairs (source ids, target ids) of the (reverse-and-)permute task.

  Ids 0 and 1 are pad and eos (contract); both sequences end with eos.
  With ``reverse=False`` the target keeps the source order (easier).
  """
  rng = np.random.default_rng(seed)
  words = np.arange(3, vocab_size)
  permutation = dict(zip(words.tolist(), rng.permutation(words).tolist()))
  pairs = []
  for _ in range(num_pairs):
    n = int(rng.integers(min_length, max_length + 1))
    src = rng.choice(words, size=n).tolist()
    tgt = [permutation[w] for w in (reversed(src) if reverse else src)]
    pairs.append((src + [1], tgt + [1]))
  return pairs


def pairs_dataset(pairs, *, batch_size: int, length: int,
                  shuffle_seed: int | None = 0,
                  repeat: bool = True) -> tf.data.Dataset:
  """Padded model batches {"inputs", "targets"} <int32>[batch_size, length]."""
  def pad(seqs):
    out = np.zeros([len(seqs), length], np.int32)
    for i, s in enumerate(seqs):
      out[i, :len(s)] = s[:length]
    return out
  ds = tf.data.Dataset.from_tensor_slices({
      "inputs": pad([p[0] for p in pairs]),
      "targets": pad([p[1] for p in pairs])})
  if repeat:
    ds = ds.repeat()
  if shuffle_seed is not None:
    ds = ds.shuffle(256, seed=shuffle_seed)
  return ds.batch(batch_size, drop_remainder=repeat)


def synthetic_parallel_dataset(*, vocab_size: int = 24, batch_size: int = 8,
                               length: int = 10, num_pairs: int = 512,
                               seed: int = 0) -> tf.data.Dataset:
  """A repeated, shuffled training stream of the reverse-and-permute task."""
  pairs = synthetic_pairs(num_pairs=num_pairs, vocab_size=vocab_size,
                          max_length=length - 1, seed=seed)
  return pairs_dataset(pairs, batch_size=batch_size, length=length,
                       shuffle_seed=seed)


def unigram_cross_entropy(pairs) -> float:
  """Entropy (nats) of the target unigram distribution incl. eos.

  A model that ignores the source and context cannot beat this on average.
  """
  counts = np.bincount(np.concatenate([np.asarray(t) for _, t in pairs]))
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())
