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

* :func:`block_dispatch_combine` -- for a small token count with a large
  capacity (the no-drop eval capacity C = S makes the buffers E*S rows per
  group, E/K times the useful rows -- the decoding case). The T = G*S*K
  choices are sorted by expert into rows padded per expert to a multiple of
  a block size b; each block of b rows belongs to one expert, whose weights
  are gathered per block (``block_fn``). Rows: at most T + E*(b-1), so the
  cost grows with S*K, not E*C. Same outputs as the buffer paths (each row
  meets the same weights). Static shapes, int32 only.

The first two call an :class:`ExpertFn` on the dispatched buffers
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


class BlockFn(Protocol):
  """The experts on expert-homogeneous blocks of rows."""

  def __call__(self, blocks: tf.Tensor, block_expert: tf.Tensor) -> tf.Tensor:
    """<dtype>[NB, b, M] rows, <int32>[NB] expert of each block -> outputs."""


def block_layout(*, num_choices: int, num_experts: int) -> tuple[int, int]:
  """(block size b, number of blocks NB) for T = ``num_choices`` choices.

  b = ceil(T / (2E)) balances the padding rows (at most E*(b-1)) against the
  number of per-block weight gathers; NB = ceil((T + E*(b-1)) / b) blocks
  hold any assignment of the T choices.
  """
  block = max(1, -(-num_choices // (2 * num_experts)))
  rows = num_choices + num_experts * (block - 1)
  return block, -(-rows // block)


def block_rows_are_fewer(*, num_choices: int, num_experts: int,
                         buffer_rows: int) -> bool:
  """True if the block layout has fewer rows than the E*G*C buffers."""
  block, num_blocks = block_layout(num_choices=num_choices,
                                   num_experts=num_experts)
  return block * num_blocks < buffer_rows


def _sorted_rows(expert: tf.Tensor, kept: tf.Tensor, *, num_experts: int,
                 block: int, num_rows: int) -> tuple[tf.Tensor, tf.Tensor]:
  """Row of each choice in the expert-sorted, block-padded layout.

  Args:
    expert: <int32>[T] expert of each choice; kept: <bool>[T] dispatched.
    num_experts: E; block: b; num_rows: NB*b.

  Returns:
    (row <int32>[T] (``num_rows`` for choices not dispatched),
     block_expert <int32>[NB] expert of each block (E-1 past the last one)).
  """
  one_hot = tf.one_hot(tf.where(kept, expert, num_experts), num_experts + 1,
                       dtype=tf.int32)[:, :num_experts]  # [T, E]
  counts = tf.reduce_sum(one_hot, axis=0)
  padded = (counts + block - 1) // block * block
  end = tf.cumsum(padded)
  start = end - padded
  rank = tf.reduce_sum(tf.cumsum(one_hot, axis=0, exclusive=True) * one_hot,
                       axis=1)
  row = tf.where(kept, tf.gather(start, tf.minimum(expert, num_experts - 1)) +
                 rank, num_rows)
  block_start = tf.range(0, num_rows, block)
  block_expert = tf.reduce_sum(tf.cast(
      end[tf.newaxis, :] <= block_start[:, tf.newaxis], tf.int32), axis=1)
  return row, tf.minimum(block_expert, num_experts - 1)


def block_dispatch_combine(x: tf.Tensor, routing: RoutingResult,
                           block_fn: BlockFn) -> tf.Tensor:
  """Expert-sorted blocks: cost O(S*K) rows; same result as the buffers.

  Args:
    x: <dtype>[G, S, M] tokens, G static.
    routing: a token-choice router's result (per-token view).
    block_fn: the experts on blocks.

  Returns:
    <dtype>[G, S, M] combined expert outputs (0 for tokens with no slot).
  """
  num_groups, group_size, model_dim = x.shape
  num_experts = routing.num_experts
  num_k = routing.expert_index.shape[-1]
  num_choices = num_groups * group_size * num_k
  block, num_blocks = block_layout(num_choices=num_choices,
                                   num_experts=num_experts)
  num_rows = block * num_blocks
  row, block_expert = _sorted_rows(
      tf.reshape(routing.expert_index, [-1]),
      tf.reshape(routing.buffer_position >= 0, [-1]),
      num_experts=num_experts, block=block, num_rows=num_rows)
  token = tf.repeat(tf.range(num_groups * group_size), num_k)  # [T]
  # Token of each row (T: empty row, the zero row of the table).
  row_token = tf.math.unsorted_segment_min(token, row, num_rows + 1)
  row_token = tf.minimum(row_token[:-1], num_choices // num_k)
  table = tf.concat([tf.reshape(x, [-1, model_dim]),
                     tf.zeros([1, model_dim], x.dtype)], axis=0)
  blocks = tf.reshape(tf.gather(table, row_token),
                      [num_blocks, block, model_dim])
  outputs = tf.reshape(block_fn(blocks, block_expert), [num_rows, model_dim])
  outputs = tf.concat([outputs, tf.zeros([1, model_dim], x.dtype)], axis=0)
  weight = tf.cast(tf.reshape(routing.combine_weights, [-1, 1]), x.dtype)
  per_choice = tf.gather(outputs, row) * weight  # [T, M]
  return tf.reduce_sum(tf.reshape(per_choice, [num_groups, group_size, num_k,
                                               model_dim]), axis=2)


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
