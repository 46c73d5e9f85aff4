"""Dispatch tokens to expert buffers and combine the expert outputs.

Dimensions cheat sheet:

  G: groups, S: group size, E: experts, C: expert capacity,
  M: model width, H: expert hidden width.

Two implementations with identical outputs and gradients:

* :func:`einsum_dispatch_combine` -- GShard Algorithm 2 as written: one-hot
  ``dispatch_mask`` and ``combine_weights`` ``<[G, S, E, C]>`` and the einsums
  ``GSEC,GSM->EGCM`` (dispatch), ``EGCM,EMH->EGCH`` and ``EGCH,EHM->GECM``
  (the experts) and ``GSEC,GECM->GSM`` (combine). Memory O(G*S*E*C*M)
  intermediates; the form the paper's sharding annotations are written for.
* :func:`index_dispatch_combine` -- a gather of token rows into the buffers
  and a scatter-add (``tf.scatter_nd``, i.e. a segment sum) back, driven by
  ``RoutingResult.slots()``; no ``[G, S, E, C]`` tensor is built, memory is
  O(G*E*C*M) = O(capacity_factor * k * G*S*M). Static shapes and int32
  indices only, so it compiles under XLA (``jit_compile=True``).

Both call an :class:`ExpertFn` on the dispatched buffers
``<activation dtype>[E, G, C, M]``. Empty slots hold zero rows; experts
without biases map them to zero, and they are never combined anyway.
"""

from __future__ import annotations

from typing import Callable, Protocol

import tensorflow as tf

from m4moe.routing import RoutingResult


class ExpertFn(Protocol):
  """The experts: ``[E, G, C, M]`` buffers in, outputs in ``output_layout``."""

  def __call__(self, dispatched: tf.Tensor, *, output_layout: str) -> tf.Tensor:
    """Runs expert e on ``dispatched[e]``.

    Args:
      dispatched: <dtype>[E, G, C, M] expert input buffers.
      output_layout: "EGCM" or "GECM", the axis order of the result.

    Returns:
      <dtype>[E, G, C, M] or <dtype>[G, E, C, M] expert outputs.
    """


def einsum_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                            expert_fn: ExpertFn) -> tf.Tensor:
  """Algorithm 2 with one-hot einsums.

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: the router's result for these groups.
    expert_fn: the experts.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  dispatch_mask = tf.cast(routing.dispatch_mask(), x.dtype)
  combine_weights = tf.cast(routing.combine_array(), x.dtype)
  dispatched = tf.einsum("GSEC,GSM->EGCM", dispatch_mask, x)
  expert_outputs = expert_fn(dispatched, output_layout="GECM")
  return tf.einsum("GSEC,GECM->GSM", combine_weights, expert_outputs)


def index_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                           expert_fn: ExpertFn) -> tf.Tensor:
  """Gather into the buffers, scatter-add back; same result as the einsums.

  Args:
    x: <dtype>[G, S, M] tokens (dtype = activation dtype).
    routing: the router's result for these groups.
    expert_fn: the experts.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  num_groups = tf.shape(x)[0]
  group_size, model_dim = x.shape[1], x.shape[2]
  num_tokens = num_groups * group_size
  # Row index into [x; 0] <[G*S + 1, M]> of each slot, EGC order.
  slot_token, slot_weight = routing.slots()
  slot_token = tf.transpose(slot_token, [1, 0, 2])  # [E, G, C]
  group = tf.range(num_groups)[tf.newaxis, :, tf.newaxis]
  rows = tf.where(slot_token < group_size, group * group_size + slot_token,
                  num_tokens)
  table = tf.concat([tf.reshape(x, [-1, model_dim]),
                     tf.zeros([1, model_dim], x.dtype)], axis=0)
  dispatched = tf.gather(table, rows)  # [E, G, C, M]
  expert_outputs = expert_fn(dispatched, output_layout="EGCM")
  weight = tf.cast(tf.transpose(slot_weight, [1, 0, 2]), x.dtype)
  weighted = expert_outputs * tf.expand_dims(weight, -1)
  # scatter_nd adds rows sharing an index (a token's k slots); the last row
  # collects the empty slots. Faster than unsorted_segment_sum on CPU.
  combined = tf.scatter_nd(
      tf.reshape(rows, [-1, 1]), tf.reshape(weighted, [-1, model_dim]),
      tf.stack([num_tokens + 1, model_dim]))
  return tf.reshape(combined[:-1], tf.shape(x))


DISPATCHERS: dict[str, Callable[[tf.Tensor, RoutingResult, ExpertFn],
                                tf.Tensor]] = {
    "einsum": einsum_dispatch_combine,
    "index": index_dispatch_combine,
}


def dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                     expert_fn: ExpertFn, *, implementation: str) -> tf.Tensor:
  """Runs ``DISPATCHERS[implementation]`` ("einsum" or "index")."""
  if implementation not in DISPATCHERS:
    raise ValueError(f"dispatch implementation {implementation!r} unknown; "
                     f"use --dispatch={' or '.join(DISPATCHERS)}")
  return DISPATCHERS[implementation](x, routing, expert_fn)
