"""A tiny stand-in for the Transformer, for testing the trainer fast.

:class:`ToyTranslator` is a :class:`m4moe.model.interfaces.TrainableModel`
(``model(batch, training=, seed=) -> output`` with ``logits``, ``moe_loss``,
``aux_loss``, ``z_loss``, ``moe_stats``) with a soft mixture of experts, a
stateless dropout and an optional "poison" token that makes the loss NaN, so
the trainer's machinery can be tested fast and independently of the real
Transformer. It learns the task of :mod:`m4moe.training.synthetic`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class ToyOutput:
  """Same fields as m4moe.model.transformer.ModelOutput."""
  logits: tf.Tensor
  moe_loss: tf.Tensor
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  moe_stats: Mapping[str, Any]


def _variable(rng: np.random.Generator, shape, name: str) -> tf.Variable:
  scale = 1.0 / np.sqrt(shape[-2] if len(shape) > 1 else shape[-1])
  return tf.Variable(rng.normal(scale=scale, size=shape).astype(np.float32),
                     name=name)


class ToyTranslator(tf.Module):
  """Bag-of-source-words context + soft MoE over decoder inputs.

  Args:
    vocab_size: V for source and target.
    d_model: M.
    num_experts: E of the soft mixture.
    dropout_rate: stateless dropout on the hidden states while training.
    poison_token: if a source row contains this id the logits are NaN.
    moe_loss_weight: weight of the load-balancing loss in ``moe_loss``.
    init_seed: numpy seed of the initial weights.
  """

  def __init__(self, *, vocab_size: int = 24, d_model: int = 16,
               num_experts: int = 4, dropout_rate: float = 0.1,
               poison_token: int | None = None, init_seed: int = 0,
               moe_loss_weight: float = 0.01, name: str = "toy"):
    super().__init__(name=name)
    rng = np.random.default_rng(init_seed)
    self.dropout_rate = dropout_rate
    self.poison_token = poison_token
    self.moe_loss_weight = moe_loss_weight
    self.source_embedding = _variable(rng, (vocab_size, d_model), "src_emb")
    self.target_embedding = _variable(rng, (vocab_size, d_model), "tgt_emb")
    self.position_embedding = _variable(rng, (64, d_model), "pos_emb")
    self.router = _variable(rng, (d_model, num_experts), "router")
    self.experts = _variable(rng, (num_experts, d_model, d_model), "experts")
    self.output_bias = tf.Variable(tf.zeros([vocab_size]), name="out_bias")
    self.output = _variable(rng, (d_model, vocab_size), "output")

  def __call__(self, batch: Mapping[str, tf.Tensor], *, training: bool,
               seed: tf.Tensor | None = None) -> ToyOutput:
    inputs, targets = batch["inputs"], batch["targets"]
    if training and self.dropout_rate and seed is None:
      raise ValueError("training=True with dropout needs a seed")
    src_mask = tf.cast(tf.not_equal(inputs, 0), tf.float32)[..., None]
    src = tf.gather(self.source_embedding, inputs) * src_mask   # [B, Ls, M]
    length = tf.shape(targets)[1]
    # Target position t is aligned with source position n - 1 - t (n words,
    # then eos): the task reverses the source.
    src_len = tf.reduce_sum(src_mask[..., 0], axis=1)           # [B]
    idx = tf.cast(src_len[:, None], tf.int32) - 2 - tf.range(length)[None]
    aligned = tf.gather(src, tf.maximum(idx, 0), batch_dims=1)  # [B, Lt, M]
    aligned *= tf.cast(idx >= 0, tf.float32)[..., None]
    decoder_inputs = tf.pad(targets[:, :-1], [[0, 0], [1, 0]])
    h = (tf.gather(self.target_embedding, decoder_inputs) + aligned +
         self.position_embedding[:length])
    gates = tf.nn.softmax(tf.einsum("BLM,ME->BLE", h, self.router))
    mixed = tf.einsum("BLE,EMN,BLM->BLN", gates, self.experts, h)
    h = h + tf.tanh(mixed)
    if training and self.dropout_rate:
      keep = tf.random.stateless_uniform(tf.shape(h), seed) >= self.dropout_rate
      h = tf.where(keep, h / (1 - self.dropout_rate), 0.0)
    logits = tf.einsum("BLM,MV->BLV", h, self.output) + self.output_bias
    if self.poison_token is not None:
      poisoned = tf.reduce_any(tf.equal(inputs, self.poison_token), axis=1)
      logits = tf.where(poisoned[:, None, None], np.nan, logits)
    load = tf.reduce_mean(tf.reshape(gates, [-1, tf.shape(gates)[-1]]), 0)
    aux = tf.cast(tf.size(load), tf.float32) * tf.reduce_sum(tf.square(load))
    stats = {"load": load,
             "load_cv": tf.math.reduce_std(load) / tf.reduce_mean(load),
             "entropy": -tf.reduce_mean(tf.reduce_sum(
                 gates * tf.math.log(gates + 1e-9), -1))}
    return ToyOutput(logits=logits, moe_loss=self.moe_loss_weight * aux,
                     aux_loss=aux,
                     z_loss=tf.constant(0.0), moe_stats={"toy/moe": stats})
