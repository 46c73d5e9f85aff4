"""Cached incremental beam search vs re-running the decoder on the prefix.

Random weights and source ids (speed does not depend on training; a random
model rarely emits EOS, so the search runs to max_decode_length, and the
record gives the decoded length), both searches compiled with
``tf.function`` and warmed up, identical hypotheses required
(``m4moe-bench decode``; this replaced ``eval/decode_benchmark.py``). The
two searches are
:func:`m4moe.inference.beam_search.translate_ids` and
:func:`m4moe.inference.beam_search.translate_ids_uncached`. Several configs (e.g.
tiny/moe and tiny/dense) are timed interleaved in one process, so the MoE
vs dense decoding cost is a ratio too. A config name may end in
``+sorted``, ``+index`` or ``+einsum`` (e.g. ``tiny/moe+index``): the same
model with that ``--dispatch``; ``+buffers`` is ``+index`` with the block
dispatch of no-drop MoE layers switched off (the E*C buffer path), to
measure what :func:`m4moe.moe.dispatch.block_dispatch_combine` buys.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.inference import beam_search as decoding
from m4moe.benchmarks import timing


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodePoint:
  """Search settings (defaults: batch 32, beam 4, max length 64)."""
  batch_size: int = 32
  beam_size: int = 4
  max_decode_length: int = 64
  source_length: int = 16
  vocab_size: int = 8000


def searches(config_name: str, point: DecodePoint
             ) -> dict[str, Callable[[tf.Tensor], decoding.BeamSearchOutput]]:
  """{"cached": fn, "uncached": fn} compiled searches of a random model."""
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from m4moe.moe import layer as moe_layer  # pylint: disable=g-import-not-at-top
  config_name, _, variant = config_name.partition("+")
  overrides = {}
  if variant:
    if variant not in (*config_lib.DISPATCH_IMPLEMENTATIONS, "buffers"):
      raise ValueError(
          f"decode config {config_name}+{variant}: unknown variant "
          f"{variant!r}; use +{', +'.join(config_lib.DISPATCH_IMPLEMENTATIONS)}"
          " or +buffers")
    overrides["dispatch"] = "index" if variant == "buffers" else variant
  buffers = variant == "buffers"
  config = config_lib.load_model_config(
      config_name, src_vocab_size=point.vocab_size,
      tgt_vocab_size=point.vocab_size, dropout_rate=0.0,
      attention_dropout_rate=0.0, **overrides)
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=config)
  if buffers:
    for layer in model.submodules:
      if isinstance(layer, moe_layer.MoeLayer):
        layer.allow_block_dispatch = False
  beam = decoding.BeamSearchConfig(beam_size=point.beam_size, alpha=0.6,
                                   max_decode_length=point.max_decode_length)
  spec = [tf.TensorSpec([None, None], tf.int32)]
  return {
      "cached": tf.function(
          lambda x: decoding.translate_ids(model, x, config=beam),
          input_signature=spec, autograph=False),
      "uncached": tf.function(
          lambda x: decoding.translate_ids_uncached(model, x, config=beam),
          input_signature=spec, autograph=False)}


def run(point: DecodePoint, *, configs: tuple[str, ...] = ("tiny/moe",
        "tiny/dense"), modes: tuple[str, ...] = ("cached", "uncached"),
        reps: int = 3, warmup: int = 1) -> Iterator[dict[str, Any]]:
  """Times every (config, mode) interleaved; yields one record per config.

  Records: sentences/s per mode, ``cached_speedup`` = median(uncached) /
  median(cached) (target >= 3), ``identical_hypotheses``, and for configs
  after the first ``cached_speed_vs_<first>``.
  """
  rng = np.random.default_rng(0)
  inputs = tf.constant(rng.integers(3, point.vocab_size, size=(
      point.batch_size, point.source_length)), tf.int32)
  outputs: dict[str, Any] = {}
  cases = {}
  for config_name in configs:
    for mode, fn in searches(config_name, point).items():
      if mode not in modes:
        continue
      key = f"{config_name}:{mode}"
      def call(fn=fn, key=key):
        outputs[key] = fn(inputs)
        return outputs[key].sequences.numpy()
      cases[key] = call
  times = timing.interleaved(cases, reps=reps, warmup=warmup)
  base = {"benchmark": "decode", **dataclasses.asdict(point), "reps": reps,
          **timing.machine()}
  for config_name in configs:
    record = {**base, "config": config_name}
    for mode in modes:
      key = f"{config_name}:{mode}"
      record[f"{mode}_sec"] = times.median(key)
      record[f"{mode}_sentences_per_sec"] = (point.batch_size /
                                             times.median(key))
    record["decoded_steps_max"] = int(
        outputs[f"{config_name}:{modes[0]}"].lengths.numpy().max())
    if len(modes) == 2:
      record["cached_speedup"] = times.ratio(f"{config_name}:uncached",
                                             f"{config_name}:cached")
      record["identical_hypotheses"] = bool(np.array_equal(
          outputs[f"{config_name}:cached"].sequences.numpy(),
          outputs[f"{config_name}:uncached"].sequences.numpy()))
    if config_name != configs[0]:
      record[f"{modes[0]}_speed_vs_{configs[0]}"] = times.ratio(
          f"{configs[0]}:{modes[0]}", f"{config_name}:{modes[0]}")
    yield record
