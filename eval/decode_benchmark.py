r"""Cached (incremental) vs uncached beam-search decoding speed.

  python -m m4moe.eval.decode_benchmark --config=tiny/moe --batch_size=8 \
      --beam_size=4 --max_decode_length=32 --source_length=16 --repeats=3

Random weights and inputs (speed does not depend on training; a random
model rarely emits EOS, so the search runs to max_decode_length; the
decoded length is printed). Both
searches are compiled with tf.function and warmed up, then timed
interleaved (the machine's speed drifts) and must return identical
hypotheses. Prints one JSON line per measurement and a summary.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe import decoding


def _parse() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="tiny/moe")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--max_decode_length", type=int, default=32)
  parser.add_argument("--source_length", type=int, default=16)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--repeats", type=int, default=3)
  return parser.parse_args()


def main() -> None:
  args = _parse()
  from m4moe import model as model_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_model_config(
      args.config, src_vocab_size=args.vocab_size,
      tgt_vocab_size=args.vocab_size, dropout_rate=0.0,
      attention_dropout_rate=0.0)
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=config)
  beam = decoding.BeamSearchConfig(beam_size=args.beam_size, alpha=0.6,
                                   max_decode_length=args.max_decode_length)
  rng = np.random.default_rng(0)
  inputs = tf.constant(rng.integers(3, args.vocab_size, size=(
      args.batch_size, args.source_length)), tf.int32)
  spec = [tf.TensorSpec([None, None], tf.int32)]
  cached = tf.function(lambda x: decoding.translate_ids(model, x, config=beam),
                       input_signature=spec, autograph=False)
  uncached = tf.function(
      lambda x: decoding.translate_ids_uncached(model, x, config=beam),
      input_signature=spec, autograph=False)
  times = {"cached": [], "uncached": []}
  outputs = {}
  for name, fn in (("cached", cached), ("uncached", uncached)):
    outputs[name] = fn(inputs)  # trace + warm-up
  for _ in range(args.repeats):
    for name, fn in (("cached", cached), ("uncached", uncached)):
      start = time.perf_counter()
      outputs[name] = fn(inputs)
      outputs[name].sequences.numpy()
      times[name].append(time.perf_counter() - start)
      print(json.dumps({"mode": name, "seconds": times[name][-1]}))
  same = bool(np.array_equal(outputs["cached"].sequences.numpy(),
                             outputs["uncached"].sequences.numpy()))
  steps = int(outputs["cached"].lengths.numpy().max())
  best = {k: min(v) for k, v in times.items()}
  print(json.dumps({
      "config": args.config, "batch_size": args.batch_size,
      "beam_size": args.beam_size, "max_decode_length": args.max_decode_length,
      "source_length": args.source_length, "decoded_steps_max": steps,
      "cached_sec": best["cached"], "uncached_sec": best["uncached"],
      "cached_sentences_per_sec": args.batch_size / best["cached"],
      "uncached_sentences_per_sec": args.batch_size / best["uncached"],
      "speedup": best["uncached"] / best["cached"],
      "identical_hypotheses": same}))


if __name__ == "__main__":
  main()
