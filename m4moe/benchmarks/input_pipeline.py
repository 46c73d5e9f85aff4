"""Input pipeline throughput, and its tokens/s vs the tiny training step's.

The pipeline is timed with :func:`measure` (non-padding source+target
tokens and packed examples delivered per second, after a few untimed
batches); the consumer is the trainer's step
(:mod:`m4moe.benchmarks.train_step`) on batches from that same pipeline.
Rounds of both are interleaved. The record also carries the pipeline's
counts (:class:`m4moe.data.pipeline.PipelineStats`: pairs kept, pairs
dropped as too long, row fill). Without ``corpus_dir`` / ``vocab_dir`` a
small synthetic corpus and vocabulary (``m4moe.data.fixtures``) are built
in a temporary directory first.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
import time
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import vocab


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelinePoint:
  """Pipeline shape; the fixture corpus size if no corpus is given."""
  max_length: int = 64
  batch_size_tokens: int = 4096
  batches_per_rep: int = 20
  fixture_pairs: int = 2000


def measure(dataset: tf.data.Dataset, *, num_batches: int,
            warmup: int = 5) -> dict[str, float]:
  """Consumes ``warmup + num_batches`` batches; rates of the timed part.

  Args:
    dataset: packed batches with ``inputs_segment_ids`` and
      ``targets_segment_ids`` <int32>[B, L] (0: padding, 1, 2, ...: the
      packed pairs of a row).
    num_batches: batches timed.
    warmup: batches consumed first, untimed (start-up, shuffle buffer).

  Returns:
    ``batches_per_s``, ``examples_per_s`` (packed pairs), ``tokens_per_s``
    (non-padding source + target tokens) and ``seconds``.
  """
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


def fixture_dirs(root: pathlib.Path, *,
                 pairs: int) -> tuple[pathlib.Path, pathlib.Path]:
  """(corpus_dir, vocab_dir) of a synthetic de/ru/ja corpus under ``root``."""
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes={
      "de": pairs, "ru": pairs // 2, "ja": pairs // 4})
  vocab.train_vocabularies(corpus_dir, root / "vocab", config=vocab.VocabConfig(
      source_vocab_size=1000, target_vocab_size=800, max_sentences=4000))
  return corpus_dir, root / "vocab"


def _tokens(batch) -> int:
  return int(np.count_nonzero(batch["inputs_segment_ids"].numpy()) +
             np.count_nonzero(batch["targets_segment_ids"].numpy()))


def run(point: PipelinePoint, *, corpus_dir: pathlib.Path | None = None,
        vocab_dir: pathlib.Path | None = None, config_name: str = "tiny/moe",
        reps: int = 3) -> Iterator[dict[str, Any]]:
  """Yields one record with ``pipeline_vs_step`` (target >= 10).

  Besides the tokens/s of both sides: ``pipeline_examples_per_sec``, and
  over every batch the pipeline delivered, ``kept`` and
  ``dropped_too_long`` pairs and ``fill`` (non-padding share of the rows).
  """
  with tempfile.TemporaryDirectory() as tmp:
    if corpus_dir is None or vocab_dir is None:
      corpus_dir, vocab_dir = fixture_dirs(pathlib.Path(tmp),
                                           pairs=point.fixture_pairs)
    config = pipeline.PipelineConfig(
        max_length=point.max_length,
        batch_size_tokens=point.batch_size_tokens)
    stats = pipeline.PipelineStats()
    dataset = pipeline.corpus_training_dataset(corpus_dir, vocab_dir,
                                               config=config,
                                               stats=stats).repeat()
    batch = next(iter(dataset))
    model_batch = {k: v for k, v in batch.items()
                   if k in train_step.step_lib.MODEL_KEYS}
    step = train_step.step_case(config_name, vocab_size=8000,
                                batch=model_batch)
    rates: list[dict[str, float]] = []
    def consume():
      rates.append(measure(dataset, num_batches=point.batches_per_rep))
    times = timing.interleaved({"pipeline": consume, "step": step},
                               reps=reps, warmup=1)
  step_rate = _tokens(batch) / times.median("step")
  pipeline_rate = float(np.median([r["tokens_per_s"] for r in rates[1:]]))
  counts = stats.as_dict()
  yield {"benchmark": "input_pipeline", **dataclasses.asdict(point),
         "config": config_name, "reps": reps, **timing.machine(),
         "pipeline_tokens_per_sec": pipeline_rate,
         "pipeline_examples_per_sec": float(np.median(
             [r["examples_per_s"] for r in rates[1:]])),
         "kept": sum(counts["kept"].values()),
         "dropped_too_long": sum(counts["dropped_too_long"].values()),
         "fill": counts["tokens"] / max(1, 2 * counts["rows"] *
                                        point.max_length),
         "step_tokens_per_sec": step_rate,
         "pipeline_vs_step": pipeline_rate / step_rate}
