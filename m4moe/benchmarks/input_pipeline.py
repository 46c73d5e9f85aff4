"""Input pipeline tokens/s vs what the tiny training step consumes.

The pipeline is timed with :func:`m4moe.data.pipeline_benchmark.measure`
(non-padding source+target tokens delivered per second); the consumer is the
trainer's step (:mod:`m4moe.benchmarks.train_step`) on batches from that
same pipeline. Rounds of both are interleaved. Without ``corpus_dir`` /
``vocab_dir`` a small synthetic corpus and vocabulary
(``m4moe.data.fixtures``) are built in a temporary directory first.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
from typing import Any, Iterator

import numpy as np

from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import pipeline_benchmark
from m4moe.data import vocab


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelinePoint:
  """Pipeline shape; the fixture corpus size if no corpus is given."""
  max_length: int = 64
  batch_size_tokens: int = 4096
  batches_per_rep: int = 20
  fixture_pairs: int = 2000


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
  """Yields one record with ``pipeline_vs_step`` (target >= 10)."""
  with tempfile.TemporaryDirectory() as tmp:
    if corpus_dir is None or vocab_dir is None:
      corpus_dir, vocab_dir = fixture_dirs(pathlib.Path(tmp),
                                           pairs=point.fixture_pairs)
    config = pipeline.PipelineConfig(
        max_length=point.max_length,
        batch_size_tokens=point.batch_size_tokens)
    dataset = pipeline.corpus_training_dataset(corpus_dir, vocab_dir,
                                               config=config).repeat()
    batch = next(iter(dataset))
    model_batch = {k: v for k, v in batch.items()
                   if k in train_step.step_lib.MODEL_KEYS}
    step = train_step.step_case(config_name, vocab_size=8000,
                                batch=model_batch)
    rates: list[float] = []
    def consume():
      rates.append(pipeline_benchmark.measure(
          dataset, num_batches=point.batches_per_rep)["tokens_per_s"])
    times = timing.interleaved({"pipeline": consume, "step": step},
                               reps=reps, warmup=1)
  step_rate = _tokens(batch) / times.median("step")
  pipeline_rate = float(np.median(rates[1:]))
  yield {"benchmark": "input_pipeline", **dataclasses.asdict(point),
         "config": config_name, "reps": reps, **timing.machine(),
         "pipeline_tokens_per_sec": pipeline_rate,
         "step_tokens_per_sec": step_rate,
         "pipeline_vs_step": pipeline_rate / step_rate}
