"""Throughput of the training input pipeline (examples/s, tokens/s).

Usage (prints one JSON line)::

  python -m m4moe.data.pipeline_benchmark CORPUS_DIR VOCAB_DIR \
      [MAX_LENGTH=64] [BATCH_SIZE_TOKENS=4096] [NUM_BATCHES=200]

Tokens are the non-padding source + target tokens delivered; examples are
packed segments. The first batches (start-up, shuffle-buffer filling) are not
timed.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np
import tensorflow as tf

from m4moe.data import pipeline


def measure(dataset: tf.data.Dataset, *, num_batches: int,
            warmup: int = 5) -> dict[str, float]:
  """Consumes ``warmup + num_batches`` batches; rates of the timed part."""
  iterator = iter(dataset)
  for _ in range(warmup):
    next(iterator)
  tokens = examples = 0
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(iterator)
    segments = batch["targets_segment_ids"].numpy()
    tokens += int(np.count_nonzero(segments))
    tokens += int(np.count_nonzero(batch["inputs_segment_ids"].numpy()))
    examples += int(segments.max(axis=1).sum())
  seconds = time.perf_counter() - start
  return {"batches_per_s": num_batches / seconds,
          "examples_per_s": examples / seconds,
          "tokens_per_s": tokens / seconds, "seconds": seconds}


def main(argv: list[str]) -> None:
  corpus_dir, vocab_dir = pathlib.Path(argv[1]), pathlib.Path(argv[2])
  max_length = int(argv[3]) if len(argv) > 3 else 64
  batch_tokens = int(argv[4]) if len(argv) > 4 else 4096
  num_batches = int(argv[5]) if len(argv) > 5 else 200
  config = pipeline.PipelineConfig(max_length=max_length,
                                   batch_size_tokens=batch_tokens)
  stats = pipeline.PipelineStats()
  dataset = pipeline.corpus_training_dataset(corpus_dir, vocab_dir,
                                             config=config, stats=stats)
  result = measure(dataset, num_batches=num_batches)
  counts = stats.as_dict()
  result["dropped_too_long"] = sum(counts["dropped_too_long"].values())
  result["kept"] = sum(counts["kept"].values())
  result["fill"] = counts["tokens"] / max(1, 2 * counts["rows"] * max_length)
  print(json.dumps(result))


if __name__ == "__main__":
  main(sys.argv)
