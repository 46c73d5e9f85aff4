"""A tiny run directory for decode/eval/export tests (seconds to build).

:func:`make_tiny_run` writes what ``m4moe-train`` and ``m4moe-vocab`` would:
``config.json`` (``{"model": ModelConfig.to_dict(), "data": {...}}`` and
the :mod:`m4moe.training.rundir` records), a
``ckpt-1`` checkpoint of a small Transformer (random weights, optionally a
few hundred steps of a copy task) and SentencePiece ``source.model`` (with
``<2xx>`` tags) / ``target.model`` under ``vocab/``.
"""

from __future__ import annotations

import json
import pathlib
import random
from typing import Sequence

import sentencepiece as spm
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.training import rundir

WORDS = ("open save close file folder window document image print copy paste "
         "delete rename select show hide new current all selected settings "
         "color page text font size list view edit help search next").split()
LANGUAGES = ("de", "fr", "en")
TRAINED_LANGUAGES = ("de", "fr")  # recorded as trained pairs de->en, fr->en


def sentences(n: int, *, seed: int = 0) -> list[str]:
  """``n`` pseudo-English UI strings of 2-6 words."""
  rng = random.Random(seed)
  return [" ".join(rng.choices(WORDS, k=rng.randint(2, 6)))
          for _ in range(n)]


def _train_spm(text: Sequence[str], prefix: pathlib.Path, *, vocab_size: int,
               tags: Sequence[str]) -> pathlib.Path:
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_prefix=str(prefix),
      vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
      byte_fallback=True, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      user_defined_symbols=list(tags), normalization_rule_name="identity",
      hard_vocab_limit=False, minloglevel=2, num_threads=1)
  return prefix.with_suffix(".model")


def tiny_config(*, src_vocab_size: int, tgt_vocab_size: int,
                moe: bool = True,
                route_by_language: bool = False) -> config_lib.ModelConfig:
  """A small model; ``route_by_language`` routes by TRAINED_LANGUAGES."""
  routing = ({"route_by": "language", "routing_languages": TRAINED_LANGUAGES}
             if route_by_language else {})
  return config_lib.load_model_config(
      "tiny/moe" if moe else "tiny/dense", src_vocab_size=src_vocab_size,
      tgt_vocab_size=tgt_vocab_size, d_model=32, num_heads=2, d_kv=16,
      d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
      attention_dropout_rate=0.0, max_length=48,
      **({"num_experts": 4, "expert_hidden_dim": 32, "group_size": 64,
          **routing} if moe else {}))


def _train_copy_task(model, source_sp, target_sp, *, steps: int) -> None:
  """A few Adam steps of copying English through the two vocabularies.

  For a language-routed model, rows alternate between the routing
  languages (the copy task is the same for each).
  """
  from m4moe.moe import task_routing  # pylint: disable=g-import-not-at-top
  text = sentences(256, seed=1)
  tag = source_sp.piece_to_id("<2en>")
  def pad(rows):
    width = max(map(len, rows))
    return tf.constant([r + [0] * (width - len(r)) for r in rows], tf.int32)
  inputs = pad([[tag, *ids, 1] for ids in source_sp.encode(text)])
  targets = pad([[*ids, 1] for ids in target_sp.encode(text)])
  optimizer = tf.keras.optimizers.Adam(3e-3)
  by_language = model.routes_by_language
  num_languages = model.config.moe.router_input_dim or 1

  @tf.function
  def step(x, y):
    batch = {"inputs": x, "targets": y}
    if by_language:
      rows = tf.range(tf.shape(x)[0]) % num_languages
      batch.update(task_routing.language_features(rows, inputs=x, targets=y))
    with tf.GradientTape() as tape:
      logits = model(batch, training=False).logits
      weights = tf.cast(y > 0, tf.float32)
      ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                          logits=logits)
      loss = tf.reduce_sum(weights * ce) / tf.reduce_sum(weights)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  for i in range(steps):
    lo = (i * 32) % 256
    step(inputs[lo:lo + 32], targets[lo:lo + 32])


def make_tiny_run(root: str | pathlib.Path, *, moe: bool = True,
                  train_steps: int = 0, seed: int = 0,
                  record: bool = True,
                  route_by_language: bool = False) -> pathlib.Path:
  """Writes a run directory under ``root``; returns its path.

  With ``record`` (the default) ``config.json`` also holds what
  ``m4moe-train`` records (:func:`m4moe.training.rundir.run_sections`: vocabulary
  fingerprint, languages and pairs TRAINED_LANGUAGES -> en); without it, it
  looks like a run written before those records existed.
  ``route_by_language``: an MoE model with ``--route_by=language`` over
  TRAINED_LANGUAGES (row ``i`` of the copy task is language ``i % 2``).
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(root)
  vocab_dir = root / "vocab"
  vocab_dir.mkdir(parents=True, exist_ok=True)
  text = sentences(400, seed=seed)
  tags = [f"<2{l}>" for l in LANGUAGES]
  source = _train_spm(text + [t.upper() for t in text],
                      vocab_dir / "source", vocab_size=360, tags=tags)
  target = _train_spm(text, vocab_dir / "target", vocab_size=320, tags=())
  source_sp = spm.SentencePieceProcessor(model_file=str(source))
  target_sp = spm.SentencePieceProcessor(model_file=str(target))
  config = tiny_config(src_vocab_size=source_sp.get_piece_size(),
                       tgt_vocab_size=target_sp.get_piece_size(), moe=moe,
                       route_by_language=route_by_language)
  tf.random.set_seed(seed)
  model = model_lib.Transformer(config=config)
  if train_steps:
    _train_copy_task(model, source_sp, target_sp, steps=train_steps)
  run = root / "run"
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                       str(run), max_to_keep=1)
  manager.save(checkpoint_number=max(train_steps, 1))
  sections = {"data": {"vocab_dir": str(vocab_dir)}}
  if record:
    sections.update(rundir.run_sections(vocab_dir=vocab_dir,
                                        languages=TRAINED_LANGUAGES))
  (run / "config.json").write_text(json.dumps(
      {"model": config.to_dict(), **sections}, indent=1), encoding="utf-8")
  return run
